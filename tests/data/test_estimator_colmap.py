"""The ``colmap`` estimator (pycolmap SfM) and the metric scale, on rendered worlds with exact cameras.

Bounds, 81 frames at 160×120, 16 fps, fov 70°, after ``sim3.trajectory_errors``
(rotation from the orientations, scale and translation from the centres):

* known K, walk-and-turn arc and orbit (SIFT on 2×-enlarged frames; the checked mapper keeps the
  global run): worst rotation error ≤ 1° (measured 0.16° and 0.64° with pycolmap 4.1.1) and worst
  camera-centre error ≤ 1% of the path (measured 0.46% and 0.79%; without the enlargement 1.1% and
  2.6%: docs/results/2026-12-colmap-enlargement.md);
* metric scale with the oracle depth (the renderer's true depth): within 2% of the truth
  (measured −0.6% on the arc with 8 sampled frames);
* unknown K (slow: two seeded runs): focal within 3%, rotation ≤ 2°;
* random seeded paths (slow): kept within 1° and 1% of the path, or failed with a named reason (kept
  random paths reached 2.2% of the path before the split-half check, which now fails them as
  ``uncertain trajectory``);
* a static camera, a textureless clip, a scene cut and a 5-frame clip fail with named errors.

SfM costs ~40-120 s per 81-frame clip on one core.
"""

from __future__ import annotations

import numpy as np
import pytest

from solarwm.camera import trajectory as T
from solarwm.camera.sim3 import trajectory_errors
from solarwm.data.estimators import ESTIMATORS, EstimationError, get_estimator
from solarwm.data.estimators.depth import DepthMap, TransformersDepth, metric_scale
from solarwm.data.sources.render import depth_views
from solarwm.data.sources.synthetic import make_scene, render_clip, sample_trajectory

W, H, F = 160, 120, 81
ARC = (1, T.Segment(F - 1, forward=4.0, yaw=60.0))
ORBIT = (2, T.orbit(F - 1, 60.0, radius=4.0))
POS_BOUND = 0.01  # worst camera-centre error / path length (measured 0.46% arc, 0.79% orbit)


def rendered(seed: int, segment: T.Segment, frames: int = F, w: int = W, h: int = H):
    """(trajectory, frames uint8 [F, H, W, 3], true depth [F, H, W]) of one clip."""
    if frames != F:
        segment = T.Segment(frames - 1, **{k: v * (frames - 1) / (F - 1) for k, v in
                                           (("forward", segment.forward), ("yaw", segment.yaw))})
    traj = T.compose_segments([segment], fps=16, width=w, height=h, fov_x_deg=70.0, start=(0, 0, 1.5),
                              start_yaw=20.0 * seed)
    scene = make_scene(np.random.default_rng(seed), traj.c2w)
    return traj, render_clip(scene, traj), depth_views(scene, traj.c2w, traj.K, w, h)


class TrueDepth:
    """A depth model answering with the renderer's depth of the frame it is given (the oracle, without a corpus)."""

    name, version, predicts_fov = "oracle", "1", False

    def __init__(self, frames: np.ndarray, depth: np.ndarray):
        self.frames, self.depth = frames.astype(np.float32), depth

    def predict(self, frame: np.ndarray) -> DepthMap:
        return DepthMap(self.depth[int(np.abs(self.frames - frame).mean((1, 2, 3)).argmin())])

    def describe(self) -> dict:
        return {"name": self.name, "version": self.version, "weights": None, "weights_sha256": None}


@pytest.mark.slow
def test_known_K_arc_is_accurate_and_metric_with_the_oracle_depth():
    traj, frames, depth = rendered(*ARC)
    est = get_estimator("colmap", depth=TrueDepth(frames, depth)).estimate(frames, traj.K, 16.0)
    assert est.pose_units == "metric" and est.c2w.shape == (F, 4, 4) and np.allclose(est.K, traj.K)
    d = est.diagnostics
    assert d["registered"] == F and d["focal_source"] == "given" and d["reprojection_px"] < 1.5
    assert d["mapper"] == "checked" and d["global_run"]["vs_first"]["rot_max_deg"] <= 2.0
    split = d["split_check"]  # two halves of the points, each adjusted alone, agree (worst of 3: 0.66% of the path)
    assert len(split["pos_max_frac"]) == 3 and split["worst_pos_frac"] == max(split["pos_max_frac"]) <= 0.007
    err = trajectory_errors(est.c2w, traj.c2w)
    assert err["rot_max_deg"] <= 1.0 and err["pos_max_frac"] <= POS_BOUND
    # metric: the similarity onto the true (metric) path needs no scale
    assert abs(err["scale"] - 1.0) <= 0.02, err
    assert d["metric_scale"]["spread"] < 0.05 and d["depth_model"]["name"] == "oracle"


