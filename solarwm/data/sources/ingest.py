"""`solarwm data ingest`: turn a source dataset on disk into canonical clips of its owner.

One source module per dataset (``solarwm/data/sources/<name>.py``) lists the native items of
a root folder and loads one into canonical conventions (`native.NativeClip`); this driver does
the rest the same way for every source:

* **windows** — whole windows of the spec at 16 fps (`conversions.window_plan`), the same
  source frame indices for video, poses, intrinsics and actions; never upsampled;
* **pose path** — metric ground truth is kept; ground truth in unknown units gets one metric
  scale per clip from the windowed bridge (`bridge.py`) with a metric reference estimator;
  video-only sources call an estimator (default ``colmap``: pycolmap SfM, metric when a depth
  model is given with ``depth_model``, else relative and then rejected by the metric camera
  gates). Without a usable estimator the clip fails with ``estimator_unavailable`` — never a
  made-up pose;
* **provenance** — owner, original id, source frame interval, source fps, every conversion
  with its version, pose path and units, as explicit fields;
* **accounting** — every native item ends as clips or as a failed clip record (a folder with
  only ``meta.json`` whose ``provenance.stages.ingest`` is ``failed`` with a reason), so
  `solarwm.data.accounting.account` counts it; a rerun skips clips already written (ids are
  deterministic: ``contract.clip_id(owner, original_id, start, end)``) and retries failures. Items are
  keyed by what they read: two of one name in different folders get ids qualified by their path
  (``name@path``), and one listed twice (a symlinked alias) is a failed ``duplicate_item`` record.

Item-level failures (the item cannot be read at all) use the interval ``[0, 0)`` in their id.
"""

from __future__ import annotations

import importlib
import json
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from solarwm.data.accounting import account
from solarwm.data.contract import FILES, Clip, ClipError, clip_id, read_meta, write_clip, write_failed_clip
from solarwm.data.executor import map_tasks
from solarwm.data.sources import conversions as cv
from solarwm.data.sources.bridge import windowed_metric_scale
from solarwm.data.sources.native import NativeClip, NativeItem, Source, SourceDefect, check_lengths

INGEST_VERSION = "solarwm-ingest/1"
# The official engine's default-mode pose path is VIPE (Pi3X + MoGe-2 + VIPE SLAM), which cannot
# run here (estimators.official says why); the default is the path that runs: pycolmap SfM,
# scaled to metres by a metric-depth model when one is given.
DEFAULT_ESTIMATOR = "colmap"
SOURCES = ("abot", "dl3dv", "miradata", "realcam_vid", "spatialvid", "sekai_game", "sekai_walking",
           "mind", "multicamvideo", "omniworld")


def get_source(name: str) -> Source:
    """The registered source ``name`` (its module's ``SOURCE``); raises ``ValueError`` for an unknown name."""
    if name not in SOURCES:
        raise ValueError(f"unknown source {name!r}; choose one of {', '.join(SOURCES)}")
    return importlib.import_module(f"solarwm.data.sources.{name}").SOURCE


@dataclass(frozen=True)
class IngestConfig:
    """What every per-item task needs (picklable)."""

    source: str
    root: str
    out: str
    spec: str
    estimator: str = DEFAULT_ESTIMATOR
    estimator_weights: str | None = None
    depth_model: str | None = None  # a transformers model folder, or oracle:DIR (estimators.depth)


_ESTIMATORS: dict[tuple[str, str | None, str | None, bool], Any] = {}


def _estimator(cfg: IngestConfig, bridged: bool = False) -> Any:
    """The configured estimator, built once per process; raises ``SourceDefect('estimator_unavailable')``.

    ``bridged``: for the metric bridge, which checks every window against the source's own poses; colmap then
    runs its incremental mapper alone and skips its split-half check, since its own checks (the global mapper's
    second opinion, ``checked``) would only cost windows where global positioning fails on forward motion
    (docs/results/2026-12-pose-estimation.md).
    """
    from solarwm.data.estimators import EstimatorUnavailable, get_estimator

    key = (cfg.estimator, cfg.estimator_weights, cfg.depth_model, bridged)
    if key not in _ESTIMATORS:
        try:
            options: dict[str, Any] = {}
            if bridged and cfg.estimator == "colmap":
                options = {"mapper": "incremental", "split_pos_frac": None}
            if cfg.depth_model:
                from solarwm.data.estimators.depth import get_depth_model

                options["depth"] = get_depth_model(cfg.depth_model)
            _ESTIMATORS[key] = get_estimator(cfg.estimator, cfg.estimator_weights, **options)
        except EstimatorUnavailable as e:
            _ESTIMATORS[key] = e
    found = _ESTIMATORS[key]
    if isinstance(found, Exception):
        raise SourceDefect("estimator_unavailable", f"{found.name}: {found.reason}")
    return found


