"""The one policy engine: evaluate a :class:`~solarwm.data.policy.spec.Policy` over a columnar table.

Every atomic check is evaluated once over the whole table (vectorised with numpy and
pyarrow.compute), then applied per owner. Reason strings are built only for failing rows, so the
cost of text grows with the number of failures, not with the table.

Fail closed: a check fails for a row when any column it reads is absent from the table, null,
not finite, or of the wrong kind; its reason then names the column (``metrics.vmaf: missing``).
Otherwise its reason names the value and the violated bound (``metrics.vlm_quality=3 < 4``).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from functools import cached_property
from typing import Callable, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from solarwm.data.policy.spec import BOOL, COLUMNS, NUMBER, STR_LIST, TEXT, TIERS, Check, Policy

NO_POLICY = "owner: no policy"
OWNER_MISSING = "owner: missing"
_KIND_NAMES = {NUMBER: "numeric", BOOL: "bool", TEXT: "text", STR_LIST: "a list of strings"}


def format_number(x: float) -> str:
    """Format one number exactly as reasons do (Arrow's shortest round-trip form: 3.0 -> '3')."""
    return pc.cast(pa.scalar(float(x), pa.float64()), pa.string()).as_py()


def _format_numbers(values: np.ndarray) -> pa.Array:
    return pc.cast(pa.array(values, pa.float64()), pa.string())


def _concat(*parts: pa.Array | str) -> pa.Array:
    return pc.binary_join_element_wise(*parts, "")


def _type_ok(kind: str, typ: pa.DataType) -> bool:
    if kind == NUMBER:
        return pa.types.is_integer(typ) or pa.types.is_floating(typ)
    if kind == BOOL:
        return pa.types.is_boolean(typ)
    if kind == TEXT:
        return pa.types.is_string(typ) or pa.types.is_large_string(typ)
    is_list = pa.types.is_list(typ) or pa.types.is_large_list(typ)
    return is_list and (pa.types.is_string(typ.value_type) or pa.types.is_large_string(typ.value_type)
                        or pa.types.is_null(typ.value_type))


@dataclass
class _Column:
    """One column read for the policy: typed values plus a per-row problem code (0 = usable)."""

    name: str
    values: np.ndarray | pa.Array | None  # float64 / bool numpy, or string / list<string> Arrow
    codes: np.ndarray  # int32 [n]; index into messages
    messages: list[str | None] = field(default_factory=lambda: [None])

    def flag(self, rows: np.ndarray | slice, message: str) -> None:
        """Mark rows (indices, boolean mask or slice) as unusable with the reason `message`."""
        if message not in self.messages:
            self.messages.append(message)
        self.codes[rows] = self.messages.index(message)

    @cached_property
    def bad(self) -> np.ndarray:
        """Rows whose value is unusable (read once the column is complete)."""
        return self.codes != 0

    def problems(self, rows: np.ndarray) -> pa.Array:
        """Reason per row in `rows` (null where the value is usable)."""
        indices = pa.array(self.codes[rows], pa.int32())
        return pa.DictionaryArray.from_arrays(indices, pa.array(self.messages, pa.string())).dictionary_decode()


def _read_column(table: pa.Table, name: str, row_errors: Mapping[int, str] | None) -> _Column:
    """Read and validate one vocabulary column; absent, null, non-finite and mistyped values are flagged.

    ``row_errors`` (row -> message) then overrides the problem of single rows, also for a column
    the table lacks (e.g. a value left out on purpose, with the reason why).
    """
    column = _Column(name, None, np.zeros(table.num_rows, np.int32))
    _fill_column(column, table, name)
    for row, message in (row_errors or {}).items():
        column.flag(np.array([row]), f"{name}: {message}")
    return column


def _fill_column(column: _Column, table: pa.Table, name: str) -> None:
    """Set ``column.values`` from the table and flag its unusable rows."""
    kind, everything = COLUMNS[name], slice(None)
    if name not in table.column_names:
        column.flag(everything, f"{name}: missing")
        return
    arr = table.column(name).combine_chunks()
    if pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_decode()
    if pa.types.is_null(arr.type):
        column.flag(everything, f"{name}: missing")
        return
    if not _type_ok(kind, arr.type):
        column.flag(everything, f"{name}: not {_KIND_NAMES[kind]} ({arr.type})")
        return
    if kind == NUMBER:
        column.values = arr.cast(pa.float64()).to_numpy(zero_copy_only=False)  # nulls become NaN
        column.flag(~np.isfinite(column.values), f"{name}: not finite")
    elif kind == BOOL:
        column.values = arr.fill_null(False).to_numpy(zero_copy_only=False)
    elif kind == TEXT:
        column.values = arr.cast(pa.string())
    else:
        column.values = arr.cast(pa.list_(pa.string()))
        items = pc.list_flatten(column.values)
        if items.null_count:
            parents = pc.list_parent_indices(column.values).to_numpy()
            column.flag(np.unique(parents[items.is_null().to_numpy(zero_copy_only=False)]),
                        f"{name}: not a list of strings")
    if arr.null_count:
        column.flag(arr.is_null().to_numpy(zero_copy_only=False), f"{name}: missing")


@dataclass
class _Outcome:
    """A check evaluated over the whole table: a failure mask and a reason builder for failing rows."""

    fail: np.ndarray  # bool [n]
    reasons: Callable[[np.ndarray], pa.Array]


def _list_text(values: pa.Array, rows: np.ndarray) -> pa.Array:
    return _concat("=[", pc.binary_join(values.take(pa.array(rows)), ", "), "]")


def _evaluate(check: Check, cols: list[_Column]) -> _Outcome:
    """Evaluate one atomic check; see spec.Check for the kinds."""
    bad = np.logical_or.reduce([c.bad for c in cols])
    label = cols[0].name if len(cols) == 1 else f"mean({', '.join(c.name for c in cols)})"
    values = cols[0].values
    kind = check.kind
    if values is None:  # the column is unusable on every row
        fail, describe = bad, None
    elif kind in ("range", "mean"):
        if kind == "mean":
            values = sum(c.values if c.values is not None else np.full(len(bad), np.nan) for c in cols) / len(cols)
        lo = -np.inf if check.min is None else check.min
        hi = np.inf if check.max is None else check.max
        with np.errstate(invalid="ignore"):
            fail = bad | (values < lo) | (values > hi)
        below = f" < {format_number(lo)}" if check.min is not None else ""
        above = f" > {format_number(hi)}" if check.max is not None else ""

        def describe(rows: np.ndarray, v: np.ndarray = values) -> pa.Array:
            low = pa.array(v[rows] < lo)
            return _concat(f"{label}=", _format_numbers(v[rows]), pc.if_else(low, below, above))
    elif kind in ("eq", "ne") and COLUMNS[check.columns[0]] == NUMBER:
        differs = values != check.value
        fail = bad | (differs if kind == "eq" else ~differs)
        op = f" != {format_number(check.value)}" if kind == "eq" else f" == {format_number(check.value)}"

        def describe(rows: np.ndarray) -> pa.Array:
            return _concat(f"{label}=", _format_numbers(values[rows]), op)
    elif kind in ("eq", "ne", "in_set"):
        wanted = pa.array([check.value] if kind != "in_set" else list(check.values), pa.string())
        member = pc.is_in(values, value_set=wanted).to_numpy(zero_copy_only=False)
        fail = bad | (member if kind == "ne" else ~member)
        op = {"eq": f" != {check.value}", "ne": f" == {check.value}",
              "in_set": f" not in {{{', '.join(check.values)}}}"}[kind]

        def describe(rows: np.ndarray) -> pa.Array:
            return _concat(f"{label}=", values.take(pa.array(rows)), op)
    elif kind == "is_true":
        fail = bad | ~values

        def describe(rows: np.ndarray) -> pa.Array:
            return pa.repeat(f"{label} is false", len(rows))
    elif kind == "nonempty_text":
        length = pc.utf8_length(pc.utf8_trim_whitespace(values)).to_numpy(zero_copy_only=False)
        with np.errstate(invalid="ignore"):
            fail = bad | ~(length > 0)

        def describe(rows: np.ndarray) -> pa.Array:
            return pa.repeat(f"{label}: empty", len(rows))
    else:  # list gates: empty, subset_of, disjoint
        if kind == "empty":
            length = pc.list_value_length(values).fill_null(0).to_numpy(zero_copy_only=False)
            fail = bad | (length > 0)
            op = " not empty"
        else:
            items = pc.list_flatten(values)
            member = pc.is_in(items, value_set=pa.array(check.values, pa.string())).to_numpy(zero_copy_only=False)
            offending = ~member if kind == "subset_of" else member
            parents = pc.list_parent_indices(values).to_numpy()
            fail = bad | (np.bincount(parents[offending], minlength=len(bad)) > 0)
            op = (f" not subset of {{{', '.join(check.values)}}}" if kind == "subset_of"
                  else f" intersects {{{', '.join(check.values)}}}")

        def describe(rows: np.ndarray) -> pa.Array:
            return _concat(label, _list_text(values, rows), op)

    def reasons(rows: np.ndarray) -> pa.Array:
        problems = None
        if describe is not None and not bad[rows].any():
            return describe(rows)
        for column in cols:  # a check on several columns names every unusable one
            p = column.problems(rows)
            if problems is None:
                problems = p
            else:
                both = pc.and_(pc.is_valid(problems), pc.is_valid(p))
                problems = pc.if_else(both, _concat(problems, "; ", p), pc.coalesce(problems, p))
        return problems if describe is None else pc.coalesce(problems, describe(rows))

    return _Outcome(fail=np.asarray(fail, bool), reasons=reasons)


def _reason_lists(n: int, row_parts: list[np.ndarray], reason_parts: list[pa.Array]) -> pa.ListArray:
    """Gather per-gate failures into one list of reasons per row, in the order the parts came.

    Part i holds the rows that failed gate i and their reasons; each row's reasons keep part order.
    """
    counts = np.zeros(n, np.int64)
    for rows in row_parts:
        counts[rows] += 1  # rows within one part are unique
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(counts, out=offsets[1:])
    # Place each part's entries after the reasons its rows already got from earlier parts.
    filled = offsets[:-1].copy()
    source = np.empty(offsets[-1], np.int64)
    start = 0
    for rows in row_parts:
        source[filled[rows]] = np.arange(start, start + rows.size)
        filled[rows] += 1
        start += rows.size
    strings = pa.concat_arrays(reason_parts).take(pa.array(source)) if reason_parts else pa.array([], pa.string())
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), strings)


