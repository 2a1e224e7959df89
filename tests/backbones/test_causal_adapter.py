"""Causal mode of the adapter contract on the tiny Wan2.2-5B route: teacher forcing, KV cache, flow map."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from solarwm.backbones import load_adapter, wan_attention
from solarwm.backbones.base import AdapterError
from solarwm.backbones.ltx25 import LTX25Adapter, LTX25Config
from solarwm.backbones.wan22_ti2v_5b import Wan22TI2V5BAdapter, Wan22TI2V5BConfig
from solarwm.camera.se3 import look_at
from solarwm.kernels.masks import block_causal_mask

C, HL, WL = 48, 16, 16  # patchify latents of 32x32 video: 8x8 = 64 tokens per latent frame
TPF = 64


def make_adapter(**changes) -> Wan22TI2V5BAdapter:
    torch.manual_seed(0)
    adapter = Wan22TI2V5BAdapter(config=dataclasses.replace(Wan22TI2V5BConfig.tiny(), **changes)).eval()
    with torch.no_grad():  # weights unlike a fresh init (zero-initialised output layers hide bugs)
        for p in adapter.transformer.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return adapter


def cameras(frames: int, offset=(0.0, 0.0, 0.0)) -> tuple[torch.Tensor, torch.Tensor]:
    """c2w [1, f, 4, 4] float64 walking forward and turning; K [1, f, 4]."""
    poses = []
    for i in range(frames):
        a = 0.15 * i
        eye = (offset[0] + 0.3 * i, offset[1] + 2.0 * math.sin(a), offset[2] + 1.5)
        target = (eye[0] + 3.0 * math.cos(a), eye[1] + 3.0 * math.sin(a), eye[2] - 0.3)
        poses.append(torch.as_tensor(look_at(eye, target), dtype=torch.float64))
    K = torch.tensor([[28.0, 28.0, 16.0, 16.0]]).expand(frames, 4)
    return torch.stack(poses)[None], K[None].clone()


def make_cond(adapter, frames: int, offset=(0.0, 0.0, 0.0)) -> dict:
    c2w, K = cameras(frames, offset)
    embeds, _ = adapter.text_encoder(["a quiet street"])
    return {"text_embeds": embeds, "c2w": c2w, "K": K, "image_size": (32, 32)}


def block_cond(cond: dict, sl: slice) -> dict:
    return dict(cond, c2w=cond["c2w"][:, sl], K=cond["K"][:, sl])


def inputs(frames: int, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(1, C, frames, HL, WL, generator=g)
    sigma = torch.rand(1, frames, generator=g) * 0.8 + 0.1
    return x, sigma


def teacher_forcing_and_rollout(adapter, seeds: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor, object]:
    """Over 3 blocks: the teacher-forced noisy prediction, the same queries against a cache of committed clean
    blocks, and that cache."""
    frames = 3 * adapter.frames_per_block
    clean, _ = inputs(frames, seed=seeds[0])
    noisy, sigma = inputs(frames, seed=seeds[1])
    cond = make_cond(adapter, frames)
    tf = adapter.forward_teacher_forcing(clean, noisy, sigma, cond)
    cache = adapter.new_cache(HL, WL)
    outs = []
    for sl in adapter.block_slices(frames):
        outs.append(adapter(noisy[:, :, sl], sigma[:, sl], block_cond(cond, sl), kv_cache=cache))
        adapter(clean[:, :, sl], torch.zeros_like(sigma[:, sl]), block_cond(cond, sl), kv_cache=cache, commit=True)
    return tf, torch.cat(outs, 2), cache


@torch.no_grad()
def test_cached_blocks_equal_one_block_causal_forward():
    """(a) Window >= all blocks: committing block by block reproduces the uncached block-causal forward."""
    adapter = make_adapter()
    frames = 3 * adapter.frames_per_block
    x, sigma = inputs(frames)
    cond = make_cond(adapter, frames)
    mask = block_causal_mask(frames, TPF, adapter.frames_per_block)
    reference = adapter(x, sigma, cond, attn_mask=mask)
    cache = adapter.new_cache(HL, WL)
    assert cache.max_frames >= frames
    outs = [adapter(x[:, :, sl], sigma[:, sl], block_cond(cond, sl), kv_cache=cache, commit=True)
            for sl in adapter.block_slices(frames)]
    torch.testing.assert_close(torch.cat(outs, 2), reference, atol=1e-4, rtol=1e-4)
    assert cache.frames == frames and cache.committed_frames == frames


@torch.no_grad()
def test_sliding_window_equals_uncached_forward_over_the_last_blocks():
    """(b) Window W < B: block B equals an uncached forward over the last W blocks at window-local positions.

    One layer: the cached keys of a history block then depend only on that block's own input. In deeper
    models they carry the context of the window they were committed in, exactly as the rollout intends.
    """
    adapter = make_adapter(num_layers=1)
    adapter.window_blocks = 2
    fpb = adapter.frames_per_block
    frames = 4 * fpb
    x, sigma = inputs(frames, seed=2)
    cond = make_cond(adapter, frames)
    cache = adapter.new_cache(HL, WL)
    for sl in adapter.block_slices(frames):
        last = adapter(x[:, :, sl], sigma[:, sl], block_cond(cond, sl), kv_cache=cache, commit=True)
    window = slice(frames - 2 * fpb, frames)
    mask = block_causal_mask(2 * fpb, TPF, fpb)
    reference = adapter(x[:, :, window], sigma[:, window], block_cond(cond, window), attn_mask=mask)
    torch.testing.assert_close(last, reference[:, :, fpb:], atol=1e-4, rtol=1e-4)
    assert cache.frames == fpb  # only window_blocks - 1 blocks of history are kept


@torch.no_grad()
def test_rollout_runs_past_the_rope_table_with_window_local_positions(monkeypatch):
    """(c) A rollout over more latent frames than rope_max_seq_len never indexes past the table."""
    adapter = make_adapter(num_layers=1, rope_max_seq_len=8)
    adapter.window_blocks = 2
    used: list[int] = []
    real = wan_attention.wan_rope_freqs

    def spy(rope, positions, grid_h, grid_w):
        used.append(int(positions.max()))
        return real(rope, positions, grid_h, grid_w)

    monkeypatch.setattr(wan_attention, "wan_rope_freqs", spy)
    frames = 8 * adapter.frames_per_block  # 24 latent frames > 8 table rows
    x, sigma = inputs(frames, seed=3)
    cond = make_cond(adapter, frames)
    cache = adapter.new_cache(HL, WL)
    for sl in adapter.block_slices(frames):
        out = adapter(x[:, :, sl], sigma[:, sl], block_cond(cond, sl), kv_cache=cache, commit=True)
        assert torch.isfinite(out).all()
    assert cache.committed_frames == frames > 8
    assert max(used) == 2 * adapter.frames_per_block - 1 < 8
    with pytest.raises(wan_attention.WanAttentionError, match="past the table"):
        wan_attention.wan_rope_freqs(adapter.transformer.rope, torch.tensor([8]), 8, 8)


@pytest.mark.slow
@torch.no_grad()
def test_window_relative_cameras_keep_precision_far_from_the_origin():
    """The same rollout 5 km away from the world origin gives the same output (cameras re-expressed per window)."""
    adapter = make_adapter(num_layers=1)
    fpb = adapter.frames_per_block
    frames = 3 * fpb
    x, sigma = inputs(frames, seed=4)
    outs = []
    for offset in ((0.0, 0.0, 0.0), (5000.0, -3000.0, 20.0)):
        cond = make_cond(adapter, frames, offset)
        cache = adapter.new_cache(HL, WL)
        outs.append(torch.cat([adapter(x[:, :, sl], sigma[:, sl], block_cond(cond, sl), kv_cache=cache, commit=True)
                               for sl in adapter.block_slices(frames)], 2))
    torch.testing.assert_close(outs[1], outs[0], atol=1e-5, rtol=1e-5)


@pytest.mark.slow
@torch.no_grad()
def test_teacher_forcing_matches_rollout_on_clean_history():
    """Training and inference agree: the TF noisy prediction equals a cached query over committed clean blocks."""
    tf, rolled, _ = teacher_forcing_and_rollout(make_adapter(), seeds=(5, 6))
    torch.testing.assert_close(tf, rolled, atol=1e-4, rtol=1e-4)


@pytest.mark.slow
@torch.no_grad()
def test_teacher_forcing_visibility():
    """Noisy block i sees clean blocks [i-W+1, i) and itself: not its own clean copy, not the future.

    One layer, so that what a noisy block sees is not mixed with what its clean history saw (clean rows see
    the whole clean prefix, as in the official layout).
    """
    adapter = make_adapter(num_layers=1)
    adapter.window_blocks = 2
    fpb = adapter.frames_per_block
    frames = 3 * fpb
    clean, _ = inputs(frames, seed=7)
    noisy, sigma = inputs(frames, seed=8)
    cond = make_cond(adapter, frames)
    base = adapter.forward_teacher_forcing(clean, noisy, sigma, cond)

    def changed(which: str, block: int) -> list[bool]:
        c, n = clean.clone(), noisy.clone()
        (c if which == "clean" else n)[:, :, block * fpb:(block + 1) * fpb] += 1.0
        out = adapter.forward_teacher_forcing(c, n, sigma, cond)
        return [bool((out - base)[:, :, b * fpb:(b + 1) * fpb].abs().max() > 1e-5) for b in range(3)]

    assert changed("clean", 0) == [False, True, False]  # block 2's window (W=2) no longer holds clean block 0
    assert changed("clean", 1) == [False, False, True]
    assert changed("noisy", 1) == [False, True, False]


@pytest.mark.slow
@torch.no_grad()
def test_flow_map_starts_at_the_stage1_model_and_round_trips(tmp_path):
    adapter = make_adapter()
    frames = 2 * adapter.frames_per_block
    x, sigma = inputs(frames, seed=9)
    cond = make_cond(adapter, frames)
    before = adapter(x, sigma, cond)
    adapter.enable_flow_map(0.25)
    torch.testing.assert_close(adapter(x, sigma, cond), before, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(adapter(x, sigma, cond, r_per_frame=sigma), before, atol=1e-6, rtol=1e-6)
    assert (adapter(x, sigma, cond, r_per_frame=torch.zeros_like(sigma)) - before).abs().max() > 1e-4
    with torch.no_grad():
        for p in adapter.delta_embedding.parameters():
            p.add_(0.01 * torch.randn_like(p))
    r = sigma * 0.5
    expected = adapter(x, sigma, cond, r_per_frame=r)
    out = adapter.save_adapter(tmp_path / "export", stage="tf_anyflow")
    loaded = load_adapter(out).eval()
    assert loaded.flow_map_gate == 0.25
    torch.testing.assert_close(loaded(x, sigma, cond, r_per_frame=r), expected)
    adapter.disable_flow_map()
    torch.testing.assert_close(adapter(x, sigma, cond), before, atol=1e-6, rtol=1e-6)
    assert "delta_embedding" not in "".join(adapter.state_dict())


@torch.no_grad()
def test_sink_teacher_forcing_matches_the_rollout_once_block_0_has_left_the_window(tmp_path):
    """With a 1-frame sink and a 2-block window, block 2 of teacher forcing (clean block 1 and clean frame 0 as
    history) equals the cached rollout whose cache evicted block 0 but kept its first frame; a sink travels with
    the export and is refused where it cannot be read."""
    adapter = make_adapter()
    adapter.window_blocks = 2
    adapter.set_sink(1)
    fpb = adapter.frames_per_block
    tf, rolled, cache = teacher_forcing_and_rollout(adapter, seeds=(10, 11))
    torch.testing.assert_close(tf, rolled, atol=1e-4, rtol=1e-4)
    assert cache.frames == 1 + fpb  # the sink frame and one block of history
    # Without the sink, block 2 reads other history: the sink is what the equality above depends on.
    adapter.set_sink(0)
    assert not torch.allclose(teacher_forcing_and_rollout(adapter, seeds=(10, 11))[0][:, :, 2 * fpb :],
                              tf[:, :, 2 * fpb :], atol=1e-4)

    adapter.set_sink(1)
    loaded = load_adapter(adapter.save_adapter(tmp_path / "export", stage="tf_anyflow"))
    assert loaded.sink_frames == 1 and loaded.new_cache(HL, WL).sink_frames == 1
    with pytest.raises(AdapterError, match="sink_frames must be in"):
        adapter.set_sink(fpb + 1)
    with pytest.raises(AdapterError, match="no attention sink"):
        LTX25Adapter(config=LTX25Config.tiny()).set_sink(1)
