"""A table with exactly Table 3's columns gets Table 3's tiers; relative poses are still rejected by name.

Rows carry only the columns the paper's notation names (no ``camera.pose_units``, no CPU stand-ins),
with values drawn around every threshold of Table 3. The shipped policy runs through the one engine
(both the meta.json path and the metrics-parquet CLI path) and is compared with a reading of Table 3
written here from the paper's numbers, independent of the policy file and of the engine.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Callable

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from solarwm.data.policy import evaluate, load_policy
from solarwm.data.policy.cli import select_command
from solarwm.data.policy.table import RELATIVE_SCALE, records_to_table

POLICY = load_policy(Path(__file__).resolve().parents[2] / "recipes/policies/solarwm-v1.yaml")
FLAGS = ("blurry", "ui_overlay", "watermark", "near_static", "text_heavy")

# Table 3's notation -> columns (paper §5.5): N, Q, R, T, E, D = mean DOVER, V, U, S, J, A, G, lineage,
# resolution (output and source) and the fields of C120/C125.
TABLE3_COLUMNS = {
    "num_frames": pa.float64(), "width": pa.float64(), "height": pa.float64(), "caption": pa.string(),
    "camera.finite": pa.bool_(), "camera.fov_x_min": pa.float64(), "camera.fov_x_max": pa.float64(),
    "camera.fov_y_min": pa.float64(), "camera.fov_y_max": pa.float64(), "camera.focal_div_max": pa.float64(),
    "camera.scale_cov": pa.float64(),
    "metrics.vlm_quality": pa.float64(), "metrics.vlm_reject_flags": pa.list_(pa.string()),
    "metrics.vlm_transition_count": pa.float64(), "metrics.vlm_entity_density": pa.float64(),
    "metrics.vlm_scene_type": pa.string(),
    "metrics.dover_tech": pa.float64(), "metrics.dover_aes": pa.float64(), "metrics.vmaf": pa.float64(),
    "metrics.unimatch": pa.float64(), "metrics.saturation": pa.float64(), "metrics.scene_cuts": pa.float64(),
    "lineage.source_tier": pa.string(), "lineage.geometry_ok": pa.bool_(),
    "lineage.source_width": pa.float64(), "lineage.source_height": pa.float64(),
}

# ---------------------------------------------------------------------------------------------
# Table 3, read from the paper. Row r: a dict of the columns above.


def C(r: dict, fov_hi: float) -> bool:
    """C120 / C125: both FOVs in [25, fov_hi] degrees, focal divergence <= 0.20, scale CoV <= 2."""
    return (r["camera.finite"] and r["camera.fov_x_min"] >= 25 and r["camera.fov_y_min"] >= 25
            and r["camera.fov_x_max"] <= fov_hi and r["camera.fov_y_max"] <= fov_hi
            and r["camera.focal_div_max"] <= 0.20 and r["camera.scale_cov"] <= 2)


def N(r): return r["num_frames"]
def Q(r): return r["metrics.vlm_quality"]
def R(r): return set(r["metrics.vlm_reject_flags"])
def T(r): return r["metrics.vlm_transition_count"]
def E(r): return r["metrics.vlm_entity_density"]
def D(r): return (r["metrics.dover_tech"] + r["metrics.dover_aes"]) / 2
def V(r): return r["metrics.vmaf"]
def U(r): return r["metrics.unimatch"]
def S(r): return r["metrics.saturation"]
def J(r): return r["metrics.scene_cuts"]
def A(r): return bool(r["caption"].strip())
def G(r): return r["lineage.geometry_ok"]
def res(r): return r["width"] == 1280 and r["height"] == 720
def res_src(r): return r["lineage.source_width"] == 1280 and r["lineage.source_height"] == 720
def lineage(r): return r["lineage.source_tier"] in ("high", "xhigh")
def between(x, lo, hi): return lo <= x <= hi


Rule = Callable[[dict], bool]
WALK = {"watermark", "near_static"}
TABLE3: dict[str, tuple[Rule, Rule]] = {  # owner -> (kept rule, xhigh extra)
    "dl3dv_10s": (lambda r: C(r, 120) and between(S(r), 0, 180) and Q(r) >= 4 and D(r) >= .20,
                  lambda r: Q(r) == 5 and D(r) >= .30),
    "dl3dv_60s": (lambda r: C(r, 120) and between(S(r), 0, 180) and Q(r) >= 4 and D(r) >= .20,
                  lambda r: Q(r) == 5 and D(r) >= .30),
    "mind": (lambda r: C(r, 125) and not R(r) and T(r) == 0 and Q(r) >= 4,
             lambda r: Q(r) == 5),
    "abot": (lambda r: C(r, 120) and between(S(r), 0, 180) and not R(r) and T(r) == 0 and Q(r) >= 4,
             lambda r: Q(r) == 5),
    "omniworld": (lambda r: C(r, 120) and between(S(r), 0, 180) and not R(r) and T(r) == 0 and Q(r) >= 4
                  and D(r) >= .30 and between(V(r), .5, 100) and between(U(r), 3, 250),
                  lambda r: Q(r) == 5 and U(r) <= 200),
    "sekai_game": (lambda r: U(r) <= 350 and D(r) >= .20 and between(Q(r), 3, 5) and "blurry" not in R(r),
                   lambda r: between(Q(r), 4, 5) and not R(r)),
    "miradata": (lambda r: A(r) and N(r) >= 81 and C(r, 120) and between(S(r), 0, 180) and Q(r) >= 4
                 and D(r) >= .40 and res(r) and not R(r) and T(r) == 0 and between(V(r), .5, 50)
                 and between(U(r), 3, 120),
                 lambda r: Q(r) == 5 and U(r) <= 100),
    "realcam": (lambda r: N(r) >= 81 and C(r, 120) and between(S(r), 0, 180) and T(r) == 0 and Q(r) >= 4
                and between(V(r), .5, 100) and D(r) >= .30 and between(U(r), 3, 200)
                and not {"blurry", "ui_overlay"} & R(r),
                lambda r: Q(r) == 5 and R(r) <= {"near_static"}),
    "multicamvideo": (lambda r: C(r, 120) and between(S(r), 0, 180) and not R(r) and T(r) == 0 and Q(r) >= 4
                      and D(r) >= .40,
                      lambda r: Q(r) == 5),
    "sekai_walking": (lambda r: A(r) and N(r) >= 81 and C(r, 120) and between(S(r), 0, 180) and T(r) == 0
                      and Q(r) >= 4 and between(V(r), .5, 50) and D(r) >= .35 and between(U(r), 3, 120)
                      and R(r) <= WALK,
                      lambda r: Q(r) == 5 and not R(r)),
    "miradata_clean": (lambda r: lineage(r) and A(r) and N(r) >= 81 and G(r) and res_src(r) and res(r)
                       and between(S(r), 0, 180) and Q(r) >= 4 and D(r) >= .40 and between(V(r), .5, 50)
                       and between(U(r), 3, 120) and not R(r) and T(r) == 0 and between(J(r), 0, 1),
                       lambda r: Q(r) == 5 and D(r) >= .45 and U(r) <= 100),
    "sekai_walking_clean": (lambda r: A(r) and N(r) >= 81 and G(r) and between(S(r), 0, 180) and T(r) == 0
                            and Q(r) >= 4 and D(r) >= .35 and between(U(r), 3, 120) and between(V(r), .5, 50)
                            and E(r) != 3 and R(r) <= WALK,
                            lambda r: Q(r) == 5 and not R(r)),
    "spatialvid": (lambda r: A(r) and N(r) >= 81 and C(r, 120) and between(S(r), 0, 180) and T(r) == 0
                   and Q(r) >= 4 and between(V(r), .5, 50) and D(r) >= .35 and between(U(r), 3, 120)
                   and J(r) == 0 and R(r) <= WALK,
                   lambda r: Q(r) == 5 and not R(r)),
    "spatialvid_clean": (lambda r: A(r) and N(r) >= 81 and G(r) and between(S(r), 0, 180) and T(r) == 0
                         and Q(r) >= 4 and between(V(r), .5, 50) and D(r) >= .35 and between(U(r), 3, 120)
                         and J(r) == 0 and E(r) != 3 and R(r) <= WALK,
                         lambda r: Q(r) == 5 and not R(r)),
}


def table3_tier(r: dict) -> str:
    """The tier Table 3 gives row ``r``."""
    kept, xhigh = TABLE3[r["owner"]]
    return ("xhigh" if xhigh(r) else "high") if kept(r) else "rejected"


# ---------------------------------------------------------------------------------------------
# Rows straddling the thresholds: each number is either typical for a kept clip or one of the
# paper's thresholds of that column, exactly or one float step to either side.

THRESHOLDS = {
    "num_frames": [81], "camera.fov_x_min": [25], "camera.fov_y_min": [25], "camera.fov_x_max": [120, 125],
    "camera.fov_y_max": [120, 125], "camera.focal_div_max": [0.20], "camera.scale_cov": [2],
    "metrics.vlm_quality": [3, 4, 5], "metrics.vlm_transition_count": [0], "metrics.vlm_entity_density": [3],
    "D": [.20, .30, .35, .40, .45], "metrics.vmaf": [.5, 50, 100], "metrics.unimatch": [3, 100, 120, 200, 250, 350],
    "metrics.saturation": [0, 180], "metrics.scene_cuts": [0, 1], "width": [1280], "height": [720],
    "lineage.source_width": [1280], "lineage.source_height": [720],
}
# Mostly inside the loosest bound, so that even owners with 16 gates keep some clips.
TYPICAL: dict[str, Callable[[random.Random], float]] = {
    "num_frames": lambda g: float(g.choice([81, 121, 161, 161, 49])),
    "camera.fov_x_min": lambda g: g.uniform(24, 80), "camera.fov_y_min": lambda g: g.uniform(24, 80),
    "camera.fov_x_max": lambda g: g.uniform(80, 126), "camera.fov_y_max": lambda g: g.uniform(80, 126),
    "camera.focal_div_max": lambda g: g.uniform(0, 0.205), "camera.scale_cov": lambda g: g.uniform(0, 2.02),
    "metrics.vlm_quality": lambda g: float(g.choice([5, 5, 5, 4, 4, 3, 2])),
    "metrics.vlm_transition_count": lambda g: float(g.choice([0] * 19 + [1])),
    "metrics.vlm_entity_density": lambda g: float(g.randrange(0, 5)),
    "D": lambda g: g.uniform(0.15, 0.7),
    "metrics.vmaf": lambda g: g.uniform(0.5, 50) if g.random() < 0.8 else g.uniform(0.3, 110),
    "metrics.unimatch": lambda g: g.uniform(3, 100) if g.random() < 0.8 else g.uniform(2, 380),
    "metrics.saturation": lambda g: g.uniform(-2, 182),
    "metrics.scene_cuts": lambda g: float(g.choice([0] * 18 + [1, 2])),
    "width": lambda g: float(g.choice([1280] * 19 + [1920])), "height": lambda g: float(g.choice([720] * 19 + [1080])),
    "lineage.source_width": lambda g: float(g.choice([1280] * 19 + [960])),
    "lineage.source_height": lambda g: float(g.choice([720] * 19 + [540])),
}


def number(g: random.Random, column: str) -> float:
    """A typical value of `column` (90%) or one of its thresholds, exactly or one float step off."""
    if g.random() < 0.9:
        return float(TYPICAL[column](g))
    t = float(g.choice(THRESHOLDS[column]))
    return g.choice([t, math.nextafter(t, -math.inf), math.nextafter(t, math.inf)])


def random_row(g: random.Random, owner: str) -> dict:
    """One row of exactly Table 3's columns (plus clip_id and owner)."""
    row = {column: number(g, column) for column in TYPICAL if column != "D"}
    d = number(g, "D")  # D is a mean: both DOVER heads at it, or spread around it
    spread = 0.0 if g.random() < 0.5 else g.uniform(-0.1, 0.1)
    row["metrics.dover_tech"], row["metrics.dover_aes"] = d + spread, d - spread
    flags = [f for f in FLAGS if g.random() < 0.05]
    row.update({
        "owner": owner, "caption": g.choice(["a walk through a market"] * 19 + [" \t"]),
        "camera.finite": g.random() < 0.98, "metrics.vlm_reject_flags": flags,
        "metrics.vlm_scene_type": "real_world", "lineage.source_tier": g.choice(["high", "xhigh", "xhigh", "rejected"]),
        "lineage.geometry_ok": g.random() < 0.95,
    })
    return row


