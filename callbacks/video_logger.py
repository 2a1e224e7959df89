"""`EvalVideoLogger`: held-out first frame + camera track → generated clip, next to the real one.

It also logs scalars ``eval/psnr`` (generated frames vs ground truth), ``eval/psnr_static`` (the
first frame repeated, the trivial baseline), ``eval/cam_rot_err_deg`` and ``eval/cam_trans_dir_err_deg``
(camera following, scored as ``solarwm test`` scores it).

Every ``every_n_steps`` optimizer steps (on the batch whose steps reach or cross the multiple: a DMD batch
makes one or two, `solarwm.callbacks.checkpoint.crossed_multiple`) and at the end of each validation, the first
``num_samples`` held-out windows are generated from their first frame, caption and
camera trajectory (``pl_module.generate``, with the EMA weights when an `EMA` callback
is present) and logged as ground truth | generated, side by side:

* to TensorBoard as an animated GIF image summary (what ``SummaryWriter.add_video``
  writes). ``add_video`` itself needs ``moviepy.editor``, which moviepy 2 removed, and
  it silently logs nothing without it, so the GIF is encoded here with Pillow and the
  same ``Summary.Image`` proto is written through the writer's event file;
* as mp4 files under ``<log_dir>/eval_videos/`` (`solarwm.data.video.write_video`).
"""

from __future__ import annotations

import io
from pathlib import Path

import lightning.pytorch as pl
import numpy as np
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities import rank_zero_only
from torch.utils.data import default_collate

from solarwm.callbacks.checkpoint import crossed_multiple
from solarwm.callbacks.ema import maybe_ema
from solarwm.data.video import to_uint8_frames


def gif_image_summary(tag: str, frames: np.ndarray, fps: float):
    """An animated-GIF ``Summary`` of uint8 ``[F, H, W, 3]`` frames (TensorBoard's video format)."""
    from PIL import Image
    from tensorboard.compat.proto.summary_pb2 import Summary

    buf = io.BytesIO()
    images = [Image.fromarray(f) for f in frames]
    images[0].save(buf, format="GIF", save_all=True, append_images=images[1:],
                   duration=max(1, round(1000 / fps)), loop=0)
    _, h, w, c = frames.shape
    image = Summary.Image(height=h, width=w, colorspace=c, encoded_image_string=buf.getvalue())
    return Summary(value=[Summary.Value(tag=tag, image=image)])


class EvalVideoLogger(Callback):
    """Log ground truth | generated clips of held-out windows every N steps and at validation end."""

    def __init__(
        self, every_n_steps: int = 100, num_samples: int = 1, num_steps: int = 8, fps: float = 8.0, seed: int = 0
    ) -> None:
        if every_n_steps < 1 or num_samples < 1 or num_steps < 1:
            raise ValueError("EvalVideoLogger: every_n_steps, num_samples and num_steps must be >= 1")
        self.every_n_steps, self.num_samples, self.num_steps = every_n_steps, num_samples, num_steps
        self.fps, self.seed = fps, seed
        self._last_step: int | None = None
        self._steps_before_batch = 0
        self.written: list[Path] = []  # mp4 files written so far (for inspection and tests)
        self.metrics: dict[str, float] = {}  # the last logged scores (eval/psnr, eval/psnr_static, eval/cam_*)

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: object) -> None:
        """Remember the optimizer step count before this batch's updates."""
        self._steps_before_batch = trainer.global_step

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: object) -> None:
        """Log when this batch's optimizer steps reached or crossed a multiple of ``every_n_steps``."""
        if crossed_multiple(self._steps_before_batch, trainer.global_step, self.every_n_steps):
            self.log_samples(trainer, pl_module)

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Log after every real validation (not the sanity check)."""
        if not trainer.sanity_checking:
            self.log_samples(trainer, pl_module)

    def _heldout_batch(self, trainer: pl.Trainer) -> dict | None:
        dataset = getattr(trainer.datamodule, "val_dataset", None) if trainer.datamodule is not None else None
        if dataset is None or len(dataset) == 0:
            return None
        return default_collate([dataset[i] for i in range(min(self.num_samples, len(dataset)))])

    @staticmethod
    def score(generated: torch.Tensor, video: torch.Tensor, c2w: torch.Tensor, K: torch.Tensor) -> dict[str, float]:
        """PSNR of the generated frames, of the static baseline (first frame repeated), and camera following.

        Camera pairs are scored as ``solarwm test`` scores them (``pair_step=SCORED_PAIR_STEP``), so the eval
        curve and the test table read the same metric. The translation error is NaN when no pair shows parallax.
        """
        from solarwm.metrics import SCORED_PAIR_STEP, CameraFollowing, VideoPSNR

        psnr, static, camera = VideoPSNR(), VideoPSNR(), CameraFollowing(pair_step=SCORED_PAIR_STEP)
        psnr.update(generated, video)
        static.update(video[:, :, :1].expand_as(video), video)
        camera.update(generated, c2w, K)
        follow = camera.compute()
        return {
            "psnr": float(psnr.compute()),
            "psnr_static": float(static.compute()),
            "cam_rot_err_deg": float(follow["rot_err_deg"]),
            "cam_trans_dir_err_deg": float(follow["trans_dir_err_deg"]),
        }

    @rank_zero_only
    def log_samples(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Generate the held-out samples once per step and write them to TensorBoard and mp4."""
        step = trainer.global_step
        if self._last_step == step:
            return
        batch = self._heldout_batch(trainer)
        if batch is None:
            return
        self._last_step = step
        video = batch["video"].to(pl_module.device)
        generator = torch.Generator(device=pl_module.device).manual_seed(self.seed)
        was_training = pl_module.training
        pl_module.eval()
        try:
            with torch.no_grad(), maybe_ema(trainer, pl_module):
                generated = pl_module.generate(
                    first_frame=video[:, :, 0],
                    caption=list(batch["caption"]),
                    c2w=batch["c2w"].to(pl_module.device),
                    K=batch["K"].to(pl_module.device),
                    num_steps=self.num_steps,
                    generator=generator,
                )
        finally:
            pl_module.train(was_training)
        self.metrics = self.score(generated.float().cpu(), video.cpu(), batch["c2w"], batch["K"])
        for logger in trainer.loggers:
            if isinstance(logger, TensorBoardLogger):
                for name, value in self.metrics.items():
                    logger.experiment.add_scalar(f"eval/{name}", value, step)
        side_by_side = torch.cat([video.cpu(), generated.float().cpu()], dim=-1)  # [B,3,F,H,2W]
        out_dir = Path(trainer.log_dir or trainer.default_root_dir) / "eval_videos"
        from solarwm.data.video import write_video

        out_dir.mkdir(parents=True, exist_ok=True)
        for i, sample_id in enumerate(batch["sample_id"]):
            frames = to_uint8_frames(side_by_side[i])
            tag = f"eval/{sample_id}"
            for logger in trainer.loggers:
                if isinstance(logger, TensorBoardLogger):
                    # The writer's own event file; add_video would write this very proto.
                    logger.experiment._get_file_writer().add_summary(gif_image_summary(tag, frames, self.fps), step)
                    logger.experiment.flush()
            path = write_video(out_dir / f"step{step:07d}_{sample_id}.mp4", frames, self.fps)
            self.written.append(Path(path))
