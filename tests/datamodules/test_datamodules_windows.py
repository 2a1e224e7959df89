"""WorldDataModule / ClipWindowDataset / RepeatSampler: windows, resize + K, repeats, epochs, ranks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from solarwm.camera.intrinsics import project
from solarwm.camera.se3 import look_at
from solarwm.data.contract import Clip, clip_id, read_meta, update_meta, write_clip
from solarwm.data.sources.synthetic import synth_corpus
from solarwm.datamodules import (
    ClipWindowDataset,
    RepeatSampler,
    Row,
    WindowError,
    WorldDataModule,
    fit_intrinsics,
    resize_crop,
)
from solarwm.datamodules.world import SynthCorpus


def _blob(u: float, v: float, width: int, height: int, sigma: float = 3.0) -> np.ndarray:
    """A Gaussian dot centred at continuous pixel (u, v); pixel (i, j) has its centre at (j+.5, i+.5)."""
    jj, ii = np.meshgrid(np.arange(width) + 0.5, np.arange(height) + 0.5)
    return np.exp(-((jj - u) ** 2 + (ii - v) ** 2) / (2 * sigma**2))


def _centroid(image: np.ndarray) -> tuple[float, float]:
    h, w = image.shape
    jj, ii = np.meshgrid(np.arange(w) + 0.5, np.arange(h) + 0.5)
    weight = image / image.sum()
    return float((weight * jj).sum()), float((weight * ii).sum())


@pytest.mark.parametrize("src,dst", [((96, 64), (64, 64)), ((80, 60), (48, 32)), ((64, 64), (64, 64))])
def test_resize_crop_moves_K_with_the_image(src: tuple[int, int], dst: tuple[int, int]) -> None:
    """A world point's projection before and after resize/crop lands where the resized image shows it."""
    (w, h), (width, height) = src, dst
    c2w = look_at(np.array([0.0, -4.0, 1.5]), np.array([0.3, 0.0, 1.0]))
    K = np.array([[0.9 * w, 0.85 * w, 0.52 * w, 0.47 * h]])
    point = np.array([[0.2, 0.1, 1.2]])
    (u, v), = project(point, c2w, K[0])[0]
    image = _blob(u, v, w, h)
    frames = torch.from_numpy(np.repeat(image[None, None], 3, axis=1) * 255.0)  # [1,3,H,W]
    out, K_out = resize_crop(frames, K, width, height)
    assert out.shape == (1, 3, height, width)
    assert np.allclose(K_out, fit_intrinsics(K, w, h, width, height))
    (u2, v2), = project(point, c2w, K_out[0])[0]
    cu, cv = _centroid(out[0, 0].numpy())
    assert abs(cu - u2) < 0.15 and abs(cv - v2) < 0.15, (cu, cv, u2, v2)
    # Exactness of K: a uniform scale s and a centre crop are an affine map of pixel coordinates.
    s = max(width / w, height / h)
    left, top = (round(w * s) - width) // 2, (round(h * s) - height) // 2
    assert u2 == pytest.approx(u * round(w * s) / w - left, abs=1e-9)
    assert v2 == pytest.approx(v * round(h * s) / h - top, abs=1e-9)


def _write_corpus(root, n: int = 5, frames: int = 12, size=(48, 32), tiers=None) -> list[str]:
    """Tiny canonical clips: each frame's mean brightness encodes its frame index."""
    ids = []
    w, h = size
    for c in range(n):
        cid = clip_id("test", f"clip{c}", 0, frames)
        video = np.zeros((frames, h, w, 3), np.uint8)
        for f in range(frames):
            video[f] = 10 + 15 * f
        eye = np.array([0.0, -3.0, 1.0])
        c2w = np.stack([look_at(eye + [0.1 * f, 0.0, 0.0], eye + [0.1 * f, 1.0, 1.0]) for f in range(frames)])
        K = np.tile([40.0, 40.0, w / 2, h / 2], (frames, 1))
        clip = Clip(cid, video, c2w, K, f"caption {c}", {"fps": 8.0}, provenance={"owner": "test"})
        folder = write_clip(clip, root)
        if tiers is not None:
            update_meta(
                folder,
                lambda m, t=tiers[c]: m.update(selection={"policy": "p", "version": "1", "tier": t, "reasons": []}),
            )
        ids.append(cid)
    return ids


