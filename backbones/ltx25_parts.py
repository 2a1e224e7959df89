"""Parts of route ``ltx25`` that wrap or load diffusers/transformers objects: the LTX-2 VAE codec, the online
Gemma feature encoder and the selective safetensors loader that reads a published audio-visual checkpoint's
video tensors only. The adapter (``solarwm.backbones.ltx25``) builds them."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn as nn
from diffusers import AutoencoderKLLTX2Video
from safetensors import safe_open

from solarwm.backbones.base import AdapterError
from solarwm.backbones.codecs import check_video


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
        check_video(video, self.temporal_compression, self.spatial_compression, "LTXVAECodec.encode")
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

        decode_block.state = state
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
        arch = (read_json(model_dir / "config.json").get("architectures") or ["AutoModel"])[0]
        model_class = getattr(transformers, arch, None)
        if model_class is None:
            raise AdapterError(f"ltx25: {model_dir}: transformers has no class {arch!r}")
        self.model = model_class.from_pretrained(str(model_dir), local_files_only=True, use_safetensors=True)
        self.tokenizer = AutoTokenizer.from_pretrained(str(tok_dir), local_files_only=True)
        self.tokenizer.padding_side = "left"  # as the LTX-2 pipelines
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        cfg = read_json(cdir / "config.json")
        if not cfg.get("per_modality_projections", False):
            raise AdapterError(f"ltx25: {cdir} is an LTX-2.0 connector (no per-modality video projection)")
        self.caption_channels, self.video_hidden_dim = int(cfg["caption_channels"]), int(cfg["video_hidden_dim"])
        self.video_text_proj_in = nn.Linear(
            self.caption_channels * int(cfg["text_proj_in_factor"]), self.video_hidden_dim,
            bias=bool(cfg.get("proj_bias", False)),
        )
        load_selected(self.video_text_proj_in, cdir, prefix="video_text_proj_in.")
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


def read_json(path: Path) -> dict[str, Any]:
    """A checkpoint folder's JSON config; an unreadable one is an ``AdapterError`` naming the path."""
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise AdapterError(f"ltx25: cannot read {path}: {e}") from e


def load_selected(model: nn.Module, folder: Path, prefix: str = "") -> None:
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
