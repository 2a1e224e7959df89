"""Every conversion from a source's native conventions to the canonical clip, in one place.

Each conversion is a small pure function with a name and a version (the ``@conversion``
decorator); an ingestor that applies one appends ``record(fn, **params)`` to the clip's
``provenance.conversions``, so a clip says exactly which conversions made it. The geometry
itself lives in `solarwm.camera` (conventions, se3, intrinsics); these functions only choose
and parameterise it per native layout.

Time: every output clip is a whole window of a spec (81, 160 or 960 frames at 16 fps).
`window_plan` picks the same source frame indices for video, poses, intrinsics and actions,
and never upsamples.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from solarwm.camera import conventions
from solarwm.camera.intrinsics import focal_mm_to_pixels, normalized_to_pixels, resize_intrinsics
from solarwm.data.sources.native import SourceDefect

SPECS: dict[str, tuple[int, float]] = {"81f": (81, 16.0), "160f": (160, 16.0), "960f": (960, 16.0)}


def conversion(name: str, version: int) -> Callable[[Callable], Callable]:
    """Tag a pure function as the conversion ``name`` at ``version``."""

    def wrap(fn: Callable) -> Callable:
        fn.conversion_name, fn.conversion_version = name, version  # type: ignore[attr-defined]
        return fn

    return wrap


def record(fn: Callable, **params: Any) -> dict[str, Any]:
    """The provenance record of applying conversion ``fn`` with ``params`` (JSON-ready)."""
    out: dict[str, Any] = {"name": fn.conversion_name, "version": fn.conversion_version}  # type: ignore[attr-defined]
    for k, v in params.items():
        out[k] = v.tolist() if isinstance(v, np.ndarray) else v
    return out


@conversion("w2c_to_c2w", 1)
def w2c_to_c2w(w2c: Any) -> np.ndarray:
    """World-to-camera ``[N, 4, 4]`` (or ``[N, 3, 4]``) → camera-to-world ``[N, 4, 4]``."""
    w2c = np.asarray(w2c, dtype=np.float64)
    if w2c.shape[-2:] == (3, 4):
        pad = np.zeros(w2c.shape[:-2] + (1, 4))
        pad[..., 0, 3] = 1.0
        w2c = np.concatenate([w2c, pad], axis=-2)
    if w2c.shape[-2:] != (4, 4):
        raise SourceDefect("pose_shape", f"extrinsics must be [N,4,4] or [N,3,4], got {list(w2c.shape)}")
    return conventions.w2c_to_c2w(w2c)


@conversion("quaternion_w2c_to_c2w", 1)
def quaternion_w2c_to_c2w(q: Any, t: Any, order: str = "wxyz") -> np.ndarray:
    """w2c as quaternion ``[N, 4]`` (``wxyz`` COLMAP/OmniWorld, ``xyzw`` scipy) + translation ``[N, 3]`` → c2w."""
    q, t = np.asarray(q, dtype=np.float64), np.asarray(t, dtype=np.float64)
    if not (np.isfinite(q).all() and np.isfinite(t).all()):
        raise SourceDefect("pose_nonfinite", "non-finite quaternion or translation")
    try:
        return conventions.w2c_to_c2w(conventions.pose_from_quaternion(q, t, order))
    except ValueError as e:
        raise SourceDefect("pose_invalid", str(e)) from None


@conversion("unreal_to_opencv", 1)
def unreal_to_opencv(m_rows: Any) -> np.ndarray:
    """Unreal row-vector c2w ``[N, 4, 4]`` (translation in 4th row, LH x-fwd y-right z-up) → OpenCV c2w (same units)."""
    return conventions.unreal_to_opencv(conventions.row_vector_to_column(m_rows))


@conversion("centimetres_to_metres", 1)
def centimetres_to_metres(c2w: Any) -> np.ndarray:
    """Translations in cm → m (rotations untouched)."""
    return scale_translation(c2w, 0.01)


@conversion("metric_scale", 1)
def scale_translation(c2w: Any, scale: float) -> np.ndarray:
    """Multiply camera centres by ``scale`` (one factor per clip; rotations are scale-free)."""
    out = np.array(c2w, dtype=np.float64, copy=True)
    out[..., :3, 3] *= float(scale)
    return out


@conversion("scale_w2c_translation", 1)
def scale_w2c_translation(w2c: Any, scale: float) -> np.ndarray:
    """Multiply w2c translations by ``scale`` (RealCam-Vid's ``align_factor``; same as scaling c2w centres)."""
    out = np.array(w2c, dtype=np.float64, copy=True)
    out[..., :3, 3] *= float(scale)
    return out


@conversion("normalized_to_pixel_K", 1)
def pixel_intrinsics(K: Any, width: int, height: int, frames: int) -> np.ndarray:
    """Image-normalised intrinsics ``(4,)``, ``(N, 4)``, ``(3, 3)`` or ``(N, 3, 3)`` → pixels ``[frames, 4]``."""
    K = np.asarray(K, dtype=np.float64)
    if K.shape[-2:] == (3, 3):
        K = np.stack([K[..., 0, 0], K[..., 1, 1], K[..., 0, 2], K[..., 1, 2]], axis=-1)
    if K.shape == (4,):
        K = np.tile(K, (frames, 1))
    if K.ndim != 2 or K.shape[1] != 4:
        raise SourceDefect("intrinsics_shape", f"cannot read intrinsics of shape {list(K.shape)}")
    return normalized_to_pixels(K, width, height)


@conversion("focal_mm_to_pixel_K", 1)
def focal_mm_intrinsics(focal_mm: float, sensor_mm: float, width: int, height: int, frames: int) -> np.ndarray:
    """A physical focal length on a sensor ``sensor_mm`` wide → pixel K ``[frames, 4]``, centred principal point."""
    f = float(focal_mm_to_pixels(focal_mm, sensor_mm, width))
    return np.tile([f, f, width / 2.0, height / 2.0], (frames, 1)).astype(np.float64)


@conversion("resize_K", 1)
def resize_K(K: Any, from_size: tuple[int, int], to_size: tuple[int, int]) -> np.ndarray:
    """Pixel K of an image ``from_size`` (W, H) → pixel K of the same view at ``to_size`` (W, H)."""
    return resize_intrinsics(np.asarray(K, dtype=np.float64), to_size[0] / from_size[0], to_size[1] / from_size[1])


@dataclass(frozen=True)
class Window:
    """One output clip: source frames ``[start, end)`` and the ``frames`` source indices it shows."""

    index: int
    start: int
    end: int
    indices: np.ndarray  # int64 [T]


def _round_half_up(num: int, den: int) -> int:
    """``floor(num/den + 0.5)`` exactly, in integers (no banker's rounding, no float drift)."""
    return (2 * num + den) // (2 * den)


@conversion("resample_fps", 1)
def window_plan(num_frames: int, src_fps: float, spec: str) -> list[Window]:
    """Whole windows of ``spec`` at its fps: ``win = round(T/fps_out · src_fps)`` source frames each.

    Output frame ``j`` of window ``w`` shows source frame ``w·win + round(j·win/T)`` (half up),
    the frame nearest to ``j/fps_out`` seconds into the window. Raises ``SourceDefect`` with
    ``fps_below_target`` when a window would need more frames than the source has per window
    (that would upsample) and ``too_short`` when not one whole window fits.
    """
    frames, fps = SPECS[spec]
    if not src_fps or src_fps <= 0:
        raise SourceDefect("fps_unknown", "the source frame rate is unknown")
    # T/fps·src_fps in rationals via milli-fps, so 29.97 and 30 both round as intended.
    milli = int(round(src_fps * 1000))
    win = max(2, _round_half_up(frames * milli, int(round(fps * 1000))))
    if win < frames:
        raise SourceDefect(
            "fps_below_target",
            f"{src_fps:g} fps gives {win} frames per {frames}-frame window at {fps:g} fps (would upsample)",
        )
    n_win = num_frames // win
    if n_win == 0:
        raise SourceDefect("too_short", f"{num_frames} frames at {src_fps:g} fps; one {spec} window needs {win}")
    step = np.array([_round_half_up(j * win, frames) for j in range(frames)], dtype=np.int64)
    return [Window(w, w * win, (w + 1) * win, np.minimum(num_frames - 1, w * win + step)) for w in range(n_win)]


@conversion("relabel_fps", 1)
def relabel_plan(num_frames: int, src_fps: float, spec: str, tolerance: float = 0.1) -> list[Window]:
    """Whole windows of ``T`` consecutive source frames played at the spec's fps (no frame dropped or made up).

    Only for sources whose native rate is within ``tolerance`` of the spec's (MultiCamVideo: 81
    frames rendered at 15 fps, played at 16 fps — a 16/15 speed-up, as the official engine does).
    """
    frames, fps = SPECS[spec]
    if not src_fps or abs(fps / src_fps - 1.0) > tolerance:
        raise SourceDefect(
            "fps_mismatch", f"{src_fps:g} fps cannot be relabelled to {fps:g} fps (tolerance {tolerance:.0%})"
        )
    n_win = num_frames // frames
    if n_win == 0:
        raise SourceDefect("too_short", f"{num_frames} frames; one {spec} window needs {frames}")
    return [
        Window(w, w * frames, (w + 1) * frames, np.arange(w * frames, (w + 1) * frames, dtype=np.int64))
        for w in range(n_win)
    ]


PLANS: dict[str, Callable[..., list[Window]]] = {"resample": window_plan, "relabel": relabel_plan}
