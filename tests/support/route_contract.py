"""The adapter contract suite, shared by every route's test file (`tests/test_route_<route>.py`).

Each check takes a built adapter (a tiny config) and asserts one clause of `BackboneAdapter`:
latent geometry and codec shapes, causal-cache exactness, teacher-forcing agreement with the
rollout, and the export round trip. Route files call them with their own adapter factory and add
what only they can test (PRoPE vs the route's native processor, the published parameter count).
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from solarwm.backbones.base import BackboneAdapter, load_adapter
from solarwm.camera.se3 import look_at
from solarwm.kernels.masks import block_causal_mask
from solarwm.rollout.engine import block_conditions


def make_batch(adapter: BackboneAdapter, num_frames: int, height: int, width: int, batch: int = 1) -> dict:
    """A batch the adapter's `prepare_conditions` accepts: video in [-1, 1], a walking-and-turning camera."""
    g = torch.Generator().manual_seed(0)
    poses = []
    for i in range(num_frames):
        a = 0.1 * i
        eye = (0.2 * i, math.sin(a), 1.5)
        poses.append(
            torch.as_tensor(
                look_at(eye, (eye[0] + 3 * math.cos(a), eye[1] + 3 * math.sin(a), 1.2)), dtype=torch.float32
            )
        )
    c2w = torch.stack(poses)[None].expand(batch, -1, -1, -1).clone()
    K = torch.tensor([0.9 * width, 0.9 * width, width / 2, height / 2]).expand(batch, num_frames, 4).clone()
    return {
        "video": torch.rand(batch, 3, num_frames, height, width, generator=g) * 2 - 1,
        "c2w": c2w,
        "K": K,
        "caption": ["a street"] * batch,
        "sample_id": [f"s{i}" for i in range(batch)],
    }


def perturb(adapter: BackboneAdapter, scale: float = 0.02) -> None:
    """Move the transformer's weights off their init (zero-initialised output layers hide bugs)."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in adapter.transformer.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g).to(p.dtype))


def check_geometry(adapter: BackboneAdapter, batch: dict) -> torch.Tensor:
    """encode/decode shapes follow the declared compression; returns the latents."""
    video = batch["video"]
    f = adapter.latent_frames(video.shape[2])
    with torch.no_grad():
        latents = adapter.encode(video)
        assert latents.shape == (
            video.shape[0],
            adapter.latent_channels,
            f,
            video.shape[3] // adapter.spatial_compression,
            video.shape[4] // adapter.spatial_compression,
        )
        decoded = adapter.decode(latents)
    assert decoded.shape == video.shape
    assert len(adapter.latent_to_pixel_frame(f)) == f
    return latents


def _inputs(adapter: BackboneAdapter, latents: torch.Tensor, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(latents.shape, generator=g)
    sigma = torch.rand(latents.shape[0], latents.shape[2], generator=g) * 0.8 + 0.1
    return x, sigma


def _block(adapter: BackboneAdapter, cond: dict, sl: slice) -> dict:
    """The rollout's own per-block slice of ``cond`` (every per-latent-frame entry the adapter declares)."""
    return block_conditions(adapter, cond, sl)


def check_cache_exact(adapter: BackboneAdapter, batch: dict, atol: float = 1e-4) -> None:
    """Committing block by block (window >= all blocks) equals one uncached block-causal forward."""
    adapter.eval()
    with torch.no_grad():
        latents = adapter.encode(batch["video"])
        cond = adapter.prepare_conditions(batch)
        x, sigma = _inputs(adapter, latents, 2)
        f, (h, w) = x.shape[2], x.shape[-2:]
        assert len(adapter.block_slices(f)) >= 2, "use a clip of at least two causal blocks"
        mask = block_causal_mask(f, adapter.tokens_per_frame(h, w), adapter.frames_per_block)
        reference = adapter(x, sigma, cond, attn_mask=mask)
        cache = adapter.new_cache(h, w)
        outs = [
            adapter(x[:, :, sl], sigma[:, sl], _block(adapter, cond, sl), kv_cache=cache, commit=True)
            for sl in adapter.block_slices(f)
        ]
    torch.testing.assert_close(torch.cat(outs, 2), reference, atol=atol, rtol=atol)


