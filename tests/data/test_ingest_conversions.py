"""The conversions and the metric bridge, one pure function at a time."""

import io
import os

import numpy as np
import pytest

from solarwm.camera.conventions import rotation_to_quat
from solarwm.camera.se3 import check_se3, look_at
from solarwm.data.estimators import PoseEstimate
from solarwm.data.sources import conversions as cv
from solarwm.data.sources.bridge import BridgeConfig, windowed_metric_scale
from solarwm.data.sources.native import SourceDefect, load_object_npy


def test_window_plan_nearest_frame_rule():
    (w0, w1) = cv.window_plan(310, 30.0, "81f")
    assert (w0.start, w0.end, w1.start, w1.end) == (0, 152, 152, 304)
    assert w0.indices[:4].tolist() == [0, 2, 4, 6] and w0.indices[-1] == 150  # j*152/81, half up
    t = w1.indices - w1.start
    assert np.all(np.abs(t / 30.0 - np.arange(81) / 16.0) <= 0.5 / 30.0 + 1e-9)  # nearest frame in time
    same = cv.window_plan(200, 16.0, "160f")
    assert len(same) == 1 and same[0].indices.tolist() == list(range(160))  # 16 fps passes through
    assert len(cv.window_plan(1800, 29.97, "960f")) == 1


@pytest.mark.parametrize(
    "n, fps, spec, reason",
    [(500, 15.0, "81f", "fps_below_target"), (100, 30.0, "81f", "too_short"), (500, 0.0, "81f", "fps_unknown")],
)
def test_window_plan_never_upsamples(n, fps, spec, reason):
    with pytest.raises(SourceDefect) as e:
        cv.window_plan(n, fps, spec)
    assert e.value.reason == reason


def test_relabel_plan_keeps_every_frame():
    (w,) = cv.relabel_plan(81, 15.0, "81f")
    assert w.indices.tolist() == list(range(81))
    with pytest.raises(SourceDefect, match="fps_mismatch"):
        cv.relabel_plan(81, 24.0, "81f")


def test_unreal_to_opencv_axes_and_units():
    ue = np.eye(4)
    ue[3, :3] = [100.0, 200.0, 300.0]  # row-vector translation: 1 m forward, 2 m right, 3 m up
    cv_pose = cv.centimetres_to_metres(cv.unreal_to_opencv(ue[None]))[0]
    np.testing.assert_allclose(cv_pose[:3, 3], [2.0, -3.0, 1.0])  # OpenCV: x right, y down, z forward
    yaw = np.radians(30)  # a camera turned right (towards UE +y) about UE up
    R = np.array([[np.cos(yaw), -np.sin(yaw), 0], [np.sin(yaw), np.cos(yaw), 0], [0, 0, 1]])
    m = np.eye(4)
    m[:3, :3] = R
    out = cv.unreal_to_opencv(m.T[None])[0]
    check_se3(out)
    np.testing.assert_allclose(out[:3, 2], [np.sin(yaw), 0.0, np.cos(yaw)], atol=1e-12)  # looks forward-right


def test_quaternion_orders_and_w2c_inverse():
    c2w = look_at([1.0, 2.0, 0.5], [4.0, -1.0, 1.0])
    w2c = np.linalg.inv(c2w)
    q = rotation_to_quat(w2c[:3, :3], "wxyz")
    np.testing.assert_allclose(cv.quaternion_w2c_to_c2w(q[None], w2c[None, :3, 3], "wxyz")[0], c2w, atol=1e-12)
    np.testing.assert_allclose(
        cv.quaternion_w2c_to_c2w(q[None, [1, 2, 3, 0]], w2c[None, :3, 3], "xyzw")[0], c2w, atol=1e-12
    )
    np.testing.assert_allclose(cv.w2c_to_c2w(w2c[None, :3])[0], c2w, atol=1e-12)  # [N,3,4] padded
    with pytest.raises(SourceDefect, match="pose_nonfinite"):
        cv.quaternion_w2c_to_c2w(np.full((1, 4), np.nan), np.zeros((1, 3)))


