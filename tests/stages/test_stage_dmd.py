"""Stage 3 (DMDModule): roles, what each update touches, the gradient, checkpoints and exact resume."""

from __future__ import annotations

from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch

from solarwm.backbones.wan22_ti2v_5b import Wan22TI2V5BAdapter, Wan22TI2V5BConfig
from solarwm.callbacks import EMA
from solarwm.datamodules import WorldDataModule
from solarwm.datamodules.world import SynthCorpus
from solarwm.objectives.dmd import dmd_gradient, dmd_surrogate
from solarwm.objectives.flow_matching import shift_sigmas
from solarwm.stages.dmd import DMDModule


def make_module(**kwargs) -> DMDModule:
    torch.manual_seed(0)
    adapter = Wan22TI2V5BAdapter(config=Wan22TI2V5BConfig.tiny())
    return DMDModule(
        adapter=adapter,
        student_update_every=2,
        optimizer=lambda p: torch.optim.AdamW(p, lr=1e-3, betas=(0.0, 0.999)),
        critic_optimizer=lambda p: torch.optim.AdamW(p, lr=1e-3, betas=(0.0, 0.999)),
        **kwargs,
    )


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("dmd") / "corpus"
    dm = WorldDataModule(
        corpus_dir=str(root),
        synth=SynthCorpus(clips=2, frames=9, width=32, height=32, fps=8.0),
        num_frames=9,
        width=32,
        height=32,
        num_val_clips=1,
        batch_size=1,
        shuffle=False,
    )
    dm.prepare_data()
    return str(root)


def datamodule(corpus: str) -> WorldDataModule:
    return WorldDataModule(
        corpus_dir=corpus, num_frames=9, width=32, height=32, num_val_clips=1, batch_size=1, shuffle=False
    )


def one_batch(corpus: str) -> dict:
    dm = datamodule(corpus)
    dm.setup("fit")
    return next(iter(dm.train_dataloader()))


def test_roles_share_frozen_parts_and_only_the_intended_weights_get_gradients(corpus):
    module = make_module()
    assert module.generator.codec is module.real_score.codec is module.fake_score.codec
    assert module.generator.delta_embedding is None and not any(p.requires_grad for p in module.real_score.parameters())
    batch = one_batch(corpus)

    def touched() -> dict[str, bool]:
        return {
            role: any(p.grad is not None and p.grad.abs().sum() > 0 for p in getattr(module, role).parameters())
            for role in ("generator", "real_score", "fake_score")
        }

    module.student_loss(batch, torch.Generator().manual_seed(0)).backward()
    assert touched() == {"generator": True, "real_score": False, "fake_score": False}
    module.zero_grad(set_to_none=True)
    module.critic_loss(batch, torch.Generator().manual_seed(0)).backward()
    assert touched() == {"generator": False, "real_score": False, "fake_score": True}


def test_dmd_gradient_is_normalised_and_the_surrogate_carries_it():
    output = torch.randn(2, 4, 3, 2, 2, requires_grad=True)
    fake, real = torch.randn(2, 4, 3, 2, 2), torch.randn(2, 4, 3, 2, 2)
    mask = torch.ones(2, 1, 3, 1, 1)
    mask[:, :, 0] = 0
    grad = dmd_gradient(output, fake, real, mask)
    norm = ((output.detach() - real).abs()[:, :, 1:]).flatten(1).mean(1)
    torch.testing.assert_close(grad[:, :, 1:], (fake - real)[:, :, 1:] / norm.view(2, 1, 1, 1, 1))
    assert torch.all(grad[:, :, 0] == 0)
    dmd_surrogate(output, grad, mask).backward()
    torch.testing.assert_close(output.grad, grad / mask.expand_as(output).sum())


def test_score_shift_sets_the_score_sigmas():
    u = torch.randint(0, 1000, (64,), generator=torch.Generator().manual_seed(3)).double() / 1000.0
    routed, uniform = make_module(), make_module(score_shift=1.0)
    torch.testing.assert_close(
        routed.score_sigmas(64, torch.Generator().manual_seed(3)),
        shift_sigmas(u, routed.generator.shift).clamp(0.02, 0.98).float(),
    )
    torch.testing.assert_close(uniform.score_sigmas(64, torch.Generator().manual_seed(3)), u.clamp(0.02, 0.98).float())
    assert routed.generator.shift != 1.0  # so the two draws differ
    with pytest.raises(ValueError, match="score_shift"):
        make_module(score_shift=0.0)


