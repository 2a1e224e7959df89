"""BidirectionalModule (eq. 1) on the tiny wan22_ti2v_5b adapter, on a CPU."""

import math

import lightning.pytorch as pl
import pytest
import torch

from solarwm.backbones.wan22_ti2v_5b import Wan22TI2V5BAdapter, Wan22TI2V5BConfig
from solarwm.camera.se3 import look_at
from solarwm.objectives.flow_matching import loss_weights, masked_mse, sample_uniform_u
from solarwm.stages.bidirectional import BidirectionalModule, NonFiniteLossError, WarmupConstantLR

B, F, H, W = 2, 9, 32, 32


def make_batch(seed: int = 0, ids=("clip-a", "clip-b")) -> dict:
    g = torch.Generator().manual_seed(seed)
    c2w = torch.stack([
        torch.stack([torch.from_numpy(look_at((3 * math.cos(0.1 * i + k), 3 * math.sin(0.1 * i + k), 1.0), (0, 0, 0.5)))
                     for i in range(F)]) for k in range(B)
    ]).float()
    # A smooth, learnable clip: a gradient that drifts over time.
    ramp = torch.linspace(-1, 1, W).view(1, 1, 1, 1, W)
    t = torch.linspace(0, 1, F).view(1, 1, F, 1, 1)
    video = (0.6 * ramp + 0.3 * t + 0.05 * torch.randn(B, 3, F, H, W, generator=g)).clamp(-1, 1)
    return {"video": video, "c2w": c2w, "K": torch.tensor([28.0, 28.0, 16.0, 16.0]).expand(B, F, 4).clone(),
            "caption": ["a red cube", "a blue sphere"], "sample_id": list(ids)}


def make_module(lr: float = 1e-3, **kwargs) -> BidirectionalModule:
    torch.manual_seed(0)
    return BidirectionalModule(
        Wan22TI2V5BAdapter(Wan22TI2V5BConfig.tiny()),
        optimizer=lambda p: torch.optim.AdamW(p, lr=lr),
        **kwargs,
    )


def make_trainer(max_steps: int) -> pl.Trainer:
    return pl.Trainer(
        accelerator="cpu", max_steps=max_steps, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
    )


def loader(batches):
    return torch.utils.data.DataLoader(batches, batch_size=None, shuffle=False)


def test_objective_helpers():
    u = sample_uniform_u(10000, "logit_normal", 0.0, 1.0, generator=torch.Generator().manual_seed(0))
    assert 0 < u.min() and u.max() < 1 and abs(u.mean().item() - 0.5) < 0.02
    assert torch.equal(loss_weights(torch.tensor([0.3]), "none"), torch.ones(1))
    assert loss_weights(torch.tensor([0.5]), "cosmap").item() == pytest.approx(4 / math.pi)
    with pytest.raises(ValueError, match="unknown timestep sampling"):
        sample_uniform_u(2, "beta")
    pred, target = torch.zeros(1, 1, 2, 1, 1), torch.tensor([1.0, 3.0]).view(1, 1, 2, 1, 1)
    assert masked_mse(pred, target, torch.tensor([0.0, 1.0]).view(1, 1, 2, 1, 1)).item() == 9.0


def test_one_training_step_changes_only_the_transformer():
    module = make_module()
    before = {n: p.detach().clone() for n, p in module.named_parameters()}
    make_trainer(1).fit(module, loader([make_batch()]))
    assert math.isfinite(module.trainer.callback_metrics["train/loss"].item())
    changed = {n for n, p in module.named_parameters() if not torch.equal(p, before[n])}
    assert changed and all(n.startswith("adapter.transformer.") for n in changed)
    assert module.adapter.codec.training is False and module.adapter.text_encoder.training is False


@pytest.mark.slow
def test_loss_goes_down_on_a_fixed_batch():
    module = make_module(lr=2e-3)
    batch = make_batch()
    optimizer = module.configure_optimizers()["optimizer"]
    fixed = lambda: module.flow_loss(batch, generator=torch.Generator().manual_seed(7))[0].item()  # noqa: E731
    start = fixed()
    module.train()
    for step in range(30):
        loss, _ = module.flow_loss(batch, generator=torch.Generator().manual_seed(step % 4))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    end = fixed()
    assert end < 0.85 * start, (start, end)


def test_validation_loss_is_reproducible():
    module = make_module().eval()
    batch = make_batch()
    with torch.no_grad():
        a = module.validation_step(batch, 0)
        b = module.validation_step(batch, 0)
        c = module.validation_step(batch, 1)
    assert a.item() == b.item() and a.item() != c.item()


