"""Pose estimators for video-only sources: one interface, plug-ins registered by name.

An estimator turns a clip's frames into camera-to-world poses and per-frame pixel intrinsics.
``colmap`` (pycolmap SfM on the CPU; metric with a depth model, ``estimators.depth``) runs here.
The official pipeline's plug-ins (Pi3X, MoGe-2, GeoCalib, VIPE; ``estimators.official``) are
listed with the reason they cannot run: building one raises ``EstimatorUnavailable`` before any
weights are read, and the ingestor records the clip as failed with the reason
``estimator_unavailable`` — a pose is never made up.
"""

from __future__ import annotations

# Plug-ins register themselves on import; importing them here makes every name known to
# ``get_estimator``. They import their heavy dependencies (pycolmap, torch) only when built.
from solarwm.data.estimators import colmap, official  # noqa: E402,F401
from solarwm.data.estimators.registry import (  # noqa: F401  (the registry's names, as the package has always had them)
    ESTIMATORS,
    POSE_UNITS,
    EstimationError,
    EstimatorUnavailable,
    PoseEstimate,
    PoseEstimator,
    estimator_status,
    get_estimator,
    register,
)
