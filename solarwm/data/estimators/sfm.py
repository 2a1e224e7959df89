"""``cpu-sfm``: structure from motion on the CPU with OpenCV and SciPy (no weights, no GPU).

The pipeline, on a clip's frames uint8 ``[F, H, W, 3]``:

1. **Tracks.** Shi–Tomasi corners tracked frame to frame with pyramidal Lucas–Kanade; a track
   survives a step only if the backward track returns within ``fb_max_px``. New corners are
   detected away from live tracks whenever fewer than 80% of ``max_corners`` remain. OpenCV puts
   pixel centres at integers; we add 0.5 so observations use the project's pixel convention
   (centre of column ``j`` at ``u = j + 0.5``, see ``solarwm.camera.intrinsics``).
2. **Initialisation.** From frame 0, the first later frame whose essential matrix (5-point
   RANSAC) has at least ``min_inliers`` inliers and a median triangulation angle of at least
   ``init_parallax_deg`` defines the first two cameras and the first points.
3. **Chaining.** Every other frame is registered by PnP RANSAC against the triangulated tracks
   it sees; after each registration, its tracks not yet in 3D are triangulated against their
   earliest registered observation when the rays are at least ``min_parallax_deg`` apart.
4. **Bundle adjustment** of all cameras and points (``bundle.bundle_adjust``), then once more
   after dropping observations with reprojection error above ``outlier_px``.

Intrinsics. A known ``K [F, 4]`` is used as given (per frame, so zooms are fine). Without one,
the estimator assumes square pixels, the principal point at the image centre and one focal for
the whole clip: it scores focal lengths for a horizontal field of view from 30° to 110° by the
essential-matrix inlier count, summed over three frame pairs spread over the clip, starts from
the best one and refines it as a free parameter of bundle adjustment. The focal is observable
only when the camera rotates; pure translation leaves it undetermined (the estimate then stays
near the grid's best guess).

Scale. Poses are up to one global scale (``pose_units = "relative"``), fixed here so that the
median depth of the observed points is 1 and frame 0 is the identity.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import cv2
import numpy as np
from scipy.spatial.transform import Rotation

from solarwm.camera.se3 import se3_inverse
from solarwm.data.estimators import EstimationError, PoseEstimate, register
from solarwm.data.estimators.bundle import Observations, bundle_adjust


@dataclass(frozen=True)
class SfmOptions:
    """Tuning of ``cpu-sfm``; the defaults were measured on rendered worlds (benchmarks/pose_estimate.py)."""

    max_corners: int = 600
    min_distance_px: int = 5
    fb_max_px: float = 0.5
    ransac_px: float = 1.0
    min_inliers: int = 30
    init_parallax_deg: float = 2.0
    min_parallax_deg: float = 1.0
    min_pnp_inliers: int = 12
    outlier_px: float = 3.0
    max_rmse_px: float = 2.0
    focal_fov_deg: tuple[float, float] = (30.0, 110.0)
    focal_candidates: int = 33
    focal_pairs: int = 4
    max_rot_std_deg: float = 1.0


def track_features(frames: np.ndarray, opts: SfmOptions) -> Observations:
    """KLT tracks over ``frames [F, H, W, 3]`` → observations (frame, track id, uv in continuous pixels)."""
    gray = [cv2.cvtColor(f, cv2.COLOR_RGB2GRAY) for f in frames]
    h, w = gray[0].shape
    lk = dict(winSize=(15, 15), maxLevel=3, criteria=(cv2.TERM_CRITERIA_EPS | cv2.TERM_CRITERIA_COUNT, 30, 0.01))
    pts = np.empty((0, 1, 2), np.float32)
    ids = np.empty(0, np.int64)
    next_id = 0
    frame_of, track_of, uv_of = [], [], []
    for f, g in enumerate(gray):
        if f > 0 and len(pts):
            nxt, st, _ = cv2.calcOpticalFlowPyrLK(gray[f - 1], g, pts, None, **lk)
            back, st_back, _ = cv2.calcOpticalFlowPyrLK(g, gray[f - 1], nxt, None, **lk)
            fb = np.linalg.norm((pts - back).reshape(-1, 2), axis=1)
            p = nxt.reshape(-1, 2)
            ok = (st.ravel() == 1) & (st_back.ravel() == 1) & (fb < opts.fb_max_px)
            ok &= (p[:, 0] >= 0) & (p[:, 0] <= w - 1) & (p[:, 1] >= 0) & (p[:, 1] <= h - 1)
            pts, ids = nxt[ok], ids[ok]
        if len(pts) < 0.8 * opts.max_corners:
            mask = np.full((h, w), 255, np.uint8)
            for x, y in pts.reshape(-1, 2):
                cv2.circle(mask, (int(round(x)), int(round(y))), opts.min_distance_px, 0, -1)
            new = cv2.goodFeaturesToTrack(g, maxCorners=opts.max_corners - len(pts), qualityLevel=0.01,
                                          minDistance=opts.min_distance_px, mask=mask, blockSize=3)
            if new is not None:
                pts = np.concatenate([pts, new.astype(np.float32)])
                ids = np.concatenate([ids, next_id + np.arange(len(new))])
                next_id += len(new)
        frame_of.append(np.full(len(ids), f))
        track_of.append(ids.copy())
        uv_of.append(pts.reshape(-1, 2).astype(np.float64) + 0.5)
    frame, track, uv = np.concatenate(frame_of), np.concatenate(track_of), np.concatenate(uv_of)
    counts = np.bincount(track, minlength=next_id)
    keep = counts[track] >= 2  # a point seen once constrains nothing
    return Observations(frame[keep], track[keep], uv[keep])


def _normalised(uv: np.ndarray, K: np.ndarray) -> np.ndarray:
    """Pixels ``[M, 2]`` → normalised image coordinates with ``K [M, 4]`` or ``[4]``."""
    return (uv - K[..., 2:]) / K[..., :2]


def _two_view(x0: np.ndarray, x1: np.ndarray, thr: float) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Relative pose (R, t of camera 1 w.r.t. camera 0) and cheirality inlier mask from normalised points."""
    if len(x0) < 5:
        return None
    E, mask = cv2.findEssentialMat(x0, x1, focal=1.0, pp=(0.0, 0.0), method=cv2.RANSAC, prob=0.999, threshold=thr)
    if E is None or E.shape[0] < 3:
        return None
    _, R, t, mask = cv2.recoverPose(E[:3], x0, x1, focal=1.0, pp=(0.0, 0.0), mask=mask)
    return R, t.ravel(), mask.ravel() > 0