def test_corpus_windows_and_split(tmp_path) -> None:
    """Corpus mode: tiers and failed clips filtered, stable held-out split, windows aligned with cameras."""
    ids = _write_corpus(tmp_path / "corpus", n=6, tiers=["xhigh", "high", "rejected", "xhigh", "high", "xhigh"])
    failed = tmp_path / "corpus" / ids[5]
    update_meta(
        failed,
        lambda m: (
            m["provenance"]
            .setdefault("stages", {})
            .update(annotate={"status": "failed", "version": "1", "error": "boom"})
        ),
    )
    dm = WorldDataModule(
        num_frames=5,
        width=32,
        height=32,
        batch_size=2,
        corpus_dir=str(tmp_path / "corpus"),
        tiers=["xhigh", "high"],
        num_val_clips=1,
        seed=3,
    )
    dm.setup("fit")
    assert set(dm.skipped) == {ids[2], ids[5]}
    train_ids = {r.sample_id for r in dm.train_dataset.rows}
    val_ids = {r.sample_id for r in dm.val_dataset.rows}
    assert len(val_ids) == 1 and not (train_ids & val_ids) and train_ids | val_ids == {ids[0], ids[1], ids[3], ids[4]}
    # The split is by stable id: a second datamodule (other seed) holds out the same clip.
    dm2 = WorldDataModule(
        num_frames=5,
        width=32,
        height=32,
        corpus_dir=str(tmp_path / "corpus"),
        tiers=["xhigh", "high"],
        num_val_clips=1,
        seed=99,
    )
    dm2.setup("fit")
    assert {r.sample_id for r in dm2.val_dataset.rows} == val_ids

    item = dm.train_dataset[(0, 0)]
    assert item["video"].shape == (3, 5, 32, 32) and item["video"].dtype == torch.float32
    assert -1.0 <= item["video"].min() and item["video"].max() <= 1.0
    # Frame brightness tells which source frames the window holds: consecutive, aligned with c2w.
    level = ((item["video"].mean(dim=(0, 2, 3)) + 1) * 127.5).numpy()
    start = int(round((level[0] - 10) / 15))
    assert np.allclose(level, 10 + 15 * (start + np.arange(5)), atol=3)
    from solarwm.data.contract import read_clip

    src = read_clip(tmp_path / "corpus" / item["sample_id"], load_video=False)
    assert torch.allclose(item["c2w"], torch.as_tensor(src.c2w[start : start + 5], dtype=torch.float32))
    assert torch.allclose(
        item["K"], torch.as_tensor(fit_intrinsics(src.K[start : start + 5], 48, 32, 32, 32), dtype=torch.float32)
    )
    # Held-out windows are fixed (the centre); training windows are reproducible per (epoch, occurrence).
    assert torch.equal(dm.val_dataset[0]["video"], dm.val_dataset[0]["video"])
    assert torch.equal(dm.train_dataset[(1, 4)]["c2w"], dm.train_dataset[(1, 4)]["c2w"])

    batch = next(iter(dm.train_dataloader()))
    assert batch["video"].shape == (2, 3, 5, 32, 32) and batch["c2w"].shape == (2, 5, 4, 4)
    assert batch["K"].shape == (2, 5, 4) and len(batch["caption"]) == 2 and len(batch["sample_id"]) == 2


def test_window_errors_name_the_row() -> None:
    """A fixed start out of range or a clip shorter than the window is a named error."""
    ds = ClipWindowDataset(
        [Row("short", num_frames=4), Row("late", num_frames=20, start_frame=18)], num_frames=5, width=8, height=8
    )
    with pytest.raises(WindowError, match="short: window"):
        ds[0]
    with pytest.raises(WindowError, match="late: start_frame"):
        ds[1]


