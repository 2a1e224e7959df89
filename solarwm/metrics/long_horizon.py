"""Long-horizon figures of a generated video against its truth: per-window PSNR, detail ratio, bootstrap intervals.

A rollout that dissolves into noise or haze keeps a plausible PSNR for a while but its *detail* (the mean absolute
spatial gradient) runs away from the truth's: patch-grid noise multiplies it, haze divides it. So per window of
``window`` frames (5 s) these functions report

* ``psnr``: PSNR (dB) of the generated frames against the truth,
* ``psnr_static``: the same for the first frame repeated (the trivial baseline a collapsed model falls below),
* ``detail_ratio``: generated / truth mean |gradient|,

and ``bootstrap_interval`` gives 95% intervals over worlds (the independent unit). Videos are uint8 ``[F, H, W, 3]``.
"""

from __future__ import annotations

from typing import Callable

import numpy as np


def detail(frames: np.ndarray) -> np.ndarray:
    """Per-frame detail of uint8 ``[F, H, W, 3]``: mean |horizontal| + |vertical| finite difference, in [0, 1] units."""
    x = np.asarray(frames, dtype=np.float64) / 255.0
    dx = np.abs(np.diff(x, axis=2)).mean(axis=(1, 2, 3))
    dy = np.abs(np.diff(x, axis=1)).mean(axis=(1, 2, 3))
    return dx + dy


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    """PSNR (dB) of two uint8 videos over all their pixels (data range 1)."""
    mse = float(np.mean((np.asarray(a, np.float64) / 255.0 - np.asarray(b, np.float64) / 255.0) ** 2))
    return float("inf") if mse == 0.0 else 10.0 * np.log10(1.0 / mse)


def window_bounds(num_frames: int, window: int, skip_first: bool = True) -> list[tuple[int, int]]:
    """``[(start, stop)]`` of consecutive windows of ``window`` frames; frame 0 (the given first frame) is left out."""
    if window < 1:
        raise ValueError(f"window must be >= 1 frame, got {window}")
    first = 1 if skip_first else 0
    return [(s, min(s + window, num_frames)) for s in range(first, num_frames, window) if s < num_frames]


def window_figures(generated: np.ndarray, truth: np.ndarray, window: int) -> dict[str, np.ndarray]:
    """Per window: ``psnr``, ``psnr_static`` (first truth frame repeated), ``detail_ratio``, ``detail_truth``."""
    if generated.shape != truth.shape:
        raise ValueError(f"generated {generated.shape} and truth {truth.shape} differ")
    gen_detail, truth_detail = detail(generated), detail(truth)
    out: dict[str, list[float]] = {"psnr": [], "psnr_static": [], "detail_ratio": [], "detail_truth": []}
    for s, e in window_bounds(len(truth), window):
        out["psnr"].append(psnr(generated[s:e], truth[s:e]))
        out["psnr_static"].append(psnr(np.broadcast_to(truth[:1], truth[s:e].shape), truth[s:e]))
        out["detail_truth"].append(float(truth_detail[s:e].mean()))
        out["detail_ratio"].append(float(gen_detail[s:e].mean() / max(truth_detail[s:e].mean(), 1e-8)))
    return {k: np.asarray(v) for k, v in out.items()}


def bootstrap_interval(
    values: np.ndarray, statistic: Callable[[np.ndarray], float] = np.mean, draws: int = 2000, seed: int = 0
) -> tuple[float, float]:
    """95% percentile interval of ``statistic`` over rows of ``values`` (rows = worlds, resampled with replacement)."""
    values = np.asarray(values)
    rng = np.random.default_rng(seed)
    n = len(values)
    stats = [statistic(values[rng.integers(0, n, n)]) for _ in range(draws)]
    low, high = np.percentile(stats, [2.5, 97.5])
    return float(low), float(high)


def paired_difference(
    a: np.ndarray, b: np.ndarray, statistic: Callable[[np.ndarray], float] = np.mean, draws: int = 2000, seed: int = 0
) -> tuple[float, float, float]:
    """``(difference, low, high)``: ``statistic(a) - statistic(b)`` and its 95% interval, resampling the same rows
    (worlds) of both, so two models measured on the same worlds are compared world by world."""
    a, b = np.asarray(a), np.asarray(b)
    if a.shape[0] != b.shape[0]:
        raise ValueError(f"paired_difference: {a.shape[0]} and {b.shape[0]} worlds differ")
    rng = np.random.default_rng(seed)
    n = len(a)
    stats = []
    for _ in range(draws):
        rows = rng.integers(0, n, n)
        stats.append(statistic(a[rows]) - statistic(b[rows]))
    low, high = np.percentile(stats, [2.5, 97.5])
    return float(statistic(a) - statistic(b)), float(low), float(high)


def in_band_fraction(ratios: np.ndarray, low: float = 0.6, high: float = 1.6) -> float:
    """Fraction of (world, window) detail ratios inside ``[low, high]`` (``ratios [worlds, windows]``)."""
    r = np.asarray(ratios, dtype=np.float64)
    return float(((r >= low) & (r <= high)).mean())


def summarise(per_world: list[dict[str, np.ndarray]], band: tuple[float, float] = (0.6, 1.6),
              from_window: int = 1) -> dict[str, object]:
    """Pooled figures of ``window_figures`` over worlds, each with a 95% bootstrap interval over worlds.

    ``from_window``: the first window of the "from 5 s on" criterion (window 0 holds the first 5 s).
    """
    psnr_w = np.stack([w["psnr"] for w in per_world])  # [worlds, windows]
    static_w = np.stack([w["psnr_static"] for w in per_world])
    ratio_w = np.stack([w["detail_ratio"] for w in per_world])
    gap = psnr_w - static_w
    mean_gap = gap.mean(0)  # the worlds' mean PSNR minus the baseline's, per window
    worst = int(np.argmin(mean_gap[from_window:])) + from_window if gap.shape[1] > from_window else 0
    return {
        "worlds": len(per_world),
        "windows": int(psnr_w.shape[1]),
        "psnr_per_window": psnr_w.mean(0).round(3).tolist(),
        "psnr_static_per_window": static_w.mean(0).round(3).tolist(),
        "gap_per_window": mean_gap.round(3).tolist(),
        "detail_ratio_per_window": ratio_w.mean(0).round(3).tolist(),
        "detail_ratio_median_per_window": np.median(ratio_w, 0).round(3).tolist(),
        "detail_in_band": round(in_band_fraction(ratio_w, *band), 4),
        "detail_in_band_ci": [round(v, 4) for v in bootstrap_interval(ratio_w, lambda r: in_band_fraction(r, *band))],
        "worst_gap_window": worst,
        "worst_gap_db": round(float(mean_gap[worst]), 3),
        "worst_gap_ci": [round(v, 3) for v in bootstrap_interval(gap[:, worst])],
        "min_gap_from_5s_ci": [
            round(v, 3) for v in bootstrap_interval(gap[:, from_window:], lambda g: g.mean(0).min())
        ],
        "max_detail_ratio": round(float(ratio_w.max()), 3),
    }
