"""recipes/policies/solarwm-v1.yaml against an independent transcription of paper Table 3.

Every bound of every owner is probed on both sides, every column a rule names must fail closed
when absent, and no column outside an owner's Table 3 rule may gate it.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from solarwm.data.policy import COLUMNS, evaluate, load_policy
from solarwm.data.policy.engine import format_number
from solarwm.data.policy.table import RELATIVE_SCALE, records_to_table

POLICY = load_policy(Path(__file__).resolve().parents[2] / "recipes/policies/solarwm-v1.yaml")
D = ("metrics.dover_tech", "metrics.dover_aes")
D_LABEL = "mean(metrics.dover_tech, metrics.dover_aes)"

# A row inside every kept rule and every xhigh extra of every owner.
GOOD = {
    "num_frames": 121,
    "width": 1280,
    "height": 720,
    "caption": "a walk through a market",
    "camera.finite": True,
    "camera.pose_units": "metric",
    "camera.fov_x_min": 60.0,
    "camera.fov_x_max": 62.0,
    "camera.fov_y_min": 40.0,
    "camera.fov_y_max": 41.0,
    "camera.focal_div_max": 0.01,
    "camera.scale_cov": 0.1,
    "metrics.vlm_quality": 5.0,
    "metrics.vlm_reject_flags": [],
    "metrics.vlm_transition_count": 0,
    "metrics.vlm_entity_density": 2,
    "metrics.vlm_scene_type": "real_world",
    "metrics.dover_tech": 0.6,
    "metrics.dover_aes": 0.6,
    "metrics.vmaf": 10.0,
    "metrics.unimatch": 50.0,
    "metrics.flow_dis": 5.0,
    "metrics.saturation": 100.0,
    "metrics.scene_cuts": 0,
    "lineage.source_tier": "high",
    "lineage.geometry_ok": True,
    "lineage.source_width": 1280,
    "lineage.source_height": 720,
}


def camera(fov_max: float) -> list:
    return [
        ("camera.fov_x_min", 25, None),
        ("camera.fov_x_max", None, fov_max),
        ("camera.fov_y_min", 25, None),
        ("camera.fov_y_max", None, fov_max),
        ("camera.focal_div_max", None, 0.20),
        ("camera.scale_cov", None, 2),
    ]


C120, C125 = camera(120), camera(125)
S = [("metrics.saturation", 0, 180)]
Q4 = [("metrics.vlm_quality", 4, None)]
Q5 = [("metrics.vlm_quality", 5, 5)]
T0 = [("metrics.vlm_transition_count", 0, 0)]
N81 = [("num_frames", 81, None)]
J0 = [("metrics.scene_cuts", 0, 0)]


def d(lo):
    return [(D, lo, None)]


def v(lo, hi):
    return [("metrics.vmaf", lo, hi)]


def u(lo, hi):
    return [("metrics.unimatch", lo, hi)]


# Other Table 3 gates by name: A caption, G geometry, lineage, resolution, resolution_src,
# E != 3, camera.finite (part of C120/C125), and the reject-flag rules on R.
R_EMPTY = ("empty", ())
R_WALK = ("subset", ("watermark", "near_static"))

# owner -> (kept intervals, kept other gates, kept R rule, xhigh intervals, xhigh R rule)
TABLE3 = {
    "dl3dv_10s": (C120 + S + Q4 + d(0.20), {"finite"}, None, Q5 + d(0.30), None),
    "dl3dv_60s": (C120 + S + Q4 + d(0.20), {"finite"}, None, Q5 + d(0.30), None),
    "mind": (C125 + T0 + Q4, {"finite"}, R_EMPTY, Q5, None),
    "abot": (C120 + S + T0 + Q4, {"finite"}, R_EMPTY, Q5, None),
    "omniworld": (C120 + S + T0 + Q4 + d(0.30) + v(0.5, 100) + u(3, 250), {"finite"}, R_EMPTY, Q5 + u(None, 200), None),
    "sekai_game": (
        u(None, 350) + d(0.20) + [("metrics.vlm_quality", 3, 5)],
        set(),
        ("disjoint", ("blurry",)),
        [("metrics.vlm_quality", 4, 5)],
        R_EMPTY,
    ),
    "miradata": (
        N81 + C120 + S + Q4 + d(0.40) + T0 + v(0.5, 50) + u(3, 120),
        {"A", "finite", "res"},
        R_EMPTY,
        Q5 + u(None, 100),
        None,
    ),
    "realcam": (
        N81 + C120 + S + T0 + Q4 + v(0.5, 100) + d(0.30) + u(3, 200),
        {"finite"},
        ("disjoint", ("blurry", "ui_overlay")),
        Q5,
        ("subset", ("near_static",)),
    ),
    "multicamvideo": (C120 + S + Q4 + d(0.40) + T0, {"finite"}, R_EMPTY, Q5, None),
    "sekai_walking": (
        N81 + C120 + S + T0 + Q4 + v(0.5, 50) + d(0.35) + u(3, 120),
        {"A", "finite"},
        R_WALK,
        Q5,
        R_EMPTY,
    ),
    "miradata_clean": (
        N81 + S + Q4 + d(0.40) + v(0.5, 50) + u(3, 120) + T0 + [("metrics.scene_cuts", 0, 1)],
        {"lineage", "A", "G", "res", "res_src"},
        R_EMPTY,
        Q5 + d(0.45) + u(None, 100),
        None,
    ),
    "sekai_walking_clean": (N81 + S + T0 + Q4 + d(0.35) + u(3, 120) + v(0.5, 50), {"A", "G", "E"}, R_WALK, Q5, R_EMPTY),
    "spatialvid": (
        N81 + C120 + S + T0 + Q4 + v(0.5, 50) + d(0.35) + u(3, 120) + J0,
        {"A", "finite"},
        R_WALK,
        Q5,
        R_EMPTY,
    ),
    "spatialvid_clean": (
        N81 + S + T0 + Q4 + v(0.5, 50) + d(0.35) + u(3, 120) + J0,
        {"A", "G", "E"},
        R_WALK,
        Q5,
        R_EMPTY,
    ),
}
OTHER_COLUMNS = {
    "A": ("caption",),
    "finite": ("camera.finite",),
    "G": ("lineage.geometry_ok",),
    "lineage": ("lineage.source_tier",),
    "res": ("width", "height"),
    "res_src": ("lineage.source_width", "lineage.source_height"),
    "E": ("metrics.vlm_entity_density",),
}
R = "metrics.vlm_reject_flags"


def select(rows: list[dict]) -> list[dict]:
    """Evaluate rows (dicts of column -> value, plus owner) with the shipped policy."""
    records = [{"clip_id": f"c{i}", **row} for i, row in enumerate(rows)]
    table, errors = records_to_table(records)
    return evaluate(POLICY, table, errors).table.to_pylist()


def one(owner: str, **changes) -> dict:
    return select([{**GOOD, "owner": owner, **changes}])[0]


def columns_of(intervals: list) -> set[str]:
    out = set()
    for column, _, _ in intervals:
        out.update(column if isinstance(column, tuple) else (column,))
    return out


def kept_columns(owner: str) -> set[str]:
    intervals, other, r_rule, _, _ = TABLE3[owner]
    cols = columns_of(intervals) | {c for name in other for c in OTHER_COLUMNS[name]}
    return cols | ({R} if r_rule else set())


def set_value(column, value) -> dict:
    return dict.fromkeys(column, value) if isinstance(column, tuple) else {column: value}


def within(owner: str, column, value: float, xhigh: bool) -> bool:
    """Whether `value` satisfies every interval of the transcription on `column`."""
    intervals = TABLE3[owner][0] + (TABLE3[owner][3] if xhigh else [])
    return all(
        (lo is None or value >= lo) and (hi is None or value <= hi) for col, lo, hi in intervals if col == column
    )


def test_policy_covers_every_owner_and_a_good_row_is_xhigh():
    assert POLICY.name == "solarwm-v1" and POLICY.version
    assert set(POLICY.owners) == set(TABLE3) | {"synthetic"}
    rows = select([{**GOOD, "owner": owner} for owner in POLICY.owners])
    assert [(r["tier"], r["reasons"]) for r in rows] == [("xhigh", [])] * len(POLICY.owners)


KEPT_BOUNDS = [
    (owner, column, lo, hi, side)
    for owner, spec in TABLE3.items()
    for column, lo, hi in spec[0]
    for side, bound in (("min", lo), ("max", hi))
    if bound is not None
]


@pytest.mark.parametrize(
    "owner,column,lo,hi,side",
    KEPT_BOUNDS,
    ids=[f"{o}-{c if isinstance(c, str) else 'D'}-{s}" for o, c, _, _, s in KEPT_BOUNDS],
)
def test_kept_bound_inclusive_inside_and_rejected_just_outside(owner, column, lo, hi, side):
    bound = lo if side == "min" else hi
    inside = one(owner, **set_value(column, bound))
    expected_inside = "xhigh" if within(owner, column, bound, xhigh=True) else "high"
    assert (inside["tier"], inside["reasons"]) == (expected_inside, [])

    outside = float(np.nextafter(bound, -math.inf if side == "min" else math.inf))
    row = one(owner, **set_value(column, outside))
    label = D_LABEL if isinstance(column, tuple) else column
    if lo == hi:
        message = f"{label}={format_number(outside)} != {format_number(bound)}"
    else:
        message = f"{label}={format_number(outside)} {'<' if side == 'min' else '>'} {format_number(bound)}"
    assert (row["tier"], row["reasons"]) == ("rejected", [message])


XHIGH_BOUNDS = [
    (owner, column, lo, hi, side)
    for owner, spec in TABLE3.items()
    for column, lo, hi in spec[3]
    for side, bound in (("min", lo), ("max", hi))
    if bound is not None
]


@pytest.mark.parametrize(
    "owner,column,lo,hi,side",
    XHIGH_BOUNDS,
    ids=[f"{o}-{c if isinstance(c, str) else 'D'}-{s}" for o, c, _, _, s in XHIGH_BOUNDS],
)
def test_xhigh_bound_inclusive_inside_and_high_just_outside(owner, column, lo, hi, side):
    bound = lo if side == "min" else hi
    assert one(owner, **set_value(column, bound))["tier"] == "xhigh"
    outside = float(np.nextafter(bound, -math.inf if side == "min" else math.inf))
    row = one(owner, **set_value(column, outside))
    if within(owner, column, outside, xhigh=False):
        assert (row["tier"], row["reasons"]) == ("high", [])
    else:  # outside the kept rule too (e.g. sekai_game Q in [3, 5] vs [4, 5]): covered above
        assert row["tier"] == "rejected"


@pytest.mark.slow
@pytest.mark.parametrize("owner", sorted(TABLE3))
def test_rule_reads_exactly_the_table3_columns(owner):
    """Dropping a column the kept rule names rejects with `column: missing`; any other column is not a gate."""
    xhigh_only = columns_of(TABLE3[owner][3]) | ({R} if TABLE3[owner][4] else set())
    for column in COLUMNS:
        row = select([{**{k: val for k, val in GOOD.items() if k != column}, "owner": owner}])[0]
        if column in kept_columns(owner):
            assert (row["tier"], row["reasons"]) == ("rejected", [f"{column}: missing"]), column
        elif column in xhigh_only:
            assert (row["tier"], row["reasons"]) == ("high", []), column
        else:
            assert (row["tier"], row["reasons"]) == ("xhigh", []), column


def test_table_column_absent_from_the_input_fails_closed():
    table = pa.table({"clip_id": ["a"], "owner": ["sekai_game"], "metrics.unimatch": [10.0]})
    row = evaluate(POLICY, table).table.to_pylist()[0]
    assert row["tier"] == "rejected"
    assert row["reasons"] == [
        "metrics.dover_tech: missing; metrics.dover_aes: missing",
        "metrics.vlm_quality: missing",
        "metrics.vlm_reject_flags: missing",
    ]


FLAG_SETS = [
    [],
    ["watermark"],
    ["near_static"],
    ["blurry"],
    ["ui_overlay"],
    ["watermark", "near_static"],
    ["blurry", "watermark"],
    ["text_heavy"],
]


def r_ok(rule, flags) -> bool:
    if rule is None:
        return True
    kind, values = rule
    return {"empty": not flags, "subset": set(flags) <= set(values), "disjoint": not set(flags) & set(values)}[kind]


@pytest.mark.parametrize("owner", sorted(TABLE3))
def test_reject_flag_rules(owner):
    kept_rule, xhigh_rule = TABLE3[owner][2], TABLE3[owner][4]
    rows = select([{**GOOD, "owner": owner, R: flags} for flags in FLAG_SETS])
    for flags, row in zip(FLAG_SETS, rows):
        if not r_ok(kept_rule, flags):
            kind, values = kept_rule
            text = f"{R}=[{', '.join(flags)}]"
            message = {
                "empty": f"{text} not empty",
                "subset": f"{text} not subset of {{{', '.join(values)}}}",
                "disjoint": f"{text} intersects {{{', '.join(values)}}}",
            }[kind]
            assert (row["tier"], row["reasons"]) == ("rejected", [message]), flags
        else:
            assert (row["tier"], row["reasons"]) == ("xhigh" if r_ok(xhigh_rule, flags) else "high", []), flags


@pytest.mark.parametrize("owner", sorted(TABLE3))
def test_other_table3_gates(owner):
    other = TABLE3[owner][1]
    cases = [  # (gate, changes, reason)
        ("A", {"caption": "  \n\t"}, "caption: empty"),
        ("A", {"caption": ""}, "caption: empty"),
        ("finite", {"camera.finite": False}, "camera.finite is false"),
        ("finite", {"camera.pose_units": "relative"}, f"camera.scale_cov: {RELATIVE_SCALE}"),
        ("G", {"lineage.geometry_ok": False}, "lineage.geometry_ok is false"),
        ("lineage", {"lineage.source_tier": "rejected"}, "lineage.source_tier=rejected not in {high, xhigh}"),
        ("res", {"width": 1920}, "width=1920 != 1280"),
        ("res", {"height": 1080}, "height=1080 != 720"),
        ("res_src", {"lineage.source_width": 1920}, "lineage.source_width=1920 != 1280"),
        ("res_src", {"lineage.source_height": 719}, "lineage.source_height=719 != 720"),
        ("E", {"metrics.vlm_entity_density": 3}, "metrics.vlm_entity_density=3 == 3"),
    ]
    for gate, changes, reason in cases:
        row = one(owner, **changes)
        expected = ("rejected", [reason]) if gate in other else ("xhigh", [])
        assert (row["tier"], row["reasons"]) == expected, (gate, changes)
    if "lineage" in other:
        assert one(owner, **{"lineage.source_tier": "xhigh"})["tier"] == "xhigh"
    if "E" in other:
        assert one(owner, **{"metrics.vlm_entity_density": 1})["tier"] == "xhigh"


@pytest.mark.parametrize("owner", sorted(TABLE3))
def test_non_finite_values_fail_closed_naming_the_column(owner):
    numeric = sorted(c for c in kept_columns(owner) if COLUMNS[c] == "number")
    for bad in (math.nan, math.inf, -math.inf):
        rows = select([{**GOOD, "owner": owner, column: bad} for column in numeric])
        for column, row in zip(numeric, rows):
            assert (row["tier"], row["reasons"]) == ("rejected", [f"{column}: not finite"]), (column, bad)


@pytest.mark.parametrize(
    "column,value,reason",
    [
        ("metrics.vlm_quality", "5", "not numeric (str)"),
        ("metrics.vlm_quality", True, "not numeric (bool)"),
        ("metrics.vlm_quality", [5], "not numeric (list)"),
        ("num_frames", "121", "not numeric (str)"),
        ("camera.finite", 1, "not bool (int)"),
        ("camera.finite", "true", "not bool (str)"),
        ("caption", 7, "not text (int)"),
        ("metrics.vlm_reject_flags", "watermark", "not a list of strings"),
        ("metrics.vlm_reject_flags", ["watermark", 3], "not a list of strings"),
        ("metrics.vlm_reject_flags", None, "missing"),
        ("lineage.geometry_ok", "yes", "not bool (str)"),
    ],
)
def test_mistyped_values_fail_closed(column, value, reason):
    owner = next(o for o in ("miradata_clean", "miradata") if column in kept_columns(o))
    row = one(owner, **{column: value})
    assert (row["tier"], row["reasons"]) == ("rejected", [f"{column}: {reason}"])


def test_mistyped_arrow_columns_fail_every_row():
    table = pa.table(
        {
            "clip_id": ["a", "b"],
            "owner": ["mind", "mind"],
            **{c: [GOOD[c]] * 2 for c in kept_columns("mind")},
            "metrics.vlm_quality": ["5", "4"],  # text where a number belongs
            "camera.finite": pa.array([1, 1], pa.int8()),
            "metrics.vlm_reject_flags": pa.array([[], ["watermark", None]], pa.list_(pa.string())),
        }
    )
    rows = evaluate(POLICY, table).table.to_pylist()
    assert rows[0]["reasons"] == ["camera.finite: not bool (int8)", "metrics.vlm_quality: not numeric (string)"]
    assert rows[1]["reasons"] == [
        "camera.finite: not bool (int8)",
        "metrics.vlm_reject_flags: not a list of strings",
        "metrics.vlm_quality: not numeric (string)",
    ]


def test_reasons_list_every_failed_gate_in_policy_order():
    row = one(
        "miradata",
        caption="",
        num_frames=80,
        **{"camera.fov_x_max": 130.0, "metrics.vlm_quality": math.nan, "metrics.unimatch": 2.5, R: ["blurry"]},
    )
    assert row["tier"] == "rejected"
    assert row["reasons"] == [
        "caption: empty",
        "num_frames=80 < 81",
        "camera.fov_x_max=130 > 120",
        "metrics.vlm_quality: not finite",
        "metrics.vlm_reject_flags=[blurry] not empty",
        "metrics.unimatch=2.5 < 3",
    ]


def test_owner_without_policy_or_missing_owner():
    rows = select([{**GOOD, "owner": "youtube"}, {**GOOD, "owner": None}, {**GOOD, "owner": "mind"}])
    assert [(r["tier"], r["reasons"]) for r in rows] == [
        ("rejected", ["owner: no policy"]),
        ("rejected", ["owner: missing"]),
        ("xhigh", []),
    ]


def test_synthetic_owner_uses_cpu_metrics_only():
    cpu = {
        "caption",
        "camera.finite",
        "camera.pose_units",
        "camera.fov_x_min",
        "camera.fov_x_max",
        "camera.fov_y_min",
        "camera.fov_y_max",
        "camera.focal_div_max",
        "camera.scale_cov",
        "metrics.saturation",
        "metrics.vmaf",
        "metrics.scene_cuts",
        "metrics.flow_dis",
    }
    rules = POLICY.owners["synthetic"]
    assert {c for check in rules.kept + rules.xhigh for c in check.columns} <= cpu
    only_cpu = {k: val for k, val in GOOD.items() if k in cpu}
    assert select([{**only_cpu, "owner": "synthetic"}])[0]["tier"] == "xhigh"
    assert select([{**only_cpu, "owner": "synthetic", "metrics.vmaf": 80.0}])[0]["tier"] == "high"
    assert select([{**only_cpu, "owner": "synthetic", "metrics.scene_cuts": 1}])[0]["reasons"] == [
        "metrics.scene_cuts=1 != 0"
    ]
