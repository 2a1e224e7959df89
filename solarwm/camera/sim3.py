"""Sim(3) alignment of camera centres (paper §5.2): Umeyama and its robust 80% refit."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from solarwm.camera.se3 import rotation_angle_deg


class DegenerateAlignmentError(ValueError):
    """The point sets cannot determine a similarity transform (too few, static or collinear)."""


@dataclass(frozen=True)
class Sim3Fit:
    """A robust Sim(3) fit with its diagnostics."""

    scale: float
    rotation: np.ndarray  # [3, 3]
    translation: np.ndarray  # [3]
    inliers: np.ndarray  # bool [N], the points the final fit used
    inlier_rmse: float
    p90_residual: float

    def apply(self, points: Any) -> np.ndarray:
        """Map points ``[M, 3]``: ``s·R·p + t``."""
        return self.scale * np.asarray(points, dtype=np.float64) @ self.rotation.T + self.translation


def _check(src: np.ndarray, dst: np.ndarray) -> None:
    if src.shape != dst.shape or src.ndim != 2 or src.shape[1] != 3:
        raise DegenerateAlignmentError(f"expected two [N,3] point sets of equal size, got {src.shape} and {dst.shape}")
    if len(src) < 3:
        raise DegenerateAlignmentError(f"need at least 3 finite point pairs, got {len(src)}")
    spread = np.linalg.norm(src - src.mean(0), axis=1).max()
    if spread < 1e-9:
        raise DegenerateAlignmentError("source points coincide (static camera): scale and rotation are undefined")
    sv = np.linalg.svd(src - src.mean(0), compute_uv=False)
    if sv[1] < 1e-9 * max(sv[0], 1e-300):
        raise DegenerateAlignmentError("source points are collinear: rotation about their line is undefined")


def umeyama(src: Any, dst: Any) -> tuple[float, np.ndarray, np.ndarray]:
    """Least-squares similarity ``dst ≈ s·R·src + t`` for points ``[N, 3]`` (Umeyama 1991).

    Rows with any non-finite coordinate are dropped first. Raises ``DegenerateAlignmentError``
    for fewer than 3 finite pairs, a static source or collinear sources.
    """
    src = np.asarray(src, dtype=np.float64)
    dst = np.asarray(dst, dtype=np.float64)
    if src.shape != dst.shape:
        raise DegenerateAlignmentError(f"point sets differ in shape: {src.shape} vs {dst.shape}")
    keep = np.isfinite(src).all(axis=1) & np.isfinite(dst).all(axis=1)
    src, dst = src[keep], dst[keep]
    _check(src, dst)
    mu_s, mu_d = src.mean(0), dst.mean(0)
    xs, xd = src - mu_s, dst - mu_d
    cov = xd.T @ xs / len(src)
    U, D, Vt = np.linalg.svd(cov)
    S = np.eye(3)
    if np.linalg.det(U) * np.linalg.det(Vt) < 0:
        S[2, 2] = -1.0
    R = U @ S @ Vt
    var_s = (xs**2).sum() / len(src)
    s = float(np.trace(np.diag(D) @ S) / var_s)
    t = mu_d - s * R @ mu_s
    return s, R, t


def robust_umeyama(src: Any, dst: Any, keep: float = 0.8) -> Sim3Fit:
    """Umeyama fit, then a refit on the ``keep`` fraction of pairs with the lowest residual.

    Diagnostics are computed on the final inliers (RMSE) and on all finite pairs (p90).
    """
    if not 0.0 < keep <= 1.0:
        raise ValueError(f"keep must be in (0, 1], got {keep}")
    src = np.asarray(src, dtype=np.float64)
    dst = np.asarray(dst, dtype=np.float64)
    finite = np.isfinite(src).all(axis=1) & np.isfinite(dst).all(axis=1)
    s, R, t = umeyama(src, dst)
    idx = np.flatnonzero(finite)
    resid = np.linalg.norm(s * src[idx] @ R.T + t - dst[idx], axis=1)
    n_keep = max(3, int(np.ceil(keep * len(idx))))
    chosen = idx[np.argsort(resid, kind="stable")[:n_keep]]
    s, R, t = umeyama(src[chosen], dst[chosen])
    inliers = np.zeros(len(src), dtype=bool)
    inliers[chosen] = True
    resid_all = np.linalg.norm(s * src[idx] @ R.T + t - dst[idx], axis=1)
    resid_in = np.linalg.norm(s * src[chosen] @ R.T + t - dst[chosen], axis=1)
    return Sim3Fit(
        scale=s, rotation=R, translation=t, inliers=inliers,
        inlier_rmse=float(np.sqrt((resid_in**2).mean())),
        p90_residual=float(np.percentile(resid_all, 90)),
    )


def align_poses(est_c2w: Any, gt_c2w: Any) -> tuple[float, np.ndarray, np.ndarray]:
    """Similarity taking an estimated trajectory onto the true one, using orientations and centres.

    The rotation is the chordal mean of ``R_gt_i · R_est_iᵀ`` (defined even for a straight or static
    path, where a fit of centres alone leaves the rotation about the path free); scale and
    translation are then least squares on the centres. ``[N, 4, 4]`` c2w each → ``(s, R [3, 3], t [3])``
    with ``gt ≈ s·R·est + t``.
    """
    est, gt = np.asarray(est_c2w, np.float64), np.asarray(gt_c2w, np.float64)
    M = (gt[:, :3, :3] @ np.swapaxes(est[:, :3, :3], 1, 2)).sum(0)
    U, _, Vt = np.linalg.svd(M)
    R = U @ np.diag([1.0, 1.0, np.sign(np.linalg.det(U @ Vt))]) @ Vt
    a, b = est[:, :3, 3] @ R.T, gt[:, :3, 3]
    ac, bc = a - a.mean(0), b - b.mean(0)
    denom = float((ac**2).sum())
    s = float((ac * bc).sum() / denom) if denom > 1e-18 else 1.0
    return s, R, b.mean(0) - s * a.mean(0)


def trajectory_errors(est_c2w: Any, gt_c2w: Any) -> dict[str, float]:
    """After ``align_poses``: worst rotation error (deg), worst camera-centre error as a fraction of the true path."""
    est, gt = np.asarray(est_c2w, np.float64), np.asarray(gt_c2w, np.float64)
    s, R, t = align_poses(est, gt)
    rel = np.swapaxes(R @ est[:, :3, :3], 1, 2) @ gt[:, :3, :3]
    centres = s * est[:, :3, 3] @ R.T + t
    path = float(np.linalg.norm(np.diff(gt[:, :3, 3], axis=0), axis=1).sum())
    pos = np.linalg.norm(centres - gt[:, :3, 3], axis=1)
    return {"rot_max_deg": float(rotation_angle_deg(rel).max()), "pos_max_frac": float(pos.max() / max(path, 1e-12)),
            "path_m": path, "scale": s}
