"""DMD's streaming long tuning: one student rollout continued across steps, its new blocks judged each step."""

from __future__ import annotations

from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch

from solarwm.backbones.wan22_ti2v_5b import Wan22TI2V5BAdapter, Wan22TI2V5BConfig
from solarwm.objectives.rng import SampleRNG
from solarwm.rollout.engine import Rollout, block_conditions
from solarwm.stages.dmd import DMDModule

from corpora import first_batch, synth_worlds


def make_module(**kwargs) -> DMDModule:
    torch.manual_seed(0)
    adapter = Wan22TI2V5BAdapter(config=Wan22TI2V5BConfig.tiny())
    return DMDModule(adapter=adapter, student_update_every=2, **kwargs)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("dmd_stream") / "corpus"
    synth_worlds(root, frames=33)  # 9 latent frames: 3 full blocks
    return root


@pytest.fixture(scope="module")
def batch(corpus: Path) -> dict:
    return first_batch(synth_worlds(corpus, frames=33))


def test_a_grad_block_is_the_same_block_and_carries_the_gradient():
    torch.manual_seed(0)
    gen = Wan22TI2V5BAdapter(config=Wan22TI2V5BConfig.tiny())
    rollout = Rollout(gen, num_steps=2)
    anchor = torch.randn(1, gen.latent_channels, 1, 8, 8)
    cond = rollout.conditions(torch.rand(1, 3, 32, 32) * 2 - 1, torch.eye(4).expand(1, 17, 4, 4).clone(),
                              torch.tensor([[16.0, 16.0, 16.0, 16.0]]).expand(1, 17, 4).clone())
    results, caches = [], []
    for grad in (False, True):
        cache = gen.new_cache(8, 8)
        noise = SampleRNG([3], salt=5)
        blocks = [rollout.block(block_conditions(gen, cond, f), anchor, f, cache, noise, exit_step=1, grad=grad)
                  for f in gen.block_slices(5)]
        results.append(blocks)
        caches.append(cache)
    for plain, traced in zip(*results):
        torch.testing.assert_close(traced.x0, plain.x0)
        assert traced.x0.requires_grad and not plain.x0.requires_grad
    torch.testing.assert_close(caches[1].layer(0)[0], caches[0].layer(0)[0])
    assert not caches[1].layer(0)[0].requires_grad  # the history is detached
    results[1][-1].x0.sum().backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in gen.parameters())
    flow = Rollout(gen, 2)
    flow.solver = "flowmap"  # the flow map's x0 comes only after its last step: no exit-step gradient
    with pytest.raises(ValueError, match="renoise"):
        flow.block(block_conditions(gen, cond, slice(0, 3)), anchor, slice(0, 3), gen.new_cache(8, 8), grad=True)


def test_the_stream_is_one_rollout_continued_step_after_step(batch):
    module = make_module(num_steps=1, score_window=4, stream_blocks=1)
    gen = module.generator
    new_latents, conds = [], []
    for step in range(3):  # 33 frames: 9 latent frames, 3 full blocks of 3
        x, cond, min_start, clip = module.continue_stream(batch, torch.Generator().manual_seed(step), grad=False)
        assert min_start == (0 if step == 0 else 1) and x.shape[2] == (3 if step == 0 else 5)
        new_latents.append(x[:, :, -3:])
        conds.append(cond)
        frames = slice(0, 3) if step == 0 else slice(3 * step - 2, 3 * step + 3)  # 2 frames before the block
        torch.testing.assert_close(clip, module.latents(batch)[:, :, frames])
    assert module._stream.next == 3
    # The same clip rolled out in one go from the same noise streams (the salt is the stream's first draw).
    salt = int(torch.randint(0, 2**62, (1,), generator=torch.Generator().manual_seed(0)))
    cond = gen.prepare_conditions(batch)
    x0 = module.latents(batch)
    reference = [b.x0 for b in Rollout(gen, 1).latent_blocks(
        dict(cond, anchor=x0[:, :, :1]), SampleRNG(module.sample_index(batch), salt=salt))]
    torch.testing.assert_close(torch.cat(new_latents, 2), torch.cat(reference, 2))
    # Each piece's cameras are its own frames' (the two frames before the new block, then the block).
    torch.testing.assert_close(conds[2]["c2w"], cond["c2w"][:, 4:9])
    # The clip has no room left: the next step starts a new stream on the batch it is given.
    module.continue_stream(batch, torch.Generator().manual_seed(9), grad=False)
    assert module._stream.next == 1 and module._stream.cache.committed_frames == 3


def test_a_stream_piece_is_re_anchored_and_judged_by_both_losses(batch):
    module = make_module(num_steps=2, score_window=4, stream_blocks=1)
    module.continue_stream(batch, torch.Generator().manual_seed(0), grad=False)  # past the clip's anchor
    piece, cond, streams, clip = module.stream_piece(batch, torch.Generator().manual_seed(1), grad=True)
    assert piece.shape[2] == 4 and cond["c2w"].shape[1] == 4 and clip.shape == piece.shape and piece.requires_grad
    module.judged_loss(piece, cond, streams).backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in module.generator.parameters())
    module.zero_grad(set_to_none=True)
    module.critic_flow_loss(piece.detach(), cond, streams).backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in module.fake_score.parameters())
    assert all(p.grad is None for p in module.generator.parameters())


def test_streaming_training_steps_continue_the_stream(corpus, tmp_path):
    module = make_module(num_steps=2, score_window=4, stream_blocks=1)
    before = [p.detach().clone() for p in module.generator.trainable_parameters()]
    trainer = pl.Trainer(max_steps=5, accelerator="cpu", logger=False, enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0,
                         default_root_dir=tmp_path)
    trainer.fit(module, datamodule=synth_worlds(corpus, frames=33))
    assert int(module.outer_step) == 4 and int(module.student_steps) == 1
    # 4 outer steps (5 optimiser steps) of one block on 3-block clips: a stream of 3, then a new one.
    assert module._stream.next == 1
    after = list(module.generator.trainable_parameters())
    assert any(not torch.equal(a, b) for a, b in zip(after, before))


def test_streaming_refuses_what_it_cannot_do(batch):
    with pytest.raises(ValueError, match="score_window"):
        make_module(stream_blocks=1)  # nothing to cut the pieces to
    with pytest.raises(ValueError, match="score_window"):
        make_module(score_window=5, stream_blocks=1)  # 2 + 3 latents, and a slice starts after the first
    with pytest.raises(ValueError, match="full blocks"):  # 9 latent frames hold 3 full blocks
        make_module(score_window=5, stream_blocks=4).continue_stream(batch, torch.Generator(), grad=False)