def _ref_text(ref: dict[str, Any]) -> str:
    """An item's place in the source root as text (its paths and archive members)."""
    return ":".join(str(v) for v in ref.values() if v is not None)


def _ref_key(root: Path, ref: dict[str, Any]) -> tuple:
    """What an item reads, with every path resolved: two items with one key are one item listed twice."""
    def real(value: Any) -> str:
        if isinstance(value, str) and value and (root / value).exists():
            return str((root / value).resolve())
        return repr(value)

    return tuple(sorted((k, real(v)) for k, v in ref.items()))


def qualified(item: NativeItem) -> NativeItem:
    """``item`` with its id qualified by its place in the root: ``name@path``."""
    return NativeItem(f"{item.original_id}@{_ref_text(item.ref)}", item.ref)


def distinct_items(root: Path, items: list[NativeItem]) -> tuple[list[NativeItem], list[tuple[NativeItem, NativeItem]]]:
    """``items`` with distinct ids, and the (alias, original) pairs that read the same data as an earlier item.

    A source names an item after its file (a video's stem, its folder); two distinct items of one name get ids
    qualified by their place in the root (``name@path``), so each gets its own records. An item whose paths
    resolve to an earlier item's (a symlinked alias) is a duplicate and is recorded as a failure."""
    seen: dict[tuple, NativeItem] = {}
    unique, duplicates = [], []
    for item in items:
        key = _ref_key(root, item.ref)
        if key in seen:
            duplicates.append((item, seen[key]))
        else:
            seen[key] = item
            unique.append(item)
    names: dict[str, int] = {}
    for item in unique:
        names[item.original_id] = names.get(item.original_id, 0) + 1
    distinct = [qualified(it) if names[it.original_id] > 1 else it for it in unique]
    renamed = {id(it): d for it, d in zip(unique, distinct)}
    duplicates = [(qualified(alias), renamed[id(original)]) for alias, original in duplicates]
    return distinct, duplicates


def _failed(out: Path, cid: str, provenance: dict[str, Any], defect: Exception) -> dict[str, Any]:
    """Record ``cid`` as failed at stage ``ingest``; returns the task's record of it."""
    reason = defect.reason if isinstance(defect, SourceDefect) else "ingest_error"
    error = str(defect) if isinstance(defect, SourceDefect) else f"ingest_error: {type(defect).__name__}: {defect}"
    write_failed_clip(out, cid, "ingest", INGEST_VERSION, error, provenance)
    return {"clip": cid, "status": "failed", "reason": reason, "error": error}


def _is_done(folder: Path) -> bool:
    """True when ``folder`` holds a clip this ingest version wrote completely."""
    if not all((folder / name).is_file() for name in FILES):
        return False
    try:
        stage = read_meta(folder).get("provenance", {}).get("stages", {}).get("ingest", {})
    except ClipError:
        return False
    return stage.get("status") == "ok" and stage.get("version") == INGEST_VERSION


def _window_poses(cfg: IngestConfig, source: Source, clip: NativeClip, frames: np.ndarray, idx: np.ndarray,
                  fps: float) -> tuple[np.ndarray, np.ndarray, str, list[dict[str, Any]], dict[str, Any]]:
    """Poses, K, units, extra conversions and provenance fields of one window, by the source's pose path."""
    if source.pose_path == "gt_pose_metric":
        return clip.c2w[idx], clip.K[idx], "metric", [], {}
    est = _estimator(cfg, bridged=source.pose_path == "gt_pose_bridge")
    if source.pose_path == "gt_pose_bridge":
        scale, diag = windowed_metric_scale(clip.c2w[idx], frames, clip.K[idx], fps, est)
        c2w = cv.scale_translation(clip.c2w[idx], scale)
        conv = cv.record(cv.scale_translation, scale=scale, method="windowed_bridge", estimator=est.name)
        fields = {"metric_bridge": diag, "estimator": {"name": est.name, "version": est.version}}
        if getattr(est, "depth", None) is not None:
            fields["depth_model"] = est.depth.describe()
        return c2w, clip.K[idx], "metric", [conv], fields
    from solarwm.data.estimators import EstimationError

    try:
        result = est.estimate(frames, None, fps)
    except EstimationError as e:
        raise SourceDefect("estimation_failed", f"{est.name}: {e}") from None
    c2w, K = np.asarray(result.c2w, np.float64), np.asarray(result.K, np.float64)
    if c2w.shape != (len(frames), 4, 4) or K.shape != (len(frames), 4):
        raise SourceDefect(
            "estimation_failed",
            f"{est.name} returned poses {list(c2w.shape)}, K {list(K.shape)} for {len(frames)} frames",
        )
    info = {"name": result.estimator, "version": result.version, "diagnostics": result.diagnostics}
    fields: dict[str, Any] = {"estimator": info}
    if "depth_model" in result.diagnostics:  # both estimators of a metric pose, side by side
        fields["depth_model"] = result.diagnostics["depth_model"]
    return c2w, K, result.pose_units, [], fields


