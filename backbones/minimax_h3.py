"""Route ``minimax_h3``: SolarWM-minimax-h3-33B on diffusers' ``MiniMaxH3Transformer3DModel`` (paper §6, Table 4).

The route keeps H3's native multimodal packing instead of turning it into a video-only DiT. One forward
packs, per sample, the rows

    [ caption (text) rows | one-frame VisualVAE anchor rows | audio rows | target video rows ]
      tag 1, t = 1          tag 0, t = 0.999                tag 2, t = 1   tag 0, t = 1 - sigma

(tags: H3's modality tags, 0 video / 1 text / 2 audio; ``t``: H3's native time, see below).

* **Text rows.** The published model reads Qwen joint caption/image features (``text_dim`` 5120). The Qwen
  conditioner is frozen and not part of this route: batches carry precomputed ``text_embeds``
  (``text_encoder="none"``). The embedded default uses ``HashingTextEncoder`` at ``text_dim``.
* **Anchor rows.** The first frame, encoded *alone* by the codec (H3's VisualVAE encodes a single frame through
  its spatial path: one latent frame), patchified like the video; ``cond["image_anchor"] [B, C, 1, h, w]``
  (not the engine's ``cond["anchor"]``, which names anchor frames *inside* the video and is empty here). It is a
  separate condition, not latent 0 of
  the video, so ``clean_latent_frames = 0``: target latent 0 stays generated and supervised. The anchor carries
  native ``t = config.anchor_t`` (0.999, H3's ``keyframe_timestep``); the reference additionally mixes in 0.1 %
  noise as a training augmentation, which this route leaves out so that a forward is a function of its inputs.
* **Audio rows.** H3's audio stream is kept because it is small; it carries encoded silence and no loss.
  ``config.audio_rows`` rows of ``audio_in_channels`` (published: 264 = ceil(158 / 24 fps x 40 AudioVAE
  latents/s), the 158-frame training clip) at native ``t = config.audio_t`` (1.0: a clean condition). The
  silence latent is a fixed buffer: zeros, or the AudioVAE encoding of silence read from
  ``config.audio_silence_path`` (a safetensors file with one tensor ``silence [audio_rows, audio_in_channels]``).
  The same rows serve every clip length and the hour-long rollout (silence carries no timing).
* **Target rows.** The latents patchified by ``patch_size`` (1, 2, 2), frame-major (t, h, w); each row holds the
  patch channels in (c, ph, pw) order (NB: the official packer's channel order was not available here; a
  pretrained checkpoint must be checked against it).

Positions (H3's 3-axis MM-RoPE, ``(t, h, w)`` per row): text row i at (i, i, i); video time starts at
``L`` = the number of text rows; the anchor sits at the time of frame 0, (L, y, x); target frame j at
(L + j, y, x); audio row i at (L + i·ρ,)·3 with ρ = latent frames per second / audio latents per second,
so audio is time-aligned with the video.

**Time convention.** H3 is data-ward: ``x_t = t·x0 + (1 - t)·eps``, ``t = 1`` clean, and the network predicts
the native velocity ``d x_t / d t = x0 - eps``. The contract is noise-ward: ``sigma`` = noise level,
``x_sigma = (1 - sigma)·x0 + sigma·eps``, target ``eps - x0``. So inside the route ``t = 1 - sigma`` (model
timestep, unscaled in [0, 1]) and ``prediction = -(native output)``; nothing outside this module sees ``t``.
The flow map's ``r`` converts the same way (``r_native = 1 - r_sigma``).

**Latent geometry.** H3's VisualVAE encodes 17-frame clips with the latent cadence (1, 4, 4, 4, 4) and drops
the 3 trailing latents of the last clip: ``17n + 5`` pixel frames -> ``5n + 2`` latent frames (158 -> 47).
Latent ``5c + k`` stands for the last pixel frame of its group: ``17c + (0, 4, 8, 12, 16)[k]``.
Codecs: ``h3_patchify`` (embedded default: lossless, the same cadence, each 17-frame chunk through
``PatchifyCodec``) or ``h3_vae`` (``AutoencoderKLMiniMaxH3``: latents normalised by ``latents_mean/std``, pixels
ImageNet-normalised as the class expects).

**Camera.** Head dim 128: H3's MM-RoPE rotates dims [0:96) (2·3·``rope_freq_dim``); fused PRoPE
(``solarwm.kernels.prope.prope_attention``) acts on [96:128) only (``camera_head_dims``). The anchor and the
target rows carry cameras (the anchor: camera of latent frame 0); text and audio rows carry the identity
projective matrix, so they see no camera. Cameras are w2c relative to the clip's first latent frame (the
reference's first-frame-relative viewmats, not rebased per window). ``H3PRoPEAttnProcessor`` does the class's
own q/k/v, per-head RMS norms and MM-RoPE, then ``prope_attention``. Parameter-free: ``camera_state_dict()`` is
empty.

**Batching.** The diffusers class shares one packed layout (one timestep table, one set of row indices) across
the batch, but the contract gives every sample its own ``sigma``. The route therefore folds the batch into the
packed sequence (batch 1 for diffusers, ``B`` documents back to back with per-sample timestep entries) and the
attention processors unfold it: attention never crosses samples. The text refiner runs unfolded (a pre/post
hook on ``token_refiner``).

**Causal mode** (reference §1.3, §4.2-4.3): ``frames_per_block = 5``, a window of 6 blocks. The prefix rows
(text, anchor, audio) are a permanent condition: every video row sees all of them, and prefix rows see only
the prefix (so their K/V do not depend on the video and are recomputed on every call instead of being
cached). Teacher forcing: ``[prefix | clean video | noisy video]``; clean rows see the prefix and the clean
video up to their block, noisy block i sees the prefix, clean blocks [i-5, i) and itself; clean and noisy
copies share positions and cameras. The KV cache (``solarwm.kernels.kv_cache.KVCache``) holds the un-roped
video K/V of the last 5 blocks; video positions are window-local (L + 0..W-1, the query block at the tail),
prefix positions stay native. The cache also remembers the rollout's first camera (``h3_origin``), the
anchor's camera and the reference of every relative viewmat. Without a mask (stage 1) the attention is H3's
native full attention over the whole packed sequence. As in the reference, teacher forcing keeps absolute video
positions (L + 0..f-1) while the rollout is window-local, so once the window rolls (more than 6 blocks) the
prefix-to-video position offsets differ between the two (video-to-video offsets do not); within the window the
cached rollout equals teacher forcing exactly (tested). On CUDA the teacher-forcing mask is a FlexAttention
``BlockMask`` (``flex_masks``); the cached block's mask (prefix rows see only the prefix) stays dense.
Not implemented: streaming decode of the VisualVAE (``stream_decoder`` raises), and the Qwen conditioner and the
AudioVAE themselves (their outputs come precomputed: ``text_embeds``, ``audio_silence_path``).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable, Literal

import torch
from diffusers import AutoencoderKLMiniMaxH3, MiniMaxH3Transformer3DModel
from safetensors.torch import load_file, save_file

from solarwm.backbones.base import AdapterError, BackboneAdapter, CacheWindow
from solarwm.backbones.lora import LoRAConfig
from solarwm.backbones.minimax_h3_parts import (
    CLIP_FRAMES,
    H3_LORA_TARGETS,
    LATENTS_PER_CLIP,
    SILENCE_FILE,
    TAG_AUDIO,
    TAG_TEXT,
    TAG_VIDEO,
    VAE_CONFIGS,
    H3AttentionContext,
    H3PatchifyCodec,
    H3PRoPEAttnProcessor,
    H3VAECodec,
    MiniMaxH3Config,
    attach_h3_context,
    h3_latent_frames,
    h3_latent_to_pixel_frame,
    h3_valid_num_frames,
)
from solarwm.backbones.pretrained import load_transformer, load_vae
from solarwm.backbones.text import HashingTextEncoder
from solarwm.kernels.kv_cache import KVCache
from solarwm.kernels.masks import MaskMod, flex_block_mask, teacher_forcing_mask, teacher_forcing_mask_mod

__all__ = ["H3_LORA_TARGETS", "MiniMaxH3Adapter", "MiniMaxH3Config"]


# ---------------------------------------------------------------------------------------------- adapter
class MiniMaxH3Adapter(BackboneAdapter):
    """Backbone adapter of SolarWM-minimax-h3-33B: native H3 packing, data-ward time inside, PRoPE on [96:128).

    ``config`` (default: ``preset``'s); ``pretrained_path``: a local diffusers folder with ``transformer/``
    (and ``vae/`` for ``codec="h3_vae"``); ``device="meta"`` builds without allocating (parameter counting);
    ``lora``: LoRA on the transformer (``BackboneAdapter.enable_lora``; published recipes: rank 384 on
    ``H3_LORA_TARGETS``).
    """

    route = "minimax_h3"
    transformer_block = "diffusers.models.transformers.transformer_minimax_h3:MiniMaxH3TransformerBlock"
    config_class = MiniMaxH3Config
    clean_latent_frames = 0  # the image is a separate anchor condition; latent 0 is generated and supervised
    timestep_scale = 1.0  # native t = 1 - sigma, unscaled
    frames_per_block = 5
    window_blocks = 6
    dense_masks_only = True  # the prefix masks are built densely around the video-row mask
    missing_text_message = "batch has no 'text_embeds' (the Qwen caption/image rows) and text_encoder='none'"
    #: Teacher-forcing mask as a FlexAttention ``BlockMask`` (True), a dense bool mask (False) or by device
    #: (None: BlockMask on CUDA, where a dense mask of the published layout, ~96.5k rows, would take ~9 GB).
    flex_masks: bool | None = None

    def __init__(
        self,
        config: MiniMaxH3Config | None = None,
        preset: Literal["tiny", "published"] = "tiny",
        pretrained_path: str | None = None,
        device: str | None = None,
        lora: LoRAConfig | None = None,
    ) -> None:
        super().__init__(config=config, preset=preset, pretrained_path=pretrained_path, device=device, lora=lora)

    # ------------------------------------------------------------------ building
    def check_config(self, config: MiniMaxH3Config) -> None:
        """Patch ``(1, p, p)``; PRoPE dims after the MM-RoPE dims, a multiple of 4 long."""
        super().check_config(config)
        rotary = 6 * config.rope_freq_dim
        start, stop = config.camera_head_dims
        if not (rotary <= start < stop <= config.attention_head_dim and (stop - start) % 4 == 0):
            raise AdapterError(
                f"{self.route}: camera_head_dims {config.camera_head_dims} must lie in [{rotary}, "
                f"{config.attention_head_dim}) (after the MM-RoPE dims) with a length divisible by 4"
            )

    def _build_model(self, root: Path | None, meta: bool) -> None:
        expected = self.config.transformer_kwargs(self.codec.latent_channels)
        layout = "transformer/ (and vae/ for codec='h3_vae')"
        self.transformer = load_transformer(self.route, MiniMaxH3Transformer3DModel, root, expected, None, layout)

    def _build_text_encoder(self, root: Path | None, meta: bool) -> torch.nn.Module | None:
        cfg = self.config
        if cfg.text_encoder not in ("hashing", "none"):
            raise AdapterError(f"{self.route}: unknown text_encoder {cfg.text_encoder!r}; expected 'hashing' or 'none'")
        return (
            HashingTextEncoder(cfg.text_dim, max_length=cfg.text_max_length) if cfg.text_encoder == "hashing" else None
        )

    def _build_extras(self, root: Path | None, device: str | None) -> None:
        self.register_buffer("silence", self._silence(), persistent=False)

    def install_processors(self) -> None:
        """PRoPE on every block's attention; the rotary hook carries the context; the text refiner unfolds the batch."""
        for index, block in enumerate(self.transformer.transformer_blocks):
            block.attn.set_processor(H3PRoPEAttnProcessor(self.config.camera_head_dims, layer_index=index))
        self.transformer.rope.register_forward_hook(attach_h3_context)
        self.transformer.rope._solarwm_context = None
        self._fold = 1  # documents folded into the packed sequence of the current call
        self.transformer.token_refiner.register_forward_pre_hook(self._unfold_text)
        self.transformer.token_refiner.register_forward_hook(self._fold_text)

    def _build_codec(self, root: Path | None) -> torch.nn.Module:
        cfg = self.config
        if cfg.codec == "h3_patchify":
            return H3PatchifyCodec(spatial=cfg.patchify_spatial)
        if cfg.codec != "h3_vae":
            raise AdapterError(f"{self.route}: unknown codec {cfg.codec!r}; expected 'h3_vae' or 'h3_patchify'")
        return H3VAECodec(load_vae(self.route, AutoencoderKLMiniMaxH3, root, cfg.codec, cfg.vae_config, VAE_CONFIGS))

    def _silence(self) -> torch.Tensor:
        cfg = self.config
        shape = (cfg.audio_rows, cfg.audio_in_channels)
        if cfg.audio_silence_path is None:
            return torch.zeros(shape)
        path = Path(cfg.audio_silence_path)
        if not path.is_file():
            raise AdapterError(f"{self.route}: audio_silence_path {path} not found")
        tensors = load_file(str(path))
        if "silence" not in tensors or tuple(tensors["silence"].shape) != shape:
            raise AdapterError(f"{self.route}: {path} must hold one tensor 'silence' of shape {shape}")
        return tensors["silence"].float()

    @property
    def num_layers(self) -> int:
        """H3 blocks with a KV-cache slot (the text refiner has none)."""
        return len(self.transformer.transformer_blocks)

    # ------------------------------------------------------------------ latent geometry (17n + 5 -> 5n + 2)
    def valid_num_frames(self, num_frames: int) -> bool:
        """True when ``num_frames = 17n + 5`` (H3's VisualVAE: 17-frame clips, 3 trailing latents dropped)."""
        return h3_valid_num_frames(num_frames)

    def latent_frames(self, num_frames: int) -> int:
        """``17n + 5 -> 5n + 2`` (158 -> 47); raises on any other count."""
        if not self.valid_num_frames(num_frames):
            raise AdapterError(f"{self.route}: {num_frames} frames is not a valid clip length (needs 17*n + 5)")
        return h3_latent_frames(num_frames)

    def latent_to_pixel_frame(self, num_latent_frames: int) -> torch.Tensor:
        """Latent ``5c + k`` -> pixel frame ``17c + (0, 4, 8, 12, 16)[k]`` (cadence (1, 4, 4, 4, 4))."""
        return h3_latent_to_pixel_frame(num_latent_frames)

    # ------------------------------------------------------------------ codec
    def stream_decoder(self) -> Callable[[torch.Tensor], torch.Tensor]:
        """Block-by-block decode (exact for the patchify codec; the VisualVAE's overlap decoder is not streamed)."""
        if not isinstance(self.codec, H3PatchifyCodec):
            raise NotImplementedError(
                f"{self.route}: streaming decode of the VisualVAE (non-causal ViT decoder with temporal overlap "
                "blending) is not implemented; decode the whole clip with decode()"
            )
        return super().stream_decoder()

    # ------------------------------------------------------------------ conditions
    def prepare_conditions(self, batch: dict[str, Any]) -> dict[str, Any]:
        """Text rows, per-latent-frame cameras and the anchor latent ``image_anchor [B, C, 1, h, w]`` (frame 0 alone).

        The anchor (``cond['image_anchor']``; not the engine's ``cond['anchor']``, which means anchor frames
        *inside* the video and is empty here since ``clean_latent_frames = 0``) comes from
        ``batch['image_anchor']`` if given, else ``batch['first_frame'] [B, 3, H, W]`` (samplers,
        rollouts) or the first video frame, encoded alone, else (cached
        latents only) latent 0: both codecs encode frame 0 alone into latent 0 (tested), so the two agree.
        """
        c2w, K = self.latent_cameras(batch["c2w"], batch["K"])
        embeds, mask = self.text_features(batch)
        device = batch["c2w"].device
        if "image_anchor" in batch:
            anchor = batch["image_anchor"]
        elif "first_frame" in batch:
            with torch.no_grad():
                anchor = self.encode(batch["first_frame"][:, :, None])
        elif "video" in batch:
            with torch.no_grad():
                anchor = self.encode(batch["video"][:, :, :1])
        elif "latents" in batch:
            anchor = batch["latents"][:, :, :1]
        else:
            raise AdapterError(
                f"{self.route}: batch needs 'image_anchor', 'first_frame', 'video' or 'latents' for the image anchor"
            )
        return {
            "text_embeds": embeds.to(device),
            "text_mask": mask.to(device) if mask is not None else None,
            "c2w": c2w,
            "K": K,
            "image_size": self._image_size(batch),
            "num_frames": batch["c2w"].shape[1],
            "image_anchor": anchor.to(device).float(),
        }

    # ------------------------------------------------------------------ packing
    def _unfold_text(self, module: torch.nn.Module, args: tuple) -> tuple:
        x = args[0]
        return (x.reshape(self._fold, x.shape[1] // self._fold, x.shape[2]),) + tuple(args[1:])

    def _fold_text(self, module: torch.nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
        return output.reshape(1, -1, output.shape[-1])

    def _patchify(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, C, f, h, w]`` -> rows ``[B, f*(h/p)*(w/p), C*p*p]`` (frame-major, channels (c, ph, pw))."""
        b, c, f, h, w = x.shape
        p = self.patch_size
        x = x.reshape(b, c, f, h // p, p, w // p, p).permute(0, 2, 3, 5, 1, 4, 6)
        return x.reshape(b, f * (h // p) * (w // p), c * p * p)

    def _unpatchify(self, rows: torch.Tensor, f: int, h: int, w: int) -> torch.Tensor:
        b, c, p = rows.shape[0], self.latent_channels, self.patch_size
        x = rows.reshape(b, f, h // p, w // p, c, p, p).permute(0, 4, 1, 2, 5, 3, 6)
        return x.reshape(b, c, f, h, w)

    def _prefix_layout(self, num_text: int, grid: tuple[int, int], device: torch.device) -> dict[str, torch.Tensor]:
        """Positions ``[P, 3]``, tags ``[P]`` and group ids ``[P]`` (0 text, 1 anchor, 2 audio) of the prefix rows."""
        gh, gw = grid
        text = torch.arange(num_text, dtype=torch.float32)[:, None].expand(num_text, 3)
        yy, xx = torch.meshgrid(torch.arange(gh), torch.arange(gw), indexing="ij")
        anchor = torch.stack([torch.full((gh * gw,), float(num_text)), yy.flatten().float(), xx.flatten().float()], 1)
        rho = (self.config.fps * LATENTS_PER_CLIP / CLIP_FRAMES) / self.config.audio_latents_per_second
        audio = (num_text + rho * torch.arange(self.config.audio_rows, dtype=torch.float32))[:, None].expand(-1, 3)
        sizes = (num_text, gh * gw, self.config.audio_rows)
        return {
            "positions": torch.cat([text, anchor, audio]).to(device),
            "tags": torch.tensor([TAG_TEXT, TAG_VIDEO, TAG_AUDIO]).repeat_interleave(torch.tensor(sizes)).to(device),
            "groups": torch.arange(3).repeat_interleave(torch.tensor(sizes)).to(device),
        }

    def _video_positions(self, temporal: torch.Tensor, num_text: int, grid: tuple[int, int], device) -> torch.Tensor:
        """Rows ``[len(temporal)*gh*gw, 3]`` at ``(num_text + temporal[j], y, x)``, frame-major."""
        gh, gw = grid
        n = temporal.numel()
        t = (num_text + temporal.float()).view(n, 1, 1).expand(n, gh, gw)
        yy = torch.arange(gh).view(1, gh, 1).expand(n, gh, gw).float()
        xx = torch.arange(gw).view(1, 1, gw).expand(n, gh, gw).float()
        return torch.stack([t, yy, xx], -1).reshape(-1, 3).to(device)

    @staticmethod
    def _identity_cameras(b: int, n: int, image_size: tuple[int, int], device) -> tuple[torch.Tensor, torch.Tensor]:
        """Cameras whose PRoPE matrix is exactly the identity (w2c = I, K = (W, H, W/2, H/2))."""
        width, height = image_size
        view = torch.eye(4, device=device).expand(b, n, 4, 4)
        K = torch.tensor([width, height, width / 2, height / 2], dtype=torch.float32, device=device).expand(b, n, 4)
        return view, K

    def _prefix_cameras(
        self, origin_K: torch.Tensor, num_text: int, tpf: int, image_size: tuple[int, int]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The prefix's per-row cameras: identity on text/audio, origin camera (w2c = I, K of frame 0) on the anchor."""
        b, device = origin_K.shape[0], origin_K.device
        tv, tk = self._identity_cameras(b, num_text, image_size, device)
        av, ak = self._identity_cameras(b, self.config.audio_rows, image_size, device)
        anchor_v = torch.eye(4, device=device).expand(b, tpf, 4, 4)
        anchor_k = origin_K.float().reshape(b, 1, 4).expand(b, tpf, 4)
        return torch.cat([tv, anchor_v, av], 1), torch.cat([tk, anchor_k, ak], 1)

    @staticmethod
    def _relative_viewmats(c2w: torch.Tensor, origin_c2w: torch.Tensor) -> torch.Tensor:
        """w2c of ``c2w [B, f, 4, 4]`` relative to ``origin_c2w [B, 1, 4, 4]`` (float64 math, float32 out)."""
        both = torch.cat([origin_c2w.to(c2w.device, torch.float64), c2w.to(torch.float64)], 1)
        return BackboneAdapter.window_viewmats(both, 0)[:, 1:]

    def run_transformer(
        self,
        x: torch.Tensor,
        sigma_per_frame: torch.Tensor,
        r_per_frame: torch.Tensor | None,
        cond: dict[str, Any],
        context: tuple[H3AttentionContext, torch.Tensor],
        copies: int = 1,
    ) -> torch.Tensor:
        """H3 on ``x [B, C, F, h, w]`` at native times ``t = 1 - sigma`` (and ``1 - r``): its native output."""
        context, positions = context
        _, _, frames, h, w = x.shape
        grid = (h // self.patch_size, w // self.patch_size)
        r_native = None if r_per_frame is None else 1.0 - r_per_frame.float()
        out = self._run(self._patchify(x), 1.0 - sigma_per_frame.float(), r_native, positions, cond, grid, context)
        return self._unpatchify(out, frames, h, w)

    def _run(
        self,
        video_rows: torch.Tensor,
        video_t: torch.Tensor,
        video_r: torch.Tensor | None,
        video_positions: torch.Tensor,
        cond: dict[str, Any],
        grid: tuple[int, int],
        context: H3AttentionContext,
    ) -> torch.Tensor:
        """One H3 forward over ``B`` folded documents ``[text | anchor | audio | video rows]``.

        ``video_rows [B, N, Cp]`` (patchified, frame-major, ``tpf`` rows per frame); ``video_t``/``video_r``
        ``[B, N / tpf]`` native times per frame; returns the native output of the video rows ``[B, N, Cp]``.
        """
        text = cond["text_embeds"]
        b, n, _ = video_rows.shape
        tpf = grid[0] * grid[1]
        num_text = text.shape[1]
        device = video_rows.device
        anchor_rows = self._patchify(cond["image_anchor"].to(device, video_rows.dtype))
        if anchor_rows.shape != (b, tpf, video_rows.shape[2]):
            raise AdapterError(
                f"{self.route}: anchor latent {tuple(cond['image_anchor'].shape)} does not match the video latents "
                f"(one frame of [B={b}, C={self.latent_channels}, h, w])"
            )
        prefix = self._prefix_layout(num_text, grid, device)
        p = prefix["positions"].shape[0]
        frames = n // tpf
        rows = p + n
        # Timestep table: per document, entries [text, anchor, audio, frame 0 .. frame F-1].
        cfg = self.config
        fixed = torch.tensor([1.0, cfg.anchor_t, cfg.audio_t], device=device).expand(b, 3)
        t_table = torch.cat([fixed, video_t.to(device, torch.float32)], 1)  # [B, G]
        groups = torch.cat([prefix["groups"], 3 + torch.arange(frames, device=device).repeat_interleave(tpf)])
        g = t_table.shape[1]
        timestep_indices = (torch.arange(b, device=device)[:, None] * g + groups[None]).reshape(-1)
        token_tags = torch.cat([prefix["tags"], torch.full((n,), TAG_VIDEO, device=device)]).repeat(b)
        position_ids = torch.cat([prefix["positions"], video_positions.to(device)]).repeat(b, 1)
        offsets = torch.arange(b, device=device)[:, None] * rows
        local = torch.arange(rows, device=device)
        text_idx = (offsets + local[:num_text]).reshape(-1)
        video_idx = (offsets + torch.cat([local[num_text : num_text + tpf], local[p:]])).reshape(-1)
        audio_idx = (offsets + local[num_text + tpf : p]).reshape(-1)

        if video_r is not None:
            self._flow_map_r = torch.cat([fixed, video_r.to(device, torch.float32)], 1).reshape(-1)
        dtype = self.transformer.dtype
        silence = self.silence.to(device).expand(b, -1, -1)
        self.transformer.rope._solarwm_context = context
        self._fold = b
        try:
            out = self.transformer(
                hidden_states=torch.cat([anchor_rows, video_rows], 1).reshape(1, -1, video_rows.shape[2]).to(dtype),
                audio_hidden_states=silence.reshape(1, -1, silence.shape[2]).to(dtype),
                encoder_hidden_states=text.reshape(1, -1, text.shape[2]).to(dtype),
                timestep=t_table.reshape(-1),
                timestep_indices=timestep_indices,
                token_tags=token_tags,
                position_ids=position_ids,
                video_indices=video_idx,
                audio_indices=audio_idx,
                text_indices=text_idx,
                return_dict=False,
            )[0]
        finally:
            self.transformer.rope._solarwm_context = None
            self._flow_map_r = None
        return out.reshape(b, tpf + n, -1)[:, tpf:].to(video_rows.dtype)

    @staticmethod
    def _prefix_mask_mod(video_mod: MaskMod, prefix_rows: int) -> MaskMod:
        """``mask_mod`` over ``[prefix | video rows]``: the video rows follow ``video_mod`` among themselves and see
        the whole prefix; prefix rows see only the prefix (the dense twin is ``_full_mask``)."""
        p = prefix_rows

        def mask_mod(b, h, q_idx, kv_idx):
            kv_prefix = kv_idx < p
            video = (q_idx >= p) & ~kv_prefix & video_mod(b, h, (q_idx - p).clamp_min(0), (kv_idx - p).clamp_min(0))
            return kv_prefix | video

        return mask_mod

    @staticmethod
    def _full_mask(
        video_mask: torch.Tensor | None, prefix_rows: int, kv_prefix_rows: int | None = None
    ) -> torch.Tensor | None:
        """Extend a video-row mask ``[Nq, Nk]`` (or ``[B, 1, Nq, Nk]``) with the prefix: video rows see the whole
        prefix, prefix rows see only the prefix."""
        if video_mask is None:
            return None
        kp = prefix_rows if kv_prefix_rows is None else kv_prefix_rows
        lead = video_mask.shape[:-2]
        nq, nk = video_mask.shape[-2:]
        full = torch.zeros(*lead, prefix_rows + nq, kp + nk, dtype=torch.bool, device=video_mask.device)
        full[..., :prefix_rows, :kp] = True
        full[..., prefix_rows:, :kp] = True
        full[..., prefix_rows:, kp:] = video_mask.bool()
        return full

    # ------------------------------------------------------------------ model call
    def _check_input(self, x_t: torch.Tensor, sigma_per_frame: torch.Tensor, cond: dict[str, Any]) -> None:
        super()._check_input(x_t, sigma_per_frame, cond)
        if "image_anchor" not in cond:
            raise AdapterError(
                f"{self.route}: cond has no 'image_anchor' (the one-frame image latent H3 packs as a condition); "
                "build cond with prepare_conditions (or set cond['image_anchor'] = encode(first_frame[:, :, None]))"
            )
        if x_t.shape[-2] % self.patch_size or x_t.shape[-1] % self.patch_size:
            raise AdapterError(
                f"{self.route}: latent size {tuple(x_t.shape[-2:])} not divisible by patch {self.patch_size}"
            )

    @staticmethod
    def native_velocity_to_target(native: torch.Tensor) -> torch.Tensor:
        """H3's native velocity ``d x_t / d t = x0 - eps`` (t = 1 clean) -> the contract target ``eps - x0``."""
        return -native

    def native_output(self, out: torch.Tensor, x_t: torch.Tensor, sigma_per_frame: torch.Tensor) -> torch.Tensor:
        """The contract's ``eps - x0`` from H3's native velocity (its t = 1 - sigma convention stays inside)."""
        return self.native_velocity_to_target(out)

    def _layout(self, x: torch.Tensor, cond: dict[str, Any]) -> tuple[tuple[int, int], int, int, int]:
        """``(grid, rows per frame, text rows, prefix rows)`` of latents ``x [B, C, f, h, w]``."""
        grid = (x.shape[-2] // self.patch_size, x.shape[-1] // self.patch_size)
        tpf = grid[0] * grid[1]
        num_text = cond["text_embeds"].shape[1]
        return grid, tpf, num_text, num_text + tpf + self.config.audio_rows

    def attention_context(
        self, x_t: torch.Tensor, cond: dict[str, Any], attn_mask: torch.Tensor | None
    ) -> tuple[H3AttentionContext, torch.Tensor]:
        """``[prefix | video]`` with cameras relative to frame 0; ``attn_mask`` masks video rows among themselves
        (prefix rows stay visible to all video rows; with a mask, prefix rows see only the prefix)."""
        grid, tpf, num_text, p = self._layout(x_t, cond)
        image_size = tuple(cond["image_size"])
        origin_c2w, origin_K = cond["c2w"][:, :1], cond["K"][:, :1]
        pv, pk = self._prefix_cameras(origin_K, num_text, tpf, image_size)
        viewmats = torch.cat([pv, self._relative_viewmats(cond["c2w"], origin_c2w).repeat_interleave(tpf, 1)], 1)
        K = torch.cat([pk, cond["K"].float().repeat_interleave(tpf, 1)], 1)
        context = H3AttentionContext(x_t.shape[0], viewmats, K, image_size, attn_mask=self._full_mask(attn_mask, p))
        return context, self._video_positions(torch.arange(x_t.shape[2]), num_text, grid, x_t.device)

    def cached_attention_context(
        self, x_t: torch.Tensor, cond: dict[str, Any], window: CacheWindow, cache: KVCache, commit: bool
    ) -> tuple[H3AttentionContext, torch.Tensor]:
        """Queries ``[prefix | block]``; keys ``[prefix | cached window | block]`` at window-local video positions."""
        grid, tpf, num_text, _ = self._layout(x_t, cond)
        device = cond["c2w"].device
        image_size = tuple(cond["image_size"])
        origin = getattr(cache, "h3_origin", None)
        if origin is None:  # the rollout's first block defines the origin (anchor camera, viewmat reference)
            origin = cache.h3_origin = (
                cond["c2w"][:, :1].detach().to(torch.float64),
                cond["K"][:, :1].detach().float(),
            )
        origin_c2w, origin_K = origin
        start, width, f = window.start, window.width, window.frames
        rel = self._relative_viewmats(window.c2w, origin_c2w)
        pv, pk = self._prefix_cameras(origin_K.to(device), num_text, tpf, image_size)
        q_view = torch.cat([pv, rel[:, start:].repeat_interleave(tpf, 1)], 1)
        q_K = torch.cat([pk, window.K[:, start:].float().repeat_interleave(tpf, 1)], 1)
        kv_view = torch.cat([pv, rel.repeat_interleave(tpf, 1)], 1)
        kv_K = torch.cat([pk, window.K.float().repeat_interleave(tpf, 1)], 1)
        prefix = self._prefix_layout(num_text, grid, device)
        p = prefix["positions"].shape[0]
        window_positions = self._video_positions(torch.arange(width), num_text, grid, device)
        kv_positions = torch.cat([prefix["positions"], window_positions])
        # Prefix queries see only the prefix; block queries see everything.
        mask = torch.ones(p + f * tpf, p + width * tpf, dtype=torch.bool, device=device)
        mask[:p, p:] = False
        context = H3AttentionContext(
            cond["c2w"].shape[0],
            q_view,
            q_K,
            image_size,
            attn_mask=mask,
            prefix_rows=p,
            cache=cache,
            commit=commit,
            kv_viewmats=kv_view,
            kv_K=kv_K,
            kv_position_ids=kv_positions,
        )
        return context, window_positions[start * tpf :]

    def teacher_forcing_context(
        self, x_noisy: torch.Tensor, cond: dict[str, Any]
    ) -> tuple[H3AttentionContext, torch.Tensor]:
        """``[prefix | clean | noisy]`` (reference §1.3): both copies share positions and cameras."""
        grid, tpf, num_text, p = self._layout(x_noisy, cond)
        b, f = x_noisy.shape[0], x_noisy.shape[2]
        image_size = tuple(cond["image_size"])
        device = x_noisy.device
        flex = self.flex_masks if self.flex_masks is not None else device.type == "cuda"
        if flex:
            video_mod = teacher_forcing_mask_mod(f, tpf, self.frames_per_block, self.window_blocks - 1)
            mask = flex_block_mask(self._prefix_mask_mod(video_mod, p), p + 2 * f * tpf, device=device)
        else:
            video = teacher_forcing_mask(
                f, tpf, self.frames_per_block, device=device, max_prior_blocks=self.window_blocks - 1
            )
            mask = self._full_mask(video, p)
        origin_c2w, origin_K = cond["c2w"][:, :1], cond["K"][:, :1]
        pv, pk = self._prefix_cameras(origin_K, num_text, tpf, image_size)
        rel = self._relative_viewmats(cond["c2w"], origin_c2w).repeat_interleave(tpf, 1)
        vK = cond["K"].float().repeat_interleave(tpf, 1)
        context = H3AttentionContext(
            b, torch.cat([pv, rel, rel], 1), torch.cat([pk, vK, vK], 1), image_size, attn_mask=mask
        )
        frames = torch.arange(f)
        return context, self._video_positions(torch.cat([frames, frames]), num_text, grid, device)

    # ------------------------------------------------------------------ AnyFlow flow map
    def time_embedding(self) -> torch.nn.Module:
        """H3's ``time_embedder`` (its output feeds every block's AdaLN table and ``norm_out``)."""
        return self.transformer.time_embedder

    def time_features(self, timesteps: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """H3's sinusoidal ``time_proj`` of native times ``[T]`` (one per timestep-table entry) shaped like ``like``."""
        proj = self.transformer.time_proj(timesteps.flatten().to(like.device))
        return proj.to(like.dtype).reshape(like.shape)

    # ------------------------------------------------------------------ export
    def _export_extra(self, directory: Path) -> None:
        """Save the (frozen) VisualVAE and a loaded silence latent next to the transformer (self-contained export)."""
        if isinstance(self.codec, H3VAECodec):
            self.codec.vae.save_pretrained(directory / "vae", safe_serialization=True)
        if self.config.audio_silence_path is not None:
            save_file({"silence": self.silence.detach().cpu().contiguous()}, str(directory / SILENCE_FILE))

    @classmethod
    def from_export(cls, directory: Path, config: MiniMaxH3Config, **kwargs: Any) -> "MiniMaxH3Adapter":
        """Rebuild from an export folder; its own copy of the silence latent replaces the recorded path."""
        if (directory / SILENCE_FILE).is_file():
            config = dataclasses.replace(config, audio_silence_path=str(directory / SILENCE_FILE))
        return cls(config=config, pretrained_path=str(directory), **kwargs)
