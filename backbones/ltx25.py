"""Route ``ltx25``: SolarWM-ltx-2.5-22B on diffusers' LTX-2 classes, used video-only (paper §6.2, Table 4).

**Video-only construction.** LTX-2.5 ships as an audio-visual checkpoint, and diffusers'
``LTX2VideoTransformer3DModel`` cannot run without audio (every block builds and runs its audio stream). So
``LTX25VideoTransformer3DModel`` builds only the video submodules, *the diffusers classes themselves*
(``LTX2Attention``, ``FeedForward``, ``RMSNorm``, ``LTX2AdaLayerNormSingle``, ``LTX2AudioVideoRotaryPosEmbed``)
under the class's own attribute names, so a published checkpoint's video keys load 1:1, and calls them in the
order ``LTX2VideoTransformer3DModel.forward`` does with ``isolate_modalities=True``. The audio stream, the
audio-video cross-attention and the audio connector are neither built nor loaded (the loader reads only the video
keys, ``safe_open`` key by key). ``tests/backbones/test_route_ltx25.py`` checks that the video path equals the full
class's video output on weights loaded from a full AV checkpoint. Parameter counts: docs/architecture.md, LTX-2.5.

**Codec.** ``AutoencoderKLLTX2Video`` (``codec="ltx_vae"``): 8x temporal, 32x spatial, 128 channels, the first
frame encoded alone, so a clip has 8n + 1 frames and latent i stands for pixel frame 8i. Latents are normalised as
the LTX-2 pipelines do. The embedded CPU default is a lossless ``PatchifyCodec(spatial=config.patchify_spatial,
temporal=8)`` with the same temporal rule (spatial 4 in the tiny route: spatial 32 would make 24,576 channels).

**Conditioning.** LTX's native first-frame latent: the first latent is clean (``clean_latent_frames = 1``),
timestep 0 on its tokens, excluded from the loss (as in ``LTX2ConditionPipeline``).

**Objective and timesteps.** Rectified flow as the base class. The transformer takes timesteps already multiplied
by 1000 (the pipelines pass ``t = 1000 sigma``), so ``timestep_scale = 1000``, the prompt AdaLN included. Shift
``e^2.05``: the pipelines' ``calculate_shift`` gives ``mu = 2.05`` at every training size here.

**Per-frame timesteps.** Cameras, AdaLN timesteps *and* the prompt K/V modulation are per latent frame, because a
causal layout holds clean and noisy frames in one call and the committed history must match the rollout's commit
pass: the text cross-attention runs once per group of frames sharing a sigma (exact: cross-attention queries are
independent). The one deviation from the pipeline: the clean first latent's prompt modulation uses its own sigma 0.

**Text.** Cached Gemma features ``[B, L, 4096]`` (the output of ``video_text_proj_in``) in ``text_embeds`` go through
the frozen video connector (``LTX2ConnectorTransformer1d``) to the text cross-attention. The embedded default hashes
captions (``HashingTextEncoder``) at the connector's width; ``text_encoder="gemma"`` (the published preset)
computes the same features from the checkpoint's Gemma (``GemmaFeatureEncoder``); a batch's ``text_embeds`` always
take precedence.

**Camera.** ``PRoPELTXAttnProcessor`` on every video self-attention (``attn1``) does the class's own math with
``solarwm.kernels.prope.prope_attention`` in place of plain attention; with one camera for all frames it equals
``LTX2AudioVideoAttnProcessor`` (tested). Text cross-attention is untouched.

**RoPE on read.** LTX's 3D RoPE works on fractional pixel-space coordinates (latent frame i covers pixel frames
``[8i - 7, 8i + 1)``, the first latent ``[0, 1)``). The KV cache stores un-roped keys; every read ropes the window at
window-local positions, shifted by one once the clip's first latent has left the window, so that only the first
latent gets the one-frame clamp. Within the window the rollout uses teacher forcing's positions exactly (tested).

**Causal mode: ``frames_per_block = 2`` latent frames (16 pixel frames), ``window_blocks = 6``.** No official value
exists for LTX-2.5; these match the two official causal routes' cadence (an update every ~0.7 s, a ~4 s window).
The arithmetic: docs/architecture.md, LTX-2.5.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn as nn
from diffusers import AutoencoderKLLTX2Video

from solarwm.backbones.base import AdapterError, BackboneAdapter, CacheWindow
from solarwm.backbones.codecs import PatchifyCodec
from solarwm.backbones.lora import LoRAConfig
from solarwm.backbones.ltx25_model import (
    ContextRotary,
    LTX25VideoTextConnector,
    LTX25VideoTransformer3DModel,
    LTXAttentionContext,
    PRoPELTXAttnProcessor,
    ltx_rope_freqs,
)
from solarwm.backbones.ltx25_parts import GemmaFeatureEncoder, LTXVAECodec, load_selected, read_json
from solarwm.backbones.pretrained import check_config_keys, load_vae
from solarwm.backbones.text import HashingTextEncoder, zero_padding
from solarwm.kernels.kv_cache import KVCache

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
    prediction: Literal["velocity", "x0", "x0_skip"] = "velocity"
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
    transformer_block = "solarwm.backbones.ltx25_model:LTX25VideoBlock"
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
        super().__init__(config=config, preset=preset, pretrained_path=pretrained_path, device=device, lora=lora)

    # ------------------------------------------------------------------ building
    def check_config(self, config: LTX25Config) -> None:
        """The connector's width must be the cross-attention's."""
        connector_width = config.connector_num_attention_heads * config.connector_attention_head_dim
        if connector_width != config.cross_attention_dim:
            raise AdapterError(
                f"{self.route}: the connector's width {connector_width} (heads x head dim) must equal "
                f"cross_attention_dim {config.cross_attention_dim}"
            )

    def _build_model(self, root: Path | None, meta: bool) -> None:
        self.transformer = self._build_transformer(root, meta=meta)
        self.connector = self._build_connector(root, meta=meta)

    def _build_extras(self, root: Path | None, device: str | None) -> None:
        if root is not None and device not in (None, "meta"):  # checkpoint tensors are read on the CPU
            self.transformer.to(device)
            self.connector.to(device)

    def install_processors(self) -> None:
        for index, block in enumerate(self.transformer.transformer_blocks):
            block.attn1.set_processor(PRoPELTXAttnProcessor(self.config.camera_head_dims, layer_index=index))

    def _build_codec(self, root: Path | None) -> nn.Module:
        cfg = self.config
        if cfg.codec == "patchify":
            return PatchifyCodec(spatial=cfg.patchify_spatial, temporal=8)
        if cfg.codec != "ltx_vae":
            raise AdapterError(f"{self.route}: unknown codec {cfg.codec!r}; expected 'ltx_vae' or 'patchify'")
        vae = load_vae(self.route, AutoencoderKLLTX2Video, root, cfg.codec, cfg.vae_config, VAE_CONFIGS)
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
        found = read_json(tdir / "config.json")
        check_config_keys(self.route, tdir, found, expected, (
            "num_layers", "num_attention_heads", "attention_head_dim", "in_channels", "out_channels",
            "cross_attention_dim", "gated_attn", "cross_attn_mod", "ff_bias", "rope_type", "use_prompt_embeddings",
            "use_prompt_adaln_single", "use_keyframes_abs_pos_embedding", "patch_size", "patch_size_t",
        ))
        with torch.device("meta"):
            model = LTX25VideoTransformer3DModel(**expected)
        if not meta:
            load_selected(model, tdir)
        return model

    def _build_connector(self, root: Path | None, meta: bool = False) -> LTX25VideoTextConnector:
        expected = self.config.connector_kwargs()
        if root is None:
            return LTX25VideoTextConnector(**expected)
        cdir = root / "connectors"
        if not (cdir / "config.json").is_file():
            raise AdapterError(f"{self.route}: {cdir} missing or has no config.json (the frozen text connector)")
        check_config_keys(self.route, cdir, read_json(cdir / "config.json"), expected, tuple(expected))
        with torch.device("meta"):
            connector = LTX25VideoTextConnector(**expected)
        if not meta:
            load_selected(connector, cdir)
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

    def attention_context(
        self, x_t: torch.Tensor, cond: dict[str, Any], attn_mask: torch.Tensor | None
    ) -> tuple[LTXAttentionContext, torch.Tensor]:
        """All frames at positions ``0..f-1``, cameras relative to the first."""
        context = LTXAttentionContext(self.window_viewmats(cond["c2w"], 0), cond["K"], tuple(cond["image_size"]),
                                      attn_mask=attn_mask)
        return context, torch.arange(x_t.shape[2])

    def cached_attention_context(
        self, x_t: torch.Tensor, cond: dict[str, Any], window: CacheWindow, cache: KVCache, commit: bool
    ) -> tuple[LTXAttentionContext, torch.Tensor]:
        """Window = cached frames then the query block, cameras relative to the query block, RoPE at
        window-local positions (shifted by one once the clip's first latent has left the window)."""
        start = window.start
        viewmats = self.window_viewmats(window.c2w, start)
        kv_positions = torch.arange(window.width) + int(window.first_evicted)
        context = LTXAttentionContext(
            viewmats[:, start:], window.K[:, start:], tuple(cond["image_size"]), cache=cache,
            commit=commit, kv_viewmats=viewmats, kv_K=window.K, kv_freqs=self.rope_freqs(kv_positions, x_t),
        )
        return context, kv_positions[start:]

    def teacher_forcing_context(self, x_noisy: torch.Tensor,
                                cond: dict[str, Any]) -> tuple[LTXAttentionContext, torch.Tensor]:
        """Both copies at positions ``0..f-1`` with the same cameras, under the teacher-forcing mask."""
        viewmats = self.window_viewmats(cond["c2w"], 0)
        context = LTXAttentionContext(torch.cat([viewmats, viewmats], 1), torch.cat([cond["K"], cond["K"]], 1),
                                      tuple(cond["image_size"]), attn_mask=self.teacher_forcing_mask(x_noisy))
        positions = torch.arange(x_noisy.shape[2])
        return context, torch.cat([positions, positions])

    def run_transformer(
        self,
        x: torch.Tensor,
        sigma_per_frame: torch.Tensor,
        r_per_frame: torch.Tensor | None,
        cond: dict[str, Any],
        context: tuple[LTXAttentionContext, torch.Tensor],
        copies: int = 1,
    ) -> torch.Tensor:
        """The video transformer on ``x [B, C, f, h, w]`` at per-frame timesteps ``1000·sigma``; RoPE at the
        context's positions."""
        context, positions = context
        timestep = sigma_per_frame.float() * self.timestep_scale
        rotary = ContextRotary(self.rope_freqs(positions, x))
        rotary.context = context
        if r_per_frame is not None:
            self._flow_map_r = r_per_frame.float() * self.timestep_scale
        dtype = self.transformer.dtype
        try:
            out = self.transformer(
                hidden_states=x.to(dtype), encoder_hidden_states=cond["text_embeds"].to(dtype), timestep=timestep,
                prompt_timestep=timestep, video_rotary_emb=rotary, frame_groups=frame_groups(sigma_per_frame),
            )
        finally:
            self._flow_map_r = None
        return out.to(x.dtype)

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
