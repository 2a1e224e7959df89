"""Pi3X (yyfz/Pi3, package ``pi3``): feed-forward camera poses for a frame set, weights ``model.safetensors``."""

from __future__ import annotations

from typing import Any

import numpy as np

from solarwm.data.estimators import PoseEstimate, register
from solarwm.data.estimators._local import load_state, not_wired, require_module, require_weights


@register("pi3x")
class Pi3XEstimator:
    """Loads ``pi3.models.pi3x.Pi3X`` from a local safetensors file."""

    name, version = "pi3x", "1"

    def __init__(self, weights: str | None = None, device: str = "cpu", **options: Any):
        module = require_module(self.name, "pi3.models.pi3x", "Pi3 from github.com/yyfz/Pi3")
        path = require_weights(self.name, weights, ("model.safetensors",))
        self.model = module.Pi3X().eval()
        self.model.load_state_dict(load_state(path))
        self.model.to(device)

    def estimate(self, frames: np.ndarray, K: np.ndarray | None, fps: float) -> PoseEstimate:
        """Not wired: raises ``EstimatorUnavailable`` (never a made-up pose)."""
        raise not_wired(self.name)