def _triangulate(w2c_a: np.ndarray, w2c_b: np.ndarray, xa: np.ndarray, xb: np.ndarray,
                 max_err: float) -> tuple[np.ndarray, np.ndarray]:
    """Points ``[M, 3]`` from normalised observations in two cameras, and which of them to keep.

    A point is kept when it is finite, in front of both cameras and reprojects within ``max_err``
    (normalised units) in both; the caller adds its parallax test.
    """
    Xh = cv2.triangulatePoints(w2c_a[:3], w2c_b[:3], xa.T.astype(np.float64), xb.T.astype(np.float64))
    with np.errstate(divide="ignore", invalid="ignore"):
        X = (Xh[:3] / Xh[3]).T
        keep = np.isfinite(X).all(1)
        for w2c, x in ((w2c_a, xa), (w2c_b, xb)):
            cam = X @ w2c[:3, :3].T + w2c[:3, 3]
            keep &= cam[:, 2] > 0
            keep &= np.linalg.norm(cam[:, :2] / cam[:, 2:] - x, axis=1) < max_err
    return X, keep


def _parallax_deg(w2c_a: np.ndarray, w2c_b: np.ndarray, X: np.ndarray) -> np.ndarray:
    """Angle between the two rays to each point ``[M, 3]``, in degrees."""
    ca, cb = se3_inverse(w2c_a)[:3, 3], se3_inverse(w2c_b)[:3, 3]
    ra, rb = X - ca, X - cb
    cos = (ra * rb).sum(1) / (np.linalg.norm(ra, axis=1) * np.linalg.norm(rb, axis=1) + 1e-300)
    return np.degrees(np.arccos(np.clip(cos, -1.0, 1.0)))


def _depth(w2c: np.ndarray, X: np.ndarray) -> np.ndarray:
    return X @ w2c[2, :3] + w2c[2, 3]


def _w2c(rvec: np.ndarray, t: np.ndarray) -> np.ndarray:
    T = np.eye(4)
    T[:3, :3] = Rotation.from_rotvec(rvec).as_matrix()
    T[:3, 3] = t
    return T


