"""Ulysses sequence parallelism as recipes and the strategy state it, in one process (the 2-process runs:
tests/distributed/test_ulysses_attention.py and test_sequence_parallel_stages.py)."""

from __future__ import annotations

import pytest
import torch

from solarwm.backbones.sequence_parallel import BLOCK_SHARDING
from solarwm.strategies import RouteFSDPStrategy
from solarwm.train_cli import parse_recipe

from routes import RECIPES, published_recipes

ROUTES = published_recipes()  # recipe prefix -> registered route


@pytest.mark.parametrize("stage", ["bid", "tf", "dmd"])
@pytest.mark.parametrize("short", sorted(ROUTES))
def test_published_recipes_state_their_sequence_parallel_size(short: str, stage: str) -> None:
    """The H3 recipes split each sample over 2 GPUs, as the official runs; the others keep P = 1."""
    spec = parse_recipe(str(RECIPES / f"{short}_{stage}.yaml")).trainer.strategy
    strategy = RouteFSDPStrategy(**vars(spec.init_args))
    assert strategy.sequence_parallel_size == (2 if ROUTES[short] == "minimax_h3" else 1)
    if strategy.sequence_parallel_size > 1:
        from solarwm.backbones.base import route_class

        assert route_class(ROUTES[short]).transformer_block in BLOCK_SHARDING  # the route can run it


def test_a_bad_sequence_parallel_size_is_a_named_error() -> None:
    for bad in (0, -2, 1.5):
        with pytest.raises(ValueError, match="sequence_parallel_size must be a positive int"):
            RouteFSDPStrategy(sequence_parallel_size=bad)


def test_local_frame_groups_renumber_each_ranks_frames_and_add_its_padding() -> None:
    """LTX's frame groups on 2 ranks for 5 frames: rank 0 frames 0-2, rank 1 frames 3-4 and one padding frame."""
    from types import SimpleNamespace

    from solarwm.backbones.sequence_parallel import local_frame_groups

    groups = [[torch.tensor([0]), torch.tensor([1, 3]), torch.tensor([2, 4])]]  # one sample, 3 timesteps
    as_lists = lambda gs: [[g.tolist() for g in sample] for sample in gs]  # noqa: E731
    rank0 = local_frame_groups(groups, SimpleNamespace(size=2, rank=0), frames=5)
    rank1 = local_frame_groups(groups, SimpleNamespace(size=2, rank=1), frames=5)
    assert as_lists(rank0) == [[[0], [1], [2]]]
    assert as_lists(rank1) == [[[0], [1], [2]]]  # frame 3 -> 0, frame 4 -> 1, padding frame 2
    # Every local frame is in exactly one group, padding included.
    rank1_of_3 = local_frame_groups([[torch.tensor([0, 1, 2])]], SimpleNamespace(size=2, rank=1), frames=3)
    assert as_lists(rank1_of_3) == [[[0], [1]]]