def test_nan_loss_names_the_step_and_the_sample_ids():
    module = make_module()
    bad = make_batch(seed=1, ids=("good-1", "broken-clip-7"))
    bad["video"][1, :, 3] = float("nan")
    with pytest.raises(NonFiniteLossError, match=r"global step 1 .*broken-clip-7"):
        make_trainer(3).fit(module, loader([make_batch(), bad, make_batch()]))


@pytest.mark.slow
def test_generate_keeps_the_first_frame_and_follows_the_camera():
    module = make_module().eval()
    batch = make_batch()
    first = batch["video"][:, :, 0]
    kwargs = dict(caption=batch["caption"], K=batch["K"], num_steps=3)
    video = module.generate(first, c2w=batch["c2w"], generator=torch.Generator().manual_seed(0), **kwargs)
    assert video.shape == (B, 3, F, H, W) and video.abs().max() <= 1.0
    assert torch.equal(video[:, :, 0], first)  # lossless codec: the anchor comes back exactly
    again = module.generate(first, c2w=batch["c2w"], generator=torch.Generator().manual_seed(0), **kwargs)
    assert torch.equal(video, again)
    turned = module.generate(first, c2w=batch["c2w"].flip(1), generator=torch.Generator().manual_seed(0), **kwargs)
    assert (turned[:, :, 1:] - video[:, :, 1:]).abs().max() > 1e-3


def test_warmup_schedule_and_cli_style_construction():
    from jsonargparse import ArgumentParser

    parser = ArgumentParser()
    parser.add_argument("--model", type=BidirectionalModule)
    cfg = parser.parse_object({"model": {
        "class_path": "solarwm.stages.bidirectional.BidirectionalModule",
        "init_args": {
            "adapter": {"class_path": "solarwm.backbones.wan22_ti2v_5b.Wan22TI2V5BAdapter",
                        "init_args": {"config": {"num_layers": 1, "shift": 2.0}}},
            "timestep_sampling": "uniform", "loss_weighting": "cosmap",
            "lr_scheduler": {"class_path": "solarwm.stages.bidirectional.WarmupConstantLR",
                             "init_args": {"warmup_steps": 4}},
        },
    }})
    module = parser.instantiate_classes(cfg).model
    assert module.adapter.config.num_layers == 1 and module.adapter.shift == 2.0
    opt = module.configure_optimizers()
    sched = opt["lr_scheduler"]["scheduler"]
    assert isinstance(sched, WarmupConstantLR) and opt["lr_scheduler"]["interval"] == "step"
    lrs = []
    for _ in range(6):
        lrs.append(opt["optimizer"].param_groups[0]["lr"])
        opt["optimizer"].step()
        sched.step()
    assert lrs == pytest.approx([2.5e-5, 5e-5, 7.5e-5, 1e-4, 1e-4, 1e-4])


def test_warmup_constant_cooldown_resumes_a_constant_run_exactly():
    """The stable phase equals a run without cool-down, so a constant-LR checkpoint resumes into its cool-down."""
    def lrs(scheduler_args: dict, state: tuple | None = None, start: int = 0, steps: int = 12) -> tuple[list, tuple]:
        opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
        sched = WarmupConstantLR(opt, **scheduler_args)
        if state is not None:  # as Lightning resumes: the optimizer's state (its LR too), then the scheduler's
            opt.load_state_dict(state[0])
            sched.load_state_dict(state[1])
        out = []
        for _ in range(start, steps):
            out.append(opt.param_groups[0]["lr"])
            opt.step()
            sched.step()
        return out, (opt.state_dict(), sched.state_dict())

    cool = dict(warmup_steps=2, decay_start=4, decay_steps=4, min_lr_ratio=0.25)
    full, _ = lrs(cool)
    assert full == pytest.approx([0.5, 1, 1, 1, 1, 0.8125, 0.625, 0.4375, 0.25, 0.25, 0.25, 0.25])
    constant, state = lrs(dict(warmup_steps=2), steps=4)  # a constant-LR run stopped where the cool-down starts
    assert constant == pytest.approx(full[:4])
    resumed, _ = lrs(cool, state=state, start=4)
    assert resumed == pytest.approx(full[4:])
    with pytest.raises(ValueError, match="min_lr_ratio"):
        WarmupConstantLR(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0), decay_steps=2, min_lr_ratio=2.0)

    # The cosine schedule keeps its shape out of the state too: a resume follows the config's total_steps.
    from solarwm.stages.base import WarmupCosineLR

    short = WarmupCosineLR(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0), total_steps=10)
    longer = WarmupCosineLR(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0), total_steps=100)
    longer.load_state_dict(short.state_dict())
    assert "total_steps" not in short.state_dict() and longer.total_steps == 100
