"""Training stages (paper §4): one LightningModule per stage plus shared flow-matching objectives.

``BidirectionalModule`` is imported lazily so that ``solarwm.stages.objectives`` (used by the backbone
adapters) never pulls in Lightning or creates an import cycle with ``solarwm.backbones``.
"""

from typing import Any

__all__ = ["BidirectionalModule"]


def __getattr__(name: str) -> Any:
    if name == "BidirectionalModule":
        from solarwm.stages.bidirectional import BidirectionalModule

        return BidirectionalModule
    raise AttributeError(f"module 'solarwm.stages' has no attribute {name!r}")
