"""What every training stage shares: the adapter, the optimiser wiring, clean latents, the stage tag.

A stage (paper §4) is a LightningModule around one ``BackboneAdapter``. Its checkpoints carry a
``solarwm`` tag ``{"stage", "route"}`` so that the next stage's ``init_from`` and ``solarwm predict``
can refuse a checkpoint of the wrong stage or route with a clear message.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import lightning.pytorch as pl
import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable

from solarwm.backbones.base import BackboneAdapter
from solarwm.objectives.rng import SampleRNG


class NonFiniteLossError(FloatingPointError):
    """The training loss became NaN/inf; the message names the global step and the batch's sample ids."""


def default_optimizer(params: Any) -> torch.optim.Optimizer:
    """AdamW(lr=1e-4, betas=(0.9, 0.999), weight_decay=0.0): the default when the YAML names none."""
    return torch.optim.AdamW(params, lr=1e-4, betas=(0.9, 0.999), weight_decay=0.0)


class _ConfiguredLR(torch.optim.lr_scheduler.LambdaLR):
    """A LambdaLR whose shape (its constructor args, ``_SHAPE``) comes from the config, its progress from a checkpoint.

    Resuming a run with the schedule changed (a cool-down added or moved, another ``total_steps``) must
    follow the new shape, not the one the checkpoint was made under, so the shape is kept out of the state.
    """

    _SHAPE: ClassVar[tuple[str, ...]] = ()
    warmup_steps: int

    def _warmup(self, step: int) -> float:
        """Linear warm-up factor from ~0 to 1 over ``warmup_steps`` optimizer steps."""
        return 1.0 if self.warmup_steps <= 0 else min(1.0, (step + 1) / self.warmup_steps)

    def state_dict(self) -> dict[str, Any]:
        """The scheduler's progress (``last_epoch``, last LRs), without the schedule's shape."""
        return {k: v for k, v in super().state_dict().items() if k not in self._SHAPE}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore progress; shape keys in older checkpoints are ignored in favour of the config."""
        super().load_state_dict({k: v for k, v in state_dict.items() if k not in self._SHAPE})


class WarmupConstantLR(_ConfiguredLR):
    """Linear warm-up over ``warmup_steps``, constant LR, then an optional linear cool-down.

    With ``decay_steps > 0`` the factor falls linearly from 1 at ``decay_start`` to ``min_lr_ratio`` at
    ``decay_start + decay_steps`` and stays there (a warmup-stable-decay schedule). The stable phase is
    identical to a run without cool-down, so a constant-LR checkpoint resumes into its cool-down exactly.
    """

    _SHAPE = ("warmup_steps", "decay_start", "decay_steps", "min_lr_ratio")

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        warmup_steps: int = 0,
        decay_start: int = 0,
        decay_steps: int = 0,
        min_lr_ratio: float = 0.0,
    ) -> None:
        if decay_steps < 0 or decay_start < 0 or not 0.0 <= min_lr_ratio <= 1.0:
            raise ValueError(
                "WarmupConstantLR: decay_start >= 0, decay_steps >= 0 and min_lr_ratio in [0, 1]; "
                f"got {decay_start}, {decay_steps}, {min_lr_ratio}"
            )
        self.warmup_steps = warmup_steps
        self.decay_start, self.decay_steps, self.min_lr_ratio = decay_start, decay_steps, min_lr_ratio
        super().__init__(optimizer, lr_lambda=self._factor)

    def _factor(self, step: int) -> float:
        warm = self._warmup(step)
        if self.decay_steps <= 0 or step < self.decay_start:
            return warm
        progress = min(1.0, (step - self.decay_start) / self.decay_steps)
        return warm * (1.0 - (1.0 - self.min_lr_ratio) * progress)


class WarmupCosineLR(_ConfiguredLR):
    """Linear warm-up over ``warmup_steps``, then cosine decay to ``min_lr_ratio`` × LR at ``total_steps``."""

    _SHAPE = ("warmup_steps", "total_steps", "min_lr_ratio")

    def __init__(
        self, optimizer: torch.optim.Optimizer, warmup_steps: int = 0, total_steps: int = 1, min_lr_ratio: float = 0.1
    ) -> None:
        if total_steps < 1 or not 0.0 <= min_lr_ratio <= 1.0:
            raise ValueError(
                f"WarmupCosineLR: total_steps >= 1 and min_lr_ratio in [0, 1]; got {total_steps}, {min_lr_ratio}"
            )
        self.warmup_steps, self.total_steps, self.min_lr_ratio = warmup_steps, total_steps, min_lr_ratio
        super().__init__(optimizer, lr_lambda=self._factor)

    def _factor(self, step: int) -> float:
        if step < self.warmup_steps:
            return self._warmup(step)
        span = max(1, self.total_steps - self.warmup_steps)
        progress = min(1.0, (step - self.warmup_steps) / span)
        return self.min_lr_ratio + (1.0 - self.min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


class StageModule(pl.LightningModule):
    """Base of the stage modules: ``adapter``, optimiser/scheduler factories, ``latents``, checkpoint tag."""

    #: Name written into checkpoints and exports: ``bidirectional``, ``tf_anyflow``, ``dmd``.
    stage_name: ClassVar[str] = ""
    #: Whether the stage's model generates block-causally (rollout) rather than as one clip.
    causal: ClassVar[bool] = False

    def __init__(
        self,
        adapter: BackboneAdapter | None,
        optimizer: OptimizerCallable = default_optimizer,
        lr_scheduler: LRSchedulerCallable | None = WarmupConstantLR,
    ) -> None:
        super().__init__()
        if adapter is not None:  # None: the subclass provides `adapter` itself (DMD: its generator)
            self.adapter = adapter
        self.optimizer_factory = optimizer
        self.scheduler_factory = lr_scheduler
        self._run_seed: int | None = None

    def latents(self, batch: dict[str, Any]) -> torch.Tensor:
        """Clean latents ``[B, C, f, h, w]``: ``batch["latents"]`` if cached, else ``adapter.encode(video)``.

        Latents from a latent view carry ``view_codec`` (``route:codec_hash``); a view made for another
        route or codec is refused (`solarwm.datamodules.latents.LatentViewError`) instead of trained on.
        """
        if "latents" in batch:
            if "view_codec" in batch:
                from solarwm.datamodules.latents import check_view_codec

                check_view_codec(batch["view_codec"], self.adapter)
            return batch["latents"].float()
        with torch.no_grad():
            return self.adapter.encode(batch["video"]).float()

    def sample_index(self, batch: dict[str, Any]) -> torch.Tensor:
        """The samples' logical indices ``[B]`` (``batch["sample_index"]``); a hand-built batch without them
        gets fresh random keys from the global RNG."""
        if "sample_index" in batch:
            return torch.as_tensor(batch["sample_index"], dtype=torch.long).reshape(-1)
        size = self.batch_size_of(batch)
        if size is None:
            size = (batch["latents"] if "latents" in batch else batch["video"]).shape[0]
        return torch.randint(0, 2**62, (size,))

    def sample_rng(self, batch: dict[str, Any], salt: int = 0) -> SampleRNG:
        """Per-sample random streams of ``batch``, keyed by its ``sample_index`` and the run's seed.

        The run's seed is ``torch.initial_seed()`` when fit started (``seed_everything``, the same on every
        rank), so a different seed draws different noise while a 1-process and an N-process run of one seed
        draw the same noise for each sample.
        """
        run_seed = self._run_seed if self._run_seed is not None else torch.initial_seed()
        return SampleRNG(self.sample_index(batch), salt=run_seed * 1_000_003 + salt, device=self.device)

    def configure_model(self) -> None:
        """Shard the adapter's transformer when the strategy is ``RouteFSDPStrategy`` (its per-block FSDP2 plan)."""
        from solarwm.strategies import RouteFSDPStrategy

        strategy = self._trainer.strategy if self._trainer is not None else None
        if isinstance(strategy, RouteFSDPStrategy):
            for adapter in self.sharded_adapters():
                strategy.parallelize(adapter)

    def sharded_adapters(self) -> list[BackboneAdapter]:
        """The adapters whose transformers FSDP shards (stages with several roles return each)."""
        return [self.adapter]

    def on_fit_start(self) -> None:
        """Remember the run's seed (``seed_everything``) for ``sample_rng``."""
        self._run_seed = torch.initial_seed()

    def check_finite(self, loss: torch.Tensor, batch: dict[str, Any], batch_idx: int) -> None:
        """Stop training with ``NonFiniteLossError`` naming the step and the samples when ``loss`` is NaN/inf."""
        if not torch.isfinite(loss.detach()).item():
            raise NonFiniteLossError(
                f"non-finite training loss {loss.item()} at global step {self.global_step} "
                f"(batch {batch_idx}); sample ids: {list(batch.get('sample_id', []))}"
            )

    @staticmethod
    def batch_size_of(batch: dict[str, Any]) -> int | None:
        """Samples in ``batch`` (for ``self.log``)."""
        return len(batch["sample_id"]) if "sample_id" in batch else None

    def clip_grad_norm(self, optimizer: torch.optim.Optimizer, max_norm: float) -> None:
        """Clip the gradient norm to ``max_norm``, also under FSDP.

        FSDP v1 shards the gradients, so a per-rank ``clip_grad_norm_`` would see a partial norm (Lightning
        refuses it); the root FSDP module computes the global norm over all ranks' shards instead. Under
        FSDP2 (``RouteFSDPStrategy``) the gradients are DTensors, whose norm is already global. It clips
        every parameter with a gradient, so callers with several optimisers zero the others' first.
        """
        from lightning.pytorch.strategies import FSDPStrategy

        strategy = self._trainer.strategy if self._trainer is not None else None
        if isinstance(strategy, FSDPStrategy):
            strategy.model.clip_grad_norm_(max_norm)
        else:
            self.clip_gradients(optimizer, gradient_clip_val=max_norm, gradient_clip_algorithm="norm")

    def configure_gradient_clipping(
        self,
        optimizer: torch.optim.Optimizer,
        gradient_clip_val: float | None = None,
        gradient_clip_algorithm: str | None = None,
    ) -> None:
        """``trainer.gradient_clip_val`` by norm through ``clip_grad_norm`` (FSDP-aware); by value as Lightning does."""
        if gradient_clip_val and gradient_clip_algorithm in (None, "norm"):
            self.clip_grad_norm(optimizer, gradient_clip_val)
        else:
            self.clip_gradients(optimizer, gradient_clip_val, gradient_clip_algorithm)

    def configure_optimizers(self) -> dict[str, Any]:
        """Optimizer over the adapter's trainable parameters and a per-step LR scheduler."""
        params = self.adapter.trainable_parameters()
        if not params:
            raise RuntimeError(f"{type(self).__name__}: the adapter has no trainable parameters")
        optimizer = self.optimizer_factory(params)
        config: dict[str, Any] = {"optimizer": optimizer}
        if self.scheduler_factory is not None:
            config["lr_scheduler"] = {"scheduler": self.scheduler_factory(optimizer), "interval": "step"}
        return config

    # ------------------------------------------------------------------ `solarwm test`
    #: Seed of the test rollouts (batch i uses test_seed + i), so every stage is scored on the same noise;
    #: a datamodule with a ``test_seed`` (``--data.init_args.test_seed``) sets it.
    test_seed: int = 4321

    def rollout_seed(self, datamodule: Any = None) -> int:
        """Test rollouts' seed: ``datamodule``'s (default: trainer's) ``test_seed`` if set, else the class default."""
        if datamodule is None and self._trainer is not None:
            datamodule = getattr(self._trainer, "datamodule", None)
        seed = getattr(datamodule, "test_seed", None)
        return self.test_seed if seed is None else int(seed)

    def on_test_epoch_start(self) -> None:
        """Fresh metrics: generated vs ground truth, the static baseline, the wrong-camera control, camera following."""
        from solarwm.metrics import SCORED_PAIR_STEP, CameraFollowing, VideoPSNR, VideoSSIM

        # Camera pairs start at every frame (SCORED_PAIR_STEP): 3.3x the pairs of stride-spaced ones on 17 frames, half
        # the estimator's noise in the translation figures (CameraFollowing's docstring).
        self.test_metrics = torch.nn.ModuleDict(
            {
                "psnr": VideoPSNR(),
                "ssim": VideoSSIM(),
                "psnr_static": VideoPSNR(),
                "psnr_wrong_camera": VideoPSNR(),
                "camera": CameraFollowing(pair_step=SCORED_PAIR_STEP),
                "camera_gt": CameraFollowing(pair_step=SCORED_PAIR_STEP),
            }
        ).to(self.device)
        self._other_cameras: torch.Tensor | None = None
        # Per test video, in the test loader's order (clip i of N at draw i // N): what intervals are computed
        # from (examples/stage_metrics.py). Kept after the epoch as ``test_records``.
        self.test_records: list[dict[str, float]] = []
        # Per multi-view world (the datamodule's second test loader): ``camera_top1_step``'s records.
        self.multiview_records: list[dict[str, Any]] = []

    def test_step(self, batch: dict[str, Any], batch_idx: int, dataloader_idx: int = 0) -> None:
        """Generate each held-out clip from its first frame and cameras; score it against the trivial baselines.

        ``psnr_static``: the first frame repeated. ``psnr_wrong_camera``: the same model and first frame driven
        by another clip's trajectory (the next clip in the batch, or the previous batch's first clip).
        Batches of the second test loader (one multi-view world each) go to ``camera_top1_step``.
        """
        if dataloader_idx == 1:
            self.camera_top1_step(batch, batch_idx)
            return
        video, c2w, K, caption = batch["video"], batch["c2w"], batch["K"], list(batch["caption"])
        first = video[:, :, 0]

        def rollout(cameras: torch.Tensor) -> torch.Tensor:
            generator = torch.Generator(device=self.device).manual_seed(self.rollout_seed() + batch_idx)
            return self.generate(first, caption, cameras, K, generator=generator).float()

        from solarwm.metrics.video import per_video_psnr

        metrics = self.test_metrics
        generated = rollout(c2w)
        static = first[:, :, None].expand_as(video)
        metrics["psnr"].update(generated, video)
        metrics["ssim"].update(generated, video)
        metrics["psnr_static"].update(static, video)
        records = [
            {"psnr": float(p), "psnr_static": float(q)}
            for p, q in zip(per_video_psnr(generated, video), per_video_psnr(static, video))
        ]
        # One video at a time, so each record gets its own pairs' errors (the pooled metric is the same).
        for b, record in enumerate(records):
            for key, clip in (("camera", generated[b : b + 1]), ("camera_gt", video[b : b + 1])):
                metrics[key].update(clip, c2w[b : b + 1], K[b : b + 1])
                suffix = "" if key == "camera" else "_gt"
                record[f"cam_rot_err_deg{suffix}"] = metrics[key].rot_err[-1].tolist()
                record[f"cam_trans_dir_err_deg{suffix}"] = metrics[key].trans_err[-1].tolist()
        if video.shape[0] > 1:
            other = c2w.roll(1, dims=0)
        elif self._other_cameras is not None and self._other_cameras.shape == c2w.shape:
            other = self._other_cameras
        else:
            other = None
        self._other_cameras = c2w[:1].clone()
        if other is not None:
            wrong = rollout(other)
            metrics["psnr_wrong_camera"].update(wrong, video)
            for record, p in zip(records, per_video_psnr(wrong, video)):
                record["psnr_wrong_camera"] = float(p)
        self.test_records.extend(records)

    #: Offset of the multi-view worlds' rollout seeds from the test clips' (their noise never coincides).
    multiview_seed_offset: int = 100_000

    def camera_top1_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        """One world's views (one batch, a shared first frame): each generated under its own camera, then ranked.

        Records, per view, whether its generation is closer (PSNR on the generated frames) to its own camera's truth
        than to every other view's, and the margin in dB over the closest other view.
        """
        from solarwm.metrics.video import per_video_psnr

        video, c2w, K, caption = batch["video"], batch["c2w"], batch["K"], list(batch["caption"])
        views = video.shape[0]
        first = video[:1, :, 0].expand(views, -1, -1, -1)  # the views share it; one frame for all keeps them identical
        seed = self.rollout_seed() + self.multiview_seed_offset + batch_idx
        generator = torch.Generator(device=self.device).manual_seed(seed)
        generated = self.generate(first, caption, c2w, K, generator=generator).float()
        for v in range(views):
            scores = per_video_psnr(generated[v : v + 1].expand_as(video), video)
            others = torch.cat([scores[:v], scores[v + 1 :]])
            self.multiview_records.append(
                {
                    "world": batch_idx,
                    "view": v,
                    "views": views,
                    "top1": bool(scores[v] > others.max()),
                    "margin_db": float(scores[v] - others.max()),
                }
            )

    def on_test_epoch_end(self) -> None:
        """Log ``test/psnr``, ``test/psnr_static``, ``test/psnr_wrong_camera``, ``test/ssim`` and camera following."""
        metrics = self.test_metrics
        for name in ("psnr", "ssim", "psnr_static", "psnr_wrong_camera"):
            if metrics[name].update_called:
                self.log(f"test/{name}", metrics[name].compute())
        for key, suffix in (("camera", ""), ("camera_gt", "_gt")):
            result = metrics[key].compute()
            self.log(f"test/cam_rot_err_deg{suffix}", result["rot_err_deg"].float())
            self.log(f"test/cam_rot_err_deg_median{suffix}", result["rot_err_deg_median"].float())  # heavy-tailed
            self.log(f"test/cam_trans_dir_err_deg{suffix}", result["trans_dir_err_deg"].float())
            for count in ("pairs", "failed_pairs", "no_parallax_pairs"):
                self.log(f"test/cam_{count}{suffix}", result[count].float())
        if self.multiview_records:
            records = self.multiview_records
            self.log("test/camera_top1", float(sum(r["top1"] for r in records)) / len(records))
            self.log("test/camera_top1_chance", 1.0 / records[0]["views"])
            self.log(
                "test/camera_top1_margin_db_median", float(torch.tensor([r["margin_db"] for r in records]).median())
            )
        del self.test_metrics

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Tag the checkpoint with this stage and route (read by ``init_from`` and ``solarwm predict``)."""
        checkpoint["solarwm"] = {
            "stage": self.stage_name,
            "route": self.adapter.route,
            "config": self.adapter.config_dict(),
        }
