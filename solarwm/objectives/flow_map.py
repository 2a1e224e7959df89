"""Pure math of the AnyFlow flow-map objective (paper eq. 2; AnyFlow v1.5 as the official release uses it).

The model predicts a flow-map velocity ``u(x_t, t, r)`` with ``x_r = x_t - (t - r)·u``; at ``r = t``
it is the ordinary flow velocity. Noise levels here are sigmas in [0, 1] (the model timestep is
``1000·sigma``). The MeanFlow identity ``u(t, r) = v - (t - r)·du/dt`` is enforced with a bounded
finite difference along the model's own diagonal velocity (no JVP):

    prediction = u(z_t, t, r) + (t - r)·(u(z+, t+, r) - u(z-, t-, r)) / (t+ - t-)
    z± = z_t ± v̂·|t± - t|,  v̂ = u(z_t, t, t),  t+ = min(t + eps, 1),  t- = max(t - eps, r)

regressed on the flow target ``v = noise - x0`` (or the CFG-fused ``g·v + (1-g)·u_uncond``).
"""

from __future__ import annotations

import math

import torch

from solarwm.objectives.flow_matching import shift_sigmas
from solarwm.objectives.rng import RandomSource, rand

#: Fractional part of the golden ratio: a low-discrepancy sequence over logical sample indices.
_GOLDEN = (math.sqrt(5.0) - 1.0) / 2.0


def pair_kinds(
    index: torch.Tensor, diffusion_ratio: float = 0.5, consistency_ratio: float = 0.25
) -> torch.Tensor:
    """Each sample's (t, r) kind, LongTensor ``[B]``: 0 diffusion (r = t), 1 consistency (r = 0), 2 mean (0 < r < t).

    ``index`` ``[B]``: the samples' logical indices in the training stream (the batch's ``sample_index``).
    The official release assigns kinds by position in the global batch (first 50% diffusion, next 25%
    consistency). Small CPU batches would then never see some kinds, so kinds follow a low-discrepancy
    sequence over the logical sample index: any epoch has the ratios up to one sample, and a sample's kind
    does not depend on how the global batch is split over ranks.
    """
    if not (0.0 <= diffusion_ratio and 0.0 <= consistency_ratio and diffusion_ratio + consistency_ratio <= 1.0):
        raise ValueError(f"pair_kinds: bad ratios {diffusion_ratio}, {consistency_ratio}")
    phase = (torch.as_tensor(index, dtype=torch.float64).reshape(-1) * _GOLDEN) % 1.0
    kinds = torch.full(phase.shape, 2, dtype=torch.long)
    kinds[phase < diffusion_ratio + consistency_ratio] = 1
    kinds[phase < diffusion_ratio] = 0
    return kinds


def sample_time_pairs(
    kinds: torch.Tensor, shift: float, generator: RandomSource = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Shifted ``(sigma_t, sigma_r)``, each ``[B]``: ``t = u1``, ``r = u2·t`` (v1.5), r set by kind, then shift both."""
    batch = kinds.shape[0]
    u1 = rand((batch,), generator, "cpu", dtype=torch.float64)
    u2 = rand((batch,), generator, "cpu", dtype=torch.float64)
    t = u1.clamp_min(1e-6)
    r = u2 * t
    r = torch.where(kinds == 0, t, r)
    r = torch.where(kinds == 1, torch.zeros_like(r), r)
    # Strictly inside (0, t) for mean pairs, repaired with nextafter as the release does.
    inside = torch.minimum(r.clamp_min(torch.finfo(torch.float64).tiny), torch.nextafter(t, torch.zeros_like(t)))
    r = torch.where(kinds == 2, inside, r)
    return shift_sigmas(t, shift).float(), shift_sigmas(r, shift).float()


def gaussian_timestep_weight(sigma: torch.Tensor, shift: float, num_steps: int = 1000) -> torch.Tensor:
    """Per-sample weight ``w(t) ∝ exp(-2((t - 500)/1000)^2)`` on the shifted 1000-point training grid.

    As the Wan scheduler's ``training_weight``: the grid ``1000·shift(linspace(1, 0, N))``, weights
    min-subtracted and normalised to mean 1, read at the grid point nearest to ``1000·sigma``.
    """
    grid = shift_sigmas(torch.linspace(1.0, 0.0, num_steps, dtype=torch.float64), shift) * 1000.0
    y = torch.exp(-2.0 * ((grid - 500.0) / 1000.0) ** 2)
    y = y - y.min()
    y = y * (num_steps / y.sum())
    index = (grid[None, :] - 1000.0 * sigma.double().cpu()[:, None]).abs().argmin(dim=1)
    return y[index].to(sigma.device, torch.float32)


def finite_difference_window(
    sigma_t: torch.Tensor, sigma_r: torch.Tensor, eps: float = 0.005
) -> tuple[torch.Tensor, torch.Tensor]:
    """The bounded window ``(t+, t-)`` of the total derivative: ``t+ = min(t + eps, 1)``, ``t- = max(t - eps, r)``."""
    return (sigma_t + eps).clamp(max=1.0), torch.maximum(sigma_t - eps, sigma_r)


def flow_map_prediction(
    u: torch.Tensor,
    u_plus: torch.Tensor,
    u_minus: torch.Tensor,
    sigma_t: torch.Tensor,
    sigma_r: torch.Tensor,
    sigma_plus: torch.Tensor,
    sigma_minus: torch.Tensor,
) -> torch.Tensor:
    """``u + (t - r)·(u+ - u-)/(t+ - t-)`` for ``[B, C, f, h, w]`` predictions and per-sample ``[B]`` sigmas."""

    def per_sample(s: torch.Tensor) -> torch.Tensor:
        return s.to(u.dtype).view(-1, *([1] * (u.dim() - 1)))

    slope = (u_plus - u_minus) / per_sample((sigma_plus - sigma_minus).clamp_min(1e-6))
    return u + per_sample(sigma_t - sigma_r) * slope


def adaptive_rescale(losses: torch.Tensor, kinds: torch.Tensor, reference: torch.Tensor | None = None) -> torch.Tensor:
    """Scale each non-diffusion sample's loss ``[B]`` to the mean diffusion loss (value only; gradients keep direction).

    ``loss_i · reference / (loss_i.detach() + 1e-5)``; diffusion samples are unchanged. ``reference`` is the
    mean diffusion loss of the global batch (all ranks; the caller reduces it); None = this batch's. Without
    any diffusion sample (``reference`` None or NaN and none here) the losses are returned as is.
    """
    diffusion = kinds == 0
    if reference is None:
        if not diffusion.any():
            return losses
        reference = losses.detach()[diffusion].mean()
    elif not torch.isfinite(reference):
        return losses
    scale = torch.where(diffusion, torch.ones_like(losses), reference / (losses.detach() + 1e-5))
    return losses * scale
