"""The canonical clip, paper eq. (4): S = (V, P, K, C, m, q, π).

On disk one folder per clip, named by its id, under a corpus folder::

    <clip_id>/video.mp4        V  H.264 yuv420p
    <clip_id>/poses.npy        P  c2w float64 [N, 4, 4], OpenCV axes, metric unless meta.pose_units says "relative"
    <clip_id>/intrinsics.npy   K  float64 [N, 4] (fx, fy, cx, cy) in pixels of video.mp4
    <clip_id>/prompt.txt       C  caption + one newline
    <clip_id>/meta.json        C, m (media metadata), q (flat metric record), π (provenance), selection

``meta.pose_units`` is ``"metric"`` (the default when absent: every GT source and the rendered
worlds) or ``"relative"`` (translation known only up to one global scale, e.g. a structure-from-
motion estimate); relative clips fail the metric camera gates by name.

Writing is atomic (a temporary sibling folder renamed into place); reading validates that
frames, poses and intrinsics share exactly the same frame indices and are well formed.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from solarwm.camera.integrity import POSE_UNITS
from solarwm.camera.se3 import PoseError, check_se3
from solarwm.data.video import VideoError, probe_video, read_video, write_video
from solarwm.util.atomic import atomic_write_text

SCHEMA = "solarwm.clip/1"
# Fixed namespace so clip ids are stable across machines and releases.
CLIP_NAMESPACE = uuid.UUID("6f1c3b52-2d0e-5c8a-9a57-50a4b7e3c1d0")
FILES = ("video.mp4", "poses.npy", "intrinsics.npy", "meta.json", "prompt.txt")


class ClipError(ValueError):
    """A clip failed a named contract check; ``clip`` names the folder or id."""

    def __init__(self, clip: str, check: str, detail: str):
        self.clip, self.check, self.detail = str(clip), check, detail
        super().__init__(f"{clip}: {check}: {detail}")


def clip_id(owner: str, original_id: str, start: int, end: int) -> str:
    """Deterministic id: uuid5 of owner, original id and the frame interval ``[start, end)``."""
    return str(uuid.uuid5(CLIP_NAMESPACE, f"{owner}\x1f{original_id}\x1f{int(start)}\x1f{int(end)}"))


@dataclass
class Clip:
    """One canonical clip in memory. ``frames`` is uint8 ``[N, H, W, 3]`` or ``None`` when not loaded."""

    clip_id: str
    frames: np.ndarray | None
    c2w: np.ndarray
    K: np.ndarray
    caption: str
    meta: dict[str, Any]
    metrics: dict[str, Any] = field(default_factory=dict)
    provenance: dict[str, Any] = field(default_factory=dict)
    selection: dict[str, Any] | None = None

    @property
    def owner(self) -> str:
        """The dataset owner from the provenance."""
        return self.provenance.get("owner", "")

    def to_meta_json(self) -> dict[str, Any]:
        """The ``meta.json`` document of this clip."""
        doc = {
            "schema": SCHEMA, "clip_id": self.clip_id, "caption": self.caption,
            "meta": self.meta, "metrics": self.metrics, "provenance": self.provenance,
        }
        if self.selection is not None:
            doc["selection"] = self.selection
        return doc


def pose_units(meta: dict[str, Any]) -> str:
    """The clip's ``meta.pose_units`` (``"metric"`` when absent); raises ``ClipError`` on an unknown value."""
    units = meta.get("pose_units", "metric")
    if units not in POSE_UNITS:
        raise ClipError(str(meta.get("clip_id", "?")), "pose_units", f"must be one of {POSE_UNITS}, got {units!r}")
    return units


def check_alignment(name: str, c2w: np.ndarray, K: np.ndarray, num_frames: int | None) -> list[ClipError]:
    """Structural checks only: array shapes and one frame index shared by video, poses and K.

    A clip failing these cannot be frame-aligned at all; non-finite values are not checked
    here (they are a camera-integrity matter that a policy rejects).
    """
    errors: list[ClipError] = []
    if c2w.ndim != 3 or c2w.shape[1:] != (4, 4):
        errors.append(ClipError(name, "poses_shape", f"poses.npy must be [N,4,4], got {list(c2w.shape)}"))
    if K.ndim != 2 or K.shape[1] != 4:
        errors.append(ClipError(name, "intrinsics_shape", f"intrinsics.npy must be [N,4], got {list(K.shape)}"))
    if errors:
        return errors
    if num_frames is not None and not (num_frames == len(c2w) == len(K)):
        errors.append(
            ClipError(name, "frame_count", f"video has {num_frames} frames, poses {len(c2w)}, intrinsics {len(K)}")
        )
    elif len(c2w) != len(K):
        errors.append(ClipError(name, "frame_count", f"poses {len(c2w)} vs intrinsics {len(K)}"))
    return errors


