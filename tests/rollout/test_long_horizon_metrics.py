"""solarwm.metrics.long_horizon: the detail ratio, per-window PSNR against the first frame repeated, intervals."""

from __future__ import annotations

import numpy as np
import pytest

from solarwm.metrics.long_horizon import (
    bootstrap_interval,
    detail,
    in_band_fraction,
    paired_difference,
    summarise,
    window_bounds,
    window_figures,
)


def textured(frames: int, seed: int = 0) -> np.ndarray:
    """A camera panning over a fixed random texture: uint8 ``[F, 16, 16, 3]`` with the same detail in every frame."""
    rng = np.random.default_rng(seed)
    world = rng.integers(0, 256, (16, 16 + frames, 3), dtype=np.uint8)
    return np.stack([world[:, i : i + 16] for i in range(frames)])


def test_detail_of_a_flat_video_is_zero_and_grows_with_noise():
    flat = np.full((3, 8, 8, 3), 128, np.uint8)
    assert np.all(detail(flat) == 0)
    noisy = np.clip(flat + np.random.default_rng(0).normal(0, 40, flat.shape), 0, 255).astype(np.uint8)
    assert np.all(detail(noisy) > 0.1)


def test_windows_skip_the_given_first_frame_and_cover_the_rest():
    bounds = window_bounds(81, 40)
    assert bounds == [(1, 41), (41, 81)]
    assert window_bounds(82, 40)[-1] == (81, 82)
    with pytest.raises(ValueError):
        window_bounds(10, 0)


def test_a_perfect_generation_has_ratio_one_and_a_haze_a_small_ratio():
    truth = textured(41)
    perfect = window_figures(truth, truth, 20)
    assert np.allclose(perfect["detail_ratio"], 1.0) and np.all(np.isinf(perfect["psnr"]))
    haze = np.full_like(truth, 200)
    figures = window_figures(haze, truth, 20)
    assert np.all(figures["detail_ratio"] == 0.0)
    assert np.all(figures["psnr_static"] < 20)  # the pan moves the texture: the first frame repeated is far off


def test_band_fraction_and_bootstrap_interval():
    ratios = np.array([[1.0, 2.0], [0.5, 1.2]])
    assert in_band_fraction(ratios) == 0.5
    low, high = bootstrap_interval(np.arange(100.0))
    assert low < 49.5 < high and high - low < 20
    constant = bootstrap_interval(np.full(10, 3.0))
    assert constant == (3.0, 3.0)


def test_summary_reports_the_worst_window_from_5s_on():
    truth = textured(81)
    good = window_figures(truth[:1].repeat(81, 0), truth, 20)  # the generation is the first frame repeated
    worlds = [good, good]
    summary = summarise(worlds)
    assert summary["worlds"] == 2 and summary["windows"] == 4
    assert summary["gap_per_window"] == [0.0, 0.0, 0.0, 0.0]
    assert 1 <= summary["worst_gap_window"] < 4


def test_paired_difference_resamples_the_same_worlds_of_both():
    rng = np.random.default_rng(1)
    a = rng.normal(size=(12, 5)) * 3.0  # worlds differ a lot; the models differ by a constant per world
    diff, low, high = paired_difference(a + 0.5, a, lambda g: g.mean())
    assert diff == pytest.approx(0.5) and low == pytest.approx(0.5) and high == pytest.approx(0.5)
    diff, low, high = paired_difference(a + rng.normal(size=a.shape) * 0.1, a, lambda g: g.mean(0).min())
    assert low <= diff <= high and high - low < 1.0  # an unpaired interval would span the worlds' spread
    with pytest.raises(ValueError, match="worlds differ"):
        paired_difference(a, a[:5])
