"""Ulysses sequence parallelism: a group of ``P`` ranks shares one sample's tokens, all-to-all around attention.

Each rank of a group holds a contiguous ``1/P`` of every sample's token sequence (``shard``): ``ceil(N/P)``
tokens, so the split falls on whole latent frames when the frame count divides by ``P``; when ``N`` does not
divide, the last rank's share is padded with zeros. A ``unit`` (LTX: the tokens of one latent frame) makes every
share whole units, ``ceil(N/(P*unit))`` of them, padded with whole units, for blocks that work per frame.
Inside a self-attention processor, after the Q/K/V
projections (and their per-token norms), ``to_heads`` turns ``[B, N/P, H, D]`` into ``[B, N, H/P, D]`` (one
all-to-all) and strips the padding, so everything up to the attention output (the route's RoPE, fused PRoPE
with per-frame cameras, the KV cache, the ``[N, N]`` mask, the attention kernel) runs unchanged on the full
sequence for ``H/P`` heads; ``to_tokens`` pads and returns ``[B, N/P, H, D]`` (the second all-to-all).
RoPE and PRoPE act per token within each head, so applying them after the head split equals applying them
before it. ``gather`` rebuilds the full sequence for the output head and the loss.

Gradients. Every rank of a group computes the same loss on the gathered output; ``gather``'s backward keeps
the rank's own slice of the gradient, scaled by ``P``, so the parameter gradients of a group's ranks sum (the
FSDP reduce-scatter averages over all ranks, group included) to the gradient of the loss taken once.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

__all__ = ["SequenceParallel", "SequenceParallelError", "all_to_all"]


class SequenceParallelError(ValueError):
    """Sequence parallelism cannot run this model or these inputs (heads not divisible by ``P``, ...)."""


def _all_to_all(x: torch.Tensor, group: Any, scatter_dim: int, gather_dim: int) -> torch.Tensor:
    """Chunk ``x`` along ``scatter_dim``, send chunk ``i`` to rank ``i``, join what arrives along ``gather_dim``."""
    size = dist.get_world_size(group)
    send = torch.stack(x.chunk(size, dim=scatter_dim)).contiguous()
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send, group=group)
    return torch.cat(recv.unbind(0), dim=gather_dim)


class _AllToAll(torch.autograd.Function):
    """``_all_to_all`` with its transpose (the reverse all-to-all) as the backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: Any, scatter_dim: int, gather_dim: int) -> torch.Tensor:
        ctx.group, ctx.scatter_dim, ctx.gather_dim = group, scatter_dim, gather_dim
        return _all_to_all(x, group, scatter_dim, gather_dim)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return _all_to_all(grad.contiguous(), ctx.group, ctx.gather_dim, ctx.scatter_dim), None, None, None


def all_to_all(x: torch.Tensor, group: Any, scatter_dim: int, gather_dim: int) -> torch.Tensor:
    """Differentiable all-to-all over ``group``: ``x``'s ``scatter_dim`` split over the ranks, ``gather_dim`` joined."""
    if x.shape[scatter_dim] % dist.get_world_size(group):
        raise SequenceParallelError(
            f"all_to_all: dim {scatter_dim} of {tuple(x.shape)} does not divide by the group's "
            f"{dist.get_world_size(group)} ranks"
        )
    return _AllToAll.apply(x, group, scatter_dim, gather_dim)


