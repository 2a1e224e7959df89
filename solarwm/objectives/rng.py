"""Random draws keyed per sample (``SampleRNG``), so a step is the same on 1 process as on N ranks."""

from __future__ import annotations

from typing import Sequence, Union

import torch

_MASK63 = (1 << 63) - 1


class SampleRNG:
    """Per-sample random streams: row ``i`` of every draw comes from its own generator, seeded by ``keys[i]``.

    Under data parallelism each rank holds a slice of the global batch. Seeding each sample by its logical
    index in the training stream (the batch's ``sample_index``) instead of drawing from a per-rank RNG makes
    every sample's noise and timesteps the same on 1 process as on N, whatever the split. ``salt`` separates
    independent uses (the run seed, a DMD role) of the same samples.
    """

    def __init__(
        self, keys: Sequence[int] | torch.Tensor, salt: int = 0, device: torch.device | str | None = None
    ) -> None:
        self.device = torch.device(device if device is not None else "cpu")
        keys = keys.tolist() if isinstance(keys, torch.Tensor) else list(keys)
        # splitmix64-style mixing: nearby keys and salts give unrelated seeds.
        self.generators = [
            torch.Generator(device=self.device).manual_seed(
                ((int(k) * 0x9E3779B97F4A7C15) ^ (int(salt) * 0xBF58476D1CE4E5B9 + 0x94D049BB133111EB)) & _MASK63
            )
            for k in keys
        ]

    def __len__(self) -> int:
        return len(self.generators)

    def _rows(self, shape: Sequence[int], draw) -> torch.Tensor:
        shape = tuple(int(n) for n in shape)
        if not shape or shape[0] != len(self.generators):
            raise ValueError(f"SampleRNG: draw shape {shape} must start with the batch size {len(self.generators)}")
        return torch.stack([draw(shape[1:], g) for g in self.generators])

    def randn(self, shape: Sequence[int], dtype: torch.dtype | None = None) -> torch.Tensor:
        """Standard normal ``[B, ...]``, row i from stream i."""
        return self._rows(shape, lambda s, g: torch.randn(s, generator=g, device=self.device, dtype=dtype))

    def rand(self, shape: Sequence[int], dtype: torch.dtype | None = None) -> torch.Tensor:
        """Uniform [0, 1) ``[B, ...]``, row i from stream i."""
        return self._rows(shape, lambda s, g: torch.rand(s, generator=g, device=self.device, dtype=dtype))

    def randint(self, high: int, shape: Sequence[int]) -> torch.Tensor:
        """Integers in [0, high) ``[B, ...]``, row i from stream i."""
        return self._rows(shape, lambda s, g: torch.randint(0, high, s, generator=g, device=self.device))


#: What the sampling helpers draw from: one generator for the batch, per-sample streams, or the global RNG.
RandomSource = Union[torch.Generator, SampleRNG, None]


def _draw(kind: str, shape: Sequence[int], generator: RandomSource, device, **kwargs) -> torch.Tensor:
    if isinstance(generator, SampleRNG):
        out = (
            generator.randint(kwargs["high"], shape) if kind == "randint" else getattr(generator, kind)(shape, **kwargs)
        )
    else:
        gen_device = generator.device if generator is not None else device
        if kind == "randint":
            out = torch.randint(0, kwargs["high"], tuple(shape), generator=generator, device=gen_device)
        else:
            out = getattr(torch, kind)(tuple(shape), generator=generator, device=gen_device, **kwargs)
    return out.to(device) if device is not None else out


def randn(
    shape: Sequence[int], generator: RandomSource = None, device=None, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """``torch.randn(shape)`` from ``generator`` (a ``SampleRNG``: row i from sample i's stream), on ``device``."""
    return _draw("randn", shape, generator, device, dtype=dtype)


def rand(
    shape: Sequence[int], generator: RandomSource = None, device=None, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """``torch.rand(shape)`` from ``generator`` (a ``SampleRNG``: row i from sample i's stream), on ``device``."""
    return _draw("rand", shape, generator, device, dtype=dtype)


def randint(high: int, shape: Sequence[int], generator: RandomSource = None, device=None) -> torch.Tensor:
    """``torch.randint(0, high, shape)`` from ``generator`` (a ``SampleRNG``: row i from sample i's stream)."""
    return _draw("randint", shape, generator, device, high=high)
