"""MultiCamVideo (ReCamMaster) → owner ``multicamvideo`` (ground-truth poses, metric).

Native layout (``KwaiVGI/ReCamMaster``, ``MultiCamVideo-Dataset`` extracted)::

    <root>/train/f<focal_mm>_aperture<a>/scene<N>/videos/cam01.mp4 ... cam10.mp4   # 81 frames, 15 fps
    <root>/train/f<focal_mm>_aperture<a>/scene<N>/cameras/camera_extrinsics.json
        {"frame0": {"cam01": "[a b c d] [e f g h] [i j k l] [tx ty tz 1]", ...}, ...}

Each matrix is an Unreal Engine camera-to-world in row-vector form (translation in the 4th
row), left-handed (x forward, y right, z up), in centimetres. Conversions: transpose to
column form and change world and camera axes with ``C = [[0,1,0],[0,0,-1],[1,0,0]]``
(``R_cv = C·R·Cᵀ``, ``t_cv = C·t``; det +1), then cm → m. K from the folder's focal length on
the 23.76 mm sensor, principal point at the centre. One item per camera.

Time (a choice; the release rule is UNVERIFIED): 81 frames at 15 fps cannot fill an 81f window
at 16 fps without upsampling, so the 81 frames are kept 1:1 and played at 16 fps (a 16/15
speed-up, as the official engine does), recorded as ``relabel_fps``. Static rig cameras are
not skipped here; the camera gates of the policy reject them with a reason.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np

from solarwm.data.sources import conversions as cv
from solarwm.data.sources.native import NativeClip, NativeItem, Source, SourceDefect, VideoFrames, read_text

SENSOR_MM = 23.76
DEFAULT_FOCAL_MM = 35.0
_FOCAL = re.compile(r"(?:^|/)f(\d+(?:\.\d+)?)_")


def list_items(root: Path) -> list[NativeItem]:
    """Every ``videos/camNN.mp4`` of every scene."""
    items = []
    for p in sorted(root.glob("*/*/scene*/videos/cam*.mp4")):
        scene = p.parent.parent.relative_to(root)
        items.append(NativeItem(f"{str(scene).replace('/', '_')}_{p.stem}", {"scene": str(scene), "cam": p.stem}))
    return items


def parse_matrix(text: str) -> np.ndarray:
    """``"[a b c d] [e f g h] [i j k l] [tx ty tz 1]"`` → the 4×4 as written (row-vector form)."""
    vals = [float(v) for v in re.findall(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|nan|inf", text)]
    if len(vals) != 16:
        raise SourceDefect("pose_file_invalid", f"a camera matrix needs 16 numbers, got {len(vals)}")
    return np.array(vals).reshape(4, 4)


def load(root: Path, item: NativeItem) -> NativeClip:
    """Frames of one camera; OpenCV metric c2w from the scene's extrinsics json; K from the focal length."""
    scene = root / item.ref["scene"]
    frames = VideoFrames(scene / "videos" / f"{item.ref['cam']}.mp4", f"{item.ref['scene']}/{item.ref['cam']}.mp4")
    try:
        doc = json.loads(read_text(scene / "cameras" / "camera_extrinsics.json"))
        keys = sorted(doc, key=lambda k: int(k.removeprefix("frame")))
        rows = np.stack([parse_matrix(doc[k][item.ref["cam"]]) for k in keys])
    except (json.JSONDecodeError, KeyError, ValueError, AttributeError) as e:
        raise SourceDefect("pose_file_invalid", f"camera_extrinsics.json: {e!r}") from None
    c2w = cv.centimetres_to_metres(cv.unreal_to_opencv(rows))
    m = _FOCAL.search(item.ref["scene"])
    focal = float(m.group(1)) if m else DEFAULT_FOCAL_MM
    K = cv.focal_mm_intrinsics(focal, SENSOR_MM, frames.width, frames.height, len(c2w))
    conversions = [cv.record(cv.unreal_to_opencv), cv.record(cv.centimetres_to_metres),
                   cv.record(cv.focal_mm_intrinsics, focal_mm=focal, sensor_mm=SENSOR_MM)]
    extra = {"scene": item.ref["scene"], "camera": item.ref["cam"], "focal_mm": focal}
    return NativeClip(item.original_id, frames, c2w, K, "metric", conversions, {}, extra)


SOURCE = Source("multicamvideo", {"*": "multicamvideo"}, "gt_pose_metric", "81f", list_items, load,
                window_mode="relabel", note="Unreal row-vector c2w, cm; 15 fps relabelled to 16")