def _check_arrays(name: str, c2w: np.ndarray, K: np.ndarray, num_frames: int | None) -> list[ClipError]:
    errors = check_alignment(name, c2w, K, num_frames)
    if errors:
        return errors
    try:
        check_se3(c2w)
    except PoseError as e:
        errors.append(ClipError(name, f"pose_{e.check}", e.detail))
    if not np.isfinite(K).all():
        errors.append(ClipError(name, "intrinsics_finite", "non-finite intrinsics"))
    elif not (K[:, :2] > 0).all():
        errors.append(ClipError(name, "focal_positive", "focal lengths must be positive"))
    return errors


def write_clip(
    clip: Clip,
    corpus_dir: str | Path,
    validate: bool = True,
    fps: float | None = None,
    arrays: dict[str, np.ndarray] | None = None,
) -> Path:
    """Write ``clip`` as ``corpus_dir/<clip_id>/`` atomically; returns the folder.

    ``validate=False`` exists only to write deliberately broken fixtures. Media metadata
    (fps, size, frame count, codec) is filled from the encoded video. ``arrays`` are optional
    per-frame sidecars (e.g. ``action``) written as ``<name>.npy``; each needs one row per frame.
    """
    corpus_dir = Path(corpus_dir)
    corpus_dir.mkdir(parents=True, exist_ok=True)
    final = corpus_dir / clip.clip_id
    if clip.frames is None:
        raise ClipError(clip.clip_id, "video", "cannot write a clip without frames")
    c2w = np.asarray(clip.c2w, dtype=np.float64)
    K = np.asarray(clip.K, dtype=np.float64)
    if validate:
        errors = _check_arrays(clip.clip_id, c2w, K, len(clip.frames))
        if errors:
            raise errors[0]
        pose_units(clip.meta)
    tmp = corpus_dir / f".{clip.clip_id}.{os.getpid()}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        rate = fps or clip.meta.get("fps")
        if not rate:
            raise ClipError(clip.clip_id, "fps", "clip.meta['fps'] (or fps=) is required")
        write_video(tmp / "video.mp4", clip.frames, float(rate))
        np.save(tmp / "poses.npy", c2w)
        np.save(tmp / "intrinsics.npy", K)
        for name, arr in (arrays or {}).items():
            if validate and len(arr) != len(clip.frames):
                raise ClipError(
                    clip.clip_id, f"{name}_count", f"{name} has {len(arr)} rows for {len(clip.frames)} frames"
                )
            np.save(tmp / f"{name}.npy", np.asarray(arr))
        (tmp / "prompt.txt").write_text(clip.caption.strip() + "\n")
        clip.meta = {**clip.meta, **probe_video(tmp / "video.mp4")}
        (tmp / "meta.json").write_text(json.dumps(clip.to_meta_json(), indent=1, sort_keys=True))
        if final.exists():
            shutil.rmtree(final)
        tmp.rename(final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def write_failed_clip(
    corpus_dir: str | Path,
    cid: str,
    stage: str,
    version: str,
    error: str,
    provenance: dict[str, Any],
) -> Path:
    """Record ``cid`` as failed at ``stage``: a ``meta.json``-only clip folder, written atomically.

    ``provenance.stages[stage]`` is ``{"status": "failed", "version", "error"}``, so
    `solarwm.data.accounting.account` counts the clip as failed with its reason; a later
    successful ``write_clip`` of the same id replaces the record.
    """
    folder = Path(corpus_dir) / cid
    prov = {**provenance, "stages": {stage: {"status": "failed", "version": version, "error": error}}}
    doc = {"schema": SCHEMA, "clip_id": cid, "caption": "", "meta": {}, "metrics": {}, "provenance": prov}
    tmp = folder.parent / f".{folder.name}.{os.getpid()}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    (tmp / "meta.json").write_text(json.dumps(doc, indent=1, sort_keys=True))
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)
    return folder


def read_meta(folder: str | Path) -> dict[str, Any]:
    """Parse ``meta.json`` of a clip folder; raises ``ClipError`` (check ``meta``) if absent or invalid."""
    folder = Path(folder)
    try:
        doc = json.loads((folder / "meta.json").read_text())
    except FileNotFoundError:
        raise ClipError(str(folder), "meta", "meta.json not found") from None
    except json.JSONDecodeError as e:
        raise ClipError(str(folder), "meta", f"meta.json is not valid JSON: {e}") from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise ClipError(str(folder), "meta", f"meta.json schema is not {SCHEMA!r}")
    problem = _structure_problem(doc)
    if problem:
        raise ClipError(str(folder), "meta", f"meta.json {problem}")
    return doc