def ingest_item(cfg: IngestConfig, item: NativeItem) -> dict[str, Any]:
    """Ingest one native item into ``cfg.out``: its windows as clips, or failed records; never raises for bad input."""
    source = get_source(cfg.source)
    owner, out = source.owner(cfg.spec), Path(cfg.out)
    base = {
        "owner": owner,
        "source": source.name,
        "original_id": item.original_id,
        "spec": cfg.spec,
        "pose_path": source.pose_path,
        "versions": {"ingest": INGEST_VERSION},
    }
    item_id = clip_id(owner, item.original_id, 0, 0)
    try:
        clip = source.load(Path(cfg.root), item)
        check_lengths(clip)
        plan_fn = cv.PLANS[source.window_mode]
        windows = plan_fn(clip.frames.count, clip.frames.fps, cfg.spec)
    except Exception as e:  # unreadable in any way: one failed record for the item, with the reason
        return {"item": item.original_id, "windows": [_failed(out, item_id, {**base, "frame_interval": None}, e)]}
    shutil.rmtree(out / item_id, ignore_errors=True)  # an earlier item-level failure is superseded
    frames_out, fps_out = cv.SPECS[cfg.spec]
    results = []
    for w in windows:
        cid = clip_id(owner, item.original_id, w.start, w.end)
        prov = {
            **base,
            "frame_interval": [w.start, w.end],
            "window": [w.index, len(windows)],
            "source_fps": clip.frames.fps,
            "source_num_frames": clip.frames.count,
            "native": clip.extra,
        }
        if _is_done(out / cid):
            results.append({"clip": cid, "status": "skipped"})
            continue
        try:
            frames = clip.frames.read(w.indices)
            c2w, K, units, more, fields = _window_poses(cfg, source, clip, frames, w.indices, fps_out)
            timing = cv.record(
                plan_fn, source_fps=clip.frames.fps, fps=fps_out, frames=frames_out, source_frames=w.end - w.start
            )
            prov.update(
                fields,
                pose_units=units,
                conversions=[*clip.conversions, timing, *more],
                stages={"ingest": {"status": "ok", "version": INGEST_VERSION}},
            )
            out_clip = Clip(
                cid,
                frames,
                c2w,
                K,
                caption="",
                provenance=prov,
                meta={"fps": fps_out, "num_frames": frames_out, "pose_units": units},
            )
            write_clip(out_clip, out, arrays={k: a[w.indices] for k, a in clip.arrays.items()})
            results.append({"clip": cid, "status": "written"})
        except (SourceDefect, ClipError) as e:
            results.append(_failed(out, cid, {**prov, "conversions": clip.conversions}, e))
    return {"item": item.original_id, "windows": results}


def _task(args: tuple[IngestConfig, NativeItem]) -> dict[str, Any]:
    return ingest_item(*args)