def generated(rows_per_owner: int, seed: int) -> list[dict]:
    g = random.Random(seed)
    rows = [random_row(g, owner) for owner in sorted(TABLE3) for _ in range(rows_per_owner)]
    for i, row in enumerate(rows):
        row["clip_id"] = f"c{i:06d}"
    return rows


def arrow_table(rows: list[dict]) -> pa.Table:
    """The rows as a metrics table whose columns are exactly clip_id, owner and Table 3's."""
    data = {"clip_id": pa.array([r["clip_id"] for r in rows]), "owner": pa.array([r["owner"] for r in rows])}
    data.update({c: pa.array([r[c] for r in rows], typ) for c, typ in TABLE3_COLUMNS.items()})
    return pa.table(data)


ROWS = generated(rows_per_owner=1500, seed=29)


def test_generated_rows_have_exactly_table3_columns_and_reach_every_tier():
    assert set(ROWS[0]) == set(TABLE3_COLUMNS) | {"clip_id", "owner"}
    assert "camera.pose_units" not in ROWS[0]
    for owner in TABLE3:  # the draw straddles the thresholds: every owner sees every tier
        tiers = {table3_tier(r) for r in ROWS if r["owner"] == owner}
        assert tiers == {"xhigh", "high", "rejected"}, owner


