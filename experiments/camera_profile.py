"""Where a stage's camera error comes from: rotation gain per frame step, and the token grid in its frames.

    python experiments/camera_profile.py [OUT] [STAGE ...]

OUT: the folder of `bash examples/three_stages.sh OUT`; STAGE: stage1, stage2 or stage3 (default: all three).

Each stage's export generates the held-out test clips as `solarwm test` does (same first frames, cameras
and noise seeds). The project's camera estimator then measures, for frame steps of 4 (the pairs
`test/cam_rot_err_deg` scores) and of 1, the **rotation gain**: the estimated rotation's component along
the commanded rotation axis over the commanded angle (1: the video turns as commanded; < 1: it lags),
the median over the clips, per step. The truth is measured alike, as the floor. Two artefacts show here
that the mean error hides:

* a stutter: the frames inside one latent frame (4 video frames under one camera) turn too little and
  the step into the next latent frame catches up;
* the error's axes: the median |error| of the step-4 pairs about the camera's x (tilt), y (pan) and z
  (roll, about the optical axis) axes, and the signed mean of the error about each (a bias, not noise,
  when far from 0). At 32x32 roll is the least constrained (its lever arm is the image radius, ≤ 16 px);
* the token grid: the mean luminance step across token borders (every 4th pixel column and row at
  32x32) over the one inside tokens, 1 for a video without a grid. Its corners stand still while the
  camera turns, so they pull the step-1 gains down further: on a stage-1 export of the 2-layer base the
  steps inside a latent read 0.6-0.8 and the steps into the next one 1.0-1.3, and after a 1.2 px blur
  of every frame (grid 1.38 -> 1.10) 0.8-0.9 and 1.2-1.3, whose sums match the step-4 gains.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch
from scipy.spatial.transform import Rotation

from solarwm.data.video import to_uint8_frames
from solarwm.metrics.camera_following import commanded_relative_pose, estimate_relative_pose
from solarwm.stages.checkpoints import load_adapter_weights
from solarwm.train_cli import SolarCLI

RECIPES = {"stage1": "tiny_bid", "stage2": "tiny_tf", "stage3": "tiny_dmd"}
RECIPE_DIR = Path(__file__).resolve().parents[1] / "recipes"


def rotation_gain(R_est: np.ndarray, R_cmd: np.ndarray) -> float | None:
    """Estimated rotation ``[3, 3]`` along the commanded one's axis over its angle; None for a commanded angle
    < 0.2 deg."""
    cmd = Rotation.from_matrix(R_cmd).as_rotvec()
    if np.linalg.norm(cmd) < np.radians(0.2):
        return None
    return float(Rotation.from_matrix(R_est).as_rotvec() @ cmd / (cmd @ cmd))


def pair_estimates(videos: list[np.ndarray], cameras: list[tuple[np.ndarray, np.ndarray]],
                   step: int) -> list[list[tuple]]:
    """Per start frame ``i`` (every ``step``), the ``(estimated R, commanded R)`` of pairs ``(i, i + step)`` with an
    estimate."""
    pairs = []
    for i in range(0, len(videos[0]) - step, step):
        at_i = []
        for video, (c2w, K) in zip(videos, cameras):
            est = estimate_relative_pose(video[i:i + step + 1], K[i], K[i + step])
            if est is not None:
                at_i.append((est.R, commanded_relative_pose(c2w[i], c2w[i + step])[:3, :3]))
        pairs.append(at_i)
    return pairs


def gain_profile(pairs: list[list[tuple]]) -> list[float]:
    """Median rotation gain over the clips for each start frame of ``pair_estimates``."""
    profile = []
    for at_i in pairs:
        gains = [g for g in (rotation_gain(R_est, R_cmd) for R_est, R_cmd in at_i) if g is not None]
        profile.append(float(np.median(gains)) if gains else float("nan"))
    return profile


def axis_errors(pairs: list[list[tuple]]) -> np.ndarray:
    """Error rotation vectors in degrees ``[P, 3]`` (camera x, y, z) of all pairs of ``pair_estimates``."""
    errors = [np.degrees(Rotation.from_matrix(R_est @ R_cmd.T).as_rotvec()) for at_i in pairs for R_est, R_cmd in at_i]
    return np.array(errors).reshape(-1, 3)


def token_grid(videos: list[np.ndarray], token: int) -> float:
    """Mean |luminance step| across token borders over the mean inside tokens (both axes, frames after the first)."""
    gray = np.stack(videos)[:, 1:].astype(np.float64).mean(-1)  # [N, F-1, H, W]
    ratios = []
    for axis in (2, 3):
        step = np.abs(np.diff(gray, axis=axis))
        phase = [np.take(step, range(p, step.shape[axis], token), axis=axis).mean() for p in range(token)]
        ratios.append(phase[token - 1] / np.mean(phase[: token - 1]))
    return float(np.mean(ratios))


def generated(out: Path, stage: str) -> tuple[list[np.ndarray], list[np.ndarray],
                                              list[tuple[np.ndarray, np.ndarray]], int]:
    """(generated videos, true videos, cameras, token size in pixels) of the stage's export on the test clips."""
    cli = SolarCLI(args=["--config", str(RECIPE_DIR / f"{RECIPES[stage]}.yaml"), "--root", str(out),
                         "--trainer.logger", "false"], run=False)
    module = cli.model
    load_adapter_weights(module.adapter, out / stage / "adapter")
    module.eval()
    cli.datamodule.setup("test")
    gen, truth, cameras = [], [], []
    for batch_idx, batch in enumerate(cli.datamodule.test_dataloader()):
        rng = torch.Generator().manual_seed(module.rollout_seed(cli.datamodule) + batch_idx)  # as StageModule.test_step
        with torch.no_grad():
            video = module.generate(batch["video"][:, :, 0], list(batch["caption"]), batch["c2w"], batch["K"],
                                    generator=rng)
        for b in range(len(video)):
            gen.append(to_uint8_frames(video[b].float()))
            truth.append(to_uint8_frames(batch["video"][b]))
            cameras.append((batch["c2w"][b].double().numpy(), batch["K"][b].double().numpy()))
    adapter = module.adapter
    token = adapter.codec.spatial_compression * adapter.config.patch_size[-1]
    return gen, truth, cameras, token


def main() -> None:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "outputs/three_stages")
    stages = sys.argv[2:] or list(RECIPES)
    for stage in stages:
        gen, truth, cameras, token = generated(out, stage)
        for name, videos in (("truth", truth), (stage, gen)):
            print(f"{name:<7} token grid {token_grid(videos, token):.2f}")
            pairs = {step: pair_estimates(videos, cameras, step) for step in (4, 1)}
            for step in (4, 1):
                profile = gain_profile(pairs[step])
                gains = " ".join(f"{i * step}>{(i + 1) * step}:{g:.2f}" for i, g in enumerate(profile))
                print(f"{'':<7} gain, step {step}: " + gains)
            err = axis_errors(pairs[4])
            print(f"{'':<7} error axes, step 4 (deg, median |e| / mean e): " + " ".join(
                f"{axis}:{np.median(np.abs(err[:, k])):.3f}/{err[:, k].mean():+.3f}" for k, axis in enumerate("xyz")))


if __name__ == "__main__":
    main()
