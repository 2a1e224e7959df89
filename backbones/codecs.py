"""Video codecs a route can pair its transformer with: the real Wan VAE or a lossless patchify codec.

Both map ``video [B, 3, F, H, W]`` in [-1, 1] with ``F = t*n + 1`` to latents ``[B, C, n + 1, H/s, W/s]``
with the first frame encoded alone (Wan's causal temporal rule), so latent frame ``i`` stands for pixel
frame ``t*i`` and ``latent_to_pixel_frame`` is the same for either codec.
"""

from __future__ import annotations

import math
from typing import Callable

import torch


class CodecError(ValueError):
    """A video/latent tensor does not fit the codec's geometry (the message names the check)."""


def check_video(video: torch.Tensor, temporal: int, spatial: int, who: str) -> None:
    """Refuse a video not ``[B, 3, F, H, W]`` with ``F = temporal*n + 1`` and ``H, W`` divisible by ``spatial``."""
    if video.dim() != 5 or video.shape[1] != 3:
        raise CodecError(f"{who}: video must be [B, 3, F, H, W], got {tuple(video.shape)}")
    frames, height, width = video.shape[2:]
    if (frames - 1) % temporal:
        raise CodecError(f"{who}: {frames} frames is not {temporal}*n + 1")
    if height % spatial or width % spatial:
        raise CodecError(f"{who}: frame size {height}x{width} not divisible by {spatial}")


