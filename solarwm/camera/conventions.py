"""Camera convention converters; each source's conversion to OpenCV metric c2w happens once, here.

The canonical convention is OpenCV: x right, y down, z forward, camera-to-world.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from solarwm.camera.se3 import se3_inverse

# OpenGL/Blender cameras look down -z with y up; flipping the camera's y and z axes maps them to OpenCV.
_FLIP_YZ = np.diag([1.0, -1.0, -1.0, 1.0])


def opengl_to_opencv(c2w: Any) -> np.ndarray:
    """OpenGL/Blender camera-to-world ``[..., 4, 4]`` (x right, y up, z back) → OpenCV c2w."""
    return np.asarray(c2w, dtype=np.float64) @ _FLIP_YZ


def opencv_to_opengl(c2w: Any) -> np.ndarray:
    """OpenCV camera-to-world ``[..., 4, 4]`` → OpenGL/Blender c2w (the flip is its own inverse)."""
    return np.asarray(c2w, dtype=np.float64) @ _FLIP_YZ


# Unreal Engine: left-handed world and camera, x forward, y right, z up. C maps UE axes to
# OpenCV's (x right, y down, z forward); applied on both sides it converts the world and the
# camera frame, so det(R) stays +1 (converting only the camera axes would leave det -1).
UNREAL_TO_OPENCV = np.array([[0.0, 1.0, 0.0], [0.0, 0.0, -1.0], [1.0, 0.0, 0.0]])


def row_vector_to_column(m: Any) -> np.ndarray:
    """A row-vector 4×4 ``[..., 4, 4]`` (translation in the 4th row, Unreal/DirectX) → column convention."""
    return np.swapaxes(np.asarray(m, dtype=np.float64), -1, -2)


def unreal_to_opencv(c2w: Any) -> np.ndarray:
    """Unreal camera-to-world ``[..., 4, 4]`` (column convention, same units) → OpenCV c2w: ``C·R·Cᵀ``, ``C·t``."""
    m = np.asarray(c2w, dtype=np.float64)
    out = np.zeros_like(m)
    out[..., :3, :3] = UNREAL_TO_OPENCV @ m[..., :3, :3] @ UNREAL_TO_OPENCV.T
    out[..., :3, 3] = m[..., :3, 3] @ UNREAL_TO_OPENCV.T
    out[..., 3, 3] = 1.0
    return out


def w2c_to_c2w(w2c: Any) -> Any:
    """World-to-camera (extrinsics, as COLMAP stores them) → camera-to-world."""
    return se3_inverse(w2c)


def c2w_to_w2c(c2w: Any) -> Any:
    """Camera-to-world → world-to-camera (the ``viewmats`` attention consumes)."""
    return se3_inverse(c2w)


def quat_to_rotation(q: Any, order: str = "wxyz") -> np.ndarray:
    """Unit quaternions ``[..., 4]`` in ``wxyz`` (COLMAP) or ``xyzw`` (scipy/ROS) order → ``[..., 3, 3]``.

    Quaternions are normalised first; a zero quaternion raises ``ValueError``.
    """
    q = np.asarray(q, dtype=np.float64)
    if order == "xyzw":
        q = q[..., [3, 0, 1, 2]]
    elif order != "wxyz":
        raise ValueError(f"quaternion order must be 'wxyz' or 'xyzw', got {order!r}")
    norm = np.linalg.norm(q, axis=-1, keepdims=True)
    if (norm < 1e-12).any():
        raise ValueError("quat_to_rotation: zero-length quaternion")
    w, x, y, z = np.moveaxis(q / norm, -1, 0)
    R = np.stack(
        [
            1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y),
            2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x),
            2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y),
        ],
        axis=-1,
    )
    return R.reshape(q.shape[:-1] + (3, 3))


def rotation_to_quat(R: Any, order: str = "wxyz") -> np.ndarray:
    """Rotation matrices ``[..., 3, 3]`` → unit quaternions ``[..., 4]`` with w ≥ 0."""
    R = np.asarray(R, dtype=np.float64)
    m = R.reshape(-1, 3, 3)
    out = np.empty((m.shape[0], 4))
    for i, r in enumerate(m):  # Shepperd's method: pick the numerically largest pivot
        tr = np.trace(r)
        if tr > 0:
            s = 2.0 * np.sqrt(tr + 1.0)
            out[i] = [0.25 * s, (r[2, 1] - r[1, 2]) / s, (r[0, 2] - r[2, 0]) / s, (r[1, 0] - r[0, 1]) / s]
        else:
            k = int(np.argmax(np.diag(r)))
            a, b, c = k, (k + 1) % 3, (k + 2) % 3
            s = 2.0 * np.sqrt(1.0 + r[a, a] - r[b, b] - r[c, c])
            v = np.empty(4)
            v[0] = (r[c, b] - r[b, c]) / s
            v[1 + a] = 0.25 * s
            v[1 + b] = (r[b, a] + r[a, b]) / s
            v[1 + c] = (r[c, a] + r[a, c]) / s
            out[i] = v
    out *= np.where(out[:, :1] < 0, -1.0, 1.0)
    if order == "xyzw":
        out = out[:, [1, 2, 3, 0]]
    elif order != "wxyz":
        raise ValueError(f"quaternion order must be 'wxyz' or 'xyzw', got {order!r}")
    return out.reshape(R.shape[:-2] + (4,))


def pose_from_quaternion(q: Any, t: Any, order: str = "wxyz") -> np.ndarray:
    """Quaternion ``[..., 4]`` + translation ``[..., 3]`` → homogeneous ``[..., 4, 4]`` (same direction)."""
    R = quat_to_rotation(q, order)
    t = np.asarray(t, dtype=np.float64)
    T = np.zeros(R.shape[:-2] + (4, 4))
    T[..., :3, :3] = R
    T[..., :3, 3] = t
    T[..., 3, 3] = 1.0
    return T
