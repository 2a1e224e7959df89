"""Columnar inputs and outputs of the policy engine: meta.json records, metrics and tiers parquet."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from solarwm.data.policy.spec import BOOL, COLUMNS, NUMBER, STR_LIST, TEXT
from solarwm.util.atomic import atomic_path

# Arrow type of each column kind when a table is built from records.
_ARROW_TYPES = {NUMBER: pa.float64(), BOOL: pa.bool_(), TEXT: pa.string(), STR_LIST: pa.list_(pa.string())}

TIERS_SCHEMA = pa.schema([
    ("clip_id", pa.string()), ("owner", pa.string()), ("tier", pa.string()), ("reasons", pa.list_(pa.string())),
])


def flatten_meta(doc: dict[str, Any]) -> dict[str, Any]:
    """One clip's meta.json document -> flat record keyed like the policy columns.

    ``meta.{num_frames,width,height}`` and ``caption`` keep their leaf names, every ``metrics``
    key is kept as is, ``provenance.lineage.*`` becomes ``lineage.*`` and ``provenance.owner``
    becomes ``owner``. Absent values stay absent (the engine fails them closed).
    """
    meta = doc.get("meta") if isinstance(doc.get("meta"), dict) else {}
    provenance = doc.get("provenance") if isinstance(doc.get("provenance"), dict) else {}
    lineage = provenance.get("lineage") if isinstance(provenance.get("lineage"), dict) else {}
    metrics = doc.get("metrics") if isinstance(doc.get("metrics"), dict) else {}
    record: dict[str, Any] = {"clip_id": doc.get("clip_id"), "owner": provenance.get("owner")}
    for key in ("num_frames", "width", "height"):
        if key in meta:
            record[key] = meta[key]
    if "caption" in doc:
        record["caption"] = doc["caption"]
    record.update(metrics)
    record.update({f"lineage.{key}": value for key, value in lineage.items()})
    return record


RELATIVE_SCALE = "undefined for relative poses (camera.pose_units=relative)"


def pose_unit_errors(table: pa.Table) -> dict[str, dict[int, str]]:
    """Row errors naming why ``camera.scale_cov`` is unusable on clips whose poses are only up to scale.

    Table 3's camera gates read ``camera.scale_cov`` but not ``camera.pose_units``, so a table
    without ``camera.pose_units`` is gated exactly as in the paper. Where the column says
    ``relative``, a scale coefficient of variation has no meaning (the annotator leaves it out),
    so the value is marked unusable, present or not: such clips fail C120/C125 with this reason
    instead of ``camera.scale_cov: missing``, and a stray value in a foreign table cannot pass.
    """
    if "camera.pose_units" not in table.column_names:
        return {}
    units = table.column("camera.pose_units").combine_chunks()
    if pa.types.is_dictionary(units.type):
        units = units.dictionary_decode()
    if not (pa.types.is_string(units.type) or pa.types.is_large_string(units.type)):
        return {}  # a mistyped column is reported by any gate that reads it; nothing to explain here
    relative = pc.fill_null(pc.equal(units, "relative"), False).to_numpy(zero_copy_only=False)
    rows = np.flatnonzero(relative)
    return {"camera.scale_cov": dict.fromkeys(rows.tolist(), RELATIVE_SCALE)} if rows.size else {}


def merge_errors(*parts: dict[str, dict[int, str]]) -> dict[str, dict[int, str]]:
    """Per-column row errors of several sources; a later part wins on the same row."""
    out: dict[str, dict[int, str]] = {}
    for part in parts:
        for column, rows in part.items():
            out.setdefault(column, {}).update(rows)
    return out


def _coerce(kind: str, value: Any) -> tuple[Any, str | None]:
    """Return (value for Arrow or None, error text or None) for one JSON value of a column kind."""
    if value is None:
        return None, None
    if kind == NUMBER:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return None, f"not numeric ({type(value).__name__})"
        try:
            return float(value), None
        except OverflowError:  # an int beyond float64 range
            return None, "not finite"
    if kind == BOOL:
        return (value, None) if isinstance(value, bool) else (None, f"not bool ({type(value).__name__})")
    if kind == TEXT:
        return (value, None) if isinstance(value, str) else (None, f"not text ({type(value).__name__})")
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return value, None
    return None, "not a list of strings"


def records_to_table(records: list[dict[str, Any]]) -> tuple[pa.Table, dict[str, dict[int, str]]]:
    """Flat records -> (table of `clip_id`, `owner` and every vocabulary column, per-row type errors).

    A value of the wrong kind becomes null in the table and an entry ``{column: {row: reason}}``
    in the returned errors, which :func:`solarwm.data.policy.engine.evaluate` turns into a failed
    gate naming the column. A vocabulary column no record has is left out (so it reads as missing).
    The errors include :func:`pose_unit_errors`.
    """
    def text(key: str) -> pa.Array:
        return pa.array([r.get(key) if isinstance(r.get(key), str) else None for r in records], pa.string())

    data: dict[str, pa.Array] = {"clip_id": text("clip_id"), "owner": text("owner")}
    errors: dict[str, dict[int, str]] = {}
    for name, kind in COLUMNS.items():
        if not any(name in r for r in records):
            continue
        values = []
        for row, record in enumerate(records):
            value, error = _coerce(kind, record.get(name))
            if error is not None:
                errors.setdefault(name, {})[row] = error
            values.append(value)
        data[name] = pa.array(values, _ARROW_TYPES[kind])
    table = pa.table(data)
    # A type error names the stored value; it is more specific than the pose-units explanation.
    return table, merge_errors(pose_unit_errors(table), errors)


def read_metrics_table(path: str | Path) -> pa.Table:
    """Read a metrics parquet (one row per clip: `clip_id`, `owner` and policy columns)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: metrics table not found")
    try:
        return pq.read_table(path)
    except (pa.ArrowInvalid, OSError) as err:
        raise ValueError(f"{path}: cannot read metrics parquet: {err}") from err


def write_tiers(table: pa.Table, path: str | Path) -> Path:
    """Write the engine's tiers table (`clip_id`, `owner`, `tier`, `reasons`) to parquet atomically."""
    path = Path(path)
    with atomic_path(path) as tmp:
        pq.write_table(table.select(TIERS_SCHEMA.names).cast(TIERS_SCHEMA), tmp)
    return path

