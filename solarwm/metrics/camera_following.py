"""Camera following: does a generated video move the way its camera was commanded?

For frame pairs ``(i, i + stride)`` the relative camera motion is estimated from the
pixels alone with OpenCV — Shi–Tomasi corners on the upscaled first frame (4× by default), tracked by
pyramidal Lucas–Kanade frame by frame through the pair and then refined directly between
its two ends, forward–backward checked; the essential matrix by RANSAC with the known
per-frame K; `cv2.recoverPose` — and compared with the commanded cameras:

* rotation error: geodesic angle between the estimated and the commanded relative rotation;
* translation direction error: angle between the unit translations (the scale of a
  monocular estimate is unknown), only where the commanded translation is not ~0.

Convention. `cv2.recoverPose` returns ``R, t`` with ``x_j = R x_i + t`` for a point in
camera-i coordinates ``x_i`` (OpenCV axes). With camera-to-world poses ``x_w = c2w_i x_i``,
``x_j = inv(c2w_j) c2w_i x_i``, so the commanded relative pose is
``relative_pose(c2w_j, c2w_i) = inv(c2w_j) @ c2w_i`` (`commanded_relative_pose`).

No parallax. Under a pure pan (or a motion too small to see) every translation fits the
essential matrix, so its rotation is biased and recoverPose's choice among the
decompositions is arbitrary. So a pure rotation is fitted to the same inliers first; when it explains
the pair the rotation comes from it and the pair has no translation direction. "Explains" is
COLMAP's test for a panoramic or planar pair: the rotation accounts for at least
``panorama_ratio`` = 0.8 of the essential matrix's inliers (COLMAP's
``TwoViewGeometryOptions.max_H_inlier_ratio``); a stricter ratio sends pans back to the arbitrary
decomposition (docs/results/2026-12-camera-error.md, "The estimator's rotation test").

Pairs the estimator cannot resolve (too few corners, tracks, RANSAC inliers — in number or
as a share of the tracks — or points in front of both cameras) are counted in ``failed_pairs`` and never
given a value. The estimator is imperfect, so the same metric on the ground-truth video with its own
cameras gives the floor a generated video should be read against, counts included (its figures on
rendered worlds: docs/results/2026-12-camera-error.md, "The estimator on rendered worlds").

Determinism. The same video gives the same numbers on any machine with the declared
dependencies: the estimator runs with OpenCV, torch and BLAS pinned to one thread
(`solarwm.util.threads.pinned_threads`), and RANSAC's random draws start from a fixed seed
(``RANSAC_SEED``, set with ``cv2.setRNGSeed`` on the calling thread just before the fit).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import cv2
import numpy as np
import torch
from torchmetrics import Metric
from torchmetrics.utilities import dim_zero_cat

from solarwm.camera.se3 import relative_pose, rotation_angle_deg  # noqa: F401  (re-exported by solarwm.metrics)
from solarwm.data.video import to_uint8_frames
from solarwm.util.threads import pinned_threads

#: Seed of OpenCV's RNG before each essential-matrix RANSAC, so its samples never depend on what
#: else used the thread's RNG before (OpenCV 4.14's RANSAC seeds its own; other builds may not).
RANSAC_SEED = 0

#: The pair step `solarwm test` scores with (a pair starting at every frame); the eval logger and the examples
#: that are read against its table use it too, so every figure comes from one metric.
SCORED_PAIR_STEP = 1


def commanded_relative_pose(c2w_i: Any, c2w_j: Any) -> np.ndarray:
    """``[..., 4, 4]`` transform taking camera-i coordinates to camera-j coordinates (recoverPose's R, t)."""
    return np.asarray(relative_pose(np.asarray(c2w_j, np.float64), np.asarray(c2w_i, np.float64)))


def direction_angle_deg(a: np.ndarray, b: np.ndarray) -> float:
    """Angle in degrees between two non-zero vectors ``[3]``, in [0, 180]."""
    cos = float(a @ b) / (np.linalg.norm(a) * np.linalg.norm(b))
    return float(np.degrees(np.arccos(np.clip(cos, -1.0, 1.0))))


def video_from_uint8(frames: np.ndarray) -> torch.Tensor:
    """uint8 frames ``[F, H, W, 3]`` (or ``[B, F, H, W, 3]``) → video ``[B, 3, F, H, W]`` in [-1, 1]."""
    x = torch.as_tensor(np.asarray(frames))
    if x.dtype != torch.uint8 or x.ndim not in (4, 5) or x.shape[-1] != 3:
        raise ValueError(f"expected uint8 frames [F, H, W, 3] or [B, F, H, W, 3], got {x.dtype} {list(x.shape)}")
    if x.ndim == 4:
        x = x[None]
    # The datamodule's mapping (x / 127.5 - 1); to_uint8_frames inverts it exactly.
    return (x.float() / 127.5 - 1.0).permute(0, 4, 1, 2, 3).contiguous()


@dataclass(frozen=True)
class PoseEstimate:
    """Estimated relative pose of a frame pair: ``x_j = R x_i + t``, ``|t| = 1``; ``t`` None without parallax."""

    R: np.ndarray  # [3, 3]
    t: np.ndarray | None  # [3] unit length, or None when a pure rotation explains the pair
    tracks: int  # correspondences that passed the forward–backward check
    inliers: int  # essential-matrix RANSAC inliers


def _normalised(points: np.ndarray, K: np.ndarray, upscale: float) -> np.ndarray:
    """OpenCV pixel positions ``[M, 2]`` in the upscaled image → normalised camera coordinates ``[M, 2]``."""
    fx, fy, cx, cy = (float(v) for v in K)
    # OpenCV puts pixel centres at integers, the project at j + 0.5 (`solarwm.camera.intrinsics`);
    # cv2.resize keeps pixel centres aligned, so continuous coordinates scale by `upscale`.
    u = (points[:, 0] + 0.5) / upscale
    v = (points[:, 1] + 0.5) / upscale
    return np.stack([(u - cx) / fx, (v - cy) / fy], axis=1)


def _rotation_fit(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Rotation ``[3, 3]`` with ``b ≈ R a`` for unit bearings ``[M, 3]`` in least squares (Kabsch)."""
    U, _, Vt = np.linalg.svd(b.T @ a)
    D = np.diag([1.0, 1.0, np.sign(np.linalg.det(U @ Vt))])  # a proper rotation, never a reflection
    return U @ D @ Vt


def _bearings(xy: np.ndarray) -> np.ndarray:
    """Normalised camera coordinates ``[M, 2]`` → unit viewing rays ``[M, 3]``."""
    rays = np.concatenate([xy, np.ones((len(xy), 1))], axis=1)
    return rays / np.linalg.norm(rays, axis=1, keepdims=True)


def _ray_angle(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Angles in radians ``[M]`` between unit rays ``[M, 3]``."""
    return np.arccos(np.clip(np.sum(u * v, axis=1), -1.0, 1.0))


def _track(gray: list[np.ndarray], corners: np.ndarray, upscale: int) -> tuple[np.ndarray, np.ndarray]:
    """Track corners ``[M, 1, 2]`` from ``gray[0]`` to ``gray[-1]`` → (end points ``[M, 1, 2]``, kept ``[M]``)."""
    window = (5 * upscale + 1, 5 * upscale + 1)
    ok = np.ones(len(corners), dtype=bool)
    # Guide: follow the corners frame by frame. Between consecutive frames the motion stays below
    # half a square of a checkerboard ground; in one jump LK can lock onto the neighbouring square.
    guess = corners
    for g0, g1 in zip(gray[:-1], gray[1:]):
        guess, status, _ = cv2.calcOpticalFlowPyrLK(g0, g1, guess, None, winSize=window, maxLevel=3)
        ok &= status.ravel() == 1
    # Refine: match the end frame to the first directly from that guess, so the per-step
    # tracking errors do not add up; then track back from there to check.
    refine = dict(winSize=window, maxLevel=1, flags=cv2.OPTFLOW_USE_INITIAL_FLOW)
    end, status, _ = cv2.calcOpticalFlowPyrLK(gray[0], gray[-1], corners, guess.copy(), **refine)
    ok &= status.ravel() == 1
    back, status, _ = cv2.calcOpticalFlowPyrLK(gray[-1], gray[0], end, corners.copy(), **refine)
    ok &= status.ravel() == 1
    # Kept only if tracking back lands where it started (drops occlusions and flat areas).
    ok &= np.linalg.norm((corners - back).reshape(-1, 2), axis=1) / upscale < 0.25
    return end, ok


def estimate_relative_pose(
    frames: np.ndarray,
    K_i: np.ndarray,
    K_j: np.ndarray,
    upscale: int = 4,
    max_features: int = 400,
    ransac_threshold_px: float = 0.25,
    parallax_px: float = 1.0,
    min_inliers: int = 15,
    min_inlier_ratio: float = 0.5,
    panorama_ratio: float = 0.8,
) -> PoseEstimate | None:
    """Relative pose of the first and last of uint8 ``frames [n, H, W, 3]`` (pixel K ``[4]`` each); None if unresolved.

    The frames in between only carry the tracks. ``ransac_threshold_px`` is the epipolar
    error allowed, in pixels of the original frames. An essential matrix that explains fewer
    than ``min_inliers`` tracks, or fewer than ``min_inlier_ratio`` of them, is no estimate
    (on rendered worlds at least 0.58 of the tracks are inliers, on frames of noise 0.3). A
    pair shows no parallax when a pure rotation explains ``panorama_ratio`` of the inliers to
    within ``parallax_px``; its rotation is then that fit and ``t`` is None. Runs with pinned
    threads and a seeded RANSAC (see the module's "Determinism").
    """
    with pinned_threads():
        return _estimate_relative_pose(frames, K_i, K_j, upscale, max_features, ransac_threshold_px, parallax_px,
                                       min_inliers, min_inlier_ratio, panorama_ratio)


def _estimate_relative_pose(
    frames: np.ndarray, K_i: np.ndarray, K_j: np.ndarray, upscale: int, max_features: int,
    ransac_threshold_px: float, parallax_px: float, min_inliers: int, min_inlier_ratio: float, panorama_ratio: float,
) -> PoseEstimate | None:
    gray = []
    for frame in frames:
        g = cv2.cvtColor(np.ascontiguousarray(frame), cv2.COLOR_RGB2GRAY)
        # At 64 px a texture period is 2–3 pixels: corners and LK windows need more support,
        # and bicubic upscaling gives both sub-pixel accuracy at the original scale.
        gray.append(cv2.resize(g, None, fx=upscale, fy=upscale, interpolation=cv2.INTER_CUBIC))
    corners = cv2.goodFeaturesToTrack(gray[0], max_features, qualityLevel=0.01,
                                      minDistance=0.75 * upscale, blockSize=3)
    if corners is None or len(corners) < min_inliers:
        return None
    ahead, keep = _track(gray, corners, upscale)
    if keep.sum() < min_inliers:
        return None
    a = _normalised(corners.reshape(-1, 2)[keep].astype(np.float64), K_i, upscale)
    b = _normalised(ahead.reshape(-1, 2)[keep].astype(np.float64), K_j, upscale)
    # Normalised coordinates let each frame have its own K (zoom); thresholds follow them.
    focal = 0.25 * float(K_i[0] + K_i[1] + K_j[0] + K_j[1])
    cv2.setRNGSeed(RANSAC_SEED)
    E, mask = cv2.findEssentialMat(a, b, np.eye(3), method=cv2.RANSAC, prob=0.999,
                                   threshold=ransac_threshold_px / focal)
    if E is None or E.shape[0] < 3 or mask is None:
        return None
    inl = mask.ravel() == 1
    if inl.sum() < max(min_inliers, min_inlier_ratio * len(inl)):
        return None

    # Without parallax (a pan, or motion too small to see) E is degenerate: any t fits and
    # recoverPose's choice is arbitrary, so test the rotation-only model first.
    rays_a, rays_b = _bearings(a[inl]), _bearings(b[inl])
    R_rot = _rotation_fit(rays_a, rays_b)
    for _ in range(2):  # refit on the points the rotation explains, dropping stray matches
        close = focal * _ray_angle(rays_a @ R_rot.T, rays_b) < parallax_px
        if close.sum() >= 3:
            R_rot = _rotation_fit(rays_a[close], rays_b[close])
    if (focal * _ray_angle(rays_a @ R_rot.T, rays_b) < parallax_px).mean() >= panorama_ratio:
        return PoseEstimate(R=R_rot, t=None, tracks=int(keep.sum()), inliers=int(inl.sum()))

    # recoverPose keeps, of the four (R, ±t) decompositions, the one putting most points in front.
    in_front, R, t, _ = cv2.recoverPose(E[:3], a, b, np.eye(3), mask=mask)
    if in_front < min_inliers:
        return None
    return PoseEstimate(R=R, t=t.ravel() / np.linalg.norm(t), tracks=int(keep.sum()), inliers=int(inl.sum()))


class CameraFollowing(Metric):
    """Rotation and translation-direction error (degrees) of the motion seen in a video vs its cameras.

    Pairs are ``(0, s), (p, p + s), (2p, 2p + s), …`` for stride ``s`` and pair step ``p``
    (default ``p = s``: non-overlapping, so each frame interval counts once; ``p = 1``: a pair
    starting at every frame, as relative pose error is usually taken). Overlapping pairs share
    frames, but each is tracked and fitted on its own, so their mean averages out the estimator's
    per-pair instability (it halves the translation ratio's noise:
    docs/results/2026-12-camera-metric-noise.md). ``compute()`` returns

    * ``rot_err_deg``, ``trans_dir_err_deg``: means over the pairs that have one (NaN if none),
      and their ``*_median`` (the errors are heavy-tailed);
    * ``pairs``: every pair seen; ``failed_pairs``: not resolved, so not scored;
    * ``no_translation_pairs``: commanded translation below ``min_translation`` metres,
      rotation scored only;
    * ``no_parallax_pairs``: translation commanded but the video shows no parallax (a pure
      rotation explains it), rotation scored only. A video that pans instead of moving
      lands here, so read this count against the ground-truth floor.
    """

    full_state_update = False
    is_differentiable = False
    higher_is_better = False

    def __init__(
        self,
        stride: int = 4,
        pair_step: int | None = None,
        min_translation: float = 1e-3,
        upscale: int = 4,
        max_features: int = 400,
        ransac_threshold_px: float = 0.25,
        parallax_px: float = 1.0,
        min_inliers: int = 15,
        min_inlier_ratio: float = 0.5,
        panorama_ratio: float = 0.8,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if stride < 1:
            raise ValueError(f"stride must be >= 1, got {stride}")
        if pair_step is not None and pair_step < 1:
            raise ValueError(f"pair_step must be >= 1, got {pair_step}")
        if not 0.0 < panorama_ratio <= 1.0:
            raise ValueError(f"panorama_ratio must be in (0, 1], got {panorama_ratio}")
        self.stride, self.min_translation = stride, min_translation
        self.pair_step = stride if pair_step is None else pair_step
        self.estimator_args = dict(
            upscale=upscale, max_features=max_features, ransac_threshold_px=ransac_threshold_px,
            parallax_px=parallax_px, min_inliers=min_inliers, min_inlier_ratio=min_inlier_ratio,
            panorama_ratio=panorama_ratio,
        )
        self.add_state("rot_err", default=[], dist_reduce_fx="cat")
        self.add_state("trans_err", default=[], dist_reduce_fx="cat")
        for name in ("pairs", "failed_pairs", "no_translation_pairs", "no_parallax_pairs"):
            self.add_state(name, default=torch.tensor(0), dist_reduce_fx="sum")

    def update(self, video: torch.Tensor, c2w: Any, K: Any) -> None:
        """Add videos ``[B, 3, F, H, W]`` in [-1, 1] and their cameras: c2w ``[B, F, 4, 4]``, pixel K ``[B, F, 4]``."""
        with pinned_threads():  # the uint8 conversion too: the numbers must not depend on thread counts
            self._add_videos(video, c2w, K)

    def _add_videos(self, video: torch.Tensor, c2w: Any, K: Any) -> None:
        c2w = torch.as_tensor(c2w).detach().cpu().double().numpy()
        K = torch.as_tensor(K).detach().cpu().double().numpy()
        B, _, F = video.shape[:3]
        if c2w.shape != (B, F, 4, 4) or K.shape != (B, F, 4):
            raise ValueError(f"video {list(video.shape)} needs c2w [B, F, 4, 4] and K [B, F, 4], "
                             f"got {list(c2w.shape)} and {list(K.shape)}")
        rot, trans = [], []
        for b in range(B):
            frames = to_uint8_frames(video[b])
            for i in range(0, F - self.stride, self.pair_step):
                j = i + self.stride
                self.pairs += 1
                est = estimate_relative_pose(frames[i:j + 1], K[b, i], K[b, j], **self.estimator_args)
                if est is None:
                    self.failed_pairs += 1
                    continue
                cmd = commanded_relative_pose(c2w[b, i], c2w[b, j])
                rot.append(rotation_angle_deg(est.R.T @ cmd[:3, :3]))
                if np.linalg.norm(cmd[:3, 3]) < self.min_translation:  # no commanded direction to compare
                    self.no_translation_pairs += 1
                elif est.t is None:
                    self.no_parallax_pairs += 1
                else:
                    trans.append(direction_angle_deg(est.t, cmd[:3, 3]))
        self.rot_err.append(torch.tensor(rot, dtype=torch.float64, device=self.device))
        self.trans_err.append(torch.tensor(trans, dtype=torch.float64, device=self.device))

    def compute(self) -> dict[str, torch.Tensor]:
        """The summary dict described in the class docstring."""
        out: dict[str, torch.Tensor] = {}
        nan = torch.tensor(float("nan"), dtype=torch.float64, device=self.device)
        for name, state in (("rot_err_deg", self.rot_err), ("trans_dir_err_deg", self.trans_err)):
            values = dim_zero_cat(state) if len(state) else nan[None][:0]  # a list here, a tensor after sync
            out[name] = values.mean() if values.numel() else nan
            out[f"{name}_median"] = values.median() if values.numel() else nan
        for name in ("pairs", "failed_pairs", "no_translation_pairs", "no_parallax_pairs"):
            out[name] = getattr(self, name)
        return out
