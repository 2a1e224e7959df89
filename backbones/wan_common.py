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

import contextlib
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

import torch
from diffusers import AutoencoderKLWan, WanTransformer3DModel

from solarwm.backbones.base import AdapterError, BackboneAdapter
from solarwm.backbones.codecs import PatchifyCodec, WanVAECodec
from solarwm.backbones.lora import LoRAConfig
from solarwm.backbones.pretrained import load_transformer
from solarwm.backbones.text import HashingTextEncoder, UMT5TextEncoder
from solarwm.backbones.wan_attention import AttentionContext, PRoPEWanAttnProcessor, attach_context
from solarwm.kernels.kv_cache import KVCache
from solarwm.kernels.masks import causal_mask


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

    def __post_init__(self) -> None:
        # JSON round trips turn tuples into lists.
        self.patch_size = tuple(self.patch_size)
        if self.camera_head_dims is not None:
            self.camera_head_dims = tuple(self.camera_head_dims)

    def transformer_kwargs(self, in_channels: int, out_channels: int | None = None) -> dict[str, Any]:
        """Keyword arguments of ``WanTransformer3DModel`` for this config (``out_channels`` defaults to ``in_channels``)."""
        return dict(
            patch_size=self.patch_size, num_attention_heads=self.num_attention_heads,
            attention_head_dim=self.attention_head_dim, in_channels=in_channels,
            out_channels=in_channels if out_channels is None else out_channels,
            text_dim=self.text_dim, freq_dim=self.freq_dim, ffn_dim=self.ffn_dim, num_layers=self.num_layers,
            cross_attn_norm=True, qk_norm="rms_norm_across_heads", eps=1e-6, image_dim=None,
            added_kv_proj_dim=None, rope_max_seq_len=self.rope_max_seq_len,
        )


#: Transformer config keys a checkpoint must match.
_CHECKED_KEYS = ("num_layers", "num_attention_heads", "attention_head_dim", "in_channels", "out_channels",
                 "text_dim", "ffn_dim", "freq_dim", "patch_size", "image_dim")


