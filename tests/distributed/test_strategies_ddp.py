"""Lightning DDP for every stage: 2 CPU processes (gloo) give the losses of 1 process, step by step.

The 2-process run goes through the real CLI (`python -m solarwm.cli fit ... --trainer.strategy ddp
--trainer.devices 2`) in a subprocess: Lightning's DDP launcher re-executes the running script for rank 1,
which must be the CLI and not pytest. The 1-process reference runs in this process (same recipe, same seed,
same global batch), which spares one interpreter start on a busy CI machine.

What makes them equal (and what the test guards): each rank reads the strided share of the same epoch order
(`RepeatSampler`); every sample's noise and timesteps come from its own stream keyed by its ``sample_index``
(`SampleRNG`), not from a per-rank RNG; batch statistics (TF-AnyFlow's rescale reference) are reduced over
ranks; and the logged losses are synced (the global batch's mean).
"""

from __future__ import annotations

import csv
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from solarwm.train_cli import main

from commands import solarwm_argv

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
GLOBAL_BATCH = 4
STEPS = 4


@pytest.fixture(scope="module")
def corpus(render_corpus) -> Path:
    """9 rendered clips: 1 held out, 8 for training (two full global batches per epoch, no rank padding)."""
    return render_corpus(clips=9, frames=9, width=48, height=32, fps=8.0, seed=0)


def _overlay(root: Path, corpus: Path, devices: int, model: dict | None = None, strategy: str = "ddp",
             steps: int = STEPS) -> Path:
    """The tiny recipe cut to ``steps``, no callbacks, a CSV log of every step, ``GLOBAL_BATCH / devices`` per rank."""
    doc = {
        "root": str(root),  # every output the recipe derives from its root lands here
        "trainer": {
            "devices": devices,
            "strategy": strategy if devices > 1 else "auto",
            "max_steps": steps,
            "val_check_interval": None,
            "limit_val_batches": 0,
            "log_every_n_steps": 1,
            "enable_progress_bar": False,
            "enable_checkpointing": False,
            "enable_model_summary": False,
            "default_root_dir": str(root),
            "callbacks": [],
            "logger": {
                "class_path": "lightning.pytorch.loggers.CSVLogger",
                "init_args": {"save_dir": str(root), "name": "csv"},
            },
        },
        "model": {"init_args": dict(model or {})},
        "data": {
            "init_args": {
                "corpus_dir": str(corpus),
                "num_val_clips": 1,
                "num_frames": 5,
                "batch_size": GLOBAL_BATCH // devices,
                "num_workers": 0,
            }
        },
    }
    root.mkdir(parents=True, exist_ok=True)
    path = root / "overlay.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _losses(root: Path, key: str) -> dict[int, float]:
    """``{step: value}`` of the logged metric ``key`` from the CSV log."""
    (metrics,) = root.glob("csv/version_*/metrics.csv")
    with metrics.open() as f:
        return {int(r["step"]): float(r[key]) for r in csv.DictReader(f) if r.get(key)}


def _fit_both(tmp_path: Path, corpus: Path, recipe: str, key: str, **overlay) -> tuple[dict, dict]:
    """The recipe on 1 process (in this process) and on 2 DDP processes (the CLI in a subprocess)."""
    one = tmp_path / "one"
    assert main(["fit", "--config", str(RECIPES / recipe), "--config", str(_overlay(one, corpus, 1, **overlay))]) == 0
    two = tmp_path / "two"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop("LOCAL_RANK", None)  # a fresh launch, not a child of this process
    result = subprocess.run(
        [
            *solarwm_argv(),
            "fit",
            "--config",
            str(RECIPES / recipe),
            "--config",
            str(_overlay(two, corpus, 2, **overlay)),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert "Starting with 2 processes" in result.stderr + result.stdout
    return _losses(one, key), _losses(two, key)


def _assert_same(single: dict, ddp: dict, steps: range) -> None:
    assert sorted(single) == sorted(ddp) and set(steps) <= set(single), (single, ddp)
    for step in single:
        assert ddp[step] == pytest.approx(single[step], rel=1e-4, abs=1e-6), (step, single, ddp)


@pytest.mark.multiprocess
@pytest.mark.slow
def test_stage1_bidirectional_ddp_equals_one_process(tmp_path, corpus) -> None:
    single, ddp = _fit_both(tmp_path, corpus, "tiny_bid.yaml", "train/loss")
    _assert_same(single, ddp, range(STEPS))
    # Not trivially equal: the loss moves from step to step.
    assert len({round(v, 4) for v in single.values()}) == STEPS


@pytest.mark.multiprocess
@pytest.mark.slow
def test_stage2_tf_anyflow_ddp_equals_one_process(tmp_path, corpus) -> None:
    """Stage 2 from scratch (``init_from: null``): kinds, times and noise per sample, the rescale reference global."""
    # The reference's pair mix (the tiny recipe trains r = t only), so kinds and the rescale are exercised.
    model = {"init_from": None, "diffusion_ratio": 0.5, "consistency_ratio": 0.25}
    single, ddp = _fit_both(tmp_path, corpus, "tiny_tf.yaml", "train/loss", model=model)
    _assert_same(single, ddp, range(STEPS))
    assert len({round(v, 4) for v in single.values()}) == STEPS
    flow_single, flow_ddp = _losses(tmp_path / "one", "train/flow_loss"), _losses(tmp_path / "two", "train/flow_loss")
    _assert_same(flow_single, flow_ddp, range(STEPS))


@pytest.mark.multiprocess
@pytest.mark.slow
def test_stage3_dmd_ddp_equals_one_process(tmp_path, corpus) -> None:
    """Stage 3 (manual optimisation, two optimisers): critic every step, student on step 2; both losses match.

    Each backward touches one role, so DDP must skip the other's parameters:
    ``ddp_find_unused_parameters_true``, as the DMD recipes set.
    """
    # 4 outer steps = 5 optimizer steps (the student updates once, at outer step 2).
    overlay = dict(
        model={"init_from": None, "student_update_every": 2}, strategy="ddp_find_unused_parameters_true", steps=5
    )
    single, ddp = _fit_both(tmp_path, corpus, "tiny_dmd.yaml", "train/critic_loss", **overlay)
    _assert_same(single, ddp, range(STEPS))
    student_single, student_ddp = (
        _losses(tmp_path / "one", "train/student_loss"),
        _losses(tmp_path / "two", "train/student_loss"),
    )
    assert student_single  # the student did update
    _assert_same(student_single, student_ddp, range(0))
