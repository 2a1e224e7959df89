"""Clip windows for training: rows of a corpus or a recipe index → model-view batches.

A *row* is one physical clip (or one recipe window of it) with a repeat factor. An
epoch visits every row ``epoch_repeats`` times (its *virtual occurrences*, paper §5.4:
a recipe references a row repeatedly without copying it). Each occurrence is loaded
once (one video decode), cut to the route's window of ``num_frames`` frames, resized
and centre-cropped to ``width x height`` with the intrinsics updated to match, and
returned as one item of the adapter's batch (``BackboneAdapter``'s contract, docs/architecture.md;
``video`` in [-1, 1]).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset, DistributedSampler

from solarwm.camera.intrinsics import crop_intrinsics, resize_intrinsics
from solarwm.datamodules.view_rows import is_view_row, load_view_row


class WindowError(ValueError):
    """A row cannot yield the requested window (too short, start out of range, bad shapes)."""

    def __init__(self, sample_id: str, check: str, detail: str) -> None:
        self.sample_id, self.check, self.detail = sample_id, check, detail
        super().__init__(f"{sample_id}: {check}: {detail}")


@dataclass(frozen=True)
class Row:
    """One addressable clip of an epoch: where it lives and how often it is visited."""

    sample_id: str
    num_frames: int
    epoch_repeats: int = 1
    start_frame: int | None = None  # fixed window start (recipe rows); None = drawn per occurrence
    folder: str | None = None  # corpus mode: canonical clip folder
    index_row: dict | None = None  # recipe mode: the validated row of `solarwm.data.index`


def stable_hash(*parts: object) -> int:
    """A process-independent 64-bit hash of ``parts`` (Python's ``hash`` is salted per process)."""
    digest = hashlib.sha256("\x1f".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "little")


def cover_crop_geometry(src_w: int, src_h: int, width: int, height: int) -> tuple[int, int, int, int]:
    """``(new_w, new_h, left, top)``: the resize that covers ``width x height``, then the centre crop."""
    scale = max(width / src_w, height / src_h)
    new_w, new_h = max(width, round(src_w * scale)), max(height, round(src_h * scale))
    return new_w, new_h, (new_w - width) // 2, (new_h - height) // 2


def fit_intrinsics(K: np.ndarray, src_w: int, src_h: int, width: int, height: int) -> np.ndarray:
    """``K [N, 4]`` of ``src_w x src_h`` images → K of the same images after `resize_crop` to ``width x height``.

    Pixel centres sit at ``j + 0.5`` (`solarwm.camera.intrinsics`), the ``align_corners=False``
    grid, so resizing by ``s`` scales every continuous pixel coordinate, hence ``(fx, fy, cx, cy)``,
    by exactly ``s``; the per-axis factors are taken after rounding, so K follows the pixels produced.
    """
    new_w, new_h, left, top = cover_crop_geometry(src_w, src_h, width, height)
    K = resize_intrinsics(np.asarray(K, dtype=np.float64), new_w / src_w, new_h / src_h)
    return np.asarray(crop_intrinsics(K, left, top), dtype=np.float64)


def resize_crop(frames: torch.Tensor, K: np.ndarray, width: int, height: int) -> tuple[torch.Tensor, np.ndarray]:
    """Resize so the image covers ``width x height``, centre-crop, and carry K along.

    ``frames`` uint8 or float ``[N, 3, H, W]``; ``K`` ``[N, 4]`` pixels of the input.
    Returns float ``[N, 3, height, width]`` (input value range kept) and the matching ``K``.
    """
    _, _, h, w = frames.shape
    new_w, new_h, left, top = cover_crop_geometry(w, h, width, height)
    if (new_w, new_h) == (w, h):  # crop only: cut before converting, so only the kept pixels become floats
        x = frames[:, :, top : top + height, left : left + width].float()
    else:
        x = F.interpolate(frames.float(), size=(new_h, new_w), mode="bilinear", align_corners=False, antialias=True)
        x = x[:, :, top : top + height, left : left + width]
    return x, fit_intrinsics(K, w, h, width, height)


class ClipWindowDataset(Dataset):
    """Map-style dataset over the virtual occurrences of ``rows``.

    Keys are ints (occurrence index, epoch 0) or ``(occurrence, epoch)`` pairs as
    `RepeatSampler` yields them; the epoch only seeds the window start of rows
    without a fixed ``start_frame`` (corpus mode), so windows vary across epochs
    but are reproducible.
    """

    def __init__(
        self,
        rows: list[Row],
        num_frames: int,
        width: int,
        height: int,
        frame_stride: int = 1,
        random_start: bool = True,
        seed: int = 0,
        release_root: str | None = None,
    ) -> None:
        self.rows = rows
        self.num_frames, self.width, self.height = num_frames, width, height
        self.frame_stride, self.random_start, self.seed = frame_stride, random_start, seed
        self.release_root = release_root
        self._reader = None
        # occurrence -> row: row i appears epoch_repeats[i] times.
        self.occurrence_row = np.repeat(np.arange(len(rows)), [r.epoch_repeats for r in rows])

    def __len__(self) -> int:
        return len(self.occurrence_row)

    def _start(self, row: Row, occurrence: int, epoch: int) -> int:
        span = (self.num_frames - 1) * self.frame_stride + 1
        last = row.num_frames - span
        if last < 0:
            raise WindowError(row.sample_id, "window", f"{row.num_frames} frames < window span {span}")
        if row.start_frame is not None:
            if not 0 <= row.start_frame <= last:
                raise WindowError(
                    row.sample_id, "start_frame", f"start {row.start_frame} outside [0, {last}] for span {span}"
                )
            return row.start_frame
        if not self.random_start:
            return last // 2  # held-out windows: the centre, the same every time
        return stable_hash(self.seed, epoch, occurrence, row.sample_id) % (last + 1)

    def _load(self, row: Row) -> tuple[np.ndarray, np.ndarray, np.ndarray, str]:
        """Decode the whole clip once → (frames uint8 [N,H,W,3], c2w [N,4,4], K [N,4], caption)."""
        if row.folder is not None:
            from solarwm.data.contract import read_clip

            clip = read_clip(Path(row.folder), load_video=True)
            return clip.frames, clip.c2w, clip.K, clip.caption
        from solarwm.data.index import ShardReader, load_row

        if self._reader is None:  # one reader per dataset copy: cached member tables and open shards
            self._reader = ShardReader()
        item = load_row(row.index_row, self.release_root, self._reader)
        return item["frames"], item["c2w"], item["K"], item["caption"]

    def __getitem__(self, key: int | tuple[int, int]) -> dict[str, Any]:
        """One window: ``video`` [3,F,H,W] in [-1,1], ``c2w`` [F,4,4], ``K`` [F,4], caption, sample_id, sample_index.

        A latent-view row gives ``latents`` [C,f,h,w], ``text_embeds`` [L,D] and ``text_mask`` [L] instead of
        ``video`` (`solarwm.datamodules.view_rows.load_view_row`).

        ``sample_index`` = ``epoch * len(self) + occurrence``: the sample's logical index in the training
        stream. Stages seed each sample's noise and timesteps by it, so that a step draws the same
        randomness however the global batch is split over ranks (`solarwm.objectives.rng.SampleRNG`).
        """
        occurrence, epoch = (key, 0) if isinstance(key, (int, np.integer)) else key
        row = self.rows[int(self.occurrence_row[occurrence])]
        if is_view_row(row.index_row):  # a latent view: the window is already cut, resized and encoded
            if self._reader is None:
                from solarwm.data.index import ShardReader

                self._reader = ShardReader()
            item = load_view_row(row.index_row, self.release_root, self._reader)
            item["sample_index"] = int(epoch) * len(self) + int(occurrence)
            return item
        start = self._start(row, int(occurrence), int(epoch))
        frames, c2w, K, caption = self._load(row)
        idx = start + self.frame_stride * np.arange(self.num_frames)
        if idx[-1] >= len(frames):
            raise WindowError(row.sample_id, "window", f"frame {idx[-1]} >= {len(frames)} decoded frames")
        window = torch.from_numpy(np.ascontiguousarray(frames[idx])).permute(0, 3, 1, 2)  # [F,3,H,W]
        video, K_out = resize_crop(window, K[idx], self.width, self.height)
        # one copy into [3,F,H,W], then in place: the same values as (video / 127.5 - 1).clamp(-1, 1)
        video = video.permute(1, 0, 2, 3).contiguous().div_(127.5).sub_(1.0).clamp_(-1.0, 1.0)
        return {
            "video": video,
            "c2w": torch.as_tensor(c2w[idx], dtype=torch.float32),
            "K": torch.as_tensor(K_out, dtype=torch.float32),
            "caption": caption,
            "sample_id": row.sample_id,
            "sample_index": int(epoch) * len(self) + int(occurrence),
        }


class RepeatSampler(DistributedSampler):
    """Epoch order over virtual occurrences, shuffled by ``seed + epoch`` and split by rank.

    A `DistributedSampler` subclass so that Lightning keeps it as is under DDP (it
    only injects its own sampler when the loader's is not one) and calls
    ``set_epoch`` every epoch. Like `DistributedSampler`, the permutation is padded
    with its own head to a multiple of ``num_replicas`` (every rank steps equally
    often), then rank ``r`` takes positions ``r, r + R, r + 2R, ...``.
    """

    def __init__(
        self,
        num_occurrences: int,
        num_replicas: int = 1,
        rank: int = 0,
        shuffle: bool = True,
        seed: int = 0,
    ) -> None:
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank {rank} outside [0, {num_replicas})")
        # Deliberately not calling DistributedSampler.__init__: it wants a dataset and a
        # process group, and we know the size and the rank already.
        self.num_occurrences, self.num_replicas, self.rank = num_occurrences, num_replicas, rank
        self.shuffle, self.seed, self.epoch, self.drop_last = shuffle, seed, 0, False
        self.num_samples = math.ceil(num_occurrences / num_replicas)
        self.total_size = self.num_samples * num_replicas

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose order the next ``__iter__`` yields."""
        self.epoch = epoch

    def epoch_order(self) -> list[int]:
        """All occurrences of this epoch, padded to ``total_size``, before the rank split."""
        if self.shuffle:
            g = torch.Generator().manual_seed(self.seed + self.epoch)
            order = torch.randperm(self.num_occurrences, generator=g).tolist()
        else:
            order = list(range(self.num_occurrences))
        if order:
            order += (order * math.ceil(self.total_size / len(order)))[: self.total_size - len(order)]
        return order

    def __iter__(self) -> Iterator[tuple[int, int]]:
        for occurrence in self.epoch_order()[self.rank : self.total_size : self.num_replicas]:
            yield occurrence, self.epoch

    def __len__(self) -> int:
        return self.num_samples
