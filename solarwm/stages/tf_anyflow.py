"""Stage 2, teacher-forced AnyFlow autoregressive initialisation (paper §4.2, eq. 2; AnyFlow v1.5).

The stage-1 model becomes a block-causal flow map. Every step runs the adapter's teacher-forcing layout
``[clean | noisy]`` (noisy block i sees clean blocks ``[i-5, i)`` and itself), with one ``(t, r)`` pair
per sample (50% ``r = t``, 25% ``r = 0``, 25% ``0 < r < t``, the route's shift on both), the r-embedding
(a copy of the pretrained time embedding, gate 0.25) and the bounded finite-difference target of
``solarwm.objectives.flow_map``. Non-diffusion losses are rescaled to the diffusion losses, then weighted by
the Gaussian timestep weight. Cost: 4 forwards per step (5 with the CFG-fused target), 3 fewer when every
pair has r = t (no finite difference to take).

Validation reports the plain teacher-forced flow loss at ``r = t`` with fixed noise, and ``generate``
is the few-step causal rollout (``solarwm.rollout``) that the eval video callback logs.
"""

from __future__ import annotations

from typing import Any

import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable

from solarwm.backbones.base import BackboneAdapter
from solarwm.objectives.flow_map import (
    adaptive_rescale,
    finite_difference_window,
    flow_map_prediction,
    gaussian_timestep_weight,
    pair_kinds,
    sample_time_pairs,
)
from solarwm.objectives.rng import RandomSource, rand, randn
from solarwm.stages.base import StageModule, WarmupConstantLR, default_optimizer
from solarwm.stages.causal import CausalGenerateMixin, load_init, per_frame, set_sink


