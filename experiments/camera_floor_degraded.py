"""How far the camera-following floor moves when the ground truth is degraded by pixel noise or blur.

`test/cam_rot_err_deg_gt` and `test/cam_trans_dir_err_deg_gt` score the rendered test clips themselves.
A generated video is never that clean: this scores the same clips after per-frame Gaussian noise and
blur (the first frame kept, as a generated video keeps its anchor; a "ramp" blur grows from 0 at the
first frame to sigma at the last, as a rollout loses detail), next to the PSNR the degradation costs, so
a camera error can be read against the image quality it was measured at. The cameras are the clips'
own, so every error here is the estimator's, none is the motion's.

    python experiments/camera_floor_degraded.py [OUT]

OUT: the folder of `bash examples/three_stages.sh OUT` (default outputs/three_stages).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable

import cv2
import numpy as np
import torch

from solarwm.data.video import to_uint8_frames
from solarwm.metrics import SCORED_PAIR_STEP, CameraFollowing, VideoPSNR, video_from_uint8
from solarwm.train_cli import SolarCLI

#: (frame [H, W, 3] uint8, rng, position in the clip in [0, 1]) -> degraded frame.
Degrade = Callable[[np.ndarray, np.random.Generator, float], np.ndarray]


def noise(std: float) -> Degrade:
    """Independent Gaussian noise of ``std`` grey levels per pixel and frame."""
    return lambda f, rng, t: np.clip(f + rng.normal(0.0, std, f.shape), 0, 255).astype(np.uint8)


def blur(sigma: float, std: float = 0.0, ramp: bool = False) -> Degrade:
    """Gaussian blur of ``sigma`` pixels (``ramp``: ``sigma * t`` at clip position ``t``), then optional noise."""
    add_noise = noise(std)

    def degrade(f: np.ndarray, rng: np.random.Generator, t: float) -> np.ndarray:
        s = sigma * t if ramp else sigma
        return add_noise(cv2.GaussianBlur(f, (0, 0), s) if s > 0 else f, rng, t)
    return degrade


def score(batches: list[dict], degrade: Degrade) -> tuple[float, dict[str, float]]:
    """(PSNR in dB as `solarwm test` reports it, camera-following summary) of the degraded clips."""
    metric, psnr, rng = CameraFollowing(pair_step=SCORED_PAIR_STEP), VideoPSNR(), np.random.default_rng(0)
    for batch in batches:
        clean, degraded = [], []
        for video in batch["video"]:
            frames = to_uint8_frames(video)  # scored against the same 8-bit frames, so undegraded is inf dB
            clean.append(video_from_uint8(frames))
            last = len(frames) - 1
            degraded.append(video_from_uint8(np.stack(
                [frames[0]] + [degrade(f, rng, i / last) for i, f in enumerate(frames[1:], start=1)])))
        degraded = torch.cat(degraded)
        psnr.update(degraded, torch.cat(clean))
        metric.update(degraded, batch["c2w"], batch["K"])
    summary = {k: float(v) for k, v in metric.compute().items()}
    summary["parallax_pairs"] = float(sum(len(errors) for errors in metric.trans_err))  # pairs with a direction
    return float(psnr.compute()), summary


def main() -> None:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "outputs/three_stages")
    recipe = Path(__file__).resolve().parents[1] / "recipes" / "tiny_bid.yaml"
    cli = SolarCLI(args=["--config", str(recipe), "--root", str(out),
                          "--trainer.logger", "false"], run=False)
    cli.datamodule.setup("test")
    batches = list(cli.datamodule.test_dataloader())
    cases = {"ground truth": noise(0.0), "noise 4": noise(4.0), "noise 8": noise(8.0), "noise 12": noise(12.0),
             "blur 0.7": blur(0.7), "blur 1.0": blur(1.0), "blur 1.5": blur(1.5), "blur 0.7 + noise 6": blur(0.7, 6.0),
             "blur 1.0 + noise 6": blur(1.0, 6.0), "ramp blur 1.5": blur(1.5, ramp=True),
             "ramp blur 2.5": blur(2.5, ramp=True)}
    print(f"{'degradation':<20}{'psnr':>8}{'rot_err':>9}{'median':>8}{'trans_err':>11}{'median':>8}"
          f"{'parallax':>10}{'failed':>8}")
    clean = None
    for name, degrade in cases.items():
        psnr, cam = score(batches, degrade)
        clean = cam['trans_dir_err_deg'] if clean is None else clean  # the first case is the clean floor
        print(f"{name:<20}{psnr:>8.2f}{cam['rot_err_deg']:>9.3f}{cam['rot_err_deg_median']:>8.3f}"
              f"{cam['trans_dir_err_deg']:>11.2f}{cam['trans_dir_err_deg_median']:>8.2f}"
              f"{int(cam['parallax_pairs']):>10}{int(cam['failed_pairs']):>5}/{int(cam['pairs'])}"
              f"   translation {cam['trans_dir_err_deg'] / clean:.2f}x the clean floor")


if __name__ == "__main__":
    main()
