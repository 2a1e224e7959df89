"""Training callbacks: eval videos, EMA, adapter export, step checkpoints."""

from solarwm.callbacks.checkpoint import StepCheckpoint, crossed_multiple
from solarwm.callbacks.ema import EMA, find_ema, maybe_ema
from solarwm.callbacks.export import AdapterExport
from solarwm.callbacks.video_logger import EvalVideoLogger, gif_image_summary

__all__ = [
    "EMA",
    "AdapterExport",
    "EvalVideoLogger",
    "StepCheckpoint",
    "crossed_multiple",
    "find_ema",
    "gif_image_summary",
    "maybe_ema",
]
