"""The official pipeline's estimators (Pi3X, MoGe-2, GeoCalib, VIPE): listed, never half-run.

The official default-mode pose path is Pi3X structure + MoGe-2 metric depth → VIPE SLAM with
per-frame intrinsics bundle adjustment initialised by GeoCalib (paper §5.2). Their inference is
not wired into this release, so each name is registered only to say *why* it cannot run here:
building one raises ``EstimatorUnavailable`` before any weights are read (the package first,
when it is missing; otherwise that the inference is not wired). ``solarwm data ingest --list``
prints these reasons; the runnable path is ``colmap`` (+ a depth model for metric scale).
"""

from __future__ import annotations

import importlib.util
from typing import Any

from solarwm.data.estimators.registry import EstimatorUnavailable, register

# name -> (python module, where it comes from, what it needs)
OFFICIAL = {
    "pi3x": ("pi3", "github.com/yyfz/Pi3", "a CUDA GPU for 81-960-frame clips"),
    "moge2": ("moge", "github.com/microsoft/MoGe", "a CUDA GPU at the official resolution"),
    "geocalib": ("geocalib", "github.com/cvg/GeoCalib", "no GPU, but it only initialises VIPE's intrinsics"),
    "vipe": ("vipe", "github.com/nv-tlabs/vipe", "a CUDA GPU for its SLAM kernels"),
}


def why_unavailable(name: str) -> str:
    """The one-line reason the official estimator ``name`` cannot run in this release."""
    module, home, needs = OFFICIAL[name]
    if importlib.util.find_spec(module) is None:
        return f"package not importable: {module} (install from {home}; needs {needs})"
    return f"package {module} imports, but this release does not wire its inference (needs {needs}); use colmap"


def _factory(name: str) -> Any:
    def build(weights: str | None = None, **options: Any) -> Any:
        raise EstimatorUnavailable(name, why_unavailable(name))

    build.__doc__ = f"Refuses up front: {name} is listed, not runnable (see ``why_unavailable``)."
    return build


for _name in OFFICIAL:
    register(_name)(_factory(_name))
