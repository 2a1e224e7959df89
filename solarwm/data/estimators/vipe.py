"""VIPE (nv-tlabs/vipe, package ``vipe``): video pose engine (SLAM + intrinsics BA); a local checkpoint folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from solarwm.data.estimators import EstimatorUnavailable, PoseEstimate, register
from solarwm.data.estimators._local import not_wired, require_module


@register("vipe")
class VipeEstimator:
    """Checks the ``vipe`` package and a local checkpoint folder (VIPE loads its own sub-models from it)."""

    name, version = "vipe", "1"

    def __init__(self, weights: str | None = None, device: str = "cpu", **options: Any):
        require_module(self.name, "vipe", "VIPE from github.com/nv-tlabs/vipe")
        if not weights or not Path(weights).is_dir() or not any(Path(weights).iterdir()):
            raise EstimatorUnavailable(self.name, f"no local VIPE checkpoint folder ({weights!r})")
        self.weights, self.device = Path(weights), device

    def estimate(self, frames: np.ndarray, K: np.ndarray | None, fps: float) -> PoseEstimate:
        """Not wired: raises ``EstimatorUnavailable`` (never a made-up pose)."""
        raise not_wired(self.name)
