"""Executors of the data engine: Ray gives byte-identical clips and releases to the process pool, and a
task whose worker dies is rerun on either executor with the accounting still balanced."""

from __future__ import annotations

import os
import shutil
import sys
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import pytest
import ray  # the `dev` extra installs it: these tests must run in CI, not skip

from solarwm.cli import main
from solarwm.data.executor import ExecutorError, map_tasks

# The data engine's modules are imported inside the tests: a spawned pool worker imports this module
# to find its task function, and should not pay for torch when the task does not need it.

FAST = ["camera", "saturation", "vmaf", "cuts"]
SYNTH = ["--clips", "4", "--frames", "9", "--size", "32x32", "--bad-fraction", "0.5", "--seed", "5"]


@pytest.fixture(scope="module")
def ray_session():
    """One local Ray (2 CPUs) for every Ray test of this module: starting Ray takes seconds."""
    ray.init(num_cpus=2, include_dashboard=False, logging_level="warning")
    # Ray workers import task functions by module name; this test module is not importable there.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    yield
    ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
    ray.shutdown()


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` by relative path, with its bytes."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def run_engine(root: Path, executor: list[str], synth_workers: str = "2") -> tuple[Path, Path]:
    """synth → annotate → select → pack through the CLI with the given executor options."""
    corpus, release = root / "corpus", root / "release"
    assert main(["data", "synth", "--out", str(corpus), *SYNTH, "--workers", synth_workers, *executor]) == 0
    assert main(["data", "annotate", "--corpus", str(corpus), "--stages", *FAST, "--workers", "2", *executor]) == 0
    assert main(["data", "select", "--corpus", str(corpus)]) == 0
    assert main(["data", "pack", "--corpus", str(corpus), "--out", str(release), "--shard-max-samples", "1",
                 "--workers", "2", *executor]) == 0
    return corpus, release


@pytest.mark.slow
def test_ray_matches_the_process_pool_byte_for_byte(ray_session, tmp_path: Path, capsys) -> None:
    from solarwm.data.accounting import account

    # synth in-process (the process executor with one worker): a spawn pool costs seconds of imports.
    pool_corpus, pool_release = run_engine(tmp_path / "pool", ["--executor", "process"], synth_workers="1")
    ray_corpus, ray_release = run_engine(tmp_path / "ray", ["--executor", "ray"])
    capsys.readouterr()
    clips = snapshot(pool_corpus)
    assert sum(name.endswith("meta.json") for name in clips) == 4
    assert snapshot(ray_corpus) == clips  # meta.json, video, cameras, prompts: the same bytes
    release = snapshot(pool_release)
    assert "raw-wds/index.jsonl.gz" in release and "raw-wds/release.json" in release
    assert sum(name.endswith(".tar") for name in release) >= 2
    assert snapshot(ray_release) == release  # shards, journals, index, summary
    assert account(ray_corpus).balanced()


# The corpus of the report in #29 §3: on it `metrics.flow_dis` of one clip was 50.655761 with
# `--workers 2` and 50.656026 on Ray, because torch's CPU resize splits work by its thread count.
FLOW_SYNTH = ["--clips", "6", "--frames", "33", "--size", "64x64", "--seed", "5"]


def annotation_fields(corpus: Path) -> dict[str, dict[str, object]]:
    """Per clip, every annotated field: the metric keys, the caption and each stage's record."""
    from solarwm.data.contract import iter_clip_dirs, read_meta

    out = {}
    for folder in iter_clip_dirs(corpus):
        doc = read_meta(folder)
        fields = {f"metrics.{k}" if not k.startswith(("metrics.", "camera.")) else k: v
                  for k, v in doc.get("metrics", {}).items()}
        fields.update({f"stage.{name}": record for name, record in doc["provenance"]["stages"].items()})
        fields["caption"] = doc.get("caption")
        out[folder.name] = fields
    return out


@pytest.mark.slow
def test_every_executor_writes_the_same_annotation_records(ray_session, tmp_path: Path, capsys) -> None:
    """In-process (at 2 threads), a 2-worker pool and Ray: every stage's every field, exactly equal."""
    import cv2
    import torch

    source = tmp_path / "source"
    assert main(["data", "synth", "--out", str(source), *FLOW_SYNTH, "--workers", "1"]) == 0
    runs = {"in_process_2_threads": ["--workers", "1"], "pool": ["--workers", "2"],
            "ray": ["--workers", "2", "--executor", "ray"]}
    fields = {}
    for name, options in runs.items():
        corpus = tmp_path / name
        shutil.copytree(source, corpus)
        # The caller's thread settings must not reach the record (a Ray task has 1 thread).
        before = torch.get_num_threads(), cv2.getNumThreads()
        torch.set_num_threads(2)
        cv2.setNumThreads(2)
        try:
            assert main(["data", "annotate", "--corpus", str(corpus), *options]) == 0
            assert (torch.get_num_threads(), cv2.getNumThreads()) == (2, 2)  # restored after the run
        finally:
            torch.set_num_threads(before[0])
            cv2.setNumThreads(before[1])
        fields[name] = annotation_fields(corpus)
    capsys.readouterr()
    reference = fields["ray"]
    assert len(reference) == 6
    for clip, record in reference.items():
        assert {"metrics.flow_dis", "metrics.vmaf", "metrics.saturation", "camera.fov_x_min"} <= set(record), clip
        assert record["stage.flow"]["status"] == "ok"
    for name, per_clip in fields.items():
        assert per_clip.keys() == reference.keys(), name
        for clip, record in per_clip.items():
            assert record.keys() == reference[clip].keys(), (name, clip)
            differing = {k: (v, reference[clip][k]) for k, v in record.items()
                         if repr(v) != repr(reference[clip][k])}  # repr: 0.0 vs -0.0 and every float digit
            assert differing == {}, (name, clip)


def _die_once(task: tuple[str, tuple]) -> object:
    """Kill this worker process the first time (no cleanup, like an OOM kill); annotate normally after."""
    from solarwm.data.annotate.runner import _annotate_task

    marker, inner = task
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return _annotate_task(inner)
    os._exit(13)


def _always_die(x: int) -> int:
    if x == 1:
        os._exit(13)
    return x


@pytest.fixture(scope="module")
def corpus_src(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("faults") / "corpus"
    assert main(["data", "synth", "--out", str(out), *SYNTH]) == 0
    return out


@pytest.mark.slow
@pytest.mark.parametrize("executor", ["process", "ray"])
def test_a_task_killed_midway_is_rerun_and_accounting_balances(
    executor, corpus_src: Path, tmp_path: Path, request
) -> None:
    from solarwm.data.accounting import account
    from solarwm.data.annotate.stages import AnnotateConfig
    from solarwm.data.contract import iter_clip_dirs, read_meta

    if executor == "ray":
        request.getfixturevalue("ray_session")
    corpus = tmp_path / "corpus"
    shutil.copytree(corpus_src, corpus)
    dirs = [str(d) for d in iter_clip_dirs(corpus)]
    marker = str(tmp_path / "died-once")
    # The third clip's task dies; the others run alongside it.
    tasks = [
        (marker if i == 2 else str(tmp_path / f"never-{i}"), (d, FAST, AnnotateConfig())) for i, d in enumerate(dirs)
    ]
    for i in range(len(dirs)):
        if i != 2:
            Path(tasks[i][0]).touch()  # these markers exist: their tasks never die
    outcomes = list(map_tasks(_die_once, tasks, executor, workers=2))
    assert os.path.exists(marker)  # the task did die once
    assert sorted(i for i, _ in outcomes) == list(range(len(dirs)))  # each task reported exactly once
    assert not [o for _, o in outcomes if isinstance(o, BaseException)]
    for d in dirs:
        stages = read_meta(Path(d))["provenance"]["stages"]
        assert set(FAST) <= set(stages), d
    assert main(["data", "select", "--corpus", str(corpus)]) == 0
    acc = account(corpus)
    assert acc.balanced() and acc.total()["ingested"] == len(dirs), acc.line()


def test_process_pool_retries_are_bounded(tmp_path: Path) -> None:
    outcomes = dict(map_tasks(_always_die, [0, 1, 2], "process", workers=2, max_retries=0))
    assert sorted(outcomes) == [0, 1, 2]
    assert isinstance(outcomes[1], BrokenProcessPool)


def test_ray_retries_are_bounded(ray_session) -> None:
    outcomes = dict(map_tasks(_always_die, [0, 1, 2], "ray", max_retries=0))
    assert outcomes[0] == 0 and outcomes[2] == 2
    assert isinstance(outcomes[1], ray.exceptions.RayError)


def _parse_int(text: str) -> int:
    return int(text)


def test_task_errors_come_back_as_outcomes_on_ray(ray_session) -> None:
    outcomes = dict(map_tasks(_parse_int, ["1", "x"], "ray"))
    assert outcomes[0] == 1 and isinstance(outcomes[1], ValueError)


def test_bad_executor_settings_are_named() -> None:
    with pytest.raises(ExecutorError, match="unknown executor 'dask'"):
        list(map_tasks(_parse_int, ["1"], "dask"))
    with pytest.raises(ExecutorError, match="needs executor 'ray'"):
        list(map_tasks(_parse_int, ["1"], "process", ray_address="auto"))
