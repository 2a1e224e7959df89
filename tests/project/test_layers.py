"""The package's layer order, stated once and checked on every import (an AST walk, top-level and lazy alike).

A module may import its own unit and any unit of a lower layer; an import of a unit of the same or a higher
layer fails the test, naming the file, the line and both units. Inside a unit the modules import each other
without a cycle. A new subpackage must be given a layer here, and every unit named here must exist.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
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
    ("lightning_cli",),  # the recipe parser: LightningCLI with composition and interpolation
    ("loading",),  # a model, a first frame and a solver for inference (export, recipe + checkpoint)
    ("train_cli", "play", "envs", "convert"),  # peers on the loaders: fit/test/predict, the browser world, the Gym
    # environment, the import of official checkpoints
    ("cli",),  # the console entry point
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


def import_edges(name: str, path: Path) -> set[str]:
    """The modules of ``MODULES`` that ``name`` imports: ``from pkg import sub`` counts as ``pkg.sub`` when that is
    a module, and an import of a name inside a module counts as that module."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    found = set()
    for line, target in imports(name, path):
        nodes = [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.lineno == line]
        subs = [f"{target}.{a.name}" for n in nodes for a in n.names if f"{target}.{a.name}" in MODULES]
        if subs:
            found.update(subs)
            continue
        while target and target not in MODULES:
            target = target.rpartition(".")[0]
        if target:
            found.add(target)
    found.discard(name)
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles of ``graph`` (its strongly connected components of more than one module, Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while component[-1:] != [v]:
                component.append(stack.pop())
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_every_unit_has_a_layer():
    units = {unit_of(m) for m in MODULES} - {""}
    assert not units - set(RANK), (
        f"give these units a layer in tests/project/test_layers.py LAYERS: {sorted(units - set(RANK))}"
    )


def test_every_layer_names_a_unit_that_exists():
    units = {unit_of(m) for m in MODULES} - {""}
    assert not set(RANK) - units, f"LAYERS names units with no module: {sorted(set(RANK) - units)}"


@pytest.mark.slow
@pytest.mark.parametrize("unit", sorted({unit_of(m) for m in MODULES} - {""}))
def test_no_import_cycle_inside_a_unit(unit):
    graph = {m: {t for t in import_edges(m, p) if unit_of(t) == unit} for m, p in MODULES.items() if unit_of(m) == unit}
    found = cycles(graph)
    assert not found, f"import cycles inside {unit!r}: " + "; ".join(" <-> ".join(c) for c in found)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_private_name_is_imported_from_another_module(name):
    """A leading underscore means "this module's own": another module that needs it needs a public name."""
    tree = ast.parse(MODULES[name].read_text(encoding="utf-8"))
    bad = [
        f"{MODULES[name].relative_to(ROOT)}:{node.lineno} imports {a.name} from {node.module}"
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("solarwm")
        for a in node.names
        if a.name.startswith("_") and not a.name.startswith("__")
    ]
    assert not bad, "private names imported across modules:\n" + "\n".join(bad)


def test_the_cycle_check_finds_a_cycle_and_passes_a_chain():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


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
            bad.append(
                f"{MODULES[name].relative_to(ROOT)}:{line} imports {target} "
                f"({source!r}, layer {RANK[source]} -> {unit!r}, layer {RANK.get(unit, '?')})"
            )
    assert not bad, "imports against the layer order:\n" + "\n".join(bad)


def test_the_walk_sees_lazy_and_relative_imports(tmp_path):
    """The check reads imports inside functions and relative ones, so a lazy import cannot dodge it."""
    source = tmp_path / "mod.py"
    source.write_text("from .masks import x\n\ndef f():\n    from solarwm.rollout.engine import Rollout\n")
    found = dict((target, line) for line, target in imports("solarwm.kernels.mod", source))
    assert found == {"solarwm.kernels.masks": 1, "solarwm.rollout.engine": 4}
