"""The DMD distribution-matching gradient and its surrogate loss (paper eq. 3), as pure tensor math."""

from __future__ import annotations

import torch


def dmd_gradient(
    output: torch.Tensor, fake_x0: torch.Tensor, real_x0: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """Normalised DMD gradient ``(fake - real) / mean|output - real|`` per sample, masked, ``[B, C, f, h, w]``."""
    mask = mask.expand_as(output).float()
    grad = (fake_x0 - real_x0).float() * mask
    normalizer = ((output.detach() - real_x0).abs().float() * mask).flatten(1).sum(1) / mask.flatten(1).sum(
        1
    ).clamp_min(1.0)
    grad = grad / normalizer.clamp_min(1e-8).view(-1, *([1] * (grad.dim() - 1)))
    return torch.nan_to_num(grad)


def dmd_surrogate(output: torch.Tensor, grad: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``0.5·MSE(output, (output - grad).detach())`` over valid elements: its gradient is ``grad / N``."""
    target = (output - grad).detach()
    mask = mask.expand_as(output).float()
    return 0.5 * (((output.float() - target) ** 2) * mask).sum() / mask.sum().clamp_min(1.0)
