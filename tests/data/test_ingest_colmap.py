"""Video-only sources through the default ``colmap`` path, and the true depth of ``data synth --depth``.

The five video-only sources differ only in how they list and load their native layout (covered
per source by test_ingest_video_sources.py); every decoded window then takes the same estimator
path. So one source, SpatialVID (mp4s in a tar.gz), goes end to end through the CLI here: ingest
with the oracle depth model → a ``metric`` clip naming both estimators → the trajectory matches
the truth with no scale fitted → ``annotate --stages camera`` → the policy's metric camera gate
(C120) passes. The rest of the spatialvid row (caption, VLM, DOVER, UniMatch) needs models that
do not run here, so only the camera gate is checked. Slow: K is unknown, so SIFT runs on
2×-enlarged frames (minutes on a loaded core).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from solarwm.camera.sim3 import trajectory_errors
from solarwm.cli import main
from solarwm.data.annotate.runner import annotate_command
from solarwm.data.contract import clip_id, iter_clip_dirs, read_clip, read_meta
from solarwm.data.estimators.depth import OracleDepth
from solarwm.data.policy import evaluate, load_policy
from solarwm.data.policy.table import flatten_meta, records_to_table
from solarwm.data.sources.render import depth_views
from solarwm.data.sources.synthetic import make_scene, synth_corpus
from solarwm.data.video import read_video

from native_fixtures import make_world, world_mp4, write_spatialvid

POLICY = load_policy(Path(__file__).resolve().parents[2] / "recipes/policies/solarwm-v1.yaml")
W, H, FPS, N = 160, 120, 16.0, 81


def test_synth_depth_is_a_sidecar_the_oracle_reads(tmp_path):
    plain, deep = tmp_path / "plain", tmp_path / "deep"
    synth_corpus(plain, clips=1, frames=5, width=32, height=24, seed=3)
    synth_corpus(deep, clips=1, frames=5, width=32, height=24, seed=3, depth=True)
    (a,), (b,) = list(iter_clip_dirs(plain)), list(iter_clip_dirs(deep))
    assert not (a / "depth.npy").exists()  # the default output is unchanged
    assert np.array_equal(np.load(a / "poses.npy"), np.load(b / "poses.npy"))
    depth = np.load(b / "depth.npy")
    assert depth.shape == (5, 24, 32) and depth.dtype == np.float32
    assert (depth[np.isfinite(depth)] > 0).all() and np.isfinite(depth).mean() > 0.3
    frames = read_video(b / "video.mp4")
    assert np.array_equal(OracleDepth(deep).predict(np.asarray(frames[2])).depth, depth[2])


@pytest.mark.slow
def test_spatialvid_through_colmap_with_the_oracle_depth_is_kept_metric(tmp_path, capsys):
    world = make_world(N, FPS, 0, width=W, height=H)
    native, corpus, oracle = tmp_path / "native", tmp_path / "corpus", tmp_path / "oracle" / "clip0"
    video = world_mp4(N, FPS, 0, width=W, height=H)
    write_spatialvid(native, video, ["uuid-metric"])
    oracle.mkdir(parents=True)
    (oracle / "video.mp4").write_bytes(video)
    scene = make_scene(np.random.default_rng(0), world.c2w)  # the world make_world rendered
    np.save(oracle / "depth.npy", depth_views(scene, world.c2w, world.K, W, H))
    args = ["data", "ingest", "--source", "spatialvid", "--root", str(native), "--out", str(corpus),
            "--spec", "81f", "--depth_model", f"oracle:{oracle.parent}"]
    assert main(args) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["clips"] == {"written": 1, "skipped": 0, "failed": 0}, summary

    cid = clip_id("spatialvid", "uuid-metric", 0, N)
    clip = read_clip(corpus / cid)
    prov = clip.provenance
    assert clip.meta["pose_units"] == prov["pose_units"] == "metric"
    assert prov["estimator"]["name"] == "colmap" and prov["estimator"]["version"].startswith("1+pycolmap-")
    assert prov["depth_model"]["name"] == "oracle"
    err = trajectory_errors(clip.c2w, world.c2w)
    assert err["rot_max_deg"] <= 2.0 and abs(err["scale"] - 1) <= 0.05, err
    assert abs(clip.K[0, 0] / world.K[0, 0] - 1) <= 0.05

    assert annotate_command(str(corpus), stages=["camera"]) == 0
    doc = read_meta(corpus / cid)
    assert doc["metrics"]["camera.pose_units"] == "metric"
    table, errors = records_to_table([flatten_meta(doc)])
    row = evaluate(POLICY, table, errors).table.to_pylist()[0]
    assert not [r for r in row["reasons"] if r.startswith("camera.")], row["reasons"]


def test_the_bridge_runs_colmap_incremental_and_the_rest_of_ingest_checked():
    # The bridge checks every window against the source's own poses; colmap's global second opinion and its
    # split-half check would only cost it windows (it is wrong on mostly-forward known-K clips:
    # docs/results/2026-12-pose-estimation.md).
    from solarwm.data.sources.ingest import IngestConfig, _estimator

    cfg = IngestConfig("sekai_game", "native", "corpus", "81f")
    assert cfg.estimator == "colmap"
    assert _estimator(cfg).opts.mapper == "checked" and _estimator(cfg).opts.split_pos_frac is not None
    bridge = _estimator(cfg, bridged=True).opts
    assert bridge.mapper == "incremental" and bridge.split_pos_frac is None
