"""The pose-estimator registry: the protocol, the result, the errors, and ``register`` / ``get_estimator``.

Its own module so that the plug-ins (``colmap``, ``official``, ``depth``) import it without importing the
package that imports them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from solarwm.data.contract import POSE_UNITS  # noqa: F401  (re-exported: one definition, in the contract)


class EstimatorUnavailable(RuntimeError):
    """The named estimator cannot run here (missing package, weights or device); ``reason`` says which."""

    def __init__(self, name: str, reason: str):
        self.name, self.reason = name, reason
        super().__init__(f"estimator_unavailable: {name}: {reason}")


class EstimationError(RuntimeError):
    """The estimator ran but could not recover a trajectory for this clip (e.g. too few features)."""


@dataclass
class PoseEstimate:
    """Poses and intrinsics for every input frame.

    ``c2w`` float64 ``[F, 4, 4]`` in OpenCV axes; ``K`` float64 ``[F, 4]`` = (fx, fy, cx, cy) in pixels
    of the input frames; ``pose_units`` is ``"metric"`` or ``"relative"`` (translation known only up
    to one global scale).
    """

    c2w: np.ndarray
    K: np.ndarray
    pose_units: str
    estimator: str
    version: str
    diagnostics: dict[str, Any] = field(default_factory=dict)


class PoseEstimator(Protocol):
    """What every plug-in provides.

    A plug-in may also declare ``pose_units`` (``"metric"`` or ``"relative"``) as an attribute when
    its units are known before it runs; the metric bridge then refuses a relative one up front.
    """

    name: str
    version: str

    def estimate(self, frames: np.ndarray, K: np.ndarray | None, fps: float) -> PoseEstimate:
        """Estimate poses for ``frames`` uint8 ``[F, H, W, 3]``; ``K`` ``[F, 4]`` pixels when known, else estimated."""
        ...


ESTIMATORS: dict[str, Callable[..., PoseEstimator]] = {}


def register(name: str) -> Callable[[Callable[..., PoseEstimator]], Callable[..., PoseEstimator]]:
    """Class decorator adding a plug-in factory to ``ESTIMATORS`` under ``name``."""

    def wrap(factory: Callable[..., PoseEstimator]) -> Callable[..., PoseEstimator]:
        ESTIMATORS[name] = factory
        return factory

    return wrap


def get_estimator(name: str, weights: str | None = None, **options: Any) -> PoseEstimator:
    """Build the estimator ``name``; raises ``EstimatorUnavailable`` if it cannot run here."""
    if name not in ESTIMATORS:
        raise EstimatorUnavailable(name, f"unknown estimator; known: {', '.join(sorted(ESTIMATORS)) or 'none'}")
    return ESTIMATORS[name](weights=weights, **options)


def estimator_status() -> list[dict[str, Any]]:
    """Every registered estimator with ``available`` and, when it cannot run here, ``why``."""
    rows = []
    for name in sorted(ESTIMATORS):
        try:
            get_estimator(name)
            rows.append({"name": name, "available": True})
        except EstimatorUnavailable as e:
            rows.append({"name": name, "available": False, "why": e.reason})
        except Exception as e:  # e.g. a plug-in that needs its weights path to be built at all
            rows.append({"name": name, "available": False, "why": f"cannot be built without weights: {e}"})
    return rows
