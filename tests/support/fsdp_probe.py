"""`FSDPProbe`: a callback the FSDP smoke test loads by class path into each rank of a real `solarwm fit`.

Each rank writes ``rank<R>.json`` (its training losses, and per transformer parameter the local shard's and the
full tensor's element counts) and ``rank<R>-{before,after}.safetensors`` (the full, all-gathered trainable
parameters at the start and end of fit), so the test can check sharding, change and agreement across ranks.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from safetensors.torch import save_file
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor


class FSDPProbe(pl.Callback):
    """Record what each rank holds and computes (see the module docstring)."""

    def __init__(self, out_dir: str) -> None:
        self.out = Path(out_dir)
        self.losses: list[float] = []

    @staticmethod
    def _gathered(pl_module: pl.LightningModule) -> dict[str, torch.Tensor]:
        # full_tensor() is a collective: every rank calls it for every parameter, in the same order.
        return {name: (p.full_tensor() if isinstance(p, DTensor) else p).detach().float().clone().contiguous()
                for name, p in pl_module.adapter.transformer.named_parameters() if p.requires_grad}

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        save_file(self._gathered(pl_module), str(self.out / f"rank{trainer.global_rank}-before.safetensors"))

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, *args: Any) -> None:
        self.losses.append(float(outputs["loss"].detach().float()))

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        rank = trainer.global_rank
        save_file(self._gathered(pl_module), str(self.out / f"rank{rank}-after.safetensors"))
        params = pl_module.adapter.transformer.named_parameters()
        shards = {name: [p.to_local().numel() if isinstance(p, DTensor) else p.numel(), p.numel(),
                         type(p).__name__, str(p.dtype)] for name, p in params}
        units = [type(m).__name__ for m in pl_module.adapter.transformer.modules() if isinstance(m, FSDPModule)]
        policy = trainer.strategy.mixed_precision_policy()
        doc = {"losses": self.losses, "shards": shards, "units": units,
               "param_dtype": str(policy.param_dtype), "reduce_dtype": str(policy.reduce_dtype)}
        (self.out / f"rank{rank}.json").write_text(json.dumps(doc))
