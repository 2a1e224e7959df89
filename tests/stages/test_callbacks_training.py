"""EMA, EvalVideoLogger and AdapterExport on a real 4-step fit of the tiny Wan route."""

from __future__ import annotations

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.loggers import TensorBoardLogger

from solarwm.backbones.base import load_adapter
from solarwm.backbones.wan22_ti2v_5b import Wan22TI2V5BAdapter
from solarwm.callbacks import EMA, AdapterExport, EvalVideoLogger
from solarwm.data.sources.synthetic import synth_corpus
from solarwm.data.video import probe_video
from solarwm.datamodules import WorldDataModule
from solarwm.stages.bidirectional import BidirectionalModule


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    """4 optimizer steps with EMA, eval videos every 2 steps and export; returns (trainer, module, callbacks, dm)."""
    root = tmp_path_factory.mktemp("fit")
    synth_corpus(root / "corpus", clips=3, frames=9, width=48, height=32, fps=8.0, seed=1)
    pl.seed_everything(0)
    dm = WorldDataModule(
        num_frames=5, width=32, height=32, batch_size=1, corpus_dir=str(root / "corpus"), num_val_clips=1
    )
    module = BidirectionalModule(Wan22TI2V5BAdapter(preset="tiny"), sample_steps=2)
    ema, video, export = (
        EMA(decay=0.5),
        EvalVideoLogger(every_n_steps=2, num_samples=1, num_steps=2, fps=4.0),
        AdapterExport(str(root / "adapter")),
    )
    trainer = pl.Trainer(
        accelerator="cpu",
        max_steps=4,
        limit_val_batches=1,
        num_sanity_val_steps=0,
        val_check_interval=2,
        check_val_every_n_epoch=None,
        logger=TensorBoardLogger(str(root), name="tb"),
        callbacks=[ema, video, export],
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        default_root_dir=str(root),
    )
    trainer.fit(module, datamodule=dm)
    return trainer, module, (ema, video, export), dm


@pytest.mark.slow
def test_ema_tracks_and_swaps(fitted) -> None:
    """The average differs from the trained weights, is swapped in and out exactly, and is checkpoint state."""
    trainer, module, (ema, _, _), _ = fitted
    name, param = next((n, p) for n, p in module.named_parameters() if p.requires_grad)
    trained = param.detach().clone()
    assert not torch.equal(ema.shadow[name], trained)
    with ema.swapped(module):
        assert torch.equal(param, ema.shadow[name])
    assert torch.equal(param, trained)
    state = ema.state_dict()
    restored = EMA(decay=0.5)
    restored.load_state_dict(state)
    assert torch.equal(restored.shadow[name], ema.shadow[name])


def test_test_loop_runs_on_the_average(fitted) -> None:
    """``trainer.test`` evaluates the EMA weights (as validation and export do) and swaps back after."""
    trainer, module, (ema, _, _), dm = fitted
    name, param = next((n, p) for n, p in module.named_parameters() if p.requires_grad)
    trained, seen = param.detach().clone(), []
    original = module.test_step

    def spy(batch, batch_idx):
        seen.append(param.detach().clone())
        return original(batch, batch_idx)

    module.test_step = spy
    try:
        trainer.test(module, dataloaders=dm.val_dataloader(), verbose=False)
    finally:
        del module.test_step
    assert seen and torch.equal(seen[0], ema.shadow[name].to(param.dtype))
    assert torch.equal(param, trained)


def test_ema_update_rule() -> None:
    """One update moves the average by (1 - decay) towards the weights."""
    ema = EMA(decay=0.9)
    layer = torch.nn.Linear(2, 2)
    ema.shadow = {n: torch.zeros_like(p) for n, p in layer.named_parameters()}

    class _T:
        global_step = 1

    ema.on_train_batch_end(_T(), layer)
    assert torch.allclose(ema.shadow["weight"], 0.1 * layer.weight.detach())


def test_tensorboard_event_holds_the_video(fitted) -> None:
    """The event file read back has an animated GIF per logging step, ground truth | generated wide."""
    from io import BytesIO

    from PIL import Image
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    trainer, _, (_, video, _), dm = fitted
    acc = EventAccumulator(trainer.logger.log_dir, size_guidance={"images": 0})
    acc.Reload()
    sample_id = dm.val_dataset.rows[0].sample_id
    events = acc.Images(f"eval/{sample_id}")
    # Steps 2 and 4: the step trigger and the validation at the same step log once.
    assert [e.step for e in events] == [2, 4]
    for e in events:
        assert (e.width, e.height) == (64, 32)
        gif = Image.open(BytesIO(e.encoded_image_string))
        assert gif.format == "GIF" and gif.n_frames == 5
    assert len(video.written) == 2
    for path in video.written:
        assert path.parent.name == "eval_videos"
        meta = probe_video(path)
        assert (meta["num_frames"], meta["width"], meta["height"]) == (5, 64, 32)


def test_export_reloads_identical(fitted) -> None:
    """The exported adapter (EMA weights) reloads into a fresh adapter with identical outputs."""
    trainer, module, (ema, _, export), dm = fitted
    fresh = load_adapter(export.exported)
    assert isinstance(fresh, Wan22TI2V5BAdapter)
    batch = torch.utils.data.default_collate([dm.val_dataset[0]])
    g = torch.Generator().manual_seed(0)
    with ema.swapped(module):
        x0 = module.adapter.encode(batch["video"])
        noise = torch.randn(x0.shape, generator=g)
        x_t, sigma = module.adapter.noisy_input(x0, noise, torch.tensor([0.7]))
        expected = module.adapter(x_t, sigma, module.adapter.prepare_conditions(batch))
    fresh.eval()
    got = fresh(x_t, sigma, fresh.prepare_conditions(batch))
    assert torch.equal(got, expected)
    # And it is the average, not the last training weights.
    trained = module.adapter(x_t, sigma, module.adapter.prepare_conditions(batch))
    assert not torch.allclose(trained, expected)
