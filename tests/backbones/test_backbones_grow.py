"""Depth growth of a Wan export (`solarwm.backbones.grow`): the grown model computes exactly what the original did."""

from __future__ import annotations

import json

import pytest
import torch

from solarwm.backbones import load_adapter
from solarwm.backbones.base import AdapterError
from solarwm.backbones.grow import grow_export, main
from solarwm.backbones.wan22_ti2v_5b import Wan22TI2V5BAdapter, Wan22TI2V5BConfig


def cameras(frames: int) -> dict[str, torch.Tensor]:
    """A slow pan: c2w [1, F, 4, 4] and pixel K [1, F, 4] for 32x32 frames."""
    c2w = torch.eye(4).repeat(1, frames, 1, 1)
    angle = torch.linspace(0.0, 0.1, frames)
    c2w[0, :, 0, 0], c2w[0, :, 0, 2], c2w[0, :, 2, 0], c2w[0, :, 2, 2] = (
        angle.cos(),
        angle.sin(),
        -angle.sin(),
        angle.cos(),
    )
    return {"c2w": c2w, "K": torch.tensor([28.0, 28.0, 16.0, 16.0]).repeat(1, frames, 1)}


@pytest.mark.slow
def test_grown_export_computes_the_same_prediction(tmp_path):
    torch.manual_seed(0)
    adapter = Wan22TI2V5BAdapter(config=Wan22TI2V5BConfig(prediction="x0_skip"))
    with torch.no_grad():  # a trained-looking model: nothing of the original is zero
        for p in adapter.transformer.parameters():
            p.add_(0.02 * torch.randn_like(p))
    adapter.save_adapter(tmp_path / "small", stage="bidirectional")
    main([str(tmp_path / "small"), str(tmp_path / "big"), "--factor", "2"])
    big = load_adapter(tmp_path / "big").eval()
    assert len(big.transformer.blocks) == 4 and big.config.num_layers == 4
    assert json.loads((tmp_path / "big" / "transformer" / "config.json").read_text())["num_layers"] == 4
    # Block 2i is block i; block 2i + 1 is its copy with the residual outputs silenced.
    torch.testing.assert_close(
        big.transformer.blocks[2].attn1.to_q.weight, adapter.transformer.blocks[1].attn1.to_q.weight
    )
    assert not big.transformer.blocks[3].ffn.net[2].weight.any() and big.transformer.blocks[3].attn1.to_q.weight.any()

    x = torch.randn(1, adapter.latent_channels, 5, 16, 16)
    sigma = torch.full((1, 5), 0.6)
    sigma[:, 0] = 0.0
    batch = {"caption": ["a slow pan"], "image_size": (32, 32), **cameras(17)}
    cond = adapter.prepare_conditions(batch)
    with torch.no_grad():
        assert torch.equal(adapter.eval()(x, sigma, cond), big(x, sigma, big.prepare_conditions(batch)))


def test_grow_refuses_an_existing_folder_and_a_bad_factor(tmp_path):
    Wan22TI2V5BAdapter(config=Wan22TI2V5BConfig()).save_adapter(tmp_path / "small", stage="bidirectional")
    (tmp_path / "taken").mkdir()
    with pytest.raises(AdapterError, match="exists"):
        grow_export(tmp_path / "small", tmp_path / "taken")
    with pytest.raises(ValueError, match="factor"):
        grow_export(tmp_path / "small", tmp_path / "new", factor=0)