class TFAnyFlowModule(CausalGenerateMixin, StageModule):
    """LightningModule of eq. (2) around any ``BackboneAdapter`` with a causal mode.

    Args:
        adapter: the route's adapter (in YAML: ``class_path`` + ``init_args``).
        init_from: stage-1 Lightning checkpoint or adapter export to start from (EMA weights when present);
            ``null`` starts from the adapter as built (a fresh model: write it only on purpose).
        init_from_command: the command that makes ``init_from`` (named in the error when it is missing).
        flow_map_gate: gate of the r-embedding (AnyFlow: 0.25).
        guidance_scale: CFG-fused target ``g·v + (1-g)·u_uncond`` (1.0 = plain ``v``, the official Wan uses 3).
        negative_prompt: the unconditional prompt of the fused target.
        diffusion_ratio, consistency_ratio: shares of ``r = t`` and ``r = 0`` pairs.
        fd_eps: half-width of the finite-difference window in sigma (official: 5 of 1000 steps).
        timestep_weighting: multiply by the Gaussian timestep weight.
        rescale: adaptive rescaling of non-diffusion samples.
        sample_steps: steps per block of ``generate`` (the flow-map few-step sampler).
        context_noise: largest noise level on the clean history copy (GameNGen's context noise): each
            sample's history is noised to its own sigma, uniform in ``[0, context_noise]`` (not shifted),
            and the model is told it; the TI2V anchor stays clean. 0 = off (the exact history).
        sink_frames: the clip's first latent frames every block also attends to (the attention sink; at most one
            block, Wan routes; 0 = none). Saved in the export, which the next stage must match.
    """

    stage_name = "tf_anyflow"

    def __init__(
        self,
        adapter: BackboneAdapter,
        init_from: str | None = None,
        init_from_command: str | None = None,
        use_ema_init: bool = True,
        flow_map_gate: float = 0.25,
        guidance_scale: float = 1.0,
        negative_prompt: str = "",
        diffusion_ratio: float = 0.5,
        consistency_ratio: float = 0.25,
        fd_eps: float = 0.005,
        timestep_weighting: bool = True,
        rescale: bool = True,
        optimizer: OptimizerCallable = default_optimizer,
        lr_scheduler: LRSchedulerCallable | None = WarmupConstantLR,
        val_seed: int = 1234,
        sample_steps: int = 4,
        context_noise: float = 0.0,
        sink_frames: int = 0,
    ) -> None:
        super().__init__(adapter, optimizer, lr_scheduler)
        self.save_hyperparameters(ignore=["adapter", "optimizer", "lr_scheduler"])
        if guidance_scale <= 0:
            raise ValueError(f"TFAnyFlowModule: guidance_scale must be > 0, got {guidance_scale}")
        if not 0.0 <= context_noise <= 1.0:
            raise ValueError(f"TFAnyFlowModule: context_noise must be in [0, 1], got {context_noise}")
        if init_from is not None:
            load_init(
                adapter, init_from, ("bidirectional",), init_from_command, use_ema_init, ignore=("delta_embedding",)
            )
        adapter.enable_flow_map(flow_map_gate)
        set_sink(adapter, sink_frames, None)  # from a bidirectional init: nothing to match
        self.guidance_scale, self.negative_prompt = guidance_scale, negative_prompt
        self.diffusion_ratio, self.consistency_ratio = diffusion_ratio, consistency_ratio
        self.fd_eps, self.timestep_weighting, self.rescale = fd_eps, timestep_weighting, rescale
        self.val_seed, self.sample_steps = val_seed, sample_steps
        self.context_noise = context_noise
        self.solver = "flowmap"

    # ------------------------------------------------------------------ objective
    @property
    def has_flow_map_pairs(self) -> bool:
        """Whether any pair has r < t (else the 3 no-grad forwards of the finite difference are skipped).

        A recipe constant, not a property of one batch, so every rank of a sharded run makes the same forwards.
        """
        return self.diffusion_ratio < 1.0

    def anyflow_loss(
        self, batch: dict[str, Any], generator: RandomSource = None
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Eq. (2) on one batch. Returns ``(loss, stats)``.

        Pair kinds follow the samples' ``sample_index``; times and noise come from ``generator``, by default
        each sample's own stream (``sample_rng``), so a sample draws the same on any number of ranks.
        """
        adapter = self.adapter
        x0 = self.latents(batch)
        cond = adapter.prepare_conditions(batch)
        b, f = x0.shape[0], x0.shape[2]
        rng = self.sample_rng(batch) if generator is None else generator
        kinds = pair_kinds(self.sample_index(batch), self.diffusion_ratio, self.consistency_ratio)
        sigma_t, sigma_r = (s.to(x0.device) for s in sample_time_pairs(kinds, adapter.shift, rng))
        kinds = kinds.to(x0.device)
        noise = randn(x0.shape, rng, x0.device)
        x_t, t_pf = adapter.noisy_input(x0, noise, sigma_t)
        r_pf = per_frame(adapter, sigma_r, f)
        target = adapter.target(x0, noise)
        history, sigma_h = self.noised_history(x0, rng)

        def tf(z: torch.Tensor, s_pf: torch.Tensor, r: torch.Tensor, c: dict[str, Any] = cond) -> torch.Tensor:
            return adapter.forward_teacher_forcing(history, z, s_pf, c, r_per_frame=r, sigma_clean=sigma_h)

        g = self.guidance_scale
        if g != 1.0:
            with torch.no_grad():
                negative = dict(cond, text_embeds=adapter.text_features({"caption": [self.negative_prompt] * b})[0])
                target = g * target + (1.0 - g) * tf(x_t, t_pf, t_pf, negative)
        u = tf(x_t, t_pf, r_pf)
        if self.has_flow_map_pairs:
            with torch.no_grad():
                v_hat = tf(x_t, t_pf, t_pf)  # the model's own diagonal velocity
                s_plus, s_minus = finite_difference_window(sigma_t, sigma_r, self.fd_eps)
                u_pm = []
                for s_new in (s_plus, s_minus):
                    s_pf = per_frame(adapter, s_new, f)
                    z = x_t + v_hat * (s_pf - t_pf)[:, None, :, None, None]  # anchor frames stay put (both sigmas 0)
                    u_pm.append(tf(z, s_pf, r_pf))
            prediction = flow_map_prediction(u, u_pm[0], u_pm[1], sigma_t, sigma_r, s_plus, s_minus)
        else:
            prediction = u  # every pair has r = t, where the finite-difference term is (t - r)·slope = 0
        mask = adapter.loss_mask(x0).expand_as(prediction)
        per_sample = (((prediction - target) / g) ** 2 * mask).flatten(1).sum(1) / mask.flatten(1).sum(1).clamp_min(1.0)
        raw = per_sample.detach()
        diffusion_mean = self._global_diffusion_mean(raw, kinds)
        if self.rescale:
            per_sample = adaptive_rescale(per_sample, kinds, diffusion_mean)
        if self.timestep_weighting:
            per_sample = per_sample * gaussian_timestep_weight(sigma_t, adapter.shift)
        flow_loss = diffusion_mean if torch.isfinite(diffusion_mean) else raw.mean()
        stats = {"flow_loss": flow_loss, "sigma_mean": sigma_t.mean()}
        return per_sample.mean(), stats

    def noised_history(self, x0: torch.Tensor, rng: RandomSource) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The teacher-forcing history copy ``[B, C, f, h, w]`` and its per-frame sigmas (None: exact, sigma 0).

        With ``context_noise`` the draws come after every other draw of the step, from the same per-sample
        streams, so a run without it draws exactly as before.
        """
        if self.context_noise == 0.0:
            return x0, None
        sigma = rand((x0.shape[0],), rng, "cpu", dtype=torch.float64).float() * self.context_noise
        return self.adapter.noisy_input(x0, randn(x0.shape, rng, x0.device), sigma.to(x0.device))

    def _global_diffusion_mean(self, losses: torch.Tensor, kinds: torch.Tensor) -> torch.Tensor:
        """Mean of the diffusion samples' losses over the global batch (summed over ranks; NaN when there are none).

        The rescale reference is a statistic of the whole batch: a per-rank mean would make the loss
        depend on how the batch is split over ranks.
        """
        diffusion = (kinds == 0).to(losses.dtype)
        totals = torch.stack([(losses.detach() * diffusion).sum(), diffusion.sum()])
        if self._trainer is not None:
            totals = self.trainer.strategy.reduce(totals, reduce_op="sum")
        return totals[0] / totals[1] if totals[1] > 0 else torch.tensor(float("nan"), device=losses.device)

    def teacher_forced_flow_loss(self, batch: dict[str, Any], generator: torch.Generator) -> torch.Tensor:
        """Plain teacher-forced flow matching (r = t) with seeded noise: the comparable validation loss."""
        adapter = self.adapter
        x0 = self.latents(batch)
        cond = adapter.prepare_conditions(batch)
        sigma = adapter.sample_sigmas(x0.shape[0], generator=generator).to(x0.device)
        noise = torch.randn(x0.shape, generator=generator, device=generator.device).to(x0.device)
        x_t, t_pf = adapter.noisy_input(x0, noise, sigma)
        prediction = adapter.forward_teacher_forcing(x0, x_t, t_pf, cond, r_per_frame=t_pf)
        return adapter.loss(prediction, adapter.target(x0, noise), adapter.loss_mask(x0))

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        """One step of eq. (2); kinds of (t, r) pairs follow the samples' ``sample_index``."""
        size = self.batch_size_of(batch) or 1
        loss, stats = self.anyflow_loss(batch)
        self.check_finite(loss, batch, batch_idx)
        # sync_dist: the logged values are the global batch's (the mean over ranks), not rank 0's share.
        self.log("train/loss", loss, prog_bar=True, batch_size=size, sync_dist=True)
        self.log("train/flow_loss", stats["flow_loss"], batch_size=size, sync_dist=True)
        self.log("train/sigma_mean", stats["sigma_mean"], batch_size=size, sync_dist=True)
        return loss

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        """Teacher-forced flow loss at r = t, seeded by ``val_seed + batch_idx``."""
        generator = torch.Generator(device="cpu").manual_seed(self.val_seed + batch_idx)
        loss = self.teacher_forced_flow_loss(batch, generator)
        self.log("val/loss", loss, prog_bar=True, sync_dist=True, batch_size=self.batch_size_of(batch))
        return loss