def test_pixel_intrinsics_shapes_and_records():
    k = np.array([0.5, 0.9, 0.5, 0.5])
    expect = np.tile([32.0, 32.4, 32.0, 18.0], (3, 1))
    np.testing.assert_allclose(cv.pixel_intrinsics(k, 64, 36, 3), expect)
    m = np.array([[0.5, 0, 0.5], [0, 0.9, 0.5], [0, 0, 1]])
    np.testing.assert_allclose(cv.pixel_intrinsics(np.stack([m] * 3), 64, 36, 3), expect)
    np.testing.assert_allclose(cv.resize_K(expect, (64, 36), (128, 72)), 2 * expect)
    assert cv.record(cv.pixel_intrinsics, width=64) == {"name": "normalized_to_pixel_K", "version": 1, "width": 64}
    with pytest.raises(SourceDefect, match="intrinsics_shape"):
        cv.pixel_intrinsics(np.zeros((2, 2)), 64, 36, 3)


class _ScaledTruth:
    """A metric estimator whose answer in window ``k`` is the truth × ``scales[k]`` (to test the bridge's filters)."""

    name, version = "scaled-truth", "1"

    def __init__(self, metric_c2w, scales, units="metric"):
        self.truth, self.scales, self.units, self.calls = metric_c2w, scales, units, 0

    def estimate(self, frames, K, fps):
        idx = frames[:, 0, 0, 0].astype(int)  # the test's frames carry their index
        c2w = self.truth[idx].copy()
        c2w[:, :3, 3] *= self.scales[self.calls % len(self.scales)]
        self.calls += 1
        return PoseEstimate(c2w, K, self.units, self.name, self.version)


def _circle(n=81):
    t = np.linspace(0, 2.0, n)
    c2w = np.stack([look_at([3 * np.cos(a), 3 * np.sin(a), 1.5 + 0.2 * np.sin(3 * a)], [0, 0, 1]) for a in t])
    frames = np.zeros((n, 2, 2, 3), np.uint8)
    frames[:, 0, 0, 0] = np.arange(n)
    return c2w, frames, np.tile([50.0, 50, 32, 18], (n, 1))


def test_bridge_median_scale_survives_one_bad_window():
    metric, frames, K = _circle()
    gt = metric.copy()
    gt[:, :3, 3] /= 2.5  # the source's unknown units
    est = _ScaledTruth(metric, [1.0, 1.0, 3.0, 1.0, 1.0, 1.0])  # one window's reference is way off
    scale, diag = windowed_metric_scale(gt, frames, K, 16.0, est)
    assert scale == pytest.approx(2.5, rel=1e-9) and len(diag["windows"]) == 6


def test_bridge_fails_closed():
    metric, frames, K = _circle()
    with pytest.raises(SourceDefect, match="metric_reference_not_metric"):
        windowed_metric_scale(metric, frames, K, 16.0, _ScaledTruth(metric, [1.0], units="relative"))
    with pytest.raises(SourceDefect, match="metric_bridge_failed"):  # references disagree by 4x
        windowed_metric_scale(
            metric, frames, K, 16.0, _ScaledTruth(metric, [1.0, 4.0, 1.0, 4.0, 1.0, 4.0]), BridgeConfig(max_spread=2.5)
        )
    static = np.repeat(metric[:1], len(metric), 0)
    with pytest.raises(SourceDefect, match="metric_bridge_failed"):
        windowed_metric_scale(static, frames, K, 16.0, _ScaledTruth(metric, [1.0]))


def test_object_metadata_is_read_without_running_pickles():
    good = np.empty(1, dtype=object)
    good[0] = {"camera_extrinsics": np.eye(4)[None], "align_factor": np.float64(2.0)}
    buf = io.BytesIO()
    np.save(buf, good, allow_pickle=True)
    assert load_object_npy(buf.getvalue(), "m")[0]["align_factor"] == 2.0

    class Evil:
        def __reduce__(self):
            return (os.system, ("echo owned",))

    bad = np.empty(1, dtype=object)
    bad[0] = Evil()
    buf = io.BytesIO()
    np.save(buf, bad, allow_pickle=True)
    with pytest.raises(SourceDefect, match="metadata_unreadable"):
        load_object_npy(buf.getvalue(), "m")
