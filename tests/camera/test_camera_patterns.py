"""Procedural camera patterns and `solarwm camera trajectory`: length, validity, plausibility, files."""

from __future__ import annotations

import json

import numpy as np
import pytest

from solarwm.camera import trajectory as tj
from solarwm.camera.patterns import EYE_HEIGHT, MAX_YAW_RATE, PATTERNS, make_pattern, path_length
from solarwm.camera.se3 import check_se3
from solarwm.cli import main


def _speeds(traj: tj.Trajectory) -> np.ndarray:
    """Camera-centre speed per frame step, m/s."""
    return np.linalg.norm(np.diff(traj.c2w[:, :3, 3], axis=0), axis=1) * traj.fps


def _yaw_rates(traj: tj.Trajectory) -> np.ndarray:
    """Absolute heading change per frame step, degrees/s (OpenCV z is the optical axis)."""
    z = traj.c2w[:, :3, 2]
    return np.abs(np.diff(np.degrees(np.unwrap(np.arctan2(z[:, 1], z[:, 0]))))) * traj.fps


@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("frames", [2, 33, 1001])
def test_exact_frame_count_and_valid_poses(pattern, frames):
    traj = make_pattern(pattern, frames, fps=16.0, width=96, height=64, seed=1)
    assert len(traj) == frames and traj.K.shape == (frames, 4)
    check_se3(traj.c2w)
    assert (traj.width, traj.height) == (96, 64)
    assert np.allclose(traj.K, traj.K[0])  # no zoom: constant intrinsics
    assert traj.c2w[0, :3, 3] == pytest.approx([0.0, 0.0, EYE_HEIGHT])


@pytest.mark.parametrize("pattern", PATTERNS)
def test_same_seed_same_path_other_seed_other_path(pattern):
    a = make_pattern(pattern, 400, seed=7)
    b = make_pattern(pattern, 400, seed=7)
    c = make_pattern(pattern, 400, seed=8) if pattern != "orbit" else make_pattern(pattern, 400, seed=9)
    assert np.array_equal(a.c2w, b.c2w) and np.array_equal(a.K, b.K)
    assert not np.allclose(a.c2w, c.c2w)


@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("fps, speed", [(16.0, 1.2), (24.0, 1.5), (8.0, 1.0)])
def test_speed_and_turn_rate_stay_plausible(pattern, fps, speed):
    traj = make_pattern(pattern, int(600 * fps), fps=fps, seed=3, speed=speed)  # ten minutes
    speeds = _speeds(traj)
    assert speeds.max() <= speed * (1 + 1e-6)
    assert _yaw_rates(traj).max() <= MAX_YAW_RATE
    # No jerks: speed changes at most at a brisk walking start's acceleration.
    assert np.abs(np.diff(speeds)).max() * fps <= 2.5
    # Camera stays at eye height within a few centimetres (random glances return to level).
    assert np.abs(traj.c2w[:, 2, 3] - EYE_HEIGHT).max() < 0.1
    if pattern in ("walk", "orbit"):
        assert speeds.mean() > 0.8 * speed  # mostly walking
    assert path_length(traj) == pytest.approx(speeds.sum() / fps)


def test_walk_turns_both_ways_and_pauses():
    traj = make_pattern("walk", 16 * 300, fps=16.0, seed=0)
    z = traj.c2w[:, :3, 2]
    dyaw = np.diff(np.unwrap(np.arctan2(z[:, 1], z[:, 0])))
    assert (dyaw > 1e-4).any() and (dyaw < -1e-4).any()
    assert (_speeds(traj) < 1e-3).any()  # some stops
    assert np.abs(z[:, 2]).max() < 1e-9  # walking looks level


@pytest.mark.parametrize("look", ["inward", "tangent"])
def test_orbit_circles_at_fixed_radius(look):
    radius = 4.0
    traj = make_pattern("orbit", 16 * 40, fps=16.0, seed=0, radius=radius, look=look)  # > one loop
    pos, fwd, right = traj.c2w[:, :3, 3], traj.c2w[:, :3, 2], traj.c2w[:, :3, 0]
    if look == "inward":
        centre = pos[0] + radius * fwd[0]
    else:
        turn = np.sign(np.cross(fwd[0], fwd[5])[2])  # +1: turning left, the centre is on the left
        centre = pos[0] - turn * radius * right[0]
    to_centre = centre - pos
    assert np.linalg.norm(to_centre, axis=1) == pytest.approx(radius, rel=1e-3)
    cos = np.einsum("ij,ij->i", to_centre, fwd) / np.linalg.norm(to_centre, axis=1)
    if look == "inward":
        assert cos.min() > 0.9999  # the centre stays on the optical axis
    else:
        assert np.abs(cos).max() < 0.02  # facing along the circle
    assert path_length(traj) == pytest.approx(1.2 * (len(traj) - 1) / 16.0, rel=1e-3)


