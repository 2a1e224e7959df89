"""Fused-PRoPE self-attention for diffusers' ``WanTransformer3DModel`` (every Wan route), with a KV cache.

``PRoPEWanAttnProcessor`` replaces ``WanAttnProcessor`` on every ``attn1``. It does the same math
(q/k/v projections, RMS q/k norm, Wan's interleaved 3D RoPE) and then
``solarwm.kernels.prope.prope_attention`` with the camera of each token's latent frame (§6.1).

The per-call state (cameras, mask, temporal positions, KV cache) is an ``AttentionContext``. The
adapter sets it on ``transformer.rope``; a forward hook there replaces Wan's rotary tables with
ones for the context's temporal positions and attaches the context to the ``(cos, sin)`` tuple
that the model hands to every block. That keeps it correct under gradient checkpointing (the
recomputation receives the same tuple) without forking the model.

Temporal positions are explicit, not ``0..F-1``: the teacher-forcing layout ``[clean | noisy]``
gives both copies the same positions, and a cached rollout reads its window at window-local
positions (history ``0..W-n-1``, query block at the tail).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from solarwm.backbones.base import AdapterError
from solarwm.kernels.kv_cache import KVCache
from solarwm.kernels.prope import prope_attention
from solarwm.kernels.ulysses import SequenceParallel


class WanAttentionError(AdapterError):
    """The Wan self-attention was called without its context or past the RoPE table."""


@dataclass
class AttentionContext:
    """One forward call's attention state, carried to every self-attention with Wan's rotary tuple.

    ``viewmats``/``K``: w2c ``[B, f, 4, 4]`` and pixel ``[B, f, 4]`` of the query frames; with a
    ``cache``, ``kv_viewmats``/``kv_K`` cover the window (cached frames, then the query frames).
    ``positions``: temporal RoPE index of each query frame ``[f]``; ``kv_positions`` those of the
    window. ``commit``: the layers stage their new K/V into the cache.
    """

    viewmats: torch.Tensor
    K: torch.Tensor
    image_size: tuple[int, int]
    positions: torch.Tensor
    attn_mask: torch.Tensor | None = None
    cache: KVCache | None = None
    kv_viewmats: torch.Tensor | None = None
    kv_K: torch.Tensor | None = None
    kv_positions: torch.Tensor | None = None
    commit: bool = False
    # Filled by the rope hook: (cos, sin) for kv_positions, and the tokens per frame.
    kv_freqs: tuple[torch.Tensor, torch.Tensor] | None = None
    # Filled by the sequence-parallel block hook (``backbones.sequence_parallel``): the full token count.
    sequence_tokens: int | None = None


class ContextRotary(tuple):
    """Wan's ``(freqs_cos, freqs_sin)`` tuple with the call's ``AttentionContext`` attached."""

    context: AttentionContext


def wan_rope_freqs(
    rope: torch.nn.Module, positions: torch.Tensor, grid_h: int, grid_w: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Wan's 3D rotary tables for frames at temporal ``positions [f]`` on a ``grid_h x grid_w`` token grid.

    Same layout as ``WanRotaryPosEmbed.forward`` (``[1, f*grid_h*grid_w, 1, D]``, frame-major), but the
    temporal rows are gathered at ``positions`` instead of ``0..f-1``. Raises if a position is past the
    table (``rope_max_seq_len``), where Wan itself would fail with a shape error.
    """
    table = rope.freqs_cos.shape[0]
    if positions.numel() and int(positions.max()) >= table:
        raise WanAttentionError(
            f"temporal RoPE position {int(positions.max())} is past the table of {table} "
            "(rope_max_seq_len); a causal rollout must use window-local positions"
        )
    if max(grid_h, grid_w) > table:
        raise WanAttentionError(f"token grid {grid_h}x{grid_w} is past the RoPE table of {table}")
    sizes = [rope.t_dim, rope.h_dim, rope.w_dim]
    out = []
    for freqs in (rope.freqs_cos, rope.freqs_sin):
        f_t, f_h, f_w = freqs.split(sizes, dim=1)
        frames = positions.numel()
        f_t = f_t[positions.to(f_t.device)].view(frames, 1, 1, -1).expand(frames, grid_h, grid_w, -1)
        f_h = f_h[:grid_h].view(1, grid_h, 1, -1).expand(frames, grid_h, grid_w, -1)
        f_w = f_w[:grid_w].view(1, 1, grid_w, -1).expand(frames, grid_h, grid_w, -1)
        out.append(torch.cat([f_t, f_h, f_w], dim=-1).reshape(1, frames * grid_h * grid_w, 1, -1))
    return out[0], out[1]


