"""Stage 1, bidirectional adaptation (paper §4.1, eq. 1).

    L_bid = E_{z0, t, eps} || f_theta(z_t, t, c) - u_t ||^2

with ``z0`` the clean video latent, ``c`` the text/image/camera conditions, ``u_t`` the backbone's native
flow or velocity target, and full (bidirectional) attention over the training window. The stage speaks
only the ``BackboneAdapter`` contract: the route decides the target, its sign, the noise schedule's
shift and which latent frames are supervised (``loss_mask``).

Only the adapter's trainable parameters (transformer + camera weights) are optimised; the codec/VAE and
text encoder are frozen inside the adapter. EMA is a callback (``solarwm.callbacks.ema``), not part of
this module; ``generate`` samples with whatever weights are currently loaded.
"""

from __future__ import annotations

from typing import Any

import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable

from solarwm.backbones.base import BackboneAdapter
from solarwm.objectives.flow_matching import (
    LossWeighting,
    TimestepSampling,
    loss_weights,
    sample_uniform_u,
    shift_sigmas,
)
from solarwm.objectives.rng import RandomSource, randn
from solarwm.stages.base import NonFiniteLossError, StageModule, WarmupConstantLR, default_optimizer

__all__ = ["BidirectionalModule", "NonFiniteLossError", "WarmupConstantLR", "default_optimizer"]