def _structure_problem(doc: dict[str, Any]) -> str | None:
    """What makes a parsed ``meta.json`` unusable by the verbs (wrong container types), or ``None``.

    Only the containers every verb walks are checked; the values inside ``metrics`` (and a mistyped
    caption) are the policy's to reject, per clip, by name.
    """
    if not isinstance(doc.get("clip_id"), str):
        return f"`clip_id` must be a string, got {type(doc.get('clip_id')).__name__}"
    for key, required in (("meta", True), ("provenance", True), ("metrics", False)):
        if required and key not in doc:
            return f"has no `{key}` object"
        if key in doc and not isinstance(doc[key], dict):
            return f"`{key}` must be an object, got {type(doc[key]).__name__}"
    if doc.get("selection") is not None and not isinstance(doc["selection"], dict):
        return f"`selection` must be an object, got {type(doc['selection']).__name__}"
    prov = doc["provenance"]
    if "owner" in prov and not isinstance(prov["owner"], str):
        return f"`provenance.owner` must be a string, got {type(prov['owner']).__name__}"
    stages = prov.get("stages", {})
    if not isinstance(stages, dict):
        return f"`provenance.stages` must be an object, got {type(stages).__name__}"
    for name, record in stages.items():
        if not isinstance(record, dict):
            return f"`provenance.stages.{name}` must be an object, got {type(record).__name__}"
    return None


def update_meta(folder: str | Path, fn: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """Apply ``fn`` to the parsed ``meta.json`` in place and rewrite it atomically."""
    folder = Path(folder)
    doc = read_meta(folder)
    fn(doc)
    atomic_write_text(folder / "meta.json", json.dumps(doc, indent=1, sort_keys=True))
    if isinstance(doc.get("caption"), str):  # a mistyped caption is the policy's to reject, not ours to crash on
        prompt = folder / "prompt.txt"
        text = doc["caption"].strip() + "\n"
        if not prompt.exists() or prompt.read_text() != text:
            atomic_write_text(prompt, text)
    return doc


def _load_array(folder: Path, name: str) -> np.ndarray:
    try:
        return np.load(folder / name, allow_pickle=False)
    except FileNotFoundError:
        raise ClipError(str(folder), "missing_file", f"{name} not found") from None
    except ValueError as e:
        raise ClipError(str(folder), "array", f"{name} cannot be read: {e}") from None


def validate_clip(folder: str | Path) -> list[ClipError]:
    """Every contract failure of a clip folder (empty list: valid). Decodes the video once."""
    folder = Path(folder)
    try:
        meta = read_meta(folder)
        c2w = _load_array(folder, "poses.npy")
        K = _load_array(folder, "intrinsics.npy")
    except ClipError as e:
        return [e]
    try:
        n = len(read_video(folder / "video.mp4"))
    except VideoError as e:
        return [ClipError(str(folder), "video", str(e))]
    errors = _check_arrays(str(folder), c2w, K, n)
    if meta["meta"].get("num_frames") != n:
        errors.append(
            ClipError(str(folder), "meta_num_frames", f"meta.json says {meta['meta'].get('num_frames')}, video has {n}")
        )
    return errors


def read_clip(folder: str | Path, load_video: bool = True, validate: bool = True) -> Clip:
    """Load a clip folder; with ``validate`` raises the first ``ClipError`` of the contract checks."""
    folder = Path(folder)
    meta = read_meta(folder)
    c2w = _load_array(folder, "poses.npy")
    K = _load_array(folder, "intrinsics.npy")
    frames = None
    if load_video:
        try:
            frames = read_video(folder / "video.mp4")
        except VideoError as e:
            raise ClipError(str(folder), "video", str(e)) from None
    if validate:
        n = len(frames) if frames is not None else meta["meta"].get("num_frames")
        errors = _check_arrays(str(folder), c2w, K, n)
        if errors:
            raise errors[0]
    return Clip(
        clip_id=meta["clip_id"],
        frames=frames,
        c2w=c2w,
        K=K,
        caption=meta.get("caption", ""),
        meta=meta["meta"],
        metrics=meta.get("metrics", {}),
        provenance=meta.get("provenance", {}),
        selection=meta.get("selection"),
    )


def iter_clip_dirs(corpus_dir: str | Path) -> list[Path]:
    """Clip folders of a corpus, sorted by id (hidden temporary folders excluded)."""
    corpus_dir = Path(corpus_dir)
    if not corpus_dir.is_dir():
        raise FileNotFoundError(f"{corpus_dir}: corpus folder not found")
    return sorted(p for p in corpus_dir.iterdir() if p.is_dir() and not p.name.startswith("."))
