"""Bundle adjustment for the CPU structure-from-motion estimator (``cpu-sfm``).

Levenberg–Marquardt on pixel reprojection error over world-to-camera poses, 3D points and,
optionally, one focal length shared by every frame. The Jacobian is analytic and sparse; each
step eliminates the points with the Schur complement (points are independent 3×3 blocks), so a
step costs one dense solve in the camera parameters only. A Huber weight per observation keeps
the few bad tracks from pulling the solution (iteratively reweighted least squares).

Frame 0 is held fixed (rigid gauge). The global scale is left free: LM's damping keeps that
one-dimensional null space from moving, and poses from this estimator are up to scale anyway.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
from scipy.spatial.transform import Rotation
from threadpoolctl import threadpool_limits


@dataclass
class Observations:
    """Feature observations: ``frame [M]``, ``point [M]`` (indices) and ``uv [M, 2]`` continuous pixels."""

    frame: np.ndarray
    point: np.ndarray
    uv: np.ndarray


@dataclass
class BundleResult:
    """Refined w2c ``rvec, t [F, 3]``, points ``[P, 3]``, intrinsics ``[F, 4]``, per-observation pixel errors ``[M]``,
    and each frame's rotation uncertainty."""

    rvec: np.ndarray
    t: np.ndarray
    points: np.ndarray
    K: np.ndarray
    errors: np.ndarray
    iterations: int
    rot_std_deg: np.ndarray  # [F] 1-sigma rotation uncertainty per frame (frame 0, the gauge, is 0)


def _skew(v: np.ndarray) -> np.ndarray:
    """Cross-product matrices ``[M, 3, 3]`` of vectors ``[M, 3]``."""
    S = np.zeros(v.shape[:-1] + (3, 3))
    S[..., 0, 1], S[..., 0, 2] = -v[..., 2], v[..., 1]
    S[..., 1, 0], S[..., 1, 2] = v[..., 2], -v[..., 0]
    S[..., 2, 0], S[..., 2, 1] = -v[..., 1], v[..., 0]
    return S


def _residuals(R: np.ndarray, t: np.ndarray, X: np.ndarray, K: np.ndarray, obs: Observations) -> tuple[np.ndarray, ...]:
    """Pixel residuals ``[M, 2]`` plus what the Jacobian needs (rotated points, camera points)."""
    RX = np.einsum("mij,mj->mi", R[obs.frame], X[obs.point])
    cam = RX + t[obs.frame]
    z = np.where(np.abs(cam[:, 2]) < 1e-9, 1e-9, cam[:, 2])  # cheirality is filtered elsewhere
    k = K[obs.frame]
    uv = np.stack([k[:, 0] * cam[:, 0] / z + k[:, 2], k[:, 1] * cam[:, 1] / z + k[:, 3]], axis=1)
    return uv - obs.uv, RX, cam, z, k


def bundle_adjust(*args, **kwargs) -> BundleResult:
    """See ``_bundle_adjust``; runs with single-threaded BLAS (its solves are small, and threads only contend)."""
    with threadpool_limits(1):
        return _bundle_adjust(*args, **kwargs)


def _bundle_adjust(
    rvec: np.ndarray, t: np.ndarray, points: np.ndarray, K: np.ndarray, obs: Observations,
    free_focal: bool = False, huber_px: float = 1.5, max_iterations: int = 50,
) -> BundleResult:
    """Refine cameras and points (and a shared focal when ``free_focal``) against ``obs``.

    ``K [F, 4]`` is fixed unless ``free_focal``, in which case ``fx = fy = f`` is one parameter for
    all frames, initialised from ``K[0, 0]``, with the principal point kept as given.
    """
    n_frames, n_points, m = len(rvec), len(points), len(obs.frame)
    R = Rotation.from_rotvec(rvec).as_matrix()
    t, X, K = t.copy(), points.copy(), K.astype(np.float64).copy()
    if free_focal:
        K[:, 0] = K[:, 1] = K[0, 0]
    nc = 6 * (n_frames - 1) + int(free_focal)  # camera-side unknowns: frames 1.. and the focal

    def cost(res: np.ndarray) -> tuple[float, np.ndarray]:
        norm = np.linalg.norm(res, axis=1)
        w = np.where(norm <= huber_px, 1.0, huber_px / np.maximum(norm, 1e-12))
        rho = np.where(norm <= huber_px, norm**2, 2 * huber_px * norm - huber_px**2)
        return float(rho.sum()), w

    res, RX, cam, z, k = _residuals(R, t, X, K, obs)
    current, w = cost(res)
    lam, it = 1e-3, 0
    for it in range(1, max_iterations + 1):
        U, Wcp, V, gc, gp = _normal_equations(R, RX, cam, z, k, w, res, obs, n_frames, n_points, free_focal)

        improved = False
        while not improved and lam < 1e8:
            Ud = U + lam * np.diag(np.diag(U) + 1e-9)
            Vd = V + lam * (V * np.eye(3)) + 1e-9 * np.eye(3)
            Vinv = np.linalg.inv(Vd)
            WV = np.einsum("cpi,pij->cpj", Wcp, Vinv)
            S = Ud - WV.reshape(nc, -1) @ Wcp.reshape(nc, -1).T
            rhs = -gc + WV.reshape(nc, -1) @ gp.ravel()
            try:
                dc = np.linalg.solve(S, rhs) if nc else np.zeros(0)
            except np.linalg.LinAlgError:
                lam *= 10
                continue
            dp = -np.einsum("pij,pj->pi", Vinv, gp + np.einsum("cpi,c->pi", Wcp, dc))
            R_new, t_new, K_new = R.copy(), t.copy(), K.copy()
            cams = dc[: 6 * (n_frames - 1)].reshape(-1, 6)
            R_new[1:] = Rotation.from_rotvec(cams[:, :3]).as_matrix() @ R[1:]
            t_new[1:] = t[1:] + cams[:, 3:]
            if free_focal:
                K_new[:, 0] = K_new[:, 1] = K[0, 0] + dc[-1]
            X_new = X + dp
            res_new, RX_new, cam_new, z_new, k_new = _residuals(R_new, t_new, X_new, K_new, obs)
            new, w_new = cost(res_new)
            if new < current:
                improved = True
                step = np.abs(np.concatenate([dc, dp.ravel()])).max()
                R, t, K, X = R_new, t_new, K_new, X_new
                res, RX, cam, z, k, w = res_new, RX_new, cam_new, z_new, k_new, w_new
                done = (current - new) < 1e-7 * current or step < 1e-10
                current, lam = new, max(lam / 10, 1e-9)
            else:
                lam *= 10
        if not improved or done:
            break
    # Uncertainty of each rotation at the solution: the camera block of the inverse Gauss–Newton
    # matrix (points eliminated, global scale — a null direction — left out by the pseudo-inverse),
    # scaled by the residual variance. A flat valley (rotation traded for translation) shows up here.
    U, Wcp, V, _, _ = _normal_equations(R, RX, cam, z, k, w, res, obs, n_frames, n_points, free_focal)
    nc = U.shape[0]
    WV = np.einsum("cpi,pij->cpj", Wcp, np.linalg.pinv(V))
    S = U - WV.reshape(nc, -1) @ Wcp.reshape(nc, -1).T
    dof = max(2 * m - nc - 3 * n_points, 1)
    cov = np.linalg.pinv(S, rcond=1e-10, hermitian=True) * float((w * (res**2).sum(1)).sum()) / dof
    rot_std = np.zeros(n_frames)
    for f in range(1, n_frames):
        block = cov[6 * (f - 1): 6 * (f - 1) + 3, 6 * (f - 1): 6 * (f - 1) + 3]
        rot_std[f] = np.degrees(np.sqrt(max(float(np.linalg.eigvalsh(block).max()), 0.0)))
    return BundleResult(Rotation.from_matrix(R).as_rotvec(), t, X, K, np.linalg.norm(res, axis=1), it, rot_std)


