"""FSDP settings of the published recipes: per-block wrap, activation checkpointing, bf16 mixed precision.

``RouteFSDPStrategy`` is FSDP2 (``fully_shard``, through Lightning's ``ModelParallelStrategy``), which runs on
CPUs with gloo, so the same class the recipes name on GPUs takes real steps here: two ``solarwm fit`` processes
on the tiny stage-1 config with the published settings (``bf16-mixed``, per-block units, activation
checkpointing, gradient clipping by norm). bf16 on the CPU needs no override: every op of the tiny Wan2.2
route runs in bf16 there (the FSDP2 policy casts the gathered parameters, Lightning's autocast the inputs).
(FSDP v1, which the strategy used before, refuses the CPU: "FSDP needs a non-CPU accelerator device".)
"""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from solarwm.backbones.base import route_class
from solarwm.strategies import transformer_block_class
from solarwm.train_cli import parse_recipe

from commands import solarwm_argv
from dist_helpers import cli_env
from routes import RECIPES, published_recipes

ROUTES = published_recipes()  # recipe prefix -> registered route


@pytest.mark.multiprocess
@pytest.mark.slow
def test_fsdp_takes_steps_on_two_cpu_processes(tmp_path: Path) -> None:
    """Stage 1, tiny Wan2.2-TI2V-5B, 2 gloo processes, the published settings: 2 optimizer steps.

    Checks: finite losses; every trainable parameter is a DTensor of which each rank holds only a part; the
    gathered parameters changed and are the same on both ranks; one FSDP unit per block (+ the root); bf16
    compute with fp32 gradient reduction.
    """
    probe = tmp_path / "probe"
    overlay = {
        "root": str(tmp_path),
        "trainer": {
            "accelerator": "cpu", "devices": 2, "precision": "bf16-mixed", "max_steps": 2, "gradient_clip_val": 1.0,
            "strategy": {"class_path": "solarwm.strategies.RouteFSDPStrategy"},
            "callbacks": [{"class_path": "fsdp_probe.FSDPProbe", "init_args": {"out_dir": str(probe)}}],
            "logger": False, "enable_checkpointing": False, "limit_val_batches": 0, "val_check_interval": None,
            "enable_progress_bar": False, "enable_model_summary": False, "default_root_dir": str(tmp_path),
        },
        "data": {"init_args": {"corpus_dir": str(tmp_path / "corpus"), "num_frames": 5, "num_val_clips": 1,
                               "batch_size": 1, "num_workers": 0,
                               "synth": {"clips": 3, "frames": 9, "width": 48, "height": 32, "fps": 8.0, "seed": 0,
                                         "views": 1},
                               "test_synth": {"clips": 2, "frames": 9, "width": 48, "height": 32}}},
    }
    path = tmp_path / "fsdp.yaml"
    path.write_text(yaml.safe_dump(overlay))
    result = subprocess.run(
        [*solarwm_argv(), "fit", "--config", str(RECIPES / "tiny_bid.yaml"), "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=600,
        env=cli_env(),
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert "Starting with 2 processes" in result.stderr + result.stdout

    ranks = [json.loads((probe / f"rank{r}.json").read_text()) for r in (0, 1)]
    block = transformer_block_class(route_class("wan22_ti2v_5b"))
    # The recipe's model (its base's depth), not the route's tiny preset.
    config = parse_recipe(str(RECIPES / "tiny_bid.yaml")).model.init_args.adapter.init_args.config.as_dict()
    tiny = route_class("wan22_ti2v_5b").config_class.tiny()
    tiny.num_layers = config.get("num_layers", tiny.num_layers)
    blocks = sum(isinstance(m, block) for m in route_class("wan22_ti2v_5b")(config=tiny).transformer.modules())
    assert blocks == tiny.num_layers
    for doc in ranks:
        assert len(doc["losses"]) == 2 and all(math.isfinite(v) for v in doc["losses"])
        assert doc["param_dtype"] == "torch.bfloat16" and doc["reduce_dtype"] == "torch.float32"
        assert doc["units"].count("FSDPCheckpointWrapper") == blocks and len(doc["units"]) == blocks + 1
        for name, (local, full, kind, dtype) in doc["shards"].items():
            assert kind == "DTensor" and dtype == "torch.float32", name  # fp32 master shards
        local, full = (sum(v[i] for v in doc["shards"].values()) for i in (0, 1))
        assert local < 0.6 * full, (local, full)  # each rank holds about half (dim 0 is split, padded)
    # The two ranks' shards partition each parameter (a [1, ...] parameter sits whole on rank 0).
    for name, (local, full, *_) in ranks[0]["shards"].items():
        assert local + ranks[1]["shards"][name][0] == full, name

    before = [load_file(probe / f"rank{r}-before.safetensors") for r in (0, 1)]
    after = [load_file(probe / f"rank{r}-after.safetensors") for r in (0, 1)]
    assert before[0].keys() == after[0].keys() == after[1].keys() and before[0]
    for name in after[0]:
        assert torch.equal(after[0][name], after[1][name]), name  # the ranks agree on the gathered weights
        assert torch.equal(before[0][name], before[1][name]), name
    assert (
        sum(not torch.equal(before[0][n], after[0][n]) for n in after[0]) >= len(after[0]) // 2
    )  # the step moved them
