"""The rollout engine: few-step grid, streaming decode, determinism, exit steps, bounded cache."""

from __future__ import annotations

import math

import pytest
import torch

from solarwm.backbones.codecs import PatchifyCodec, WanVAECodec
from solarwm.backbones.wan22_ti2v_5b import TINY_WAN_VAE_CONFIG, Wan22TI2V5BAdapter, Wan22TI2V5BConfig
from solarwm.camera.se3 import look_at
from solarwm.rollout.engine import Rollout, few_step_sigmas


def test_few_step_grid_matches_the_reference():
    """Wan2.2-5B (shift 5, 4 steps): sigma = 1, .9375, .8333, .625, then 0."""
    torch.testing.assert_close(
        few_step_sigmas(4, 5.0), torch.tensor([1.0, 0.9375, 0.833333, 0.625, 0.0]), atol=1e-5, rtol=0
    )


def test_patchify_stream_decode_equals_whole_clip_decode():
    codec = PatchifyCodec(spatial=2)
    latents = torch.randn(1, codec.latent_channels, 7, 4, 4)
    decode = codec.stream_decoder()
    streamed = torch.cat([decode(latents[:, :, s : s + 3]) for s in range(0, 7, 3)], 2)
    assert torch.equal(streamed, codec.decode(latents))


def test_wan_vae_stream_decode_keeps_one_causal_cache():
    """Block-by-block decode of the real AutoencoderKLWan class equals its whole-clip decode."""
    from diffusers import AutoencoderKLWan

    torch.manual_seed(0)
    codec = WanVAECodec(AutoencoderKLWan(**TINY_WAN_VAE_CONFIG)).eval()
    latents = torch.randn(1, codec.latent_channels, 5, 2, 2)
    with torch.no_grad():
        whole = codec.decode(latents)
        decode = codec.stream_decoder()
        streamed = torch.cat([decode(latents[:, :, s : s + 2]) for s in range(0, 5, 2)], 2)
    assert streamed.shape == whole.shape == (1, 3, 17, 32, 32)
    torch.testing.assert_close(streamed, whole, atol=1e-5, rtol=1e-5)


def _conditions(rollout: Rollout, frames: int) -> dict:
    c2w = torch.stack(
        [torch.as_tensor(look_at((0.2 * i, 0.0, 1.5), (0.2 * i + 3.0, math.sin(i / 5), 1.4))) for i in range(frames)]
    )[None]
    K = torch.tensor([28.0, 28.0, 16.0, 16.0]).expand(1, frames, 4).clone()
    first = torch.linspace(-1, 1, 3 * 32 * 32).view(1, 3, 32, 32)
    return rollout.conditions(first, c2w, K, ["a hallway"])


@pytest.fixture(scope="module")
def adapter() -> Wan22TI2V5BAdapter:
    torch.manual_seed(0)
    return Wan22TI2V5BAdapter(config=Wan22TI2V5BConfig.tiny()).eval()


@pytest.mark.slow
def test_rollout_is_deterministic_for_a_seed_and_keeps_the_anchor(adapter):
    rollout = Rollout(adapter, num_steps=2)
    cond = _conditions(rollout, 29)  # 8 latent frames: blocks of 3, 3, 2

    def run(seed: int) -> torch.Tensor:
        return torch.cat(list(rollout.video_blocks(cond, torch.Generator().manual_seed(seed))), 2)

    a, b, c = run(0), run(0), run(1)
    assert a.shape == (1, 3, 29, 32, 32)
    assert torch.equal(a, b) and (a - c).abs().max() > 1e-3
    first = adapter.decode(cond["anchor"])[:, :, 0]  # the anchor latent decodes to the (codec-exact) first frame
    torch.testing.assert_close(a[:, :, 0], first)


@pytest.mark.slow
def test_exit_step_commits_that_steps_x0_and_the_cache_stays_bounded(adapter):
    rollout = Rollout(adapter, num_steps=4)
    cond = _conditions(rollout, 4 * 26 + 1)  # 27 latent frames = 9 blocks, past the 6-block window
    cache = adapter.new_cache(16, 16)
    sizes = []
    blocks = []
    for block in rollout.latent_blocks(cond, torch.Generator().manual_seed(0), exit_step=1, cache=cache):
        blocks.append(block)
        sizes.append(cache.nbytes())
    sigmas = few_step_sigmas(4, adapter.shift)
    assert all(b.sigma == pytest.approx(float(sigmas[1])) for b in blocks)
    assert cache.frames == 15 and cache.committed_frames == 27
    assert sizes[5:] == [sizes[5]] * len(sizes[5:])  # memory stops growing once the window is full
    with pytest.raises(ValueError, match="flowmap"):
        Rollout(adapter, solver="flowmap")


def test_commit_sigma_commits_the_history_renoised_and_told_and_keeps_the_anchor(adapter, monkeypatch):
    """With ``commit_sigma`` each block's x0 goes into the cache re-noised to that sigma (the anchor clean), drawn
    after the block's own draws: the first block is unchanged, later blocks read the noised history."""
    rollout = Rollout(adapter, num_steps=2)
    cond = _conditions(rollout, 25)  # 7 latent frames: blocks of 3, 3, 1
    commits = []
    forward = type(adapter).forward

    def spy(self, x_t, sigma_per_frame, block_cond, **kwargs):  # noqa: ANN001, ANN202
        if kwargs.get("commit"):
            commits.append((x_t.clone(), sigma_per_frame.clone()))
        return forward(self, x_t, sigma_per_frame, block_cond, **kwargs)

    monkeypatch.setattr(type(adapter), "forward", spy)

    def run() -> list:
        return list(rollout.latent_blocks(cond, torch.Generator().manual_seed(0)))

    exact = run()
    exact_commits, commits[:] = list(commits), []
    assert all(torch.equal(x, b.x0) and (s == 0).all() for (x, s), b in zip(exact_commits, exact))
    monkeypatch.setattr(adapter, "commit_sigma", 0.2)
    noised = run()
    assert torch.equal(noised[0].x0, exact[0].x0) and not torch.equal(noised[1].x0, exact[1].x0)
    (x, s), block = commits[0], noised[0]
    assert (s[:, :1] == 0).all() and (s[:, 1:] == 0.2).all()  # the anchor frame stays clean, at sigma 0
    assert torch.equal(x[:, :, :1], block.x0[:, :, :1]) and (x[:, :, 1:] != block.x0[:, :, 1:]).all()
    assert all((s == 0.2).all() for _, s in commits[1:])