def estimate_focal(obs: Observations, num_frames: int, width: int, height: int, opts: SfmOptions) -> float:
    """One focal in pixels for the clip: the grid focal whose essential matrices keep the most inliers."""
    lo, hi = (math.radians(a) for a in opts.focal_fov_deg)
    fovs = np.linspace(lo, hi, opts.focal_candidates)
    focals = width / (2.0 * np.tan(fovs / 2.0))
    scores = np.zeros(len(focals))
    # Pairs: from a few anchors spread over the clip, the farthest later frame that still shares
    # half of the anchor's tracks — wide enough to see the focal, short enough to survive fast turns.
    for a in np.unique(np.linspace(0, num_frames - 2, opts.focal_pairs).astype(int)):
        ta, ua = obs.point[obs.frame == a], obs.uv[obs.frame == a]
        b = a + 1
        while b + 1 < num_frames and len(np.intersect1d(ta, obs.point[obs.frame == b + 1])) >= max(opts.min_inliers, len(ta) / 2):
            b += 1
        tb, ub = obs.point[obs.frame == b], obs.uv[obs.frame == b]
        common, ia, ib = np.intersect1d(ta, tb, return_indices=True)
        if len(common) < opts.min_inliers:
            continue
        for i, f in enumerate(focals):
            K = np.array([f, f, width / 2.0, height / 2.0])
            cv2.setRNGSeed(0)
            E, mask = cv2.findEssentialMat(_normalised(ua[ia], K), _normalised(ub[ib], K), focal=1.0, pp=(0.0, 0.0),
                                           method=cv2.RANSAC, prob=0.999, threshold=opts.ransac_px / f)
            scores[i] += 0 if mask is None else int(mask.sum())
    if not scores.any():
        raise EstimationError("focal: no frame pair shares enough tracks to score a focal length")
    best = np.flatnonzero(scores == scores.max())
    return float(focals[best[len(best) // 2]])


class CpuSfm:
    """Structure from motion on the CPU (OpenCV tracks + essential matrix + PnP + SciPy bundle adjustment)."""

    name = "cpu-sfm"
    version = "2"
    pose_units = "relative"  # declared up front: the metric bridge refuses it before running

    def __init__(self, weights: str | None = None, **options: Any):
        if weights:
            raise EstimationError("cpu-sfm takes no weights")
        self.opts = SfmOptions(**options)

    def estimate(self, frames: np.ndarray, K: np.ndarray | None, fps: float) -> PoseEstimate:
        """Poses up to scale for ``frames`` uint8 ``[F, H, W, 3]``; ``K [F, 4]`` pixels if known, else estimated."""
        frames = np.asarray(frames)
        if frames.ndim != 4 or frames.shape[-1] != 3 or frames.dtype != np.uint8:
            raise EstimationError(f"frames must be uint8 [F,H,W,3], got {frames.dtype} {list(frames.shape)}")
        n, h, w = frames.shape[:3]
        if n < 3:
            raise EstimationError(f"need at least 3 frames, got {n}")
        opts = self.opts
        cv2.setRNGSeed(0)  # RANSAC draws: the same clip gives the same poses
        obs = track_features(frames, opts)
        if len(np.unique(obs.point)) < opts.min_inliers:
            raise EstimationError(f"too few features: {len(np.unique(obs.point))} tracks < {opts.min_inliers}")
        focal_source = "given"
        if K is None:
            f = estimate_focal(obs, n, w, h, opts)
            K = np.tile([f, f, w / 2.0, h / 2.0], (n, 1))
            focal_source = "estimated"
        K = np.asarray(K, dtype=np.float64)
        if K.shape != (n, 4) or not np.isfinite(K).all() or (K[:, :2] <= 0).any():
            raise EstimationError(f"K must be finite [F,4] with positive focals, got shape {list(K.shape)}")
        xn = _normalised(obs.uv, K[obs.frame])
        thr = opts.ransac_px / float(np.median(K[:, :2]))

        order = np.argsort(obs.point, kind="stable")
        splits = np.flatnonzero(np.diff(obs.point[order])) + 1
        by_track = {int(obs.point[g[0]]): g for g in np.split(order, splits)}
        rvec, tvec = np.zeros((n, 3)), np.zeros((n, 3))
        registered = np.zeros(n, bool)
        registered[0] = True
        points: dict[int, np.ndarray] = {}
        diag: dict[str, Any] = {"tracks": int(len(np.unique(obs.point))), "observations": int(len(obs.frame))}

        # 2. initial pair
        best = None
        for j in range(1, n):
            common, i0, i1 = np.intersect1d(obs.point[obs.frame == 0], obs.point[obs.frame == j], return_indices=True)
            if len(common) < opts.min_inliers:
                break  # tracks only get lost further on
            x0, x1 = xn[obs.frame == 0][i0], xn[obs.frame == j][i1]
            pose = _two_view(x0, x1, thr)
            if pose is None or pose[2].sum() < opts.min_inliers:
                continue
            R, t, inl = pose
            w2c1 = np.eye(4)
            w2c1[:3, :3], w2c1[:3, 3] = R, t
            X, ok = _triangulate(np.eye(4), w2c1, x0[inl], x1[inl], 2 * thr)
            angle = np.where(ok, _parallax_deg(np.eye(4), w2c1, X), 0.0)
            med = float(np.median(angle[ok])) if ok.sum() >= opts.min_inliers else 0.0
            if best is None or med > best[0]:
                best = (med, j, w2c1, common[inl], X, angle)
            if med >= opts.init_parallax_deg:
                break
        if best is None or best[0] < 0.5 * opts.init_parallax_deg:
            got = "no pair with enough inliers" if best is None else f"max median parallax {best[0]:.2f} deg"
            raise EstimationError(f"initialisation: {got}; the camera barely translates or features are too few")
        parallax, j, w2c1, tracks, X, angle = best
        rvec[j], tvec[j] = Rotation.from_matrix(w2c1[:3, :3]).as_rotvec(), w2c1[:3, 3]
        registered[j] = True
        good = angle >= opts.min_parallax_deg
        points.update({int(tr): x for tr, x in zip(tracks[good], X[good])})
        diag.update(init_pair=[0, int(j)], init_inliers=int(len(tracks)), init_parallax_deg=round(parallax, 3))

        # 3. chaining: frames between the pair, then the rest in order
        pnp_inliers = {0: int(len(tracks)), int(j): int(len(tracks))}
        for k in list(range(1, j)) + list(range(j + 1, n)):
            sel = np.flatnonzero(obs.frame == k)
            known = np.array([int(tr) in points for tr in obs.point[sel]], bool)
            if known.sum() < opts.min_pnp_inliers:
                raise EstimationError(f"frame {k}: only {int(known.sum())} tracked points with 3D (< {opts.min_pnp_inliers})")
            obj = np.array([points[int(tr)] for tr in obs.point[sel[known]]])
            img = xn[sel[known]]
            prev = np.flatnonzero(registered)[np.argmin(np.abs(np.flatnonzero(registered) - k))]
            # OpenCV writes the guess arrays in place: give it its own (3, 1) buffers.
            rv0, tv0 = rvec[prev].reshape(3, 1).copy(), tvec[prev].reshape(3, 1).copy()
            ok, rv, tv, inl = cv2.solvePnPRansac(obj, img, np.eye(3), None, rvec=rv0, tvec=tv0,
                                                 useExtrinsicGuess=True, iterationsCount=200,
                                                 reprojectionError=float(2 * thr), confidence=0.999)
            n_inl = 0 if inl is None else len(inl)
            if not ok or n_inl < opts.min_pnp_inliers:
                raise EstimationError(f"frame {k}: PnP found {n_inl} inliers (< {opts.min_pnp_inliers})")
            rv, tv = cv2.solvePnPRefineLM(obj[inl.ravel()], img[inl.ravel()], np.eye(3), None, rv, tv)
            rvec[k], tvec[k], registered[k] = rv.ravel(), tv.ravel(), True
            pnp_inliers[int(k)] = n_inl
            self._triangulate_new(k, obs, by_track, xn, rvec, tvec, registered, points, 2 * thr)
        diag["pnp_inliers"] = [pnp_inliers[k] for k in range(n)]

        # 4. bundle adjustment, twice: the second pass without outlier observations
        result = None
        use = np.array([int(tr) in points for tr in obs.point], bool)
        for _ in range(2):
            ids = np.unique(obs.point[use])
            index = {int(tr): i for i, tr in enumerate(ids)}
            sub = Observations(obs.frame[use], np.array([index[int(tr)] for tr in obs.point[use]]), obs.uv[use])
            X0 = np.array([points[int(tr)] for tr in ids])
            result = bundle_adjust(rvec, tvec, X0, K, sub, free_focal=focal_source == "estimated")
            rvec, tvec, K = result.rvec, result.t, result.K
            points = {int(tr): result.points[i] for i, tr in enumerate(ids)}
            bad = np.flatnonzero(use)[result.errors > opts.outlier_px]
            if not len(bad):
                break
            use[bad] = False
        assert result is not None
        errors = result.errors[result.errors <= opts.outlier_px]
        rmse = float(np.sqrt(np.mean(errors**2))) if len(errors) else math.inf
        diag.update(points=int(len(points)), ba_observations=int(use.sum()), ba_iterations=result.iterations,
                    reprojection_rmse_px=round(rmse, 4), focal_source=focal_source,
                    rot_std_deg_max=round(float(result.rot_std_deg.max()), 4))
        if focal_source == "estimated":
            diag["focal_px"] = round(float(K[0, 0]), 3)
        if not rmse <= opts.max_rmse_px:
            raise EstimationError(f"bundle adjustment: reprojection RMSE {rmse:.3f} px > {opts.max_rmse_px} px")
        if focal_source == "estimated":
            # A refined focal that left the searched field-of-view range came with a wrong trajectory in
            # every such benchmark clip (rotation traded for focal): fail the clip rather than return it.
            fov = math.degrees(2.0 * math.atan(w / (2.0 * float(K[0, 0]))))
            lo, hi = opts.focal_fov_deg
            if not lo <= fov <= hi:
                raise EstimationError(f"focal: refined field of view {fov:.1f} deg is outside the searched {lo:g}-{hi:g} deg")
        if diag["rot_std_deg_max"] > opts.max_rot_std_deg:
            raise EstimationError(f"ill-conditioned: a rotation is known only to {diag['rot_std_deg_max']:.2f} deg "
                                  f"(1 sigma) > {opts.max_rot_std_deg} deg")

        w2c = np.stack([_w2c(r, t) for r, t in zip(rvec, tvec)])
        Xall = np.array(list(points.values()))
        depths = np.concatenate([_depth(w2c[k], Xall) for k in range(n)])
        scale = float(np.median(depths[depths > 0]))
        c2w = se3_inverse(w2c)
        c2w[:, :3, 3] /= scale
        diag["scale_note"] = "median point depth = 1"
        diag["options"] = asdict(self.opts)
        return PoseEstimate(c2w=c2w, K=K, pose_units="relative", estimator=self.name, version=self.version,
                            diagnostics=diag)

    def _triangulate_new(self, k: int, obs: Observations, by_track: dict[int, np.ndarray], xn: np.ndarray,
                         rvec: np.ndarray, tvec: np.ndarray, registered: np.ndarray, points: dict[int, np.ndarray],
                         max_err: float) -> None:
        """Triangulate frame ``k``'s tracks that have no 3D point yet, against their earliest registered view."""
        sel = np.flatnonzero(obs.frame == k)
        fresh = [i for i in sel if int(obs.point[i]) not in points]
        if not fresh:
            return
        w2c_k = _w2c(rvec[k], tvec[k])
        by_frame: dict[int, list[tuple[int, int]]] = {}
        for i in fresh:
            views = by_track[int(obs.point[i])]  # in frame order (tracks are built frame by frame)
            views = views[registered[obs.frame[views]] & (obs.frame[views] != k)]
            if len(views):
                by_frame.setdefault(int(obs.frame[views[0]]), []).append((i, int(views[0])))
        for a, pairs in by_frame.items():
            w2c_a = _w2c(rvec[a], tvec[a])
            ik = np.array([p[0] for p in pairs])
            ia = np.array([p[1] for p in pairs])
            X, good = _triangulate(w2c_a, w2c_k, xn[ia], xn[ik], max_err)
            good &= _parallax_deg(w2c_a, w2c_k, X) >= self.opts.min_parallax_deg
            for i, x in zip(ik[good], X[good]):
                points[int(obs.point[i])] = x


register("cpu-sfm")(CpuSfm)
