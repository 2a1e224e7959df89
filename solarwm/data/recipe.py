"""Recipes (paper §5.6): logical train/test indices over a raw-wds release, copying no video.

A recipe spec (YAML, see ``recipes/data/*.yaml``)::

    name: short_81f                 # required
    version: "1"                    # optional
    owners: [abot, miradata, ...]   # required; every owner must be in the release
    tiers: [kept-xhigh, kept-high]  # partitions taken (kept-xhigh | kept-high | rejected)
    repeat: {abot: 6}               # per-owner epoch repeat factor, integer >= 1 (default 1)
    window: {frames: 81, mode: evenly_spread, count: 1}   # or mode: packed (from 0, stride W)
    test_view: {per_owner: 100}     # clips per owner held out as the test view

Windows: ``evenly_spread`` places ``count`` windows of W frames at starts
``round(linspace(0, N - W, count))`` (duplicate starts of barely-long clips collapse);
``packed`` cuts ``floor(N / W)`` windows at 0, W, 2W, ... Clips shorter than W are excluded
and counted.

Splits rank each owner's clips by the first 8 bytes of ``sha256(sample_id)`` read as a
big-endian integer (ties by id); the first ``per_owner`` clips form the test view. Whole clips
are split, never windows, so overlapping windows of one clip cannot leak across the split.
Test rows carry ``epoch_repeats`` 1; train rows carry their owner's repeat factor.

Output folder: ``train-index.jsonl.gz``, ``test-index.jsonl.gz`` (release index rows plus
``epoch_repeats``, ``start_frame``, ``window_frames``, ``source_sample_id``, ``window_index``,
``window_count``, ``split``, ``recipe``; ``sample_id`` is ``<source_sample_id>#w<k>``; paths stay
relative to the release root) and ``report.json`` (the release root, physical rows, virtual
occurrences per epoch per owner and tier, excluded short clips).
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from solarwm.data.index import read_index, write_rows
from solarwm.data.release import INDEX_PATH, PARTITIONS
from solarwm.util.atomic import atomic_write_text

SPEC_KEYS = {"name", "version", "description", "owners", "tiers", "repeat", "window", "test_view"}
WINDOW_KEYS = {"frames", "mode", "count"}
TEST_VIEW_KEYS = {"per_owner"}
WINDOW_MODES = ("evenly_spread", "packed")


class RecipeError(ValueError):
    """A recipe spec is malformed, or a built recipe failed a check (e.g. split overlap)."""

    def __init__(self, source: str, where: str, detail: str) -> None:
        self.source, self.where, self.detail = source, where, detail
        super().__init__(f"{source}: {where}: {detail}")


@dataclass(frozen=True)
class RecipeSpec:
    """A validated recipe spec."""

    name: str
    owners: tuple[str, ...]
    tiers: tuple[str, ...]
    window_frames: int
    window_mode: str
    window_count: int = 1
    repeat: dict[str, int] = field(default_factory=dict)
    test_per_owner: int = 100
    version: str = ""


def _positive_int(value: Any, source: str, where: str, minimum: int = 1) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise RecipeError(source, where, f"must be an integer >= {minimum}, got {value!r}")
    return value


def _mapping(value: Any, keys: set[str], source: str, where: str) -> dict:
    if not isinstance(value, dict):
        raise RecipeError(source, where, f"must be a mapping, got {type(value).__name__}")
    unknown = sorted(set(value) - keys)
    if unknown:
        raise RecipeError(source, where, f"unknown key(s) {unknown}; allowed {sorted(keys)}")
    return value


def parse_recipe_spec(doc: Any, source: str = "<recipe>", known_owners: set[str] | None = None) -> RecipeSpec:
    """Validate a parsed recipe YAML; owners are checked against ``known_owners`` when given."""
    doc = _mapping(doc, SPEC_KEYS, source, "spec")
    for key in ("name", "owners", "window"):
        if key not in doc:
            raise RecipeError(source, "spec", f"missing required key {key!r}")
    if not isinstance(doc["name"], str) or not doc["name"]:
        raise RecipeError(source, "name", "must be a non-empty string")
    owners = doc["owners"]
    if not isinstance(owners, list) or not owners or not all(isinstance(o, str) for o in owners):
        raise RecipeError(source, "owners", "must be a non-empty list of owner names")
    if len(set(owners)) != len(owners):
        raise RecipeError(source, "owners", f"duplicate owner in {owners}")
    if known_owners is not None:
        unknown = sorted(set(owners) - set(known_owners))
        if unknown:
            raise RecipeError(source, "owners", f"unknown owner(s) {unknown}; known: {sorted(known_owners)}")
    tiers = doc.get("tiers", ["kept-xhigh", "kept-high"])
    partitions = set(PARTITIONS.values())
    if not isinstance(tiers, list) or not tiers or any(t not in partitions for t in tiers):
        raise RecipeError(source, "tiers", f"must be a non-empty list of {sorted(partitions)}, got {tiers!r}")
    repeat = _mapping(doc.get("repeat", {}) or {}, set(owners), source, "repeat")
    repeat = {o: _positive_int(r, source, f"repeat.{o}") for o, r in repeat.items()}
    window = _mapping(doc["window"], WINDOW_KEYS, source, "window")
    if "frames" not in window or "mode" not in window:
        raise RecipeError(source, "window", "needs `frames` and `mode`")
    if window["mode"] not in WINDOW_MODES:
        raise RecipeError(source, "window.mode", f"must be one of {WINDOW_MODES}, got {window['mode']!r}")
    if window["mode"] == "packed" and "count" in window:
        raise RecipeError(source, "window.count", "packed windows take no count (every full stride is cut)")
    test_view = _mapping(doc.get("test_view", {}) or {}, TEST_VIEW_KEYS, source, "test_view")
    return RecipeSpec(
        name=doc["name"],
        version=str(doc.get("version", "")),
        owners=tuple(owners),
        tiers=tuple(tiers),
        window_frames=_positive_int(window["frames"], source, "window.frames"),
        window_mode=window["mode"],
        window_count=_positive_int(window.get("count", 1), source, "window.count"),
        repeat=repeat,
        test_per_owner=_positive_int(test_view.get("per_owner", 100), source, "test_view.per_owner", minimum=0),
    )


def load_recipe_spec(path: str | Path, known_owners: set[str] | None = None) -> RecipeSpec:
    """Read and validate a recipe spec YAML."""
    path = Path(path)
    try:
        doc = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise RecipeError(str(path), "yaml", str(exc)) from None
    return parse_recipe_spec(doc, str(path), known_owners)


def window_starts(num_frames: int, window: int, mode: str, count: int = 1) -> list[int]:
    """Start frames of the windows of a clip of ``num_frames`` frames (empty when it is too short)."""
    if num_frames < window:
        return []
    if mode == "packed":
        return list(range(0, num_frames - window + 1, window))
    if mode == "evenly_spread":
        return sorted({int(s) for s in np.round(np.linspace(0, num_frames - window, count))})
    raise ValueError(f"unknown window mode {mode!r}")


def split_rank(sample_id: str) -> int:
    """The split rank of a clip: the first 8 bytes of sha256(sample_id) as a big-endian integer."""
    return int.from_bytes(hashlib.sha256(sample_id.encode("utf-8")).digest()[:8], "big")


def held_out_scenes(scene_of: dict[str, str], count: int) -> set[str]:
    """The held-out ids: whole scenes in ``split_rank`` order until at least ``count`` ids (``scene_of``: id -> scene).

    A clip that names no scene is its own (``scene_of[id] == id``); the clips of one scene (the views of one
    world, ``provenance.scene``) are held out together, so no held-out clip shares its scene with training.
    """
    members: dict[str, list[str]] = defaultdict(list)
    for sample_id, scene in scene_of.items():
        members[scene].append(sample_id)
    held: set[str] = set()
    for scene in sorted(members, key=lambda k: (split_rank(k), k)):
        if len(held) >= count:
            break
        held.update(members[scene])
    return held


def build_recipe(rows: list[dict], spec: RecipeSpec) -> tuple[list[dict], list[dict], dict]:
    """Cut windows, split and weight release rows: returns (train rows, test rows, report)."""
    tiers = {t for t in spec.tiers}
    by_owner: dict[str, list[dict]] = defaultdict(list)
    excluded_short: Counter = Counter()
    for row in rows:
        if row["dataset"] not in spec.owners or PARTITIONS[row["kept_tier"]] not in tiers:
            continue
        if row["num_frames"] < spec.window_frames:
            excluded_short[(row["dataset"], PARTITIONS[row["kept_tier"]])] += 1
            continue
        by_owner[row["dataset"]].append(row)

    train, test = [], []
    for owner in spec.owners:
        ranked = sorted(by_owner.get(owner, []), key=lambda r: (split_rank(r["sample_id"]), r["sample_id"]))
        held = held_out_scenes({r["sample_id"]: r.get("scene") or r["sample_id"] for r in ranked}, spec.test_per_owner)
        for row in ranked:
            split = "test" if row["sample_id"] in held else "train"
            starts = window_starts(row["num_frames"], spec.window_frames, spec.window_mode, spec.window_count)
            for k, start in enumerate(starts):
                window_row = {
                    **row,
                    "sample_id": f"{row['sample_id']}#w{k}",
                    "source_sample_id": row["sample_id"],
                    "start_frame": start,
                    "window_frames": spec.window_frames,
                    "window_index": k,
                    "window_count": len(starts),
                    "split": split,
                    "epoch_repeats": spec.repeat.get(owner, 1) if split == "train" else 1,
                    "recipe": spec.name,
                }
                (test if split == "test" else train).append(window_row)

    train_ids = {r["source_sample_id"] for r in train}
    test_ids = {r["source_sample_id"] for r in test}
    overlap = (train_ids & test_ids) | ({r["sample_id"] for r in train} & {r["sample_id"] for r in test})
    if overlap:
        raise RecipeError(
            spec.name, "split", f"{len(overlap)} id(s) in both train and test, e.g. {sorted(overlap)[:3]}"
        )

    def tally(rows_: list[dict]) -> dict:
        per: dict[str, dict[str, dict[str, int]]] = defaultdict(
            lambda: defaultdict(lambda: {"physical": 0, "virtual": 0, "clips": 0})
        )
        clips = defaultdict(set)
        for r in rows_:
            cell = per[r["dataset"]][PARTITIONS[r["kept_tier"]]]
            cell["physical"] += 1
            cell["virtual"] += r["epoch_repeats"]
            clips[(r["dataset"], PARTITIONS[r["kept_tier"]])].add(r["source_sample_id"])
        for (owner, part), ids in clips.items():
            per[owner][part]["clips"] = len(ids)
        return {
            "physical_rows": len(rows_),
            "virtual_occurrences": sum(r["epoch_repeats"] for r in rows_),
            "clips": len({r["source_sample_id"] for r in rows_}),
            "per_owner": {o: dict(sorted(t.items())) for o, t in sorted(per.items())},
        }

    report = {
        "recipe": spec.name,
        "version": spec.version,
        "owners": list(spec.owners),
        "tiers": list(spec.tiers),
        "repeat": {o: spec.repeat.get(o, 1) for o in spec.owners},
        "window": {"frames": spec.window_frames, "mode": spec.window_mode, "count": spec.window_count},
        "test_per_owner": spec.test_per_owner,
        "train": tally(train),
        "test": tally(test),
        "excluded_short": {f"{o}/{p}": n for (o, p), n in sorted(excluded_short.items())},
        "excluded_short_total": sum(excluded_short.values()),
    }
    return train, test, report


def recipe_command(release: str, spec: str, out: str) -> int:
    """Build a recipe's train/test indices over a raw-wds release and print its report.

    Args:
        release: release root (the folder holding raw-wds/).
        spec: recipe spec YAML (see recipes/data/).
        out: output folder for train-index.jsonl.gz, test-index.jsonl.gz and report.json.
    """
    release_root = Path(release).resolve()
    rows = read_index(release_root / INDEX_PATH, release_root)
    recipe = load_recipe_spec(spec, known_owners={r["dataset"] for r in rows})
    train, test, report = build_recipe(rows, recipe)
    report = {"release_root": str(release_root), "release_index": INDEX_PATH, "spec": str(spec), **report}

    out_path = Path(out)
    write_rows(out_path / "train-index.jsonl.gz", train)
    write_rows(out_path / "test-index.jsonl.gz", test)
    atomic_write_text(out_path / "report.json", json.dumps(report, indent=1, sort_keys=True) + "\n")
    print(json.dumps(report, indent=2))
    return 0