def check_teacher_forcing_matches_rollout(adapter: BackboneAdapter, batch: dict, atol: float = 1e-4) -> None:
    """The teacher-forced noisy prediction equals cached queries over committed clean history."""
    adapter.eval()
    with torch.no_grad():
        clean = adapter.encode(batch["video"])
        cond = adapter.prepare_conditions(batch)
        noisy, sigma = _inputs(adapter, clean, 3)
        tf = adapter.forward_teacher_forcing(clean, noisy, sigma, cond)
        h, w = clean.shape[-2:]
        cache = adapter.new_cache(h, w)
        outs = []
        for sl in adapter.block_slices(clean.shape[2]):
            outs.append(adapter(noisy[:, :, sl], sigma[:, sl], _block(adapter, cond, sl), kv_cache=cache))
            adapter(
                clean[:, :, sl], torch.zeros_like(sigma[:, sl]), _block(adapter, cond, sl), kv_cache=cache, commit=True
            )
    torch.testing.assert_close(tf, torch.cat(outs, 2), atol=atol, rtol=atol)


def check_export_round_trip(adapter: BackboneAdapter, batch: dict, directory: Path) -> None:
    """save_adapter then load_adapter rebuilds an adapter with identical outputs."""
    adapter.eval()
    with torch.no_grad():
        latents = adapter.encode(batch["video"])
        x, sigma = _inputs(adapter, latents, 4)
        expected = adapter(x, sigma, adapter.prepare_conditions(batch))
        loaded = load_adapter(adapter.save_adapter(directory, stage="bidirectional")).eval()
        assert type(loaded) is type(adapter)
        torch.testing.assert_close(loaded(x, sigma, loaded.prepare_conditions(batch)), expected)


def parameter_count(adapter: BackboneAdapter) -> int:
    """Parameters of the transformer (the published count the paper's Table 4 gives)."""
    return sum(p.numel() for p in adapter.transformer.parameters())


def check_lora(adapter: BackboneAdapter, batch: dict, directory: Path, lora: dict) -> None:
    """LoRA on the route (``enable_lora``): only LoRA (+ camera) weights train, B = 0 leaves the outputs
    unchanged, a non-zero LoRA keeps the cache exact, and both exports (LoRA, merged) reproduce the outputs.

    ``adapter``: a plain built adapter (no LoRA yet); ``lora``: ``{rank, alpha, target_modules, dropout}``.
    Needs a batch of at least two causal blocks.
    """
    adapter.eval()
    with torch.no_grad():
        latents = adapter.encode(batch["video"])
        x, sigma = _inputs(adapter, latents, 5)
        cond = adapter.prepare_conditions(batch)
        base = adapter(x, sigma, cond)
        adapter.enable_lora(lora)
        lora_params = {id(p) for p in adapter.lora_parameters()}
        camera = {id(p) for p in adapter.camera_parameters(adapter.transformer)}
        assert lora_params and {id(p) for p in adapter.trainable_parameters()} == lora_params | camera
        frozen = [p for p in adapter.transformer.parameters() if id(p) not in lora_params | camera]
        assert frozen and not any(p.requires_grad for p in frozen)
        torch.testing.assert_close(adapter(x, sigma, cond), base, rtol=0, atol=0)  # B = 0 at init
        g = torch.Generator().manual_seed(6)
        for p in adapter.lora_parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g).to(p.dtype))
        expected = adapter(x, sigma, cond)
    check_cache_exact(adapter, batch)
    with torch.no_grad():
        loaded = load_adapter(adapter.save_adapter(directory / "lora", stage="bidirectional")).eval()
        assert loaded.lora_config == adapter.lora_config
        torch.testing.assert_close(loaded(x, sigma, loaded.prepare_conditions(batch)), expected, rtol=0, atol=0)
        merged_dir = adapter.save_adapter(directory / "merged", stage="bidirectional", merge_lora=True)
        assert not (merged_dir / "lora").exists()
        merged = load_adapter(merged_dir).eval()
        assert merged.lora_config is None
        # W + BA rounds differently from W x + B(A x): float32 rounding, relative to the output's size
        # (torch 2.13: 1 of 98,304 LTX outputs off by 1.14e-5).
        torch.testing.assert_close(merged(x, sigma, merged.prepare_conditions(batch)), expected, rtol=1e-5, atol=1e-5)
