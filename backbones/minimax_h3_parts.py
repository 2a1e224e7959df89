"""Parts of route ``minimax_h3``: H3's frame rule (17n + 5 frames -> 5n + 2 latents), its codecs and its attention.

The VisualVAE cadence, the lossless patchify codec applied per 17-frame clip and the real
``AutoencoderKLMiniMaxH3`` wrapper; the per-call attention context carried on the rotary tuple and the
self-attention processor (native MM-RoPE on head dims [0:96), fused PRoPE on [96:128) for anchor and
video rows, the KV cache on video rows). The adapter (``solarwm.backbones.minimax_h3``) wires them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Literal

import torch
from diffusers import AutoencoderKLMiniMaxH3
from diffusers.models.transformers.transformer_minimax_h3 import _apply_rotary_emb

from solarwm.backbones.base import AdapterError
from solarwm.backbones.codecs import CodecError, PatchifyCodec
from solarwm.backbones.wan_attention import ContextRotary
from solarwm.kernels.kv_cache import KVCache
from solarwm.kernels.prope import prope_attention
from solarwm.kernels.ulysses import SequenceParallel

#: H3 modality tags (``MINIMAX_H3_MODALITY_NUM`` = 3 in diffusers).
TAG_VIDEO, TAG_TEXT, TAG_AUDIO = 0, 1, 2
#: Pixel frames per VisualVAE clip and its latent cadence.
CLIP_FRAMES = 17
CADENCE = (1, 4, 4, 4, 4)
LATENTS_PER_CLIP = len(CADENCE)
#: Pixel frame (within its clip) that each latent of a clip stands for: the last frame of its group.
_CADENCE_END = tuple(sum(CADENCE[: k + 1]) - 1 for k in range(LATENTS_PER_CLIP))  # (0, 4, 8, 12, 16)
#: File of the silence latent inside an export (when ``audio_silence_path`` was set).
SILENCE_FILE = "audio_silence.safetensors"
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

#: LoRA of the published H3 recipes (reference: rank 384 on the blocks' q/k/v/o + FFN). peft matches by name
#: suffix, so these also adapt the 2 text-refiner blocks (same module names), a small superset of the reference.
H3_LORA_TARGETS = ("attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0", "ff.net.0.proj", "ff.net.2")

#: A few-hundred-k-parameter ``AutoencoderKLMiniMaxH3`` with the published geometry (17n+5 -> 5n+2, 16x).
TINY_H3_VAE_CONFIG: dict[str, Any] = {
    "latent_channels": 8, "block_out_channels": [8, 8, 8, 8, 8, 8], "layers_per_block": 1,
    "norm_num_groups": 4, "decoder_num_layers": 1, "decoder_num_attention_heads": 2,
    "decoder_attention_head_dim": 16, "decoder_num_register_tokens": 1,
    "latents_mean": [0.0] * 8, "latents_std": [1.0] * 8,
}
#: ``h3`` = the diffusers defaults, which are the released VisualVAE geometry (24 channels, 16x, 17-frame clips).
VAE_CONFIGS: dict[str, dict[str, Any]] = {"h3": {}, "tiny": TINY_H3_VAE_CONFIG}


# ---------------------------------------------------------------------------------------------- geometry
def h3_valid_num_frames(num_frames: int) -> bool:
    """True when ``num_frames = 17n + 5`` (n >= 0)."""
    return num_frames >= 5 and (num_frames - 5) % CLIP_FRAMES == 0


def h3_latent_frames(num_frames: int) -> int:
    """``17n + 5 -> 5n + 2``."""
    return LATENTS_PER_CLIP * ((num_frames - 5) // CLIP_FRAMES) + 2


def h3_latent_to_pixel_frame(num_latent_frames: int) -> torch.Tensor:
    """Latent ``5c + k`` -> pixel frame ``17c + (0, 4, 8, 12, 16)[k]`` (the last frame of its cadence group)."""
    idx = torch.arange(num_latent_frames, dtype=torch.long)
    ends = torch.tensor(_CADENCE_END, dtype=torch.long)
    return CLIP_FRAMES * (idx // LATENTS_PER_CLIP) + ends[idx % LATENTS_PER_CLIP]


class H3PatchifyCodec(torch.nn.Module):
    """Lossless codec with H3's temporal cadence (embedded default; no weights).

    The video is cut into 17-frame clips (the last one 5 frames); each clip goes through
    ``PatchifyCodec(temporal=4)`` (17 = 4·4 + 1 -> 5 latents with cadence (1, 4, 4, 4, 4); 5 -> 2 latents).
    A single frame (the image anchor) -> one latent. ``decode(encode(x)) == x`` exactly. Every latent
    decodes on its own (1 frame when its index is a multiple of 5, else 4), so streaming is exact.
    """

    def __init__(self, spatial: int = 2, scale: float = 2.0) -> None:
        super().__init__()
        self.inner = PatchifyCodec(spatial=spatial, temporal=4, scale=scale)
        self.spatial_compression = spatial
        self.temporal_compression = 4
        self.latent_channels = self.inner.latent_channels

    def encode(self, video: torch.Tensor) -> torch.Tensor:
        """``[B, 3, F, H, W]`` with F = 17n + 5 (or 1) -> ``[B, C, 5n + 2 (or 1), H/s, W/s]``."""
        frames = video.shape[2] if video.dim() == 5 else -1
        if frames != 1 and not h3_valid_num_frames(frames):
            raise CodecError(
                f"H3PatchifyCodec.encode: video must be [B, 3, 17n+5 or 1, H, W], got {tuple(video.shape)}"
            )
        chunks = video.split(CLIP_FRAMES, dim=2)
        return torch.cat([self.inner.encode(c) for c in chunks], dim=2)

    def decode_latents(self, latents: torch.Tensor, first_index: int = 0) -> torch.Tensor:
        """Decode latents whose first one has global index ``first_index`` in its clip's latent sequence."""
        x = self.inner._unfold(latents)  # [B, 3, f, 4, H, W]
        frames = []
        for i in range(x.shape[2]):
            group = x[:, :, i]
            if (first_index + i) % LATENTS_PER_CLIP == 0:  # a stand-alone frame stored 4 times: exact mean
                frames.append(((group[:, :, 0:1] + group[:, :, 1:2]) + (group[:, :, 2:3] + group[:, :, 3:4])) / 4)
            else:
                frames.append(group)
        return torch.cat(frames, dim=2)

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Exact inverse of ``encode``: ``[B, C, f, h, w]`` -> ``[B, 3, F, H, W]``."""
        return self.decode_latents(latents, 0)

    def stream_decoder(self) -> Callable[[torch.Tensor], torch.Tensor]:
        """Decode consecutive latent blocks of one clip; concatenated outputs equal ``decode``."""
        state = {"seen": 0}

        def decode_block(latents: torch.Tensor) -> torch.Tensor:
            out = self.decode_latents(latents, state["seen"])
            state["seen"] += latents.shape[2]
            return out

        decode_block.state = state
        return decode_block


class H3VAECodec(torch.nn.Module):
    """``AutoencoderKLMiniMaxH3`` (H3's VisualVAE) between [-1, 1] video and normalised latents."""

    def __init__(self, vae: AutoencoderKLMiniMaxH3) -> None:
        super().__init__()
        self.vae = vae
        cfg = vae.config
        if int(cfg.clip_length) != CLIP_FRAMES or int(vae.temporal_compression_ratio) != 4 or int(cfg.token_drop) != 3:
            raise AdapterError(
                f"minimax_h3: VisualVAE geometry clip_length={cfg.clip_length}, temporal ratio "
                f"{vae.temporal_compression_ratio}, token_drop={cfg.token_drop}; "
                "the route needs 17, 4, 3 (17n+5 -> 5n+2)"
            )
        self.spatial_compression = int(vae.spatial_compression_ratio)
        self.temporal_compression = 4
        self.latent_channels = int(cfg.latent_channels)
        self.register_buffer(
            "mean", torch.tensor(cfg.latents_mean, dtype=torch.float32).view(1, -1, 1, 1, 1), persistent=False
        )
        self.register_buffer(
            "std", torch.tensor(cfg.latents_std, dtype=torch.float32).view(1, -1, 1, 1, 1), persistent=False
        )
        self.register_buffer("pix_mean", torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1, 1), persistent=False)
        self.register_buffer("pix_std", torch.tensor(IMAGENET_STD).view(1, 3, 1, 1, 1), persistent=False)

    def encode(self, video: torch.Tensor) -> torch.Tensor:
        frames = video.shape[2] if video.dim() == 5 else -1
        if frames != 1 and not h3_valid_num_frames(frames):
            raise CodecError(f"H3VAECodec.encode: video must be [B, 3, 17n+5 or 1, H, W], got {tuple(video.shape)}")
        pixels = ((video.float() + 1.0) / 2.0 - self.pix_mean) / self.pix_std
        z = self.vae.encode(pixels).latent_dist.mode().float()
        return (z - self.mean) / self.std

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        z = latents.float() * self.std + self.mean
        frames = None
        if z.shape[2] == 2:
            # diffusers' chunked decoder has no chunk for the shortest clip (5 frames -> 2 latents); pad with the
            # last latent repeated, as it does itself for a partial chunk, and keep the 5 requested frames.
            z, frames = torch.cat([z, z[:, :, -1:].expand(-1, -1, LATENTS_PER_CLIP, -1, -1)], 2), 5
        pixels = self.vae.decode(z).sample.float() * self.pix_std + self.pix_mean
        if frames is not None:
            pixels = pixels[:, :, :frames]
        return pixels * 2.0 - 1.0


