"""RealCam-Vid → owner ``realcam_vid`` (ground-truth poses, metric).

Native layout (HF ``MuteApo/RealCam-Vid``)::

    <root>/RealCam-Vid_train.npz          # arr_0: object array of dicts, one per clip
    <root>/RealCam-Vid_test.npz
    <root>/zip/RealEstate10K/<name>.zip   # members RealEstate10K/train/<scene>/<id>.mp4

Each metadata dict: ``video_path`` ("RealEstate10K/train/<scene>/<id>.mp4"),
``camera_extrinsics`` ``[N, 4, 4]`` (or ``[N, 3, 4]``) world-to-camera in OpenCV axes and
relative (MonST3R) units, ``align_factor`` (relative → metres), ``camera_intrinsics`` ``(4,)``
normalised by W, H. Conversions, in the official order: w2c translations × align_factor, then
c2w = inverse, then K × (W, H). Only the RealEstate10K subset is read (the DL3DV and MiraData
subsets duplicate other owners). A clip whose stem has no metadata entry fails with
``missing_pose_file``. The metadata's object arrays are read with a restricted unpickler.
Default spec 160f (the released length is UNVERIFIED; 10 s suits RE10K clip lengths).
"""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from solarwm.data.sources import conversions as cv
from solarwm.data.sources.native import NativeClip, NativeItem, Source, SourceDefect, VideoFrames, load_object_npy

SUBSET = "RealEstate10K"
_META: dict[str, dict[str, dict[str, Any]]] = {}  # root → stem → entry, loaded once per process


def _metadata(root: Path) -> dict[str, dict[str, Any]]:
    """Metadata entries of every ``RealCam-Vid_*.npz`` at the root, by video stem."""
    key = str(root)
    if key not in _META:
        index: dict[str, dict[str, Any]] = {}
        for npz in sorted(root.glob("RealCam-Vid_*.npz")):
            with zipfile.ZipFile(npz) as z:
                entries = load_object_npy(z.read("arr_0.npy"), str(npz))
            for e in entries.reshape(-1):
                if isinstance(e, dict) and "video_path" in e:
                    index[Path(str(e["video_path"])).stem] = e
        _META[key] = index
    return _META[key]


def list_items(root: Path) -> list[NativeItem]:
    """Every mp4 member of the RealEstate10K zips."""
    items = []
    for zpath in sorted((root / "zip" / SUBSET).glob("*.zip")):
        try:
            with zipfile.ZipFile(zpath) as z:
                names = sorted(n for n in z.namelist() if n.endswith(".mp4"))
        except zipfile.BadZipFile:
            items.append(NativeItem(zpath.stem, {"zip": str(zpath.relative_to(root)), "member": None}))
            continue
        items += [NativeItem(Path(n).stem, {"zip": str(zpath.relative_to(root)), "member": n}) for n in names]
    return items


def load(root: Path, item: NativeItem) -> NativeClip:
    """Video bytes from the zip, metric OpenCV c2w and pixel K from the metadata entry."""
    if item.ref["member"] is None:
        raise SourceDefect("archive_unreadable", f"{item.ref['zip']} is not a readable zip")
    with zipfile.ZipFile(root / item.ref["zip"]) as z:
        frames = VideoFrames(z.read(item.ref["member"]), f"{item.ref['zip']}:{item.ref['member']}")
    entry = _metadata(root).get(item.original_id)
    if entry is None:
        raise SourceDefect("missing_pose_file", f"no RealCam-Vid_*.npz entry for {item.original_id}")
    try:
        w2c = np.asarray(entry["camera_extrinsics"], dtype=np.float64)
        af = float(entry["align_factor"])
        k_norm = np.asarray(entry["camera_intrinsics"], dtype=np.float64)
    except (KeyError, TypeError, ValueError) as e:
        raise SourceDefect("pose_file_invalid", f"metadata entry of {item.original_id}: {e}") from None
    if not np.isfinite(af) or af <= 0:
        raise SourceDefect("pose_file_invalid", f"align_factor must be a positive number, got {af}")
    n = len(w2c)
    c2w = cv.w2c_to_c2w(cv.scale_w2c_translation(w2c, af))
    K = cv.pixel_intrinsics(k_norm, frames.width, frames.height, n)
    conversions = [cv.record(cv.scale_w2c_translation, scale=af, why="align_factor: relative to metres"),
                   cv.record(cv.w2c_to_c2w),
                   cv.record(cv.pixel_intrinsics, width=frames.width, height=frames.height)]
    extra = {"video_path": str(entry.get("video_path")), "zip": item.ref["zip"], "align_factor": af}
    return NativeClip(item.original_id, frames, c2w, K, "metric", conversions, {}, extra)


SOURCE = Source("realcam_vid", {"*": "realcam_vid"}, "gt_pose_metric", "160f", list_items, load,
                note="RealEstate10K subset; w2c x align_factor, inverted; K normalised")
