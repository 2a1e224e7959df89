"""The KV cache's attention sink: the first committed frames stay at the head, the rest roll, memory stays bounded."""

from __future__ import annotations

import pytest
import torch

from solarwm.backbones.base import CacheWindow
from solarwm.kernels.kv_cache import KVCache


def _commit(cache: KVCache, first: int, frames: int) -> None:
    """Commit ``frames`` frames numbered from ``first``: every row's K/V and camera hold its frame number."""
    rows = torch.arange(first, first + frames, dtype=torch.float32).repeat_interleave(cache.tokens_per_frame)
    kv = rows.view(1, -1, 1, 1)
    for layer in range(cache.num_layers):
        cache.stage(layer, kv, kv)
    c2w = torch.eye(4, dtype=torch.float64).expand(1, frames, 4, 4).clone()
    c2w[0, :, 0, 3] = torch.arange(first, first + frames, dtype=torch.float64)
    cache.commit(c2w, torch.ones(1, frames, 4))


def test_the_sink_frames_stay_at_the_head_and_the_rest_rolls():
    cache = KVCache(num_layers=2, max_frames=4, tokens_per_frame=2, sink_frames=1)
    held = []
    for block in range(5):  # blocks of 2 frames: 0-1, 2-3, ..., 8-9
        _commit(cache, 2 * block, 2)
        held.append(cache.c2w[0, :, 0, 3].tolist())
        assert cache.frames <= cache.sink_frames + cache.max_frames
    assert held[0] == [0, 1] and held[1] == [0, 1, 2, 3]  # nothing evicted yet
    assert held[2] == [0, 2, 3, 4, 5] and held[4] == [0, 6, 7, 8, 9]
    keys, values = cache.layer(1)
    assert keys[0, :, 0, 0].tolist() == [0, 0, 6, 6, 7, 7, 8, 8, 9, 9] and torch.equal(keys, values)
    assert cache.held_sink == 1 and cache.evicted

    plain = KVCache(num_layers=1, max_frames=4, tokens_per_frame=1)
    for block in range(5):
        _commit(plain, 2 * block, 2)
    assert plain.c2w[0, :, 0, 3].tolist() == [6, 7, 8, 9] and plain.held_sink == 0
    with pytest.raises(ValueError, match="sink_frames"):
        KVCache(num_layers=1, max_frames=4, tokens_per_frame=1, sink_frames=-1)


def test_window_positions_put_a_sink_apart_where_teacher_forcing_trains_it():
    c2w = torch.eye(4, dtype=torch.float64).expand(1, 7, 4, 4)
    K = torch.ones(1, 7, 4)
    # 1 sink frame + 3 history frames + a 3-frame query block, block 0 evicted but its first frame kept.
    apart = CacheWindow(c2w, K, frames=3, first_evicted=False, sink=1)
    assert apart.positions(3).tolist() == [0, 3, 4, 5, 6, 7, 8]
    assert CacheWindow(c2w, K, frames=3, first_evicted=True).positions(3).tolist() == list(range(7))
