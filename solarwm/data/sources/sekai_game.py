"""Sekai-Game → owner ``sekai_game`` (ground-truth poses in normalised units → windowed metric bridge).

Native layout (HF ``Lixsp11/Sekai-Project``, ``sekai-game-{walking,drone}.zip`` extracted)::

    <root>/walking/<game>_<start:07d>_<end:07d>.mp4   # 30 fps
    <root>/walking/<game>_<start:07d>_<end:07d>.npz   # extrinsic [N, 4, 4], intrinsic [3, 3]
    <root>/drone/...

``extrinsic`` is camera-to-world in OpenCV axes with translations normalised per clip (not
metres): the poses are only indexed, never flipped (an earlier official build flipped y/z and
broke every clip silently). ``intrinsic`` is normalised by (W, H). One metric scale per output
clip comes from the windowed bridge with a metric reference estimator; without one the clip
fails with ``estimator_unavailable``. An mp4 without its npz fails with ``missing_pose_file``.
The id's frame range (source frames of the game recording) is kept in ``provenance.native``.
Default spec 160f (the released windowing is UNVERIFIED).
"""

from __future__ import annotations

import re
import zipfile
from pathlib import Path

import numpy as np

from solarwm.data.sources import conversions as cv
from solarwm.data.sources.native import NativeClip, NativeItem, Source, SourceDefect, VideoFrames

_RANGE = re.compile(r"_(\d{7})_(\d{7})$")


def list_items(root: Path) -> list[NativeItem]:
    """Every mp4 under the root (subset = its folder)."""
    return [NativeItem(p.stem, {"video": str(p.relative_to(root)), "subset": p.parent.name})
            for p in sorted(root.rglob("*.mp4"))]


def load(root: Path, item: NativeItem) -> NativeClip:
    """Frames of the mp4; c2w and pixel K from the npz next to it."""
    video = root / item.ref["video"]
    frames = VideoFrames(video, item.ref["video"])
    npz = video.with_suffix(".npz")
    if not npz.is_file():
        raise SourceDefect("missing_pose_file", f"{npz.name} not found next to {video.name}")
    try:
        with np.load(npz, allow_pickle=False) as d:
            c2w = np.asarray(d["extrinsic"], dtype=np.float64)
            k_norm = np.asarray(d["intrinsic"], dtype=np.float64)
    except (KeyError, ValueError, OSError, zipfile.BadZipFile) as e:
        raise SourceDefect("pose_file_invalid", f"{npz.name}: {e}") from None
    if c2w.ndim != 3 or c2w.shape[1:] != (4, 4):
        raise SourceDefect("pose_file_invalid", f"{npz.name}: extrinsic must be [N,4,4], got {list(c2w.shape)}")
    K = cv.pixel_intrinsics(k_norm, frames.width, frames.height, len(c2w))
    extra = {"subset": item.ref["subset"]}
    m = _RANGE.search(item.original_id)
    if m:
        extra["game_frame_range"] = [int(m.group(1)), int(m.group(2))]
    conversions = [cv.record(cv.pixel_intrinsics, width=frames.width, height=frames.height)]
    return NativeClip(item.original_id, frames, c2w, K, "relative", conversions, {}, extra)


SOURCE = Source("sekai_game", {"*": "sekai_game"}, "gt_pose_bridge", "160f", list_items, load,
                note="c2w OpenCV, normalised translation; indexed, never flipped")
