"""Tiny route models and a real call on a clip whose latent frame count does not divide by 2."""

from __future__ import annotations

import torch

from solarwm.backbones.base import route_class

#: Route -> (pixel frames, height, width, batch): odd latent frame counts (Wan: 5 latents, H3: 7).
CLIPS = {
    "wan22_ti2v_5b": (4 * 4 + 1, 32, 32, 1),
    "wan22_i2v_14b": (4 * 4 + 1, 32, 32, 1),
    "ltx25": (8 * 4 + 1, 32, 32, 1),
    "minimax_h3": (17 + 5, 16, 16, 2),
}


def tiny_route(route: str) -> torch.nn.Module:
    """The route's tiny preset, seeded (the same weights in every process)."""
    torch.manual_seed(0)
    return route_class(route)(preset="tiny")


def clip_batch(adapter: torch.nn.Module, seed: int = 0) -> dict:
    """A seeded batch of the route's test clip: video, cameras, captions."""
    frames, height, width, batch = CLIPS[adapter.route]
    g = torch.Generator().manual_seed(seed)
    c2w = torch.eye(4).repeat(batch, frames, 1, 1)
    c2w[..., :3, 3] = torch.linspace(0, 1, frames)[None, :, None] * torch.randn(batch, 1, 3, generator=g)
    K = torch.tensor([20.0, 20.0, width / 2, height / 2]).repeat(batch, frames, 1)
    video = torch.rand(batch, 3, frames, height, width, generator=g) * 2 - 1
    return {
        "video": video,
        "c2w": c2w,
        "K": K,
        "caption": ["a walk"] * batch,
        "sample_id": [str(i) for i in range(batch)],
    }


def _clean_and_noise(adapter: torch.nn.Module, seed: int) -> tuple[torch.Tensor, dict, torch.Tensor, torch.Generator]:
    """The clip's latents ``x0``, its conditions, seeded noise like ``x0`` and the generator that drew it."""
    batch = clip_batch(adapter)
    dtype = next(adapter.transformer.parameters()).dtype
    x0 = adapter.encode(batch["video"].to(dtype))
    g = torch.Generator().manual_seed(seed)
    return x0, adapter.prepare_conditions(batch), torch.randn(x0.shape, generator=g, dtype=x0.dtype), g


def teacher_forcing_call(adapter: torch.nn.Module) -> torch.Tensor:
    """One teacher-forcing forward (the ``[clean | noisy]`` layout under its block-causal mask)."""
    x0, cond, noise, g = _clean_and_noise(adapter, seed=1)
    sigma = torch.rand(x0.shape[0], generator=g, dtype=torch.float64).to(x0.dtype)
    x_t, sigma_pf = adapter.noisy_input(x0, noise, sigma)
    return adapter.forward_teacher_forcing(x0, x_t, sigma_pf, cond)


def plain_call(adapter: torch.nn.Module) -> torch.Tensor:
    """One uncached forward on the clip's odd number of latent frames, a different noise level per frame (so a
    route that groups frames by timestep, as LTX's cross-attention does, makes several groups)."""
    x0, cond, noise, g = _clean_and_noise(adapter, seed=2)
    sigma = torch.rand(x0.shape[0], x0.shape[2], generator=g, dtype=torch.float64).to(x0.dtype)
    x_t = x0 + (noise - x0) * sigma[:, None, :, None, None]
    return adapter(x_t, sigma, cond)