@pytest.mark.slow
def test_known_K_orbit_is_accurate_and_relative_without_a_depth_model():
    traj, frames, _ = rendered(*ORBIT)
    est = get_estimator("colmap").estimate(frames, traj.K, 16.0)
    assert est.pose_units == "relative" and est.diagnostics["scale_note"] == "median point depth = 1"
    err = trajectory_errors(est.c2w, traj.c2w)
    assert err["rot_max_deg"] <= 1.0 and err["pos_max_frac"] <= POS_BOUND


@pytest.mark.slow
def test_unknown_K_orbit_estimates_the_focal():
    traj, frames, _ = rendered(*ORBIT)
    est = get_estimator("colmap").estimate(frames, None, 16.0)
    assert est.diagnostics["focal_source"] == "estimated" and est.diagnostics["upscale"] == 2
    assert np.allclose(est.K[:, 0], est.K[0, 0]) and np.allclose(est.K[:, 2:], [W / 2, H / 2])
    assert abs(est.K[0, 0] / traj.K[0, 0] - 1) <= 0.03
    assert trajectory_errors(est.c2w, traj.c2w)["rot_max_deg"] <= 2.0


NAMED = ("too few frames", "no model", "several disconnected models", "too few registered frames",
         "too few points", "reprojection error", "focal:", "metric scale:", "unstable trajectory", "unstable focal",
         "uncertain trajectory")


def test_frames_under_320_px_on_the_short_side_are_enlarged_2x():
    colmap = get_estimator("colmap")
    # (h, w) -> factor, by the short side: 160x120 and 320x240, either way up, are enlarged
    # (measured in docs/results/2026-12-colmap-enlargement-320.md).
    sizes = ((120, 160), (240, 320), (180, 320), (320, 240), (320, 480), (720, 1280))
    assert [colmap._upscale(h, w) for h, w in sizes] == [2, 2, 2, 2, 1, 1]
    assert get_estimator("colmap", upscale=1)._upscale(120, 160) == 1  # an explicit factor wins
    assert get_estimator("colmap", upscale=3)._upscale(720, 1280) == 3


def test_the_second_focal_seed_nudges_the_first_wider():
    assert get_estimator("colmap")._focal_seeds(None, W, H) == pytest.approx((1.2 * W, W))  # COLMAP's prior 1.2 W
    # a depth-model seed
    assert get_estimator("colmap")._focal_seeds(0.6 * W, W, H) == pytest.approx((0.6 * W, 0.5 * W))
    assert get_estimator("colmap", second_focal_seed_ratio=1.5)._focal_seeds(None, H, W) == pytest.approx(
        (1.2 * W, 0.8 * W)
    )
    for bad in (1.0, 0.0, -1.2):  # 1 repeats the first run: no second opinion
        with pytest.raises(ValueError, match="second_focal_seed_ratio"):
            get_estimator("colmap", second_focal_seed_ratio=bad)
    with pytest.raises(ValueError, match="split_pos_frac"):
        get_estimator("colmap", split_pos_frac=0.0)
    with pytest.raises(ValueError, match="split_draws"):
        get_estimator("colmap", split_draws=0)


@pytest.mark.slow
@pytest.mark.parametrize("i, known", [(0, True), (1, True), (2, True), (0, False)])
def test_random_clip_meets_the_bounds_or_fails_by_name(i, known):
    # Frames not enlarged and unchecked, pycolmap 4.1.1's incremental mapper sends random1 and random2 16-18 deg off
    # and its global mapper random0 12 deg off, each with a low reprojection error; with K estimated, one incremental
    # run puts random0's focal 67% short. The checked default must keep them right or fail them by name; with the
    # mappers agreeing, random1 and random2 were kept 2.2% and 1.4% of the path off until the split-half check.
    traj = sample_trajectory(np.random.default_rng([7, i]), F, W, H, 16.0)  # the benchmark's random{i}
    frames = render_clip(make_scene(np.random.default_rng(100 + i), traj.c2w), traj)
    try:
        est = get_estimator("colmap").estimate(frames, traj.K if known else None, 16.0)
    except EstimationError as e:
        assert str(e).startswith(NAMED), str(e)
        return
    err = trajectory_errors(est.c2w, traj.c2w)
    if known:
        assert err["rot_max_deg"] <= 1.0 and err["pos_max_frac"] <= POS_BOUND
    else:
        assert err["rot_max_deg"] <= 2.0 and abs(est.K[0, 0] / traj.K[0, 0] - 1) <= 0.03


