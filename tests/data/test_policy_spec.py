"""Policy YAML validation, the metrics-parquet path and the corpus path of `solarwm data select`."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from solarwm.data.accounting import account
from solarwm.data.contract import Clip, clip_id, read_meta, write_clip
from solarwm.data.policy import PolicyError, evaluate, load_policy, parse_policy
from solarwm.data.policy.cli import select_command
from solarwm.data.policy.table import flatten_meta, records_to_table

SHIPPED = Path(__file__).resolve().parents[2] / "recipes/policies/solarwm-v1.yaml"
BASE = {
    "policy": "test", "version": "1",
    "owners": {"mind": {"kept": [{"range": {"column": "metrics.vlm_quality", "min": 4}}],
                        "xhigh": [{"eq": {"column": "metrics.vlm_quality", "value": 5}}]}},
}


def with_change(path: list, value, delete: bool = False) -> dict:
    doc = copy.deepcopy(BASE)
    node = doc
    for key in path[:-1]:
        node = node[key]
    if delete:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return doc


KEPT = ["owners", "mind", "kept", 0]
BAD_DOCS = [
    ("unknown top-level key", with_change(["extra"], 1), "top level: unknown key(s) ['extra']"),
    ("missing version", with_change(["version"], None, delete=True), "missing key(s) ['version']"),
    ("numeric version", with_change(["version"], 1), "version: expected a non-empty string"),
    ("empty name", with_change(["policy"], " "), "policy: expected a non-empty string"),
    ("unknown owner", with_change(["owners", "youtube"], BASE["owners"]["mind"]), "owners.youtube: unknown owner id"),
    ("unknown owner key", with_change(["owners", "mind", "promote"], []), "owners.mind: unknown key(s) ['promote']"),
    ("missing xhigh", with_change(["owners", "mind", "xhigh"], None, delete=True),
     "owners.mind: missing key(s) ['xhigh']"),
    ("empty kept", with_change(["owners", "mind", "kept"], []), "a kept rule needs at least one gate"),
    ("unknown gate", with_change(KEPT, {"between": {"column": "metrics.vmaf"}}), "unknown gate 'between'"),
    ("two keys", with_change(KEPT, {"empty": "metrics.vlm_reject_flags", "is_true": "camera.finite"}),
     "exactly one key"),
    ("unknown column", with_change(KEPT, {"range": {"column": "metrics.vmaf_motion", "min": 1}}),
     "kept[0].range.column: unknown column 'metrics.vmaf_motion'"),
    ("wrong column kind", with_change(KEPT, {"range": {"column": "caption", "min": 1}}),
     "gate 'range' cannot read 'caption' (a text column)"),
    ("min > max", with_change(KEPT, {"range": {"column": "metrics.vmaf", "min": 5, "max": 1}}),
     "malformed interval: min 5.0 > max 1.0"),
    ("non-numeric bound", with_change(KEPT, {"range": {"column": "metrics.vmaf", "min": "0.5"}}),
     "kept[0].range.min: expected a finite number, got '0.5'"),
    ("bool bound", with_change(KEPT, {"range": {"column": "metrics.vmaf", "max": True}}), "expected a finite number"),
    ("nan bound", with_change(KEPT, {"range": {"column": "metrics.vmaf", "max": float("nan")}}),
     "expected a finite number"),
    ("no bound", with_change(KEPT, {"range": {"column": "metrics.vmaf"}}), "an interval needs min, max or both"),
    ("unknown interval key", with_change(KEPT, {"range": {"column": "metrics.vmaf", "minimum": 1}}),
     "unknown key(s) ['minimum']"),
    ("camera gate", with_change(KEPT, {"camera": "C130"}), "unknown camera gate 'C130'"),
    ("empty allowed set", with_change(KEPT, {"subset_of": {"column": "metrics.vlm_reject_flags", "allowed": []}}),
     "expected a non-empty list of strings"),
    ("eq text with number", with_change(KEPT, {"eq": {"column": "lineage.source_tier", "value": 1}}),
     "expected a string"),
    ("mean of one column", with_change(KEPT, {"mean": {"columns": ["metrics.dover_tech"], "min": 0.2}}),
     "at least two columns"),
    ("resolution without height", with_change(KEPT, {"resolution": {"width": 1280}}), "missing key(s) ['height']"),
    ("gate list not a list", with_change(["owners", "mind", "xhigh"], {"eq": 1}), "expected a list of gates"),
]


@pytest.mark.parametrize("doc,message", [(d, m) for _, d, m in BAD_DOCS], ids=[n for n, _, _ in BAD_DOCS])
def test_bad_policy_is_a_named_error(doc, message, tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(PolicyError) as err:
        load_policy(path)
    assert message in str(err.value) and str(path) in str(err.value)


def test_duplicate_yaml_keys_and_unparsable_files_are_errors(tmp_path):
    path = tmp_path / "dup.yaml"
    path.write_text(SHIPPED.read_text().replace("  mind:\n", "  abot:\n", 1))
    with pytest.raises(PolicyError, match="duplicate key 'abot'"):
        load_policy(path)
    path.write_text("policy: [unclosed")
    with pytest.raises(PolicyError, match="cannot read policy"):
        load_policy(path)
    with pytest.raises(PolicyError, match="cannot read policy"):
        load_policy(tmp_path / "absent.yaml")


def test_bad_policy_touches_no_clip(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(with_change(KEPT, {"range": {"column": "metrics.nope", "min": 1}})))
    table = pa.table({"clip_id": ["a"], "owner": ["mind"], "metrics.vlm_quality": [5.0]})
    pq.write_table(table, tmp_path / "m.parquet")
    assert select_command(metrics=str(tmp_path / "m.parquet"), out=str(tmp_path / "t.parquet"), policy=str(bad)) == 2
    assert not (tmp_path / "t.parquet").exists()


def test_shipped_policy_parses_and_gate_texts_read_like_table3():
    policy = load_policy(SHIPPED)
    texts = [check.text for check in policy.owners["omniworld"].kept]
    assert "metrics.vmaf in [0.5, 100]" in texts and "metrics.unimatch in [3, 250]" in texts
    assert "mean(metrics.dover_tech, metrics.dover_aes) >= 0.3" in texts
    assert [c.text for c in policy.owners["mind"].kept][:5] == [
        "camera.finite is true", "camera.fov_x_min >= 25", "camera.fov_x_max <= 125", "camera.fov_y_min >= 25",
        "camera.fov_y_max <= 125"]
    assert parse_policy(yaml.safe_load(SHIPPED.read_text())) == policy.__class__(
        policy.name, policy.version, policy.owners, source="<policy>")


def metrics_rows() -> list[dict]:
    good = {"metrics.vlm_quality": 5.0, "metrics.vlm_reject_flags": [], "metrics.vlm_transition_count": 0.0,
            "camera.finite": True, "camera.fov_x_min": 60.0, "camera.fov_x_max": 60.0, "camera.fov_y_min": 40.0,
            "camera.fov_y_max": 40.0, "camera.focal_div_max": 0.0, "camera.scale_cov": 0.0,
            "camera.pose_units": "metric"}
    return [
        {"clip_id": "a", "owner": "mind", **good},
        {"clip_id": "b", "owner": "mind", **good, "metrics.vlm_quality": 4.0},
        {"clip_id": "c", "owner": "mind", **good, "metrics.vlm_reject_flags": ["blurry", "nsfw"],
         "metrics.vlm_quality": None},
        {"clip_id": "d", "owner": "unknown_source", **good},
    ]


def test_metrics_parquet_round_trip(tmp_path, capsys):
    source = pa.Table.from_pylist(metrics_rows())
    pq.write_table(source, tmp_path / "metrics.parquet")
    out = tmp_path / "sel" / "tiers.parquet"
    assert select_command(metrics=str(tmp_path / "metrics.parquet"), out=str(out), policy=str(SHIPPED)) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["tiers"] == {"xhigh": 1, "high": 1, "rejected": 2}
    assert summary["owners"]["mind"]["top_reasons"] == {"metrics.vlm_reject_flags empty": 1,
                                                        "metrics.vlm_quality >= 4": 1}
    tiers = pq.read_table(out)
    assert tiers.schema.field("reasons").type == pa.list_(pa.string())
    assert tiers.to_pylist() == [
        {"clip_id": "a", "owner": "mind", "tier": "xhigh", "reasons": []},
        {"clip_id": "b", "owner": "mind", "tier": "high", "reasons": []},
        {"clip_id": "c", "owner": "mind", "tier": "rejected",
         "reasons": ["metrics.vlm_reject_flags=[blurry, nsfw] not empty", "metrics.vlm_quality: missing"]},
        {"clip_id": "d", "owner": "unknown_source", "tier": "rejected", "reasons": ["owner: no policy"]},
    ]
    assert tiers.equals(evaluate(load_policy(SHIPPED), source).table)
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".")]  # no temporary left


def test_select_command_argument_errors(tmp_path, capsys):
    assert select_command() == 2
    assert select_command(corpus=str(tmp_path), metrics="m.parquet", out="t.parquet") == 2
    assert select_command(metrics="m.parquet") == 2
    assert select_command(metrics=str(tmp_path / "absent.parquet"), out=str(tmp_path / "t.parquet"),
                          policy=str(SHIPPED)) == 2
    (tmp_path / "junk.parquet").write_text("not parquet")
    assert select_command(metrics=str(tmp_path / "junk.parquet"), out=str(tmp_path / "t.parquet"),
                          policy=str(SHIPPED)) == 2
    assert "cannot read metrics parquet" in capsys.readouterr().err


def write_fixture_clip(corpus: Path, owner: str, name: str, metrics: dict, stages: dict | None = None) -> Path:
    """A tiny real clip (4 frames of 16x16 H.264) with the given metrics."""
    rng = np.random.default_rng(len(name))
    c2w = np.repeat(np.eye(4)[None], 4, axis=0)
    K = np.repeat([[20.0, 20.0, 8.0, 8.0]], 4, axis=0)
    clip = Clip(clip_id=clip_id(owner, name, 0, 4), frames=rng.integers(0, 255, (4, 16, 16, 3), dtype=np.uint8),
                c2w=c2w, K=K, caption=f"a clip called {name}", meta={"fps": 8.0}, metrics=metrics,
                provenance={"owner": owner, "original_id": name, "frame_interval": [0, 4], "conversions": [],
                            "versions": {}, "stages": stages or {}})
    return write_clip(clip, corpus)


def test_corpus_select_writes_selection_and_accounts(tmp_path, capsys):
    camera = {"camera.finite": True, "camera.fov_x_min": 53.0, "camera.fov_x_max": 53.0, "camera.fov_y_min": 53.0,
              "camera.fov_y_max": 53.0, "camera.focal_div_max": 0.0, "camera.scale_cov": 0.0,
              "camera.pose_units": "metric"}
    cpu = {**camera, "metrics.saturation": 90.0, "metrics.scene_cuts": 0, "metrics.flow_dis": 3.0}
    corpus = tmp_path / "corpus"
    xhigh = write_fixture_clip(corpus, "synthetic", "xhigh", {**cpu, "metrics.vmaf": 10.0})
    high = write_fixture_clip(corpus, "synthetic", "high", {**cpu, "metrics.vmaf": 75.0})
    mistyped = write_fixture_clip(corpus, "synthetic", "mistyped", {**cpu, "metrics.vmaf": "fast"})
    failed = write_fixture_clip(corpus, "synthetic", "failed", cpu,
                                stages={"vmaf": {"status": "failed", "version": "1", "error": "ffmpeg missing"}})

    assert select_command(corpus=str(corpus), policy=str(SHIPPED)) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["accounting"] == "ingested 4 = kept-xhigh 1 + kept-high 1 + rejected 1 + failed 1"
    assert summary["failed_not_selected"] == 1 and summary["unreadable"] == []
    assert read_meta(xhigh)["selection"] == {"policy": "solarwm-v1", "version": "1.0.1", "tier": "xhigh",
                                             "reasons": []}
    assert read_meta(high)["selection"]["tier"] == "high"
    assert read_meta(mistyped)["selection"]["reasons"] == ["metrics.vmaf: not numeric (str)"]
    assert "selection" not in read_meta(failed)
    assert account(corpus).balanced()

    before = {p: p.stat().st_mtime_ns for p in (xhigh, high, mistyped)}
    assert select_command(corpus=str(corpus), policy=str(SHIPPED)) == 0  # rerun: same result, nothing rewritten
    assert json.loads(capsys.readouterr().out)["tiers"] == summary["tiers"]
    assert {p: p.stat().st_mtime_ns for p in before} == before


def test_flatten_meta_maps_the_documented_keys():
    doc = {"clip_id": "x", "caption": "c", "meta": {"num_frames": 81, "width": 1280, "height": 720, "fps": 24.0},
           "metrics": {"metrics.vmaf": 3.0, "camera.finite": True},
           "provenance": {"owner": "miradata_clean", "lineage": {"source_tier": "high", "geometry_ok": True}}}
    assert flatten_meta(doc) == {"clip_id": "x", "owner": "miradata_clean", "num_frames": 81, "width": 1280,
                                 "height": 720, "caption": "c", "metrics.vmaf": 3.0, "camera.finite": True,
                                 "lineage.source_tier": "high", "lineage.geometry_ok": True}
    table, errors = records_to_table([flatten_meta(doc), {"clip_id": "y", "owner": "mind", "metrics.vmaf": "x"}])
    assert errors == {"metrics.vmaf": {1: "not numeric (str)"}}
    assert table.column("metrics.vmaf").to_pylist() == [3.0, None]
