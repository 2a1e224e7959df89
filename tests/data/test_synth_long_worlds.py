"""Worlds that last: a minute-long rendered walk keeps detail in every 5-s window, and the camera stays above ground."""

from __future__ import annotations

import numpy as np
import pytest

from solarwm.camera import trajectory as T
from solarwm.data.sources import synthetic
from solarwm.data.sources.synthetic import CAMERA_Z, SynthSpec, build_clip, render_clip, sample_trajectory
from solarwm.data.sources.synthetic_world import ALONG_PATH_AFTER_M, along_path, make_scene
from solarwm.metrics.long_horizon import detail


def test_a_straight_minute_long_walk_passes_scenery_all_the_way():
    """A 90 m walk: the world holds content past where the original objects end, and detail stays in a band."""
    traj = T.compose_segments([T.forward(240, 90.0)], fps=4.0, width=48, height=32, fov_x_deg=70.0,
                              start=(0.0, 0.0, 1.5), start_yaw=30.0, start_pitch=0.0)
    rng = np.random.default_rng(7)
    scene = make_scene(rng, traj.c2w)
    along = along_path(np.random.default_rng(7), traj.c2w[:, :3, 3], traj.c2w[:, :3, 2], 0.8)
    assert len(along) > (90 - ALONG_PATH_AFTER_M) / 3 * 0.8  # one per 3 m, a few refused for clearance
    frames = render_clip(scene, traj)
    d = detail(frames)
    per_window = np.array([d[s : s + 20].mean() for s in range(1, len(d), 20)])  # 5-s windows at 4 fps
    median = np.median(per_window)
    assert per_window.min() > 0.4 * median and per_window.max() < 2.5 * median


@pytest.mark.slow
def test_minute_long_synth_clips_keep_detail_in_every_window():
    """Clips of `solarwm data synth --frames 481 --fps 8`: each 5-s window's detail in a band of the clip's median."""
    spec = SynthSpec(frames=481, width=48, height=32, fps=8.0, seed=9000)
    for index in range(3):
        clip, _ = build_clip(spec, index)
        d = detail(clip.frames)
        per_window = np.array([d[s : s + 40].mean() for s in range(1, 481, 40)])
        median = np.median(per_window)
        assert per_window.min() > 0.4 * median and per_window.max() < 2.5 * median, index
        assert np.all(clip.c2w[:, 2, 3] >= CAMERA_Z[0] - 1e-9)


def test_long_clips_stay_above_ground_and_short_ones_never_pass_the_clamp(monkeypatch):
    """Looking down while walking for a minute would go through the ground; a 2-s clip is left as composed."""
    heights = np.concatenate(
        [sample_trajectory(np.random.default_rng(s), 481, 48, 32, 8.0).c2w[:, 2, 3] for s in range(20)]
    )
    assert heights.min() >= CAMERA_Z[0] and heights.max() <= CAMERA_Z[1]
    assert heights.min() == CAMERA_Z[0]  # some of these walks did reach the ground: the clamp is what held them

    def refuse(traj):
        raise AssertionError("a short clip was clamped")

    monkeypatch.setattr(synthetic, "_keep_above_ground", refuse)
    for seed in range(20):
        assert len(sample_trajectory(np.random.default_rng(seed), 161, 48, 32, 16.0)) == 161