@pytest.mark.slow
def test_when_the_mappers_disagree_the_clip_fails_by_name():
    # random1, K known, frames not enlarged (upscale=1): the incremental mapper lands 15 deg off, the global
    # mapper 0.6 deg; neither run is kept (enlarged, the two agree).
    traj = sample_trajectory(np.random.default_rng([7, 1]), F, W, H, 16.0)
    frames = render_clip(make_scene(np.random.default_rng(101), traj.c2w), traj)
    with pytest.raises(EstimationError, match="unstable trajectory: the incremental and global mappers disagree"):
        get_estimator("colmap", upscale=1).estimate(frames, traj.K, 16.0)


@pytest.mark.slow
def test_degenerate_clips_fail_by_name():
    traj, frames, _ = rendered(ARC[0], ARC[1], frames=17)
    est = get_estimator("colmap")
    with pytest.raises(EstimationError, match=r"^too few frames: 5 < 8"):
        est.estimate(frames[:5], traj.K[:5], 16.0)
    with pytest.raises(EstimationError, match=r"^no model"):  # a static camera: no parallax
        est.estimate(np.repeat(frames[:1], 12, 0), traj.K[:12], 16.0)
    with pytest.raises(EstimationError, match=r"^no model"):  # textureless
        est.estimate(np.full((12, H, W, 3), 127, np.uint8), traj.K[:12], 16.0)
    # A scene cut: the second half shows another world, so no single model holds every frame.
    other = render_clip(make_scene(np.random.default_rng(99), traj.c2w), traj)
    cut = np.concatenate([frames[:9], other[9:]])
    with pytest.raises(EstimationError, match=r"^(several disconnected models|too few registered frames)"):
        est.estimate(cut, traj.K, 16.0)


def test_metric_scale_fails_when_frames_disagree():
    rng = np.random.default_rng(0)

    class Ob:
        def __init__(self):
            self.uv = rng.uniform(0, 32, (40, 2))
            self.z = np.full(40, 2.0)

    frames = np.zeros((8, 32, 32, 3), np.uint8)
    frames[:, 0, 0, 0] = np.arange(8)  # tell the frames apart

    class Drifting:
        name, version, predicts_fov = "drift", "1", False

        def predict(self, frame):
            return DepthMap(np.full((32, 32), 2.0 * (1 + 0.5 * frame[0, 0, 0]), np.float32))

        def describe(self):
            return {"name": self.name}

    observed = [Ob() for _ in range(8)]
    with pytest.raises(EstimationError, match=r"^metric scale: per-frame depth ratios disagree"):
        metric_scale(observed, frames, Drifting())
    scale, diag = metric_scale(observed, frames, TrueDepth(frames, np.full((8, 32, 32), 6.0, np.float32)))
    assert scale == pytest.approx(3.0) and diag["spread"] == 0.0 and len(diag["frames"]) == 8


@pytest.mark.slow
def test_tiny_random_depthpro_runs_end_to_end(tmp_path):
    """Plumbing only: a random DepthPro saved with save_pretrained and loaded from that folder.

    Its metres mean nothing.
    """
    import sys
    from pathlib import Path

    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from pose_estimate import tiny_depthpro

    torch.manual_seed(0)
    tiny_depthpro(tmp_path)
    model = TransformersDepth(tmp_path)
    assert model.predicts_fov and len(model.describe()["weights_sha256"]) == 64
    traj, frames, _ = rendered(*ARC)
    out = model.predict(frames[0])
    assert out.depth.shape == (H, W) and out.fov_x_deg is not None
    # A random model's per-frame depth ratios disagree, so the spread bound is lifted, and the split-half check
    # (tested above) is off: at 4 fps it fails this arc by name, 0.95% of the path. Plumbing only.
    est = get_estimator("colmap", depth=model, max_scale_spread=np.inf, split_pos_frac=None).estimate(
        frames[::4], traj.K[::4], 4.0
    )
    assert est.pose_units == "metric" and est.diagnostics["depth_model"]["name"] == "transformers:depth_pro"
    assert np.isfinite(est.c2w).all() and est.diagnostics["metric_scale"]["scale"] > 0


def test_registry():
    assert {"colmap", "geocalib", "moge2", "pi3x", "vipe"} <= set(ESTIMATORS)
    assert get_estimator("colmap").pose_units == "relative"
    with pytest.raises(EstimationError, match="takes no weights"):
        get_estimator("colmap", weights="/some/path")
