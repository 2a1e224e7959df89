"""The sliding-window KV cache of a causal rollout (an optional attention sink) and a block's window over it.

One ``KVCache`` serves every route. Per transformer layer it holds the **un-roped** keys and the
values of the last ``max_frames`` committed latent frames, ``[B, N, H, D]`` with ``N = frames *
tokens_per_frame`` (frame-major). Alongside, a rolling camera buffer holds the committed frames'
c2w ``[B, frames, 4, 4]`` (float64, so an hour-long track kilometres from the origin keeps its
precision) and pixel K ``[B, frames, 4]``, aligned with the K/V rows.

Keys are stored un-roped because RoPE is applied on every read with *window-local* temporal
positions (0..W-1, the query block at the tail): a rollout of any length never indexes past the
RoPE table, and the relative offsets match teacher-forced training.

A forward either reads only (a denoising step) or reads and *commits* (the clean block at sigma 0):
layers ``stage`` their new K/V while attending; ``commit`` then appends them, with the block's
cameras, and evicts the oldest frames beyond ``max_frames``. Memory is bounded by ``max_frames``
whatever the horizon.

``sink_frames`` (default 0) keeps the clip's first committed latent frames for good (the attention sink,
LongLive's ``sink_size``: the TI2V anchor, the one frame that is ground truth): they stay at the head of
the rows and only the frames after them roll, so the cache holds at most ``sink_frames + max_frames``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


class KVCacheError(RuntimeError):
    """The cache was used against its protocol (a layer staged twice, a commit with nothing staged)."""


class KVCache:
    """Per-layer un-roped K/V of the last ``max_frames`` latent frames plus their cameras."""

    def __init__(self, num_layers: int, max_frames: int, tokens_per_frame: int, sink_frames: int = 0) -> None:
        if num_layers < 1 or max_frames < 0 or tokens_per_frame < 1 or sink_frames < 0:
            raise ValueError(
                f"KVCache: need num_layers >= 1, max_frames >= 0, tokens_per_frame >= 1, sink_frames >= 0; "
                f"got {num_layers}, {max_frames}, {tokens_per_frame}, {sink_frames}"
            )
        self.num_layers, self.max_frames, self.tokens_per_frame = num_layers, max_frames, tokens_per_frame
        self.sink_frames = sink_frames
        self.keys: list[torch.Tensor | None] = [None] * num_layers
        self.values: list[torch.Tensor | None] = [None] * num_layers
        self.c2w: torch.Tensor | None = None  # [B, frames, 4, 4] float64
        self.K: torch.Tensor | None = None  # [B, frames, 4]
        self.committed_frames = 0  # latent frames committed since the start (grows; the cache does not)
        self._staged: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    @property
    def frames(self) -> int:
        """Latent frames currently held (at most ``sink_frames + max_frames``)."""
        return 0 if self.c2w is None else int(self.c2w.shape[1])

    @property
    def held_sink(self) -> int:
        """Leading held frames that are the sink (fewer than ``sink_frames`` until that many are committed)."""
        return min(self.sink_frames, self.committed_frames)

    @property
    def evicted(self) -> bool:
        """Whether any committed frame has left the cache (then the sink, if any, sits apart from the rest)."""
        return self.committed_frames > self.frames

    def layer(self, index: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Cached un-roped ``(keys, values)`` of layer ``index``, each ``[B, N, H, D]`` (None when empty)."""
        return self.keys[index], self.values[index]

    def stage(self, index: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Hold layer ``index``'s new un-roped K/V ``[B, n, H, D]`` until ``commit``."""
        if index in self._staged:
            raise KVCacheError(f"KVCache: layer {index} staged twice before a commit")
        self._staged[index] = (keys.detach(), values.detach())

    def commit(self, c2w: torch.Tensor, K: torch.Tensor) -> None:
        """Append the staged K/V of every layer and the block's cameras (c2w ``[B, f, 4, 4]``, K ``[B, f, 4]``)."""
        if len(self._staged) != self.num_layers:
            raise KVCacheError(
                f"KVCache: commit with {len(self._staged)} of {self.num_layers} layers staged "
                "(the commit forward must run every layer with commit=True)"
            )
        new_frames = c2w.shape[1]
        sink = min(self.sink_frames, self.committed_frames + new_frames)  # sink frames held after this commit
        keep = self.max_frames
        tpf = self.tokens_per_frame
        for index in range(self.num_layers):
            k_new, v_new = self._staged[index]
            if k_new.shape[1] != new_frames * self.tokens_per_frame:
                raise KVCacheError(
                    f"KVCache: layer {index} staged {k_new.shape[1]} tokens for {new_frames} frames "
                    f"of {self.tokens_per_frame} tokens"
                )
            self.keys[index] = self._roll(self.keys[index], k_new, keep * tpf, sink * tpf)
            self.values[index] = self._roll(self.values[index], v_new, keep * tpf, sink * tpf)
        self.c2w = self._roll(self.c2w, c2w.detach().to(torch.float64), keep, sink)
        self.K = self._roll(self.K, K.detach(), keep, sink)
        self.committed_frames += new_frames
        self._staged.clear()

    def discard_staged(self) -> None:
        """Drop staged K/V (a forward that failed half-way must not leave half a commit behind)."""
        self._staged.clear()

    @staticmethod
    def _roll(old: torch.Tensor | None, new: torch.Tensor, keep: int, sink: int = 0) -> torch.Tensor:
        """``cat(old, new)`` along dim 1: the first ``sink`` rows, then the last ``keep`` of the others (a fresh
        tensor, so memory stays flat)."""
        both = new if old is None else torch.cat([old, new], dim=1)
        rest = both[:, sink:]
        return torch.cat([both[:, :sink], rest[:, max(0, rest.shape[1] - keep) :]], dim=1).clone()

    def nbytes(self) -> int:
        """Bytes held by cached K/V and cameras (for the rollout's memory report)."""
        tensors = [t for t in self.keys + self.values + [self.c2w, self.K] if t is not None]
        return sum(t.numel() * t.element_size() for t in tensors)


@dataclass
class CacheWindow:
    """A cached block's window: the committed frames' cameras, then the query block's ``frames`` latent frames."""

    c2w: torch.Tensor  #: [B, W, 4, 4] float64
    K: torch.Tensor  #: [B, W, 4] pixels
    frames: int  #: latent frames of the query block (the window's tail)
    first_evicted: bool  #: the clip's first latent frame has left the window
    sink: int = 0  #: leading frames held apart as the attention sink (the frames after them were evicted)

    @property
    def width(self) -> int:
        """Latent frames in the window, the query block included."""
        return self.c2w.shape[1]

    @property
    def start(self) -> int:
        """Window index of the query block's first frame."""
        return self.width - self.frames

    def positions(self, frames_per_block: int) -> torch.Tensor:
        """Temporal positions ``[W]``: ``0..W-1``; with a sink apart, the sink at ``0..s-1`` and the rest from
        ``frames_per_block`` on, where teacher forcing over ``window_blocks + 1`` blocks puts them for its last
        block (block 0 just left the window, its first ``s`` frames kept)."""
        positions = torch.arange(self.width)
        if self.sink:
            positions[self.sink :] += frames_per_block - self.sink
        return positions
