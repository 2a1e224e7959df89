"""Pixel intrinsics ``K = (fx, fy, cx, cy)`` per frame, shape ``[..., 4]``.

Pixel convention (used by the renderer, the datamodules and every projection): image
coordinates are continuous, pixel column ``j`` spans ``[j, j+1)`` so its centre is at
``u = j + 0.5`` (likewise rows). Under this convention resizing an image by ``s`` scales all
four numbers by ``s`` exactly, and cropping shifts only the principal point.
"""

from __future__ import annotations

from typing import Any

import numpy as np

Array = Any


def fov_deg(K: Array, width: float, height: float) -> tuple[np.ndarray, np.ndarray]:
    """Horizontal and vertical field of view in degrees, each ``[...]``: ``2·atan(W / 2fx)``."""
    K = np.asarray(K, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        fov_x = np.degrees(2.0 * np.arctan(width / (2.0 * K[..., 0])))
        fov_y = np.degrees(2.0 * np.arctan(height / (2.0 * K[..., 1])))
    return fov_x, fov_y


def focal_divergence(K: Array, eps: float = 1e-8) -> np.ndarray:
    """Focal consistency ``|fx − fy| / ((fx + fy)/2 + ε)`` per frame (paper §5.2)."""
    K = np.asarray(K, dtype=np.float64)
    return np.abs(K[..., 0] - K[..., 1]) / (0.5 * (K[..., 0] + K[..., 1]) + eps)


def normalized_to_pixels(Kn: Array, width: float, height: float) -> np.ndarray:
    """Intrinsics normalised by image size (fx/W, fy/H, cx/W, cy/H) → pixels."""
    Kn = np.asarray(Kn, dtype=np.float64)
    return Kn * np.array([width, height, width, height], dtype=np.float64)


def pixels_to_normalized(K: Array, width: float, height: float) -> np.ndarray:
    """Pixel intrinsics → normalised by image size (the K̃ that PRoPE uses)."""
    K = np.asarray(K, dtype=np.float64)
    return K / np.array([width, height, width, height], dtype=np.float64)


def focal_mm_to_pixels(focal_mm: Array, sensor_width_mm: float, width_px: float) -> np.ndarray:
    """Physical focal length (mm) and sensor width (mm) → focal length in pixels of an image ``width_px`` wide."""
    if sensor_width_mm <= 0:
        raise ValueError(f"sensor width must be positive, got {sensor_width_mm}")
    return np.asarray(focal_mm, dtype=np.float64) * (width_px / sensor_width_mm)


def crop_intrinsics(K: Array, left: float, top: float) -> Array:
    """Intrinsics after cropping ``left`` columns and ``top`` rows off the image."""
    out = K.clone() if hasattr(K, "clone") else np.array(K, dtype=np.float64, copy=True)
    out[..., 2] = out[..., 2] - left
    out[..., 3] = out[..., 3] - top
    return out


def resize_intrinsics(K: Array, scale_x: float, scale_y: float) -> Array:
    """Intrinsics after resizing the image by ``scale_x`` horizontally and ``scale_y`` vertically."""
    out = K.clone() if hasattr(K, "clone") else np.array(K, dtype=np.float64, copy=True)
    out[..., 0] = out[..., 0] * scale_x
    out[..., 2] = out[..., 2] * scale_x
    out[..., 1] = out[..., 1] * scale_y
    out[..., 3] = out[..., 3] * scale_y
    return out


def project(points_world: Array, c2w: Array, K: Array) -> tuple[np.ndarray, np.ndarray]:
    """Project world points ``[M, 3]`` through one camera (c2w ``[4, 4]``, K ``[4]``).

    Returns ``uv [M, 2]`` in continuous pixel coordinates (see module docstring) and the
    camera-space depth ``[M]`` (positive in front of the camera).
    """
    from solarwm.camera.se3 import se3_inverse

    p = np.asarray(points_world, dtype=np.float64)
    w2c = se3_inverse(np.asarray(c2w, dtype=np.float64))
    cam = p @ w2c[:3, :3].T + w2c[:3, 3]
    z = cam[:, 2]
    fx, fy, cx, cy = np.asarray(K, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        uv = np.stack([fx * cam[:, 0] / z + cx, fy * cam[:, 1] / z + cy], axis=-1)
    return uv, z
