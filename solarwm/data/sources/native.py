"""What an ingestor hands the shared driver: a native item loaded into canonical conventions.

A source module lists its native items (`NativeItem`: an original id and where its files are)
and loads one into a `NativeClip`: frames (an mp4 on disk, mp4 bytes from an archive, or a
sequence of images), and — for ground-truth sources — camera-to-world poses already converted
to OpenCV axes, pixel intrinsics, per-frame sidecar arrays (actions) and the list of conversion
records that got them there. Anything that makes an item unusable raises `SourceDefect` with a
named reason; the driver turns it into a failed clip record, so nothing is lost silently.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from solarwm.data.video import VideoError, probe_video, read_video_frames

POSE_PATHS = ("gt_pose_metric", "gt_pose_bridge", "estimator")


class SourceDefect(ValueError):
    """A native item cannot become a clip; ``reason`` is a short snake_case name, ``detail`` says why."""

    def __init__(self, reason: str, detail: str = ""):
        self.reason, self.detail = reason, detail
        super().__init__(f"{reason}: {detail}" if detail else reason)


@dataclass(frozen=True)
class NativeItem:
    """One native unit of a source (an episode, a video, a camera of a scene); picklable."""

    original_id: str
    ref: dict[str, Any]  # paths / archive members the source needs to load it


class VideoFrames:
    """Frames of an mp4 file or of mp4 bytes (an archive member), decoded only where asked."""

    def __init__(self, source: str | Path | bytes, name: str, fps: float | None = None):
        self.source, self.name = (source if isinstance(source, bytes) else str(source)), name
        try:
            info = probe_video(self.source)
        except VideoError as e:
            raise SourceDefect("video_unreadable", str(e)) from None
        if not info["num_frames"]:
            raise SourceDefect("video_unreadable", f"{name}: no frames")
        self.count, self.width, self.height = int(info["num_frames"]), int(info["width"]), int(info["height"])
        self.fps = float(fps or info["fps"] or 0.0)

    def read(self, indices: Sequence[int]) -> np.ndarray:
        """uint8 ``[len(indices), H, W, 3]``."""
        try:
            return read_video_frames(self.source, indices, self.name)
        except VideoError as e:
            raise SourceDefect("video_unreadable", str(e)) from None


class ImageFrames:
    """Frames stored as encoded images (PNG/JPEG bytes), one per frame, decoded only where asked."""

    def __init__(self, images: Sequence[bytes], name: str, fps: float):
        if not images:
            raise SourceDefect("video_unreadable", f"{name}: no frames")
        self.images, self.name, self.fps, self.count = list(images), name, float(fps), len(images)
        first = self._decode(0)
        self.height, self.width = first.shape[:2]

    def _decode(self, i: int) -> np.ndarray:
        import cv2

        img = cv2.imdecode(np.frombuffer(self.images[i], np.uint8), cv2.IMREAD_COLOR)
        if img is None:
            raise SourceDefect("video_unreadable", f"{self.name}: frame {i} is not a decodable image")
        return img[..., ::-1]  # BGR → RGB

    def read(self, indices: Sequence[int]) -> np.ndarray:
        """uint8 ``[len(indices), H, W, 3]``."""
        return np.stack([self._decode(int(i)) for i in indices])


@dataclass
class NativeClip:
    """A loaded native item. ``c2w`` ``[N, 4, 4]`` OpenCV and ``K`` ``[N, 4]`` pixels, or ``None`` (video only).

    ``pose_units`` is ``"metric"`` for metric ground truth and ``"relative"`` for ground truth
    known up to one scale per clip (the windowed bridge restores metres). ``arrays`` hold
    per-frame sidecars ``[N, ...]`` written next to the clip as ``<name>.npy``.
    """

    original_id: str
    frames: VideoFrames | ImageFrames
    c2w: np.ndarray | None = None
    K: np.ndarray | None = None
    pose_units: str | None = None
    conversions: list[dict[str, Any]] = field(default_factory=list)
    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)  # source facts kept in provenance.native


@dataclass(frozen=True)
class Source:
    """A registered source: its owner(s), pose path, default spec and the two functions an ingestor provides."""

    name: str
    owners: dict[str, str]  # spec → owner; "*" for every spec
    pose_path: str  # one of POSE_PATHS
    default_spec: str
    list_items: Callable[[Path], list[NativeItem]]
    load: Callable[[Path, NativeItem], NativeClip]
    window_mode: str = "resample"  # or "relabel" (see conversions.window_plan)
    note: str = ""

    def owner(self, spec: str) -> str:
        """The corpus owner of this source at ``spec``; raises ``ValueError`` if the source has none there."""
        if spec in self.owners:
            return self.owners[spec]
        if "*" in self.owners:
            return self.owners["*"]
        choices = ", ".join(f"{o} (--spec {s})" for s, o in self.owners.items())
        raise ValueError(f"source {self.name} has no owner at spec {spec}; its owners: {choices}")


def read_text(path: Path, reason: str = "missing_pose_file") -> str:
    """Text of a native file; a missing file raises ``SourceDefect(reason)``."""
    try:
        return Path(path).read_text()
    except FileNotFoundError:
        raise SourceDefect(reason, f"{path} not found") from None


def check_lengths(clip: NativeClip) -> None:
    """Video, poses, intrinsics and every sidecar must have one entry per frame; poses finite, rotations proper."""
    from solarwm.camera.se3 import PoseError, check_se3

    n = clip.frames.count
    if clip.c2w is not None:
        if len(clip.c2w) != n or clip.K is None or len(clip.K) != n:
            raise SourceDefect("frame_pose_count_mismatch",
                               f"video has {n} frames, poses {len(clip.c2w)}, "
                               f"intrinsics {None if clip.K is None else len(clip.K)}")
        try:
            check_se3(clip.c2w, atol=1e-3)
        except PoseError as e:
            reason = {
                "finite": "pose_nonfinite",
                "det": "pose_improper_rotation",
                "orthonormal": "pose_not_orthonormal",
            }.get(e.check, f"pose_{e.check}")
            raise SourceDefect(reason, e.detail) from None
        if not np.isfinite(clip.K).all() or not (clip.K[:, :2] > 0).all():
            raise SourceDefect("intrinsics_invalid", "intrinsics must be finite with positive focal lengths")
    for name, arr in clip.arrays.items():
        if len(arr) != n:
            raise SourceDefect(f"{name}_count_mismatch", f"video has {n} frames, {name} has {len(arr)} rows")


_PICKLE_ALLOWED = {
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"),
    ("numpy._core.multiarray", "scalar"),
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("builtins", "dict"),
    ("builtins", "list"),
    ("collections", "OrderedDict"),
}


def load_object_npy(data: bytes, name: str) -> Any:
    """An object-dtype ``.npy`` (dicts of arrays, as RealCam-Vid ships its metadata) without running arbitrary pickles.

    Object arrays are stored as a pickle; only numpy's array/scalar reconstructors and plain
    containers may be instantiated, so a hostile file cannot execute code.
    """
    import io
    import pickle

    class _Restricted(pickle.Unpickler):
        def find_class(self, module: str, attr: str) -> Any:
            if (module, attr) not in _PICKLE_ALLOWED:
                raise SourceDefect("metadata_unreadable", f"{name}: refuses to unpickle {module}.{attr}")
            return super().find_class(module, attr)

    fp = io.BytesIO(data)
    version = np.lib.format.read_magic(fp)
    read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    shape, _, dtype = read_header(fp)
    if dtype != np.dtype(object):
        return np.lib.format.read_array(io.BytesIO(data), allow_pickle=False)
    try:
        arr = _Restricted(fp, encoding="latin1").load()
    except (pickle.UnpicklingError, EOFError, AttributeError) as e:
        raise SourceDefect("metadata_unreadable", f"{name}: {e}") from None
    return np.asarray(arr).reshape(shape)
