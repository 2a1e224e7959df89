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

from pathlib import Path

import pytest

from solarwm.train_cli import main

from dist_helpers import fit, fit_overlay, logged
from routes import RECIPES

GLOBAL_BATCH = 4
STEPS = 4


@pytest.fixture(scope="module")
def corpus(render_corpus) -> Path:
    """9 rendered clips: 1 held out, 8 for training (two full global batches per epoch, no rank padding)."""
    return render_corpus(clips=9, frames=9, width=48, height=32, fps=8.0, seed=0)


def _fit_both(tmp_path: Path, corpus: Path, recipe: str, key: str, model: dict | None = None,
              strategy: str = "ddp", steps: int = STEPS) -> tuple[dict, dict]:
    """The recipe on 1 process (in this process) and on 2 DDP processes (the CLI in a subprocess)."""

    def overlay(root: Path, devices: int) -> Path:
        return fit_overlay(root, corpus, devices, GLOBAL_BATCH // devices, steps, strategy if devices > 1 else "auto",
                           model=model, data={"num_frames": 5})

    one, two = tmp_path / "one", tmp_path / "two"
    assert main(["fit", "--config", str(RECIPES / recipe), "--config", str(overlay(one, 1))]) == 0
    result = fit(recipe, overlay(two, 2))
    assert "Starting with 2 processes" in result.stderr + result.stdout
    return logged(one, key), logged(two, key)


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
    flow_single, flow_ddp = logged(tmp_path / "one", "train/flow_loss"), logged(tmp_path / "two", "train/flow_loss")
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
        logged(tmp_path / "one", "train/student_loss"),
        logged(tmp_path / "two", "train/student_loss"),
    )
    assert student_single  # the student did update
    _assert_same(student_single, student_ddp, range(0))