class LossLog(pl.Callback):
    def __init__(self) -> None:
        self.losses: list[tuple[int, float, float | None]] = []

    def on_train_batch_end(self, trainer, pl_module, *args) -> None:
        m = trainer.callback_metrics
        student = float(m["train/student_loss"]) if pl_module._student_updated else None
        self.losses.append((int(pl_module.outer_step), float(m["train/critic_loss"]), student))


def fit(
    module: DMDModule, corpus: str, root: Path, max_steps: int, ckpt_path: str | None = None, every: int | None = None
):
    log = LossLog()
    callbacks = [log, EMA(decay=0.5, start_step=1)]
    if every:
        callbacks.append(pl.callbacks.ModelCheckpoint(dirpath=root, every_n_train_steps=every, save_top_k=-1))
    trainer = pl.Trainer(
        max_steps=max_steps,
        accelerator="cpu",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        callbacks=callbacks,
        default_root_dir=root,
        deterministic=True,
    )
    trainer.fit(module, datamodule=datamodule(corpus), ckpt_path=ckpt_path)
    return log.losses, trainer


@pytest.mark.slow
def test_training_keeps_the_teacher_and_resume_continues_exactly(corpus, tmp_path):
    module = make_module()
    real_before = {k: v.clone() for k, v in module.real_score.state_dict().items()}
    gen_before = {k: v.clone() for k, v in module.generator.transformer.state_dict().items()}
    full, trainer = fit(module, corpus, tmp_path / "full", max_steps=9, every=None)
    assert all(torch.equal(v, module.real_score.state_dict()[k]) for k, v in real_before.items())
    assert any(not torch.equal(v, module.generator.transformer.state_dict()[k]) for k, v in gen_before.items())
    assert int(module.student_steps) >= 2 and sum(s is not None for _, _, s in full) == int(module.student_steps)

    first = make_module()
    part1, _ = fit(first, corpus, tmp_path / "part", max_steps=4, every=4)
    ckpt = sorted((tmp_path / "part").glob("*.ckpt"))[-1]
    state = torch.load(ckpt, weights_only=True)
    roles = {k.split(".")[0] for k in state["state_dict"]}
    assert {"generator", "real_score", "fake_score"} <= roles and len(state["optimizer_states"]) == 2
    assert {k: state["solarwm"][k] for k in ("stage", "route")} == {"stage": "dmd", "route": "wan22_ti2v_5b"}
    assert state["solarwm"]["config"]["prediction"] == "x0"  # what init_from checks against the next adapter
    part2, _ = fit(make_module(), corpus, tmp_path / "part2", max_steps=9, ckpt_path=str(ckpt))
    resumed = part1 + part2
    assert [s for s, _, _ in resumed] == [s for s, _, _ in full]
    for (_, c_full, s_full), (_, c_res, s_res) in zip(full, resumed):
        assert c_res == pytest.approx(c_full, rel=1e-5, abs=1e-7)
        assert (s_full is None) == (s_res is None) and (
            s_full is None or s_res == pytest.approx(s_full, rel=1e-5, abs=1e-7)
        )