class BidirectionalModule(StageModule):
    """LightningModule of eq. (1) around any ``BackboneAdapter``.

    Args:
        adapter: the route's adapter (in YAML: ``class_path`` + ``init_args``).
        timestep_sampling: how ``u`` in (0, 1) is drawn before the adapter's shift: ``uniform`` or
            ``logit_normal`` (sigmoid of N(logit_mean, logit_std^2), SD3).
        logit_mean, logit_std: parameters of ``logit_normal``.
        loss_weighting: ``none`` (plain eq. 1), ``cosmap`` (per-sample 2/(pi(1-2s+2s^2)), SD3) or ``x0``
            (per-sample s^2: the x0 error of an x0-predicting route).
        optimizer: LightningCLI optimizer callable (default AdamW lr 1e-4).
        lr_scheduler: LightningCLI scheduler callable, stepped every optimizer step (default warm-up/constant).
        val_seed: seed of the validation noise and sigmas (identical every epoch, so ``val/loss`` is comparable).
        sample_steps: default Euler steps of ``generate``.
        init_from: a stage-1 checkpoint or export to continue from (EMA weights when present); None = the
            adapter as built (pretrained weights come from the adapter's own ``pretrained_path``).
        init_from_command: the command that makes ``init_from`` (named in the error when it is missing).
    """

    stage_name = "bidirectional"

    def __init__(
        self,
        adapter: BackboneAdapter,
        timestep_sampling: TimestepSampling = "logit_normal",
        logit_mean: float = 0.0,
        logit_std: float = 1.0,
        loss_weighting: LossWeighting = "none",
        optimizer: OptimizerCallable = default_optimizer,
        lr_scheduler: LRSchedulerCallable = WarmupConstantLR,
        val_seed: int = 1234,
        sample_steps: int = 20,
        init_from: str | None = None,
        init_from_command: str | None = None,
    ) -> None:
        super().__init__(adapter, optimizer, lr_scheduler)
        if init_from is not None:
            from solarwm.stages.causal import load_init

            load_init(adapter, init_from, ("bidirectional",), init_from_command)
        if timestep_sampling not in ("uniform", "logit_normal"):
            raise ValueError(f"timestep_sampling must be 'uniform' or 'logit_normal', got {timestep_sampling!r}")
        if loss_weighting not in ("none", "cosmap", "x0"):
            raise ValueError(f"loss_weighting must be 'none', 'cosmap' or 'x0', got {loss_weighting!r}")
        self.save_hyperparameters(ignore=["adapter", "optimizer", "lr_scheduler"])
        self.timestep_sampling = timestep_sampling
        self.logit_mean, self.logit_std = logit_mean, logit_std
        self.loss_weighting = loss_weighting
        self.val_seed = val_seed
        self.sample_steps = sample_steps

    # ------------------------------------------------------------------ objective
    def flow_loss(
        self, batch: dict[str, Any], generator: RandomSource = None
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Eq. (1) on one batch. Returns ``(loss, stats)``.

        ``generator`` fixes noise and sigmas (validation); None draws them per sample from ``sample_rng``
        (training: the same draws for a sample on any number of ranks).
        """
        x0 = self.latents(batch)
        cond = self.adapter.prepare_conditions(batch)
        b = x0.shape[0]
        rng = self.sample_rng(batch) if generator is None else generator
        u = sample_uniform_u(
            b, self.timestep_sampling, self.logit_mean, self.logit_std, generator=rng, device=x0.device
        )
        sigma = self.adapter.sample_sigmas(b, u=u)
        noise = randn(x0.shape, rng, x0.device)
        x_t, sigma_per_frame = self.adapter.noisy_input(x0, noise, sigma)
        prediction = self.adapter(x_t, sigma_per_frame, cond)
        target = self.adapter.target(x0, noise)
        mask = self.adapter.loss_mask(x0)
        loss = self.adapter.loss(prediction, target, mask, loss_weights(sigma, self.loss_weighting))
        return loss, {"sigma_mean": sigma.mean().detach()}

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        """One step of eq. (1); a non-finite loss stops training with ``NonFiniteLossError``."""
        loss, stats = self.flow_loss(batch)
        self.check_finite(loss, batch, batch_idx)
        size = self.batch_size_of(batch)
        # sync_dist: the logged value is the global batch's loss (the mean over ranks), not rank 0's share.
        self.log("train/loss", loss, prog_bar=True, batch_size=size, sync_dist=True)
        self.log("train/sigma_mean", stats["sigma_mean"], batch_size=size, sync_dist=True)
        return loss

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        """Eq. (1) with noise/sigmas seeded by ``val_seed + batch_idx`` (comparable across epochs)."""
        generator = torch.Generator(device="cpu").manual_seed(self.val_seed + batch_idx)
        loss, _ = self.flow_loss(batch, generator=generator)
        size = len(batch["sample_id"]) if "sample_id" in batch else None
        self.log("val/loss", loss, prog_bar=True, sync_dist=True, batch_size=size)
        return loss

    # ------------------------------------------------------------------ sampling
    @torch.no_grad()
    def generate(
        self,
        first_frame: torch.Tensor,
        caption: list[str],
        c2w: torch.Tensor,
        K: torch.Tensor,
        num_steps: int | None = None,
        generator: torch.Generator | None = None,
        text_embeds: torch.Tensor | None = None,
        text_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Camera-conditioned image-to-video: ``first_frame [B, 3, H, W]`` in [-1, 1] -> ``video [B, 3, F, H, W]``.

        ``F`` = ``c2w.shape[1]`` (``c2w [B, F, 4, 4]``, ``K [B, F, 4]`` in pixels of ``first_frame``). Euler
        integration of the flow ODE from sigma=1 to 0 on the adapter's shifted schedule; the first latent
        is the encoded first frame and stays fixed (sigma 0), as in training. No classifier-free guidance.
        """
        adapter = self.adapter
        b, _, height, width = first_frame.shape
        num_frames = c2w.shape[1]
        f = adapter.latent_frames(num_frames)
        batch: dict[str, Any] = {
            "caption": list(caption),
            "c2w": c2w,
            "K": K,
            "image_size": (width, height),
            "first_frame": first_frame.to(self.device),
        }  # first_frame: routes with an image condition (I2V's y) build it in prepare_conditions
        if text_embeds is not None:
            batch["text_embeds"], batch["text_mask"] = text_embeds, text_mask
        cond = adapter.prepare_conditions(batch)
        anchor = adapter.encode(first_frame[:, :, None].to(self.device)).float()  # [B, C, 1, h, w]
        shape = (b, anchor.shape[1], f, anchor.shape[3], anchor.shape[4])
        gen_device = generator.device if generator is not None else self.device
        x = torch.randn(shape, generator=generator, device=gen_device).to(self.device)
        # The encoded first frame is exactly the clean anchor latent(s) of a full-clip encoding (causal codec).
        clean = min(adapter.clean_latent_frames, anchor.shape[2])
        x[:, :, :clean] = anchor[:, :, :clean]
        steps = num_steps or self.sample_steps
        sigmas = shift_sigmas(torch.linspace(1.0, 0.0, steps + 1, device=self.device), adapter.shift)
        for i in range(steps):
            sigma_pf = sigmas[i].expand(b, f).clone()
            sigma_pf[:, :clean] = 0.0
            velocity = adapter(x, sigma_pf, cond).float()
            x = x + (sigmas[i + 1] - sigmas[i]) * velocity
            x[:, :, :clean] = anchor[:, :, :clean]
        return adapter.decode(x)
