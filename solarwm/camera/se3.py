"""Rigid transforms in SE(3): inverse, composition, relative pose, exponential map, look-at and validation.

Every function accepts numpy arrays or torch tensors of shape ``[..., 4, 4]`` and returns
the same kind, so the data engine (numpy, float64) and the models (torch) share one
implementation.
"""

from __future__ import annotations

from typing import Any

import numpy as np

try:  # torch is a hard dependency of the package, but keep geometry importable without it
    import torch
except ImportError:  # pragma: no cover
    torch = None

Array = Any  # np.ndarray | torch.Tensor


class PoseError(ValueError):
    """A pose failed a named SE(3) check (``finite``, ``bottom_row``, ``orthonormal``, ``det``)."""

    def __init__(self, check: str, detail: str):
        self.check = check
        self.detail = detail
        super().__init__(f"{check}: {detail}")


def _is_torch(x: Array) -> bool:
    return torch is not None and isinstance(x, torch.Tensor)


def _transpose(r: Array) -> Array:
    return r.transpose(-1, -2) if _is_torch(r) else np.swapaxes(r, -1, -2)


def se3_inverse(T: Array) -> Array:
    """Inverse of rigid transforms ``[..., 4, 4]`` using R^T, -R^T t (exact, no generic inverse)."""
    R = T[..., :3, :3]
    t = T[..., :3, 3:4]
    Rt = _transpose(R)
    out = T.clone() if _is_torch(T) else np.array(T, copy=True)
    out[..., :3, :3] = Rt
    out[..., :3, 3:4] = -(Rt @ t)
    out[..., 3, :3] = 0
    out[..., 3, 3] = 1
    return out


def compose(a: Array, b: Array) -> Array:
    """Composition ``a ∘ b`` (apply ``b`` first), i.e. the matrix product ``a @ b``."""
    return a @ b


def relative_pose(c2w_ref: Array, c2w: Array) -> Array:
    """Pose of ``c2w`` expressed in the camera frame of ``c2w_ref``: ``inv(ref) @ c2w``."""
    return se3_inverse(c2w_ref) @ c2w


def rotation_angle_deg(R: np.ndarray) -> Any:
    """Geodesic angle of rotations ``[..., 3, 3]`` in degrees, in [0, 180] (a float for one rotation)."""
    cos = (np.trace(np.asarray(R), axis1=-2, axis2=-1) - 1.0) / 2.0
    angle = np.degrees(np.arccos(np.clip(cos, -1.0, 1.0)))
    return float(angle) if np.ndim(angle) == 0 else angle


def se3_exp(twist: Array) -> Array:
    """Exponential map of twists ``[..., 6]`` = (v, w) (translation, rotation vector in radians) -> ``[..., 4, 4]``.

    ``T @ se3_exp(dt * xi)`` moves a camera with the constant body twist ``xi`` (in its own axes) for ``dt``:
    the rotation is Rodrigues' ``exp(w^)`` and the translation ``V v`` follows the arc the rotation sweeps
    (``V = I + (1-cos θ)/θ² w^ + (θ-sin θ)/θ³ w^²``); series near θ = 0 keep it exact to float64.
    """
    if _is_torch(twist):
        return torch.as_tensor(se3_exp(twist.detach().cpu().double().numpy()), dtype=twist.dtype, device=twist.device)
    xi = np.asarray(twist, dtype=np.float64)
    if xi.shape[-1:] != (6,):
        raise ValueError(f"se3_exp: twists must be [..., 6], got {list(xi.shape)}")
    v, w = xi[..., :3], xi[..., 3:]
    theta = np.linalg.norm(w, axis=-1)[..., None, None]
    W = np.zeros(xi.shape[:-1] + (3, 3))
    W[..., 0, 1], W[..., 0, 2], W[..., 1, 2] = -w[..., 2], w[..., 1], -w[..., 0]
    W[..., 1, 0], W[..., 2, 0], W[..., 2, 1] = w[..., 2], -w[..., 1], w[..., 0]
    small = theta < 1e-4
    t2 = theta**2
    safe = np.where(small, 1.0, theta)
    a = np.where(small, 1.0 - t2 / 6.0, np.sin(safe) / safe)
    b = np.where(small, 0.5 - t2 / 24.0, (1.0 - np.cos(safe)) / safe**2)
    c = np.where(small, 1.0 / 6.0 - t2 / 120.0, (safe - np.sin(safe)) / safe**3)
    W2 = W @ W
    eye = np.eye(3)
    T = np.zeros(xi.shape[:-1] + (4, 4))
    T[..., :3, :3] = eye + a * W + b * W2
    T[..., :3, 3] = ((eye + b * W + c * W2) @ v[..., None])[..., 0]
    T[..., 3, 3] = 1.0
    return T


def look_at(eye: Any, target: Any, up: Any = (0.0, 0.0, 1.0)) -> np.ndarray:
    """OpenCV camera-to-world ``[4, 4]`` at ``eye`` looking at ``target`` (x right, y down, z forward).

    ``up`` is the world up direction; the camera's -y axis is aligned with it as closely as
    possible. Raises ``ValueError`` when the view direction is parallel to ``up``.
    """
    eye = np.asarray(eye, dtype=np.float64)
    target = np.asarray(target, dtype=np.float64)
    up = np.asarray(up, dtype=np.float64)
    z = target - eye
    norm = np.linalg.norm(z)
    if norm < 1e-12:
        raise ValueError("look_at: eye and target coincide")
    z = z / norm
    x = np.cross(z, up)
    if np.linalg.norm(x) < 1e-9:
        raise ValueError("look_at: view direction is parallel to the up vector")
    x = x / np.linalg.norm(x)
    y = np.cross(z, x)
    T = np.eye(4)
    T[:3, 0], T[:3, 1], T[:3, 2], T[:3, 3] = x, y, z, eye
    return T


def check_se3(T: Array, atol: float = 1e-4) -> None:
    """Raise ``PoseError`` unless every ``[..., 4, 4]`` is finite with a proper rotation (det +1)."""
    T = T.detach().cpu().double().numpy() if _is_torch(T) else np.asarray(T, dtype=np.float64)
    if T.shape[-2:] != (4, 4):
        raise PoseError("shape", f"expected [..., 4, 4], got {list(T.shape)}")
    flat = T.reshape(-1, 4, 4)
    finite = np.isfinite(flat).all(axis=(1, 2))
    if not finite.all():
        raise PoseError("finite", f"non-finite values in pose(s) {np.flatnonzero(~finite)[:8].tolist()}")
    bottom = np.abs(flat[:, 3] - np.array([0.0, 0.0, 0.0, 1.0])).max(axis=1)
    if (bottom > atol).any():
        raise PoseError(
            "bottom_row", f"bottom row is not [0,0,0,1] in pose(s) {np.flatnonzero(bottom > atol)[:8].tolist()}"
        )
    R = flat[:, :3, :3]
    ortho = np.abs(R @ np.swapaxes(R, 1, 2) - np.eye(3)).max(axis=(1, 2))
    if (ortho > atol).any():
        bad = np.flatnonzero(ortho > atol)
        raise PoseError(
            "orthonormal", f"rotation not orthonormal in pose(s) {bad[:8].tolist()} (max error {ortho.max():.2e})"
        )
    det = np.linalg.det(R)
    if (np.abs(det - 1.0) > atol).any():
        bad = np.flatnonzero(np.abs(det - 1.0) > atol)
        raise PoseError("det", f"rotation determinant is not +1 in pose(s) {bad[:8].tolist()} (det {det[bad[0]]:.4f})")