# ---------------------------------------------------------------------------------------------- attention
@dataclass
class H3AttentionContext:
    """One call's attention state, attached to the rotary tuple H3 hands to every block.

    The packed sequence is ``batch`` documents of ``rows`` rows folded into one. ``viewmats``/``K``: per-row
    query cameras ``[B, rows, 4, 4]`` / ``[B, rows, 4]`` (identity on text/audio rows). ``attn_mask``: dense bool
    ``[rows, kv_rows]`` or ``[B, 1, rows, kv_rows]`` (None: full attention). With a ``cache``: ``prefix_rows``
    rows of every document are the prefix (never cached), the rest are the query block; keys are
    ``[prefix | cached video | query video]`` with cameras ``kv_viewmats``/``kv_K`` and rotary positions
    ``kv_position_ids``.
    """

    batch: int
    viewmats: torch.Tensor
    K: torch.Tensor
    image_size: tuple[int, int]
    attn_mask: torch.Tensor | None = None
    prefix_rows: int = 0
    cache: KVCache | None = None
    commit: bool = False
    kv_viewmats: torch.Tensor | None = None
    kv_K: torch.Tensor | None = None
    kv_position_ids: torch.Tensor | None = None
    kv_freqs: tuple[torch.Tensor, torch.Tensor] | None = None  # filled by the rope hook
    sequence_tokens: int | None = None  # packed rows, filled by the sequence-parallel block hook


