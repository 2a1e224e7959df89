"""Pieces the causal stages (TF-AnyFlow, DMD) share: initialisation by path, per-frame sigmas, rollout sampling."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from solarwm.backbones.base import BackboneAdapter
from solarwm.backbones.export import read_adapter_json
from solarwm.rollout.engine import Rollout
from solarwm.stages.checkpoints import StageCheckpointError, load_adapter_weights


def per_frame(adapter: BackboneAdapter, sigma: torch.Tensor, num_frames: int) -> torch.Tensor:
    """Per-sample sigmas ``[B]`` -> ``[B, f]``, the route's clean anchor frames at 0."""
    out = sigma.float().view(-1, 1).expand(-1, num_frames).clone()
    out[:, : adapter.clean_latent_frames] = 0.0
    return out


def load_init(
    adapter: BackboneAdapter,
    path: str,
    expect_stage: tuple[str, ...],
    command: str | None = None,
    use_ema: bool = True,
    ignore: tuple[str, ...] = (),
) -> dict[str, Any]:
    """Initialise ``adapter`` from the previous stage's checkpoint or export; a missing one names its command."""
    if not Path(path).exists():
        hint = f"; make it with `{command}`" if command else ""
        raise StageCheckpointError(f"init_from {path} not found{hint}")
    return load_adapter_weights(adapter, path, expect_stage=expect_stage, use_ema=use_ema, ignore=ignore)


def set_sink(adapter: BackboneAdapter, sink_frames: int, init_from: str | None) -> None:
    """Give the causal ``adapter`` its attention sink; an ``init_from`` export trained with another sink is refused."""
    if init_from is not None and Path(init_from).is_dir():  # an export (a Lightning checkpoint carries no sink)
        trained = read_adapter_json(init_from).get("sink_frames") or 0
        if trained != sink_frames:
            raise StageCheckpointError(
                f"init_from {init_from} was trained with sink_frames {trained}, this stage has {sink_frames}: "
                f"set model.init_args.sink_frames {trained}"
            )
    adapter.set_sink(sink_frames)


class CausalGenerateMixin:
    """``generate`` for causal stages: a few-step block-causal rollout (same signature as stage 1's)."""

    causal = True
    adapter: BackboneAdapter
    solver: str
    sample_steps: int

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
        """``first_frame [B, 3, H, W]`` in [-1, 1] + ``c2w [B, F, 4, 4]``, ``K [B, F, 4]`` -> ``[B, 3, F, H, W]``."""
        device = first_frame.device
        rollout = Rollout(self.adapter, num_steps or self.sample_steps, self.solver)
        cond = rollout.conditions(first_frame, c2w.to(device), K.to(device), list(caption), text_embeds, text_mask)
        return torch.cat(list(rollout.video_blocks(cond, generator)), dim=2)
