"""The installed package imports on its own: every module, and only third-party packages pyproject declares.

CI runs in a fresh virtual environment (.ci/run), so an undeclared import fails the first test there. The
second catches it on any machine, even one that happens to have the package: it reads every module's imports
and checks that each third-party distribution they come from is a declared requirement (core or an extra).
"""

from __future__ import annotations

import ast
import importlib
import importlib.metadata as md
import pkgutil
import re
import sys
from pathlib import Path

import pytest

import solarwm

#: Optional accelerators imported inside a guard; each is declared in an extra (gpu, ray), not in the core.
GUARDED = {"flash_attn", "ray"}


def _modules() -> list[str]:
    return sorted(m.name for m in pkgutil.walk_packages(solarwm.__path__, "solarwm."))


def _sources() -> list[Path]:
    roots = {Path(p) for p in solarwm.__path__}
    for name in ("backbones", "datamodules", "callbacks", "kernels"):
        roots |= {Path(p) for p in importlib.import_module(f"solarwm.{name}").__path__}
    return sorted(f for root in roots for f in root.rglob("*.py"))


def _declared() -> set[str]:
    """Normalised names of every distribution solarwm requires, with every extra."""
    names = set()
    for req in md.requires("solarwm") or []:
        names.add(re.split(r"[\s<>=!~\[;(]", req, maxsplit=1)[0].lower().replace("_", "-"))
    return names


@pytest.mark.parametrize("module", _modules())
def test_every_module_imports(module: str) -> None:
    importlib.import_module(module)


def test_every_third_party_import_is_declared() -> None:
    """Each top-level import outside the standard library maps to a declared distribution."""
    dists = md.packages_distributions()
    declared = _declared()
    undeclared = {}
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                tops = [a.name.split(".")[0] for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                tops = [node.module.split(".")[0]]
            else:
                continue
            for top in tops:
                if top in sys.stdlib_module_names or top in ("solarwm", "__future__"):
                    continue
                providers = {d.lower().replace("_", "-") for d in dists.get(top, [])}
                if not providers & declared and top not in GUARDED:
                    undeclared.setdefault(top, str(path.name))
    assert not undeclared, f"imported but not declared in pyproject.toml (module: first file): {undeclared}"
    assert {"ray", "flash-attn"} <= declared  # the guarded ones are declared, as extras
