"""ABot-World-Explorer-500h → owner ``abot`` (ground-truth poses in unknown units → windowed metric bridge).

Native layout (HF ``acvlab/ABot-World-Explorer-500h``)::

    <root>/metadata.jsonl                                  # {"sample_id": ...} per line (not needed)
    <root>/data/<id[:2]>/<id>/video.mp4                    # 30 fps, 60 s
    <root>/data/<id[:2]>/<id>/annotations.tar
        action.json          {"frames": [{"keys": {"W": bool, ...}}, ...], "control_scheme": ...}
        sparse/0/cameras.txt COLMAP text, one PINHOLE camera: id PINHOLE W H fx fy cx cy
        sparse/0/images.txt  COLMAP text, one pose per frame: IMAGE_ID QW QX QY QZ TX TY TZ CAM NAME

The COLMAP text model is read with ``pycolmap.Reconstruction`` (no hand-written reader). Its
poses are world-to-camera with Hamilton ``wxyz`` quaternions in OpenCV axes; c2w is their inverse. Frame numbers
(``NAME.split("_")[1]``) must be contiguous. Translations have
no declared units, so each output clip gets one metric scale from the windowed bridge.
``action.npy`` is uint8 ``[T, 11]`` for keys ``W A S D Q E I J K L Space``, sliced with the
video. Choice for an UNVERIFIED point: when cameras.txt's W×H differs from the mp4's size, K
is rescaled to the mp4 (``resize_K`` recorded) — the official engine does not check.
"""

from __future__ import annotations

import json
import tarfile
import tempfile
from pathlib import Path

import numpy as np

from solarwm.data.sources import conversions as cv
from solarwm.data.sources.native import NativeClip, NativeItem, Source, SourceDefect, VideoFrames

ACTION_KEYS = ("W", "A", "S", "D", "Q", "E", "I", "J", "K", "L", "Space")


def list_items(root: Path) -> list[NativeItem]:
    """Every episode folder with a video.mp4."""
    return [
        NativeItem(p.parent.name, {"episode": str(p.parent.relative_to(root))})
        for p in sorted((root / "data").glob("*/*/video.mp4"))
    ]


def _member(tar: tarfile.TarFile, name: str, reason: str) -> str:
    for m in tar.getmembers():
        if m.name.lstrip("./") == name:
            f = tar.extractfile(m)
            if f is not None:
                return f.read().decode()
    raise SourceDefect(reason, f"annotations.tar has no {name}")


def read_colmap_text(cameras: str, images: str) -> tuple[int, int, np.ndarray, np.ndarray, np.ndarray]:
    """COLMAP cameras.txt + images.txt, read with ``pycolmap.Reconstruction`` → (W, H, [fx, fy, cx, cy],
    qvec wxyz ``[N, 4]``, tvec ``[N, 3]``) sorted by frame number; one PINHOLE camera, contiguous frames."""
    import pycolmap

    with tempfile.TemporaryDirectory(prefix="solarwm-abot-") as tmp:
        d = Path(tmp)
        (d / "cameras.txt").write_text(cameras)
        # COLMAP's reader drops the last image when its (empty) POINTS2D line is cut off at EOF.
        (d / "images.txt").write_text(images.rstrip("\n") + "\n\n")
        (d / "points3D.txt").write_text("")  # the annotations ship no points; pycolmap wants the file
        rec = pycolmap.Reconstruction()
        try:
            rec.read_text(str(d))
        except Exception as e:  # pycolmap raises its own error types for unparsable text
            raise SourceDefect("pose_file_invalid", f"sparse/0 is not a readable COLMAP text model: {e}") from None
    if not rec.cameras:
        raise SourceDefect("pose_file_invalid", "cameras.txt has no camera")
    cam = rec.cameras[min(rec.cameras)]
    if cam.model_name != "PINHOLE":
        raise SourceDefect("camera_model_unsupported", f"expected a PINHOLE camera, got {cam.model_name}")
    if not rec.images:
        raise SourceDefect("pose_file_invalid", "images.txt has no image lines")
    rows = sorted(rec.images.values(), key=lambda im: im.image_id)
    try:
        numbers = [int(im.name.split("_")[1].split(".")[0]) for im in rows]
    except (IndexError, ValueError):
        raise SourceDefect(
            "pose_file_invalid", f"image names must look like frame_000001.png, got {rows[0].name}"
        ) from None
    if numbers != list(range(numbers[0], numbers[0] + len(numbers))):
        raise SourceDefect("pose_frames_not_contiguous", "images.txt frame numbers are not contiguous")
    poses = [im.cam_from_world() for im in rows]
    q = np.array([np.asarray(T.rotation.quat)[[3, 0, 1, 2]] for T in poses])  # Eigen xyzw → wxyz
    t = np.array([np.asarray(T.translation) for T in poses])
    return int(cam.width), int(cam.height), np.asarray(cam.params[:4], np.float64), q, t


def parse_actions(text: str) -> tuple[np.ndarray, str | None]:
    """action.json → uint8 ``[T, 11]`` key states and the control scheme."""
    try:
        doc = json.loads(text)
        rows = [[bool(f["keys"].get(k, False)) for k in ACTION_KEYS] for f in doc["frames"]]
    except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
        raise SourceDefect("action_file_invalid", f"action.json: {e}") from None
    return np.asarray(rows, dtype=np.uint8).reshape(-1, len(ACTION_KEYS)), doc.get("control_scheme")


def load(root: Path, item: NativeItem) -> NativeClip:
    """Frames, COLMAP poses inverted to c2w, PINHOLE K and key actions of one episode."""
    ep = root / item.ref["episode"]
    frames = VideoFrames(ep / "video.mp4", f"{item.ref['episode']}/video.mp4")
    if not (ep / "annotations.tar").is_file():
        raise SourceDefect("missing_pose_file", f"{item.ref['episode']}/annotations.tar not found")
    try:
        with tarfile.open(ep / "annotations.tar") as tar:
            cams = _member(tar, "sparse/0/cameras.txt", "missing_pose_file")
            imgs = _member(tar, "sparse/0/images.txt", "missing_pose_file")
            actions = _member(tar, "action.json", "missing_action_file")
    except tarfile.TarError as e:
        raise SourceDefect("archive_unreadable", f"annotations.tar: {e}") from None
    cam_w, cam_h, k, q, t = read_colmap_text(cams, imgs)
    c2w = cv.quaternion_w2c_to_c2w(q, t, "wxyz")
    K = np.tile(k, (len(c2w), 1))
    conversions = [cv.record(cv.quaternion_w2c_to_c2w, order="wxyz")]
    if (cam_w, cam_h) != (frames.width, frames.height):
        K = cv.resize_K(K, (cam_w, cam_h), (frames.width, frames.height))
        conversions.append(cv.record(cv.resize_K, from_size=[cam_w, cam_h], to_size=[frames.width, frames.height]))
    action, scheme = parse_actions(actions)
    extra = {"control_scheme": scheme, "action_keys": list(ACTION_KEYS), "scale_source": "colmap_arbitrary"}
    return NativeClip(item.original_id, frames, c2w, K, "relative", conversions, {"action": action}, extra)


SOURCE = Source(
    "abot",
    {"*": "abot"},
    "gt_pose_bridge",
    "960f",
    list_items,
    load,
    note="COLMAP w2c wxyz, unknown units; actions [T,11]",
)
