"""Block-causal rollout (paper §4.3): any horizon, block after block, on a sliding-window KV cache.

Each block of ``adapter.frames_per_block`` latent frames is denoised in a few steps on the shifted
grid ``sigma_k = shift(1 - k/N)`` (Wan2.2-5B, N = 4, shift 5: 1, .9375, .8333, .625), attending to
its window of cached history. Two solvers:

* ``renoise`` (the DMD student's rule): ``x0 = x - sigma_k·v``, then fresh Gaussian noise to
  ``sigma_{k+1}``; the x0 of the last step is the block.
* ``flowmap`` (the AnyFlow stage-2 model): ``x <- x - (sigma_k - sigma_{k+1})·u(x, sigma_k, r=sigma_{k+1})``,
  deterministic; needs the adapter's flow map (``enable_flow_map``).

The finished x0 is then committed to the cache by one more forward at sigma 0, so the next block
reads clean history (or re-noised to ``adapter.commit_sigma`` and told so: for a model trained with
context noise). ``exit_step`` stops a block early and commits that step's x0 (DMD's rollout-and-replay
draws one exit step for all blocks). The TI2V anchor (the encoded first frame)
stays clean at sigma 0 in the first block.
Per-latent-frame conditions (the cameras; the I2V route's image condition ``y``) are sliced per
block by ``block_conditions`` (a training clip), or come block by block from an open-ended
``RolloutSession`` (``solarwm.rollout.session``: ``solarwm predict``'s ``write_rollout``, ``solarwm play``,
the Gym env), which needs nothing about the future; both drive the same ``Rollout.block``.

Blocks are decoded as they come (``video_blocks``) with the route's streaming decoder, so memory is
flat in the horizon; the RoPE table is never exceeded because the cache reads at window-local
positions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Literal

import torch

from solarwm.backbones.base import BackboneAdapter
from solarwm.objectives.flow_matching import flow_interpolate, shift_sigmas
from solarwm.objectives.rng import RandomSource, randn

Solver = Literal["renoise", "flowmap"]


def few_step_sigmas(num_steps: int, shift: float, device: torch.device | str | None = None) -> torch.Tensor:
    """The few-step grid ``[num_steps + 1]`` from 1 to 0 with the route's shift (Wan 5B: 1, .9375, .8333, .625, 0)."""
    if num_steps < 1:
        raise ValueError(f"few_step_sigmas: num_steps must be >= 1, got {num_steps}")
    return shift_sigmas(torch.linspace(1.0, 0.0, num_steps + 1, dtype=torch.float64), shift).float().to(device)


def block_conditions(adapter: BackboneAdapter, cond: dict[str, Any], frames: slice) -> dict[str, Any]:
    """``cond`` for one causal block: every per-latent-frame entry (indexed ``[B, f, ...]``; the adapter's
    ``per_frame_conditions``, default the cameras ``c2w`` and ``K``) sliced to ``[:, frames]``, the rest as is."""
    names = getattr(adapter, "per_frame_conditions", ("c2w", "K"))
    return dict(cond, **{name: cond[name][:, frames] for name in names if name in cond})


@dataclass
class BlockResult:
    """One generated block: the committed ``x0 [B, C, n, h, w]``, the input at the exit step and its sigma."""

    x0: torch.Tensor
    noisy: torch.Tensor
    sigma: float
    frames: slice


