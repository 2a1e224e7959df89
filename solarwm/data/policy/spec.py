"""Selection policies (paper §5.5, Table 3): the column vocabulary, the gate vocabulary and the YAML loader.

A policy YAML names a policy, its version and, per dataset owner, a ``kept`` and an ``xhigh``
list of gates. Each YAML gate expands into one or more atomic :class:`Check` objects; the
engine (:mod:`solarwm.data.policy.engine`) evaluates checks, never YAML.

Everything about the file is validated before a single clip is touched: unknown keys, unknown
owners, gates on columns outside :data:`COLUMNS`, a gate on a column of the wrong kind,
malformed intervals, and a missing name or version all raise :class:`PolicyError`.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from solarwm.data.annotate import registry
from solarwm.data.annotate.stages import STAGES
from solarwm.data.kinds import BOOL, NUMBER, STR_LIST, TEXT  # a value of the wrong kind fails its gate

# The flat columns a policy may gate on, with their kinds. `selection` reads them from each
# clip's meta.json (see solarwm.data.policy.table.flatten_meta) or from a metrics parquet.
# Columns of the clip itself and of its lineage; every other column is a key an annotation stage
# declares (solarwm.data.annotate.stages.STAGES), with the kind declared there; COLUMNS follows the
# registry, so a stage registered later (a plug-in module, a test) adds its keys.
CLIP_COLUMNS: dict[str, str] = {
    "num_frames": NUMBER,  # N
    "width": NUMBER,
    "height": NUMBER,
    "caption": TEXT,  # A: non-empty after stripping (ingested, or written by the vlm stage)
    "lineage.source_tier": TEXT,  # clean owners: tier of the kept source clip
    "lineage.geometry_ok": BOOL,  # G
    "lineage.source_width": NUMBER,
    "lineage.source_height": NUMBER,
}


def _columns() -> dict[str, str]:
    """CLIP_COLUMNS plus every stage's declared keys; a key declared twice must keep one kind."""
    columns = dict(CLIP_COLUMNS)
    for stage in STAGES.values():
        for key, kind in stage.keys.items():
            if columns.setdefault(key, kind) != kind:
                raise TypeError(f"stage {stage.name!r} declares {key!r} as {kind}, elsewhere {columns[key]}")
    return columns


class _Columns(Mapping[str, str]):
    """The column vocabulary ``{column: kind}``, rebuilt whenever a stage is registered or unregistered."""

    def __init__(self) -> None:
        self._generation, self._columns = -1, {}

    def _current(self) -> dict[str, str]:
        if self._generation != registry.generation():
            self._columns, self._generation = _columns(), registry.generation()
        return self._columns

    def __getitem__(self, name: str) -> str:
        return self._current()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._current())

    def __len__(self) -> int:
        return len(self._current())

    def __repr__(self) -> str:
        return f"COLUMNS({self._current()!r})"


# camera.pose_units is not part of C120/C125 (Table 3 does not name it): relative poses have no
# camera.scale_cov, which the camera gates need; see table.pose_unit_errors.
COLUMNS: Mapping[str, str] = _Columns()

# Dataset owners of Table 3, plus the procedurally rendered worlds.
OWNERS: tuple[str, ...] = (
    "abot", "dl3dv_10s", "dl3dv_60s", "mind", "miradata", "miradata_clean", "multicamvideo",
    "omniworld", "realcam", "sekai_game", "sekai_walking", "sekai_walking_clean", "spatialvid",
    "spatialvid_clean", "synthetic",
)

TIERS: tuple[str, ...] = ("xhigh", "high", "rejected")

# C120 / C125: camera integrity with the given upper field-of-view bound (paper §5.5).
CAMERA_GATES: dict[str, float] = {"C120": 120.0, "C125": 125.0}

# Which atomic check kinds may read which column kinds.
_KIND_COLUMNS: dict[str, tuple[str, ...]] = {
    "range": (NUMBER,),
    "mean": (NUMBER,),
    "eq": (NUMBER, TEXT),
    "ne": (NUMBER, TEXT),
    "in_set": (TEXT,),
    "is_true": (BOOL,),
    "nonempty_text": (TEXT,),
    "empty": (STR_LIST,),
    "subset_of": (STR_LIST,),
    "disjoint": (STR_LIST,),
}


class PolicyError(ValueError):
    """A policy file is malformed; raised before any clip is evaluated."""

    def __init__(self, source: str, where: str, detail: str) -> None:
        self.source, self.where, self.detail = source, where, detail
        super().__init__(f"{source}: {where}: {detail}")


