"""Shared checks of the weight-backed plug-ins: importable model code, a local weights file, safe loading."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from solarwm.data.estimators import EstimatorUnavailable


def require_module(estimator: str, module: str, install: str) -> Any:
    """Import ``module`` or raise ``EstimatorUnavailable`` naming the package to install."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise EstimatorUnavailable(estimator, f"package not importable: {module} ({e}); install {install}") from None


def require_weights(estimator: str, weights: str | None, names: tuple[str, ...]) -> Path:
    """The weights file: ``weights`` itself, or the first of ``names`` inside the folder ``weights``."""
    if not weights:
        raise EstimatorUnavailable(estimator, f"no weights path given (expected a local {' or '.join(names)})")
    path = Path(weights)
    if path.is_dir():
        found = [path / n for n in names if (path / n).is_file()]
        if not found:
            raise EstimatorUnavailable(estimator, f"weights folder {path} has none of {list(names)}")
        path = found[0]
    if not path.is_file():
        raise EstimatorUnavailable(estimator, f"weights file not found: {path}")
    return path


def load_state(path: Path) -> dict[str, Any]:
    """A state dict from ``.safetensors`` or, with ``weights_only=True``, from a torch checkpoint."""
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(path))
    import torch

    return torch.load(str(path), map_location="cpu", weights_only=True)


def not_wired(estimator: str) -> EstimatorUnavailable:
    """Raised by ``estimate`` of a plug-in whose inference is not wired up in this release."""
    return EstimatorUnavailable(estimator, "weights load, but this release does not run its inference yet")
