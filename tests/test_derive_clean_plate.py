"""``data derive --transform clean-plate``: lineage, geometry sliced from the parent, nothing copied, accounting, resume.

The lineage tests use a plain Lanczos resize as the transform. ``test_tiny_ltx23_pipeline_end_to_end``
runs the real path: diffusers' ``LTX2InContextPipeline`` with the same component classes as LTX-2.3
(random weights, tiny configs), saved with ``save_pretrained`` and loaded by ``CleanPlate.from_local``
with an IC-LoRA safetensors file in the LTX-2 trainer's key layout.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np

from solarwm.camera.intrinsics import resize_intrinsics
from solarwm.data.annotate.runner import annotate_command
from solarwm.data.accounting import account
from solarwm.data.contract import Clip, clip_id, iter_clip_dirs, read_clip, read_meta, write_clip
from solarwm.data.derive import CLEAN_OF, derive_corpus, model_frames, resize_frames, slice_plan


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


def derived_dirs(out):
    """Folders of ``out`` holding a derived clip (failed records have only meta.json)."""
    return [d for d in iter_clip_dirs(out) if (d / "video.mp4").is_file()]


def test_slice_plan_and_model_frames():
    assert slice_plan(960) == (0, 160) and slice_plan(160) == (0, 160)
    assert slice_plan(100) == (9, 90) and slice_plan(81) == (0, 81) and slice_plan(80) is None
    # The reference (§11): the model runs 121 frames at 24 fps for 81 at 16 fps, 241 for 160.
    assert model_frames(81) == 121 and model_frames(160) == 241


def test_lineage_accounting_and_resume(tmp_path, capsys):
    src, out = tmp_path / "src", tmp_path / "out"
    good = parent(src, "sekai_walking", "walk", 96)
    parent(src, "spatialvid", "rel", 96, units="relative")
    parent(src, "synthetic", "world", 96)
    parent(src, "miradata", "short", 40)
    summary = derive_corpus(src, out, upscale)
    assert summary["line"] == "parents 4 = derived 1 + already derived 0 + failed 2 + not a Clean Plate source 1"
    reasons = sorted(r["reason"] for r in summary["failed_parents"])
    assert reasons == ["metric_scale_unrecoverable", "parent_too_short"]
    # Eligible parents = derived + failed, and the corpus accounting sees the same: the failures are
    # failed clip records in OUT with their reason; the synthetic parent is in the ledger only.
    assert summary["eligible"] == 3 == summary["derived"] + summary["failed"]
    acc = account(out).total()
    assert (acc["ingested"], acc["failed"], acc["pending"]) == (3, 2, 1)
    errors = sorted(f["error"].split(":")[0] for f in account(out).failures)
    assert errors == ["metric_scale_unrecoverable", "parent_too_short"]
    assert {f["stage"] for f in account(out).failures} == {"derive"}
    short = read_meta(out / clip_id("miradata_clean", clip_id("miradata", "short", 0, 40), 0, 0))
    assert short["provenance"]["lineage"]["parent_clip_id"] == clip_id("miradata", "short", 0, 40)

    [derived_dir] = derived_dirs(out)
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
    assert again["line"] == "parents 4 = derived 0 + already derived 1 + failed 2 + not a Clean Plate source 1"
    assert len(iter_clip_dirs(out)) == 3 and len(derived_dirs(out)) == 1
    ledger = [json.loads(x) for x in (out / "derive_ledger.jsonl").read_text().splitlines()]
    assert len(ledger) == 8 and {r["status"] for r in ledger} == {"derived", "cached", "failed", "skipped"}


def test_cli_without_weights_exits_2_with_one_line(tmp_path):
    cmd = [sys.executable, "-m", "solarwm.cli", "data", "derive", "--corpus", str(tmp_path), "--out", str(tmp_path / "o")]
    r = subprocess.run(cmd, capture_output=True, text=True, env={"PATH": "", "HOME": str(tmp_path)})
    assert r.returncode == 2 and "clean_plate_unavailable" in r.stderr
    r = subprocess.run(cmd + ["--weights", str(tmp_path)], capture_output=True, text=True)
    assert r.returncode == 2 and "model_index.json" in r.stderr