def attach_h3_context(rope: torch.nn.Module, args: tuple, output: tuple) -> tuple:
    """Forward hook on ``transformer.rope``: attach the call's context (and the window's rotary tables)."""
    context: H3AttentionContext | None = getattr(rope, "_solarwm_context", None)
    if context is None:
        return output
    if context.kv_position_ids is not None:
        context.kv_freqs = rope.forward(context.kv_position_ids.to(args[0].device))  # .forward: no hook recursion
    wrapped = ContextRotary(output)
    wrapped.context = context
    return wrapped


class H3PRoPEAttnProcessor:
    """Self-attention of ``MiniMaxH3TransformerBlock``: MiniMaxH3AttnProcessor's math + fused PRoPE (+ KV cache).

    q/k/v projections, per-head RMS norms and MM-RoPE (dims [0, 6·rope_freq_dim)) exactly as the native
    processor, then ``prope_attention`` with PRoPE on ``head_dims`` only. One instance per block.
    """

    def __init__(self, head_dims: tuple[int, int], layer_index: int = 0) -> None:
        self.head_dims = slice(*head_dims)
        self.layer_index = layer_index
        self.sequence_parallel: SequenceParallel | None = None  # Ulysses group (backbones.sequence_parallel)

    def __call__(
        self,
        attn: torch.nn.Module,
        hidden_states: torch.Tensor,
        rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None,
        attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        ctx: H3AttentionContext | None = getattr(rotary_emb, "context", None)
        if ctx is None:
            raise AdapterError(
                "minimax_h3: camera condition missing in self-attention: call the adapter (it packs the "
                "sequence and sets the cameras), not the bare transformer"
            )
        if getattr(attn, "fused_projections", False):
            query, key, value = attn.to_qkv(hidden_states).chunk(3, dim=-1)
        else:
            query, key, value = attn.to_q(hidden_states), attn.to_k(hidden_states), attn.to_v(hidden_states)
        b = ctx.batch
        sp = self.sequence_parallel
        if sp is None:
            rows, heads = hidden_states.shape[1] // b, attn.heads
            # Unfold the documents: [1, B*rows, H*D] -> [B, rows, H, D].
            query = attn.norm_q(query.reshape(b, rows, heads, -1))
            key = attn.norm_k(key.reshape(b, rows, heads, -1))
            value = value.reshape(b, rows, heads, -1)
        else:
            # This rank's packed rows [1, N/P, H, D] -> all rows of H/P heads [1, N, H/P, D] (the norms are per head).
            rows, heads = ctx.sequence_tokens // b, attn.heads // sp.size
            split = hidden_states.shape[:2] + (attn.heads, -1)
            qkv = (attn.norm_q(query.reshape(split)), attn.norm_k(key.reshape(split)), value.reshape(split))
            query, key, value = (sp.to_heads(t, ctx.sequence_tokens).reshape(b, rows, heads, -1) for t in qkv)
        cos, sin = rotary_emb[0][:rows], rotary_emb[1][:rows]  # every document has the same layout
        query = _apply_rotary_emb(query, cos, sin)
        if ctx.cache is None:
            key = _apply_rotary_emb(key, cos, sin)
            kv_viewmats, kv_K = ctx.viewmats, ctx.K
        else:
            p = ctx.prefix_rows
            if ctx.commit:
                ctx.cache.stage(self.layer_index, key[:, p:], value[:, p:])  # un-roped video K/V
            past_k, past_v = ctx.cache.layer(self.layer_index)
            if past_k is not None:
                key = torch.cat([key[:, :p], past_k.to(key.dtype), key[:, p:]], 1)
                value = torch.cat([value[:, :p], past_v.to(value.dtype), value[:, p:]], 1)
            key = _apply_rotary_emb(key, *ctx.kv_freqs)
            kv_viewmats, kv_K = ctx.kv_viewmats, ctx.kv_K
        mask = attention_mask if attention_mask is not None else ctx.attn_mask
        out = prope_attention(
            query.transpose(1, 2),
            key.transpose(1, 2),
            value.transpose(1, 2),
            ctx.viewmats,
            ctx.K,
            kv_viewmats,
            kv_K,
            ctx.image_size,
            head_dims=self.head_dims,
            attn_mask=mask,
        )
        out = out.transpose(1, 2).reshape(1, b * rows, heads, -1)
        if sp is not None:
            out = sp.to_tokens(out)
        out = out.flatten(2, 3).type_as(query)
        out = attn.to_out[0](out)
        return attn.to_out[1](out)


# ---------------------------------------------------------------------------------------------- config
@dataclass
class MiniMaxH3Config:
    """Config of the route; ``published()`` is the 33B H3 Omni Transformer, ``tiny()`` the same classes for a CPU."""

    num_layers: int = 2
    num_refiner_layers: int = 1
    num_attention_heads: int = 2
    attention_head_dim: int = 128
    hidden_size: int = 256
    ffn_dim: int = 512
    audio_in_channels: int = 8
    patch_size: tuple[int, int, int] = (1, 2, 2)
    text_dim: int = 32
    freq_dim: int = 32
    time_embed_hidden_dim: int = 128
    time_embed_dim: int = 64
    rope_freq_dim: int = 16
    #: ``h3_patchify``: lossless, H3's cadence (embedded default); ``h3_vae``: AutoencoderKLMiniMaxH3.
    codec: Literal["h3_vae", "h3_patchify"] = "h3_patchify"
    patchify_spatial: int = 2
    #: AutoencoderKLMiniMaxH3 config used when no ``pretrained_path`` gives ``vae/``: ``h3`` or ``tiny``.
    vae_config: Literal["h3", "tiny"] = "tiny"
    #: ``hashing``: HashingTextEncoder (embedded default); ``none``: batches carry precomputed Qwen ``text_embeds``.
    text_encoder: Literal["hashing", "none"] = "hashing"
    text_max_length: int = 16
    #: Silent audio rows (a permanent condition, zero loss) and their source (None: zeros).
    audio_rows: int = 4
    audio_silence_path: str | None = None
    #: AudioVAE latents per second and the video frame rate (time-align the audio rows' positions).
    audio_latents_per_second: float = 40.0
    fps: float = 24.0
    #: Native H3 times of the condition rows (t = 1 clean): anchor (keyframe_timestep) and audio.
    anchor_t: float = 0.999
    audio_t: float = 1.0
    #: Flow timestep shift on sigma (H3: 12).
    shift: float = 3.0
    #: ``(start, stop)`` head dims that get PRoPE; must not overlap the MM-RoPE dims [0, 6·rope_freq_dim).
    camera_head_dims: tuple[int, int] = (96, 128)

    def __post_init__(self) -> None:
        self.patch_size = tuple(self.patch_size)
        self.camera_head_dims = tuple(self.camera_head_dims)

    @classmethod
    def tiny(cls) -> "MiniMaxH3Config":
        """2 layers, 2 heads x 128 (MM-RoPE [0:96), PRoPE [96:128)), hidden 256, patchify codec, hashing text."""
        return cls()

    @classmethod
    def published(cls) -> "MiniMaxH3Config":
        """The H3 Omni Transformer (33.1 B): 50 layers, 56 heads x 128, hidden 5376, ffn 14336, Qwen 5120-d rows."""
        return cls(
            num_layers=50,
            num_refiner_layers=2,
            num_attention_heads=56,
            attention_head_dim=128,
            hidden_size=5376,
            ffn_dim=14336,
            audio_in_channels=32,
            text_dim=5120,
            freq_dim=256,
            time_embed_hidden_dim=5376,
            time_embed_dim=2688,
            rope_freq_dim=16,
            codec="h3_vae",
            vae_config="h3",
            text_encoder="none",
            text_max_length=512,
            audio_rows=math.ceil(158 / 24.0 * 40.0),
            shift=12.0,
        )

    def transformer_kwargs(self, in_channels: int) -> dict[str, Any]:
        """Keyword arguments of ``MiniMaxH3Transformer3DModel`` for this config."""
        return dict(
            num_attention_heads=self.num_attention_heads,
            attention_head_dim=self.attention_head_dim,
            hidden_size=self.hidden_size,
            num_layers=self.num_layers,
            num_refiner_layers=self.num_refiner_layers,
            ffn_dim=self.ffn_dim,
            in_channels=in_channels,
            audio_in_channels=self.audio_in_channels,
            patch_size=self.patch_size,
            text_dim=self.text_dim,
            freq_dim=self.freq_dim,
            time_embed_hidden_dim=self.time_embed_hidden_dim,
            time_embed_dim=self.time_embed_dim,
            rope_freq_dim=self.rope_freq_dim,
        )
