"""`WorldDataModule`: a corpus of canonical clips or a recipe index → training windows.

Two sources of rows, one pipeline (`datamodules.clips`):

* corpus mode (``corpus_dir``): every canonical clip folder that did not fail a stage
  (and whose ``selection.tier`` is in ``tiers`` when given); a deterministic held-out
  subset by stable id (the ``num_val_clips`` clips with the smallest id hash; the clips of one
  ``provenance.scene``, the views of one world, held out together, so possibly a few more) is the
  validation split. A missing folder is rendered first with `synth_corpus` when
  ``synth`` is given, which is how the embedded default runs on a fresh checkout.
* recipe mode (``train_index`` [+ ``test_index``]): the rows of a recipe index
  (`solarwm.data.index.read_index`), each with its ``epoch_repeats`` and fixed
  ``start_frame``; ``test_index`` is the validation split.
* view mode (``latent_view`` [+ ``test_index``]): a latent-cache view of a recipe
  (`solarwm data latents`, `solarwm.datamodules.latents`): batches carry ``latents``,
  ``text_embeds`` and ``text_mask`` instead of ``video``, so the stage skips ``encode``.
  The view must have this datamodule's window geometry, and the model's route and codec
  (checked at setup and by the stage); ``test_index`` (raw, under ``release_root``) stays
  the validation split.

Corpus mode can also take a test set of its own (``test_corpus_dir`` [+ ``test_synth``]): every usable clip
of another corpus, typically worlds of a seed the model never saw, is then `solarwm test`'s split instead of
the held-out scenes of the training corpus (which stay the validation split).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import lightning.pytorch as pl
from lightning.pytorch.utilities import rank_zero_info
from torch.utils.data import DataLoader, Dataset, Subset

from solarwm.data.recipe import held_out_scenes
from solarwm.datamodules.clips import ClipWindowDataset, RepeatSampler, Row

#: Written into a corpus the data module renders: the ``SynthCorpus`` it was rendered from.
SYNTH_MARKER = "synth.json"


@dataclass
class SynthCorpus:
    """How to render the corpus when ``corpus_dir`` does not exist yet (`synth_corpus` arguments)."""

    clips: int = 8
    frames: int = 33
    width: int = 96
    height: int = 64
    fps: float = 8.0
    seed: int = 0
    bad_fraction: float = 0.0
    motion: str = "mixed"
    views: int = 1


class WorldDataModule(pl.LightningDataModule):
    """Windows of ``num_frames`` frames at ``width x height`` from a corpus or a recipe index.

    ``test_draws``: how many times `solarwm test` generates each held-out clip, from other noise each time;
    the test metrics pool over the draws (``test_dataloader``). ``test_seed``: the seed of that noise (test
    batch i draws from ``test_seed + i``; None: the stage's default, ``StageModule.test_seed``).
    ``test_multiview_dir`` [+ ``test_multiview``, views >= 2]: worlds each filmed by several cameras from one start
    pose; `solarwm test` then also generates every view from the shared first frame and reports how often the video
    is closest to its own camera's truth (``test/camera_top1``, second test loader, one world per batch).
    """

    def __init__(
        self,
        num_frames: int = 17,
        width: int = 64,
        height: int = 64,
        batch_size: int = 1,
        corpus_dir: str | None = None,
        tiers: list[str] | None = None,
        num_val_clips: int = 2,
        synth: SynthCorpus | None = None,
        train_index: str | None = None,
        test_index: str | None = None,
        release_root: str | None = None,
        latent_view: str | None = None,
        frame_stride: int = 1,
        seed: int = 0,
        shuffle: bool = True,
        num_workers: int = 0,
        test_draws: int = 1,
        test_seed: int | None = None,
        test_corpus_dir: str | None = None,
        test_synth: SynthCorpus | None = None,
        test_multiview_dir: str | None = None,
        test_multiview: SynthCorpus | None = None,
    ) -> None:
        super().__init__()
        if sum(x is not None for x in (corpus_dir, train_index, latent_view)) != 1:
            raise ValueError(
                "WorldDataModule: give exactly one of corpus_dir (corpus mode), train_index (recipe mode) "
                "or latent_view (view mode)"
            )
        if (train_index is not None or test_index is not None) and release_root is None:
            raise ValueError("WorldDataModule: recipe mode needs release_root (the folder the index's shards live in)")
        if min(num_frames, width, height, batch_size, frame_stride, test_draws) < 1:
            raise ValueError(
                "WorldDataModule: num_frames, width, height, batch_size, frame_stride, test_draws must be >= 1"
            )
        self.num_frames, self.width, self.height = num_frames, width, height
        self.batch_size, self.frame_stride, self.seed = batch_size, frame_stride, seed
        self.corpus_dir, self.tiers, self.num_val_clips, self.synth = corpus_dir, tiers, num_val_clips, synth
        self.train_index, self.test_index, self.release_root = train_index, test_index, release_root
        self.latent_view = latent_view
        self.view_meta: dict | None = None  # view.json of the latent view (view mode)
        self.shuffle, self.num_workers, self.test_draws = shuffle, num_workers, test_draws
        self.test_seed = test_seed
        if test_synth is not None and test_corpus_dir is None:
            raise ValueError("WorldDataModule: test_synth needs test_corpus_dir (where to render the test worlds)")
        if test_corpus_dir is not None and corpus_dir is None:
            raise ValueError(
                "WorldDataModule: test_corpus_dir is for corpus mode; recipe and view modes take test_index"
            )
        self.test_corpus_dir, self.test_synth = test_corpus_dir, test_synth
        if test_multiview is not None and test_multiview_dir is None:
            raise ValueError("WorldDataModule: test_multiview needs test_multiview_dir (where to render the worlds)")
        if test_multiview_dir is not None and (
            corpus_dir is None or test_multiview is None or test_multiview.views < 2
        ):
            raise ValueError(
                "WorldDataModule: test_multiview_dir needs corpus mode and a test_multiview with views >= 2"
            )
        self.test_multiview_dir, self.test_multiview = test_multiview_dir, test_multiview
        self.multiview_dataset: ClipWindowDataset | None = None
        self.test_dataset: ClipWindowDataset | None = None
        self.train_dataset: ClipWindowDataset | None = None
        self.val_dataset: ClipWindowDataset | None = None
        self.skipped: dict[str, str] = {}  # sample id or folder -> why it is not used

    # ---------------------------------------------------------------- rows
    def prepare_data(self) -> None:
        """Render the corpus (and the test corpus) if it does not exist yet (rank 0 only, as Lightning calls it)."""
        if self.corpus_dir is None:
            return
        self._render(self.corpus_dir, self.synth)
        if self.test_corpus_dir is not None:
            self._render(self.test_corpus_dir, self.test_synth)
        if self.test_multiview_dir is not None:
            self._render(self.test_multiview_dir, self.test_multiview)

    def _render(self, corpus_dir: str, synth: SynthCorpus | None) -> None:
        """Render ``corpus_dir`` from ``synth`` unless it exists (then check it was rendered from ``synth``)."""
        if Path(corpus_dir).exists():
            if synth is not None:
                self._check_rendered(Path(corpus_dir), synth)
            return
        if synth is None:
            raise FileNotFoundError(
                f"WorldDataModule: corpus_dir {corpus_dir} does not exist and no synth spec is given"
            )
        from solarwm.data.sources.synthetic import synth_corpus

        # Render next to the target and rename once complete, so an interrupted render is
        # resumed (synth_corpus writes clip by clip) rather than mistaken for a finished corpus.
        target = Path(corpus_dir)
        partial = target.with_name(target.name + ".partial")
        summary = synth_corpus(str(partial), **asdict(synth))
        (partial / SYNTH_MARKER).write_text(json.dumps(asdict(synth), sort_keys=True) + "\n")
        partial.rename(target)
        rank_zero_info(f"WorldDataModule: rendered corpus {corpus_dir}: {summary}")

    @staticmethod
    def _check_rendered(corpus: Path, synth: SynthCorpus) -> None:
        """Refuse a corpus this data module rendered from another ``synth`` spec (e.g. an older recipe's)."""
        marker = corpus / SYNTH_MARKER
        if not marker.is_file():
            return  # a corpus of the user's own (or from `solarwm data synth`): used as it is
        rendered, wanted = json.loads(marker.read_text()), asdict(synth)
        if rendered != wanted:
            changed = ", ".join(f"{k}: {rendered.get(k)!r} -> {v!r}" for k, v in wanted.items() if rendered.get(k) != v)
            raise FileExistsError(
                f"WorldDataModule: corpus_dir {corpus} was rendered from another synth spec ({changed}); "
                f"delete the folder (it is rendered again) or point corpus_dir elsewhere"
            )

    def _corpus_rows(self) -> tuple[list[Row], list[Row]]:
        """The training corpus's rows, split into (train, held-out) by scene."""
        rows, scene_of = self._usable_rows(self.corpus_dir)
        # Held-out split by stable id (the recipe split rule): independent of folder order and of which other
        # clips exist; the clips of one scene (the views of a multi-camera world) are held out together.
        val_ids = held_out_scenes(scene_of, self.num_val_clips)
        train = [r for r in rows if r.sample_id not in val_ids]
        val = [r for r in rows if r.sample_id in val_ids]
        return train, val

    def _usable_rows(self, corpus_dir: str) -> tuple[list[Row], dict[str, str]]:
        """Every usable clip of ``corpus_dir`` as a row (the others go to ``skipped``), and each row's scene."""
        from solarwm.data.accounting import outcome
        from solarwm.data.contract import ClipError, iter_clip_dirs, read_clip, read_meta

        span = (self.num_frames - 1) * self.frame_stride + 1
        rows, scene_of = [], {}
        for folder in iter_clip_dirs(corpus_dir):
            try:
                meta = read_meta(folder)
                read_clip(folder, load_video=False, validate=True)  # cheap camera/array checks
            except (ClipError, OSError, ValueError) as err:
                self.skipped[str(folder)] = f"invalid clip: {err}"
                continue
            sample_id = meta["clip_id"]
            status = outcome(meta)
            tier = (meta.get("selection") or {}).get("tier")
            n = int(meta["meta"]["num_frames"])
            if status == "failed":
                self.skipped[sample_id] = "failed a processing stage"
            elif self.tiers is not None and tier not in self.tiers:
                self.skipped[sample_id] = f"tier {tier!r} not in {self.tiers}"
            elif n < span:
                self.skipped[sample_id] = f"{n} frames < window span {span}"
            else:
                rows.append(Row(sample_id=sample_id, num_frames=n, folder=str(folder)))
                scene_of[sample_id] = meta.get("provenance", {}).get("scene") or sample_id
        return rows, scene_of

    def _index_rows(self, path: str, repeats: bool) -> list[Row]:
        from solarwm.data.index import read_index

        rows = []
        for r in read_index(path, self.release_root):
            # A window row (window_frames) loads as its window already, so it starts at 0.
            windowed = "window_frames" in r
            rows.append(
                Row(
                    sample_id=r["sample_id"],
                    num_frames=int(r["window_frames"] if windowed else r["num_frames"]),
                    epoch_repeats=int(r.get("epoch_repeats", 1)) if repeats else 1,
                    start_frame=0 if windowed else r.get("start_frame"),
                    index_row=r,
                )
            )
        return rows

    def setup(self, stage: str | None = None) -> None:
        """Read the rows once and build the train / held-out datasets."""
        if self.train_dataset is not None:
            return
        self._check_route_geometry()
        if self.corpus_dir is not None:
            self.prepare_data()  # no-op when it exists; covers use without a Trainer
            train, val = self._corpus_rows()
        elif self.latent_view is not None:
            train = self._view_rows()
            val = self._index_rows(self.test_index, repeats=False) if self.test_index else []
        else:
            train = self._index_rows(self.train_index, repeats=True)
            val = self._index_rows(self.test_index, repeats=False) if self.test_index else []
        if not train:
            raise ValueError(f"WorldDataModule: no usable training rows ({len(self.skipped)} skipped: {self.skipped})")
        if self.skipped:
            rank_zero_info(f"WorldDataModule: skipped {len(self.skipped)} clips: {self.skipped}")
        common = dict(
            num_frames=self.num_frames,
            width=self.width,
            height=self.height,
            frame_stride=self.frame_stride,
            seed=self.seed,
            release_root=self.release_root,
        )
        train_common = dict(common, release_root=self.latent_view) if self.latent_view is not None else common
        self.train_dataset = ClipWindowDataset(train, random_start=True, **train_common)
        self.val_dataset = ClipWindowDataset(val, random_start=False, **common)
        if self.test_corpus_dir is not None:
            test, _ = self._usable_rows(self.test_corpus_dir)
            if not test:
                raise ValueError(f"WorldDataModule: no usable test rows in {self.test_corpus_dir} ({self.skipped})")
            self.test_dataset = ClipWindowDataset(test, random_start=False, **common)
        if self.test_multiview_dir is not None:
            self.multiview_dataset = ClipWindowDataset(self._multiview_rows(), random_start=False, **common)

    def _multiview_rows(self) -> list[Row]:
        """The multi-view test worlds' rows, the views of each world consecutive (one test batch per world)."""
        rows, scene_of = self._usable_rows(self.test_multiview_dir)
        views = self.test_multiview.views
        by_scene: dict[str, list[Row]] = {}
        for row in sorted(rows, key=lambda r: r.sample_id):
            by_scene.setdefault(scene_of[row.sample_id], []).append(row)
        whole = [group for _, group in sorted(by_scene.items()) if len(group) == views]
        if not whole:
            raise ValueError(f"WorldDataModule: no world with all {views} views in {self.test_multiview_dir}")
        return [row for group in whole for row in group]

    def _view_rows(self) -> list[Row]:
        """The rows of the latent view, after checking its window geometry against this datamodule's."""
        from solarwm.datamodules.latents import LatentViewError, read_view

        self.view_meta, rows = read_view(self.latent_view)
        mine = {
            "num_frames": self.num_frames,
            "width": self.width,
            "height": self.height,
            "frame_stride": self.frame_stride,
        }
        theirs = {k: self.view_meta.get(k) for k in mine}
        if theirs != mine:
            raise LatentViewError(
                f"latent view {self.latent_view} has windows {theirs}; this datamodule asks for {mine}"
            )
        self._check_view_codec()
        return [
            Row(
                sample_id=r["sample_id"],
                num_frames=self.num_frames,
                epoch_repeats=int(r.get("epoch_repeats", 1)),
                start_frame=0,
                index_row=r,
            )
            for r in rows
        ]

    def _adapter(self):
        module = self.trainer.lightning_module if self.trainer is not None else None
        return getattr(module, "adapter", None)

    def _check_view_codec(self) -> None:
        """Refuse a view made for another route or codec than the trainer's model (before the first step)."""
        adapter = self._adapter()
        if adapter is not None and self.view_meta is not None:
            from solarwm.datamodules.latents import check_view_codec, view_tag

            tag = view_tag(self.view_meta["route"], self.view_meta["codec_hash"])
            check_view_codec(tag, adapter, where=f"latent view {self.latent_view}")

    def _check_route_geometry(self) -> None:
        """Fail early when the window does not fit the route's frame geometry (Wan: 4n+1)."""
        adapter = self._adapter()
        if adapter is not None and not adapter.valid_num_frames(self.num_frames):
            raise ValueError(f"WorldDataModule: num_frames={self.num_frames} is not valid for {type(adapter).__name__}")

    # ---------------------------------------------------------------- loaders
    def train_sampler(self, num_replicas: int | None = None, rank: int | None = None) -> RepeatSampler:
        """The rank-aware sampler of the training occurrences (the strategy's data-parallel ranks by default)."""
        # The strategy's data-parallel share: a sequence-parallel group's ranks read the same samples.
        share = getattr(self.trainer.strategy, "distributed_sampler_kwargs", None) if self.trainer is not None else None
        if num_replicas is None:
            num_replicas = (
                share["num_replicas"] if share else self.trainer.world_size if self.trainer is not None else 1
            )
        if rank is None:
            rank = share["rank"] if share else self.trainer.global_rank if self.trainer is not None else 0
        return RepeatSampler(len(self.train_dataset), num_replicas, rank, shuffle=self.shuffle, seed=self.seed)

    def train_dataloader(self) -> DataLoader:
        """Shuffled occurrences (``seed + epoch``), this rank's share."""
        return DataLoader(
            self.train_dataset,
            batch_size=self.batch_size,
            sampler=self.train_sampler(),
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
            drop_last=False,
        )

    def _in_order(self, dataset: Dataset) -> DataLoader:
        return DataLoader(dataset, batch_size=self.batch_size, shuffle=False, num_workers=self.num_workers)

    def val_dataloader(self) -> DataLoader:
        """The held-out windows in a fixed order."""
        return self._in_order(self.val_dataset)

    def test_dataloader(self) -> DataLoader:
        """The test split (``test_corpus_dir``'s clips, else the held-out split), ``test_draws`` times in one order.

        A stage seeds each test batch's rollout by its batch index, so every pass generates the clips from
        other noise and the test metrics pool over the draws: a mean over one draw of a few clips moves
        with the draw by more than many targets' margins.
        """
        dataset = self.test_dataset if self.test_dataset is not None else self.val_dataset
        loader = self._in_order(Subset(dataset, list(range(len(dataset))) * self.test_draws))
        if self.multiview_dataset is None:
            return loader
        # The second loader gives one world per batch (its views): `solarwm test`'s test/camera_top1.
        views = DataLoader(
            self.multiview_dataset, batch_size=self.test_multiview.views, shuffle=False, num_workers=self.num_workers
        )
        return [loader, views]
