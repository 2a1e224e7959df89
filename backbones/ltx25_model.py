"""The video-only LTX-2 transformer of route ``ltx25``, built from diffusers' own parts, and its PRoPE attention.

diffusers' ``LTX2VideoTransformer3DModel`` always builds and runs its audio stream, so
``LTX25VideoTransformer3DModel`` assembles only the video path from the class's own submodules, under
the original parameter names, and calls them in the order the class's ``forward`` does (the adapter's
loader reads only these tensors from a full checkpoint). ``PRoPELTXAttnProcessor`` is the video
self-attention with fused PRoPE and the KV cache; ``LTX25VideoTextConnector`` is the frozen video
half of ``LTX2TextConnectors``. The adapter (``solarwm.backbones.ltx25``) wires them together.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
from diffusers.configuration_utils import ConfigMixin, register_to_config
from diffusers.models.attention import FeedForward
from diffusers.models.embeddings import PixArtAlphaTextProjection
from diffusers.models.modeling_utils import ModelMixin
from diffusers.models.normalization import RMSNorm
from diffusers.models.transformers.transformer_ltx2 import (
    LTX2AdaLayerNormSingle,
    LTX2Attention,
    LTX2AudioVideoRotaryPosEmbed,
    apply_interleaved_rotary_emb,
    apply_split_rotary_emb,
)
from diffusers.pipelines.ltx2.connectors import LTX2ConnectorTransformer1d

from solarwm.backbones.base import AdapterError
from solarwm.kernels.kv_cache import KVCache
from solarwm.kernels.prope import prope_attention
from solarwm.kernels.ulysses import SequenceParallel


class LTXAttentionError(AdapterError):
    """The LTX self-attention was called without its camera context."""


@dataclass
class LTXAttentionContext:
    """One forward call's self-attention state (see ``wan_attention.AttentionContext``): query cameras
    ``viewmats``/``K`` per latent frame, an optional dense mask, and with a ``cache`` the window's cameras
    and the rotary tables of the window's keys (``kv_freqs``)."""

    viewmats: torch.Tensor
    K: torch.Tensor
    image_size: tuple[int, int]
    attn_mask: torch.Tensor | None = None
    cache: KVCache | None = None
    kv_viewmats: torch.Tensor | None = None
    kv_K: torch.Tensor | None = None
    kv_freqs: tuple[torch.Tensor, torch.Tensor] | None = None
    commit: bool = False
    # Under sequence parallelism (set by the block hook of backbones.sequence_parallel): the full token count, and
    # the whole-frame split's latent frames and tokens per frame (each rank's share is whole frames).
    sequence_tokens: int | None = None
    sequence_frames: int | None = None
    sequence_unit: int = 1
    local_frame_groups: list[list[torch.Tensor]] | None = None  # this rank's frame groups


class ContextRotary(tuple):
    """LTX's ``(cos, sin)`` rotary tuple of the query tokens with the call's ``LTXAttentionContext`` attached."""

    context: LTXAttentionContext | None = None


