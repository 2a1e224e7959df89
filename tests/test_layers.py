"""The package's layer order, stated once and checked on every import (an AST walk, top-level and lazy alike).

A module may import its own unit and any unit of a lower layer; an import of a unit of the same or a higher
layer fails the test, naming the file, the line and both units. A new subpackage must be given a layer here.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: Source folder of each installed package (pyproject's ``package-dir``).
PACKAGE_DIRS = {"solarwm": "solarwm", "solarwm.backbones": "backbones", "solarwm.datamodules": "datamodules",
                "solarwm.callbacks": "callbacks", "solarwm.kernels": "kernels"}
#: Bottom to top. Units in one layer are peers and must not import each other.
LAYERS: list[tuple[str, ...]] = [
    ("util",),  # parse_size, the atomic write: below everything, imports nothing of solarwm
    ("camera",),  # SE(3), conventions, intrinsics, trajectories
    ("kernels", "objectives"),  # attention, PRoPE, masks, the KV cache; pure loss math and SampleRNG
    ("data", "backbones"),  # the data engine (physical corpus, logical recipe); the route adapters
    ("metrics", "datamodules", "strategies"),  # scoring; the model view (windows, latent views); FSDP per route
    ("rollout",),  # the causal rollout engine over an adapter
    ("stages",),  # the LightningModules
    ("callbacks",),  # what watches stages
    ("train_cli",),  # LightningCLI and predict (their model and first-frame loaders)
    ("play",),  # the browser world, loading models as predict does
    ("envs", "serve"),  # the world as a Gymnasium environment, on play's loaders
    ("cli", "__main__"),  # the console entry point
]
RANK = {unit: rank for rank, units in enumerate(LAYERS) for unit in units}


def unit_of(module: str) -> str:
    """The layering unit of a dotted ``solarwm`` module name: its first component below ``solarwm``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def modules() -> dict[str, Path]:
    """Every source module of the installed packages, by dotted name."""
    found = {}
    for package, folder in PACKAGE_DIRS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT / folder).with_suffix("").parts
            found[".".join([package, *(p for p in rel if p != "__init__")])] = path
    return found


def imports(name: str, path: Path) -> list[tuple[int, str]]:
    """``(line, imported module)`` of every absolute or relative import of a solarwm module in ``path``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "solarwm"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] == "solarwm":
                out.append((node.lineno, target))
    return out


MODULES = modules()


def test_every_unit_has_a_layer():
    units = {unit_of(m) for m in MODULES} - {""}
    assert not units - set(RANK), f"give these units a layer in tests/test_layers.py LAYERS: {sorted(units - set(RANK))}"


def test_the_package_root_imports_nothing_of_its_own():
    """``import solarwm`` stays light: the root module may not pull in any unit."""
    assert not imports("solarwm", MODULES["solarwm"])


@pytest.mark.parametrize("name", sorted(set(MODULES) - {"solarwm"}))
def test_no_upward_or_sideways_import(name):
    source = unit_of(name)
    if source not in RANK:
        pytest.skip(f"{name}: unit {source!r} has no layer (test_every_unit_has_a_layer fails)")
    bad = []
    for line, target in imports(name, MODULES[name]):
        unit = unit_of(target)
        if unit in ("", source):
            continue
        if unit not in RANK or RANK[unit] >= RANK[source]:
            bad.append(f"{MODULES[name].relative_to(ROOT)}:{line} imports {target} "
                       f"({source!r}, layer {RANK[source]} -> {unit!r}, layer {RANK.get(unit, '?')})")
    assert not bad, "imports against the layer order:\n" + "\n".join(bad)


def test_the_walk_sees_lazy_and_relative_imports(tmp_path):
    """The check reads imports inside functions and relative ones, so a lazy import cannot dodge it."""
    source = tmp_path / "mod.py"
    source.write_text("from .masks import x\n\ndef f():\n    from solarwm.rollout.engine import Rollout\n")
    found = dict((target, line) for line, target in imports("solarwm.kernels.mod", source))
    assert found == {"solarwm.kernels.masks": 1, "solarwm.rollout.engine": 4}
