"""The tiny MiniMax-H3 route through the three stages of `solarwm fit` (2 steps each, 22-frame clips = 2 blocks):
stage-1 sampler with the image anchor, teacher-forced AnyFlow, and DMD's rollout + replay."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

from solarwm.backbones.base import load_adapter, read_adapter_json
from solarwm.train_cli import main

from runs import tiny_recipe as _tiny_recipe


def _h3(path: Path, **init_args) -> Path:
    doc = yaml.safe_load(path.read_text())
    doc["model"]["init_args"]["adapter"]["class_path"] = "solarwm.backbones.minimax_h3.MiniMaxH3Adapter"
    doc["model"]["init_args"]["adapter"]["init_args"] = {"preset": "tiny"}  # the tiny base is a Wan checkpoint
    doc["model"]["init_args"].update(init_args)
    doc["data"]["init_args"].update(num_frames=22, width=16, height=16)  # 17 + 5 frames -> 7 latents
    doc["data"]["init_args"]["synth"].update(frames=24, width=24, height=16)
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.mark.slow
def test_three_stages_fit_and_export(tmp_path):
    bid = _h3(_tiny_recipe(tmp_path / "bid"))
    assert main(["fit", "--config", str(bid)]) == 0
    corpus = tmp_path / "bid" / "corpus"
    tf = _h3(
        _tiny_recipe(tmp_path / "tf", recipe="tiny_tf.yaml", corpus=corpus), init_from=str(tmp_path / "bid" / "adapter")
    )
    assert main(["fit", "--config", str(tf)]) == 0
    dmd = _h3(
        _tiny_recipe(tmp_path / "dmd", recipe="tiny_dmd.yaml", corpus=corpus),
        init_from={"generator": str(tmp_path / "tf" / "adapter"), "score": str(tmp_path / "bid" / "adapter")},
    )
    assert main(["fit", "--config", str(dmd)]) == 0
    for stage, name in (("bid", "bidirectional"), ("tf", "tf_anyflow"), ("dmd", "dmd")):
        meta = read_adapter_json(tmp_path / stage / "adapter")
        assert meta["route"] == "minimax_h3" and meta["stage"] == name
    stage2 = load_adapter(tmp_path / "tf" / "adapter")
    assert stage2.flow_map_gate == 0.25 and stage2.frames_per_block == 5
    student = load_adapter(tmp_path / "dmd" / "adapter")
    assert student.delta_embedding is None
    assert all(torch.isfinite(p).all() for p in student.transformer.parameters())
