"""Property tests: the vectorised engine equals a plain per-row evaluation, and tiers are monotone."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from test_policy_table3 import GOOD  # one fixture row that passes every owner's policy

from solarwm.data.policy import COLUMNS, OWNERS, TIERS, Check, Policy, evaluate, load_policy
from solarwm.data.policy.engine import format_number
from solarwm.data.policy.spec import BOOL, NUMBER, TEXT
from solarwm.data.policy.table import records_to_table

POLICY = load_policy(Path(__file__).resolve().parents[2] / "recipes/policies/solarwm-v1.yaml")
FLAGS = ["text_heavy", "watermark", "ui_overlay", "blurry", "near_static", "low_light", "nsfw", "single_color"]
ABSENT = object()
BOUNDS = [0, 0.2, 0.3, 0.35, 0.4, 0.45, 0.5, 1, 2, 3, 4, 5, 25, 81, 100, 120, 125, 180, 200, 250, 350, 720, 1280]

# ---------------------------------------------------------------------------------------------
# The oracle: the same policy evaluated one row at a time in plain Python.


def problem(column: str, row: dict) -> str | None:
    """Why `row[column]` is unusable, or None."""
    value = row.get(column)
    if value is None:
        return f"{column}: missing"
    kind = COLUMNS[column]
    if kind == NUMBER:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"{column}: not numeric ({type(value).__name__})"
        return None if math.isfinite(value) else f"{column}: not finite"
    if kind == BOOL:
        return None if isinstance(value, bool) else f"{column}: not bool ({type(value).__name__})"
    if kind == TEXT:
        return None if isinstance(value, str) else f"{column}: not text ({type(value).__name__})"
    ok = isinstance(value, list) and all(isinstance(item, str) for item in value)
    return None if ok else f"{column}: not a list of strings"


def check_row(check: Check, row: dict) -> str | None:
    """The failure reason of one check on one row, or None when it passes."""
    problems = [p for p in (problem(c, row) for c in check.columns) if p]
    if problems:
        return "; ".join(problems)
    col = check.columns[0]
    value = row[col]
    if check.kind in ("range", "mean"):
        label = col if check.kind == "range" else f"mean({', '.join(check.columns)})"
        x = float(value) if check.kind == "range" else sum(float(row[c]) for c in check.columns) / len(check.columns)
        if check.min is not None and x < check.min:
            return f"{label}={format_number(x)} < {format_number(check.min)}"
        if check.max is not None and x > check.max:
            return f"{label}={format_number(x)} > {format_number(check.max)}"
        return None
    if check.kind in ("eq", "ne"):
        numeric = COLUMNS[col] == NUMBER
        shown = format_number(value) if numeric else value
        target = format_number(check.value) if numeric else check.value
        same = (float(value) if numeric else value) == check.value
        if check.kind == "eq" and not same:
            return f"{col}={shown} != {target}"
        return f"{col}={shown} == {target}" if check.kind == "ne" and same else None
    if check.kind == "in_set":
        return None if value in check.values else f"{col}={value} not in {{{', '.join(check.values)}}}"
    if check.kind == "is_true":
        return None if value else f"{col} is false"
    if check.kind == "nonempty_text":
        return None if value.strip() else f"{col}: empty"
    shown = f"{col}=[{', '.join(value)}]"
    if check.kind == "empty":
        return f"{shown} not empty" if value else None
    allowed = ", ".join(check.values)
    if check.kind == "subset_of":
        return None if set(value) <= set(check.values) else f"{shown} not subset of {{{allowed}}}"
    return f"{shown} intersects {{{allowed}}}" if set(value) & set(check.values) else None


def oracle(policy: Policy, row: dict) -> tuple[str, list[str]]:
    owner = row.get("owner")
    if owner is None:
        return "rejected", ["owner: missing"]
    if owner not in policy.owners:
        return "rejected", ["owner: no policy"]
    rules = policy.owners[owner]
    reasons = [r for r in (check_row(c, row) for c in rules.kept) if r is not None]
    if reasons:
        return "rejected", reasons
    return ("xhigh" if all(check_row(c, row) is None for c in rules.xhigh) else "high"), []


# ---------------------------------------------------------------------------------------------
# Rows: mostly good, with a few columns perturbed to boundaries, NaN, missing or mistyped values.

numbers = st.one_of(
    st.sampled_from(BOUNDS), st.floats(-10, 1500, allow_nan=False), st.integers(-5, 1500),
    st.sampled_from([math.nan, math.inf, -math.inf, "5", True, [1.0]]),
    st.sampled_from(BOUNDS).map(lambda b: math.nextafter(b, math.inf)),
    st.sampled_from(BOUNDS).map(lambda b: math.nextafter(b, -math.inf)),
)
PERTURB = {
    NUMBER: numbers,
    BOOL: st.sampled_from([True, False, 1, "true"]),
    TEXT: st.sampled_from(["", " ", "\t\n", "x", " a street ", "high", "xhigh", "rejected", 3]),
    "str_list": st.one_of(st.lists(st.sampled_from(FLAGS), max_size=3), st.sampled_from(["watermark", [1], ["a", 2]])),
}


@st.composite
def rows(draw) -> dict:
    row = {"owner": draw(st.sampled_from([*OWNERS, "youtube", None])), **GOOD}
    row["metrics.vlm_quality"] = draw(st.sampled_from([5.0, 4.0]))  # 4: high for most owners
    for column in draw(st.lists(st.sampled_from(sorted(COLUMNS)), max_size=4, unique=True)):
        value = draw(st.one_of(st.just(ABSENT), st.just(None), PERTURB[COLUMNS[column]]))
        if value is ABSENT:
            row.pop(column, None)
        else:
            row[column] = value
    return row


def run(policy: Policy, batch: list[dict]) -> list[tuple[str, list[str]]]:
    table, errors = records_to_table([{"clip_id": str(i), **row} for i, row in enumerate(batch)])
    return [(r["tier"], r["reasons"]) for r in evaluate(policy, table, errors).table.to_pylist()]


@settings(max_examples=150, deadline=None)
@given(st.lists(rows(), min_size=1, max_size=25))
def test_engine_equals_per_row_oracle(batch):
    assert run(POLICY, batch) == [oracle(POLICY, row) for row in batch]


def tightened(policy: Policy, delta: float) -> Policy:
    """Every interval narrowed by `delta` on each bounded side (never past its other bound)."""

    def tighten(check: Check) -> Check:
        if check.kind not in ("range", "mean"):
            return check
        lo = None if check.min is None else check.min + delta
        hi = None if check.max is None else check.max - delta
        if lo is not None and hi is not None and lo > hi:
            lo = hi = (check.min + check.max) / 2
        return dataclasses.replace(check, min=lo, max=hi)

    owners = {o: dataclasses.replace(r, kept=tuple(map(tighten, r.kept)), xhigh=tuple(map(tighten, r.xhigh)))
              for o, r in policy.owners.items()}
    return dataclasses.replace(policy, owners=owners)


@settings(max_examples=60, deadline=None)
@given(st.lists(rows(), min_size=1, max_size=20), st.sampled_from([1e-9, 0.01, 0.5, 3.0, 40.0]))
def test_tightening_the_policy_never_upgrades(batch, delta):
    loose = run(POLICY, batch)
    tight = run(tightened(POLICY, delta), batch)
    for (loose_tier, _), (tight_tier, _) in zip(loose, tight):
        assert TIERS.index(tight_tier) >= TIERS.index(loose_tier)


@settings(max_examples=60, deadline=None)
@given(st.lists(rows(), min_size=1, max_size=20), st.sampled_from(sorted(COLUMNS)),
       st.sampled_from([None, math.nan, "bad"]))
def test_breaking_a_value_never_upgrades(batch, column, broken):
    before = run(POLICY, batch)
    after = run(POLICY, [{**row, column: broken} for row in batch])
    for (old, _), (new, reasons) in zip(before, after):
        assert TIERS.index(new) >= TIERS.index(old)
        if new == "rejected" and old != "rejected":
            assert any(reason.startswith(f"{column}") for reason in reasons)
