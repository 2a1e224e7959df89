"""Training stages (paper §4): one LightningModule per stage; their loss math is ``solarwm.objectives``."""

from solarwm.stages.bidirectional import BidirectionalModule
from solarwm.stages.dmd import DMDModule
from solarwm.stages.tf_anyflow import TFAnyFlowModule

__all__ = ["BidirectionalModule", "TFAnyFlowModule", "DMDModule"]
