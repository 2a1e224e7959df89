"""`StepCheckpoint`: Lightning's ModelCheckpoint whose ``every_n_train_steps`` cannot be jumped over.

``trainer.global_step`` counts optimizer steps. Under manual optimisation with several optimisers it
grows by more than one per batch: DMD makes a critic step every batch and a student step every N-th
(`solarwm.stages.dmd`), so with ``student_update_every: 5`` the count goes ..., 6m - 1, 6m + 1, ... and
``global_step % n == 0`` never holds for an ``n`` that divides by 6. Lightning's ModelCheckpoint tests
exactly that, so ``recipes/tiny_dmd.yaml`` (``every_n_train_steps: 60``) wrote no periodic checkpoint
at all, and a published DMD run (500) skipped every third one. Here a batch saves when its optimizer
steps reach or cross a multiple of ``n`` (`crossed_multiple`); with one optimizer step per batch that is
exactly Lightning's rule.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import ModelCheckpoint


def crossed_multiple(before: int, after: int, every: int) -> bool:
    """Whether a multiple of ``every`` lies in ``(before, after]``: the step count went from ``before`` to ``after``."""
    return every >= 1 and after // every > before // every


class StepCheckpoint(ModelCheckpoint):
    """``ModelCheckpoint`` (same arguments) that saves on every batch whose optimizer steps cross a multiple of
    ``every_n_train_steps``, also when the count jumps over it (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._steps_before_batch = 0

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        """Remember the optimizer step count before this batch's updates."""
        self._steps_before_batch = trainer.global_step

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        """Save when this batch crossed a multiple of ``every_n_train_steps``; automatic optimisation as Lightning."""
        if pl_module.automatic_optimization:  # one optimizer step per batch: Lightning's own rule is the same
            return super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        if not crossed_multiple(self._steps_before_batch, trainer.global_step, self._every_n_train_steps):
            return
        if self._should_skip_saving_checkpoint(trainer):
            return
        candidates = self._monitor_candidates(trainer)
        if self.monitor is not None and self.monitor not in candidates:
            self._defer_save_until_validation = True  # as Lightning: save once validation has logged it
            return
        self._save_topk_checkpoint(trainer, candidates)
        self._save_last_checkpoint(trainer, candidates)