@pytest.mark.slow
def test_periodic_checkpoints_and_eval_videos_fire_when_the_step_count_jumps_over_the_multiple(corpus, tmp_path):
    """A DMD batch makes 1 or 2 optimizer steps; with student_update_every=2 the count runs 1, 2, 4, 5, 7, 8.

    Lightning's ModelCheckpoint (``global_step % 3 == 0``) never saves; StepCheckpoint and EvalVideoLogger act
    on the batches that cross 3 and 6 (ending at steps 4 and 7).
    """
    from solarwm.callbacks import EvalVideoLogger, StepCheckpoint, crossed_multiple

    assert crossed_multiple(2, 4, 3) and crossed_multiple(2, 3, 3) and not crossed_multiple(4, 5, 3)
    assert not crossed_multiple(0, 0, 1) and not crossed_multiple(0, 5, 0)
    steps = []

    class Steps(pl.Callback):
        def on_train_batch_end(self, trainer, *args) -> None:
            steps.append(trainer.global_step)

    videos = EvalVideoLogger(every_n_steps=3, num_steps=1)
    callbacks = [
        Steps(),
        videos,
        pl.callbacks.ModelCheckpoint(dirpath=tmp_path / "lightning", every_n_train_steps=3, save_top_k=-1),
        StepCheckpoint(dirpath=tmp_path / "step", every_n_train_steps=3, save_top_k=-1, filename="{step}"),
    ]
    trainer = pl.Trainer(
        max_steps=8,
        accelerator="cpu",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        callbacks=callbacks,
        default_root_dir=tmp_path,
    )
    trainer.fit(make_module(), datamodule=datamodule(corpus))
    assert steps == [1, 2, 4, 5, 7, 8]
    assert not list((tmp_path / "lightning").glob("*.ckpt"))
    assert sorted(p.name for p in (tmp_path / "step").glob("*.ckpt")) == ["step=4.ckpt", "step=7.ckpt"]
    assert [p.name.split("_")[0] for p in videos.written] == ["step0000004", "step0000007"]


@pytest.mark.slow
def test_camera_guidance_pushes_the_real_score_away_from_a_still_camera(corpus, monkeypatch):
    import solarwm.stages.dmd as dmd_mod

    module = make_module(guidance_scale=0.0, camera_guidance_scale=2.0)
    batch = one_batch(corpus)
    calls: list[torch.Tensor] = []

    def fake_x0(adapter, noisy, sigma_pf, cond):
        if adapter is module.fake_score:
            return torch.zeros_like(noisy)
        c2w = cond["c2w"]
        calls.append(c2w)
        still = bool(torch.equal(c2w, c2w[:, :1].expand_as(c2w)))
        return torch.full_like(noisy, 0.25 if still else 1.0)

    seen = {}

    def capture(output, fake, real, mask):
        seen["real"] = real
        return dmd_gradient(output, fake, real, mask)

    monkeypatch.setattr(module, "_x0", fake_x0)
    monkeypatch.setattr(dmd_mod, "dmd_gradient", capture)
    module.student_loss(batch, torch.Generator().manual_seed(0))
    # The real score saw the commanded cameras (which move) and the first frame's camera held still.
    assert len(calls) == 2 and not torch.equal(calls[0], calls[0][:, :1].expand_as(calls[0]))
    assert torch.equal(calls[1], calls[0][:, :1].expand_as(calls[0]))
    assert torch.allclose(seen["real"], torch.full_like(seen["real"], 1.0 + 2.0 * (1.0 - 0.25)))

    calls.clear()
    module.camera_guidance_scale = 0.0
    module.student_loss(batch, torch.Generator().manual_seed(0))
    assert len(calls) == 1 and torch.allclose(seen["real"], torch.ones_like(seen["real"]))


@pytest.mark.slow
def test_regression_weight_adds_the_mse_of_the_generated_frames_to_the_clip(corpus):
    batch = one_batch(corpus)
    plain = make_module(guidance_scale=0.0)
    with_reg = make_module(guidance_scale=0.0, regression_weight=0.5)
    with_reg.load_state_dict(plain.state_dict())
    rng = lambda: torch.Generator().manual_seed(3)  # noqa: E731 - the same rollout for both
    exit_step, streams = plain.draws(batch, rng())
    output, _, x0 = plain.rollout_and_replay(batch, exit_step, streams, grad=False)
    gen = output[:, :, plain.generator.clean_latent_frames :]
    expected = 0.5 * ((gen - x0[:, :, plain.generator.clean_latent_frames :]) ** 2).mean()
    assert expected > 0
    loss = with_reg.student_loss(batch, rng())
    assert torch.allclose(loss - plain.student_loss(batch, rng()), expected, rtol=1e-4)
    loss.backward()  # the term trains the student only
    assert any(p.grad is not None for p in with_reg.generator.parameters())
    assert all(p.grad is None for p in with_reg.fake_score.parameters())
    with pytest.raises(ValueError, match="regression_weight"):
        make_module(regression_weight=-1.0)
