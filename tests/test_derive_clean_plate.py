"""``data derive --transform clean-plate``: lineage, geometry sliced from the parent, nothing copied, accounting, resume.

The Clean Plate model itself needs the LTX-2.3 weights; here the transform is a plain Lanczos
resize so the lineage path (everything around the model) runs on the CPU.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np

from solarwm.camera.intrinsics import resize_intrinsics
from solarwm.data.annotate.runner import annotate_command
from solarwm.data.contract import Clip, clip_id, iter_clip_dirs, read_clip, write_clip
from solarwm.data.derive import CLEAN_OF, derive_corpus, resize_frames, slice_plan


def parent(corpus, owner, name, n, units="metric", size=(64, 36)):
    rng = np.random.default_rng(len(name))
    w, h = size
    c2w = np.stack([np.eye(4)] * n)
    c2w[:, 0, 3] = np.linspace(0, 1, n)
    K = np.tile([50.0, 50.0, w / 2, h / 2], (n, 1))
    K[:, 0] += np.arange(n)  # per-frame K, so a wrong slice would show
    K[:, 1] = K[:, 0]
    meta = {"fps": 16.0, "pose_units": units}
    clip = Clip(clip_id(owner, name, 0, n), rng.integers(0, 255, (n, h, w, 3), dtype=np.uint8), c2w, K,
                "a parent caption", meta, metrics={"metrics.vmaf": 3.0, "camera.fov_x_min": 40.0},
                provenance={"owner": owner, "original_id": name, "frame_interval": [0, n]},
                selection={"tier": "high", "reasons": []})
    return write_clip(clip, corpus)


def upscale(frames, caption):
    return resize_frames(frames, 128, 72)


def test_slice_plan():
    assert slice_plan(960) == (0, 160) and slice_plan(160) == (0, 160)
    assert slice_plan(100) == (9, 90) and slice_plan(81) == (0, 81) and slice_plan(80) is None


def test_lineage_accounting_and_resume(tmp_path, capsys):
    src, out = tmp_path / "src", tmp_path / "out"
    good = parent(src, "sekai_walking", "walk", 96)
    parent(src, "spatialvid", "rel", 96, units="relative")
    parent(src, "synthetic", "world", 96)
    parent(src, "miradata", "short", 40)
    summary = derive_corpus(src, out, upscale)
    assert summary["line"] == "parents 4 = derived 1 + already derived 0 + failed 3"
    reasons = sorted(r["reason"] for r in summary["failed_parents"])
    assert reasons == ["metric_scale_unrecoverable", "not_a_clean_plate_source", "parent_too_short"]

    [derived_dir] = iter_clip_dirs(out)
    p, d = read_clip(good), read_clip(derived_dir)
    start, end = slice_plan(96)
    assert d.owner == CLEAN_OF["sekai_walking"] == "sekai_walking_clean"
    lineage = d.provenance["lineage"]
    assert lineage["parent_clip_id"] == p.clip_id and lineage["parent_interval"] == [start, end]
    assert (lineage["source_width"], lineage["source_height"], lineage["source_tier"]) == (64, 36, "high")
    assert d.clip_id == clip_id("sekai_walking_clean", p.clip_id, start, end)
    assert np.array_equal(d.c2w, p.c2w[start:end])
    assert np.allclose(d.K, resize_intrinsics(p.K[start:end], 2.0, 2.0))
    assert {"name": "resize_intrinsics", "version": "1", "scale": [2.0, 2.0]} in d.provenance["conversions"]
    assert (d.meta["width"], d.meta["height"], d.meta["num_frames"], d.meta["fps"]) == (128, 72, 81, 16.0)
    # Nothing is copied: no metric, no caption, no selection — the clip is annotated afresh.
    assert d.metrics == {} and d.caption == "" and d.selection is None
    assert annotate_command(str(out), stages=["camera", "saturation"]) == 0
    capsys.readouterr()
    annotated = read_clip(derived_dir, load_video=False)
    assert annotated.metrics["camera.pose_units"] == "metric" and "metrics.saturation" in annotated.metrics
    assert annotated.metrics["camera.fov_x_min"] != 40.0

    again = derive_corpus(src, out, upscale)
    assert again["line"] == "parents 4 = derived 0 + already derived 1 + failed 3"
    assert len(iter_clip_dirs(out)) == 1
    ledger = [json.loads(x) for x in (out / "derive_ledger.jsonl").read_text().splitlines()]
    assert len(ledger) == 8 and {r["status"] for r in ledger} == {"derived", "cached", "failed"}


def test_cli_without_weights_exits_2_with_one_line(tmp_path):
    cmd = [sys.executable, "-m", "solarwm.cli", "data", "derive", "--corpus", str(tmp_path), "--out", str(tmp_path / "o")]
    r = subprocess.run(cmd, capture_output=True, text=True, env={"PATH": "", "HOME": str(tmp_path)})
    assert r.returncode == 2 and "clean_plate_unavailable" in r.stderr
    r = subprocess.run(cmd + ["--weights", str(tmp_path)], capture_output=True, text=True)
    assert r.returncode == 2 and "model_index.json" in r.stderr
