"""Camera trajectories: segment generators, smooth composition and the trajectory file format.

World frame: right-handed, z up, metric. A camera state is a position, a heading (yaw about
+z, positive turns left/counter-clockwise seen from above; pitch, positive looks up) and a
zoom factor multiplying the base focal length. Segments are per-step increments in the
camera's own frame (forward along the heading, right, world-up), so they compose in any
order; ``compose_segments`` integrates them into OpenCV c2w poses and per-frame pixel K.

File format (``save_trajectory`` / ``load_trajectory``):
- ``.json``: ``{"format": "solarwm.trajectory/1", "fps": float, "width": int, "height": int,
  "c2w": [N][4][4], "K": [N][4]}`` — c2w OpenCV metric camera-to-world, K pixels (fx, fy, cx, cy).
- ``.npz``: arrays ``c2w`` [N,4,4] float64, ``K`` [N,4] float64, ``fps`` [], ``image_size`` [2] = (W, H).
"""

from __future__ import annotations

import json
import math
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from solarwm.camera.se3 import check_se3
from solarwm.util.atomic import atomic_path, atomic_write_text

TRAJECTORY_FORMAT = "solarwm.trajectory/1"
#: The largest image side (pixels) a trajectory may declare: a replay generates frames of that size.
MAX_IMAGE_SIDE = 8192


@dataclass
class Trajectory:
    """A frame-aligned camera track: c2w ``[N, 4, 4]`` (OpenCV, metric) and K ``[N, 4]`` pixels."""

    c2w: np.ndarray
    K: np.ndarray
    fps: float
    width: int
    height: int

    def __post_init__(self) -> None:
        self.c2w = np.asarray(self.c2w, dtype=np.float64)
        self.K = np.asarray(self.K, dtype=np.float64)
        if self.c2w.ndim != 3 or self.c2w.shape[1:] != (4, 4):
            raise ValueError(f"trajectory c2w must be [N,4,4], got {list(self.c2w.shape)}")
        if self.K.shape != (len(self.c2w), 4):
            raise ValueError(f"trajectory K must be [N,4] with N={len(self.c2w)}, got {list(self.K.shape)}")
        if not (math.isfinite(self.fps) and self.fps > 0):
            raise ValueError(f"trajectory fps must be a finite number > 0, got {self.fps}")
        if not (self.width >= 1 and self.height >= 1):
            raise ValueError(f"trajectory image size must be at least 1x1 pixels, got {self.width}x{self.height}")
        if self.width > MAX_IMAGE_SIDE or self.height > MAX_IMAGE_SIDE:
            raise ValueError(f"trajectory image size {self.width}x{self.height} is above the largest side, "
                             f"{MAX_IMAGE_SIDE} pixels")

    def __len__(self) -> int:
        return len(self.c2w)

    def slice(self, start: int, stop: int) -> "Trajectory":
        """Frames ``[start, stop)``; raises if the trajectory is shorter than ``stop``."""
        if stop > len(self):
            raise ValueError(f"trajectory has {len(self)} frames, {stop} requested")
        return Trajectory(self.c2w[start:stop], self.K[start:stop], self.fps, self.width, self.height)


@dataclass(frozen=True)
class Segment:
    """``steps`` equal increments: metres (forward, right, up), degrees (yaw, pitch), log-zoom."""

    steps: int
    forward: float = 0.0
    right: float = 0.0
    up: float = 0.0
    yaw: float = 0.0
    pitch: float = 0.0
    log_zoom: float = 0.0

    def increments(self) -> np.ndarray:
        """Per-step increments ``[steps, 6]`` (forward, right, up, yaw, pitch, log_zoom)."""
        if self.steps < 1:
            raise ValueError(f"a segment needs at least one step, got {self.steps}")
        per = np.array([self.forward, self.right, self.up, self.yaw, self.pitch, self.log_zoom]) / self.steps
        return np.tile(per, (self.steps, 1))


def forward(steps: int, distance: float = 1.0) -> Segment:
    """Move ``distance`` metres along the heading."""
    return Segment(steps, forward=distance)


def backward(steps: int, distance: float = 1.0) -> Segment:
    """Move ``distance`` metres against the heading."""
    return Segment(steps, forward=-distance)


