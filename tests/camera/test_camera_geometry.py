"""SE(3), convention converters and intrinsics: round trips and named failures."""

import math

import numpy as np
import pytest
import torch

from solarwm.camera import conventions as conv
from solarwm.camera.integrity import camera_integrity
from solarwm.camera.intrinsics import (
    crop_intrinsics,
    focal_divergence,
    focal_mm_to_pixels,
    fov_deg,
    normalized_to_pixels,
    pixels_to_normalized,
    project,
    resize_intrinsics,
)
from solarwm.camera.se3 import PoseError, check_se3, compose, look_at, relative_pose, se3_inverse


def random_se3(rng, n=None):
    q = rng.normal(size=(4,) if n is None else (n, 4))
    t = rng.normal(size=(3,) if n is None else (n, 3))
    return conv.pose_from_quaternion(q, t)


def test_se3_inverse_numpy_and_torch():
    rng = np.random.default_rng(0)
    T = random_se3(rng, 8)
    np.testing.assert_allclose(se3_inverse(T) @ T, np.broadcast_to(np.eye(4), T.shape), atol=1e-12)
    Tt = torch.from_numpy(T)
    np.testing.assert_allclose(se3_inverse(Tt).numpy(), np.linalg.inv(T), atol=1e-12)


def test_compose_and_relative_pose():
    rng = np.random.default_rng(1)
    a, b = random_se3(rng), random_se3(rng)
    np.testing.assert_allclose(compose(a, relative_pose(a, b)), b, atol=1e-12)
    np.testing.assert_allclose(relative_pose(a, a), np.eye(4), atol=1e-12)


def test_look_at_points_optical_axis_at_target():
    T = look_at([1.0, 2.0, 1.5], [4.0, -1.0, 0.5])
    check_se3(T)
    uv, z = project(np.array([[4.0, -1.0, 0.5]]), T, np.array([50.0, 50.0, 32.0, 32.0]))
    np.testing.assert_allclose(uv[0], [32.0, 32.0], atol=1e-9)
    assert z[0] > 0
    # the image's "up" (-y camera axis) points to world up
    assert T[2, 1] < 0
    with pytest.raises(ValueError, match="parallel"):
        look_at([0, 0, 0], [0, 0, 5])


@pytest.mark.parametrize(
    "bad, check",
    [
        (lambda T: T.__setitem__((0, 0), np.nan), "finite"),
        (lambda T: T.__setitem__((3, 0), 0.5), "bottom_row"),
        (lambda T: T.__setitem__((0, 0), 2.0), "orthonormal"),
        (lambda T: T.__setitem__((slice(0, 3), 0), -T[:3, 0]), "det"),
    ],
)
def test_check_se3_names_the_failed_check(bad, check):
    T = random_se3(np.random.default_rng(2))
    bad(T)
    with pytest.raises(PoseError) as e:
        check_se3(T)
    assert e.value.check == check


def test_opengl_opencv_round_trip_and_meaning():
    rng = np.random.default_rng(3)
    T = random_se3(rng, 5)
    np.testing.assert_allclose(conv.opencv_to_opengl(conv.opengl_to_opencv(T)), T, atol=1e-12)
    # An OpenGL camera at the origin looking down -z sees a point at z=-2 straight ahead.
    c2w_gl = np.eye(4)
    uv, z = project(np.array([[0.0, 0.0, -2.0]]), conv.opengl_to_opencv(c2w_gl), np.array([10.0, 10.0, 5.0, 5.0]))
    assert z[0] == pytest.approx(2.0) and np.allclose(uv, [[5.0, 5.0]])
    # ... and a point above it (GL +y) lands above the centre (smaller v).
    uv, _ = project(np.array([[0.0, 1.0, -2.0]]), conv.opengl_to_opencv(c2w_gl), np.array([10.0, 10.0, 5.0, 5.0]))
    assert uv[0, 1] < 5.0