@dataclass(frozen=True)
class Check:
    """One atomic, vectorisable gate on one or more columns (all bounds inclusive)."""

    kind: str
    columns: tuple[str, ...]
    min: float | None = None
    max: float | None = None
    value: float | str | None = None
    values: tuple[str, ...] = ()
    where: str = field(default="", compare=False)  # YAML location, for messages only

    @property
    def text(self) -> str:
        """Human-readable form, e.g. ``metrics.saturation in [0, 180]``."""
        col = self.columns[0] if len(self.columns) == 1 else f"mean({', '.join(self.columns)})"
        if self.kind in ("range", "mean"):
            if self.min is not None and self.max is not None:
                return f"{col} in [{_num(self.min)}, {_num(self.max)}]"
            return f"{col} >= {_num(self.min)}" if self.min is not None else f"{col} <= {_num(self.max)}"
        if self.kind in ("eq", "ne"):
            op = "=" if self.kind == "eq" else "!="
            value = _num(self.value) if isinstance(self.value, float) else self.value
            return f"{col} {op} {value}"
        if self.kind == "in_set":
            return f"{col} in {{{', '.join(self.values)}}}"
        if self.kind == "is_true":
            return f"{col} is true"
        if self.kind == "nonempty_text":
            return f"{col} non-empty"
        if self.kind == "empty":
            return f"{col} empty"
        if self.kind == "subset_of":
            return f"{col} subset of {{{', '.join(self.values)}}}"
        return f"{col} disjoint from {{{', '.join(self.values)}}}"


@dataclass(frozen=True)
class OwnerRules:
    """The kept rule and the xhigh extra of one owner, as atomic checks in YAML order."""

    kept: tuple[Check, ...]
    xhigh: tuple[Check, ...]


@dataclass(frozen=True)
class Policy:
    """A named, versioned set of per-owner rules."""

    name: str
    version: str
    owners: dict[str, OwnerRules]
    source: str = ""


def _num(x: float | None) -> str:
    """Format a bound compactly (4.0 -> '4', 0.2 -> '0.2')."""
    return str(int(x)) if x is not None and float(x).is_integer() else repr(x)