class _GatherTokens(torch.autograd.Function):
    """All-gather of the group's token slices; backward: this rank's slice of the gradient times ``P``."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group: Any, dim: int, rank: int) -> torch.Tensor:
        size = dist.get_world_size(group)
        ctx.group, ctx.dim, ctx.rank, ctx.size = group, dim, rank, size
        parts = [torch.empty_like(x) for _ in range(size)]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.cat(parts, dim=dim)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        # Every rank of the group holds the same loss; only this rank's slice flows back into its part of the
        # model, and the P restores the sum the FSDP gradient average divides by (see the module docstring).
        local = grad.chunk(ctx.size, dim=ctx.dim)[ctx.rank]
        return local * ctx.size, None, None, None


class SequenceParallel:
    """One rank's view of its sequence-parallel group (``group=None``: the default group).

    ``size`` ranks share each sample; this rank holds token slice ``rank`` of ``size``.
    """

    def __init__(self, group: Any = None) -> None:
        if not dist.is_initialized():
            raise SequenceParallelError("sequence parallelism needs an initialised torch.distributed process group")
        self.group = group
        self.size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)

    def local_tokens(self, num_tokens: int, unit: int = 1) -> int:
        """Tokens each rank holds of a sequence of ``num_tokens``, whole ``unit``s (the last shares may be padding)."""
        if num_tokens % unit:
            raise SequenceParallelError(f"a sequence of {num_tokens} tokens is not whole units of {unit}")
        return -(-num_tokens // (self.size * unit)) * unit

    def token_range(self, num_tokens: int, unit: int = 1) -> tuple[int, int]:
        """``[start, stop)`` of this rank's real tokens in the full sequence (stop may be below start + local)."""
        local = self.local_tokens(num_tokens, unit)
        start = min(self.rank * local, num_tokens)
        return start, min(start + local, num_tokens)

    def _pad(self, x: torch.Tensor, num_tokens: int, dim: int, unit: int = 1) -> torch.Tensor:
        """``x`` with ``num_tokens`` tokens along ``dim``, zero-padded to ``size * local_tokens``."""
        missing = self.size * self.local_tokens(num_tokens, unit) - num_tokens
        if missing == 0:
            return x
        shape = list(x.shape)
        shape[dim] = missing
        return torch.cat([x, x.new_zeros(shape)], dim=dim)

    def shard(self, x: torch.Tensor, dim: int = 1, unit: int = 1) -> torch.Tensor:
        """This rank's contiguous slice of the full sequence ``x`` along ``dim`` (padded: ``local_tokens`` long)."""
        num_tokens = x.shape[dim]
        local = self.local_tokens(num_tokens, unit)
        return self._pad(x, num_tokens, dim, unit).narrow(dim, self.rank * local, local)

    def gather(self, x: torch.Tensor, num_tokens: int, dim: int = 1, unit: int = 1) -> torch.Tensor:
        """The full sequence of ``num_tokens`` tokens from every rank's slice ``x`` (padding stripped)."""
        if x.shape[dim] != self.local_tokens(num_tokens, unit):
            raise SequenceParallelError(
                f"gather: a slice of {x.shape[dim]} tokens along dim {dim}, expected "
                f"{self.local_tokens(num_tokens, unit)} of {num_tokens} over {self.size} ranks"
            )
        full = _GatherTokens.apply(x, self.group, dim, self.rank)
        return full.narrow(dim, 0, num_tokens)

    def to_heads(self, x: torch.Tensor, num_tokens: int) -> torch.Tensor:
        """``[B, N/P, H, D]`` (this rank's tokens, all heads) -> ``[B, N, H/P, D]`` (all tokens, its heads)."""
        self.check_heads(x.shape[2], "to_heads")
        full = all_to_all(x, self.group, scatter_dim=2, gather_dim=1)
        return full[:, :num_tokens] if full.shape[1] != num_tokens else full

    def to_tokens(self, x: torch.Tensor, unit: int = 1) -> torch.Tensor:
        """``[B, N, H/P, D]`` -> ``[B, N/P, H, D]``: the inverse of ``to_heads`` (pads ``N`` as ``shard`` does)."""
        return all_to_all(self._pad(x, x.shape[1], 1, unit), self.group, scatter_dim=1, gather_dim=2)

    def check_heads(self, heads: int, where: str) -> None:
        """Raise unless ``heads`` divides by the group size (each rank takes ``heads / P`` of them)."""
        if heads % self.size:
            divisors = [p for p in range(1, heads + 1) if heads % p == 0]
            raise SequenceParallelError(
                f"{where}: {heads} attention heads do not divide by sequence_parallel_size={self.size}; "
                f"use one of {divisors}"
            )