def test_repeat_accounting() -> None:
    """A row with epoch_repeats=3 appears three times per epoch, a row with 1 once."""
    rows = [Row("a", 9, epoch_repeats=3), Row("b", 9), Row("c", 9, epoch_repeats=2)]
    ds = ClipWindowDataset(rows, num_frames=5, width=8, height=8)
    sampler = RepeatSampler(len(ds), seed=1)
    seen = [rows[ds.occurrence_row[occ]].sample_id for occ, _ in sampler]
    assert sorted(seen) == ["a", "a", "a", "b", "c", "c"]


def test_epoch_determinism() -> None:
    """Same (seed, epoch) → same order; another epoch → another order; set_epoch selects it."""
    a, b = RepeatSampler(50, seed=7), RepeatSampler(50, seed=7)
    a.set_epoch(2), b.set_epoch(2)
    assert list(a) == list(b)
    first = [occ for occ, _ in a]
    a.set_epoch(3)
    second = [occ for occ, _ in a]
    assert first != second and sorted(first) == sorted(second) == list(range(50))
    assert all(epoch == 3 for _, epoch in a)


@pytest.mark.parametrize("total,world", [(24, 4), (23, 4), (5, 3), (2, 4)])
def test_rank_split_disjoint_and_complete(total: int, world: int) -> None:
    """Ranks partition the epoch's padded order: equal shares, complete, disjoint up to the padding."""
    shares = []
    for rank in range(world):
        s = RepeatSampler(total, num_replicas=world, rank=rank, seed=5)
        s.set_epoch(1)
        shares.append([occ for occ, _ in s])
    assert len({len(x) for x in shares}) == 1 and len(shares[0]) == len(RepeatSampler(total, world, 0))
    positions = RepeatSampler(total, world, 0, seed=5)
    positions.set_epoch(1)
    order = positions.epoch_order()
    # Interleaving the ranks' shares gives back the padded epoch order exactly.
    assert [shares[i % world][i // world] for i in range(len(order))] == order
    flat = [occ for share in shares for occ in share]
    assert set(flat) == set(range(total))
    assert len(flat) - len(set(flat)) == len(order) - total  # duplicates only from padding
    if total % world == 0:
        assert len(flat) == len(set(flat))


def test_lightning_keeps_the_rank_aware_sampler() -> None:
    """Lightning only injects its DistributedSampler when the loader's sampler is not one."""
    from torch.utils.data import DistributedSampler

    assert isinstance(RepeatSampler(10, 2, 1), DistributedSampler)


def test_an_existing_corpus_must_be_the_synth_specs(tmp_path) -> None:
    """A corpus the module rendered is reused only under the same spec; a stale one is named, not trained on."""
    from solarwm.datamodules import SynthCorpus

    spec = SynthCorpus(clips=2, frames=9, width=32, height=32, seed=3, motion="slow_pan")
    corpus = tmp_path / "corpus"
    dm = WorldDataModule(corpus_dir=str(corpus), synth=spec, num_frames=9, width=32, height=32, num_val_clips=1)
    dm.prepare_data()  # renders, and records the spec
    dm.prepare_data()  # the same spec: reused as is
    assert len([p for p in corpus.iterdir() if p.is_dir()]) == 2
    stale = WorldDataModule(
        corpus_dir=str(corpus),
        synth=SynthCorpus(clips=2, frames=9, width=32, height=32, seed=3, motion="pan"),
        num_frames=9,
        num_val_clips=1,
    )
    with pytest.raises(FileExistsError, match="rendered from another synth spec \\(motion: 'slow_pan' -> 'pan'\\)"):
        stale.prepare_data()
    # A corpus it did not render (the user's own, or `solarwm data synth`'s) is used as it is.
    (corpus / "synth.json").unlink()
    stale.prepare_data()


def test_views_of_one_world_are_held_out_together(tmp_path) -> None:
    """A multi-view corpus splits by world (provenance.scene): no held-out clip shares its world with training."""
    from solarwm.data.contract import read_meta
    from solarwm.data.sources.synthetic import synth_corpus

    corpus = tmp_path / "corpus"
    synth_corpus(corpus, clips=8, frames=5, width=32, height=32, fps=8.0, seed=6, motion="slow_pan", views=2)
    scene = {p.name: read_meta(p)["provenance"]["scene"] for p in corpus.iterdir() if p.is_dir()}
    assert len(set(scene.values())) == 4 and all(s.startswith("slow_pan-v2-scene-6-") for s in scene.values())
    for held_out in (1, 2, 3):
        dm = WorldDataModule(num_frames=5, width=32, height=32, corpus_dir=str(corpus), num_val_clips=held_out)
        dm.setup("fit")
        train = {scene[r.sample_id] for r in dm.train_dataset.rows}
        val = {scene[r.sample_id] for r in dm.val_dataset.rows}
        # Whole worlds, enough of them for the clips asked for, and none of them trained on.
        assert not (train & val) and len(train | val) == 4
        assert len(dm.val_dataset.rows) == 2 * len(val) == 2 * ((held_out + 1) // 2)


def test_a_test_corpus_of_unseen_worlds_is_the_test_split(tmp_path) -> None:
    """``test_corpus_dir`` (made from ``test_synth`` on first use): all its clips, ``test_draws`` times, in order."""
    synth_corpus(tmp_path / "corpus", clips=4, frames=5, width=32, height=32, fps=8.0, seed=6)
    spec = SynthCorpus(clips=3, frames=5, width=32, height=32, seed=9, motion="slow_pan")
    dm = WorldDataModule(
        num_frames=5,
        width=32,
        height=32,
        batch_size=2,
        corpus_dir=str(tmp_path / "corpus"),
        num_val_clips=1,
        test_draws=2,
        test_corpus_dir=str(tmp_path / "test"),
        test_synth=spec,
    )
    dm.prepare_data()
    dm.setup("test")
    tested = [sid for b in dm.test_dataloader() for sid in b["sample_id"]]
    rendered = sorted(read_meta(p)["clip_id"] for p in (tmp_path / "test").iterdir() if p.is_dir())
    assert sorted(tested[:3]) == rendered and tested == tested[:3] * 2
    assert len(dm.val_dataset.rows) == 1 and not set(tested) & {r.sample_id for r in dm.train_dataset.rows}
    # Another spec than the one the test corpus was rendered from is refused, as for the training corpus.
    other = WorldDataModule(
        num_frames=5,
        width=32,
        height=32,
        corpus_dir=str(tmp_path / "corpus"),
        test_corpus_dir=str(tmp_path / "test"),
        test_synth=SynthCorpus(clips=3, seed=10),
    )
    with pytest.raises(FileExistsError, match="seed: 9 -> 10"):
        other.prepare_data()
    with pytest.raises(ValueError, match="test_synth needs test_corpus_dir"):
        WorldDataModule(corpus_dir=str(tmp_path / "corpus"), test_synth=spec)


def test_test_draws_repeat_the_held_out_clips_in_order(tmp_path) -> None:
    """``test_draws`` passes the held-out windows that many times, in the same order; validation once."""
    _write_corpus(tmp_path / "corpus", n=6, tiers=["xhigh"] * 6)
    dm = WorldDataModule(
        num_frames=5,
        width=32,
        height=32,
        batch_size=2,
        corpus_dir=str(tmp_path / "corpus"),
        num_val_clips=3,
        test_draws=3,
    )
    dm.setup("test")
    once = [sid for b in dm.val_dataloader() for sid in b["sample_id"]]
    drawn = [sid for b in dm.test_dataloader() for sid in b["sample_id"]]
    assert len(once) == 3 and drawn == once * 3
    with pytest.raises(ValueError, match="test_draws"):
        WorldDataModule(corpus_dir=str(tmp_path / "corpus"), test_draws=0)