def test_bad_pattern_arguments_are_named_errors():
    with pytest.raises(ValueError, match="unknown pattern 'spiral'"):
        make_pattern("spiral", 10)
    with pytest.raises(ValueError, match="at least 2 frames"):
        make_pattern("walk", 1)
    with pytest.raises(ValueError, match="radius of at least"):
        make_pattern("orbit", 10, radius=0.5, speed=1.5)
    with pytest.raises(ValueError, match="unknown orbit look"):
        make_pattern("orbit", 10, look="outward")


@pytest.mark.parametrize("suffix", [".npz", ".json"])
def test_cli_writes_a_loadable_trajectory(tmp_path, capsys, suffix):
    out = tmp_path / "sub" / f"walk{suffix}"
    args = ["camera", "trajectory", "--pattern", "walk", "--frames", "500", "--fps", "16",
            "--size", "128x72", "--out", str(out), "--seed", "4", "--speed", "1.4"]
    assert main(args) == 0
    summary = json.loads(capsys.readouterr().out)
    loaded = tj.load_trajectory(out)
    direct = make_pattern("walk", 500, 16.0, 128, 72, seed=4, speed=1.4)
    assert np.array_equal(loaded.c2w, direct.c2w) and np.array_equal(loaded.K, direct.K)
    assert (loaded.fps, loaded.width, loaded.height) == (16.0, 128, 72)
    assert summary == {"path": str(out), "frames": 500, "fps": 16.0, "size": "128x72", "pattern": "walk",
                       "seed": 4, "path_length_m": pytest.approx(path_length(direct), abs=1e-3)}
    assert [p.name for p in out.parent.iterdir()] == [out.name]  # no temporary left behind


def test_an_hour_at_16_fps_is_one_command(tmp_path, capsys):
    out = tmp_path / "hour.npz"
    assert main(["camera", "trajectory", "--pattern", "random", "--frames", "57600", "--out", str(out)]) == 0
    traj = tj.load_trajectory(out)  # validates every pose
    assert len(traj) == 57600
    assert json.loads(capsys.readouterr().out)["frames"] == 57600
    assert _speeds(traj).max() <= 1.2 * (1 + 1e-6)


def test_vectorised_composition_matches_step_by_step_integration():
    segments = [tj.forward(10, 2.0), tj.Segment(9, forward=1.0, yaw=20.0, pitch=3.0), tj.orbit(20, 40.0, 3.0),
                tj.pitch_turn(5, -10.0), tj.zoom(6, 1.5), tj.vertical(4, 0.5), tj.lateral(7, -1.0)]
    traj = tj.compose_segments(segments, blend_steps=5, start_yaw=33.0, start_pitch=-7.0)
    # Reference: the per-frame loop compose_segments replaced (mid-step heading, world-up "up").
    inc = tj._blend(np.concatenate([s.increments() for s in segments]), 5)
    pos, yaw, pitch = np.array([0.0, 0.0, 1.5]), 33.0, -7.0
    expected = [tj.heading_c2w(pos, yaw, pitch)]
    for d_fwd, d_right, d_up, d_yaw, d_pitch, _ in inc:
        mid = tj.heading_c2w(pos, yaw + 0.5 * d_yaw, pitch + 0.5 * d_pitch)
        pos = pos + d_fwd * mid[:3, 2] + d_right * mid[:3, 0] + np.array([0.0, 0.0, d_up])
        yaw, pitch = yaw + d_yaw, pitch + d_pitch
        expected.append(tj.heading_c2w(pos, yaw, pitch))
    assert np.allclose(traj.c2w, np.stack(expected), atol=1e-12)
    assert traj.K[-1, 0] == pytest.approx(traj.K[0, 0] * 1.5)
