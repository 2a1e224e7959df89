"""Training stages (paper §4): one LightningModule per stage plus shared flow-matching objectives.

``BidirectionalModule`` is imported lazily so that ``solarwm.stages.objectives`` (used by the backbone
adapters) never pulls in Lightning or creates an import cycle with ``solarwm.backbones``.
"""

from typing import Any

__all__ = ["BidirectionalModule", "TFAnyFlowModule", "DMDModule"]

_LAZY = {
    "BidirectionalModule": "solarwm.stages.bidirectional",
    "TFAnyFlowModule": "solarwm.stages.tf_anyflow",
    "DMDModule": "solarwm.stages.dmd",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'solarwm.stages' has no attribute {name!r}")
