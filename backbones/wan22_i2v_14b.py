"""Route ``wan22_i2v_14b``: SolarWM-wan2.2-14B on diffusers' Wan2.2 I2V-A14B (paper §6.2, Table 4).

Backbone. Wan2.2-I2V-A14B ships two experts (high-noise and low-noise) with a noise boundary between
them; SolarWM initialises from the **high-noise expert** (``transformer/`` of the Diffusers checkpoint)
and trains it as one dense model over all timesteps (the two-expert routing is not kept). It is a
``WanTransformer3DModel`` with in_channels 36, out_channels 16, 40 layers, 40 heads x 128 (dim 5120),
ffn 13824, UMT5 text (4096-d), freq_dim 256, patch (1, 2, 2) and no image embedder (``image_dim``
None: Wan2.2 A14B dropped Wan2.1's CLIP branch) — 14,288,901,184 parameters (14.29 B). The codec is
the Wan2.1 VAE (``AutoencoderKLWan``: z_dim 16, 4x temporal, 8x spatial).

Image condition ``y`` (the official one, as diffusers' ``WanImageToVideoPipeline.prepare_latents``):
encode a video whose first frame is the image and whose later frames are zero (VAE posterior mode,
normalised like the latents), and put a 4-channel first-frame mask in front of it — the pixel mask
(1 on frame 0, 0 after) with frame 0 repeated 4x for the temporal compression, folded 4 frames per
latent frame, so mask channels are all 1 on latent frame 0 and 0 on later ones. ``y`` has
``4 + 16 = 20`` channels and the transformer input is ``cat([x_t (16), y (20)])`` = 36 channels.
``y`` is an explicit input; **no latent frame is a clean anchor** (``clean_latent_frames = 0``):
the first target latent stays noisy and supervised.

``y`` lives in ``cond["y"]`` frame-major, ``[B, f, 20, h, w]`` (channels in diffusers' order:
mask then latent), so that it is a per-latent-frame condition like the cameras
(``per_frame_conditions = ("c2w", "K", "y")``): a causal rollout slices it per block like ``c2w``/``K``
(``solarwm.rollout.engine.block_conditions``), teacher forcing gives both the clean and the noisy
copy the same ``y``. ``prepare_conditions`` builds it from ``batch["video"][:, :, 0]``, else
``batch["first_frame"]`` / ``batch["image"]`` (rollout, sampling), else takes a precomputed ``batch["y"]``.
``prepare_conditions``' ``y`` covers the whole clip; an open-ended rollout (``solarwm.rollout.session``)
takes it block by block from ``frame_condition_stream`` (the VAE's causal encoder run across blocks), so
memory and VAE time per block are flat in the horizon.

Causal mode. There is no official causal A14B (the official contracts refuse A14B Stage 1), so the
block size is our choice: ``frames_per_block = 3`` latent frames (12 pixel frames) and a window of 6
blocks, the values of the official Wan2.2-5B causal route. The reasons: the A14B route has the same
VAE temporal factor (4) and the same 3D RoPE table as the 5B, so a block covers the same span of time
(0.75 s at 16 fps) and 81 frames = 21 latents = 7 whole blocks, as on the 5B; and the official Wan
causal code requires 3 latent frames per block for every Wan config. Tokens per latent frame at
480x832 are 1560 (vs 405 for the 5B at 480x864), so a 6-block window is 28,080 tokens.

Objective, camera and everything else are ``WanAdapterBase`` (shared with the 5B route): rectified
flow with target ``eps - x0``, model timestep ``1000 * sigma`` per token, shift ``config.shift`` (Wan:
5.0 for 480p I2V), PRoPE on every ``attn1``, UMT5 or hashing text.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Literal

import torch

from solarwm.backbones.base import AdapterError
from solarwm.backbones.lora import LoRAConfig
from solarwm.backbones.wan_common import WanAdapterBase, WanRouteConfig

#: Wan2.1 VAE (``Wan-AI/Wan2.2-I2V-A14B-Diffusers/vae/config.json``; diffusers ``convert_wan_to_diffusers``,
#: equal to ``AutoencoderKLWan``'s defaults).
WAN21_VAE_CONFIG: dict[str, Any] = {
    "base_dim": 96, "z_dim": 16, "dim_mult": [1, 2, 4, 4], "num_res_blocks": 2, "attn_scales": [],
    "temperal_downsample": [False, True, True], "dropout": 0.0, "is_residual": False,
    "in_channels": 3, "out_channels": 3, "patch_size": None,
    "scale_factor_temporal": 4, "scale_factor_spatial": 8,
    "latents_mean": [
        -0.7571, -0.7089, -0.9113, 0.1075, -0.1745, 0.9653, -0.1517, 1.5508,
        0.4134, -0.0715, 0.5517, -0.3632, -0.1922, -0.9497, 0.2503, -0.2921,
    ],
    "latents_std": [
        2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743,
        3.2687, 2.1526, 2.8652, 1.5579, 1.6382, 1.1253, 2.8251, 1.9160,
    ],
}

#: Same AutoencoderKLWan class and Wan2.1 geometry (no patchify, z_dim 16, 4x / 8x), about 220 k params.
TINY_WAN21_VAE_CONFIG: dict[str, Any] = {
    "base_dim": 8, "z_dim": 16, "dim_mult": [1, 2, 2, 2], "num_res_blocks": 1, "attn_scales": [],
    "temperal_downsample": [False, True, True], "dropout": 0.0, "is_residual": False,
    "in_channels": 3, "out_channels": 3, "patch_size": None,
    "scale_factor_temporal": 4, "scale_factor_spatial": 8,
    "latents_mean": [0.0] * 16, "latents_std": [1.0] * 16,
}

VAE_CONFIGS = {"wan2.1": WAN21_VAE_CONFIG, "tiny": TINY_WAN21_VAE_CONFIG}


@dataclass
class Wan22I2V14BConfig(WanRouteConfig):
    """Route config; ``published()`` is the Wan2.2-I2V-A14B high-noise expert, ``tiny()`` the same classes for a CPU.

    Fields: see ``WanRouteConfig``. The default codec is the Wan VAE (the tiny Wan2.1-style config unless
    ``pretrained_path`` has ``vae/``), so latents have the published 16 channels and ``y`` 20. With
    ``codec="patchify"`` (``3*4*s*s`` latent channels C) the layout stays the same rule: ``y`` = 4 mask
    channels + C, transformer input ``2C + 4``.
    """

    codec: Literal["wan_vae", "patchify"] = "wan_vae"
    #: AutoencoderKLWan config used when no ``pretrained_path`` gives ``vae/``: ``wan2.1`` or ``tiny``.
    vae_config: Literal["wan2.1", "tiny"] = "tiny"

    @classmethod
    def tiny(cls) -> "Wan22I2V14BConfig":
        """2 layers, 4 heads x 64, ffn 512, text_dim 32, tiny Wan2.1-style VAE (16 channels), hashing text."""
        return cls()

    @classmethod
    def published(cls) -> "Wan22I2V14BConfig":
        """Wan2.2-I2V-A14B high-noise expert: 40 layers, 40x128 heads, ffn 13824, Wan2.1 VAE, UMT5 (4096-d), shift 5."""
        return cls(
            num_layers=40,
            num_attention_heads=40,
            attention_head_dim=128,
            ffn_dim=13824,
            text_dim=4096,
            freq_dim=256,
            codec="wan_vae",
            vae_config="wan2.1",
            text_encoder="umt5",
            text_max_length=512,
            shift=5.0,
        )


class Wan22I2V14BAdapter(WanAdapterBase):
    """Backbone adapter of SolarWM-wan2.2-14B (I2V-A14B): official ``y`` condition, no clean anchor, PRoPE camera.

    ``config`` (default: ``preset``'s config); ``pretrained_path``: a local diffusers checkpoint folder with
    ``transformer/`` (the high-noise expert of Wan2.2-I2V-A14B-Diffusers; ``transformer_2/`` is not used),
    ``vae/`` for ``codec="wan_vae"`` and ``text_encoder/`` + ``tokenizer/`` for UMT5; ``device``: build
    under ``torch.device(device)`` (``"meta"`` for counting); ``lora``: LoRA on the transformer.
    """

    route = "wan22_i2v_14b"
    config_class = Wan22I2V14BConfig
    vae_configs = VAE_CONFIGS
    vae_spatial_compression = 8
    per_frame_conditions = ("c2w", "K", "y")
    clean_latent_frames = 0  # y is the image condition; the first target latent is noisy and supervised
    frames_per_block = 3  # no official value for A14B: the Wan2.2-5B causal block (see module docstring)
    window_blocks = 6

    def __init__(
        self,
        config: Wan22I2V14BConfig | None = None,
        preset: Literal["tiny", "published"] = "tiny",
        pretrained_path: str | None = None,
        device: str | None = None,
        lora: LoRAConfig | None = None,
    ) -> None:
        super().__init__(config=config, preset=preset, pretrained_path=pretrained_path, device=device, lora=lora)

    def transformer_channels(self) -> tuple[int, int]:
        """``(C + mask + C, C)``: noisy latent, then ``y`` = temporal-factor mask channels + image latent (36, 16)."""
        c = self.latent_channels
        return c + self.condition_channels, c

    @property
    def condition_channels(self) -> int:
        """Channels of ``y``: the first-frame mask (one per pixel frame of a latent frame) + the latent."""
        return self.temporal_compression + self.latent_channels

    # ------------------------------------------------------------------ image condition
    @torch.no_grad()
    def image_condition(self, image: torch.Tensor, num_frames: int) -> torch.Tensor:
        """The official ``y`` for ``image [B, 3, H, W]`` in [-1, 1] and a clip of ``num_frames`` pixel frames.

        Returns ``[B, f, 4 + C, h, w]`` (frame-major): channels ``[:4]`` the first-frame mask (1 on latent
        frame 0, 0 after), ``[4:]`` the normalised latent of ``[image, 0, 0, ...]`` (``num_frames`` frames).
        """
        if image.dim() != 4 or image.shape[1] != 3:
            raise AdapterError(f"{self.route}: the condition image must be [B, 3, H, W], got {tuple(image.shape)}")
        f = self.latent_frames(num_frames)
        b, _, height, width = image.shape
        video = torch.cat([image[:, :, None], image.new_zeros(b, 3, num_frames - 1, height, width)], dim=2)
        latent = self.encode(video).float()  # [B, C, f, h, w]
        mask = latent.new_zeros(b, self.temporal_compression, f, *latent.shape[-2:])
        mask[:, :, 0] = 1.0
        return torch.cat([mask, latent], dim=1).transpose(1, 2).contiguous()

    def frame_condition_stream(self, first_frame: torch.Tensor) -> Callable[[int], dict[str, torch.Tensor]]:
        """``y`` block by block: the codec's stream encoder over ``[image, 0, 0, ...]``, never the whole horizon.

        Concatenated, the blocks' ``y`` equal ``image_condition`` of the whole clip (the VAE is causal, so a
        latent frame of ``[image, 0, ...]`` does not depend on the clip's length); memory and VAE time per
        block are flat in the horizon.
        """
        encode = self.codec.stream_encoder()
        t = self.temporal_compression
        state = {"start": 0, "encoder": encode.state}
        b, _, height, width = first_frame.shape

        @torch.no_grad()
        def next_y(n: int) -> dict[str, torch.Tensor]:
            first = state["start"] == 0
            video = first_frame.new_zeros(b, 3, 1 + t * (n - 1) if first else t * n, height, width)
            if first:
                video[:, :, 0] = first_frame
            latent = encode(video).float()  # [B, C, n, h, w]
            mask = latent.new_zeros(b, t, n, *latent.shape[-2:])
            if first:
                mask[:, :, 0] = 1.0
            state["start"] += n
            return {"y": torch.cat([mask, latent], dim=1).transpose(1, 2).contiguous()}

        next_y.state = state
        return next_y

    def prepare_conditions(self, batch: dict[str, Any]) -> dict[str, Any]:
        """``WanAdapterBase.prepare_conditions`` + ``y [B, f, 20, h, w]`` from the first frame (module docstring)."""
        cond = super().prepare_conditions(batch)
        num_frames = batch["c2w"].shape[1]
        if "video" in batch:
            y = self.image_condition(batch["video"][:, :, 0], num_frames)
        elif "first_frame" in batch or "image" in batch:
            y = self.image_condition(batch["first_frame"] if "first_frame" in batch else batch["image"], num_frames)
        elif "y" in batch:
            y = batch["y"]
        else:
            raise AdapterError(
                f"{self.route}: the I2V route needs the condition image: batch 'video', 'first_frame' or 'image' "
                "(or a precomputed 'y')"
            )
        f = self.latent_frames(num_frames)
        if y.dim() != 5 or tuple(y.shape[1:3]) != (f, self.condition_channels):
            raise AdapterError(
                f"{self.route}: y must be [B, {f}, {self.condition_channels}, h, w], got {tuple(y.shape)}"
            )
        cond["y"] = y.to(batch["c2w"].device)
        return cond

    def channel_conditions(self, cond: dict[str, Any]) -> torch.Tensor:
        """``y`` as transformer input channels ``[B, 4 + C, f, h, w]`` (concatenated after ``x_t``)."""
        return cond["y"].transpose(1, 2)
