"""Lightning overhead per training step: Trainer.fit vs a bare PyTorch loop on the tiny Wan route.

Both run the same `BidirectionalModule.training_step` on the same in-memory batch with the same
optimizer (AdamW) and gradient clipping; the first ``--warmup`` steps are excluded. Prints the
steady-state seconds per step of each and their ratio (goal: Lightning / bare <= 1.1).

    python benchmarks/train_step.py [--steps 30] [--warmup 5] [--frames 17] [--size 64]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import warnings

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, Dataset

from solarwm.backbones.wan22_ti2v_5b import Wan22TI2V5BAdapter
from solarwm.stages.bidirectional import BidirectionalModule


class _SameBatch(Dataset):
    """``length`` references to one pre-built batch (no decode cost in either loop)."""

    def __init__(self, batch: dict, length: int) -> None:
        self.batch, self.length = batch, length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> dict:
        return self.batch


class _StepTimer(pl.Callback):
    """Wall time between consecutive train-batch ends: everything Lightning does per step."""

    def __init__(self) -> None:
        self.stamps: list[float] = []

    def on_train_batch_end(self, *args) -> None:
        self.stamps.append(time.perf_counter())


def make_module(seed: int) -> BidirectionalModule:
    """The tiny route with fixed weights."""
    torch.manual_seed(seed)
    return BidirectionalModule(Wan22TI2V5BAdapter(preset="tiny"), optimizer=lambda p: torch.optim.AdamW(p, lr=1e-4),
                               lr_scheduler=None)


def make_batch(frames: int, size: int, batch_size: int, height: int | None = None) -> dict:
    """A random batch in the datamodule's format, ``size`` (width) x ``height`` (default: square)."""
    g = torch.Generator().manual_seed(0)
    height = height or size
    c2w = torch.eye(4).repeat(batch_size, frames, 1, 1)
    c2w[..., 0, 3] = torch.linspace(0, 1, frames)
    K = torch.tensor([size * 0.8, size * 0.8, size / 2, height / 2]).repeat(batch_size, frames, 1)
    return {
        "video": torch.rand(batch_size, 3, frames, height, size, generator=g) * 2 - 1, "c2w": c2w, "K": K,
        "caption": ["a street"] * batch_size, "sample_id": [f"s{i}" for i in range(batch_size)],
    }


def lightning_steps(batch: dict, steps: int) -> list[float]:
    """Per-step seconds of Trainer.fit (batch_size=None loader: the batch is passed as is)."""
    timer = _StepTimer()
    trainer = pl.Trainer(accelerator="cpu", max_steps=steps, limit_train_batches=steps, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         num_sanity_val_steps=0, limit_val_batches=0, gradient_clip_val=1.0, callbacks=[timer])
    trainer.fit(make_module(0), train_dataloaders=DataLoader(_SameBatch(batch, steps), batch_size=None))
    return [b - a for a, b in zip(timer.stamps, timer.stamps[1:])]


def bare_steps(batch: dict, steps: int) -> list[float]:
    """Per-step seconds of the same step in plain PyTorch."""
    module = make_module(0)
    module.train()
    warnings.filterwarnings("ignore", message=".*self.log.*")
    optimizer = module.configure_optimizers()["optimizer"]
    params = module.adapter.trainable_parameters()
    stamps = [time.perf_counter()]
    for i in range(steps):
        loss = module.training_step(batch, i)  # the very step Lightning runs (its self.log is a no-op here)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        stamps.append(time.perf_counter())
    return [b - a for a, b in zip(stamps[1:], stamps[2:])]


def main() -> None:
    """Run both loops and print per-step medians and their ratio as JSON."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--frames", type=int, default=17)
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--batch_size", type=int, default=1)
    args = ap.parse_args()
    batch = make_batch(args.frames, args.size, args.batch_size)
    # Alternate the two twice and keep each one's best median: the machine may be shared.
    bare, light = float("inf"), float("inf")
    for _ in range(2):
        bare = min(bare, statistics.median(bare_steps(batch, args.steps)[args.warmup:]))
        light = min(light, statistics.median(lightning_steps(batch, args.steps)[args.warmup:]))
    print(json.dumps({
        "route": "wan22_ti2v_5b/tiny", "frames": args.frames, "size": args.size, "batch_size": args.batch_size,
        "threads": torch.get_num_threads(), "steady_steps": args.steps - args.warmup - 1,
        "bare_s_per_step": round(bare, 4), "lightning_s_per_step": round(light, 4),
        "ratio_lightning_over_bare": round(light / bare, 3), "goal": "<= 1.1",
    }))


if __name__ == "__main__":
    main()