def lateral(steps: int, distance: float = 1.0) -> Segment:
    """Truck ``distance`` metres to the right (negative: left)."""
    return Segment(steps, right=distance)


def vertical(steps: int, distance: float = 1.0) -> Segment:
    """Pedestal ``distance`` metres up (negative: down)."""
    return Segment(steps, up=distance)


def yaw_turn(steps: int, degrees: float = 30.0) -> Segment:
    """Pan by ``degrees`` (positive turns left, counter-clockwise seen from above)."""
    return Segment(steps, yaw=degrees)


def pitch_turn(steps: int, degrees: float = 10.0) -> Segment:
    """Tilt by ``degrees`` (positive looks up)."""
    return Segment(steps, pitch=degrees)


def orbit(steps: int, degrees: float = 45.0, radius: float = 3.0) -> Segment:
    """Circle ``degrees`` around the point ``radius`` metres ahead, keeping it centred.

    Moving right by the arc length while turning left by the same angle keeps the pivot on
    the optical axis (the chord/arc difference is second order per step).
    """
    return Segment(steps, right=math.radians(degrees) * radius, yaw=degrees)


def pause(steps: int) -> Segment:
    """Hold the camera still."""
    return Segment(steps)


def zoom(steps: int, factor: float = 1.5) -> Segment:
    """Change the focal length by ``factor`` (>1 zooms in), geometrically per step."""
    if factor <= 0:
        raise ValueError(f"zoom factor must be positive, got {factor}")
    return Segment(steps, log_zoom=math.log(factor))


def heading_rotations(yaw_deg: np.ndarray, pitch_deg: np.ndarray) -> np.ndarray:
    """OpenCV camera-to-world rotations ``[N, 3, 3]`` for headings in degrees (world z up, no roll)."""
    yaw = np.radians(np.asarray(yaw_deg, dtype=np.float64))
    pitch = np.radians(np.asarray(pitch_deg, dtype=np.float64))
    if (np.abs(np.cos(pitch)) < 1e-6).any():
        raise ValueError("pitch of ±90° has no defined right vector")
    cy, sy, cp, sp = np.cos(yaw), np.sin(yaw), np.cos(pitch), np.sin(pitch)
    z = np.stack([cp * cy, cp * sy, sp], axis=-1)
    x = np.stack([sy, -cy, np.zeros_like(yaw)], axis=-1)  # cross(z, up), already unit length
    y = np.cross(z, x)
    return np.stack([x, y, z], axis=-1)  # columns: right, down, forward


def heading_c2w(position: Sequence[float], yaw_deg: float, pitch_deg: float) -> np.ndarray:
    """OpenCV c2w ``[4, 4]`` at ``position`` with the given heading (world z up, no roll)."""
    T = np.eye(4)
    T[:3, :3] = heading_rotations(np.array([yaw_deg]), np.array([pitch_deg]))[0]
    T[:3, 3] = np.asarray(position, dtype=np.float64)
    return T


