"""GeoCalib (cvg/GeoCalib, package ``geocalib``): single-image intrinsics and gravity, weights ``geocalib-pinhole.tar``."""

from __future__ import annotations

from typing import Any

import numpy as np

from solarwm.data.estimators import PoseEstimate, register
from solarwm.data.estimators._local import load_state, not_wired, require_module, require_weights


@register("geocalib")
class GeoCalibEstimator:
    """Loads ``geocalib.GeoCalib`` and its local checkpoint (torch.load weights_only)."""

    name, version = "geocalib", "1"

    def __init__(self, weights: str | None = None, device: str = "cpu", **options: Any):
        module = require_module(self.name, "geocalib", "GeoCalib from github.com/cvg/GeoCalib")
        path = require_weights(self.name, weights, ("geocalib-pinhole.tar",))
        self.model = module.GeoCalib().eval()
        state = load_state(path)
        self.model.load_state_dict(state.get("model", state), strict=False)
        self.model.to(device)

    def estimate(self, frames: np.ndarray, K: np.ndarray | None, fps: float) -> PoseEstimate:
        """Not wired: raises ``EstimatorUnavailable`` (never a made-up pose)."""
        raise not_wired(self.name)