def test_meta_json_path_gives_table3_tiers():
    table, errors = records_to_table(ROWS)
    assert "camera.pose_units" not in table.column_names and not errors
    result = evaluate(POLICY, table, errors).table.to_pylist()
    mismatches = [(r["owner"], out["tier"], table3_tier(r), out["reasons"])
                  for r, out in zip(ROWS, result) if out["tier"] != table3_tier(r)]
    assert mismatches == []
    assert all(bool(out["reasons"]) == (out["tier"] == "rejected") for out in result)


def test_metrics_parquet_cli_path_gives_table3_tiers(tmp_path, capsys):
    metrics, out = tmp_path / "metrics.parquet", tmp_path / "tiers.parquet"
    pq.write_table(arrow_table(ROWS), metrics)
    assert select_command(metrics=str(metrics), out=str(out)) == 0
    summary = json.loads(capsys.readouterr().out)
    tiers = pq.read_table(out).to_pylist()
    assert [t["clip_id"] for t in tiers] == [r["clip_id"] for r in ROWS]
    assert [t["tier"] for t in tiers] == [table3_tier(r) for r in ROWS]
    expected = {tier: sum(table3_tier(r) == tier for r in ROWS) for tier in ("xhigh", "high", "rejected")}
    assert summary["tiers"] == expected and summary["clips"] == len(ROWS)
    assert all(not reason.startswith("camera.pose_units") for t in tiers for reason in t["reasons"])


