"""The windowed robust metric bridge for ground-truth trajectories in unknown units (ABot, Sekai-Game).

The trajectory's shape is trusted, its units are not. A metric reference estimator (behind
`solarwm.data.estimators`) runs on a few short windows of the clip; in each window a robust
Sim(3) fit (`solarwm.camera.sim3.robust_umeyama`) of the ground-truth camera centres onto
the estimator's metric centres gives one scale. Windows whose fit is poor are dropped, the
rest are MAD-filtered, and the clip gets the median — one factor, applied to translations only
(rotations are scale-free). Defaults follow the official engine (6 windows × 2 s, 16 samples,
normalised RMSE ≤ 0.15, ≥ 3 windows, p90/p10 ≤ 2.5). If no metric reference can be had, the
clip fails closed with a named reason: a scale is never made up.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from solarwm.camera.sim3 import DegenerateAlignmentError, robust_umeyama
from solarwm.data.sources.native import SourceDefect

BRIDGE_VERSION = 1


@dataclass(frozen=True)
class BridgeConfig:
    """Window layout and acceptance rules of the bridge."""

    windows: int = 6
    seconds: float = 2.0
    samples: int = 16
    max_nrmse: float = 0.15
    min_windows: int = 3
    max_spread: float = 2.5  # p90 / p10 of the accepted scales


def bridge_windows(num_frames: int, fps: float, cfg: BridgeConfig) -> list[np.ndarray]:
    """Sample indices ``[S]`` of each bridge window, spread evenly over the clip."""
    length = int(min(num_frames, max(3, round(cfg.seconds * fps))))
    starts = np.unique(np.round(np.linspace(0, num_frames - length, cfg.windows)).astype(int))
    n = min(cfg.samples, length)
    return [np.unique(np.round(np.linspace(s, s + length - 1, n)).astype(int)) for s in starts]


def windowed_metric_scale(
    gt_c2w: np.ndarray,
    frames: np.ndarray,
    K: np.ndarray,
    fps: float,
    estimator: Any,
    cfg: BridgeConfig = BridgeConfig(),
) -> tuple[float, dict[str, Any]]:
    """One metric scale for ``gt_c2w`` ``[N, 4, 4]`` from a metric ``estimator`` on ``frames`` ``[N, H, W, 3]``.

    Returns ``(scale, diagnostics)``; raises ``SourceDefect`` (``metric_reference_not_metric``,
    ``metric_bridge_failed``) when no trustworthy scale exists.
    """
    from solarwm.data.estimators import EstimationError

    # A plug-in that declares relative units (e.g. ``colmap`` without a depth model) is refused before it runs.
    if getattr(estimator, "pose_units", "metric") != "metric":
        raise SourceDefect(
            "metric_reference_not_metric",
            f"estimator {estimator.name} returns {estimator.pose_units} poses; the bridge needs metric ones",
        )
    per_window: list[dict[str, Any]] = []
    for idx in bridge_windows(len(gt_c2w), fps, cfg):
        span = max(int(idx[-1] - idx[0]), 1)
        try:
            est = estimator.estimate(frames[idx], K[idx], fps * (len(idx) - 1) / span)
        except EstimationError as e:  # this window has no reference; the others may still agree
            per_window.append(
                {"frames": [int(idx[0]), int(idx[-1]) + 1], "accepted": False, "why": f"estimation_failed: {e}"}
            )
            continue
        if est.pose_units != "metric":
            raise SourceDefect(
                "metric_reference_not_metric",
                f"estimator {est.estimator} returns {est.pose_units} poses; the bridge needs metric ones",
            )
        src, dst = gt_c2w[idx, :3, 3], np.asarray(est.c2w)[:, :3, 3]
        row: dict[str, Any] = {"frames": [int(idx[0]), int(idx[-1]) + 1]}
        try:
            fit = robust_umeyama(src, dst)
        except DegenerateAlignmentError as e:
            per_window.append({**row, "accepted": False, "why": f"degenerate: {e}"})
            continue
        spread = float(np.sqrt(((dst - dst.mean(0)) ** 2).sum(1).mean()))
        nrmse = fit.inlier_rmse / max(spread, 1e-12)
        ok = bool(np.isfinite(fit.scale) and fit.scale > 0 and nrmse <= cfg.max_nrmse)
        per_window.append({**row, "scale": fit.scale, "nrmse": nrmse, "accepted": ok})
    scales = np.array([w["scale"] for w in per_window if w["accepted"]])
    diag: dict[str, Any] = {"version": BRIDGE_VERSION, "config": asdict(cfg), "windows": per_window}
    need = min(cfg.min_windows, len(per_window))
    if len(scales) < need or len(scales) == 0:
        raise SourceDefect("metric_bridge_failed", f"{len(scales)} of {len(per_window)} windows fit (need {need})")
    med = float(np.median(scales))
    mad = float(np.median(np.abs(scales - med)))
    # MAD filter; when most windows agree exactly (MAD 0) the tolerance falls back to a relative epsilon.
    kept = scales[np.abs(scales - med) <= max(3.0 * 1.4826 * mad, 1e-9 * med)]
    p10, p90 = np.percentile(kept, [10, 90])
    if p90 / p10 > cfg.max_spread:
        raise SourceDefect(
            "metric_bridge_failed", f"window scales disagree: p90/p10 = {p90 / p10:.2f} > {cfg.max_spread}"
        )
    scale = float(np.median(kept))
    diag.update({"scale": scale, "accepted": int(len(kept)), "p90_over_p10": float(p90 / p10)})
    return scale, diag
