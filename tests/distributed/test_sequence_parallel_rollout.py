"""A causal rollout under Ulysses sequence parallelism (2 gloo processes) equals the one-process rollout.

Each block's tokens are split over the ranks; after the first all-to-all a rank holds all tokens of its
``H/2`` heads, so its KV cache keeps those heads only and needs no communication of its own. The decoded frames
must match the single-process rollout within one grey level.
"""

from __future__ import annotations

import pytest
import torch

from solarwm.kernels.ulysses import SequenceParallel

from dist_helpers import spawn

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]


def _rollout(adapter: torch.nn.Module) -> tuple[torch.Tensor, object]:
    """Decoded video ``[B, 3, F, H, W]`` of a seeded 3-block rollout, and its KV cache."""
    from solarwm.rollout.engine import Rollout

    from route_inputs import clip_batch

    batch = clip_batch(adapter)
    engine = Rollout(adapter, num_steps=2)
    cond = engine.conditions(batch["video"][:, :, 0], batch["c2w"], batch["K"], caption=batch["caption"])
    cache = adapter.new_cache(*cond["anchor"].shape[-2:])
    generator = torch.Generator().manual_seed(7)
    decode = adapter.stream_decoder()
    frames = [decode(block.x0) for block in engine.latent_blocks(cond, generator, cache=cache)]
    return torch.cat(frames, 2), cache


def _worker(rank: int, world: int, route: str) -> None:
    from solarwm.backbones.sequence_parallel import enable_sequence_parallel

    from route_inputs import tiny_route

    adapter = tiny_route(route).eval()
    reference, ref_cache = _rollout(adapter)
    enable_sequence_parallel(adapter, SequenceParallel())
    video, cache = _rollout(adapter)
    grey = lambda v: ((v.clamp(-1, 1) + 1) * 127.5).round()  # noqa: E731
    assert video.shape == reference.shape
    assert (grey(video) - grey(reference)).abs().max() <= 1.0
    keys, ref_keys = cache.layer(0)[0], ref_cache.layer(0)[0]
    assert keys.shape[2] * world == ref_keys.shape[2]  # the rank's H/P heads, all of the window's tokens
    torch.testing.assert_close(keys, ref_keys.chunk(world, dim=2)[rank], rtol=1e-4, atol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("route", ["wan22_ti2v_5b", "ltx25"])
def test_rollout_under_sequence_parallel_equals_one_process(route: str) -> None:
    spawn(_worker, 2, route)