def _blend(inc: np.ndarray, blend_steps: int) -> np.ndarray:
    """Smooth the increments with a Hann window so velocities change continuously at junctions."""
    if blend_steps <= 1 or len(inc) < 2:
        return inc
    # An odd, centred window conserves each segment's total across junctions.
    n = blend_steps | 1
    w = np.hanning(n + 2)[1:-1]
    w /= w.sum()
    padded = np.pad(inc, ((n // 2, n // 2), (0, 0)), mode="edge")
    return np.stack([np.convolve(padded[:, c], w, mode="valid") for c in range(inc.shape[1])], axis=1)


def compose_segments(
    segments: Sequence[Segment],
    fps: float = 16.0,
    width: int = 64,
    height: int = 64,
    fov_x_deg: float = 60.0,
    start: Sequence[float] = (0.0, 0.0, 1.5),
    start_yaw: float = 0.0,
    start_pitch: float = 0.0,
    blend_steps: int = 4,
) -> Trajectory:
    """Integrate segments into a trajectory of ``1 + Σ steps`` frames (the start pose is frame 0).

    Square pixels, principal point at the image centre, base focal from ``fov_x_deg``; zoom
    segments scale fx and fy together.
    """
    if not segments:
        raise ValueError("compose_segments needs at least one segment")
    inc = _blend(np.concatenate([s.increments() for s in segments]), blend_steps)
    f0 = width / (2.0 * math.tan(math.radians(fov_x_deg) / 2.0))
    # Vectorised over frames (an hour of frames takes milliseconds): headings are running sums,
    # and each step translates with the mid-step heading so turning while moving follows an arc.
    yaw = np.cumsum(np.concatenate([[float(start_yaw)], inc[:, 3]]))
    pitch = np.cumsum(np.concatenate([[float(start_pitch)], inc[:, 4]]))
    mid = heading_rotations(yaw[:-1] + 0.5 * inc[:, 3], pitch[:-1] + 0.5 * inc[:, 4])
    steps = inc[:, :1] * mid[:, :, 2] + inc[:, 1:2] * mid[:, :, 0]
    steps[:, 2] += inc[:, 2]  # "up" is world up, not the camera's
    pos = np.cumsum(np.concatenate([np.asarray(start, dtype=np.float64)[None], steps]), axis=0)
    c2w = np.zeros((len(pos), 4, 4))
    c2w[:, :3, :3] = heading_rotations(yaw, pitch)
    c2w[:, :3, 3] = pos
    c2w[:, 3, 3] = 1.0
    z = np.exp(np.cumsum(np.concatenate([[0.0], inc[:, 5]])))
    K = np.stack([f0 * z, f0 * z, np.full_like(z, width / 2.0), np.full_like(z, height / 2.0)], axis=1)
    return Trajectory(c2w, K, float(fps), int(width), int(height))


def save_trajectory(traj: Trajectory, path: str | Path) -> Path:
    """Write a trajectory as ``.json`` or ``.npz`` (chosen by suffix), atomically."""
    path = Path(path)
    if path.suffix == ".json":
        doc = {
            "format": TRAJECTORY_FORMAT, "fps": traj.fps, "width": traj.width, "height": traj.height,
            "c2w": traj.c2w.tolist(), "K": traj.K.tolist(),
        }
        atomic_write_text(path, json.dumps(doc))
    elif path.suffix == ".npz":
        with atomic_path(path) as tmp, open(tmp, "wb") as f:
            np.savez(f, c2w=traj.c2w, K=traj.K, fps=np.float64(traj.fps),
                     image_size=np.array([traj.width, traj.height], dtype=np.int64))
    else:
        raise ValueError(f"{path}: trajectory files are .json or .npz")
    return path


def load_trajectory(path: str | Path) -> Trajectory:
    """Read and validate a ``.json`` or ``.npz`` trajectory; errors name the file and the check."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: trajectory file not found")
    try:
        if path.suffix == ".json":
            doc = json.loads(path.read_text())
            if not isinstance(doc, dict):
                raise ValueError(f"the top level is a JSON {type(doc).__name__}, expected an object")
            if doc.get("format") != TRAJECTORY_FORMAT:
                raise ValueError(f"format is {doc.get('format')!r}, expected {TRAJECTORY_FORMAT!r}")
            traj = Trajectory(np.array(doc["c2w"], dtype=np.float64), np.array(doc["K"], dtype=np.float64),
                              float(doc["fps"]), int(doc["width"]), int(doc["height"]))
        elif path.suffix == ".npz":
            try:
                with np.load(path, allow_pickle=False) as z:
                    w, h = (int(v) for v in z["image_size"])
                    traj = Trajectory(z["c2w"], z["K"], float(z["fps"]), w, h)
            except (zipfile.BadZipFile, EOFError) as e:  # truncated or empty: not an npz archive
                raise ValueError(f"not a readable .npz archive ({type(e).__name__}: {e})") from e
        else:
            raise ValueError("trajectory files are .json or .npz")
    except (KeyError, ValueError, TypeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: invalid trajectory: {e}") from e
    try:
        check_se3(traj.c2w)
    except ValueError as e:
        raise ValueError(f"{path}: invalid trajectory pose: {e}") from e
    if not (np.isfinite(traj.K).all() and (traj.K[:, :2] > 0).all()):
        raise ValueError(f"{path}: invalid trajectory intrinsics: focal lengths must be finite and positive")
    return traj
