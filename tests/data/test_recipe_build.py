"""`data recipe`: spec validation, windows, split disjointness, repeat accounting, end to end."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest
import yaml

from solarwm.data.index import read_index
from solarwm.data.policy.spec import OWNERS
from solarwm.data.recipe import (
    RecipeError,
    build_recipe,
    load_recipe_spec,
    parse_recipe_spec,
    recipe_command,
    split_rank,
    window_starts,
)
from solarwm.data.release import pack_command

from corpora import make_corpus

RECIPES = Path(__file__).resolve().parents[2] / "recipes" / "data"


def _rows(owners: dict[str, int], frames=lambda i: 40 + 7 * i) -> list[dict]:
    """Fabricated release rows: n clips per owner, alternating kept tiers, varied lengths."""
    rows = []
    for owner, n in owners.items():
        for i in range(n):
            rows.append({"sample_id": f"{owner}-{i:03d}", "dataset": owner, "num_frames": frames(i),
                         "kept_tier": ("xhigh", "high", "rejected")[i % 3], "shard": f"raw-wds/{owner}/shards/x.tar"})
    return rows


def _spec(**overrides) -> dict:
    doc = {"name": "t", "owners": ["abot", "synthetic"], "tiers": ["kept-xhigh", "kept-high"],
           "repeat": {"abot": 6}, "window": {"frames": 33, "mode": "packed"}, "test_view": {"per_owner": 3}}
    doc.update(overrides)
    return doc


def test_shipped_specs_parse() -> None:
    short = load_recipe_spec(RECIPES / "short_81f.yaml", known_owners=set(OWNERS))
    assert len(short.owners) == 10 and short.window_frames == 81 and short.test_per_owner == 100
    assert short.repeat == {"abot": 6, "miradata": 6, "sekai_game": 6}
    synth = load_recipe_spec(RECIPES / "synthetic_33f.yaml", known_owners=set(OWNERS))
    assert synth.owners == ("synthetic",) and synth.window_mode == "packed"


@pytest.mark.parametrize("overrides,where", [
    ({"colour": "red"}, "spec"),
    ({"owners": ["abot", "nobody"]}, "owners"),
    ({"tiers": ["kept-high", "gold"]}, "tiers"),
    ({"repeat": {"abot": 0}}, "repeat.abot"),
    ({"repeat": {"abot": 1.5}}, "repeat.abot"),
    ({"repeat": {"abot": True}}, "repeat.abot"),
    ({"repeat": {"abot": "2"}}, "repeat.abot"),
    ({"repeat": {"realcam": 2}}, "repeat"),
    ({"window": {"frames": 33, "mode": "sliding"}}, "window.mode"),
    ({"window": {"frames": 33, "mode": "packed", "stride": 4}}, "window"),
    ({"test_view": {"per_owner": 5, "seed": 1}}, "test_view"),
])
def test_bad_specs(overrides, where) -> None:
    with pytest.raises(RecipeError) as info:
        parse_recipe_spec(_spec(**overrides), known_owners={"abot", "synthetic"})
    assert info.value.where == where


def test_window_cutting() -> None:
    assert window_starts(100, 33, "packed") == [0, 33, 66]
    assert window_starts(99, 33, "packed") == [0, 33, 66]
    assert window_starts(98, 33, "packed") == [0, 33]
    assert window_starts(32, 33, "packed") == []
    assert window_starts(100, 33, "evenly_spread", 3) == [0, 34, 67]
    assert window_starts(100, 33, "evenly_spread", 1) == [0]
    assert window_starts(33, 33, "evenly_spread", 4) == [0]  # all starts coincide: one window
    assert window_starts(20, 33, "evenly_spread", 2) == []


def test_split_is_disjoint_and_whole_clip() -> None:
    rows = _rows({"abot": 30, "synthetic": 30})
    spec = parse_recipe_spec(_spec(window={"frames": 33, "mode": "evenly_spread", "count": 3}))
    train, test, report = build_recipe(rows, spec)
    side = defaultdict(set)
    for r in train + test:
        side[r["source_sample_id"]].add(r["split"])
        assert r["sample_id"] == f"{r['source_sample_id']}#w{r['window_index']}"
    assert all(len(s) == 1 for s in side.values())
    assert not ({r["sample_id"] for r in train} & {r["sample_id"] for r in test})
    # the first `per_owner` clips by sha256 rank of each owner are the test view
    for owner in ("abot", "synthetic"):
        eligible = [
            r["sample_id"]
            for r in rows
            if r["dataset"] == owner and r["kept_tier"] != "rejected" and r["num_frames"] >= 33
        ]
        expected = sorted(eligible, key=lambda s: (split_rank(s), s))[:3]
        assert sorted({r["source_sample_id"] for r in test if r["dataset"] == owner}) == sorted(expected)
    assert report["test"]["clips"] == 6


def test_repeat_accounting_and_short_exclusion() -> None:
    rows = _rows({"abot": 12, "synthetic": 12}, frames=lambda i: 20 + 10 * i)
    spec = parse_recipe_spec(_spec(window={"frames": 33, "mode": "packed"}))
    train, test, report = build_recipe(rows, spec)
    assert all(r["epoch_repeats"] == (6 if r["dataset"] == "abot" else 1) for r in train)
    assert all(r["epoch_repeats"] == 1 for r in test)
    assert report["train"]["physical_rows"] == len(train)
    assert report["train"]["virtual_occurrences"] == sum(r["epoch_repeats"] for r in train)
    per = report["train"]["per_owner"]
    assert sum(c["virtual"] for c in per["abot"].values()) == 6 * sum(c["physical"] for c in per["abot"].values())
    # lengths 20, 30 (i = 0, 1) are shorter than 33; i = 2 is rejected (not in the tiers)
    kept_short = [r for r in rows if r["kept_tier"] != "rejected" and r["num_frames"] < 33]
    assert report["excluded_short_total"] == len(kept_short) == 4
    for r in train + test:
        assert r["num_frames"] >= 33 and r["start_frame"] + r["window_frames"] <= r["num_frames"]
        assert r["window_count"] == r["num_frames"] // 33


def test_recipe_command_end_to_end(tmp_path: Path, capsys) -> None:
    clips = [
        (f"c{i:02d}", "synthetic" if i % 2 else "abot", ("xhigh", "high", "rejected")[i % 3], 4 + i % 5)
        for i in range(14)
    ]
    corpus = make_corpus(tmp_path, clips=clips)
    release = tmp_path / "release"
    pack_command(str(corpus), str(release))
    capsys.readouterr()
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        yaml.safe_dump(
            _spec(
                repeat={"abot": 3},
                window={"frames": 5, "mode": "evenly_spread", "count": 2},
                test_view={"per_owner": 1},
            )
        )
    )
    out = tmp_path / "recipe"
    assert recipe_command(str(release), str(spec), str(out)) == 0
    report = json.loads((out / "report.json").read_text())
    assert Path(report["release_root"]) == release.resolve()
    train = read_index(out / "train-index.jsonl.gz", report["release_root"])
    test = read_index(out / "test-index.jsonl.gz", report["release_root"])
    assert {r["split"] for r in train} == {"train"} and {r["split"] for r in test} == {"test"}
    assert len({r["source_sample_id"] for r in test}) == 2  # one clip per owner
    assert report["train"]["virtual_occurrences"] == sum(r["epoch_repeats"] for r in train)
    assert report["excluded_short_total"] == sum(1 for c in clips if c[2] != "rejected" and c[3] < 5)

    # an unknown owner (not in the release) is an error before anything is written
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(_spec(owners=["abot", "realcam"], repeat={})))
    with pytest.raises(RecipeError, match="realcam"):
        recipe_command(str(release), str(bad), str(tmp_path / "never"))
    assert not (tmp_path / "never").exists()


def test_test_view_holds_out_whole_scenes() -> None:
    """Rows naming a scene (the views of one world) go to test together; rows without one split as before."""
    rows = [dict(r, kept_tier="xhigh", scene=f"scene-{i // 4}") for i, r in enumerate(_rows({"synthetic": 16}))]
    spec = parse_recipe_spec(_spec(owners=["synthetic"], repeat={}), known_owners={"synthetic"})
    train, test, _ = build_recipe(rows, spec)
    scene = {r["sample_id"]: r["scene"] for r in rows}
    test_scenes = {scene[r["source_sample_id"]] for r in test}
    assert len(test_scenes) == 1 and len({r["source_sample_id"] for r in test}) == 4  # 3 asked for: one whole scene
    assert not test_scenes & {scene[r["source_sample_id"]] for r in train}
    # Without scenes, exactly the 3 clips of smallest split rank.
    plain = [{k: v for k, v in r.items() if k != "scene"} for r in rows]
    _, test_plain, _ = build_recipe(plain, spec)
    lowest = sorted((r["sample_id"] for r in plain), key=lambda i: (split_rank(i), i))[:3]
    assert {r["source_sample_id"] for r in test_plain} == set(lowest)
