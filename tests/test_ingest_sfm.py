"""`data ingest --estimator cpu-sfm`, end to end on a rendered world whose metric trajectory is known.

The five video-only sources (dl3dv, miradata, spatialvid, sekai_walking, mind) differ only in how
they list and load their native layout (covered per source by test_ingest_video_sources.py); each
decoded window then takes the same estimator path (``ingest._window_poses``). So one source,
SpatialVID (mp4s in a tar.gz), goes through the whole path here: CLI ingest → clip with
``pose_units: relative`` and the estimator named in provenance → poses checked against the truth
after Sim(3) → ``annotate --stages camera`` → the policy engine fails the metric camera gate by
name. The frames are 160×120 (at 128×96 too few corners survive the 125° turn to score a focal).

Bound: on this world (81 frames at 16 fps, walk-and-turn arc, K estimated) cpu-sfm's largest
rotation error after a Sim(3) fit of camera centres was 4.7° (focal within 4%); the test asserts
8°. The same arc through the worlds of seeds 1 and 2 gave 24° and 27° without a failure being
raised: a long fast turn is where cpu-sfm is weakest, so this is a path test, not an accuracy claim.

The non-metric ground-truth sources (abot, sekai_game) need a *metric* reference estimator for
their scale bridge: cpu-sfm declares relative units and is refused with
``metric_reference_not_metric`` before it runs, each window failing closed.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from scipy.spatial.transform import Rotation

from native_fixtures import make_world, world_mp4, write_abot, write_sekai_game, write_spatialvid
from solarwm.camera.sim3 import robust_umeyama
from solarwm.cli import main
from solarwm.data.accounting import account
from solarwm.data.annotate.runner import annotate_command
from solarwm.data.contract import clip_id, iter_clip_dirs, read_clip, read_meta
from solarwm.data.estimators import get_estimator
from solarwm.data.policy import evaluate, load_policy
from solarwm.data.policy.table import RELATIVE_SCALE, flatten_meta, records_to_table
from solarwm.data.sources.ingest import ingest

POLICY = load_policy(Path(__file__).resolve().parents[1] / "recipes/policies/solarwm-v1.yaml")
W, H, FPS, N = 160, 120, 16.0, 81  # one whole 81f window at the spec's own rate: frame j is source frame j
ROT_BOUND_DEG = 8.0


def test_spatialvid_through_cpu_sfm_keeps_a_relative_clip_that_fails_the_metric_gate(tmp_path, capsys):
    world = make_world(N, FPS, 0, width=W, height=H)
    native, corpus = tmp_path / "native", tmp_path / "corpus"
    write_spatialvid(native, world_mp4(N, FPS, 0, width=W, height=H), ["uuid-sfm"])
    args = ["data", "ingest", "--source", "spatialvid", "--root", str(native), "--out", str(corpus),
            "--spec", "81f", "--estimator", "cpu-sfm"]
    assert main(args) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["clips"] == {"written": 1, "skipped": 0, "failed": 0}

    cid = clip_id("spatialvid", "uuid-sfm", 0, N)
    clip = read_clip(corpus / cid)
    prov = clip.provenance
    assert clip.meta["pose_units"] == prov["pose_units"] == "relative"
    assert prov["estimator"]["name"] == "cpu-sfm" and prov["estimator"]["version"] == get_estimator("cpu-sfm").version
    assert prov["estimator"]["diagnostics"]["focal_source"] == "estimated"
    assert prov["frame_interval"] == [0, N] and prov["original_id"] == "uuid-sfm"

    # Up to scale and gauge: compare after a Sim(3) fit of the estimated camera centres to the true ones.
    fit = robust_umeyama(clip.c2w[:, :3, 3], world.c2w[:, :3, 3])
    aligned = fit.rotation @ clip.c2w[:, :3, :3]
    rot_err = np.degrees(Rotation.from_matrix(np.swapaxes(aligned, 1, 2) @ world.c2w[:, :3, :3]).magnitude())
    assert rot_err.max() < ROT_BOUND_DEG
    path = np.linalg.norm(np.diff(world.c2w[:, :3, 3], axis=0), axis=1).sum()
    assert np.sqrt(np.mean(np.sum((fit.apply(clip.c2w[:, :3, 3]) - world.c2w[:, :3, 3]) ** 2, 1))) < 0.05 * path
    assert abs(clip.K[0, 0] / world.K[0, 0] - 1) < 0.25

    # The metric camera gate fails closed for it, with the reason named.
    assert annotate_command(str(corpus), stages=["camera"]) == 0
    doc = read_meta(corpus / cid)
    assert doc["metrics"]["camera.pose_units"] == "relative" and "camera.scale_cov" not in doc["metrics"]
    table, errors = records_to_table([flatten_meta(doc)])
    row = evaluate(POLICY, table, errors).table.to_pylist()[0]
    assert f"camera.scale_cov: {RELATIVE_SCALE}" in row["reasons"] and row["tier"] == "rejected"
    assert account(corpus).total()["ingested"] == 1 and account(corpus).total()["failed"] == 0


@pytest.mark.parametrize("source", ["abot", "sekai_game"])
def test_bridge_sources_refuse_a_relative_reference(source, tmp_path):
    world = make_world(310, 30.0)
    native, out = tmp_path / "native", tmp_path / "corpus"
    if source == "abot":
        write_abot(native, "ab0001", world, norm=2.5)
    else:
        write_sekai_game(native, "sekai_0001", world, norm=2.5)
    summary = ingest(source, native, out, spec="81f", estimator="cpu-sfm", progress=False)
    assert summary["failed_reasons"] == {"metric_reference_not_metric": 2}
    for d in iter_clip_dirs(out):
        prov = read_meta(d)["provenance"]
        assert prov["stages"]["ingest"]["error"].startswith("metric_reference_not_metric: estimator cpu-sfm returns relative")
        assert not (d / "poses.npy").exists()  # no clip is kept with a made-up scale
    assert account(out).total()["failed"] == 2
