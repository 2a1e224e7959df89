"""Route ``wan22_ti2v_5b``: SolarWM-wan2.2-5B on diffusers' Wan2.2 TI2V-5B (paper §6.2, Table 4).

The TI2V member of the family keeps Wan2.2's native interface: a clip is one 48-channel Wan2.2 VAE
latent (4x temporal, 16x spatial, the first frame encoded alone), there is no separate image tensor
``y``; the first latent frame is the clean image anchor (sigma 0, hence per-token timestep 0 on its
tokens, exactly like diffusers' ``expand_timesteps`` TI2V path) and is excluded from the loss; the
other latents are denoised under the camera condition.

Objective (rectified flow, as Wan): ``x_sigma = (1 - sigma) x0 + sigma eps``, target
``u = eps - x0``, model timestep ``1000 * sigma``, timestep shift ``config.shift`` (Wan: 5.0 for the
5B model at 720p).

Camera: ``PRoPEWanAttnProcessor`` is set on every self-attention (``attn1``) of the unmodified
diffusers ``WanTransformer3DModel``. It does WanAttnProcessor's math (q/k/v projections, RMS q/k norm,
Wan 3D RoPE) and then ``solarwm.kernels.prope.prope_attention`` on ``config.camera_head_dims``
(default: all head dims) with the camera of each token's latent frame. Cross-attention is untouched.
Fused-PRoPE is parameter-free, so ``camera_state_dict()`` is empty for this route.

Cameras travel with Wan's rotary embedding: a forward hook on ``transformer.rope`` attaches the
current call's cameras to the (cos, sin) tuple the model hands to every block. This keeps them
correct under gradient checkpointing (the recomputation receives the same tuple) without forking
the model.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from solarwm.backbones.lora import LoRAConfig
from solarwm.backbones.wan_common import WanAdapterBase, WanRouteConfig

#: Wan2.2 VAE (``Wan-AI/Wan2.2-TI2V-5B-Diffusers/vae/config.json``; diffusers ``convert_wan_to_diffusers``).
WAN22_VAE_CONFIG: dict[str, Any] = {
    "base_dim": 160, "decoder_base_dim": 256, "z_dim": 48, "is_residual": True,
    "in_channels": 12, "out_channels": 12, "patch_size": 2,
    "scale_factor_temporal": 4, "scale_factor_spatial": 16,
    "latents_mean": [
        -0.2289, -0.0052, -0.1323, -0.2339, -0.2799, 0.0174, 0.1838, 0.1557, -0.1382, 0.0542, 0.2813, 0.0891,
        0.1570, -0.0098, 0.0375, -0.1825, -0.2246, -0.1207, -0.0698, 0.5109, 0.2665, -0.2108, -0.2158, 0.2502,
        -0.2055, -0.0322, 0.1109, 0.1567, -0.0729, 0.0899, -0.2799, -0.1230, -0.0313, -0.1649, 0.0117, 0.0723,
        -0.2839, -0.2083, -0.0520, 0.3748, 0.0152, 0.1957, 0.1433, -0.2944, 0.3573, -0.0548, -0.1681, -0.0667,
    ],
    "latents_std": [
        0.4765, 1.0364, 0.4514, 1.1677, 0.5313, 0.4990, 0.4818, 0.5013, 0.8158, 1.0344, 0.5894, 1.0901,
        0.6885, 0.6165, 0.8454, 0.4978, 0.5759, 0.3523, 0.7135, 0.6804, 0.5833, 1.4146, 0.8986, 0.5659,
        0.7069, 0.5338, 0.4889, 0.4917, 0.4069, 0.4999, 0.6866, 0.4093, 0.5709, 0.6065, 0.6415, 0.4944,
        0.5726, 1.2042, 0.5458, 1.6887, 0.3971, 1.0600, 0.3943, 0.5537, 0.5444, 0.4089, 0.7468, 0.7744,
    ],
}

#: Same AutoencoderKLWan class and Wan2.2 geometry (residual, patch 2, 4x/16x), a few hundred k params.
TINY_WAN_VAE_CONFIG: dict[str, Any] = {
    "base_dim": 8, "decoder_base_dim": 8, "z_dim": 16, "dim_mult": [1, 2, 2, 2], "num_res_blocks": 1,
    "temperal_downsample": [False, True, True], "is_residual": True, "in_channels": 12, "out_channels": 12,
    "patch_size": 2, "scale_factor_temporal": 4, "scale_factor_spatial": 16,
    "latents_mean": [0.0] * 16, "latents_std": [1.0] * 16,
}

#: The tiny VAE with Wan2.2's 48 latent channels: a tiny official base (tests) fits the 48-channel transformer.
TINY48_WAN_VAE_CONFIG: dict[str, Any] = dict(
    TINY_WAN_VAE_CONFIG, z_dim=48, latents_mean=[0.0] * 48, latents_std=[1.0] * 48
)

VAE_CONFIGS = {"wan2.2": WAN22_VAE_CONFIG, "tiny": TINY_WAN_VAE_CONFIG, "tiny48": TINY48_WAN_VAE_CONFIG}


@dataclass
class Wan22TI2V5BConfig(WanRouteConfig):
    """Config of the route; ``published()`` is Wan2.2-TI2V-5B, ``tiny()`` the same classes for a CPU.

    Fields: see ``WanRouteConfig``. Defaults: 2 layers, 4 heads x 64, the patchify codec at spatial
    factor 2 (Wan2.2's 48 latent channels: 64x64 video -> 32x32 latents -> 16x16 tokens of 192 values
    per frame), hashing text, shift 3.
    """

    #: AutoencoderKLWan config used when no ``pretrained_path`` gives ``vae/``: ``wan2.2`` or ``tiny``.
    vae_config: Literal["wan2.2", "tiny", "tiny48"] = "tiny"

    @classmethod
    def official(cls, arch: dict[str, Any], stage: str, base: Path | None) -> "Wan22TI2V5BConfig":
        """The config of an official SolarWM package of Wan architecture ``arch`` (``backbones.official``), with the
        official conventions as its settings; ``base``: a diffusers-layout base with the VAE and umT5 (or None)."""
        parts: dict[str, Any]
        if base is not None:
            parts = dict(codec="wan_vae", vae_config="wan2.2", text_encoder="umt5",
                         text_encoder_path=str(base.resolve()))
        else:  # no VAE/T5 given: the 48-channel lossless patchify codec and hashing text keep the export runnable
            parts = dict(codec="patchify", patchify_spatial=2, vae_config="tiny", text_encoder="hashing",
                         text_encoder_path=None)
        return dataclasses.replace(
            cls.published(),
            num_layers=arch["num_layers"], num_attention_heads=arch["num_heads"],
            attention_head_dim=arch["dim"] // arch["num_heads"], ffn_dim=arch["ffn_dim"], text_dim=arch["text_dim"],
            freq_dim=arch["freq_dim"], patch_size=tuple(arch["patch_size"]), text_max_length=arch["text_len"],
            rope_max_seq_len=1024, shift=5.0, prediction="velocity", camera_head_dims=None,
            latent_camera="group_first", intrinsics="wan_fixed",
            timestep_rounding="bfloat16" if stage == "dmd" else "none", **parts,
        )

    @classmethod
    def tiny(cls) -> "Wan22TI2V5BConfig":
        """2 layers, 4 heads x 64, ffn 512, text_dim 32, patchify codec, hashing text, x0 output: trains on a CPU."""
        return cls(prediction="x0")

    @classmethod
    def published(cls) -> "Wan22TI2V5BConfig":
        """Wan2.2-TI2V-5B: 30 layers, 24 heads x 128, ffn 14336, 48 latent channels, UMT5 (4096-d) text."""
        return cls(
            num_layers=30, num_attention_heads=24, attention_head_dim=128, ffn_dim=14336, text_dim=4096,
            freq_dim=256, codec="wan_vae", vae_config="wan2.2", text_encoder="umt5", text_max_length=512,
            shift=5.0,
        )


class Wan22TI2V5BAdapter(WanAdapterBase):
    """Backbone adapter of SolarWM-wan2.2-5B (TI2V): clean first-latent anchor, flow target, PRoPE camera.

    ``config`` (default: ``preset``'s config); ``pretrained_path``: a local diffusers checkpoint folder with
    ``transformer/`` (and ``vae/`` for ``codec="wan_vae"``; ``text_encoder/`` + ``tokenizer/`` for UMT5), or the
    official SolarWM base in its original Wan layout, converted once into a cache (``backbones.official_base``);
    ``device`` builds the codec and transformer under ``torch.device(device)`` (``"meta"``: no weights
    allocated, for parameter counting). Everything but the anchor rule is ``WanAdapterBase``.
    """

    route = "wan22_ti2v_5b"
    config_class = Wan22TI2V5BConfig
    vae_configs = VAE_CONFIGS
    vae_spatial_compression = 16
    clean_latent_frames = 1  # the TI2V image anchor

    def __init__(
        self,
        config: Wan22TI2V5BConfig | None = None,
        preset: Literal["tiny", "published"] = "tiny",
        pretrained_path: str | None = None,
        device: str | None = None,
        lora: LoRAConfig | None = None,
    ) -> None:
        if pretrained_path is not None and device != "meta":
            from solarwm.backbones.official_base import is_official_base, official_base_cache

            if is_official_base(pretrained_path):  # the release's original layout: its diffusers copy, made once
                pretrained_path = str(official_base_cache(pretrained_path, Wan22TI2V5BConfig, VAE_CONFIGS))
        super().__init__(config=config, preset=preset, pretrained_path=pretrained_path, device=device, lora=lora)
