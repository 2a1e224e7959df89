"""Flow-matching math shared by every stage and by the backbone adapters.

Conventions (rectified flow, as in Wan / SD3 / diffusers' FlowMatchEulerDiscreteScheduler):

* ``sigma`` in [0, 1] is the noise level: ``x_sigma = (1 - sigma) * x0 + sigma * eps``.
* The model's flow target is the velocity ``d x_sigma / d sigma = eps - x0`` ("noise minus data").
  Sampling therefore integrates from sigma=1 (noise) to sigma=0 (data) with
  ``x_{sigma_next} = x_sigma + (sigma_next - sigma) * v`` (``sigma_next < sigma``).
* The timestep shift ``s`` maps a uniform ``u`` to ``sigma = s*u / (1 + (s-1)*u)``; ``s > 1`` spends
  more of training (and sampling) at high noise, which high-resolution video needs.

Pure tensor functions only (no Lightning, no route imports): ``solarwm.objectives`` sits below both
``solarwm.backbones`` and ``solarwm.stages``.
"""

from __future__ import annotations

import math
from typing import Literal

import torch

from solarwm.objectives.rng import RandomSource, rand, randn

TimestepSampling = Literal["uniform", "logit_normal"]
LossWeighting = Literal["none", "cosmap", "x0"]


def shift_sigmas(u: torch.Tensor, shift: float) -> torch.Tensor:
    """Apply the flow timestep shift: ``sigma = s*u / (1 + (s-1)*u)`` (identity when ``shift == 1``)."""
    if shift <= 0:
        raise ValueError(f"flow shift must be > 0, got {shift}")
    return shift * u / (1.0 + (shift - 1.0) * u)


def sample_uniform_u(
    batch_size: int,
    method: TimestepSampling = "uniform",
    logit_mean: float = 0.0,
    logit_std: float = 1.0,
    generator: RandomSource = None,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Draw ``u`` in (0, 1) of shape ``[B]``: ``uniform`` or ``logit_normal`` (sigmoid of N(mean, std), SD3 §3.1)."""
    if method == "uniform":
        return rand((batch_size,), generator, device)
    if method == "logit_normal":
        return torch.sigmoid(logit_mean + logit_std * randn((batch_size,), generator, device))
    raise ValueError(f"unknown timestep sampling {method!r}; expected 'uniform' or 'logit_normal'")


def flow_interpolate(x0: torch.Tensor, noise: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
    """``x_sigma = (1 - sigma) * x0 + sigma * noise``; ``sigma`` broadcasts against ``x0``."""
    return (1.0 - sigma) * x0 + sigma * noise


def flow_velocity(x0: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """The flow target ``u_t = d x_sigma / d sigma = noise - x0`` (sign: points from data to noise)."""
    return noise - x0


def loss_weights(sigma: torch.Tensor, weighting: LossWeighting = "none") -> torch.Tensor:
    """Per-sample loss weight ``[B]``: ``none`` = 1; ``cosmap`` = 2 / (pi * (1 - 2s + 2s^2)) (SD3 eq. 20);
    ``x0`` = s^2, which turns the velocity error (x0 - x̂0)/s of an x0-predicting model into the x0 error, so
    low noise levels (where copying the input is nearly right) do not dominate training."""
    if weighting == "none":
        return torch.ones_like(sigma)
    if weighting == "cosmap":
        return 2.0 / (math.pi * (1.0 - 2.0 * sigma + 2.0 * sigma**2))
    if weighting == "x0":
        return sigma**2
    raise ValueError(f"unknown loss weighting {weighting!r}; expected 'none', 'cosmap' or 'x0'")


def masked_mse(
    prediction: torch.Tensor,
    target: torch.Tensor,
    mask: torch.Tensor,
    weight: torch.Tensor | None = None,
) -> torch.Tensor:
    """Mean squared error over the elements where ``mask`` is 1.

    ``prediction``/``target`` are ``[B, C, f, h, w]``; ``mask`` broadcasts to them (e.g. ``[B, 1, f, 1, 1]``);
    ``weight`` is an optional per-sample ``[B]`` factor. The mean is taken over the supervised
    elements only, so a masked-out anchor latent does not dilute the loss.
    """
    if prediction.shape != target.shape:
        raise ValueError(f"prediction {tuple(prediction.shape)} and target {tuple(target.shape)} differ")
    mask = mask.to(prediction.dtype).expand_as(prediction)
    sq = (prediction.float() - target.float()) ** 2 * mask
    if weight is not None:
        sq = sq * weight.float().view(-1, *([1] * (sq.ndim - 1)))
    denom = mask.float().sum().clamp_min(1.0)
    return sq.sum() / denom
