"""The CPU pose estimator ``cpu-sfm`` on rendered worlds whose metric trajectory is known exactly.

Measured bound (``benchmarks/pose_estimate.py``, 256×192, 24 frames at 16 fps, fov 70°): after a
robust Sim(3) alignment of camera centres (``sim3.robust_umeyama``) the largest per-frame
rotation error was 1.6° (walk-and-turn arc) and 3.5° (diagonal climb) with known K, and 6.7° on
the diagonal climb with K estimated (cpu-sfm v2; 6.0° with v1). The test asserts 5° with known K
and 8° with estimated K. The seeded random clips at the end use an alignment-free error instead.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy.spatial.transform import Rotation

from solarwm.camera import trajectory as T
from solarwm.camera.sim3 import robust_umeyama
from solarwm.data.estimators import ESTIMATORS, EstimationError, get_estimator
from solarwm.data.sources.synthetic import make_scene, render_clip

W, H, F = 256, 192, 24


def rendered(seed: int, segment: T.Segment):
    traj = T.compose_segments([segment], fps=16, width=W, height=H, fov_x_deg=70.0, start=(0, 0, 1.5),
                              start_yaw=20.0 * seed)
    return traj, render_clip(make_scene(np.random.default_rng(seed), traj.c2w), traj)


def rotation_error_deg(est: np.ndarray, gt: np.ndarray) -> np.ndarray:
    """Per-frame rotation error [F] after a Sim(3) fit of estimated to true camera centres."""
    fit = robust_umeyama(est[:, :3, 3], gt[:, :3, 3])
    aligned = fit.rotation @ est[:, :3, :3]
    return np.degrees(Rotation.from_matrix(np.swapaxes(aligned, 1, 2) @ gt[:, :3, :3]).magnitude())


ARC = (1, T.Segment(F - 1, forward=2.0, yaw=30.0))
CLIMB = (4, T.Segment(F - 1, forward=1.5, right=0.8, up=0.6, yaw=20.0))


@pytest.mark.parametrize("seed,segment", [ARC, CLIMB], ids=["arc", "climb"])
def test_known_K_rotation_error_after_sim3_is_bounded(seed, segment):
    traj, frames = rendered(seed, segment)
    est = get_estimator("cpu-sfm").estimate(frames, traj.K, 16.0)
    assert est.pose_units == "relative" and est.estimator == "cpu-sfm"
    assert est.c2w.shape == (F, 4, 4) and np.allclose(est.K, traj.K)
    assert rotation_error_deg(est.c2w, traj.c2w).max() < 5.0
    d = est.diagnostics
    assert d["focal_source"] == "given" and d["reprojection_rmse_px"] < 1.0
    assert len(d["pnp_inliers"]) == F and min(d["pnp_inliers"]) >= 12


def test_unknown_K_estimates_one_focal_and_bounded_rotation():
    traj, frames = rendered(*CLIMB)
    est = get_estimator("cpu-sfm").estimate(frames, None, 16.0)
    assert est.diagnostics["focal_source"] == "estimated"
    assert np.allclose(est.K[:, 0], est.K[0, 0]) and np.allclose(est.K[:, 1], est.K[:, 0])
    assert np.allclose(est.K[:, 2:], [W / 2, H / 2])
    assert abs(est.K[0, 0] / traj.K[0, 0] - 1) < 0.25
    assert rotation_error_deg(est.c2w, traj.c2w).max() < 8.0


def test_featureless_or_static_clips_raise_estimation_error():
    flat = np.full((6, 96, 128, 3), 127, np.uint8)
    with pytest.raises(EstimationError, match="too few features"):
        get_estimator("cpu-sfm").estimate(flat, None, 16.0)
    traj, frames = rendered(*ARC)
    static = np.repeat(frames[:1], 8, axis=0)
    with pytest.raises(EstimationError, match="initialisation"):
        get_estimator("cpu-sfm").estimate(static, traj.K[:8], 16.0)


def test_registry_names_the_cpu_estimator():
    assert "cpu-sfm" in ESTIMATORS
    with pytest.raises(EstimationError, match="no weights"):
        get_estimator("cpu-sfm", weights="/some/path")


def rotation_error_rel0_deg(est: np.ndarray, gt: np.ndarray) -> np.ndarray:
    """Per-frame error [F] of each rotation relative to frame 0: free of the world gauge and of scale."""
    rel_est = np.swapaxes(est[:1, :3, :3], 1, 2) @ est[:, :3, :3]
    rel_gt = np.swapaxes(gt[:1, :3, :3], 1, 2) @ gt[:, :3, :3]
    return np.degrees(Rotation.from_matrix(np.swapaxes(rel_est, 1, 2) @ rel_gt).magnitude())


# Measured over the benchmark's 7 seeded random clips (benchmarks/pose_estimate.py --random 7, K
# estimated and known): every clip that was not failed had a rotation error relative to frame 0
# under 11°. Sim(3)-of-centres errors are not used here: these paths are short and often nearly
# straight, so the alignment's rotation about the path is undetermined (it reads up to 180°).
RANDOM_REL0_BOUND_DEG = 12.0
NAMED_FAILURES = ("too few features", "focal:", "initialisation:", "frame ", "bundle adjustment:", "ill-conditioned:")


@pytest.mark.parametrize("i", [0, 1, 2])
def test_random_clips_fail_by_name_or_stay_within_the_bound(i):
    from solarwm.data.sources.synthetic import sample_trajectory

    traj = sample_trajectory(np.random.default_rng([7, i]), F, W, H, 16.0)  # the benchmark's clip random{i}
    frames = render_clip(make_scene(np.random.default_rng(100 + i), traj.c2w), traj)
    try:
        est = get_estimator("cpu-sfm").estimate(frames, None, 16.0)
    except EstimationError as e:
        assert str(e).startswith(NAMED_FAILURES), str(e)
        return
    assert rotation_error_rel0_deg(est.c2w, traj.c2w).max() < RANDOM_REL0_BOUND_DEG
