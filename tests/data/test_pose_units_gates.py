"""Relative (up-to-scale) poses fail the metric camera gates by name, through the one integrity check and engine."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from solarwm.camera.integrity import camera_integrity
from solarwm.data.annotate.runner import annotate_command
from solarwm.data.contract import Clip, ClipError, clip_id, read_meta, write_clip
from solarwm.data.policy import evaluate, load_policy
from solarwm.data.policy.table import flatten_meta, records_to_table

POLICY = load_policy(Path(__file__).resolve().parents[2] / "recipes/policies/solarwm-v1.yaml")


def test_integrity_leaves_out_scale_for_relative_poses():
    c2w, K = np.stack([np.eye(4)] * 3), np.tile([32.0, 32.0, 32.0, 32.0], (3, 1))
    metric = camera_integrity(c2w, K, 64, 64)
    relative = camera_integrity(c2w, K, 64, 64, pose_units="relative")
    assert metric["camera.pose_units"] == "metric" and metric["camera.scale_cov"] == 0.0
    assert relative["camera.pose_units"] == "relative" and "camera.scale_cov" not in relative
    assert relative["camera.fov_x_min"] == metric["camera.fov_x_min"]  # scale-free keys are still computed
    with pytest.raises(ValueError, match="pose_units"):
        camera_integrity(c2w, K, 64, 64, pose_units="furlongs")


def write(corpus: Path, name: str, units: str | None) -> Path:
    rng = np.random.default_rng(0)
    c2w = np.stack([np.eye(4)] * 4)
    c2w[:, 0, 3] = np.arange(4) * 0.1
    meta = {"fps": 8.0} if units is None else {"fps": 8.0, "pose_units": units}
    clip = Clip(clip_id(name, name, 0, 4), rng.integers(0, 255, (4, 32, 32, 3), dtype=np.uint8), c2w,
                np.tile([30.0, 30.0, 16.0, 16.0], (4, 1)), "a clip", meta, provenance={"owner": "dl3dv_10s"})
    return write_clip(clip, corpus)


def test_relative_clip_fails_the_camera_gate_with_the_reason_named(tmp_path, capsys):
    corpus = tmp_path / "c"
    metric, default, relative = write(corpus, "m", "metric"), write(corpus, "d", None), write(corpus, "r", "relative")
    assert annotate_command(str(corpus), stages=["camera"]) == 0
    capsys.readouterr()
    docs = {p.name: read_meta(p) for p in (metric, default, relative)}
    assert docs[relative.name]["metrics"]["camera.pose_units"] == "relative"
    assert docs[default.name]["metrics"]["camera.pose_units"] == "metric"  # absent means metric
    table, errors = records_to_table([flatten_meta(d) for d in docs.values()])
    rows = {r["clip_id"]: r for r in evaluate(POLICY, table, errors).table.to_pylist()}
    camera_reasons = [
        [x for x in rows[p.name]["reasons"] if x.startswith("camera.")] for p in (metric, default, relative)
    ]
    assert camera_reasons[:2] == [[], []]
    # Table 3's C120 does not read camera.pose_units; the scale CoV it needs is undefined for relative poses.
    assert camera_reasons[2] == ["camera.scale_cov: undefined for relative poses (camera.pose_units=relative)"]
    assert rows[relative.name]["tier"] == "rejected"


def test_contract_refuses_unknown_pose_units(tmp_path):
    with pytest.raises(ClipError, match="pose_units"):
        write(tmp_path, "x", "feet")
    assert not any(tmp_path.iterdir())
    assert json.loads((write(tmp_path, "y", "relative") / "meta.json").read_text())["meta"]["pose_units"] == "relative"
