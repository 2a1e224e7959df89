"""The twist integrator of `solarwm play` and the SE(3) exponential map it uses."""

from __future__ import annotations

import numpy as np
import pytest

from solarwm.camera.controller import CameraController, ControlError, check_twist
from solarwm.camera.se3 import check_se3, se3_exp, se3_inverse


def test_se3_exp_is_rodrigues_and_inverts_by_negation():
    rng = np.random.default_rng(0)
    xi = rng.normal(size=(20, 6))
    T = se3_exp(xi)
    check_se3(T)
    np.testing.assert_allclose(se3_exp(-xi), se3_inverse(T), atol=1e-12)
    # a pure rotation of 90 deg about +y maps forward (+z) to right (+x)
    R = se3_exp(np.array([0, 0, 0, 0, np.pi / 2, 0]))[:3, :3]
    np.testing.assert_allclose(R @ [0, 0, 1], [1, 0, 0], atol=1e-12)
    # tiny angles use the series and agree with the closed form continuously
    small = se3_exp(np.array([1.0, 2.0, 3.0, 1e-6, 0, 0]))
    np.testing.assert_allclose(small[:3, 3], [1.0, 2.0 - 1.5e-6, 3.0 + 1e-6], atol=1e-9)


def test_frames_integrate_the_twist_at_the_fps_in_camera_axes():
    controller = CameraController(fps=16.0)
    first = controller.frames(9, velocity=[0, 0, 1.0], angular=[0, 0, 0])
    np.testing.assert_allclose(first[0], np.eye(4))
    np.testing.assert_allclose(first[-1][:3, 3], [0, 0, 8 / 16.0], atol=1e-12)
    turn = controller.frames(16, velocity=[0, 0, 0], angular=[0, 45.0, 0])  # one second of yaw right
    forward = (np.linalg.inv(first[-1]) @ turn[-1])[:3, 2]
    np.testing.assert_allclose(forward, [np.sin(np.radians(45)), 0, np.cos(np.radians(45))], atol=1e-12)
    # pitch up (+wx) looks toward -y; strafe +x moves right in the turned frame
    up = controller.frames(1, angular=[90.0, 0, 0])
    assert (np.linalg.inv(turn[-1]) @ up[0])[1, 2] < 0


def test_smoothing_damps_a_step_change_and_is_off_by_default():
    sharp = CameraController(fps=10.0).frames(3, velocity=[1.0, 0, 0])
    np.testing.assert_allclose(np.diff(sharp[:, 0, 3]), 0.1)
    smooth = CameraController(fps=10.0, smoothing=0.5).frames(30, velocity=[1.0, 0, 0])
    steps = np.diff(smooth[:, 0, 3])
    assert 0 < steps[0] < 0.05 and np.all(np.diff(steps) > 0) and steps[-1] > 0.09


@pytest.mark.parametrize("velocity, angular, match", [
    ([0, 0], [0, 0, 0], "3 numbers"), ([0, 0, float("nan")], [0, 0, 0], "finite"),
    ([0, 0, 5], [0, 0, 0], "above the maximum"), ([0, 0, 0], [0, 200, 0], "above the maximum"),
    (["a", 0, 0], [0, 0, 0], "3 numbers"),
])
def test_bad_twists_are_named(velocity, angular, match):
    with pytest.raises(ControlError, match=match):
        check_twist(velocity, angular, max_speed=4.0, max_angular=180.0)