def _normal_equations(R, RX, cam, z, k, w, res, obs, n_frames, n_points, free_focal):
    """Gauss–Newton blocks at the current state: camera ``U [C, C]``, coupling ``Wcp [C, P, 3]``, points
    ``V [P, 3, 3]`` and gradients ``gc [C]``, ``gp [P, 3]`` (Huber-weighted; frame 0 fixed)."""
    m = len(obs.frame)
    nc = 6 * (n_frames - 1) + int(free_focal)
    moving = obs.frame > 0
    # d(uv)/d(cam point) [M, 2, 3]; perturbations: R <- exp(dw) R, t <- t + dt, X <- X + dX.
    dproj = np.zeros((m, 2, 3))
    dproj[:, 0, 0], dproj[:, 0, 2] = k[:, 0] / z, -k[:, 0] * cam[:, 0] / z**2
    dproj[:, 1, 1], dproj[:, 1, 2] = k[:, 1] / z, -k[:, 1] * cam[:, 1] / z**2
    J_rot = -dproj @ _skew(RX)
    J_pt = dproj @ R[obs.frame]
    J_cam = np.concatenate([J_rot, dproj], axis=2)  # [M, 2, 6]
    rows = np.repeat(np.arange(2 * m).reshape(m, 2, 1), 6, axis=2)[moving].ravel()
    cols = (6 * (obs.frame[moving] - 1)[:, None, None] + np.arange(6)[None, None, :]).repeat(2, axis=1).ravel()
    vals = J_cam[moving].ravel()
    if free_focal:
        rows = np.concatenate([rows, np.arange(2 * m)])
        cols = np.concatenate([cols, np.full(2 * m, nc - 1)])
        vals = np.concatenate([vals, (cam[:, :2] / z[:, None]).ravel()])
    Jc = sp.csr_matrix((vals, (rows, cols)), shape=(2 * m, nc))
    Jp_rows = np.repeat(np.arange(2 * m).reshape(m, 2, 1), 3, axis=2).ravel()
    Jp_cols = (3 * obs.point[:, None, None] + np.arange(3)[None, None, :]).repeat(2, axis=1).ravel()
    Jp = sp.csr_matrix((J_pt.ravel(), (Jp_rows, Jp_cols)), shape=(2 * m, 3 * n_points))
    sw = sp.diags(np.sqrt(np.repeat(w, 2)))
    Jc_w, Jp_w, r_w = (sw @ Jc).tocsr(), (sw @ Jp).tocsr(), np.sqrt(np.repeat(w, 2)) * res.ravel()
    U = (Jc_w.T @ Jc_w).toarray()
    # Camera-point coupling, dense [nc, P, 3]: small next to the points, and dense products are fast.
    Wcp = (Jc_w.T @ Jp_w).toarray().reshape(nc, n_points, 3)
    V = np.zeros((n_points, 3, 3))
    np.add.at(V, obs.point, np.einsum("mai,ma,maj->mij", J_pt, np.repeat(w[:, None], 2, 1), J_pt))
    return U, Wcp, V, Jc_w.T @ r_w, (Jp_w.T @ r_w).reshape(-1, 3)
