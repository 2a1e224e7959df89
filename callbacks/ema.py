"""`EMA`: an exponential moving average of the trainable parameters.

The average is swapped into the module for validation and test (and, through `EMA.swapped`,
for eval videos and export), swapped back afterwards, and saved in the checkpoint
as the callback's state.

A stage may narrow what is averaged and when: ``pl_module.ema_parameters()`` (named
parameters; default: every trainable one) and ``pl_module.ema_step()`` (the update count
to fold in after this batch, or None when the batch updated nothing; default: the
trainer's global step). DMD averages only its student, on student updates. With
``start_step`` the average is (re)started from the weights at that update.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback


class EMA(Callback):
    """Keep ``ema = decay * ema + (1 - decay) * param`` every ``update_every`` optimizer steps."""

    def __init__(self, decay: float = 0.999, update_every: int = 1, start_step: int = 0) -> None:
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"EMA: decay must be in [0, 1), got {decay}")
        if update_every < 1 or start_step < 0:
            raise ValueError(f"EMA: update_every must be >= 1 and start_step >= 0, got {update_every}, {start_step}")
        self.decay, self.update_every, self.start_step = decay, update_every, start_step
        self.started = start_step == 0
        self.shadow: dict[str, torch.Tensor] = {}  # parameter name -> averaged value (fp32)
        self._backup: dict[str, torch.Tensor] | None = None  # training weights while swapped

    @staticmethod
    def _trainable(module: torch.nn.Module) -> Iterator[tuple[str, torch.nn.Parameter]]:
        if hasattr(module, "ema_parameters"):
            return iter(module.ema_parameters())
        return ((n, p) for n, p in module.named_parameters() if p.requires_grad)

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Start the average at the current weights (or keep the one restored from a checkpoint)."""
        for name, p in self._trainable(pl_module):
            if name in self.shadow:
                self.shadow[name] = self.shadow[name].to(p.device)
            else:
                self.shadow[name] = p.detach().float().clone()

    @torch.no_grad()
    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any) -> None:
        """Fold the new weights into the average on every ``update_every``-th update (see module docstring)."""
        step = pl_module.ema_step() if hasattr(pl_module, "ema_step") else trainer.global_step
        if step is None or step < self.start_step or step % self.update_every != 0:
            return
        if not self.started:  # the average begins at the weights of update `start_step`
            self.started = True
            for name, p in self._trainable(pl_module):
                self.shadow[name] = p.detach().float().clone()
            return
        # Each update stands for `update_every` steps of decay.
        decay = self.decay**self.update_every
        for name, p in self._trainable(pl_module):
            self.shadow[name].lerp_(p.detach().float(), 1.0 - decay)

    @torch.no_grad()
    def swap_in(self, pl_module: torch.nn.Module) -> None:
        """Replace the trainable weights by the average (keeping the training weights aside)."""
        if self._backup is not None or not self.shadow or not self.started:
            return  # nothing averaged yet: the live weights are the model
        self._backup = {}
        for name, p in self._trainable(pl_module):
            self._backup[name] = p.detach().clone()
            p.copy_(self.shadow[name].to(p.dtype))

    @torch.no_grad()
    def swap_out(self, pl_module: torch.nn.Module) -> None:
        """Restore the training weights after `swap_in`."""
        if self._backup is None:
            return
        for name, p in self._trainable(pl_module):
            p.copy_(self._backup[name])
        self._backup = None

    @contextmanager
    def swapped(self, pl_module: torch.nn.Module) -> Iterator[None]:
        """``with ema.swapped(module):`` runs the block on the averaged weights."""
        already = self._backup is not None
        self.swap_in(pl_module)
        try:
            yield
        finally:
            if not already:
                self.swap_out(pl_module)

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Validate the averaged weights."""
        self.swap_in(pl_module)

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Back to the training weights (before ModelCheckpoint, which Lightning runs last)."""
        self.swap_out(pl_module)

    def on_test_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Test the averaged weights, as validation, export and ``solarwm predict`` do.

        ``solarwm test --ckpt_path`` restores this callback's average from the checkpoint before the loop.
        """
        self.swap_in(pl_module)

    def on_test_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Back to the training weights."""
        self.swap_out(pl_module)

    def on_save_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict) -> None:
        """A checkpoint written while swapped still holds the training weights in ``state_dict``."""
        if self._backup is None:
            return
        for name, value in self._backup.items():
            if name in checkpoint["state_dict"]:
                checkpoint["state_dict"][name] = value.clone()

    def state_dict(self) -> dict[str, Any]:
        """The average, saved under the callback's key of the checkpoint."""
        return {"decay": self.decay, "update_every": self.update_every, "started": self.started,
                "shadow": {k: v.cpu() for k, v in self.shadow.items()}}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Resume the average from a checkpoint."""
        self.shadow = {k: v.clone() for k, v in state_dict["shadow"].items()}
        self.started = state_dict.get("started", True)


def find_ema(trainer: pl.Trainer) -> EMA | None:
    """The trainer's EMA callback, if any."""
    return next((c for c in trainer.callbacks if isinstance(c, EMA)), None)


@contextmanager
def maybe_ema(trainer: pl.Trainer | None, pl_module: torch.nn.Module) -> Iterator[None]:
    """Run the block on the EMA weights when the trainer has an EMA callback, else as is."""
    ema = find_ema(trainer) if trainer is not None else None
    if ema is None:
        yield
    else:
        with ema.swapped(pl_module):
            yield
