"""Route ``ltx25``: SolarWM-ltx-2.5-22B on diffusers' LTX-2 classes, used video-only (paper §6.2, Table 4).

**Video-only construction.** LTX-2.5 ships as an audio-visual checkpoint (``LTX2VideoTransformer3DModel``:
a 4096-wide video stream, a 2048-wide audio stream and bidirectional audio-video cross-attention in
each of 48 blocks; ``LTX2TextConnectors``: a video and an audio text connector). diffusers' class cannot
run without audio: every ``LTX2VideoTransformerBlock.forward`` runs the audio self-attention, audio
text cross-attention and audio feed-forward unconditionally, and its ``__init__`` builds them. So this
route does not instantiate that class. ``LTX25VideoTransformer3DModel`` builds only the video submodules,
*the diffusers classes themselves* (``LTX2Attention``, ``FeedForward``, ``RMSNorm``,
``LTX2AdaLayerNormSingle``, ``LTX2AudioVideoRotaryPosEmbed``) under the class's own attribute names
(``proj_in``, ``time_embed``, ``prompt_adaln``, ``rope``, ``transformer_blocks.i.{norm1, attn1, norm2,
attn2, norm3, ff, scale_shift_table, prompt_scale_shift_table}``, ``scale_shift_table``, ``norm_out``,
``proj_out``), so a published checkpoint's video keys load 1:1. Its forward calls them in the order
``LTX2VideoTransformer3DModel.forward`` does with ``isolate_modalities=True`` (patchify projection;
time embedding -> AdaLN modulation; prompt AdaLN; per block: norm1 + modulation -> video self-attention
(+ gate), norm2 + text-query modulation -> text cross-attention on modulated prompt K/V (+ gate),
norm3 + modulation -> feed-forward (+ gate); output norm + modulation -> ``proj_out``). The audio
stream (``audio_*``), the audio-video cross-attention (``audio_to_video_attn``,
``video_to_audio_attn``, ``av_cross_attn_*``, ``*_a2v_cross_attn_scale_shift_table``) and the audio
connector are neither built nor loaded: the checkpoint loader reads only the video keys from the
safetensors files (``safe_open``, key by key). ``tests/test_route_ltx25.py`` checks that the video path
equals the full class's video output (isolate_modalities) on weights loaded from a full AV checkpoint.

Published count (meta device, ``LTX25Config.published()``; Table 4 says "14.74B video path; 1.61B
Gemma connector frozen"): video core 13,123,337,344 (13.1 B) + frozen video connector 1,612,546,304
(1.61 B) = 14,735,883,648 (14.74 B). The removed audio stream is 3,286,408,320 (+ its 403,620,096
connector = 3.69 B) and the AV cross-attention 2,578,113,536 (2.58 B), as Table 4 says. The Gemma feature
projection (``video_text_proj_in``, 3840·49 -> 4096, 0.77 B) is not counted: it belongs to the Gemma
feature extraction, whose 4096-d output (the cached features) is what the frozen connector takes.

**Codec.** ``AutoencoderKLLTX2Video`` (``codec="ltx_vae"``): 8x temporal, 32x spatial, 128 channels,
the first frame encoded alone, so a clip has 8n + 1 frames and latent i stands for pixel frame 8i (the
base class's rules with ``temporal_compression = 8``). Latents are normalised as the LTX-2 pipelines do
(``(z - latents_mean) * scaling_factor / latents_std``). The embedded CPU default is a lossless
``PatchifyCodec(spatial=config.patchify_spatial, temporal=8)`` with the same temporal rule
(spatial 32 would make 24,576 channels, so the tiny route uses 4: 384 channels).

**Conditioning.** LTX's native first-frame latent: the first latent is clean (``clean_latent_frames = 1``),
timestep 0 on its tokens, excluded from the loss (as in ``LTX2ConditionPipeline``, whose per-token
timestep is ``t * (1 - conditioning_mask)``).

**Objective and timesteps.** Rectified flow as the base class: ``x_sigma = (1 - sigma) x0 + sigma eps``,
target ``eps - x0``. The LTX-2 transformer takes timesteps already multiplied by
``timestep_scale_multiplier`` = 1000 (the pipelines pass the scheduler's ``t = 1000 sigma``; its
``time_embed`` is a sinusoid of that value), so ``timestep_scale = 1000``. The prompt AdaLN
(``prompt_adaln``, LTX-2.3+) takes the same ``1000 sigma``. Published shift ``e^2.05``: the LTX-2
pipelines' ``calculate_shift`` gives ``mu = 2.05`` at >= 4096 tokens (every training size here) and
their exponential time shift with ``mu`` is the base class's shift ``s = e^mu``.

**Per-frame timesteps.** Cameras, AdaLN timesteps *and* the prompt K/V modulation are per latent
frame. diffusers feeds the prompt AdaLN one sigma per sample (it modulates the text keys/values, shared
by all queries); a causal layout holds clean (sigma 0) and noisy frames in one call, and the committed
clean history must be computed exactly as in the rollout's commit pass, so the text cross-attention is
run once per group of frames sharing a sigma, each with its own modulated K/V (exact: cross-attention
queries are independent). One deviation from the pipeline follows: the clean first-frame latent's
prompt modulation uses its own sigma 0 instead of the sample's sigma.

**Text.** Cached Gemma features ``[B, L, 4096]`` (the output of LTX-2.5's ``video_text_proj_in``) in the
batch's ``text_embeds`` go through the frozen video connector (``LTX2ConnectorTransformer1d``: 8 blocks,
128 learnable registers that replace padding) to the transformer's text cross-attention (LTX-2.3+ has no
caption projection in the transformer: ``use_prompt_embeddings=False``). The embedded default hashes
captions (``HashingTextEncoder``) at the connector's width (its input width equals its output width
and the transformer's ``cross_attention_dim``). Without a cache, ``text_encoder="gemma"`` (the published
preset) computes the same features from the checkpoint's Gemma and ``video_text_proj_in``
(``GemmaFeatureEncoder``); a batch's ``text_embeds`` always take precedence.

**Camera.** ``PRoPELTXAttnProcessor`` on every video self-attention (``attn1``) does the class's own
math (q/k/v, RMS q/k norm across heads, LTX's split or interleaved RoPE, the per-head output gate)
with ``solarwm.kernels.prope.prope_attention`` in place of plain attention. With one camera for all
frames it equals ``LTX2AudioVideoAttnProcessor`` (tested). Text cross-attention is untouched.

**RoPE on read.** LTX's 3D RoPE works on fractional pixel-space coordinates: latent frame i covers
pixel frames ``[8i - 7, 8i + 1)`` (the first latent ``[0, 1)``, the causal offset clamp), in seconds
(``/ fps``) and relative to ``base_num_frames``; h/w likewise x32. ``ltx_rope_freqs`` builds the
tables with the model's own ``rope.prepare_video_coords`` and ``rope(...)`` and keeps the frames at
the given *latent positions*. The KV cache stores un-roped keys; every read ropes the window at
window-local positions ``0..W-1``, shifted by one once the clip's first latent has left the window, so
that window position 0 is never given the first-frame clamp it does not have: the clamp squeezes the
first latent to one pixel frame, and a regular latent at window position 0 would sit 5 frames (not 8)
before its successor. Within the window the rollout uses teacher forcing's positions exactly (tested);
past it, as for every route, window-local positions equal training's only up to a shift, and RoPE
followed by PRoPE is shift-invariant only for a static camera.

**Causal mode: ``frames_per_block = 2`` latent frames (16 pixel frames), ``window_blocks = 6``.** No
official value exists for LTX-2.5 (the official repository covers stage 1 only). The two official
causal routes update every ~0.7 s (Wan2.2-5B: 3 latents x 4 = 12 frames at 16 fps = 0.75 s; MiniMax-H3:
5 latents = 17 frames at 24 fps = 0.71 s) and see a ~4.3-4.5 s window (6 blocks). LTX compresses 8x in
time, so one latent is 8 frames: 2 latents = 16 frames = 0.67 s at LTX's native 24 fps (1.0 s at the
corpus' 16 fps) and the 6-block window is 12 latents = 4.0 s (6.0 s); 3 latents would stretch the
window to 6 s (9 s) and update every 1-1.5 s, 1 latent would shrink it to 2 s (3 s). Per block, 2 latents
at 704x1280 are 2 x 880 = 1,760 tokens (Wan2.2-5B: 3 x 405 = 1,215). A 121-frame 5 s clip at 24 fps
(16 latents) splits into exactly 8 blocks; the recipes' 81-frame 5 s clips at 16 fps (11 latents) into
5 blocks and a last one of 1, all inside one 12-latent window.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Literal

import torch
import torch.nn as nn
from diffusers import AutoencoderKLLTX2Video
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
from safetensors import safe_open

from solarwm.backbones.base import AdapterError, BackboneAdapter
from solarwm.backbones.codecs import PatchifyCodec, _check_video
from solarwm.backbones.lora import LoRAConfig
from solarwm.backbones.text import HashingTextEncoder, zero_padding
from solarwm.kernels.masks import causal_mask
from solarwm.kernels.prope import prope_attention
from solarwm.rollout.cache import KVCache

# --------------------------------------------------------------------------------------------- configs

#: The video arguments of LTX-2.5's ``LTX2VideoTransformer3DModel`` config (diffusers names). 2.3+: gated
#: self-attention, prompt K/V modulation, caption projection in the connector; 2.5: no video FFN bias.
LTX25_TRANSFORMER_CONFIG: dict[str, Any] = {
    "in_channels": 128, "out_channels": 128, "patch_size": 1, "patch_size_t": 1,
    "num_attention_heads": 32, "attention_head_dim": 128, "cross_attention_dim": 4096,
    "vae_scale_factors": (8, 32, 32), "pos_embed_max_pos": 20, "base_height": 2048, "base_width": 2048,
    "gated_attn": True, "cross_attn_mod": True, "num_layers": 48, "caption_channels": 3840,
    "rope_type": "split", "rope_double_precision": True, "use_prompt_embeddings": False, "ff_bias": False,
    "use_prompt_adaln_single": True, "use_keyframes_abs_pos_embedding": True,
}

#: LTX-2.5 video VAE (``AutoencoderKLLTX2Video``): 128 channels, 32x spatial, 8x temporal.
LTX25_VAE_CONFIG: dict[str, Any] = {
    "in_channels": 3, "out_channels": 3, "latent_channels": 128,
    "block_out_channels": (256, 512, 1024, 1024), "layers_per_block": (4, 6, 4, 2, 2),
    "downsample_type": ("spatial", "temporal", "spatiotemporal", "spatiotemporal"),
    "spatio_temporal_scaling": (True, True, True, True),
    "decoder_block_out_channels": (256, 512, 512, 1024), "decoder_layers_per_block": (4, 6, 4, 2, 2),
    "decoder_spatio_temporal_scaling": (True, True, True, True),
    "decoder_inject_noise": (False, False, False, False, False),
    "upsample_type": ("spatiotemporal", "spatiotemporal", "temporal", "spatial"),
    "upsample_residual": (False, False, False, False), "upsample_factor": (2, 2, 1, 2),
    "timestep_conditioning": False, "patch_size": 4, "patch_size_t": 1, "resnet_norm_eps": 1e-6,
    "scaling_factor": 1.0, "encoder_causal": True, "decoder_causal": False,
    "encoder_spatial_padding_mode": "zeros", "decoder_spatial_padding_mode": "zeros",
    "spatial_compression_ratio": 32, "temporal_compression_ratio": 8,
}

#: Same class and geometry (32x spatial, 8x temporal, first frame alone), a few thousand parameters.
TINY_LTX_VAE_CONFIG: dict[str, Any] = {
    "in_channels": 3, "out_channels": 3, "latent_channels": 16,
    "block_out_channels": (8, 8, 16, 16), "layers_per_block": (1, 1, 1, 1, 1),
    "downsample_type": ("spatial", "temporal", "spatiotemporal", "spatiotemporal"),
    "spatio_temporal_scaling": (True, True, True, True),
    "decoder_block_out_channels": (8, 16, 32), "decoder_layers_per_block": (1, 1, 1, 1),
    "decoder_spatio_temporal_scaling": (True, True, True), "decoder_inject_noise": (False, False, False, False),
    "upsample_type": ("spatiotemporal", "spatiotemporal", "spatiotemporal"),
    "upsample_residual": (False, False, False), "upsample_factor": (2, 2, 2),
    "timestep_conditioning": False, "patch_size": 4, "patch_size_t": 1, "decoder_causal": False,
    "spatial_compression_ratio": 32, "temporal_compression_ratio": 8,
}

VAE_CONFIGS = {"ltx2.5": LTX25_VAE_CONFIG, "tiny": TINY_LTX_VAE_CONFIG}


@dataclass
class LTX25Config:
    """Config of the route; ``published()`` is LTX-2.5's video path, ``tiny()`` the same classes for a CPU."""

    num_layers: int = 2
    num_attention_heads: int = 4
    attention_head_dim: int = 32
    #: Width of the text features the cross-attention reads (= the connector's width; 4096 published).
    cross_attention_dim: int = 128
    gated_attn: bool = True
    cross_attn_mod: bool = True
    use_prompt_adaln_single: bool = True
    ff_bias: bool = False
    rope_type: Literal["split", "interleaved"] = "split"
    use_keyframes_abs_pos_embedding: bool = True
    #: The frozen video text connector (``LTX2ConnectorTransformer1d``); its width is ``cross_attention_dim``.
    connector_num_layers: int = 1
    connector_num_attention_heads: int = 4
    connector_attention_head_dim: int = 32
    #: Learnable registers that replace padding (the text length is padded to a multiple of this).
    connector_num_learnable_registers: int | None = 8
    #: ``patchify``: lossless space/time-to-depth (embedded default); ``ltx_vae``: AutoencoderKLLTX2Video.
    codec: Literal["ltx_vae", "patchify"] = "patchify"
    #: Spatial factor of the patchify codec (``3 * 8 * s * s`` latent channels).
    patchify_spatial: int = 4
    #: AutoencoderKLLTX2Video config used when no ``pretrained_path`` gives ``vae/``: ``ltx2.5`` or ``tiny``.
    vae_config: Literal["ltx2.5", "tiny"] = "tiny"
    #: ``hashing``: HashingTextEncoder at the connector width; ``gemma``: Gemma (``text_encoder/`` +
    #: ``tokenizer/``) and LTX-2.5's video feature projection (``connectors/``) from ``text_encoder_path`` (or
    #: ``pretrained_path``), for captions without cached features; ``none``: batches must carry cached Gemma
    #: features (``text_embeds [B, L, cross_attention_dim]`` + ``text_mask``). Cached features always win.
    text_encoder: Literal["hashing", "gemma", "none"] = "hashing"
    text_encoder_path: str | None = None
    text_max_length: int = 16
    #: Frame rate the RoPE's temporal coordinates (seconds) are computed with.
    fps: float = 24.0
    #: Flow timestep shift (LTX-2 at >= 4096 tokens: e^2.05).
    shift: float = 3.0
    #: ``velocity``: LTX's native output (pretrained weights); ``x0``: the network predicts x0 and the
    #: adapter returns the velocity (x_t - x0)/sigma (tiny configs whose tokens are wider than the model).
    prediction: Literal["velocity", "x0"] = "velocity"
    #: ``(start, stop)`` head dims that get PRoPE; ``None`` = all dims of every head.
    camera_head_dims: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        if self.camera_head_dims is not None:
            self.camera_head_dims = tuple(self.camera_head_dims)

    @classmethod
    def tiny(cls) -> "LTX25Config":
        """2 layers, 4 heads x 32, a 1-block connector, patchify codec, hashing text, x0 output: trains on a CPU."""
        return cls(prediction="x0")

    @classmethod
    def published(cls) -> "LTX25Config":
        """LTX-2.5's video path: 48 layers, 32 heads x 128, 8-block connector, LTX-2.5 VAE, Gemma features
        (cached in the batch, else computed by the checkpoint's Gemma and feature projection)."""
        return cls(
            num_layers=48, num_attention_heads=32, attention_head_dim=128, cross_attention_dim=4096,
            connector_num_layers=8, connector_num_attention_heads=32, connector_attention_head_dim=128,
            connector_num_learnable_registers=128, codec="ltx_vae", vae_config="ltx2.5", text_encoder="gemma",
            text_max_length=1024, fps=16.0, shift=round(math.exp(2.05), 4),
        )

    def transformer_kwargs(self, in_channels: int) -> dict[str, Any]:
        """Keyword arguments of ``LTX25VideoTransformer3DModel`` (diffusers' LTX-2 names) for this config."""
        kwargs = dict(LTX25_TRANSFORMER_CONFIG)
        kwargs.update(
            in_channels=in_channels, out_channels=in_channels, num_layers=self.num_layers,
            num_attention_heads=self.num_attention_heads, attention_head_dim=self.attention_head_dim,
            cross_attention_dim=self.cross_attention_dim, gated_attn=self.gated_attn,
            cross_attn_mod=self.cross_attn_mod, use_prompt_adaln_single=self.use_prompt_adaln_single,
            ff_bias=self.ff_bias, rope_type=self.rope_type,
            use_keyframes_abs_pos_embedding=self.use_keyframes_abs_pos_embedding,
        )
        return kwargs

    def connector_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of ``LTX25VideoTextConnector`` (``LTX2TextConnectors``' video names)."""
        return dict(
            video_connector_num_attention_heads=self.connector_num_attention_heads,
            video_connector_attention_head_dim=self.connector_attention_head_dim,
            video_connector_num_layers=self.connector_num_layers,
            video_connector_num_learnable_registers=self.connector_num_learnable_registers,
            video_gated_attn=self.gated_attn, rope_type=self.rope_type,
        )


# --------------------------------------------------------------------------------------------- RoPE + camera


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
        query = _rotate(attn, query, query_rotary_emb)

        if ctx.cache is None:
            key = _rotate(attn, key, query_rotary_emb)
            kv_viewmats, kv_K = ctx.viewmats, ctx.K
            mask = attention_mask if attention_mask is not None else ctx.attn_mask
        else:
            key, value = key.unflatten(2, (attn.heads, -1)), value.unflatten(2, (attn.heads, -1))
            if ctx.commit:
                ctx.cache.stage(self.layer_index, key, value)
            past_k, past_v = ctx.cache.layer(self.layer_index)
            if past_k is not None:
                key = torch.cat([past_k.to(key.dtype), key], 1)
                value = torch.cat([past_v.to(value.dtype), value], 1)
            key = _rotate(attn, key.flatten(2), ctx.kv_freqs)
            value = value.flatten(2)
            kv_viewmats, kv_K, mask = ctx.kv_viewmats, ctx.kv_K, None  # the query block sees its window

        heads = attn.heads
        q = query.unflatten(2, (heads, -1)).transpose(1, 2)
        k = key.unflatten(2, (heads, -1)).transpose(1, 2)
        v = value.unflatten(2, (heads, -1)).transpose(1, 2)
        out = prope_attention(
            q, k, v, ctx.viewmats, ctx.K, kv_viewmats, kv_K, ctx.image_size,
            head_dims=self.head_dims, attn_mask=mask,
        )
        out = out.transpose(1, 2).to(query.dtype)  # [B, N, H, D]
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


class LTXVAECodec(nn.Module):
    """diffusers ``AutoencoderKLLTX2Video`` with the LTX-2 pipelines' latent normalisation; posterior mode."""

    def __init__(self, vae: AutoencoderKLLTX2Video) -> None:
        super().__init__()
        self.vae = vae
        self.temporal_compression = int(vae.temporal_compression_ratio)
        self.spatial_compression = int(vae.spatial_compression_ratio)
        self.latent_channels = int(vae.config.latent_channels)
        self.scaling = float(vae.config.scaling_factor)

    def _stats(self, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        shape = (1, -1, 1, 1, 1)
        return (self.vae.latents_mean.view(shape).to(like.device, torch.float32),
                self.vae.latents_std.view(shape).to(like.device, torch.float32))

    def encode(self, video: torch.Tensor) -> torch.Tensor:
        """``video [B, 3, 8n+1, H, W]`` in [-1, 1] -> normalised latents ``[B, C, n+1, H/32, W/32]``."""
        _check_video(video, self.temporal_compression, self.spatial_compression, "LTXVAECodec.encode")
        z = self.vae.encode(video.to(self.vae.dtype)).latent_dist.mode().float()
        mean, std = self._stats(z)
        return (z - mean) * self.scaling / std

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Normalised latents ``[B, C, f, h, w]`` -> ``video [B, 3, 8(f-1)+1, 32h, 32w]`` in [-1, 1]."""
        mean, std = self._stats(latents)
        z = latents.float() * std / self.scaling + mean
        return self.vae.decode(z.to(self.vae.dtype), return_dict=False)[0].float().clamp(-1.0, 1.0)

    def stream_decoder(self, context: int = 2) -> Callable[[torch.Tensor], torch.Tensor]:
        """Block-by-block decode with ``context`` previous latents re-decoded in front of each block.

        LTX-2.5's decoder is not causal (``decoder_causal=False``: it looks ahead in time), so no streaming
        decode can equal the whole-clip decode exactly; this one is flat in memory and approximate at
        block boundaries (a block's last frames miss the next block's latents).
        """
        state: dict[str, torch.Tensor | None] = {"prev": None}
        t = self.temporal_compression

        def decode_block(latents: torch.Tensor) -> torch.Tensor:
            prev = state["prev"]
            z = latents if prev is None else torch.cat([prev.to(latents.device), latents], 2)
            video = self.decode(z)
            state["prev"] = z[:, :, -context:].detach()
            return video if prev is None else video[:, :, -t * latents.shape[2]:]

        return decode_block


# --------------------------------------------------------------------------------------------- Gemma features


class GemmaFeatureEncoder(nn.Module):
    """What a Gemma feature cache holds, computed online: LTX-2's prompt encoding (``LTX2Pipeline.
    _get_gemma_prompt_embeds``: left-padded tokens, every hidden state of the Gemma model stacked) followed by
    ``LTX2TextConnectors``' video feature projection (per-token RMS norm, padding zeroed, scaled by
    ``sqrt(video_hidden_dim / caption_channels)``, ``video_text_proj_in``). Output: ``(features [B, L, D],
    mask [B, L])``, the frozen connector's input. ``path`` holds ``text_encoder/``, ``tokenizer/`` and
    ``connectors/`` (an LTX-2.5 diffusers folder); only ``video_text_proj_in.*`` is read from the connectors.
    Nothing is downloaded (``local_files_only``).
    """

    def __init__(self, path: str | Path, max_length: int = 1024) -> None:
        super().__init__()
        import transformers
        from transformers import AutoTokenizer

        root = Path(path)
        model_dir, tok_dir, cdir = root / "text_encoder", root / "tokenizer", root / "connectors"
        for folder in (model_dir, tok_dir, cdir):
            if not folder.is_dir():
                raise AdapterError(
                    f"ltx25: {folder} missing (text_encoder='gemma' needs text_encoder/, tokenizer/, connectors/)"
                )
        arch = (_read_json(model_dir / "config.json").get("architectures") or ["AutoModel"])[0]
        model_class = getattr(transformers, arch, None)
        if model_class is None:
            raise AdapterError(f"ltx25: {model_dir}: transformers has no class {arch!r}")
        self.model = model_class.from_pretrained(str(model_dir), local_files_only=True, use_safetensors=True)
        self.tokenizer = AutoTokenizer.from_pretrained(str(tok_dir), local_files_only=True)
        self.tokenizer.padding_side = "left"  # as the LTX-2 pipelines
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        cfg = _read_json(cdir / "config.json")
        if not cfg.get("per_modality_projections", False):
            raise AdapterError(f"ltx25: {cdir} is an LTX-2.0 connector (no per-modality video projection)")
        self.caption_channels, self.video_hidden_dim = int(cfg["caption_channels"]), int(cfg["video_hidden_dim"])
        self.video_text_proj_in = nn.Linear(
            self.caption_channels * int(cfg["text_proj_in_factor"]), self.video_hidden_dim,
            bias=bool(cfg.get("proj_bias", False)),
        )
        _load_selected(self.video_text_proj_in, cdir, prefix="video_text_proj_in.")
        self.max_length = max_length

    @torch.no_grad()
    def forward(self, captions: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        from diffusers.pipelines.ltx2.connectors import per_token_rms_norm

        device = self.video_text_proj_in.weight.device
        tok = self.tokenizer([c.strip() for c in captions], padding="max_length", max_length=self.max_length,
                             truncation=True, add_special_tokens=True, return_tensors="pt")
        mask = tok.attention_mask.to(device)
        out = self.model(input_ids=tok.input_ids.to(device), attention_mask=mask, output_hidden_states=True)
        hidden = out.hidden_states
        hidden = per_token_rms_norm(torch.stack(hidden, dim=-1).float()).flatten(2, 3)
        hidden = torch.where(mask.bool().unsqueeze(-1), hidden, torch.zeros_like(hidden))
        scale = math.sqrt(self.video_hidden_dim / self.caption_channels)
        features = self.video_text_proj_in((hidden * scale).to(self.video_text_proj_in.weight.dtype))
        return features.float(), mask.bool()


# --------------------------------------------------------------------------------------------- loading


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise AdapterError(f"ltx25: cannot read {path}: {e}") from e


def _load_selected(model: nn.Module, folder: Path, prefix: str = "") -> None:
    """Load exactly ``model``'s parameters from the safetensors files of ``folder`` (keys ``prefix + name``),
    reading only those tensors: other components of the checkpoint (audio, AV cross-attention) are never loaded."""
    wanted = {prefix + k: k for k in model.state_dict()}
    state: dict[str, torch.Tensor] = {}
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise AdapterError(f"ltx25: no *.safetensors in {folder}")
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for key in f.keys():
                if key in wanted:
                    tensor = f.get_tensor(key)
                    state[wanted[key]] = tensor.float() if tensor.is_floating_point() else tensor
    missing = sorted(set(wanted.values()) - set(state))
    if missing:
        raise AdapterError(f"ltx25: {folder} lacks {len(missing)} video tensors, e.g. {missing[:3]}")
    try:
        model.load_state_dict(state, strict=True, assign=True)
    except RuntimeError as e:
        raise AdapterError(f"ltx25: {folder} does not match the config: {e}") from e


def _check_keys(folder: Path, found: dict[str, Any], expected: dict[str, Any], keys: tuple[str, ...]) -> None:
    def plain(value: Any) -> Any:
        return tuple(value) if isinstance(value, (list, tuple)) else value

    wrong = [f"{k}: checkpoint {found[k]!r} != config {expected[k]!r}"
             for k in keys if k in found and plain(found[k]) != plain(expected[k])]
    if wrong:
        raise AdapterError(f"ltx25: checkpoint {folder} does not match the config: " + "; ".join(wrong))


# --------------------------------------------------------------------------------------------- the adapter


def frame_groups(sigma_per_frame: torch.Tensor) -> list[list[torch.Tensor]]:
    """Per sample, the latent frames sharing one sigma (their text K/V modulation is the same)."""
    groups = []
    for row in sigma_per_frame.detach().float().cpu():
        values, inverse = torch.unique(row, return_inverse=True)
        groups.append([torch.nonzero(inverse == i).flatten() for i in range(len(values))])
    return groups


class LTX25Adapter(BackboneAdapter):
    """Backbone adapter of SolarWM-ltx-2.5-22B: video-only LTX-2.5, clean first latent, flow target, PRoPE.

    ``config`` (default: ``preset``'s config); ``pretrained_path``: a local folder with ``transformer/``
    (an LTX-2.5 diffusers transformer folder, audio-visual or video-only: only video keys are read),
    ``connectors/`` (``LTX2TextConnectors`` or this route's video connector: only ``video_connector.*`` is
    read), ``vae/`` for ``codec="ltx_vae"`` and ``text_encoder/`` + ``tokenizer/`` for ``text_encoder="gemma"``;
    ``device`` builds under ``torch.device(device)`` (``"meta"``: no weights allocated, for parameter
    counting); ``lora``: LoRA on the transformer (``BackboneAdapter.enable_lora``).
    """

    route = "ltx25"
    config_class = LTX25Config
    clean_latent_frames = 1  # LTX's native first-frame latent
    timestep_scale = 1000.0  # LTX-2's timestep_scale_multiplier: the model takes 1000 * sigma
    patch_size = 1
    frames_per_block = 2  # 16 pixel frames; see the module docstring
    window_blocks = 6
    frozen_part_names = ("codec", "connector", "text_encoder")

    def __init__(
        self,
        config: LTX25Config | None = None,
        preset: Literal["tiny", "published"] = "tiny",
        pretrained_path: str | None = None,
        device: str | None = None,
        lora: LoRAConfig | None = None,
    ) -> None:
        super().__init__()
        if config is None:
            config = LTX25Config.tiny() if preset == "tiny" else LTX25Config.published()
        self.require_weights(preset, pretrained_path, device)  # before a 13 B model is built at random
        self.config = config = dataclasses.replace(config)
        self.shift = config.shift
        connector_width = config.connector_num_attention_heads * config.connector_attention_head_dim
        if connector_width != config.cross_attention_dim:
            raise AdapterError(
                f"{self.route}: the connector's width {connector_width} (heads x head dim) must equal "
                f"cross_attention_dim {config.cross_attention_dim}"
            )
        root = Path(pretrained_path) if pretrained_path is not None else None
        if root is not None and not root.is_dir():
            raise AdapterError(f"{self.route}: pretrained_path {root} does not exist")

        build = torch.device(device) if device is not None else contextlib.nullcontext()
        with build:
            self.codec = self._build_codec(root)
            self.temporal_compression = self.codec.temporal_compression
            self.spatial_compression = self.codec.spatial_compression
            self.latent_channels = self.codec.latent_channels
            self.transformer = self._build_transformer(root, meta=device == "meta")
            self.connector = self._build_connector(root, meta=device == "meta")
        self.text_encoder = self._build_text_encoder(root, meta=device == "meta")
        if root is not None and device not in (None, "meta"):  # checkpoint tensors are read on the CPU
            self.transformer.to(device)
            self.connector.to(device)

        for part in self.frozen_parts().values():
            part.requires_grad_(False).eval()
        for index, block in enumerate(self.transformer.transformer_blocks):
            block.attn1.set_processor(PRoPELTXAttnProcessor(config.camera_head_dims, layer_index=index))
        if lora is not None:
            self.enable_lora(lora)

    # ------------------------------------------------------------------ building
    def _build_codec(self, root: Path | None) -> nn.Module:
        cfg = self.config
        if cfg.codec == "patchify":
            return PatchifyCodec(spatial=cfg.patchify_spatial, temporal=8)
        if cfg.codec != "ltx_vae":
            raise AdapterError(f"{self.route}: unknown codec {cfg.codec!r}; expected 'ltx_vae' or 'patchify'")
        if root is not None:
            vae_dir = root / "vae"
            if not vae_dir.is_dir():
                raise AdapterError(f"{self.route}: {vae_dir} missing (codec='ltx_vae' needs pretrained_path/vae/)")
            vae = AutoencoderKLLTX2Video.from_pretrained(str(vae_dir), use_safetensors=True)
        else:
            vae = AutoencoderKLLTX2Video(**VAE_CONFIGS[cfg.vae_config])
        if int(vae.temporal_compression_ratio) != 8:
            raise AdapterError(f"{self.route}: VAE temporal factor {vae.temporal_compression_ratio} != 8")
        return LTXVAECodec(vae)

    def _build_transformer(self, root: Path | None, meta: bool = False) -> LTX25VideoTransformer3DModel:
        expected = self.config.transformer_kwargs(self.codec.latent_channels)
        if root is None:
            return LTX25VideoTransformer3DModel(**expected)
        tdir = root / "transformer"
        if not (tdir / "config.json").is_file():
            raise AdapterError(
                f"{self.route}: {tdir} missing or has no config.json: pretrained_path must be a checkpoint folder "
                "with transformer/ and connectors/ (and vae/ for codec='ltx_vae')"
            )
        found = _read_json(tdir / "config.json")
        _check_keys(tdir, found, expected, (
            "num_layers", "num_attention_heads", "attention_head_dim", "in_channels", "out_channels",
            "cross_attention_dim", "gated_attn", "cross_attn_mod", "ff_bias", "rope_type", "use_prompt_embeddings",
            "use_prompt_adaln_single", "use_keyframes_abs_pos_embedding", "patch_size", "patch_size_t",
        ))
        with torch.device("meta"):
            model = LTX25VideoTransformer3DModel(**expected)
        if not meta:
            _load_selected(model, tdir)
        return model

    def _build_connector(self, root: Path | None, meta: bool = False) -> LTX25VideoTextConnector:
        expected = self.config.connector_kwargs()
        if root is None:
            return LTX25VideoTextConnector(**expected)
        cdir = root / "connectors"
        if not (cdir / "config.json").is_file():
            raise AdapterError(f"{self.route}: {cdir} missing or has no config.json (the frozen text connector)")
        _check_keys(cdir, _read_json(cdir / "config.json"), expected, tuple(expected))
        with torch.device("meta"):
            connector = LTX25VideoTextConnector(**expected)
        if not meta:
            _load_selected(connector, cdir)
        return connector

    def _build_text_encoder(self, root: Path | None, meta: bool = False) -> nn.Module | None:
        cfg = self.config
        if cfg.text_encoder == "none":
            return None
        if cfg.text_encoder == "hashing":
            return HashingTextEncoder(cfg.cross_attention_dim, max_length=cfg.text_max_length)
        if cfg.text_encoder != "gemma":
            raise AdapterError(
                f"{self.route}: unknown text_encoder {cfg.text_encoder!r}; expected 'hashing', 'gemma' or 'none'"
            )
        path = cfg.text_encoder_path or (str(root) if root is not None else None)
        if path is None:
            if meta:  # parameter counting: the text encoder is not part of the route's count
                return None
            raise AdapterError(
                f"{self.route}: text_encoder='gemma' needs text_encoder_path or a pretrained_path with "
                "text_encoder/, tokenizer/ and connectors/ (or use text_encoder='none' with cached features)"
            )
        # Record the resolved folder so an export (which does not copy Gemma) reloads the same encoder.
        cfg.text_encoder_path = str(Path(path).resolve())
        encoder = GemmaFeatureEncoder(path, max_length=cfg.text_max_length)
        if encoder.video_hidden_dim != cfg.cross_attention_dim:
            raise AdapterError(
                f"{self.route}: {path}: Gemma features have width {encoder.video_hidden_dim}, the connector takes "
                f"{cfg.cross_attention_dim}"
            )
        return encoder

    @property
    def num_layers(self) -> int:
        return len(self.transformer.transformer_blocks)

    # ------------------------------------------------------------------ conditions
    def text_features(self, batch: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """``(embeds [B, L', D], mask [B, L'])``: cached Gemma features (``text_embeds``) or hashed captions,
        through the frozen video connector (L' = L padded to a multiple of its registers)."""
        if "text_embeds" in batch:
            features, mask = batch["text_embeds"], batch.get("text_mask")
            if mask is None:
                mask = torch.ones(features.shape[:2], dtype=torch.bool, device=features.device)
        elif self.text_encoder is not None:
            features, mask = self.text_encoder(list(batch["caption"]))
        else:
            raise AdapterError(
                f"{self.route}: batch has no 'text_embeds' (cached Gemma features) and the adapter has "
                "text_encoder='none'"
            )
        if features.shape[-1] != self.config.cross_attention_dim:
            raise AdapterError(
                f"{self.route}: text features have dim {features.shape[-1]}, the connector expects "
                f"{self.config.cross_attention_dim}"
            )
        weight = next(self.connector.parameters())
        features, mask = features.to(weight.device), mask.to(weight.device).bool()
        with torch.no_grad():
            embeds, out_mask = self.connector(zero_padding(features, mask).to(weight.dtype), mask)
        return embeds.float(), out_mask

    def prepare_conditions(self, batch: dict[str, Any]) -> dict[str, Any]:
        """Connector text features + the camera of each latent frame (c2w float64 ``[B, f, 4, 4]``, K ``[B, f, 4]``)."""
        c2w, K = self.latent_cameras(batch["c2w"], batch["K"])
        embeds, mask = self.text_features(batch)
        device = batch["c2w"].device
        return {
            "text_embeds": embeds.to(device), "text_mask": mask.to(device), "c2w": c2w, "K": K,
            "image_size": self._image_size(batch), "num_frames": batch["c2w"].shape[1],
        }

    # ------------------------------------------------------------------ model call
    def rope_freqs(self, positions: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotary tables of latent frames at ``positions`` for latents shaped like ``x [B, C, *, h, w]``."""
        h, w = x.shape[-2:]
        return ltx_rope_freqs(self.transformer.rope, positions, h, w, self.config.fps, x.shape[0], x.device)

    def _run(
        self,
        x: torch.Tensor,
        sigma_per_frame: torch.Tensor,
        r_per_frame: torch.Tensor | None,
        text_embeds: torch.Tensor,
        context: LTXAttentionContext,
        positions: torch.Tensor,
    ) -> torch.Tensor:
        """The video transformer on ``x [B, C, f, h, w]`` at per-frame timesteps ``1000·sigma``."""
        if r_per_frame is not None and self.delta_embedding is None:
            raise AdapterError(f"{self.route}: r_per_frame given but the flow map is not enabled (enable_flow_map)")
        timestep = sigma_per_frame.float() * self.timestep_scale
        rotary = ContextRotary(self.rope_freqs(positions, x))
        rotary.context = context
        if r_per_frame is not None:
            self._flow_map_r = r_per_frame.float() * self.timestep_scale
        dtype = self.transformer.dtype
        try:
            out = self.transformer(
                hidden_states=x.to(dtype), encoder_hidden_states=text_embeds.to(dtype), timestep=timestep,
                prompt_timestep=timestep, video_rotary_emb=rotary, frame_groups=frame_groups(sigma_per_frame),
            )
        finally:
            self._flow_map_r = None
        return out.to(x.dtype)

    def forward(
        self,
        x_t: torch.Tensor,
        sigma_per_frame: torch.Tensor,
        cond: dict[str, Any],
        attn_mask: torch.Tensor | None = None,
        kv_cache: KVCache | None = None,
        commit: bool = False,
        r_per_frame: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Flow prediction ``[B, C, f, h, w]`` (``eps - x0`` space); see ``BackboneAdapter.forward``."""
        self._check_input(x_t, sigma_per_frame, cond)
        self._check_cache_call(attn_mask, kv_cache, commit)
        f = x_t.shape[2]
        if kv_cache is None:
            context = LTXAttentionContext(self.window_viewmats(cond["c2w"], 0), cond["K"], tuple(cond["image_size"]),
                                          attn_mask=attn_mask)
            positions = torch.arange(f)
        else:
            context, positions = self._cached_context(cond, kv_cache, x_t, commit)
        out = self._cached_call(
            lambda: self._run(x_t, sigma_per_frame, r_per_frame, cond["text_embeds"], context, positions),
            cond, kv_cache, commit,
        )
        return self._native(out, x_t, sigma_per_frame)

    def _cached_context(
        self, cond: dict[str, Any], cache: KVCache, x_t: torch.Tensor, commit: bool
    ) -> tuple[LTXAttentionContext, torch.Tensor]:
        """Window = cached frames then the query block, cameras relative to the query block, RoPE at
        window-local positions (shifted by one once the clip's first latent has left the window)."""
        f = x_t.shape[2]
        window_c2w = cond["c2w"] if cache.c2w is None else torch.cat([cache.c2w.to(cond["c2w"].device), cond["c2w"]], 1)
        window_K = cond["K"] if cache.K is None else torch.cat([cache.K.to(cond["K"].device), cond["K"]], 1)
        width = window_c2w.shape[1]
        viewmats = self.window_viewmats(window_c2w, width - f)
        first_evicted = cache.committed_frames > cache.frames
        kv_positions = torch.arange(width) + int(first_evicted)
        context = LTXAttentionContext(
            viewmats[:, width - f :], window_K[:, width - f :], tuple(cond["image_size"]), cache=cache,
            commit=commit, kv_viewmats=viewmats, kv_K=window_K, kv_freqs=self.rope_freqs(kv_positions, x_t),
        )
        return context, kv_positions[width - f :]

    def forward_teacher_forcing(
        self,
        x_clean: torch.Tensor,
        x_noisy: torch.Tensor,
        sigma_per_frame: torch.Tensor,
        cond: dict[str, Any],
        r_per_frame: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Prediction for ``x_noisy [B, C, f, h, w]`` on ``[clean | noisy]``; see ``BackboneAdapter``."""
        self._check_teacher_forcing(x_clean, x_noisy, sigma_per_frame, cond)
        _, _, f, h, w = x_noisy.shape
        viewmats = self.window_viewmats(cond["c2w"], 0)
        mask = causal_mask(
            "teacher_forcing", f, self.tokens_per_frame(h, w), self.frames_per_block,
            device=x_noisy.device, max_prior_blocks=self.window_blocks - 1,
        )
        context = LTXAttentionContext(torch.cat([viewmats, viewmats], 1), torch.cat([cond["K"], cond["K"]], 1),
                                      tuple(cond["image_size"]), attn_mask=mask)
        positions = torch.arange(f)
        zeros = torch.zeros_like(sigma_per_frame)
        sigma_full = torch.cat([zeros, sigma_per_frame], 1)
        r_full = None if r_per_frame is None else torch.cat([zeros, r_per_frame], 1)  # clean history: r = t = 0
        out = self._run(torch.cat([x_clean, x_noisy], 2), sigma_full, r_full, cond["text_embeds"], context,
                        torch.cat([positions, positions]))
        return self._native(out[:, :, f:], x_noisy, sigma_per_frame)

    # ------------------------------------------------------------------ AnyFlow flow map
    def time_embedding(self) -> nn.Module:
        """LTX's ``time_embed.emb.timestep_embedder`` (feeds every block's AdaLN and the output modulation)."""
        return self.transformer.time_embed.emb.timestep_embedder

    def time_features(self, timesteps: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """LTX's sinusoidal projection (``time_embed.emb.time_proj``) of per-frame timesteps ``[B, f]``."""
        proj = self.transformer.time_embed.emb.time_proj(timesteps.flatten())
        return proj.to(like.dtype).reshape(like.shape)

    # ------------------------------------------------------------------ export
    def _export_extra(self, directory: Path) -> None:
        """Save the frozen video connector (and the LTX VAE) so the export is self-contained."""
        self.connector.save_pretrained(directory / "connectors", safe_serialization=True)
        if isinstance(self.codec, LTXVAECodec):
            self.codec.vae.save_pretrained(directory / "vae", safe_serialization=True)
