"""Executor behaviour: failures recorded not raised, idempotent reruns, resume, skipped stages, accounting."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from solarwm.data.annotate.runner import annotate_clip, annotate_command, run_annotate
from solarwm.data.annotate.stages import AnnotateConfig
from solarwm.data.contract import iter_clip_dirs, read_meta, update_meta

FAST = ["camera", "saturation", "vmaf", "cuts"]


@pytest.fixture(scope="module")
def corpus_src(render_corpus) -> Path:
    return render_corpus(clips=6, frames=17, width=48, height=32, fps=8.0, seed=3, bad_fraction=0.5)


@pytest.fixture
def corpus(corpus_src: Path, copy_corpus) -> Path:
    return copy_corpus(corpus_src)


def snapshot(corpus: Path) -> dict[str, bytes]:
    return {str(p.relative_to(corpus)): p.read_bytes() for p in sorted(corpus.rglob("*")) if p.is_file()}


def test_command_records_failures_and_accounts_every_clip(corpus: Path, capsys: pytest.CaptureFixture) -> None:
    assert annotate_command(str(corpus), stages=["camera,saturation"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["clips"] == len(iter_clip_dirs(corpus)) == summary["accounting"]["total"]["ingested"]
    defects = {d.name: read_meta(d)["provenance"].get("defect") for d in iter_clip_dirs(corpus)}
    mismatched = [c for c, d in defects.items() if d == "count_mismatch"]
    assert mismatched, "fixture should contain a count_mismatch clip"
    failed = {(f["clip"], f["stage"]) for f in summary["failed"]}
    assert {(c, "camera") for c in mismatched} <= failed
    for f in summary["failed"]:
        assert f["error"].startswith("frame_count:")
        rec = read_meta(corpus / f["clip"])["provenance"]["stages"]["camera"]
        assert rec["status"] == "failed" and "keys" not in rec
    assert summary["accounting"]["total"]["failed"] == len(mismatched)
    for c, d in defects.items():
        m = read_meta(corpus / c)["metrics"]
        assert "metrics.saturation" in m
        if d == "nan_pose":
            assert m["camera.finite"] is False and "camera.fov_x_min" not in m


@pytest.mark.slow
def test_rerun_is_idempotent(corpus: Path) -> None:
    run_annotate(corpus, FAST, AnnotateConfig())
    before = snapshot(corpus)
    results = run_annotate(corpus, FAST, AnnotateConfig())
    assert snapshot(corpus) == before
    for r in results:
        for stage, status in r.stages.items():
            # finished stages are skipped; a clip failing a stage fails it the same way again
            assert status in ("cached", "failed"), (r.clip, stage, status)


@pytest.mark.slow
def test_resume_completes_partial_corpus(corpus: Path) -> None:
    dirs = iter_clip_dirs(corpus)
    done = dirs[: len(dirs) // 2]
    for d in done:  # as if a run was killed after finishing half the clips
        annotate_clip(str(d), FAST, AnnotateConfig())
    finished = {d.name: read_meta(d) for d in done}
    results = {r.clip: r for r in run_annotate(corpus, FAST, AnnotateConfig())}
    for d in dirs:
        meta = read_meta(d)
        assert set(meta["provenance"]["stages"]) >= set(FAST)
        if d.name in finished:
            assert meta == finished[d.name]
            assert set(results[d.name].stages.values()) <= {"cached", "failed"}
        else:
            assert "ok" in results[d.name].stages.values()


def test_version_change_reruns_and_drops_stale_keys(corpus: Path) -> None:
    d = iter_clip_dirs(corpus)[0]
    annotate_clip(str(d), ["saturation"], AnnotateConfig())

    def age(doc: dict) -> None:
        doc["metrics"]["metrics.saturation_old"] = 1.0
        doc["provenance"]["stages"]["saturation"].update(
            version="0", keys=["metrics.saturation", "metrics.saturation_old"]
        )

    update_meta(d, age)
    assert annotate_clip(str(d), ["saturation"], AnnotateConfig()).stages == {"saturation": "ok"}
    meta = read_meta(d)
    assert "metrics.saturation_old" not in meta["metrics"]
    assert meta["provenance"]["stages"]["saturation"]["version"] != "0"


def test_dover_without_weights_is_skipped(corpus: Path) -> None:
    d = iter_clip_dirs(corpus)[0]
    result = annotate_clip(str(d), ["dover"], AnnotateConfig())
    assert result.stages == {"dover": "skipped"}
    meta = read_meta(d)
    rec = meta["provenance"]["stages"]["dover"]
    assert rec["status"] == "skipped" and rec["reason"] == "no DOVER weights configured"
    assert not any(k.startswith("metrics.dover") for k in meta["metrics"])


@pytest.mark.slow
def test_process_pool_matches_in_process(corpus: Path, tmp_path: Path) -> None:
    import shutil

    other = tmp_path / "other"
    shutil.copytree(corpus, other)
    run_annotate(corpus, ["saturation", "vmaf"], AnnotateConfig(), workers=1)
    run_annotate(other, ["saturation", "vmaf"], AnnotateConfig(), workers=2)
    for d in iter_clip_dirs(corpus):
        assert read_meta(d)["metrics"] == read_meta(other / d.name)["metrics"]


def test_bad_configuration_returns_error_code(corpus: Path, capsys: pytest.CaptureFixture) -> None:
    assert annotate_command(str(corpus), stages=["vlm"]) == 2
    captured = capsys.readouterr()
    assert (
        captured.out == "" and captured.err.startswith("solarwm data annotate: error: ") and "endpoint" in captured.err
    )
    assert annotate_command(str(corpus / "missing")) == 2


def test_stage_keys_are_declared_once_and_the_policy_columns_come_from_them():
    """COLUMNS = clip columns + every stage's declared keys; a stage writing an undeclared key fails by name."""
    import dataclasses

    from solarwm.data.annotate import runner
    from solarwm.data.annotate.stages import STAGES
    from solarwm.data.policy.spec import CLIP_COLUMNS, COLUMNS

    declared = {k: kind for stage in STAGES.values() for k, kind in stage.keys.items()}
    assert COLUMNS == {**CLIP_COLUMNS, **declared}
    assert {"camera.scale_cov", "metrics.flow_dis", "metrics.vlm_quality"} <= set(declared)

    stage = dataclasses.replace(
        STAGES["saturation"], run=lambda ctx, cfg: {"metrics.saturation": "high", "metrics.extra": 1.0}
    )
    with pytest.raises(
        runner.MetricError,
        match=r"saturation.keys: metrics.extra \(undeclared\), "
        r"metrics.saturation \(not number\)",
    ):
        runner._check_declared(stage, stage.run(None, None))
    runner._check_declared(STAGES["saturation"], {"metrics.saturation": 12.5})  # declared and a number: fine
