"""Stage 2 (TFAnyFlowModule): with r = t pairs only, the loss skips the finite difference and stays the same."""

from __future__ import annotations

import pytest
import torch

from solarwm.backbones.wan22_ti2v_5b import Wan22TI2V5BAdapter, Wan22TI2V5BConfig
from solarwm.datamodules import WorldDataModule
from solarwm.datamodules.world import SynthCorpus
from solarwm.stages.tf_anyflow import TFAnyFlowModule


@pytest.fixture(scope="module")
def batch(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("tf") / "corpus"
    dm = WorldDataModule(corpus_dir=str(root), synth=SynthCorpus(clips=3, frames=9, width=32, height=32, fps=8.0),
                         num_frames=9, width=32, height=32, num_val_clips=1, batch_size=2, shuffle=False)
    dm.prepare_data()
    dm.setup("fit")
    return next(iter(dm.train_dataloader()))


@pytest.mark.slow
def test_diffusion_only_pairs_skip_the_finite_difference_and_give_the_same_loss(batch, monkeypatch):
    torch.manual_seed(0)
    module = TFAnyFlowModule(adapter=Wan22TI2V5BAdapter(config=Wan22TI2V5BConfig.tiny()),
                             diffusion_ratio=1.0, consistency_ratio=0.0)
    # Nudge the r-embedding off its copy of the time embedding, so u depends on r at all.
    with torch.no_grad():
        for p in module.adapter.delta_embedding.parameters():
            p.add_(0.05 * torch.randn_like(p))
    calls = []
    forward = module.adapter.forward_teacher_forcing

    def counted(*args, **kwargs):
        calls.append(1)
        return forward(*args, **kwargs)

    monkeypatch.setattr(module.adapter, "forward_teacher_forcing", counted)
    assert not module.has_flow_map_pairs
    short, stats = module.anyflow_loss(batch, torch.Generator().manual_seed(3))
    assert len(calls) == 1 and torch.isfinite(short)

    calls.clear()
    monkeypatch.setattr(TFAnyFlowModule, "has_flow_map_pairs", property(lambda self: True))
    full, full_stats = module.anyflow_loss(batch, torch.Generator().manual_seed(3))
    assert len(calls) == 4  # u, the diagonal velocity and the two finite-difference points
    torch.testing.assert_close(short, full, rtol=1e-6, atol=0.0)
    torch.testing.assert_close(stats["flow_loss"], full_stats["flow_loss"], rtol=1e-6, atol=0.0)

    monkeypatch.undo()
    module.diffusion_ratio = 0.5
    assert module.has_flow_map_pairs
