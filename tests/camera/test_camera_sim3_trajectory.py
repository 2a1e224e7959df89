"""Sim(3) alignment and trajectory generators / file format."""

import math

import numpy as np
import pytest

from solarwm.camera import trajectory as tj
from solarwm.camera.conventions import pose_from_quaternion
from solarwm.camera.se3 import check_se3
from solarwm.camera.sim3 import DegenerateAlignmentError, robust_umeyama, umeyama


def _known(rng, n=50):
    src = rng.normal(size=(n, 3)) * 3
    T = pose_from_quaternion(rng.normal(size=4), rng.normal(size=3))
    s = 2.5
    dst = s * src @ T[:3, :3].T + T[:3, 3]
    return src, dst, s, T[:3, :3], T[:3, 3]


def test_umeyama_exact_and_noisy():
    rng = np.random.default_rng(0)
    src, dst, s, R, t = _known(rng)
    s_, R_, t_ = umeyama(src, dst)
    assert s_ == pytest.approx(s, rel=1e-10)
    np.testing.assert_allclose(R_, R, atol=1e-10)
    np.testing.assert_allclose(t_, t, atol=1e-9)
    s_, R_, t_ = umeyama(src, dst + rng.normal(scale=0.01, size=dst.shape))
    assert s_ == pytest.approx(s, rel=1e-2)
    np.testing.assert_allclose(R_, R, atol=1e-2)


def test_robust_beats_plain_with_outliers():
    rng = np.random.default_rng(1)
    src, dst, s, R, t = _known(rng, 60)
    dst = dst + rng.normal(scale=0.005, size=dst.shape)
    dst[:5] += rng.normal(scale=20.0, size=(5, 3))  # 8% gross outliers
    s_plain, _, _ = umeyama(src, dst)
    fit = robust_umeyama(src, dst, keep=0.8)
    assert abs(fit.scale - s) < abs(s_plain - s)
    assert abs(fit.scale - s) < 1e-2
    np.testing.assert_allclose(fit.rotation, R, atol=1e-2)
    assert not fit.inliers[:5].any() and fit.inliers.sum() == 48
    assert fit.inlier_rmse < 0.02 and fit.p90_residual < 1.0
    np.testing.assert_allclose(fit.apply(src[5:]), dst[5:], atol=0.05)


def test_umeyama_drops_non_finite_rows():
    rng = np.random.default_rng(2)
    src, dst, s, _, _ = _known(rng, 10)
    src[3] = np.nan
    assert umeyama(src, dst)[0] == pytest.approx(s)


@pytest.mark.parametrize(
    "src, why",
    [
        (np.zeros((2, 3)), "at least 3"),
        (np.ones((10, 3)), "static"),
        (np.outer(np.arange(10.0), [1.0, 2.0, 0.5]), "collinear"),
        (np.full((10, 3), np.nan), "at least 3"),
    ],
)
def test_degenerate_inputs_raise_named_error(src, why):
    with pytest.raises(DegenerateAlignmentError, match=why):
        umeyama(src, np.random.default_rng(3).normal(size=src.shape))


def test_forward_speed_and_heading():
    traj = tj.compose_segments([tj.forward(32, 4.0)], blend_steps=0)
    assert len(traj) == 33
    steps = np.linalg.norm(np.diff(traj.c2w[:, :3, 3], axis=0), axis=1)
    np.testing.assert_allclose(steps, 4.0 / 32)
    # heading yaw=0 → optical axis +x, and motion is along the optical axis
    np.testing.assert_allclose(traj.c2w[0, :3, 2], [1, 0, 0], atol=1e-12)
    check_se3(traj.c2w)


def test_each_generator_moves_as_named():
    start = tj.compose_segments([tj.pause(1)]).c2w[0]
    def last(seg):
        return tj.compose_segments([seg], blend_steps=0).c2w[-1]
    assert last(tj.backward(8, 1.0))[0, 3] == pytest.approx(-1.0)
    assert last(tj.lateral(8, 1.0))[1, 3] == pytest.approx(-1.0)  # right of +x heading is -y
    assert last(tj.vertical(8, 0.5))[2, 3] == pytest.approx(2.0)
    yaw = last(tj.yaw_turn(9, 90.0))
    np.testing.assert_allclose(yaw[:3, 2], [0, 1, 0], atol=1e-12)  # turned left
    pitch = last(tj.pitch_turn(9, 30.0))
    assert pitch[2, 2] == pytest.approx(math.sin(math.radians(30)))
    np.testing.assert_allclose(last(tj.pause(5)), start)


def test_orbit_keeps_pivot_centred():
    traj = tj.compose_segments([tj.orbit(90, 90.0, radius=3.0)], blend_steps=0)
    pivot = np.array([3.0, 0.0, 1.5])
    for T in traj.c2w[::10]:
        to_pivot = pivot - T[:3, 3]
        assert np.linalg.norm(to_pivot) == pytest.approx(3.0, rel=1e-3)
        cosang = to_pivot @ T[:3, 2] / np.linalg.norm(to_pivot)
        assert cosang > 0.9999


def test_zoom_scales_focal_and_composition_is_continuous():
    traj = tj.compose_segments([tj.forward(16, 2.0), tj.yaw_turn(16, 45.0), tj.zoom(16, 2.0)], blend_steps=6)
    assert len(traj) == 49
    assert traj.K[-1, 0] / traj.K[0, 0] == pytest.approx(2.0, rel=1e-6)
    assert (traj.K[:, 0] == traj.K[:, 1]).all()
    # velocities change smoothly: no step increment more than 2x the max of its neighbours' mean
    step = np.linalg.norm(np.diff(traj.c2w[:, :3, 3], axis=0), axis=1)
    assert np.abs(np.diff(step)).max() < 0.5 * step.max()


@pytest.mark.parametrize("suffix", [".json", ".npz"])
def test_trajectory_file_round_trip(tmp_path, suffix):
    traj = tj.compose_segments([tj.forward(8, 1.0), tj.zoom(8, 1.2)], fps=12.0, width=96, height=64)
    path = tj.save_trajectory(traj, tmp_path / f"t{suffix}")
    back = tj.load_trajectory(path)
    np.testing.assert_allclose(back.c2w, traj.c2w)
    np.testing.assert_allclose(back.K, traj.K)
    assert (back.fps, back.width, back.height) == (12.0, 96, 64)


def test_trajectory_file_errors_name_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.json"):
        tj.load_trajectory(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text(
        '{"format": "solarwm.trajectory/1", "fps": 8, "width": 4, "height": 4, '
        '"c2w": [[[1,0,0,0],[0,1,0,0],[0,0,1,0],[0,0,0,2]]], "K": [[1,1,2,2]]}'
    )
    with pytest.raises(ValueError, match="bad.json.*bottom_row"):
        tj.load_trajectory(bad)
    with pytest.raises(ValueError, match="3 frames, 5 requested"):
        tj.compose_segments([tj.forward(2)]).slice(0, 5)
