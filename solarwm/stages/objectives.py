"""Shared flow-matching helpers used by every stage and by the backbone adapters.

Conventions (rectified flow, as in Wan / SD3 / diffusers' FlowMatchEulerDiscreteScheduler):

* ``sigma`` in [0, 1] is the noise level: ``x_sigma = (1 - sigma) * x0 + sigma * eps``.
* The model's flow target is the velocity ``d x_sigma / d sigma = eps - x0`` ("noise minus data").
  Sampling therefore integrates from sigma=1 (noise) to sigma=0 (data) with
  ``x_{sigma_next} = x_sigma + (sigma_next - sigma) * v`` (``sigma_next < sigma``).
* The timestep shift ``s`` maps a uniform ``u`` to ``sigma = s*u / (1 + (s-1)*u)``; ``s > 1`` spends
  more of training (and sampling) at high noise, which high-resolution video needs.

This module holds pure tensor functions only (no Lightning, no route imports) so that both
``solarwm.backbones`` and ``solarwm.stages`` can import it without cycles.
"""

from __future__ import annotations

import math
from typing import Literal, Sequence, Union

import torch

TimestepSampling = Literal["uniform", "logit_normal"]
LossWeighting = Literal["none", "cosmap", "x0"]


_MASK63 = (1 << 63) - 1


class SampleRNG:
    """Per-sample random streams: row ``i`` of every draw comes from its own generator, seeded by ``keys[i]``.

    Under data parallelism each rank holds a slice of the global batch. Seeding each sample by its logical
    index in the training stream (the batch's ``sample_index``) instead of drawing from a per-rank RNG makes
    every sample's noise and timesteps the same on 1 process as on N, whatever the split. ``salt`` separates
    independent uses (the run seed, a DMD role) of the same samples.
    """

    def __init__(self, keys: Sequence[int] | torch.Tensor, salt: int = 0, device: torch.device | str | None = None) -> None:
        self.device = torch.device(device if device is not None else "cpu")
        keys = keys.tolist() if isinstance(keys, torch.Tensor) else list(keys)
        # splitmix64-style mixing: nearby keys and salts give unrelated seeds.
        self.generators = [
            torch.Generator(device=self.device).manual_seed(
                ((int(k) * 0x9E3779B97F4A7C15) ^ (int(salt) * 0xBF58476D1CE4E5B9 + 0x94D049BB133111EB)) & _MASK63
            )
            for k in keys
        ]

    def __len__(self) -> int:
        return len(self.generators)

    def _rows(self, shape: Sequence[int], draw) -> torch.Tensor:
        shape = tuple(int(n) for n in shape)
        if not shape or shape[0] != len(self.generators):
            raise ValueError(f"SampleRNG: draw shape {shape} must start with the batch size {len(self.generators)}")
        return torch.stack([draw(shape[1:], g) for g in self.generators])

    def randn(self, shape: Sequence[int], dtype: torch.dtype | None = None) -> torch.Tensor:
        """Standard normal ``[B, ...]``, row i from stream i."""
        return self._rows(shape, lambda s, g: torch.randn(s, generator=g, device=self.device, dtype=dtype))

    def rand(self, shape: Sequence[int], dtype: torch.dtype | None = None) -> torch.Tensor:
        """Uniform [0, 1) ``[B, ...]``, row i from stream i."""
        return self._rows(shape, lambda s, g: torch.rand(s, generator=g, device=self.device, dtype=dtype))

    def randint(self, high: int, shape: Sequence[int]) -> torch.Tensor:
        """Integers in [0, high) ``[B, ...]``, row i from stream i."""
        return self._rows(shape, lambda s, g: torch.randint(0, high, s, generator=g, device=self.device))


#: What the sampling helpers draw from: one generator for the batch, per-sample streams, or the global RNG.
RandomSource = Union[torch.Generator, SampleRNG, None]


def _draw(kind: str, shape: Sequence[int], generator: RandomSource, device, **kwargs) -> torch.Tensor:
    if isinstance(generator, SampleRNG):
        out = generator.randint(kwargs["high"], shape) if kind == "randint" else getattr(generator, kind)(shape, **kwargs)
    else:
        gen_device = generator.device if generator is not None else device
        if kind == "randint":
            out = torch.randint(0, kwargs["high"], tuple(shape), generator=generator, device=gen_device)
        else:
            out = getattr(torch, kind)(tuple(shape), generator=generator, device=gen_device, **kwargs)
    return out.to(device) if device is not None else out


def randn(shape: Sequence[int], generator: RandomSource = None, device=None, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``torch.randn(shape)`` from ``generator`` (a ``SampleRNG``: row i from sample i's stream), on ``device``."""
    return _draw("randn", shape, generator, device, dtype=dtype)


def rand(shape: Sequence[int], generator: RandomSource = None, device=None, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``torch.rand(shape)`` from ``generator`` (a ``SampleRNG``: row i from sample i's stream), on ``device``."""
    return _draw("rand", shape, generator, device, dtype=dtype)


def randint(high: int, shape: Sequence[int], generator: RandomSource = None, device=None) -> torch.Tensor:
    """``torch.randint(0, high, shape)`` from ``generator`` (a ``SampleRNG``: row i from sample i's stream)."""
    return _draw("randint", shape, generator, device, high=high)


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