@dataclass
class Selection:
    """The engine's result: one row per clip plus per-owner counts of failed kept gates."""

    table: pa.Table  # clip_id: string, owner: string, tier: string, reasons: list<string>
    policy: Policy
    gate_failures: dict[str, Counter] = field(default_factory=dict)  # owner -> {gate text: rows}

    def summary(self, top: int = 5) -> dict:
        """Per-owner counts by tier and the most frequent failed gates (JSON-ready)."""
        grouped = self.table.group_by(["owner", "tier"]).aggregate([([], "count_all")]).to_pylist()
        counts: dict[str, dict[str, int]] = {}
        for group in grouped:
            counts.setdefault(str(group["owner"]), dict.fromkeys(TIERS, 0))[group["tier"]] = group["count_all"]
        return {
            "policy": self.policy.name,
            "version": self.policy.version,
            "clips": self.table.num_rows,
            "tiers": {t: sum(c[t] for c in counts.values()) for t in TIERS},
            "owners": {
                owner: {**per, "top_reasons": dict(self.gate_failures.get(owner, Counter()).most_common(top))}
                for owner, per in sorted(counts.items())
            },
        }


def evaluate(policy: Policy, table: pa.Table, row_errors: Mapping[str, Mapping[int, str]] | None = None) -> Selection:
    """Assign every row of `table` a tier and its ordered failed kept gates under `policy`.

    `table` needs `clip_id` and `owner` plus whatever vocabulary columns the policy reads (absent
    ones fail closed). `row_errors` optionally marks single values as unusable, e.g.
    ``{"metrics.vmaf": {7: "not numeric (str)"}}`` from a corpus whose meta.json holds a string.
    """
    for required in ("clip_id", "owner"):
        if required not in table.column_names:
            raise ValueError(f"selection input lacks the column {required!r}")
    n = table.num_rows
    row_errors = row_errors or {}
    columns: dict[str, _Column] = {}
    outcomes: dict[Check, _Outcome] = {}

    def outcome(check: Check) -> _Outcome:
        if check not in outcomes:
            for name in check.columns:
                if name not in columns:
                    columns[name] = _read_column(table, name, row_errors.get(name))
            outcomes[check] = _evaluate(check, [columns[c] for c in check.columns])
        return outcomes[check]

    owner = table.column("owner").combine_chunks()
    if pa.types.is_dictionary(owner.type):
        owner = owner.dictionary_decode()
    if not (pa.types.is_string(owner.type) or pa.types.is_large_string(owner.type) or pa.types.is_null(owner.type)):
        raise ValueError(f"selection input column 'owner' must be text, got {owner.type}")
    encoded = pc.dictionary_encode(owner.cast(pa.string()))
    owner_ids = encoded.dictionary.to_pylist()
    codes = encoded.indices.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
    # Rows grouped by owner, ascending within each owner; a stable sort of small ints is a radix sort.
    order = np.argsort(codes.astype(np.int16) if len(owner_ids) < 2**15 else codes, kind="stable")
    bounds = np.searchsorted(codes[order], np.arange(-1, len(owner_ids) + 1))

    tier = np.full(n, TIERS.index("rejected"), np.int8)
    row_parts: list[np.ndarray] = []
    reason_parts: list[pa.Array] = []
    gate_failures: dict[str, Counter] = {}
    for code in range(-1, len(owner_ids)):
        rows = order[bounds[code + 1]:bounds[code + 2]]
        if rows.size == 0:
            continue
        name = owner_ids[code] if code >= 0 else None
        rules = policy.owners.get(name) if name is not None else None
        if rules is None:
            reason = OWNER_MISSING if name is None else NO_POLICY
            row_parts.append(rows)
            reason_parts.append(pa.repeat(reason, rows.size))
            gate_failures.setdefault(str(name), Counter())[reason] += rows.size
            continue
        failures = gate_failures.setdefault(name, Counter())
        kept = np.ones(rows.size, bool)
        for check in rules.kept:
            result = outcome(check)
            failed = result.fail[rows]
            if failed.any():
                kept &= ~failed
                row_parts.append(rows[failed])
                reason_parts.append(result.reasons(rows[failed]))
                failures[check.text] += int(failed.sum())
        xhigh = kept.copy()
        for check in rules.xhigh:
            xhigh &= ~outcome(check).fail[rows]
        tier[rows[kept]] = TIERS.index("high")
        tier[rows[xhigh]] = TIERS.index("xhigh")

    reasons = _reason_lists(n, row_parts, reason_parts)
    tiers = pa.DictionaryArray.from_arrays(pa.array(tier, pa.int8()), pa.array(TIERS)).dictionary_decode()
    clip_ids = table.column("clip_id").combine_chunks()
    result = pa.table({"clip_id": clip_ids.cast(pa.string()), "owner": owner.cast(pa.string()),
                       "tier": tiers, "reasons": reasons})
    return Selection(table=result, policy=policy, gate_failures=gate_failures)
