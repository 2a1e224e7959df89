"""Datamodules: rows of a corpus or recipe index → route windows (the batch of the adapter contract)."""

from solarwm.datamodules.clips import ClipWindowDataset, RepeatSampler, Row, WindowError, fit_intrinsics, resize_crop
from solarwm.datamodules.world import SynthCorpus, WorldDataModule

__all__ = [
    "ClipWindowDataset",
    "RepeatSampler",
    "Row",
    "SynthCorpus",
    "WindowError",
    "WorldDataModule",
    "fit_intrinsics",
    "resize_crop",
]
