"""Accuracy and cost of the ``colmap`` pose estimator on rendered worlds with exact metric cameras.

    python benchmarks/pose_estimate.py [--sizes 160x120,320x180] [--frames 81] [--clips arc,orbit] [--random 1]

Per clip kind (walk-and-turn arc, diagonal climb, orbit, lateral-then-forward, seeded random
clips of the synthetic corpus's own sampler) and size, renders the clip, estimates poses with K
known and with K estimated, aligns the estimate to the truth (``sim3.trajectory_errors``:
rotation from the orientations, scale and translation from the centres) and prints one JSON line:
worst rotation error (deg), worst camera-centre error (% of the path), focal error, seconds.
The figures of the hand-written ``cpu-sfm`` it replaced (measured once before it was deleted,
``pose_estimate_cpu_sfm.jsonl``) are printed in the same run with ``"estimator": "cpu-sfm (old)"``.
``--scale`` also times the metric-scale step with each depth model (the oracle, and a tiny random
DepthPro saved with ``save_pretrained``; its metres mean nothing, only its cost).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from solarwm.camera import trajectory as T
from solarwm.camera.sim3 import trajectory_errors
from solarwm.data.estimators import EstimationError, get_estimator
from solarwm.data.sources.render import depth_views
from solarwm.data.sources.synthetic import make_scene, render_clip, sample_trajectory
from solarwm.util.parsing import parse_size

OLD = Path(__file__).with_name("pose_estimate_cpu_sfm.jsonl")


def clips(w: int, h: int, frames: int, names: list[str], random: int) -> dict[str, tuple[int, T.Trajectory]]:
    """Clip kind → (world seed, trajectory); the named kinds are the old benchmark's, over ``frames`` frames."""
    n = frames - 1
    kinds = {
        "arc": (1, [T.Segment(n, forward=2.0, yaw=30.0)]),
        "climb": (4, [T.Segment(n, forward=1.5, right=0.8, up=0.6, yaw=20.0)]),
        "orbit": (2, [T.orbit(n, 40.0, radius=4.0)]),
        "lateral_forward": (3, [T.lateral(n // 2, 1.0), T.forward(n - n // 2, 1.5)]),
    }
    out = {k: (seed, T.compose_segments(seg, fps=16, width=w, height=h, fov_x_deg=70.0, start=(0, 0, 1.5),
                                        start_yaw=20.0 * seed)) for k, (seed, seg) in kinds.items() if k in names}
    for i in range(random):
        out[f"random{i}"] = (100 + i, sample_trajectory(np.random.default_rng([7, i]), frames, w, h, 16.0))
    return out


def tiny_depthpro(folder: Path) -> None:
    """A randomly initialised DepthPro with the field-of-view head, saved with ``save_pretrained``."""
    from transformers import DepthProConfig, DepthProForDepthEstimation

    vit = {"model_type": "dinov2", "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
           "image_size": 64, "patch_size": 16, "out_indices": [1, 2]}
    cfg = DepthProConfig(
        patch_size=64,
        fusion_hidden_size=16,
        intermediate_hook_ids=[1, 0],
        intermediate_feature_dims=[8, 8],
        scaled_images_feature_dims=[16, 16, 8],
        use_fov_model=True,
        num_fov_head_layers=1,
        image_model_config=vit,
        patch_model_config=vit,
        fov_model_config=vit,
    )
    DepthProForDepthEstimation(cfg).save_pretrained(folder)
    # The processor's config as the hub's DepthPro folders ship it (DepthProImageProcessor itself needs torchvision).
    (folder / "preprocessor_config.json").write_text(
        json.dumps(
            {
                "image_processor_type": "DepthProImageProcessor",
                "do_resize": True,
                "size": {"height": 256, "width": 256},
                "do_rescale": True,
                "rescale_factor": 1 / 255,
                "do_normalize": True,
                "image_mean": [0.5, 0.5, 0.5],
                "image_std": [0.5, 0.5, 0.5],
            }
        )
    )


def main() -> None:
    """Print one JSON line per (clip, size, K) for colmap and the old cpu-sfm, then the scale-step timings."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="160x120,320x180")
    p.add_argument("--frames", type=int, default=81)
    p.add_argument("--clips", default="arc,climb,orbit,lateral_forward")
    p.add_argument("--random", type=int, default=1)
    p.add_argument("--scale", action="store_true", help="also time the metric-scale step per depth model")
    a = p.parse_args()
    for size in a.sizes.split(","):
        w, h = parse_size(size)
        for name, (seed, traj) in clips(w, h, a.frames, a.clips.split(","), a.random).items():
            scene = make_scene(np.random.default_rng(seed), traj.c2w)
            frames = render_clip(scene, traj)
            for known in (True, False):
                row = {
                    "estimator": "colmap",
                    "clip": name,
                    "size": size,
                    "frames": a.frames,
                    "K": "known" if known else "estimated",
                }
                t0 = time.perf_counter()
                try:
                    est = get_estimator("colmap").estimate(frames, traj.K if known else None, 16.0)
                except EstimationError as e:
                    print(
                        json.dumps({**row, "error": str(e), "seconds": round(time.perf_counter() - t0, 1)}), flush=True
                    )
                    continue
                err = trajectory_errors(est.c2w, traj.c2w)
                row.update(
                    rot_max_deg=round(err["rot_max_deg"], 3),
                    pos_max_pct=round(100 * err["pos_max_frac"], 3),
                    path_m=round(err["path_m"], 3),
                    seconds=round(time.perf_counter() - t0, 1),
                    reproj_px=est.diagnostics["reprojection_px"],
                    upscale=est.diagnostics["upscale"],
                )
                if not known:
                    row["focal_err_pct"] = round(100 * float(est.K[0, 0] / traj.K[0, 0] - 1), 2)
                print(json.dumps(row), flush=True)
            if a.scale and name == "arc":
                time_scale(frames, traj, scene, size)
    if OLD.is_file():
        for line in OLD.read_text().splitlines():
            print(json.dumps({"estimator": "cpu-sfm (old)", **json.loads(line)}))


def time_scale(frames: np.ndarray, traj: T.Trajectory, scene, size: str) -> None:
    """Seconds of the metric-scale step (8 sampled frames) per depth model on one reconstruction."""
    from solarwm.data.estimators.colmap import ColmapEstimator
    from solarwm.data.estimators.depth import DepthMap, TransformersDepth, metric_scale

    depth = depth_views(scene, traj.c2w, traj.K, traj.width, traj.height)

    class RenderedDepth:  # the oracle's answer, without its video lookup
        name, version, predicts_fov = "oracle", "1", False

        def predict(self, frame):
            return DepthMap(depth[int(np.abs(frames.astype(np.float32) - frame).mean((1, 2, 3)).argmin())])

        def describe(self):
            return {"name": "oracle"}

    holder: dict = {}
    import solarwm.data.estimators.depth as D

    real = D.metric_scale

    def keep_observations(observed, fr, model, **kw):  # the step's input, to time it alone below
        holder["observed"] = observed
        return real(observed, fr, model, **kw)

    D.metric_scale = keep_observations
    try:
        out = ColmapEstimator(depth=RenderedDepth()).estimate(frames, traj.K, 16.0)
    finally:
        D.metric_scale = real
    truth = trajectory_errors(out.c2w, traj.c2w)["scale"]
    with tempfile.TemporaryDirectory() as tmp:
        tiny_depthpro(Path(tmp))
        for model in (RenderedDepth(), TransformersDepth(tmp)):
            t0 = time.perf_counter()
            try:
                scale, diag = metric_scale(holder["observed"], frames, model)
                extra = {"scale_err_pct": round(100 * (truth - 1), 3)} if model.name == "oracle" else {}
            except EstimationError as e:
                extra = {"error": str(e)}
            print(
                json.dumps(
                    {
                        "step": "metric_scale",
                        "depth_model": model.name,
                        "size": size,
                        "sampled_frames": 8,
                        "seconds": round(time.perf_counter() - t0, 3),
                        **extra,
                    }
                ),
                flush=True,
            )


if __name__ == "__main__":
    main()