def ingest(
    source: str,
    root: str | Path,
    out: str | Path,
    spec: str | None = None,
    workers: int = 1,
    executor: str = "process",
    estimator: str = DEFAULT_ESTIMATOR,
    estimator_weights: str | None = None,
    progress: bool = True,
    depth_model: str | None = None,
) -> dict[str, Any]:
    """Ingest every native item of ``source`` under ``root`` into the corpus ``out``; returns the summary."""
    from solarwm.data.estimators import ESTIMATORS

    if estimator not in ESTIMATORS:  # a typo, not a clip's problem: refused before any work
        raise ValueError(f"unknown estimator {estimator!r}; choose one of {', '.join(sorted(ESTIMATORS))}")
    src = get_source(source)
    spec = spec or src.default_spec
    if spec not in cv.SPECS:
        raise ValueError(f"unknown spec {spec!r}; choose one of {', '.join(cv.SPECS)}")
    owner = src.owner(spec)
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: source root folder not found")
    listed = src.list_items(root)
    items, duplicates = distinct_items(root, listed)
    cfg = IngestConfig(source, str(root), str(out), spec, estimator, estimator_weights, depth_model)
    Path(out).mkdir(parents=True, exist_ok=True)
    records: list[dict[str, Any]] = []
    for alias, original in duplicates:
        base = {
            "owner": owner,
            "source": source,
            "original_id": alias.original_id,
            "frame_interval": None,
            "spec": spec,
            "versions": {"ingest": INGEST_VERSION},
        }
        defect = SourceDefect(
            "duplicate_item",
            f"{_ref_text(alias.ref)} reads the same data as {_ref_text(original.ref)} (item {original.original_id})",
        )
        records.append(
            {
                "item": alias.original_id,
                "windows": [_failed(Path(out), clip_id(owner, alias.original_id, 0, 0), base, defect)],
            }
        )
    tasks = [(cfg, it) for it in items]
    for i, result in map_tasks(
        _task, tasks, executor=executor, workers=workers, desc=f"ingest {source}" if progress else None, unit="item"
    ):
        if isinstance(result, BaseException):  # a crashed worker: the item is recorded failed, not lost
            cid = clip_id(owner, items[i].original_id, 0, 0)
            base = {
                "owner": owner,
                "source": source,
                "original_id": items[i].original_id,
                "frame_interval": None,
                "spec": spec,
                "versions": {"ingest": INGEST_VERSION},
            }
            result = {"item": items[i].original_id, "windows": [_failed(Path(out), cid, base, result)]}
        records.append(result)
    counts = {k: 0 for k in ("written", "skipped", "failed")}
    reasons: dict[str, int] = {}
    for r in records:
        for w in r["windows"]:
            counts[w["status"]] += 1
            if w["status"] == "failed":
                reasons[w["reason"]] = reasons.get(w["reason"], 0) + 1
    acc = account(out)
    return {
        "command": "ingest",
        "source": source,
        "owner": owner,
        "spec": spec,
        "root": str(root),
        "out": str(out),
        "items": len(listed),
        "duplicates": len(duplicates),
        "clips": counts,
        "failed_reasons": dict(sorted(reasons.items())),
        "accounting": acc.to_dict(),
        "records": sorted(records, key=lambda r: r["item"]),
    }


def list_sources() -> list[dict[str, Any]]:
    """Every source with its owner(s), pose path and default spec."""
    rows = []
    for name in SOURCES:
        s = get_source(name)
        owners = sorted(set(s.owners.values()))
        rows.append(
            {"source": name, "owners": owners, "pose_path": s.pose_path, "default_spec": s.default_spec, "note": s.note}
        )
    return rows


POSE_PATH_TEXT = {
    "gt_pose_metric": "gt_pose metric",
    "gt_pose_bridge": "gt_pose non-metric (windowed bridge)",
    "estimator": "estimator",
}


def ingest_command(
    source: str | None = None,
    root: str | None = None,
    out: str | None = None,
    spec: str | None = None,
    workers: int = 1,
    executor: str = "process",
    estimator: str = DEFAULT_ESTIMATOR,
    estimator_weights: str | None = None,
    depth_model: str | None = None,
    list: bool = False,
) -> int:
    """Ingest a source dataset from its native layout into canonical clips (``--list``: the sources).

    Args:
        source: source name (see --list).
        root: the source's native folder.
        out: corpus folder to write clips into (a rerun resumes).
        spec: 81f, 160f or 960f (16 fps); default per source (see --list).
        workers: worker processes; 1 runs in-process.
        executor: task executor of solarwm.data.executor (process, ...).
        estimator: pose estimator for video-only sources and the metric reference of the bridge (see --list).
        estimator_weights: local weights path for the estimator.
        depth_model: metric-depth model that scales colmap's poses to metres: a local transformers folder
            (DepthPro, Depth Anything metric) or oracle:DIR (true depth of a `data synth --depth` corpus).
            Without it video-only clips are relative (rejected by the metric camera gates) and the
            abot/sekai_game bridge has no metric reference.
        list: print every source with its owner(s) and pose path, and every estimator, then exit.
    """
    if list:
        from solarwm.data.estimators import estimator_status

        for row in list_sources():
            print(
                f"{row['source']:<14} owners {','.join(row['owners']):<22} {POSE_PATH_TEXT[row['pose_path']]:<38} "
                f"default --spec {row['default_spec']}"
            )
        print()
        for row in estimator_status():
            default = " (default)" if row["name"] == DEFAULT_ESTIMATOR else ""
            state = "available" if row["available"] else f"unavailable: {row['why']}"
            print(f"estimator {row['name']:<10} {state}{default}")
        return 0
    if not (source and root and out):
        raise ValueError("--source, --root and --out are required (or --list)")
    summary = ingest(source, root, out, spec, workers, executor, estimator, estimator_weights, depth_model=depth_model)
    print(
        f"{summary['owner']}: {summary['items']} items; clips written {summary['clips']['written']}, "
        f"skipped {summary['clips']['skipped']}, failed {summary['clips']['failed']}",
        file=sys.stderr,
    )
    print(summary["accounting"]["line"], file=sys.stderr)
    print(json.dumps({k: v for k, v in summary.items() if k != "records"}, indent=1))
    return 0