class PatchifyCodec(torch.nn.Module):
    """Lossless space/time-to-depth codec for the embedded (CPU) default; no weights.

    Latent frame 0 holds the first frame repeated ``temporal`` times; latent ``i >= 1`` holds frames
    ``t*(i-1)+1 .. t*i``. Each ``s x s`` pixel block of those ``t`` frames becomes ``3*t*s*s`` channels
    ordered (rgb, time, dy, dx). ``decode(encode(x)) == x`` exactly: the repeated first frame is
    averaged with a power-of-two pairwise sum, which is exact for identical copies.
    """

    def __init__(self, spatial: int = 4, temporal: int = 4, scale: float = 2.0) -> None:
        super().__init__()
        if scale <= 0 or math.frexp(scale)[0] != 0.5:
            raise CodecError(f"PatchifyCodec: scale must be a power of two (exact in floating point), got {scale}")
        self.spatial_compression = spatial
        self.temporal_compression = temporal
        self.latent_channels = 3 * temporal * spatial * spatial
        # Like a VAE's latent normalisation: pixels in [-1, 1] have std ~0.4 on rendered worlds, and
        # flow matching learns far faster when the data has roughly unit variance against unit noise.
        self.scale = float(scale)

    def encode(self, video: torch.Tensor) -> torch.Tensor:
        """``video [B, 3, F, H, W]`` -> ``[B, 3*t*s*s, (F-1)/t + 1, H/s, W/s]``."""
        t, s = self.temporal_compression, self.spatial_compression
        check_video(video, t, s, "PatchifyCodec.encode")
        b, c, _, height, width = video.shape
        x = torch.cat([video[:, :, :1].expand(b, c, t, height, width), video[:, :, 1:]], dim=2)
        f = x.shape[2] // t
        x = x.reshape(b, c, f, t, height // s, s, width // s, s)
        x = x.permute(0, 1, 3, 5, 7, 2, 4, 6)  # b, c, t, dy, dx, f, h, w
        return x.reshape(b, self.latent_channels, f, height // s, width // s) * self.scale

    def _unfold(self, latents: torch.Tensor) -> torch.Tensor:
        """``[B, 3*t*s*s, f, h, w]`` -> pixel groups ``[B, 3, f, t, h*s, w*s]`` (latent i holds t frames)."""
        t, s = self.temporal_compression, self.spatial_compression
        if latents.dim() != 5 or latents.shape[1] != self.latent_channels:
            raise CodecError(
                f"PatchifyCodec.decode: latents must be [B, {self.latent_channels}, f, h, w], "
                f"got {tuple(latents.shape)}"
            )
        b, _, f, h, w = latents.shape
        x = (
            (latents / self.scale).reshape(b, 3, t, s, s, f, h, w).permute(0, 1, 5, 2, 6, 3, 7, 4)
        )  # b, c, f, t, h, dy, w, dx
        return x.reshape(b, 3, f, t, h * s, w * s)

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Exact inverse of ``encode``: ``[B, 3*t*s*s, f, h, w]`` -> ``[B, 3, t*(f-1) + 1, h*s, w*s]``."""
        x = self._unfold(latents)
        b, _, f, t, height, width = x.shape
        first = x[:, :, 0]  # [B, 3, t, H, W]: the repeated first frame
        while first.shape[2] > 1 and first.shape[2] % 2 == 0:
            first = first[:, :, 0::2] + first[:, :, 1::2]
        first = first.sum(dim=2, keepdim=True) / t
        rest = x[:, :, 1:].reshape(b, 3, (f - 1) * t, height, width)
        return torch.cat([first, rest], dim=2)

    def stream_encoder(self) -> "Callable[[torch.Tensor], torch.Tensor]":
        """An encoder of consecutive chunks of one clip (the first ``t*n + 1`` frames, later ones ``t*n``);
        concatenated, its outputs equal ``encode`` of the whole clip (latent groups are independent)."""
        state = {"first": True}

        def encode_block(video: torch.Tensor) -> torch.Tensor:
            if state["first"]:
                state["first"] = False
                return self.encode(video)
            return self.encode(torch.cat([video[:, :, :1], video], 2))[:, :, 1:]

        encode_block.state = state
        return encode_block

    def stream_decoder(self) -> "Callable[[torch.Tensor], torch.Tensor]":
        """A decoder for consecutive latent blocks of one clip: the first block holds latent 0 (1 frame),
        every later latent gives ``t`` frames. Concatenated, the outputs equal ``decode`` of the whole clip."""
        state = {"first": True}

        def decode_block(latents: torch.Tensor) -> torch.Tensor:
            if state["first"]:
                state["first"] = False
                return self.decode(latents)
            x = self._unfold(latents)
            b, _, f, t, height, width = x.shape
            return x.reshape(b, 3, f * t, height, width)

        decode_block.state = state  # what a forked rollout copies (`solarwm.rollout.session`)
        return decode_block


class WanVAECodec(torch.nn.Module):
    """diffusers ``AutoencoderKLWan`` with the VAE config's ``latents_mean``/``latents_std`` normalisation.

    Encoding takes the posterior mode (``latent_dist.mode()``, as the Wan pipelines do for conditions):
    deterministic, so cached latents and on-the-fly latents agree. Normalised latents are
    ``(z - mean) / std`` per channel, as in ``WanPipeline`` / ``WanImageToVideoPipeline``.
    """

    def __init__(self, vae: torch.nn.Module) -> None:
        super().__init__()
        self.vae = vae
        cfg = vae.config
        self.temporal_compression = int(cfg.scale_factor_temporal)
        self.spatial_compression = int(cfg.scale_factor_spatial)
        self.latent_channels = int(cfg.z_dim)
        shape = (1, cfg.z_dim, 1, 1, 1)
        self.register_buffer(
            "latents_mean", torch.tensor(cfg.latents_mean, dtype=torch.float32).view(shape), persistent=False
        )
        self.register_buffer(
            "latents_std", torch.tensor(cfg.latents_std, dtype=torch.float32).view(shape), persistent=False
        )

    def encode(self, video: torch.Tensor) -> torch.Tensor:
        """``video [B, 3, F, H, W]`` in [-1, 1] -> normalised latents ``[B, z_dim, (F-1)/4 + 1, H/16, W/16]``."""
        check_video(video, self.temporal_compression, self.spatial_compression, "WanVAECodec.encode")
        z = self.vae.encode(video.to(self.vae.dtype)).latent_dist.mode().float()
        return (z - self.latents_mean) / self.latents_std

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Normalised latents ``[B, z_dim, f, h, w]`` -> ``video [B, 3, 4(f-1) + 1, 16h, 16w]`` in [-1, 1]."""
        z = latents.float() * self.latents_std + self.latents_mean
        return self.vae.decode(z.to(self.vae.dtype), return_dict=False)[0].float().clamp(-1.0, 1.0)

    def stream_encoder(self) -> "Callable[[torch.Tensor], torch.Tensor]":
        """An encoder of consecutive chunks of one clip (the first ``4n + 1`` frames, later ones ``4n``) that
        keeps one causal-VAE cache: ``AutoencoderKLWan._encode``'s chunk loop (1 frame, then 4 at a time) run
        across calls, so the concatenated outputs are ``encode`` of the whole clip (posterior mode, normalised).
        """
        vae = self.vae
        vae.clear_cache()
        state = {"index": 0, "feat_map": vae._enc_feat_map}  # a fresh list: this stream's own

        def encode_block(video: torch.Tensor) -> torch.Tensor:
            from diffusers.models.autoencoders.autoencoder_kl_wan import patchify

            x = video.to(vae.dtype)
            if vae.config.patch_size is not None:
                x = patchify(x, patch_size=vae.config.patch_size)
            chunks, i = [], 0
            while i < x.shape[2]:
                size = 1 if state["index"] == 0 else 4
                chunks.append(vae.encoder(x[:, :, i : i + size], feat_cache=state["feat_map"], feat_idx=[0]))
                state["index"] += 1
                i += size
            mean = vae.quant_conv(torch.cat(chunks, 2))[:, : self.latent_channels].float()
            return (mean - self.latents_mean) / self.latents_std

        encode_block.state = state
        return encode_block

    def stream_decoder(self) -> "Callable[[torch.Tensor], torch.Tensor]":
        """A decoder for consecutive latent blocks of one clip that keeps one continuous causal-VAE cache.

        It runs ``AutoencoderKLWan``'s own per-latent-frame decode loop (``_decode``) without clearing the
        feature cache between blocks, so memory stays flat over any length and the concatenated output
        equals ``decode`` of the whole clip. (Spatial tiling is not applied: frames are decoded whole.)
        The decoder owns its feature cache (``decode_block.state``), so several streams can share one VAE.
        """
        from diffusers.models.autoencoders.autoencoder_kl_wan import unpatchify

        vae = self.vae
        vae.clear_cache()
        state = {"index": 0, "feat_map": vae._feat_map}  # clear_cache made a fresh list: this stream's own

        def decode_block(latents: torch.Tensor) -> torch.Tensor:
            z = (latents.float() * self.latents_std + self.latents_mean).to(vae.dtype)
            x = vae.post_quant_conv(z)
            frames = []
            for i in range(x.shape[2]):
                frames.append(
                    vae.decoder(
                        x[:, :, i : i + 1],
                        feat_cache=state["feat_map"],
                        feat_idx=[0],
                        first_chunk=state["index"] == 0,
                    )
                )
                state["index"] += 1
            out = torch.cat(frames, 2)
            if vae.config.patch_size is not None:
                out = unpatchify(out, patch_size=vae.config.patch_size)
            return out.float().clamp(-1.0, 1.0)

        decode_block.state = state
        return decode_block