def _number(value: Any, source: str, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise PolicyError(source, where, f"expected a finite number, got {value!r}")
    return float(value)


def _mapping(value: Any, keys: set[str], required: set[str], source: str, where: str) -> dict:
    if not isinstance(value, dict):
        raise PolicyError(source, where, f"expected a mapping with keys {sorted(keys)}, got {value!r}")
    unknown = set(value) - keys
    if unknown:
        raise PolicyError(source, where, f"unknown key(s) {sorted(map(str, unknown))}; allowed {sorted(keys)}")
    absent = required - set(value)
    if absent:
        raise PolicyError(source, where, f"missing key(s) {sorted(absent)}")
    return value


def _column(name: Any, kind: str, source: str, where: str) -> str:
    if not isinstance(name, str) or name not in COLUMNS:
        raise PolicyError(source, where, f"unknown column {name!r}; see COLUMNS in solarwm/data/policy/spec.py")
    if COLUMNS[name] not in _KIND_COLUMNS[kind]:
        raise PolicyError(source, where, f"gate {kind!r} cannot read {name!r} (a {COLUMNS[name]} column)")
    return name


def _strings(values: Any, source: str, where: str) -> tuple[str, ...]:
    if not isinstance(values, list) or not values or not all(isinstance(v, str) for v in values):
        raise PolicyError(source, where, f"expected a non-empty list of strings, got {values!r}")
    return tuple(values)


def _interval(spec: dict, source: str, where: str) -> tuple[float | None, float | None]:
    lo = _number(spec["min"], source, f"{where}.min") if "min" in spec else None
    hi = _number(spec["max"], source, f"{where}.max") if "max" in spec else None
    if lo is None and hi is None:
        raise PolicyError(source, where, "an interval needs min, max or both")
    if lo is not None and hi is not None and lo > hi:
        raise PolicyError(source, where, f"malformed interval: min {lo} > max {hi}")
    return lo, hi


def parse_gate(gate: Any, source: str = "<policy>", where: str = "gate") -> list[Check]:
    """Expand one YAML gate (a single-key mapping) into atomic checks; raise PolicyError if malformed."""
    if not isinstance(gate, dict) or len(gate) != 1:
        raise PolicyError(source, where, f"a gate is a mapping with exactly one key, got {gate!r}")
    (key, arg), = gate.items()
    at = f"{where}.{key}"
    if key == "camera":
        if arg not in CAMERA_GATES:
            raise PolicyError(source, at, f"unknown camera gate {arg!r}; allowed {sorted(CAMERA_GATES)}")
        fov_max = CAMERA_GATES[arg]
        # Exactly Table 3's C120/C125; metric scale is enforced through camera.scale_cov.
        checks = [Check("is_true", ("camera.finite",), where=at)]
        for axis in ("x", "y"):
            checks.append(Check("range", (f"camera.fov_{axis}_min",), min=25.0, where=at))
            checks.append(Check("range", (f"camera.fov_{axis}_max",), max=fov_max, where=at))
        checks.append(Check("range", ("camera.focal_div_max",), max=0.20, where=at))
        checks.append(Check("range", ("camera.scale_cov",), max=2.0, where=at))
        return checks
    if key == "resolution":
        spec = _mapping(arg, {"width", "height", "columns"}, {"width", "height"}, source, at)
        columns = spec.get("columns", ["width", "height"])
        if not isinstance(columns, list) or len(columns) != 2:
            raise PolicyError(source, f"{at}.columns", f"expected [width_column, height_column], got {columns!r}")
        return [
            Check("eq", (_column(col, "eq", source, f"{at}.columns"),),
                  value=_number(spec[dim], source, f"{at}.{dim}"), where=at)
            for col, dim in zip(columns, ("width", "height"))
        ]
    if key in ("range", "mean"):
        col_key = "column" if key == "range" else "columns"
        spec = _mapping(arg, {col_key, "min", "max"}, {col_key}, source, at)
        lo, hi = _interval(spec, source, at)
        if key == "range":
            columns = (_column(spec["column"], key, source, f"{at}.column"),)
        else:
            names = spec["columns"]
            if not isinstance(names, list) or len(names) < 2:
                raise PolicyError(source, f"{at}.columns", f"expected a list of at least two columns, got {names!r}")
            columns = tuple(_column(c, key, source, f"{at}.columns") for c in names)
        return [Check(key, columns, min=lo, max=hi, where=at)]
    if key in ("eq", "ne"):
        spec = _mapping(arg, {"column", "value"}, {"column", "value"}, source, at)
        column = _column(spec["column"], key, source, f"{at}.column")
        if COLUMNS[column] == TEXT:
            if not isinstance(spec["value"], str):
                raise PolicyError(source, f"{at}.value", f"{column} is text; expected a string, got {spec['value']!r}")
            value: float | str = spec["value"]
        else:
            value = _number(spec["value"], source, f"{at}.value")
        return [Check(key, (column,), value=value, where=at)]
    if key in ("in_set", "subset_of", "disjoint"):
        values_key = "allowed" if key == "subset_of" else "values"
        spec = _mapping(arg, {"column", values_key}, {"column", values_key}, source, at)
        column = _column(spec["column"], key, source, f"{at}.column")
        return [Check(key, (column,), values=_strings(spec[values_key], source, f"{at}.{values_key}"), where=at)]
    if key in ("is_true", "nonempty_text", "empty"):
        return [Check(key, (_column(arg, key, source, at),), where=at)]
    raise PolicyError(
        source, where,
        f"unknown gate {key!r}; allowed camera, range, mean, eq, ne, in_set, is_true, nonempty_text, "
        "empty, subset_of, disjoint, resolution",
    )


def parse_policy(doc: Any, source: str = "<policy>") -> Policy:
    """Validate a loaded policy document and compile it to atomic checks."""
    spec = _mapping(doc, {"policy", "version", "description", "owners"}, {"policy", "version", "owners"},
                    source, "top level")
    for key in ("policy", "version"):
        if not isinstance(spec[key], str) or not spec[key].strip():
            raise PolicyError(source, key, f"expected a non-empty string (quote numbers), got {spec[key]!r}")
    if not isinstance(spec["owners"], dict) or not spec["owners"]:
        raise PolicyError(source, "owners", "expected a non-empty mapping of owner id -> {kept, xhigh}")
    owners: dict[str, OwnerRules] = {}
    for owner, rules in spec["owners"].items():
        if owner not in OWNERS:
            raise PolicyError(source, f"owners.{owner}", f"unknown owner id; allowed {list(OWNERS)}")
        rules = _mapping(rules, {"kept", "xhigh"}, {"kept", "xhigh"}, source, f"owners.{owner}")
        compiled = {}
        for part in ("kept", "xhigh"):
            gates = rules[part]
            if not isinstance(gates, list):
                raise PolicyError(source, f"owners.{owner}.{part}", f"expected a list of gates, got {gates!r}")
            compiled[part] = tuple(
                check for i, gate in enumerate(gates)
                for check in parse_gate(gate, source, f"owners.{owner}.{part}[{i}]")
            )
        if not compiled["kept"]:
            raise PolicyError(source, f"owners.{owner}.kept", "a kept rule needs at least one gate")
        owners[owner] = OwnerRules(kept=compiled["kept"], xhigh=compiled["xhigh"])
    return Policy(name=spec["policy"], version=spec["version"], owners=owners, source=source)


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate mapping keys (PyYAML would silently keep the last)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def load_policy(path: str | Path) -> Policy:
    """Read and validate a policy YAML file; raise PolicyError naming the file and the bad entry."""
    path = Path(path)
    try:
        doc = yaml.load(path.read_text(), Loader=_UniqueKeyLoader)
    except (OSError, yaml.YAMLError) as err:
        raise PolicyError(str(path), "file", f"cannot read policy: {err}") from err
    return parse_policy(doc, str(path))
