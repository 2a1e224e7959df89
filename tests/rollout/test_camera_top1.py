"""`solarwm test`'s test/camera_top1: multi-view worlds, each view generated and ranked against every view's truth."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from solarwm.backbones.wan22_ti2v_5b import Wan22TI2V5BAdapter, Wan22TI2V5BConfig
from solarwm.datamodules import WorldDataModule
from solarwm.datamodules.world import SynthCorpus
from solarwm.stages.dmd import DMDModule

VIEWS = 3


@pytest.fixture(scope="module")
def datamodule(tmp_path_factory) -> WorldDataModule:
    root = tmp_path_factory.mktemp("top1")
    dm = WorldDataModule(
        corpus_dir=str(root / "corpus"), synth=SynthCorpus(clips=2, frames=9, width=32, height=32),
        test_multiview_dir=str(root / "multiview"),
        test_multiview=SynthCorpus(clips=2 * VIEWS, frames=9, width=32, height=32, seed=5, views=VIEWS),
        num_frames=9, width=32, height=32, num_val_clips=1, batch_size=1,
    )
    dm.prepare_data()
    dm.setup("test")
    return dm


class Scripted(DMDModule):
    """A DMD stage whose ``generate`` returns a chosen view's truth for every view (no model involved)."""

    truth: torch.Tensor
    shift_view: int = 0

    def generate(self, first_frame, caption, c2w, K, num_steps=None, generator=None, **kwargs):  # noqa: D102
        return self.truth.roll(self.shift_view, dims=0)


def test_views_of_a_world_form_one_batch_with_a_shared_first_frame(datamodule):
    loaders = datamodule.test_dataloader()
    assert isinstance(loaders, list) and len(loaders) == 2
    batches = list(loaders[1])
    assert len(batches) == 2 and all(b["video"].shape[0] == VIEWS for b in batches)
    for batch in batches:
        scenes = {json.loads((Path(r.folder) / "meta.json").read_text())["provenance"]["scene"]
                  for r in datamodule.multiview_dataset.rows if r.sample_id in batch["sample_id"]}
        assert len(scenes) == 1
        torch.testing.assert_close(batch["video"][:, :, 0], batch["video"][:1, :, 0].expand(VIEWS, -1, -1, -1))
        assert not torch.equal(batch["c2w"][0], batch["c2w"][1])  # only the camera tells the views apart


def test_a_model_that_follows_the_camera_scores_one_and_one_that_swaps_views_scores_zero(datamodule):
    torch.manual_seed(0)
    module = Scripted(adapter=Wan22TI2V5BAdapter(config=Wan22TI2V5BConfig.tiny()))
    batch = next(iter(datamodule.test_dataloader()[1]))
    for shift, expected in ((0, 1.0), (1, 0.0)):
        module.multiview_records = []
        module.truth, module.shift_view = batch["video"].float(), shift
        module.camera_top1_step(batch, 0)
        records = module.multiview_records
        assert len(records) == VIEWS and all(r["views"] == VIEWS for r in records)
        assert sum(r["top1"] for r in records) / VIEWS == expected
        assert all((r["margin_db"] > 0) == r["top1"] for r in records)


def test_without_a_multiview_set_the_test_loader_is_unchanged(tmp_path):
    dm = WorldDataModule(corpus_dir=str(tmp_path / "c"), synth=SynthCorpus(clips=2, frames=9, width=32, height=32),
                         num_frames=9, width=32, height=32, num_val_clips=1, batch_size=1)
    dm.prepare_data()
    dm.setup("test")
    assert not isinstance(dm.test_dataloader(), list)
    with pytest.raises(ValueError):
        WorldDataModule(corpus_dir="x", test_multiview_dir="y", test_multiview=SynthCorpus(views=1))