def ltx_rope_freqs(
    rope: LTX2AudioVideoRotaryPosEmbed, positions: torch.Tensor, grid_h: int, grid_w: int, fps: float,
    batch_size: int, device: torch.device | str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """LTX's video rotary tables for latent frames at temporal ``positions [f]`` on a ``grid_h x grid_w`` grid.

    Built with the model's own ``rope.prepare_video_coords`` (pixel-space patch bounds, causal first-frame
    clamp, seconds at ``fps``) and ``rope(coords)``; the frames at ``positions`` are kept (frame-major
    tokens). Position 0 is the clip's first latent (one pixel frame); positions may repeat (teacher forcing).
    """
    positions = positions.to(torch.long).cpu()
    frames = int(positions.max()) + 1 if positions.numel() else 1
    coords = rope.prepare_video_coords(batch_size, frames, grid_h, grid_w, device, fps=fps)
    coords = coords.unflatten(2, (frames, grid_h * grid_w))[:, :, positions.to(coords.device)].flatten(2, 3)
    cos, sin = rope(coords, device=device)
    return cos, sin


def _rank_heads(freqs: tuple[torch.Tensor, torch.Tensor], sp: SequenceParallel) -> tuple[torch.Tensor, torch.Tensor]:
    """The rotary tables of this rank's ``H/P`` heads: split tables ``[B, H, N, r]``, interleaved ``[B, N, H*D]``."""
    dim = 1 if freqs[0].dim() == 4 else -1
    return tuple(t.chunk(sp.size, dim=dim)[sp.rank] for t in freqs)


def _rotate(attn: LTX2Attention, x: torch.Tensor, freqs: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """LTX's RoPE on ``x [B, N, heads*dim]`` exactly as ``LTX2AudioVideoAttnProcessor`` applies it."""
    if attn.rope_type == "interleaved":
        return apply_interleaved_rotary_emb(x, freqs)
    return apply_split_rotary_emb(x, freqs)


class PRoPELTXAttnProcessor:
    """Video self-attention processor for ``LTX2Attention``: ``LTX2AudioVideoAttnProcessor``'s math with
    fused PRoPE (``prope_attention``) in place of plain attention, and a KV cache of un-roped keys.

    One instance per block (``layer_index`` addresses its ``KVCache`` slot). Parameter-free.
    """

    def __init__(self, head_dims: tuple[int, int] | None = None, layer_index: int = 0) -> None:
        self.head_dims = slice(*head_dims) if head_dims is not None else None
        self.layer_index = layer_index
        self.sequence_parallel: SequenceParallel | None = None  # Ulysses group (kernels.ulysses)

    def __call__(
        self,
        attn: LTX2Attention,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        query_rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None,
        key_rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """``hidden_states [B, N, dim]`` -> ``[B, N, dim]``; cameras and cache from ``query_rotary_emb.context``."""
        if encoder_hidden_states is not None:
            raise LTXAttentionError("PRoPELTXAttnProcessor is for the video self-attention (attn1) only")
        ctx: LTXAttentionContext | None = getattr(query_rotary_emb, "context", None)
        if ctx is None:
            raise LTXAttentionError(
                "camera condition missing in self-attention: call the adapter (it sets the cameras), "
                "not the bare transformer"
            )
        gate_logits = attn.to_gate_logits(hidden_states) if attn.to_gate_logits is not None else None
        query = attn.norm_q(attn.to_q(hidden_states))
        key = attn.norm_k(attn.to_k(hidden_states))
        value = attn.to_v(hidden_states)
        heads, q_freqs, kv_freqs = attn.heads, query_rotary_emb, ctx.kv_freqs
        sp = self.sequence_parallel
        if sp is not None:  # from here to the output: all tokens, H/P heads (and those heads' rotary tables)
            heads = attn.heads // sp.size
            query, key, value = (sp.to_heads(t.unflatten(2, (attn.heads, -1)), ctx.sequence_tokens).flatten(2)
                                 for t in (query, key, value))
            q_freqs = _rank_heads(query_rotary_emb, sp)
            kv_freqs = _rank_heads(kv_freqs, sp) if kv_freqs is not None else None
        query = _rotate(attn, query, q_freqs)

        if ctx.cache is None:
            key = _rotate(attn, key, q_freqs)
            kv_viewmats, kv_K = ctx.viewmats, ctx.K
            mask = attention_mask if attention_mask is not None else ctx.attn_mask
        else:
            key, value = key.unflatten(2, (heads, -1)), value.unflatten(2, (heads, -1))
            if ctx.commit:
                ctx.cache.stage(self.layer_index, key, value)
            past_k, past_v = ctx.cache.layer(self.layer_index)
            if past_k is not None:
                key = torch.cat([past_k.to(key.dtype), key], 1)
                value = torch.cat([past_v.to(value.dtype), value], 1)
            key = _rotate(attn, key.flatten(2), kv_freqs)
            value = value.flatten(2)
            kv_viewmats, kv_K, mask = ctx.kv_viewmats, ctx.kv_K, None  # the query block sees its window

        q = query.unflatten(2, (heads, -1)).transpose(1, 2)
        k = key.unflatten(2, (heads, -1)).transpose(1, 2)
        v = value.unflatten(2, (heads, -1)).transpose(1, 2)
        out = prope_attention(
            q, k, v, ctx.viewmats, ctx.K, kv_viewmats, kv_K, ctx.image_size,
            head_dims=self.head_dims, attn_mask=mask,
        )
        out = out.transpose(1, 2).to(query.dtype)  # [B, N, H, D]
        if sp is not None:
            out = sp.to_tokens(out, ctx.sequence_unit)
        if gate_logits is not None:
            out = out * (2.0 * torch.sigmoid(gate_logits)).unsqueeze(-1)
        out = attn.to_out[0](out.flatten(2, 3))
        return attn.to_out[1](out)


# --------------------------------------------------------------------------------------------- the video-only model


def _mod_params(table: torch.Tensor, temb: torch.Tensor, batch_size: int) -> tuple[torch.Tensor, ...]:
    """``LTX2VideoTransformerBlock.get_mod_params``: table ``[n, D]`` + temb ``[B, f, n*D]`` -> n x ``[B, f, D]``."""
    values = table[None, None].to(temb.device) + temb.reshape(batch_size, temb.shape[1], table.shape[0], -1)
    return values.unbind(dim=2)


def _frames(x: torch.Tensor, frames: int) -> torch.Tensor:
    """Frame-major tokens ``[B, f*T, D]`` -> ``[B, f, T, D]``."""
    return x.unflatten(1, (frames, -1))


def _modulate(x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """``x [B, f, T, D] * (1 + scale) + shift`` with per-frame ``[B, f, D]`` modulation."""
    return x * (1 + scale[:, :, None]) + shift[:, :, None]


class LTX25VideoBlock(nn.Module):
    """The video half of ``LTX2VideoTransformerBlock``: the same submodules under the same names, nothing of audio."""

    def __init__(
        self, dim: int, num_attention_heads: int, attention_head_dim: int, cross_attention_dim: int,
        gated_attn: bool, cross_attn_mod: bool, qk_norm: str, activation_fn: str, attention_bias: bool,
        attention_out_bias: bool, eps: float, elementwise_affine: bool, rope_type: str, ff_bias: bool,
    ) -> None:
        super().__init__()
        attn = dict(heads=num_attention_heads, kv_heads=num_attention_heads, dim_head=attention_head_dim,
                    bias=attention_bias, out_bias=attention_out_bias, qk_norm=qk_norm, rope_type=rope_type,
                    apply_gated_attention=gated_attn)
        self.norm1 = RMSNorm(dim, eps=eps, elementwise_affine=elementwise_affine)
        self.attn1 = LTX2Attention(query_dim=dim, cross_attention_dim=None, **attn)
        self.norm2 = RMSNorm(dim, eps=eps, elementwise_affine=elementwise_affine)
        self.attn2 = LTX2Attention(query_dim=dim, cross_attention_dim=cross_attention_dim, **attn)
        self.norm3 = RMSNorm(dim, eps=eps, elementwise_affine=elementwise_affine)
        self.ff = FeedForward(dim, activation_fn=activation_fn, bias=ff_bias)
        self.video_cross_attn_adaln = cross_attn_mod
        self.scale_shift_table = nn.Parameter(torch.randn(9 if cross_attn_mod else 6, dim) / dim**0.5)
        if cross_attn_mod:
            self.prompt_scale_shift_table = nn.Parameter(torch.randn(2, dim))

    def forward(
        self,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor,
        temb: torch.Tensor,
        temb_prompt: torch.Tensor | None,
        video_rotary_emb: tuple[torch.Tensor, torch.Tensor],
        frame_groups: list[list[torch.Tensor]],
        encoder_attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``hidden_states [B, f*T, D]``; ``temb [B, f, n*D]``, ``temb_prompt [B, f, 2D]`` per latent frame."""
        b, f = hidden_states.shape[0], temb.shape[1]
        params = _mod_params(self.scale_shift_table, temb, b)
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = params[:6]

        # 1. video self-attention
        norm = _modulate(_frames(self.norm1(hidden_states), f), scale_msa, shift_msa).flatten(1, 2)
        attn = self.attn1(norm, encoder_hidden_states=None, query_rotary_emb=video_rotary_emb)
        hidden_states = hidden_states + (_frames(attn, f) * gate_msa[:, :, None]).flatten(1, 2)

        # 2. text cross-attention (Q: video, K/V: modulated text)
        norm = _frames(self.norm2(hidden_states), f)
        if self.video_cross_attn_adaln:
            shift_text_q, scale_text_q, gate_text_q = params[6:9]
            norm = _modulate(norm, scale_text_q, shift_text_q)
            if temb_prompt is not None:
                shift_kv, scale_kv = _mod_params(self.prompt_scale_shift_table, temb_prompt, b)
            else:  # use_prompt_adaln_single=False: the static per-layer table only
                table = self.prompt_scale_shift_table.to(hidden_states.dtype)
                shift_kv, scale_kv = (t.expand(b, f, -1) for t in table[None, None].unbind(2))
            attn = torch.empty_like(norm)
            for i, groups in enumerate(frame_groups):
                for frames in groups:
                    j = int(frames[0])
                    scale, shift = scale_kv[i : i + 1, j : j + 1], shift_kv[i : i + 1, j : j + 1]
                    text = encoder_hidden_states[i : i + 1] * (1 + scale) + shift
                    mask = None if encoder_attention_mask is None else encoder_attention_mask[i : i + 1]
                    out = self.attn2(norm[i : i + 1, frames].flatten(1, 2), encoder_hidden_states=text,
                                     attention_mask=mask)
                    attn[i : i + 1, frames] = out.unflatten(1, (len(frames), -1))
            attn = attn * gate_text_q[:, :, None]
        else:
            attn = _frames(self.attn2(norm.flatten(1, 2), encoder_hidden_states=encoder_hidden_states,
                                      attention_mask=encoder_attention_mask), f)
        hidden_states = hidden_states + attn.flatten(1, 2)

        # 3. feed-forward
        norm = _modulate(_frames(self.norm3(hidden_states), f), scale_mlp, shift_mlp).flatten(1, 2)
        return hidden_states + (_frames(self.ff(norm), f) * gate_mlp[:, :, None]).flatten(1, 2)


class LTX25VideoTransformer3DModel(ModelMixin, ConfigMixin):
    """The video path of ``LTX2VideoTransformer3DModel`` (see the module docstring): same config names,
    same parameter names, no audio stream and no audio-video cross-attention.

    ``forward(hidden_states [B, C, f, h, w], encoder_hidden_states [B, L, cross_attention_dim],
    timestep [B, f], prompt_timestep [B, f], video_rotary_emb, frame_groups)`` with timesteps already
    x ``timestep_scale_multiplier`` and per latent frame; patch sizes are 1 (LTX-2.x), so tokens are the
    latent pixels, frame-major.
    """

    _supports_gradient_checkpointing = True
    _skip_layerwise_casting_patterns = ["norm"]
    _repeated_blocks = ["LTX25VideoBlock"]

    @register_to_config
    def __init__(
        self,
        in_channels: int = 128,
        out_channels: int | None = 128,
        patch_size: int = 1,
        patch_size_t: int = 1,
        num_attention_heads: int = 32,
        attention_head_dim: int = 128,
        cross_attention_dim: int = 4096,
        vae_scale_factors: tuple[int, int, int] = (8, 32, 32),
        pos_embed_max_pos: int = 20,
        base_height: int = 2048,
        base_width: int = 2048,
        gated_attn: bool = False,
        cross_attn_mod: bool = False,
        num_layers: int = 48,
        activation_fn: str = "gelu-approximate",
        qk_norm: str = "rms_norm_across_heads",
        norm_elementwise_affine: bool = False,
        norm_eps: float = 1e-6,
        caption_channels: int = 3840,
        attention_bias: bool = True,
        attention_out_bias: bool = True,
        rope_theta: float = 10000.0,
        rope_double_precision: bool = True,
        causal_offset: int = 1,
        timestep_scale_multiplier: int = 1000,
        rope_type: str = "interleaved",
        use_prompt_embeddings: bool = True,
        ff_bias: bool = True,
        use_prompt_adaln_single: bool = True,
        use_keyframes_abs_pos_embedding: bool = False,
    ) -> None:
        super().__init__()
        if patch_size != 1 or patch_size_t != 1:
            raise AdapterError(f"ltx25: patch sizes must be 1 (LTX-2.x), got {patch_size_t}x{patch_size}")
        out_channels = out_channels or in_channels
        inner_dim = num_attention_heads * attention_head_dim
        self.proj_in = nn.Linear(in_channels, inner_dim)
        if use_keyframes_abs_pos_embedding:
            # Loaded with the checkpoint; unused by the plain forward (as in diffusers without a keyframe mask).
            self.keyframes_abs_pos_embedding = nn.Parameter(torch.zeros(1, inner_dim))
        if use_prompt_embeddings:  # LTX-2.0; 2.3+ project the caption in the connector
            self.caption_projection = PixArtAlphaTextProjection(in_features=caption_channels, hidden_size=inner_dim)
        self.time_embed = LTX2AdaLayerNormSingle(inner_dim, num_mod_params=9 if cross_attn_mod else 6,
                                                 use_additional_conditions=False)
        self.scale_shift_table = nn.Parameter(torch.randn(2, inner_dim) / inner_dim**0.5)
        if cross_attn_mod and use_prompt_adaln_single:
            self.prompt_adaln = LTX2AdaLayerNormSingle(inner_dim, num_mod_params=2, use_additional_conditions=False)
        self.rope = LTX2AudioVideoRotaryPosEmbed(
            dim=inner_dim, patch_size=patch_size, patch_size_t=patch_size_t, base_num_frames=pos_embed_max_pos,
            base_height=base_height, base_width=base_width, scale_factors=vae_scale_factors, theta=rope_theta,
            causal_offset=causal_offset, modality="video", double_precision=rope_double_precision,
            rope_type=rope_type, num_attention_heads=num_attention_heads,
        )
        self.transformer_blocks = nn.ModuleList([
            LTX25VideoBlock(
                inner_dim, num_attention_heads, attention_head_dim, cross_attention_dim, gated_attn, cross_attn_mod,
                qk_norm, activation_fn, attention_bias, attention_out_bias, norm_eps, norm_elementwise_affine,
                rope_type, ff_bias,
            )
            for _ in range(num_layers)
        ])
        self.norm_out = nn.LayerNorm(inner_dim, eps=1e-6, elementwise_affine=False)
        self.proj_out = nn.Linear(inner_dim, out_channels)
        self.gradient_checkpointing = False

    def forward(
        self,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor,
        timestep: torch.Tensor,
        prompt_timestep: torch.Tensor,
        video_rotary_emb: tuple[torch.Tensor, torch.Tensor],
        frame_groups: list[list[torch.Tensor]],
        encoder_attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``[B, C, f, h, w]`` -> ``[B, out_channels, f, h, w]`` (see the class docstring)."""
        b, _, f, h, w = hidden_states.shape
        x = self.proj_in(hidden_states.permute(0, 2, 3, 4, 1).flatten(1, 3))
        dtype = x.dtype
        if encoder_attention_mask is not None and encoder_attention_mask.ndim == 2:
            encoder_attention_mask = ((1 - encoder_attention_mask.to(dtype)) * -10000.0).unsqueeze(1)

        temb, embedded = self.time_embed(timestep.flatten(), batch_size=b, hidden_dtype=dtype)
        temb, embedded = temb.view(b, f, -1), embedded.view(b, f, -1)
        temb_prompt = None
        if getattr(self, "prompt_adaln", None) is not None:
            temb_prompt = self.prompt_adaln(prompt_timestep.flatten(), batch_size=b, hidden_dtype=dtype)[0]
            temb_prompt = temb_prompt.view(b, f, -1)
        if self.config.use_prompt_embeddings:
            encoder_hidden_states = self.caption_projection(encoder_hidden_states).view(b, -1, x.shape[-1])

        for block in self.transformer_blocks:
            args = (x, encoder_hidden_states, temb, temb_prompt, video_rotary_emb, frame_groups, encoder_attention_mask)
            if torch.is_grad_enabled() and self.gradient_checkpointing:
                x = self._gradient_checkpointing_func(block, *args)
            else:
                x = block(*args)

        shift, scale = (self.scale_shift_table[None, None] + embedded[:, :, None]).unbind(2)
        x = _modulate(_frames(self.norm_out(x), f), scale, shift).flatten(1, 2)
        out = self.proj_out(x)
        return out.view(b, f, h, w, -1).permute(0, 4, 1, 2, 3)


class LTX25VideoTextConnector(ModelMixin, ConfigMixin):
    """The video half of ``LTX2TextConnectors`` after its feature projection: ``video_connector``
    (``LTX2ConnectorTransformer1d``) with the same config and parameter names, no audio connector.

    ``forward(features [B, L, D], mask bool [B, L]) -> (embeds [B, L, D], mask [B, L])`` does what
    ``LTX2TextConnectors.forward`` does to the projected video features (additive mask, connector with
    learnable registers in place of padding, output masked by the connector's mask).
    """

    @register_to_config
    def __init__(
        self,
        video_connector_num_attention_heads: int = 32,
        video_connector_attention_head_dim: int = 128,
        video_connector_num_layers: int = 8,
        video_connector_num_learnable_registers: int | None = 128,
        video_gated_attn: bool = True,
        connector_rope_base_seq_len: int = 4096,
        rope_theta: float = 10000.0,
        rope_double_precision: bool = True,
        causal_temporal_positioning: bool = False,
        rope_type: str = "split",
    ) -> None:
        super().__init__()
        self.video_connector = LTX2ConnectorTransformer1d(
            num_attention_heads=video_connector_num_attention_heads,
            attention_head_dim=video_connector_attention_head_dim, num_layers=video_connector_num_layers,
            num_learnable_registers=video_connector_num_learnable_registers,
            rope_base_seq_len=connector_rope_base_seq_len, rope_theta=rope_theta,
            rope_double_precision=rope_double_precision, causal_temporal_positioning=causal_temporal_positioning,
            rope_type=rope_type, gated_attention=video_gated_attn,
        )

    @property
    def width(self) -> int:
        return self.video_connector.inner_dim

    def forward(self, features: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        registers = self.config.video_connector_num_learnable_registers
        if registers:  # the registers tile the sequence: pad it (as padding, which they replace)
            pad = (-features.shape[1]) % registers
            if pad:
                features = torch.nn.functional.pad(features, (0, 0, 0, pad))
                mask = torch.nn.functional.pad(mask, (0, pad), value=False)
        dtype = features.dtype
        additive = (mask.to(torch.int64) - 1).to(dtype).view(mask.shape[0], 1, 1, -1) * torch.finfo(dtype).max
        out, out_mask = self.video_connector(features, additive)
        keep = (out_mask < 1e-6).to(torch.int64).reshape(out.shape[0], out.shape[1], 1)
        return out * keep, keep.squeeze(-1).bool()


# --------------------------------------------------------------------------------------------- codec
