"""How a test starts ``solarwm`` in a subprocess."""

from __future__ import annotations

import sys
from pathlib import Path


def solarwm_argv() -> list[str]:
    """The ``solarwm`` console script of this environment, else ``python -m solarwm.cli``.

    The console script never puts the working directory on ``sys.path``; ``python -m`` does, and from the
    repository root the top-level ``kernels/`` folder would then shadow Hugging Face's ``kernels`` package.
    """
    script = Path(sys.executable).with_name("solarwm")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "solarwm.cli"]
