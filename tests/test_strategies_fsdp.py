"""FSDP settings of the published recipes: per-block wrap, activation checkpointing, bf16 mixed precision.

PyTorch's FSDP (v1, what Lightning's ``FSDPStrategy`` wraps) refuses to run without an accelerator
("FSDP needs a non-CPU accelerator device"), so on the CPU this checks that every published recipe builds
its strategy with the route's transformer block as the wrap and checkpoint unit, and that this unit is what
the route's transformer is made of. The step itself runs where a GPU is present.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from solarwm.backbones.base import AdapterError, route_class
from solarwm.strategies import RouteFSDPStrategy, route_block_class
from solarwm.train_cli import parse_recipe

RECIPES = Path(__file__).resolve().parents[1] / "recipes"
ROUTES = {"wan22_5b": "wan22_ti2v_5b", "wan22_14b": "wan22_i2v_14b", "ltx25": "ltx25", "minimax_h3": "minimax_h3"}


@pytest.mark.parametrize("stage", ["bid", "tf", "dmd"])
@pytest.mark.parametrize("short", sorted(ROUTES))
def test_published_recipe_builds_fsdp_per_transformer_block(short: str, stage: str) -> None:
    config = parse_recipe(str(RECIPES / f"{short}_{stage}.yaml"))
    spec = config.trainer.strategy
    assert spec.class_path == "solarwm.strategies.RouteFSDPStrategy"
    assert spec.init_args.route == ROUTES[short] and spec.init_args.activation_checkpointing is True
    assert config.trainer.precision == "bf16-mixed"
    strategy = RouteFSDPStrategy(**vars(spec.init_args))
    block = route_block_class(ROUTES[short])
    assert strategy.kwargs["auto_wrap_policy"]._module_classes == {block}  # torch's ModuleWrapPolicy
    assert strategy._activation_checkpointing_kwargs["auto_wrap_policy"]._module_classes == {block}
    assert strategy.kwargs["use_orig_params"] is True  # units mix frozen and trainable parameters


@pytest.mark.parametrize("route", sorted(set(ROUTES.values())))
def test_the_wrap_unit_is_what_the_transformer_repeats(route: str) -> None:
    """The tiny model of each route is built of its ``transformer_block`` (else FSDP would wrap nothing)."""
    torch.manual_seed(0)
    adapter = route_class(route)(preset="tiny")
    block = route_block_class(route)
    assert sum(isinstance(m, block) for m in adapter.transformer.modules()) >= 2


def test_unknown_route_is_a_named_error() -> None:
    with pytest.raises(AdapterError, match="unknown backbone route 'nope'"):
        RouteFSDPStrategy(route="nope")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="FSDP (v1) needs an accelerator")
def test_fsdp_takes_steps_on_the_tiny_config(tmp_path: Path) -> None:
    """Stage 1 on the GPU(s) with the published FSDP settings (bf16-mixed, per-block wrap and checkpointing)."""
    overlay = {
        "trainer": {
            "accelerator": "gpu", "devices": min(2, torch.cuda.device_count()), "precision": "bf16-mixed", "max_steps": 2,
            "strategy": {"class_path": "solarwm.strategies.RouteFSDPStrategy", "init_args": {"route": "wan22_ti2v_5b"}},
            "callbacks": [], "logger": False, "enable_checkpointing": False, "limit_val_batches": 0,
            "val_check_interval": None, "default_root_dir": str(tmp_path),
        },
        "data": {"init_args": {"corpus_dir": str(tmp_path / "corpus"), "num_frames": 5, "num_val_clips": 1,
                               "synth": {"clips": 5, "frames": 9, "width": 48, "height": 32, "fps": 8.0, "seed": 0}}},
    }
    path = tmp_path / "fsdp.yaml"
    path.write_text(yaml.safe_dump(overlay))
    result = subprocess.run(
        [sys.executable, "-m", "solarwm.cli", "fit", "--config", str(RECIPES / "tiny_bid.yaml"), "--config", str(path)],
        capture_output=True, text=True, timeout=600, env=dict(os.environ),
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert "`Trainer.fit` stopped: `max_steps=2` reached" in result.stderr + result.stdout