def attach_context(rope: torch.nn.Module, args: tuple, output: tuple) -> tuple:
    """Forward hook on ``transformer.rope``: tables at the context's positions, with the context attached."""
    context: AttentionContext | None = getattr(rope, "_solarwm_context", None)
    if context is None:
        return output
    hidden_states = args[0]
    _, p_h, p_w = rope.patch_size
    grid_h, grid_w = hidden_states.shape[3] // p_h, hidden_states.shape[4] // p_w
    wrapped = ContextRotary(wan_rope_freqs(rope, context.positions, grid_h, grid_w))
    if context.kv_positions is not None:
        context.kv_freqs = wan_rope_freqs(rope, context.kv_positions, grid_h, grid_w)
    wrapped.context = context
    return wrapped


def apply_wan_rotary(x: torch.Tensor, freqs_cos: torch.Tensor, freqs_sin: torch.Tensor) -> torch.Tensor:
    """Wan's interleaved RoPE on ``x [B, N, H, D]`` (identical to WanAttnProcessor's inner function)."""
    x1, x2 = x.unflatten(-1, (-1, 2)).unbind(-1)
    cos = freqs_cos[..., 0::2]
    sin = freqs_sin[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = x1 * cos - x2 * sin
    out[..., 1::2] = x1 * sin + x2 * cos
    return out.type_as(x)


class PRoPEWanAttnProcessor:
    """Self-attention processor for ``WanAttention``: WanAttnProcessor's math + fused PRoPE (+ KV cache).

    One instance per block (``layer_index`` addresses the block's slot in a ``KVCache``). Parameter-free.
    """

    def __init__(self, head_dims: tuple[int, int] | None = None, layer_index: int = 0) -> None:
        self.head_dims = slice(*head_dims) if head_dims is not None else None
        self.layer_index = layer_index
        self.sequence_parallel: SequenceParallel | None = None  # Ulysses group (backbones.sequence_parallel)

    def __call__(
        self,
        attn: torch.nn.Module,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """``hidden_states [B, N, dim]`` -> ``[B, N, dim]``; cameras and cache come from ``rotary_emb.context``."""
        if encoder_hidden_states is not None:
            raise WanAttentionError("PRoPEWanAttnProcessor is for self-attention (attn1) only")
        ctx: AttentionContext | None = getattr(rotary_emb, "context", None)
        if ctx is None:
            raise WanAttentionError(
                "camera condition missing in self-attention: call the adapter (it sets the cameras), "
                "not the bare transformer"
            )
        if getattr(attn, "fused_projections", False):
            query, key, value = attn.to_qkv(hidden_states).chunk(3, dim=-1)
        else:
            query, key, value = attn.to_q(hidden_states), attn.to_k(hidden_states), attn.to_v(hidden_states)
        query = attn.norm_q(query).unflatten(2, (attn.heads, -1))
        key = attn.norm_k(key).unflatten(2, (attn.heads, -1))
        value = value.unflatten(2, (attn.heads, -1))
        sp = self.sequence_parallel
        if sp is not None:  # from here to the output: all tokens, H/P heads
            query, key, value = (sp.to_heads(t, ctx.sequence_tokens) for t in (query, key, value))
        query = apply_wan_rotary(query, *rotary_emb)

        if ctx.cache is None:
            key = apply_wan_rotary(key, *rotary_emb)
            kv_viewmats, kv_K = ctx.viewmats, ctx.K
            mask = attention_mask if attention_mask is not None else ctx.attn_mask
        else:
            if ctx.commit:
                ctx.cache.stage(self.layer_index, key, value)
            past_k, past_v = ctx.cache.layer(self.layer_index)
            if past_k is not None:
                key, value = torch.cat([past_k.to(key.dtype), key], 1), torch.cat([past_v.to(value.dtype), value], 1)
            key = apply_wan_rotary(key, *ctx.kv_freqs)
            kv_viewmats, kv_K, mask = ctx.kv_viewmats, ctx.kv_K, None  # the query block sees its whole window

        # Cameras are per latent frame; tokens are frame-major, so prope_attention applies each
        # frame's matrix to that frame's tokens without per-token copies.
        out = prope_attention(
            query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2),
            ctx.viewmats, ctx.K, kv_viewmats, kv_K, ctx.image_size,
            head_dims=self.head_dims, attn_mask=mask,
        )
        out = out.transpose(1, 2)
        if sp is not None:
            out = sp.to_tokens(out)
        out = out.flatten(2, 3).type_as(query)
        out = attn.to_out[0](out)
        return attn.to_out[1](out)