class WanAdapterBase(BackboneAdapter):
    """``BackboneAdapter`` for diffusers' ``WanTransformer3DModel`` + a Wan codec + a text encoder (see module docstring).

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
    #: ``cond`` entries indexed ``[B, f, ...]`` by latent frame (sliced per block by a causal rollout).
    per_frame_conditions: ClassVar[tuple[str, ...]] = ("c2w", "K")
    timestep_scale = 1000.0
    patch_size = 2

    def __init__(
        self,
        config: WanRouteConfig | None = None,
        preset: Literal["tiny", "published"] = "tiny",
        pretrained_path: str | None = None,
        device: str | None = None,
        lora: LoRAConfig | None = None,
    ) -> None:
        super().__init__()
        if config is None:
            config = self.config_class.tiny() if preset == "tiny" else self.config_class.published()
        self.require_weights(preset, pretrained_path, device)
        self.config = config = dataclasses.replace(config)
        if config.patch_size[0] != 1 or config.patch_size[1] != config.patch_size[2]:
            raise AdapterError(f"{self.route}: patch_size must be (1, p, p), got {config.patch_size}")
        self.patch_size = config.patch_size[1]
        self.shift = config.shift
        root = Path(pretrained_path) if pretrained_path is not None else None
        if root is not None and not root.is_dir():
            raise AdapterError(f"{self.route}: pretrained_path {root} does not exist")
        self.check_pretrained_export(root)

        build = torch.device(device) if device is not None else contextlib.nullcontext()
        with build:
            self.codec = self._build_codec(root)
            self.temporal_compression = self.codec.temporal_compression
            self.spatial_compression = self.codec.spatial_compression
            self.latent_channels = self.codec.latent_channels
            self.transformer = self._build_transformer(root)
        self.text_encoder = self._build_text_encoder(root)

        # Only the transformer trains (fused-PRoPE adds no weights); codec and text encoder are frozen.
        self.codec.requires_grad_(False).eval()
        if self.text_encoder is not None:
            self.text_encoder.requires_grad_(False).eval()
        for index, block in enumerate(self.transformer.blocks):
            block.attn1.set_processor(PRoPEWanAttnProcessor(config.camera_head_dims, layer_index=index))
        self.transformer.rope.register_forward_hook(attach_context)
        self.transformer.rope._solarwm_context = None
        self.enable_lora(lora)

    # ------------------------------------------------------------------ building
    def transformer_channels(self) -> tuple[int, int]:
        """``(in_channels, out_channels)`` of the transformer; default: the latent channels both ways."""
        return self.latent_channels, self.latent_channels

    def _build_codec(self, root: Path | None) -> torch.nn.Module:
        cfg = self.config
        if cfg.codec == "patchify":
            return PatchifyCodec(spatial=cfg.patchify_spatial, temporal=4)
        if cfg.codec != "wan_vae":
            raise AdapterError(f"{self.route}: unknown codec {cfg.codec!r}; expected 'wan_vae' or 'patchify'")
        if root is not None:
            vae_dir = root / "vae"
            if not vae_dir.is_dir():
                raise AdapterError(f"{self.route}: {vae_dir} missing (codec='wan_vae' needs pretrained_path/vae/)")
            vae = AutoencoderKLWan.from_pretrained(str(vae_dir), use_safetensors=True)
        else:
            if cfg.vae_config not in self.vae_configs:
                raise AdapterError(
                    f"{self.route}: unknown vae_config {cfg.vae_config!r}; expected one of {sorted(self.vae_configs)}"
                )
            vae = AutoencoderKLWan(**self.vae_configs[cfg.vae_config])
        if int(vae.config.scale_factor_temporal) != 4:
            raise AdapterError(f"{self.route}: VAE temporal factor {vae.config.scale_factor_temporal} != 4")
        if int(vae.config.scale_factor_spatial) != self.vae_spatial_compression:
            raise AdapterError(
                f"{self.route}: VAE spatial factor {vae.config.scale_factor_spatial} != {self.vae_spatial_compression} "
                "(a VAE of another Wan route?)"
            )
        return WanVAECodec(vae)

    def _build_transformer(self, root: Path | None) -> WanTransformer3DModel:
        expected = self.config.transformer_kwargs(*self.transformer_channels())
        layout = "transformer/ (and vae/ for codec='wan_vae')"
        return load_transformer(self.route, WanTransformer3DModel, root, expected, _CHECKED_KEYS, layout)

    def _build_text_encoder(self, root: Path | None) -> torch.nn.Module | None:
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
    def _check_input(self, x_t: torch.Tensor, sigma_per_frame: torch.Tensor, cond: dict[str, Any]) -> None:
        if x_t.dim() != 5 or x_t.shape[1] != self.latent_channels:
            raise AdapterError(f"{self.route}: x_t must be [B, {self.latent_channels}, f, h, w], got {tuple(x_t.shape)}")
        b, _, f = x_t.shape[:3]
        if sigma_per_frame.shape != (b, f):
            raise AdapterError(f"{self.route}: sigma_per_frame must be [{b}, {f}], got {tuple(sigma_per_frame.shape)}")
        for name in self.per_frame_conditions:
            if name not in cond:
                raise AdapterError(f"{self.route}: cond has no {name!r} (build cond with prepare_conditions)")
            if tuple(cond[name].shape[:2]) != (b, f):
                raise AdapterError(
                    f"{self.route}: cond[{name!r}] covers {tuple(cond[name].shape[:2])} (batch, latent frames), "
                    f"latents are ({b}, {f})"
                )

    def _run(
        self,
        x: torch.Tensor,
        sigma_per_frame: torch.Tensor,
        r_per_frame: torch.Tensor | None,
        cond: dict[str, Any],
        context: AttentionContext,
        copies: int = 1,
    ) -> torch.Tensor:
        """The diffusers transformer on ``x [B, C, f, h, w]``: per-token timesteps ``1000·sigma`` of each frame.

        ``copies``: ``x`` holds the per-frame conditions' frames that many times over (teacher forcing: 2).
        """
        if r_per_frame is not None and self.delta_embedding is None:
            raise AdapterError(f"{self.route}: r_per_frame given but the flow map is not enabled (enable_flow_map)")
        extra = self.channel_conditions(cond)
        if extra is not None:
            x_in = torch.cat([x, torch.cat([extra.to(x.dtype)] * copies, 2)], 1)
        else:
            x_in = x
        tpf = self.tokens_per_frame(*x.shape[-2:])
        # Per-token timesteps [B, f*h*w/p^2] (diffusers' expand_timesteps path; clean frames get 0).
        timestep = (sigma_per_frame.float() * self.timestep_scale).repeat_interleave(tpf, dim=1)
        rope = self.transformer.rope
        rope._solarwm_context = context
        if r_per_frame is not None:
            self._flow_map_r = (r_per_frame.float() * self.timestep_scale).repeat_interleave(tpf, dim=1)
        dtype = self.transformer.dtype
        try:
            out = self.transformer(
                hidden_states=x_in.to(dtype), timestep=timestep,
                encoder_hidden_states=cond["text_embeds"].to(dtype), return_dict=False,
            )[0]
        finally:
            rope._solarwm_context = None
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
            context = AttentionContext(
                self.window_viewmats(cond["c2w"], 0), cond["K"], tuple(cond["image_size"]),
                positions=torch.arange(f), attn_mask=attn_mask,
            )
        else:
            context = self._cached_context(cond, kv_cache, f, commit)
        out = self._cached_call(lambda: self._run(x_t, sigma_per_frame, r_per_frame, cond, context), cond, kv_cache, commit)
        return self._native(out, x_t, sigma_per_frame)

    def _cached_context(self, cond: dict[str, Any], cache: KVCache, f: int, commit: bool) -> AttentionContext:
        """Window = cached frames then the query block, at positions 0..W-1, cameras relative to the query block."""
        window_c2w = cond["c2w"] if cache.c2w is None else torch.cat([cache.c2w.to(cond["c2w"].device), cond["c2w"]], 1)
        window_K = cond["K"] if cache.K is None else torch.cat([cache.K.to(cond["K"].device), cond["K"]], 1)
        width = window_c2w.shape[1]
        viewmats = self.window_viewmats(window_c2w, width - f)
        return AttentionContext(
            viewmats[:, width - f :], window_K[:, width - f :], tuple(cond["image_size"]),
            positions=torch.arange(width - f, width), cache=cache, commit=commit,
            kv_viewmats=viewmats, kv_K=window_K, kv_positions=torch.arange(width),
        )

    def forward_teacher_forcing(
        self,
        x_clean: torch.Tensor,
        x_noisy: torch.Tensor,
        sigma_per_frame: torch.Tensor,
        cond: dict[str, Any],
        r_per_frame: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Prediction for ``x_noisy [B, C, f, h, w]`` on ``[clean | noisy]``; see ``BackboneAdapter``.

        Both copies share temporal positions, cameras and the per-frame channel conditions (I2V: ``y``).
        """
        self._check_teacher_forcing(x_clean, x_noisy, sigma_per_frame, cond)
        b, _, f, h, w = x_noisy.shape
        viewmats = self.window_viewmats(cond["c2w"], 0)
        mask = causal_mask(
            "teacher_forcing", f, self.tokens_per_frame(h, w), self.frames_per_block,
            device=x_noisy.device, max_prior_blocks=self.window_blocks - 1,
        )
        positions = torch.arange(f)
        context = AttentionContext(
            torch.cat([viewmats, viewmats], 1), torch.cat([cond["K"], cond["K"]], 1), tuple(cond["image_size"]),
            positions=torch.cat([positions, positions]), attn_mask=mask,
        )
        zeros = torch.zeros_like(sigma_per_frame)
        sigma_full = torch.cat([zeros, sigma_per_frame], 1)
        # The clean history has r = t = 0 (AnyFlow: r_clean = t_clean).
        r_full = None if r_per_frame is None else torch.cat([zeros, r_per_frame], 1)
        out = self._run(torch.cat([x_clean, x_noisy], 2), sigma_full, r_full, cond, context, copies=2)
        return self._native(out[:, :, f:], x_noisy, sigma_per_frame)

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
