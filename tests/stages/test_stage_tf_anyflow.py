"""Stage 2 (TFAnyFlowModule): r = t pairs skip the finite difference; context noise on the history; the sink."""

from __future__ import annotations

import pytest
import torch

from solarwm.backbones.base import AdapterError
from solarwm.backbones.wan22_ti2v_5b import Wan22TI2V5BAdapter, Wan22TI2V5BConfig
from solarwm.datamodules import WorldDataModule
from solarwm.datamodules.world import SynthCorpus
from solarwm.objectives.rng import SampleRNG
from solarwm.stages.checkpoints import StageCheckpointError
from solarwm.stages.dmd import DMDInit, DMDModule
from solarwm.stages.tf_anyflow import TFAnyFlowModule


def _first_batch(root, frames: int) -> dict:
    dm = WorldDataModule(corpus_dir=str(root), synth=SynthCorpus(clips=3, frames=frames, width=32, height=32, fps=8.0),
                         num_frames=frames, width=32, height=32, num_val_clips=1, batch_size=2, shuffle=False)
    dm.prepare_data()
    dm.setup("fit")
    return next(iter(dm.train_dataloader()))


@pytest.fixture(scope="module")
def batch(tmp_path_factory) -> dict:
    return _first_batch(tmp_path_factory.mktemp("tf") / "corpus", 9)


@pytest.fixture(scope="module")
def two_block_batch(tmp_path_factory) -> dict:
    """17 frames: 5 latent frames, so a noisy block has history in the teacher-forcing layout."""
    return _first_batch(tmp_path_factory.mktemp("tf17") / "corpus", 17)


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


def _tf_module(**kwargs) -> TFAnyFlowModule:
    torch.manual_seed(0)
    return TFAnyFlowModule(adapter=Wan22TI2V5BAdapter(config=Wan22TI2V5BConfig.tiny()), **kwargs)


def test_context_noise_noises_each_samples_history_from_its_own_stream_and_keeps_the_anchor(batch):
    module = _tf_module(context_noise=0.3)
    x0 = module.latents(batch)
    history, sigma = module.noised_history(x0, SampleRNG([5, 6], salt=1))
    anchor = module.adapter.clean_latent_frames
    assert anchor == 1 and sigma.shape == x0.shape[::2][:1] + x0.shape[2:3]
    assert (sigma[:, :anchor] == 0).all() and torch.equal(history[:, :, :anchor], x0[:, :, :anchor])
    assert ((sigma[:, anchor:] > 0) & (sigma[:, anchor:] <= 0.3)).all()
    assert (history[:, :, anchor:] != x0[:, :, anchor:]).all()
    # Sample 6 draws the same history alone as beside sample 5 (a split batch noises the same).
    alone, sigma_alone = module.noised_history(x0[1:], SampleRNG([6], salt=1))
    torch.testing.assert_close(alone, history[1:], rtol=0, atol=0)
    torch.testing.assert_close(sigma_alone, sigma[1:], rtol=0, atol=0)

    exact = _tf_module()
    assert exact.noised_history(x0, SampleRNG([5, 6]))[0] is x0 and exact.noised_history(x0, None)[1] is None
    with pytest.raises(ValueError, match="context_noise must be in"):
        _tf_module(context_noise=1.5)


def test_the_history_sigma_reaches_the_model_and_zero_is_the_exact_history(two_block_batch):
    module = _tf_module()
    adapter = module.adapter
    x0 = module.latents(two_block_batch)
    cond = adapter.prepare_conditions(two_block_batch)
    x_t, t_pf = adapter.noisy_input(x0, torch.randn_like(x0), torch.tensor([0.7, 0.4]))
    with torch.no_grad():
        plain = adapter.forward_teacher_forcing(x0, x_t, t_pf, cond)
        zero = adapter.forward_teacher_forcing(x0, x_t, t_pf, cond, sigma_clean=torch.zeros_like(t_pf))
        told = adapter.forward_teacher_forcing(x0, x_t, t_pf, cond, sigma_clean=torch.full_like(t_pf, 0.3))
    torch.testing.assert_close(zero, plain, rtol=0, atol=0)
    # The first block sees no history, so only later blocks may move with the history's label.
    later = slice(adapter.frames_per_block, None)
    assert x0.shape[2] > adapter.frames_per_block
    assert not torch.allclose(told[:, :, later], plain[:, :, later])
    with pytest.raises(AdapterError, match="sigma_clean"):
        adapter.forward_teacher_forcing(x0, x_t, t_pf, cond, sigma_clean=t_pf[:, :1])


def test_context_noise_leaves_the_steps_other_draws_as_they_were(batch):
    keys = SampleRNG([3, 4], salt=2)
    _, exact = _tf_module().anyflow_loss(batch, keys)
    loss, noised = _tf_module(context_noise=0.3).anyflow_loss(batch, SampleRNG([3, 4], salt=2))
    assert torch.isfinite(loss)
    torch.testing.assert_close(noised["sigma_mean"], exact["sigma_mean"], rtol=0, atol=0)


def test_the_sink_goes_from_stage_2_into_its_export_and_stage_3_must_match_it(tmp_path):
    base = Wan22TI2V5BAdapter(config=Wan22TI2V5BConfig.tiny()).save_adapter(tmp_path / "stage1", stage="bidirectional")
    stage2 = _tf_module(sink_frames=1, init_from=str(base))
    assert stage2.adapter.sink_frames == 1
    export = stage2.adapter.save_adapter(tmp_path / "stage2", stage="tf_anyflow")
    init = DMDInit(generator=str(export), score=str(base))
    student = DMDModule(Wan22TI2V5BAdapter(config=Wan22TI2V5BConfig.tiny()), init_from=init, sink_frames=1)
    assert student.generator.sink_frames == 1 and student.real_score.sink_frames == 0
    with pytest.raises(StageCheckpointError, match="trained with sink_frames 1, this stage has 0"):
        DMDModule(Wan22TI2V5BAdapter(config=Wan22TI2V5BConfig.tiny()), init_from=init)
