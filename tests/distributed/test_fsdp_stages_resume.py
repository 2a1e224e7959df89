"""FSDP (``RouteFSDPStrategy``, P = 1) on 2 gloo processes: stages 2 and 3 take real steps, and a sharded
checkpoint resumes a run exactly.

Stages 2 and 3 log, step by step, the losses of 1 process with the same global batch (as DDP does,
tests/distributed/test_strategies_ddp.py): the flow map's r-embedding and DMD's three roles are sharded,
reduced and stepped, not skipped. The resume test stops a stage-1 run after step 2 with a sharded checkpoint
(one file per rank, ``state_dict_type: sharded``), resumes it with ``--ckpt_path`` and compares steps 3-4 with
an uninterrupted run: weights, optimizer states, the LR schedule and the data order all come back.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from solarwm.train_cli import main

from dist_helpers import fit, fit_overlay, logged
from routes import RECIPES

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

FSDP = {"class_path": "solarwm.strategies.RouteFSDPStrategy"}
SHARDED = {"class_path": "solarwm.strategies.RouteFSDPStrategy", "init_args": {"state_dict_type": "sharded"}}
DATA = {"num_frames": 5}  # 2 latent frames: the shortest window of the tiny route
STAGES = {
    "tf": ("tiny_tf.yaml", {"init_from": None, "diffusion_ratio": 0.5, "consistency_ratio": 0.25},
           ["train/loss", "train/flow_loss"], 3),
    # 3 outer steps = 4 optimizer steps (the student updates at outer step 2)
    "dmd": ("tiny_dmd.yaml", {"init_from": None, "student_update_every": 2},
            ["train/critic_loss", "train/student_loss"], 4),
}


@pytest.fixture(scope="module")
def corpus(render_corpus) -> Path:
    """5 rendered 9-frame clips: 1 held out, 4 for training (2 steps of 2 per epoch)."""
    return render_corpus(clips=5, frames=9, width=48, height=32, fps=8.0, seed=0)


def _same(want: dict[int, float], got: dict[int, float]) -> None:
    assert want and sorted(want) == sorted(got), (want, got)
    for step in want:
        assert got[step] == pytest.approx(want[step], rel=1e-4, abs=1e-6), (step, want, got)


@pytest.mark.slow
@pytest.mark.parametrize("stage", sorted(STAGES))
def test_fsdp_stage_takes_the_steps_of_one_process(tmp_path, corpus, stage: str) -> None:
    recipe, model, keys, steps = STAGES[stage]
    one, two = tmp_path / "one", tmp_path / "two"
    assert main(["fit", "--config", str(RECIPES / recipe), "--config",
                 str(fit_overlay(one, corpus, 1, 2, steps, model=model, data=DATA))]) == 0
    result = fit(recipe, fit_overlay(two, corpus, 2, 1, steps, strategy=FSDP, model=model, data=DATA))
    assert "Starting with 2 processes" in result.stderr + result.stdout
    for key in keys:
        _same(logged(one, key), logged(two, key))
    assert len(set(logged(one, keys[0]).values())) > 1  # the loss moves


@pytest.mark.slow
def test_fsdp_sharded_checkpoint_resumes_exactly(tmp_path, corpus) -> None:
    """Stage 1 for 4 steps, against 2 steps + a sharded checkpoint + a resumed run to step 4."""
    save = {"enable_checkpointing": True, "callbacks": [{
        "class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
        "init_args": {"dirpath": str(tmp_path / "ckpt"), "every_n_train_steps": 2, "save_top_k": -1},
    }]}
    whole, part = tmp_path / "whole", tmp_path / "part"
    fit("tiny_bid.yaml", fit_overlay(whole, corpus, 2, 1, 4, strategy=SHARDED, data=DATA))
    fit("tiny_bid.yaml", fit_overlay(part, corpus, 2, 1, 2, strategy=SHARDED, data=DATA, trainer=save))
    (checkpoint,) = (tmp_path / "ckpt").glob("*step=2*")
    assert checkpoint.is_dir() and len(list(checkpoint.glob("*.distcp"))) == 2  # one shard file per rank
    resume = fit_overlay(part, corpus, 2, 1, 4, strategy=SHARDED, data=DATA)
    fit("tiny_bid.yaml", resume, "--ckpt_path", str(checkpoint))
    uninterrupted, resumed = logged(whole, "train/loss"), logged(part, "train/loss")
    assert sorted(uninterrupted) == [0, 1, 2, 3] and sorted(resumed) == [0, 1, 2, 3], (uninterrupted, resumed)
    _same({s: uninterrupted[s] for s in (2, 3)}, {s: resumed[s] for s in (2, 3)})
