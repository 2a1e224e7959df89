"""`AdapterExport`: write the trained adapter at the end of fit (diffusers form + camera safetensors)."""

from __future__ import annotations

from pathlib import Path

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info

from solarwm.callbacks.ema import maybe_ema


class AdapterExport(Callback):
    """At fit end, ``pl_module.adapter.save_adapter(dirpath)`` (the EMA weights when ``use_ema`` and an EMA runs)."""

    def __init__(self, dirpath: str | None = None, use_ema: bool = True) -> None:
        self.dirpath, self.use_ema = dirpath, use_ema
        self.exported: Path | None = None

    def resolve_dirpath(self, trainer: pl.Trainer) -> Path:
        """``dirpath`` as given, else ``<log_dir>/adapter``."""
        if self.dirpath is not None:
            return Path(self.dirpath)
        return Path(trainer.log_dir or trainer.default_root_dir) / "adapter"

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Export once, from global rank 0 (the weights are identical on every rank under DDP)."""
        adapter = getattr(pl_module, "adapter", None)
        if adapter is None:
            raise AttributeError(f"AdapterExport: {type(pl_module).__name__} has no `adapter` to export")
        if not trainer.is_global_zero:
            return
        target = self.resolve_dirpath(trainer)
        stage = getattr(pl_module, "stage_name", None) or None
        if self.use_ema:
            with maybe_ema(trainer, pl_module):
                self.exported = adapter.save_adapter(target, stage=stage)
        else:
            self.exported = adapter.save_adapter(target, stage=stage)
        rank_zero_info(f"AdapterExport: wrote {self.exported}")