CAMERA_GATED = sorted(o for o in TABLE3 if any(c.columns == ("camera.scale_cov",) for c in POLICY.owners[o].kept))


def relative_rows(with_scale: bool) -> list[dict]:
    """Rows Table 3 would keep, except that their poses are only up to scale."""
    rows = []
    for owner in CAMERA_GATED:
        row = next(r for r in ROWS if r["owner"] == owner and table3_tier(r) != "rejected")
        row = {**row, "camera.pose_units": "relative"}
        if not with_scale:
            del row["camera.scale_cov"]  # what camera_integrity writes for relative poses
        rows.append(row)
    return rows


@pytest.mark.parametrize("with_scale", [False, True], ids=["annotated", "foreign_scale_value"])
def test_relative_poses_are_rejected_with_a_named_reason(with_scale, tmp_path, capsys):
    assert CAMERA_GATED  # every owner with C120 / C125
    rows = relative_rows(with_scale)
    reason = f"camera.scale_cov: {RELATIVE_SCALE}"
    table, errors = records_to_table(rows)
    for out in evaluate(POLICY, table, errors).table.to_pylist():
        assert (out["tier"], out["reasons"]) == ("rejected", [reason]), out["owner"]

    # The same rows as a metrics parquet through `solarwm data select --metrics`.
    columns = {**TABLE3_COLUMNS, "camera.pose_units": pa.string()}
    data = {c: pa.array([r.get(c) for r in rows], typ) for c, typ in columns.items()}
    if not with_scale:
        del data["camera.scale_cov"]
    metrics = tmp_path / "relative.parquet"
    pq.write_table(pa.table({"clip_id": [r["clip_id"] for r in rows], "owner": [r["owner"] for r in rows], **data}),
                   metrics)
    assert select_command(metrics=str(metrics), out=str(tmp_path / "tiers.parquet")) == 0
    capsys.readouterr()
    tiers = pq.read_table(tmp_path / "tiers.parquet").to_pylist()
    assert [(t["tier"], t["reasons"]) for t in tiers] == [("rejected", [reason])] * len(rows)


def test_metric_poses_keep_their_table3_tier_when_pose_units_is_present():
    rows = [{**r, "camera.pose_units": "metric"} for r in ROWS[::7]]
    table, errors = records_to_table(rows)
    result = evaluate(POLICY, table, errors).table.to_pylist()
    assert [out["tier"] for out in result] == [table3_tier(r) for r in rows]
