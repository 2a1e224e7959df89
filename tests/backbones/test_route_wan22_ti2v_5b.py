"""What only the tiny Wan2.2-TI2V-5B route checks (the contract suite: tests/backbones/test_route_contract.py)."""

from __future__ import annotations

import torch

from solarwm.backbones.wan22_ti2v_5b import Wan22TI2V5BAdapter, Wan22TI2V5BConfig

import route_contract as contract


def adapter() -> Wan22TI2V5BAdapter:
    torch.manual_seed(0)
    built = Wan22TI2V5BAdapter(config=Wan22TI2V5BConfig.tiny())
    contract.perturb(built)
    return built


def test_pretrained_folder_is_checked_against_the_config(tmp_path):
    """A checkpoint folder loads with safetensors; a config mismatch or a missing folder names the key or path."""
    import dataclasses

    import pytest

    from solarwm.backbones.base import AdapterError

    a = adapter()
    a.transformer.save_pretrained(tmp_path / "ckpt" / "transformer", safe_serialization=True)
    loaded = Wan22TI2V5BAdapter(config=a.config, pretrained_path=str(tmp_path / "ckpt"))
    assert all(torch.equal(p, q) for p, q in zip(loaded.transformer.parameters(), a.transformer.parameters()))
    with pytest.raises(AdapterError, match="num_layers: checkpoint 2 != config 1"):
        Wan22TI2V5BAdapter(config=dataclasses.replace(a.config, num_layers=1), pretrained_path=str(tmp_path / "ckpt"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(AdapterError, match="missing or has no config.json"):
        Wan22TI2V5BAdapter(config=a.config, pretrained_path=str(tmp_path / "empty"))
