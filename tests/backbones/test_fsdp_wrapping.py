"""FSDP wrapping of every route, in one process: the per-block units, activation checkpointing and the published
recipes' strategy settings (the 2-process run is tests/distributed/test_strategies_fsdp.py)."""

from __future__ import annotations

import pytest
import torch

from solarwm.backbones.base import AdapterError, route_class
from solarwm.strategies import RouteFSDPStrategy, transformer_block_class
from solarwm.train_cli import parse_recipe

from routes import RECIPES, published_recipes

ROUTES = published_recipes()  # recipe prefix -> registered route


@pytest.mark.slow
@pytest.mark.parametrize("stage", ["bid", "tf", "dmd"])
@pytest.mark.parametrize("short", sorted(ROUTES))
def test_published_recipe_builds_fsdp_per_transformer_block(short: str, stage: str) -> None:
    config = parse_recipe(str(RECIPES / f"{short}_{stage}.yaml"))
    spec = config.trainer.strategy
    assert spec.class_path == "solarwm.strategies.RouteFSDPStrategy"
    assert spec.init_args.activation_checkpointing is True and config.trainer.precision == "bf16-mixed"
    strategy = RouteFSDPStrategy(**vars(spec.init_args))
    assert strategy.activation_checkpointing
    # The wrap unit comes from the adapter the recipe builds, not from a route name in the strategy.
    assert config.model.init_args.adapter.class_path.rsplit(".", 1)[1] == route_class(ROUTES[short]).__name__
    assert strategy.sharding_strategy == "FULL_SHARD" and strategy._tensor_parallel_size == 1


@pytest.mark.parametrize("route", sorted(set(ROUTES.values())))
def test_shard_transformer_makes_one_checkpointed_unit_per_block(route: str) -> None:
    """On a 1-process gloo group: every block becomes a checkpoint wrapper that is its own FSDP unit."""
    import torch.distributed as dist
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    from solarwm.strategies import bf16_mixed_policy, shard_transformer

    torch.manual_seed(0)
    transformer = route_class(route)(preset="tiny").transformer
    block = transformer_block_class(route_class(route))
    blocks = sum(isinstance(m, block) for m in transformer.modules())
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:0", rank=0, world_size=1)
    try:
        units = shard_transformer(transformer, block, mp_policy=bf16_mixed_policy())
    finally:
        dist.destroy_process_group()
    assert len(units) == blocks >= 2
    assert all(isinstance(u, CheckpointWrapper) and isinstance(u, FSDPModule) for u in units)
    assert isinstance(transformer, FSDPModule)  # the root unit
    assert all(isinstance(p, DTensor) for p in transformer.parameters())


@pytest.mark.parametrize("route", sorted(set(ROUTES.values())))
def test_the_wrap_unit_is_what_the_transformer_repeats(route: str) -> None:
    """The tiny model of each route is built of its ``transformer_block`` (else FSDP would wrap nothing)."""
    torch.manual_seed(0)
    adapter = route_class(route)(preset="tiny")
    block = transformer_block_class(route_class(route))
    assert sum(isinstance(m, block) for m in adapter.transformer.modules()) >= 2


def test_an_adapter_without_a_wrap_unit_is_a_named_error() -> None:
    class NoBlock(torch.nn.Module):
        transformer_block = ""

    class NotAModule(torch.nn.Module):
        transformer_block = "math:pi"

    with pytest.raises(AdapterError, match="NoBlock names no transformer_block"):
        transformer_block_class(NoBlock)
    with pytest.raises(AdapterError, match="transformer_block math:pi is not an nn.Module class"):
        transformer_block_class(NotAModule)


def test_unsupported_sharding_strategy_is_a_named_error() -> None:
    with pytest.raises(ValueError, match="HYBRID_SHARD.*FULL_SHARD or SHARD_GRAD_OP"):
        RouteFSDPStrategy(sharding_strategy="HYBRID_SHARD")
