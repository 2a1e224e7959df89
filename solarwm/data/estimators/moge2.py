"""MoGe-2 (microsoft/MoGe, package ``moge``): metric depth and intrinsics per frame, weights ``model.pt``."""

from __future__ import annotations

from typing import Any

import numpy as np

from solarwm.data.estimators import PoseEstimate, register
from solarwm.data.estimators._local import load_state, not_wired, require_module, require_weights


@register("moge2")
class MoGe2Estimator:
    """Loads ``moge.model.v2.MoGeModel`` from a local checkpoint (``model_config`` + ``model``, weights_only)."""

    name, version = "moge2", "1"

    def __init__(self, weights: str | None = None, device: str = "cpu", **options: Any):
        module = require_module(self.name, "moge.model.v2", "MoGe from github.com/microsoft/MoGe")
        path = require_weights(self.name, weights, ("model.pt", "model.safetensors"))
        state = load_state(path)
        self.model = module.MoGeModel(**state["model_config"]).eval()
        self.model.load_state_dict(state["model"])
        self.model.to(device)

    def estimate(self, frames: np.ndarray, K: np.ndarray | None, fps: float) -> PoseEstimate:
        """Not wired: raises ``EstimatorUnavailable`` (never a made-up pose)."""
        raise not_wired(self.name)
