"""DMD's score_window: long rollouts judged on window-sized slices with a re-anchored first latent."""

from __future__ import annotations

import pytest
import torch

from solarwm.backbones.wan22_ti2v_5b import Wan22TI2V5BAdapter, Wan22TI2V5BConfig
from solarwm.stages.dmd import DMDModule

from corpora import first_batch, synth_worlds


def make_module(**kwargs) -> DMDModule:
    torch.manual_seed(0)
    adapter = Wan22TI2V5BAdapter(config=Wan22TI2V5BConfig.tiny())
    return DMDModule(adapter=adapter, student_update_every=2, num_steps=2, **kwargs)


@pytest.fixture(scope="module")
def batch(tmp_path_factory) -> dict:
    return first_batch(synth_worlds(tmp_path_factory.mktemp("dmd_long") / "corpus", frames=25))


def test_slice_has_the_window_length_a_clean_re_anchor_and_its_own_cameras(batch):
    module = make_module(score_window=5)
    gen = module.generator
    x = torch.randn(1, gen.latent_channels, 7, 8, 8)
    cond = {
        "c2w": torch.arange(7.0).view(1, 7, 1, 1).expand(1, 7, 4, 4),
        "K": torch.arange(7.0).view(1, 7, 1).expand(1, 7, 4),
        "text_embeds": torch.zeros(1, 2, 3),
    }
    starts = set()
    for seed in range(20):
        piece, sliced, frames = module.score_slice(x, cond, torch.Generator().manual_seed(seed))
        start = int(sliced["c2w"][0, 0, 0, 0])
        starts.add(start)
        assert frames == slice(start, start + 5)
        assert piece.shape[2] == 5 and sliced["K"].shape[1] == 5 and sliced["text_embeds"] is cond["text_embeds"]
        torch.testing.assert_close(piece[:, :, 1:], x[:, :, start + 1 : start + 5])
        if start > 0:  # the anchor is the last pixel frame of latent `start`, encoded alone
            last = gen.decode(x[:, :, start - 1 : start + 1])[:, :, -1:]
            torch.testing.assert_close(piece[:, :, :1], gen.encode(last))
        else:
            torch.testing.assert_close(piece, x[:, :, :5])
    assert starts == {0, 1, 2}


def test_short_clips_and_no_window_are_left_alone(batch):
    module = make_module(score_window=9)
    x = torch.randn(1, module.generator.latent_channels, 7, 8, 8)
    cond = {"c2w": torch.zeros(1, 7, 4, 4)}
    assert module.score_slice(x, cond, torch.Generator())[0] is x
    assert make_module().score_slice(x, cond, torch.Generator())[0] is x


@pytest.mark.slow
def test_long_rollout_losses_train_the_student_and_critic_on_slices(batch):
    module = make_module(score_window=5)
    assert batch["video"].shape[2] == 25  # 7 latent frames: 3 blocks, scored 5 at a time
    module.student_loss(batch, torch.Generator().manual_seed(0)).backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in module.generator.parameters())
    module.zero_grad(set_to_none=True)
    module.critic_loss(batch, torch.Generator().manual_seed(0)).backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in module.fake_score.parameters())


def test_score_window_refuses_what_it_cannot_do():
    with pytest.raises(ValueError):
        make_module(score_window=1)


def test_regression_on_a_slice_compares_with_the_clip_under_its_cameras(batch, monkeypatch):
    module = make_module(score_window=5, regression_weight=1.0)
    seen = []
    loss = module.generator.loss
    monkeypatch.setattr(module.generator, "loss", lambda out, x0, mask: seen.append(x0) or loss(out, x0, mask))
    module.student_loss(batch, torch.Generator().manual_seed(0))
    x0 = module.latents(batch)
    assert len(seen) == 1 and seen[0].shape[2] == 5
    assert any(torch.equal(seen[0], x0[:, :, s : s + 5].float()) for s in range(3))