class Rollout:
    """Generate latents (or video) block by block with ``adapter``'s causal mode.

    Args:
        adapter: a route adapter with causal weights (stage 2 or 3).
        num_steps: denoising steps per block.
        solver: ``renoise`` or ``flowmap`` (see module docstring).
    """

    def __init__(self, adapter: BackboneAdapter, num_steps: int = 4, solver: Solver = "renoise") -> None:
        if solver not in ("renoise", "flowmap"):
            raise ValueError(f"Rollout: solver must be 'renoise' or 'flowmap', got {solver!r}")
        if solver == "flowmap" and adapter.delta_embedding is None:
            raise ValueError("Rollout: solver 'flowmap' needs an adapter with the AnyFlow flow map (a stage-2 model)")
        self.adapter, self.num_steps, self.solver = adapter, num_steps, solver

    def conditions(
        self,
        first_frame: torch.Tensor,
        c2w: torch.Tensor,
        K: torch.Tensor,
        caption: list[str] | None = None,
        text_embeds: torch.Tensor | None = None,
        text_mask: torch.Tensor | None = None,
    ) -> dict[str, Any]:
        """Rollout-wide conditions: the adapter's ``prepare_conditions`` (text features, every latent frame's
        camera, route extras such as the I2V image condition built from ``first_frame``) plus the anchor latent."""
        adapter = self.adapter
        device = first_frame.device
        batch: dict[str, Any] = {
            "caption": caption or [""] * first_frame.shape[0],
            "c2w": c2w.to(device),
            "K": K.to(device),
            "image_size": (first_frame.shape[-1], first_frame.shape[-2]),
            "first_frame": first_frame,
        }
        if text_embeds is not None:
            batch["text_embeds"], batch["text_mask"] = text_embeds, text_mask
        cond = adapter.prepare_conditions(batch)
        cond["anchor"] = adapter.encode(first_frame[:, :, None]).float()  # [B, C, 1, h, w]
        return cond

    def check_exit_step(self, exit_step: int | None) -> int:
        """The exit step to use (default: the last); raises on one out of range or one the solver cannot take."""
        exit_step = self.num_steps - 1 if exit_step is None else exit_step
        if not 0 <= exit_step < self.num_steps:
            raise ValueError(f"Rollout: exit_step must be in [0, {self.num_steps}), got {exit_step}")
        if self.solver == "flowmap" and exit_step != self.num_steps - 1:
            raise ValueError("Rollout: the flowmap solver reaches x0 only at its last step; exit_step needs 'renoise'")
        return exit_step

    @torch.no_grad()
    def block(
        self,
        block_cond: dict[str, Any],
        anchor: torch.Tensor,
        frames: slice,
        cache: Any,
        generator: RandomSource = None,
        exit_step: int | None = None,
        grad: bool = False,
    ) -> BlockResult:
        """Denoise the latent frames ``frames`` (one causal block) on ``cache`` and commit the result.

        ``block_cond``: the block's conditions (its cameras ``[B, n, ...]``, the text features, route extras);
        ``anchor [B, C, a, h, w]``: the clean anchor latents (the first ``clean_latent_frames`` stay them).
        The noise comes from ``generator`` in a fixed order (the block's start noise, then one fresh draw
        per re-noising step), so a rollout is the same however its blocks are driven.
        ``grad``: the exit step's forward carries gradient (the returned x0 does; the cache gets it detached),
        as Self-Forcing trains a student on its own rollout; the values are those of ``grad=False``.
        """
        adapter = self.adapter
        exit_step = self.check_exit_step(exit_step)
        if grad and self.solver != "renoise":
            raise ValueError("Rollout: grad needs the 'renoise' solver (its exit step's x0 is the block)")
        b, c, _, h, w = anchor.shape
        device = anchor.device
        sigmas = few_step_sigmas(self.num_steps, adapter.shift, device)
        n = frames.stop - frames.start
        clean = max(0, min(adapter.clean_latent_frames - frames.start, n))  # anchor frames in this block
        x = randn((b, c, n, h, w), generator, device)  # a SampleRNG gives each sample its own stream
        x[:, :, :clean] = anchor[:, :, :clean]
        for k in range(exit_step + 1):
            sigma_pf = torch.full((b, n), float(sigmas[k]), device=device)
            sigma_pf[:, :clean] = 0.0
            noisy = x
            if self.solver == "flowmap":
                r_pf = torch.full((b, n), float(sigmas[k + 1]), device=device)
                r_pf[:, :clean] = 0.0
                u = adapter(x, sigma_pf, block_cond, kv_cache=cache, r_per_frame=r_pf).float()
                x = x - (sigmas[k] - sigmas[k + 1]) * u  # after the last step (r = 0) this is x0
            else:
                with torch.set_grad_enabled(grad and k == exit_step):
                    v = adapter(x, sigma_pf, block_cond, kv_cache=cache).float()
                    x0 = x - adapter.sampler_sigma(sigmas[k]) * v  # the σ the model was told (bf16-rounded)
                    x0[:, :, :clean] = anchor[:, :, :clean]
                if k < exit_step:
                    fresh = randn(x.shape, generator, device)
                    x = (1.0 - sigmas[k + 1]) * x0 + sigmas[k + 1] * fresh
            if clean:  # out of place: the exit step's input may be saved for a gradient
                x = torch.cat([anchor[:, :, :clean], x[:, :, clean:]], 2)
        if self.solver == "flowmap":
            x0 = x
        sigma_pf = torch.full((b, n), adapter.commit_sigma, device=device)
        sigma_pf[:, :clean] = 0.0  # the anchor (already x0's leading frames) stays exact
        history = x0.detach()
        if adapter.commit_sigma > 0:  # drawn last, so a rollout without it draws as before
            noise = randn(x0.shape, generator, device)
            history = flow_interpolate(history, noise, sigma_pf.to(x0.dtype)[:, None, :, None, None])
        adapter(history, sigma_pf, block_cond, kv_cache=cache, commit=True)
        return BlockResult(x0=x0, noisy=noisy, sigma=float(sigmas[exit_step]), frames=frames)

    @torch.no_grad()
    def latent_blocks(
        self,
        cond: dict[str, Any],
        generator: RandomSource = None,
        exit_step: int | None = None,
        cache: Any = None,
    ) -> Iterator[BlockResult]:
        """Yield every block of the clip described by ``cond`` (from ``conditions``) in order."""
        adapter = self.adapter
        anchor = cond["anchor"]
        exit_step = self.check_exit_step(exit_step)
        cache = adapter.new_cache(*anchor.shape[-2:]) if cache is None else cache
        for frames in adapter.block_slices(cond["c2w"].shape[1]):
            yield self.block(block_conditions(adapter, cond, frames), anchor, frames, cache, generator, exit_step)

    @torch.no_grad()
    def video_blocks(self, cond: dict[str, Any], generator: torch.Generator | None = None) -> Iterator[torch.Tensor]:
        """Yield decoded video ``[B, 3, n_frames, H, W]`` in [-1, 1] block by block (streaming decode)."""
        decode = self.adapter.stream_decoder()
        for block in self.latent_blocks(cond, generator):
            yield decode(block.x0)
