"""Camera control: a twist (velocities in the camera's own axes) integrated into cameras, frame by frame.

A twist is a linear velocity ``(vx, vy, vz)`` in m/s and an angular velocity ``(wx, wy, wz)`` in degrees/s,
both in the camera's OpenCV axes (x right, y down, z forward; right-handed). Each frame at ``fps`` moves
the camera by the exponential map of the twist over ``1/fps`` (``solarwm.camera.se3.se3_exp``):
``c2w_{k+1} = c2w_k · exp(ξ/fps)``. So ``+vz`` walks forward, ``+vx`` strafes right, ``+vy`` moves down,
``+wy`` turns right (yaw), ``+wx`` looks up (pitch), ``+wz`` rolls clockwise as seen from behind the camera.

``smoothing`` (seconds, off at 0) damps changes: the applied twist follows the commanded one with that
time constant (``applied += (1 - e^{-dt/τ})·(target - applied)`` per frame).
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from solarwm.camera.se3 import check_se3, se3_exp


class ControlError(ValueError):
    """A twist or controller setting is not usable (wrong shape, not finite, above the maximum)."""


def check_twist(
    velocity: Sequence[float], angular: Sequence[float], max_speed: float, max_angular: float
) -> np.ndarray:
    """Twist ``[6]`` (m/s, deg/s) after checking shape, finiteness and ``|v| <= max_speed``, ``|w| <= max_angular``."""
    try:
        v = np.asarray(velocity, dtype=np.float64)
        w = np.asarray(angular, dtype=np.float64)
    except (TypeError, ValueError):
        raise ControlError("velocity and angular must be lists of 3 numbers") from None
    if v.shape != (3,) or w.shape != (3,):
        raise ControlError(
            f"velocity and angular must be lists of 3 numbers, got shapes {list(v.shape)} and {list(w.shape)}"
        )
    if not (np.isfinite(v).all() and np.isfinite(w).all()):
        raise ControlError("velocity and angular must be finite")
    if np.linalg.norm(v) > max_speed + 1e-9:
        raise ControlError(f"speed {np.linalg.norm(v):.3g} m/s is above the maximum {max_speed:g} m/s")
    if np.linalg.norm(w) > max_angular + 1e-9:
        raise ControlError(f"angular speed {np.linalg.norm(w):.3g} deg/s is above the maximum {max_angular:g} deg/s")
    return np.concatenate([v, w])


class CameraController:
    """Integrates twists into OpenCV c2w poses ``[n, 4, 4]`` at ``fps``, starting at ``start`` (identity)."""

    def __init__(self, fps: float, start: np.ndarray | None = None, smoothing: float = 0.0) -> None:
        if not fps > 0 or smoothing < 0:
            raise ControlError(f"need fps > 0 and smoothing >= 0, got fps={fps}, smoothing={smoothing}")
        self.fps, self.smoothing = float(fps), float(smoothing)
        self.start = np.eye(4) if start is None else np.asarray(start, dtype=np.float64)
        check_se3(self.start)
        self.pose: np.ndarray | None = None  # the last pose handed out
        self.applied = np.zeros(6)  # the twist in effect (m/s, deg/s), after smoothing

    def frames(self, n: int, velocity: Sequence[float] = (0, 0, 0), angular: Sequence[float] = (0, 0, 0)) -> np.ndarray:
        """The next ``n`` poses under the twist (the very first pose handed out is ``start`` itself)."""
        target = np.concatenate([np.asarray(velocity, np.float64), np.asarray(angular, np.float64)])
        dt = 1.0 / self.fps
        alpha = 1.0 if self.smoothing == 0 else 1.0 - math.exp(-dt / self.smoothing)
        out = np.zeros((n, 4, 4))
        for k in range(n):
            if self.pose is None:
                self.pose = self.start.copy()
            else:
                self.applied = self.applied + alpha * (target - self.applied)
                xi = np.concatenate([self.applied[:3], np.radians(self.applied[3:])]) * dt
                self.pose = self.pose @ se3_exp(xi)
            out[k] = self.pose
        return out