def test_w2c_c2w_round_trip():
    T = random_se3(np.random.default_rng(4), 3)
    np.testing.assert_allclose(conv.w2c_to_c2w(conv.c2w_to_w2c(T)), T, atol=1e-12)


@pytest.mark.parametrize("order", ["wxyz", "xyzw"])
def test_quaternion_round_trip(order):
    rng = np.random.default_rng(5)
    q = rng.normal(size=(16, 4))
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    q *= np.sign(q[:, :1])  # canonical w >= 0
    qo = q if order == "wxyz" else q[:, [1, 2, 3, 0]]
    R = conv.quat_to_rotation(qo, order)
    np.testing.assert_allclose(conv.rotation_to_quat(R, order), qo, atol=1e-10)
    check_se3(conv.pose_from_quaternion(qo, np.zeros((16, 3)), order))


def test_quaternion_known_rotation():
    # 90° about z in wxyz
    R = conv.quat_to_rotation([math.cos(math.pi / 4), 0, 0, math.sin(math.pi / 4)])
    np.testing.assert_allclose(R @ [1, 0, 0], [0, 1, 0], atol=1e-12)
    with pytest.raises(ValueError):
        conv.quat_to_rotation([0, 0, 0, 0])
    with pytest.raises(ValueError):
        conv.quat_to_rotation([1, 0, 0, 0], order="zyxw")


def test_intrinsics_conversions():
    K = np.array([[100.0, 110.0, 64.0, 36.0]])
    np.testing.assert_allclose(normalized_to_pixels(pixels_to_normalized(K, 128, 72), 128, 72), K)
    fx, fy = fov_deg(K, 128, 72)
    assert fx[0] == pytest.approx(math.degrees(2 * math.atan(64 / 100)))
    assert fy[0] == pytest.approx(math.degrees(2 * math.atan(36 / 110)))
    assert focal_divergence(K)[0] == pytest.approx(10 / 105, rel=1e-6)
    # 24 mm on a 36 mm sensor at 1920 px: 1280 px
    assert focal_mm_to_pixels(24.0, 36.0, 1920) == pytest.approx(1280.0)


def test_resize_and_crop_keep_projection_consistent():
    c2w = look_at([0, 0, 1.5], [5, 1, 1.0])
    K = np.array([60.0, 60.0, 32.0, 32.0])
    pts = np.array([[5.0, 1.0, 1.0], [6.0, 0.5, 2.0], [4.0, 2.0, 0.3]])
    uv, _ = project(pts, c2w, K)
    # resize 64 -> 32 then crop 4 px left, 2 px top: pixel coordinates follow the image
    K2 = crop_intrinsics(resize_intrinsics(K, 0.5, 0.5), 4, 2)
    uv2, _ = project(pts, c2w, K2)
    np.testing.assert_allclose(uv2, uv * 0.5 - [4, 2], atol=1e-9)
    Kt = resize_intrinsics(torch.from_numpy(K[None]), 2.0, 3.0)
    assert Kt.tolist() == [[120.0, 180.0, 64.0, 96.0]]


def test_camera_integrity_keys_and_fail_closed():
    c2w = np.stack([np.eye(4)] * 4)
    K = np.tile([32.0, 32.0, 32.0, 32.0], (4, 1))
    m = camera_integrity(c2w, K, 64, 64)
    assert m["camera.finite"] is True and m["camera.scale_cov"] == 0.0
    assert m["camera.fov_x_min"] == pytest.approx(90.0)
    assert camera_integrity(c2w, K, 64, 64, scale=[1.0, 1.0, 3.0, 3.0])["camera.scale_cov"] == pytest.approx(0.5)
    c2w[1, 0, 3] = np.nan
    bad = camera_integrity(c2w, K, 64, 64)
    assert bad == {"camera.finite": False, "camera.pose_units": "metric"}
    assert camera_integrity(np.stack([np.eye(4)] * 3), K, 64, 64) == {
        "camera.finite": False,
        "camera.pose_units": "metric",
    }
