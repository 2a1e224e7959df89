"""What every Wan route shares: the config fields, building and checking the diffusers parts, the model call.

``WanAdapterBase`` implements ``BackboneAdapter`` for diffusers' ``WanTransformer3DModel`` with fused-PRoPE
self-attention (``solarwm.backbones.wan_attention``): codec (``PatchifyCodec`` or ``AutoencoderKLWan`` via
``WanVAECodec``), text encoder (hashing or UMT5), checkpoint checks, per-token timesteps, the uncached /
cached / teacher-forced forward, the AnyFlow time embedding and the export. A route subclass sets its
config class, its VAE configs and what differs: extra transformer input channels (``channel_conditions``,
e.g. the I2V image condition ``y``), extra ``cond`` entries (``prepare_conditions``) and its anchor rule.

Per-frame conditions. ``cond`` entries named in ``per_frame_conditions`` are indexed ``[B, f, ...]`` by
latent frame (cameras ``c2w``/``K``; the I2V route's ``y``); a causal rollout hands each block the slice
``[:, block]`` of each of them (``solarwm.rollout.engine.block_conditions``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

import torch
from diffusers import AutoencoderKLWan, WanTransformer3DModel

from solarwm.backbones.base import AdapterError, BackboneAdapter, CacheWindow
from solarwm.backbones.codecs import PatchifyCodec, WanVAECodec
from solarwm.backbones.pretrained import load_transformer, load_vae
from solarwm.backbones.text import HashingTextEncoder, UMT5TextEncoder
from solarwm.backbones.wan_attention import AttentionContext, PRoPEWanAttnProcessor, attach_context
from solarwm.kernels.kv_cache import KVCache


@dataclass
class WanRouteConfig:
    """Fields every Wan route config has; routes subclass it with their defaults, ``tiny()`` and ``published()``."""

    num_layers: int = 2
    num_attention_heads: int = 4
    attention_head_dim: int = 64
    ffn_dim: int = 512
    text_dim: int = 32
    freq_dim: int = 32
    patch_size: tuple[int, int, int] = (1, 2, 2)
    rope_max_seq_len: int = 1024
    #: ``patchify``: lossless space/time-to-depth (embedded default); ``wan_vae``: AutoencoderKLWan.
    codec: Literal["wan_vae", "patchify"] = "patchify"
    #: Spatial factor of the patchify codec (``3 * 4 * s * s`` latent channels). The hidden size (heads x
    #: head dim) must be at least the token size, or the model cannot represent the noise it has to remove.
    patchify_spatial: int = 2
    #: AutoencoderKLWan config (a key of the route's ``vae_configs``) used when no ``pretrained_path`` gives ``vae/``.
    vae_config: str = "tiny"
    #: ``hashing``: HashingTextEncoder; ``umt5``: UMT5 from ``text_encoder_path`` (or pretrained_path);
    #: ``none``: batches must carry precomputed ``text_embeds``.
    text_encoder: Literal["hashing", "umt5", "none"] = "hashing"
    text_encoder_path: str | None = None
    text_max_length: int = 16
    #: Flow timestep shift (Wan: 5.0 at 720p/480p for the released models; smaller for small frames).
    shift: float = 3.0
    #: What the transformer's output means. ``velocity``: Wan's native ε − x₀ (pretrained weights).
    #: ``x0``: the network predicts the clean latent and the adapter returns the velocity
    #: (x_t − x̂₀)/σ, so the loss stays the native flow target. With tokens wider than the hidden
    #: size (a tiny route) a network cannot carry the noise through to predict ε − x₀, but it
    #: can predict x₀ (Li & He 2025, "Back to Basics: Let Denoising Generative Models Denoise").
    #: ``x0_skip``: x₀ with EDM's skip connection (``backbones.base.x0_skip_velocity``): at small σ the
    #: estimate is x_t itself, so the network need not learn the identity.
    prediction: Literal["velocity", "x0", "x0_skip"] = "velocity"
    #: ``(start, stop)`` head dims that get PRoPE; ``None`` = all dims of every head.
    camera_head_dims: tuple[int, int] | None = None
    #: Whose camera a latent frame carries. ``group_last``: pixel frame ``4i``, the last of the frames it
    #: decodes to (ours). ``group_first``: ``4i - 3`` for ``i >= 1`` and frame 0 for latent 0, the first of its
    #: group, as the official SolarWM release was trained (Junchao-cs/SolarWM
    #: ``src/solarwm/backends/wan22/runtime/data.py`` ``latent_aligned_pixel_indices``).
    latent_camera: Literal["group_last", "group_first"] = "group_last"
    #: The intrinsics PRoPE sees. ``per_frame``: each frame's K (ours). ``wan_fixed``: the official fixed
    #: normalised focal lengths (969.69.../1920, 969.69.../1080, centred), the batch's K ignored (same file).
    intrinsics: Literal["per_frame", "wan_fixed"] = "per_frame"
    #: ``bfloat16``: the transformer sees timesteps rounded to bf16, as the official stage-2 sampler feeds them
    #: (Junchao-cs/SolarWM ``.../wan22/runtime/stage2.py``); ``none``: exact (ours, and the official training).
    timestep_rounding: Literal["none", "bfloat16"] = "none"

    def __post_init__(self) -> None:
        # JSON round trips turn tuples into lists.
        self.patch_size = tuple(self.patch_size)
        if self.camera_head_dims is not None:
            self.camera_head_dims = tuple(self.camera_head_dims)

    def transformer_kwargs(self, in_channels: int, out_channels: int | None = None) -> dict[str, Any]:
        """Keyword args of ``WanTransformer3DModel`` for this config (``out_channels`` defaults to ``in_channels``)."""
        return dict(
            patch_size=self.patch_size,
            num_attention_heads=self.num_attention_heads,
            attention_head_dim=self.attention_head_dim,
            in_channels=in_channels,
            out_channels=in_channels if out_channels is None else out_channels,
            text_dim=self.text_dim,
            freq_dim=self.freq_dim,
            ffn_dim=self.ffn_dim,
            num_layers=self.num_layers,
            cross_attn_norm=True,
            qk_norm="rms_norm_across_heads",
            eps=1e-6,
            image_dim=None,
            added_kv_proj_dim=None,
            rope_max_seq_len=self.rope_max_seq_len,
        )


#: Transformer config keys a checkpoint must match.
_CHECKED_KEYS = (
    "num_layers",
    "num_attention_heads",
    "attention_head_dim",
    "in_channels",
    "out_channels",
    "text_dim",
    "ffn_dim",
    "freq_dim",
    "patch_size",
    "image_dim",
)


class WanAdapterBase(BackboneAdapter):
    """``BackboneAdapter`` for diffusers' ``WanTransformer3DModel`` + a Wan codec + a text encoder (module docstring).

    ``config`` (default: ``preset``'s config); ``pretrained_path``: a local diffusers checkpoint folder with
    ``transformer/`` (and ``vae/`` for ``codec="wan_vae"``; ``text_encoder/`` + ``tokenizer/`` for UMT5);
    ``device`` builds the codec and transformer under ``torch.device(device)`` (``"meta"``: no weights
    allocated, for parameter counting); ``lora``: LoRA on the transformer (``BackboneAdapter.enable_lora``).
    """

    config_class: ClassVar[type[WanRouteConfig]]
    transformer_block = "diffusers.models.transformers.transformer_wan:WanTransformerBlock"
    #: ``vae_config`` name -> AutoencoderKLWan config.
    vae_configs: ClassVar[dict[str, dict[str, Any]]] = {}
    #: Spatial factor the route's VAE must have (Wan2.2 VAE: 16, Wan2.1 VAE: 8).
    vae_spatial_compression: ClassVar[int] = 16
    timestep_scale = 1000.0
    patch_size = 2
    supports_sink = True

    # ------------------------------------------------------------------ building
    def install_processors(self) -> None:
        """Fused PRoPE on every ``attn1`` (fused-PRoPE adds no weights); the rotary hook carries the context."""
        for index, block in enumerate(self.transformer.blocks):
            block.attn1.set_processor(PRoPEWanAttnProcessor(self.config.camera_head_dims, layer_index=index))
        self.transformer.rope.register_forward_hook(attach_context)
        self.transformer.rope._solarwm_context = None

    def transformer_channels(self) -> tuple[int, int]:
        """``(in_channels, out_channels)`` of the transformer; default: the latent channels both ways."""
        return self.latent_channels, self.latent_channels

    def _build_codec(self, root: Path | None) -> torch.nn.Module:
        cfg = self.config
        if cfg.codec == "patchify":
            return PatchifyCodec(spatial=cfg.patchify_spatial, temporal=4)
        if cfg.codec != "wan_vae":
            raise AdapterError(f"{self.route}: unknown codec {cfg.codec!r}; expected 'wan_vae' or 'patchify'")
        vae = load_vae(self.route, AutoencoderKLWan, root, cfg.codec, cfg.vae_config, self.vae_configs)
        if int(vae.config.scale_factor_temporal) != 4:
            raise AdapterError(f"{self.route}: VAE temporal factor {vae.config.scale_factor_temporal} != 4")
        if int(vae.config.scale_factor_spatial) != self.vae_spatial_compression:
            raise AdapterError(
                f"{self.route}: VAE spatial factor {vae.config.scale_factor_spatial} != {self.vae_spatial_compression} "
                "(a VAE of another Wan route?)"
            )
        return WanVAECodec(vae)

    def _build_model(self, root: Path | None, meta: bool) -> None:
        expected = self.config.transformer_kwargs(*self.transformer_channels())
        layout = "transformer/ (and vae/ for codec='wan_vae')"
        self.transformer = load_transformer(self.route, WanTransformer3DModel, root, expected, _CHECKED_KEYS, layout)

    def _build_text_encoder(self, root: Path | None, meta: bool) -> torch.nn.Module | None:
        cfg = self.config
        if cfg.text_encoder == "none":
            return None
        if cfg.text_encoder == "hashing":
            return HashingTextEncoder(cfg.text_dim, max_length=cfg.text_max_length)
        if cfg.text_encoder != "umt5":
            raise AdapterError(f"{self.route}: unknown text_encoder {cfg.text_encoder!r}")
        path = cfg.text_encoder_path or (str(root) if root is not None else None)
        if path is None:
            raise AdapterError(
                f"{self.route}: text_encoder='umt5' needs text_encoder_path or a pretrained_path with text_encoder/"
            )
        # Record the resolved folder so an export (which does not copy UMT5) reloads the same encoder.
        cfg.text_encoder_path = str(Path(path).resolve())
        return UMT5TextEncoder(path, max_length=cfg.text_max_length)

    # ------------------------------------------------------------------ conditions
    def prepare_conditions(self, batch: dict[str, Any]) -> dict[str, Any]:
        """Text features + the camera of each latent frame (c2w ``[B, f, 4, 4]`` float64, pixel ``K [B, f, 4]``)."""
        c2w, K = self.latent_cameras(batch["c2w"], batch["K"])
        embeds, mask = self.text_features(batch)
        device = batch["c2w"].device
        return {
            "text_embeds": embeds.to(device),
            "text_mask": mask.to(device) if mask is not None else None,
            "c2w": c2w,
            "K": K,
            "image_size": self._image_size(batch),
            "num_frames": batch["c2w"].shape[1],
        }

    def channel_conditions(self, cond: dict[str, Any]) -> torch.Tensor | None:
        """Extra transformer input channels ``[B, c, f, h, w]`` concatenated after ``x_t`` (route hook; I2V: ``y``)."""
        return None

    # ------------------------------------------------------------------ model call
    def latent_camera_frames(self, num_latent_frames: int) -> torch.Tensor:
        """LongTensor ``[f]``: the pixel frame whose camera latent frame i carries (``config.latent_camera``)."""
        last = self.latent_to_pixel_frame(num_latent_frames)
        if self.config.latent_camera == "group_last":
            return last
        return (last - (self.temporal_compression - 1)).clamp_min(0)  # 4i - 3; latent 0 stays frame 0

    def prope_K(self, K: torch.Tensor, image_size: tuple[int, int]) -> torch.Tensor:
        """The pixel intrinsics ``[B, f, 4]`` PRoPE sees: ``K``, or the official fixed ones (``config.intrinsics``).

        PRoPE normalises by the image size and centres the principal point, so the fixed pixel K
        ``(fx·W, fy·H, W/2, H/2)`` is exactly the official focal-only ``diag(fx, fy, 1)`` (3a1b2c3/SolarWM
        ``src/solarwm/backends/wan22/modeling/camera_prope.py``).
        """
        if self.config.intrinsics == "per_frame":
            return K
        from solarwm.backbones.official import WAN_FIXED_FX, WAN_FIXED_FY

        width, height = image_size
        fixed = torch.tensor(
            [WAN_FIXED_FX * width, WAN_FIXED_FY * height, width / 2, height / 2], dtype=K.dtype, device=K.device
        )
        return fixed.expand(K.shape)

    def attention_context(
        self, x_t: torch.Tensor, cond: dict[str, Any], attn_mask: torch.Tensor | None
    ) -> AttentionContext:
        """All frames at positions ``0..f-1``, cameras relative to the first."""
        return AttentionContext(
            self.window_viewmats(cond["c2w"], 0),
            self.prope_K(cond["K"], cond["image_size"]),
            tuple(cond["image_size"]),
            positions=torch.arange(x_t.shape[2]),
            attn_mask=attn_mask,
        )

    def cached_attention_context(
        self, x_t: torch.Tensor, cond: dict[str, Any], window: CacheWindow, cache: KVCache, commit: bool
    ) -> AttentionContext:
        """Window = cached frames then the query block, at positions 0..W-1 (a sink apart: ``CacheWindow.positions``),
        cameras relative to the query block."""
        start = window.start
        viewmats = self.window_viewmats(window.c2w, start)
        K = self.prope_K(window.K, cond["image_size"])
        kv_positions = window.positions(self.frames_per_block)
        return AttentionContext(
            viewmats[:, start:],
            K[:, start:],
            tuple(cond["image_size"]),
            positions=kv_positions[start:],
            cache=cache,
            commit=commit,
            kv_viewmats=viewmats,
            kv_K=K,
            kv_positions=kv_positions,
        )

    def teacher_forcing_context(self, x_noisy: torch.Tensor, cond: dict[str, Any]) -> AttentionContext:
        """Both copies at positions ``0..f-1`` with the same cameras, under the teacher-forcing mask."""
        viewmats = self.window_viewmats(cond["c2w"], 0)
        positions = torch.arange(x_noisy.shape[2])
        K = self.prope_K(cond["K"], cond["image_size"])
        return AttentionContext(
            torch.cat([viewmats, viewmats], 1),
            torch.cat([K, K], 1),
            tuple(cond["image_size"]),
            positions=torch.cat([positions, positions]),
            attn_mask=self.teacher_forcing_mask(x_noisy),
        )

    def run_transformer(
        self,
        x: torch.Tensor,
        sigma_per_frame: torch.Tensor,
        r_per_frame: torch.Tensor | None,
        cond: dict[str, Any],
        context: AttentionContext,
        copies: int = 1,
    ) -> torch.Tensor:
        """The diffusers transformer on ``x [B, C, f, h, w]``: per-token timesteps ``1000·sigma`` of each frame.

        The per-frame channel conditions (I2V: ``y``) are repeated ``copies`` times along the frames.
        """
        extra = self.channel_conditions(cond)
        if extra is not None:
            x_in = torch.cat([x, torch.cat([extra.to(x.dtype)] * copies, 2)], 1)
        else:
            x_in = x
        tpf = self.tokens_per_frame(*x.shape[-2:])
        # Per-token timesteps [B, f*h*w/p^2] (diffusers' expand_timesteps path; clean frames get 0).
        timestep = self.model_timesteps(sigma_per_frame).repeat_interleave(tpf, dim=1)
        rope = self.transformer.rope
        rope._solarwm_context = context
        if r_per_frame is not None:
            self._flow_map_r = self.model_timesteps(r_per_frame).repeat_interleave(tpf, dim=1)
        dtype = self.transformer.dtype
        try:
            out = self.transformer(
                hidden_states=x_in.to(dtype),
                timestep=timestep,
                encoder_hidden_states=cond["text_embeds"].to(dtype),
                return_dict=False,
            )[0]
        finally:
            rope._solarwm_context = None
            self._flow_map_r = None
        return out.to(x.dtype)

    def model_timesteps(self, sigma: torch.Tensor) -> torch.Tensor:
        """float32 model timesteps ``1000·sigma``, rounded through bf16 when ``config.timestep_rounding`` says so."""
        t = sigma.float() * self.timestep_scale
        return t.to(torch.bfloat16).float() if self.config.timestep_rounding == "bfloat16" else t

    def sampler_sigma(self, sigma: torch.Tensor) -> torch.Tensor:
        """``sigma``, or with bf16 timesteps the σ the model was told (the official stage-2 sampler's x0 step)."""
        if self.config.timestep_rounding == "none":
            return sigma
        return self.model_timesteps(torch.as_tensor(sigma)) / self.timestep_scale

    # ------------------------------------------------------------------ AnyFlow flow map
    def time_embedding(self) -> torch.nn.Module:
        """Wan's ``condition_embedder.time_embedder`` (feeds every block's AdaLN and the head)."""
        return self.transformer.condition_embedder.time_embedder

    def time_features(self, timesteps: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """Wan's sinusoidal projection of per-token timesteps ``[B, N]`` -> ``[B, N, freq_dim]`` like ``like``."""
        proj = self.transformer.condition_embedder.timesteps_proj(timesteps.flatten())
        return proj.unflatten(0, timesteps.shape).to(like.dtype).reshape(like.shape)

    # ------------------------------------------------------------------ export
    def _export_extra(self, directory: Path) -> None:
        """Save the (frozen) Wan VAE next to the transformer so the export is self-contained."""
        if isinstance(self.codec, WanVAECodec):
            self.codec.vae.save_pretrained(directory / "vae", safe_serialization=True)
