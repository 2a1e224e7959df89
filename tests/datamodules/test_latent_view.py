"""`solarwm data latents`: a recipe's windows encoded once; the tiny route trains from the view with the
raw-video path's loss, a view of another route or codec is refused by name, and a killed build resumes."""

from __future__ import annotations

import json
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
import yaml

from solarwm.cli import main
from solarwm.data.contract import iter_clip_dirs, update_meta
from solarwm.data.index import read_index
from solarwm.data.sources.synthetic import synth_corpus
from solarwm.datamodules import latents as view_module
from solarwm.datamodules.latents import LatentViewError

GEOMETRY = dict(num_frames=9, width=32, height=32)
VIEW_ARGS = ["--route", "wan22_ti2v_5b", "--num-frames", "9", "--width", "32", "--height", "32"]


def snapshot(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def recipe(tmp_path_factory) -> Path:
    """A release of 4 rendered clips (17 frames at 48x32) and a recipe of two 9-frame windows per clip, repeat 2."""
    root = tmp_path_factory.mktemp("view")
    corpus = root / "corpus"
    synth_corpus(corpus, clips=4, frames=17, width=48, height=32, fps=8.0, seed=11)
    for folder in iter_clip_dirs(corpus):  # selection without the metric stages: every clip kept
        update_meta(
            folder, lambda doc: doc.update(selection={"policy": "test", "version": "1", "tier": "high", "reasons": []})
        )
    assert main(["data", "pack", "--corpus", str(corpus), "--out", str(root / "release")]) == 0
    spec = {
        "name": "tiny_9f",
        "owners": ["synthetic"],
        "tiers": ["kept-high"],
        "repeat": {"synthetic": 2},
        "window": {"frames": 9, "mode": "evenly_spread", "count": 2},
        "test_view": {"per_owner": 1},
    }
    (root / "spec.yaml").write_text(yaml.safe_dump(spec))
    assert (
        main(
            [
                "data",
                "recipe",
                "--release",
                str(root / "release"),
                "--spec",
                str(root / "spec.yaml"),
                "--out",
                str(root / "recipe"),
            ]
        )
        == 0
    )
    return root


@pytest.fixture(scope="module")
def view(recipe: Path) -> Path:
    out = recipe / "latent-view"
    assert (
        main(
            [
                "data",
                "latents",
                "--index",
                str(recipe / "recipe/train-index.jsonl.gz"),
                "--root",
                str(recipe / "release"),
                "--out",
                str(out),
                "--shard-max-samples",
                "4",
                *VIEW_ARGS,
            ]
        )
        == 0
    )
    return out


def _datamodules(recipe: Path, view: Path):
    from solarwm.datamodules import WorldDataModule

    raw = WorldDataModule(
        **GEOMETRY,
        batch_size=2,
        shuffle=False,
        train_index=str(recipe / "recipe/train-index.jsonl.gz"),
        release_root=str(recipe / "release"),
    )
    cached = WorldDataModule(**GEOMETRY, batch_size=2, shuffle=False, latent_view=str(view))
    return raw, cached


def test_view_rows_name_route_codec_and_source(recipe: Path, view: Path) -> None:
    source = read_index(recipe / "recipe/train-index.jsonl.gz", recipe / "release")
    rows = read_index(view / "index.jsonl.gz", view)
    meta = json.loads((view / "view.json").read_text())
    assert len(rows) == len(source) == 6 and meta["failed"] == []
    assert meta["accounting"] == "source rows 6 = encoded 6 + failed 0"
    assert meta["codec"]["config"]["codec"] == "patchify" and meta["codec"]["route"] == "wan22_ti2v_5b"
    assert sorted(p.name for p in (view / "shards").iterdir()) == ["latents-000000.tar", "latents-000001.tar"]
    for row, src in zip(rows, source):
        assert row["sample_id"] == src["sample_id"] and row["source"] == src
        assert row["route"] == "wan22_ti2v_5b" and row["codec_hash"] == meta["codec_hash"]
        assert row["epoch_repeats"] == 2 and row["latent_shape"] == [48, 3, 16, 16]


def test_view_batch_gives_the_raw_path_loss(recipe: Path, view: Path) -> None:
    from solarwm.backbones.wan22_ti2v_5b import Wan22TI2V5BAdapter
    from solarwm.stages.bidirectional import BidirectionalModule

    raw, cached = _datamodules(recipe, view)
    raw.setup("fit")
    cached.setup("fit")
    raw_batch = next(iter(raw.train_dataloader()))
    view_batch = next(iter(cached.train_dataloader()))
    assert raw_batch["sample_id"] == view_batch["sample_id"]
    assert "video" not in view_batch and view_batch["text_embeds"].shape[:2] == (2, 16)
    torch.manual_seed(0)
    module = BidirectionalModule(Wan22TI2V5BAdapter(preset="tiny"))
    torch.testing.assert_close(view_batch["latents"], module.adapter.encode(raw_batch["video"]), rtol=0, atol=1e-6)
    torch.testing.assert_close(view_batch["K"], raw_batch["K"])
    losses = []
    for batch in (raw_batch, view_batch):
        torch.manual_seed(123)
        losses.append(module.flow_loss(batch)[0])
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_tiny_route_trains_from_the_view(recipe: Path, view: Path) -> None:
    from solarwm.backbones.wan22_ti2v_5b import Wan22TI2V5BAdapter
    from solarwm.stages.bidirectional import BidirectionalModule

    _, cached = _datamodules(recipe, view)
    module = BidirectionalModule(Wan22TI2V5BAdapter(preset="tiny"), timestep_sampling="uniform")
    module.adapter.encode = None  # the view path must never encode video
    before = [p.detach().clone() for p in module.adapter.trainable_parameters()]
    trainer = pl.Trainer(
        accelerator="cpu",
        max_steps=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        limit_val_batches=0,
        num_sanity_val_steps=0,
    )
    trainer.fit(module, datamodule=cached)
    assert trainer.global_step == 2
    assert torch.isfinite(trainer.callback_metrics["train/loss"])
    assert any(not torch.equal(a, b) for a, b in zip(module.adapter.trainable_parameters(), before))


def test_view_of_another_codec_or_route_is_refused(recipe: Path, view: Path) -> None:
    from solarwm.backbones.wan22_i2v_14b import Wan22I2V14BAdapter
    from solarwm.backbones.wan22_ti2v_5b import Wan22TI2V5BAdapter, Wan22TI2V5BConfig
    from solarwm.stages.bidirectional import BidirectionalModule

    meta = json.loads((view / "view.json").read_text())
    other_codec = Wan22TI2V5BAdapter(config=Wan22TI2V5BConfig(prediction="x0", codec="wan_vae", vae_config="tiny"))
    _, cached = _datamodules(recipe, view)
    trainer = pl.Trainer(
        accelerator="cpu",
        max_steps=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        limit_val_batches=0,
        num_sanity_val_steps=0,
    )
    with pytest.raises(
        LatentViewError,
        match=rf"route 'wan22_ti2v_5b' codec {meta['codec_hash']}; this model is "
        rf"route 'wan22_ti2v_5b' codec (?!{meta['codec_hash']})",
    ):
        trainer.fit(BidirectionalModule(other_codec), datamodule=cached)
    # the stage refuses too, for a batch used without the datamodule's check
    _, cached = _datamodules(recipe, view)
    cached.setup("fit")
    batch = next(iter(cached.train_dataloader()))
    with pytest.raises(LatentViewError, match=r"made for route 'wan22_ti2v_5b'.*this model is route 'wan22_i2v_14b'"):
        BidirectionalModule(Wan22I2V14BAdapter(preset="tiny")).flow_loss(batch)
    # and a datamodule asking for other windows
    from solarwm.datamodules import WorldDataModule

    with pytest.raises(LatentViewError, match="has windows .*'num_frames': 9.* asks for .*'num_frames': 13"):
        WorldDataModule(num_frames=13, width=32, height=32, latent_view=str(view)).setup("fit")


def test_killed_build_resumes_byte_identical(recipe: Path, view: Path, tmp_path: Path, monkeypatch, capsys) -> None:
    args = [
        "data",
        "latents",
        "--index",
        str(recipe / "recipe/train-index.jsonl.gz"),
        "--root",
        str(recipe / "release"),
        "--shard-max-samples",
        "4",
        *VIEW_ARGS,
    ]
    out = tmp_path / "resumed"
    original = view_module._encode_sample
    calls = {"n": 0}

    def dying(*a, **k):
        calls["n"] += 1
        if calls["n"] == 6:  # the second shard is half written
            raise KeyboardInterrupt("simulated kill")
        return original(*a, **k)

    monkeypatch.setattr(view_module, "_encode_sample", dying)
    with pytest.raises(KeyboardInterrupt):
        main([*args, "--out", str(out)])
    assert sorted(p.name for p in (out / "shards").iterdir()) == ["latents-000000.tar", "latents-000001.tar.partial"]
    monkeypatch.setattr(view_module, "_encode_sample", original)
    assert main([*args, "--out", str(out)]) == 0
    assert snapshot(out) == snapshot(view)
    capsys.readouterr()
    # a finished view reruns as a no-op; other settings are refused rather than mixed in
    assert main([*args, "--out", str(out)]) == 0
    assert json.loads(capsys.readouterr().out)["written_shards"] == 0
    assert main([*args[:-2], "--width", "48", "--out", str(out)]) == 2
    assert "write the view into a fresh folder" in capsys.readouterr().err
