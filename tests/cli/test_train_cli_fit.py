"""`solarwm fit` through train_cli.main on a tiny rendered corpus, then `solarwm predict` from its outputs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from solarwm.camera.trajectory import compose_segments, forward, save_trajectory, yaw_turn
from solarwm.data.contract import iter_clip_dirs
from solarwm.data.video import read_video
from solarwm.train_cli import main

from runs import tiny_recipe as _tiny_recipe

RECIPES = Path(__file__).resolve().parents[2] / "recipes"


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """One real `solarwm fit` of 2 steps."""
    root = tmp_path_factory.mktemp("tiny_bid")
    assert main(["fit", "--config", str(_tiny_recipe(root))]) == 0
    traj = compose_segments([forward(4, 0.5), yaw_turn(4, 10.0)], fps=8.0, width=48, height=32)
    save_trajectory(traj, root / "traj.json")
    save_trajectory(traj.slice(0, 4), root / "short.json")
    return root


@pytest.mark.slow
def test_fit_writes_checkpoint_export_and_videos(run: Path) -> None:
    """The fit rendered its corpus, stepped twice and wrote a checkpoint, an export and an eval video."""
    assert len(iter_clip_dirs(run / "corpus")) == 3
    assert (run / "checkpoints" / "last.ckpt").is_file()
    assert json.loads((run / "adapter" / "adapter.json").read_text())["route"] == "wan22_ti2v_5b"
    assert len(list(run.glob("tb/version_*/eval_videos/step0000002_*.mp4"))) == 1


def _predict(run: Path, capsys, *extra: str) -> dict:
    first = str(iter_clip_dirs(run / "corpus")[0])
    args = [
        "predict",
        "--first_frame",
        first,
        "--caption",
        "a room",
        "--trajectory",
        str(run / "traj.json"),
        "--num_steps",
        "2",
        *extra,
    ]
    assert main(args) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


@pytest.mark.slow
def test_predict_from_checkpoint_and_from_export(run: Path, capsys) -> None:
    """Both weight sources give an mp4 of the recipe's frame count; EMA checkpoint == EMA export."""
    out_ckpt = run / "pred_ckpt.mp4"
    summary = _predict(
        run,
        capsys,
        "--config",
        str(run / "recipe.yaml"),
        "--checkpoint",
        str(run / "checkpoints" / "last.ckpt"),
        "--output",
        str(out_ckpt),
    )
    assert summary["ema"] is True and summary["num_frames"] == 5
    frames_ckpt = read_video(out_ckpt)
    assert frames_ckpt.shape == (5, 32, 32, 3)
    out_export = run / "pred_export.mp4"
    _predict(
        run,
        capsys,
        "--adapter",
        str(run / "adapter"),
        "--num_frames",
        "5",
        "--width",
        "32",
        "--height",
        "32",
        "--output",
        str(out_export),
    )
    assert np.array_equal(read_video(out_export), frames_ckpt)


@pytest.mark.slow
def test_predict_short_trajectory_is_an_error(run: Path) -> None:
    """A 4-frame trajectory for a 5-frame clip is refused (no padding)."""
    with pytest.raises(ValueError, match="trajectory has 4 frames, --num_frames is 5"):
        main(
            [
                "predict",
                "--config",
                str(run / "recipe.yaml"),
                "--checkpoint",
                str(run / "checkpoints" / "last.ckpt"),
                "--first_frame",
                str(iter_clip_dirs(run / "corpus")[0]),
                "--trajectory",
                str(run / "short.json"),
                "--output",
                str(run / "never.mp4"),
            ]
        )
    assert not (run / "never.mp4").exists()


@pytest.mark.slow
def test_predict_bad_checkpoints_say_so(run: Path, tmp_path: Path) -> None:
    """A missing checkpoint names its path; one of another model shape names the mismatch."""
    common = [
        "--first_frame",
        str(iter_clip_dirs(run / "corpus")[0]),
        "--trajectory",
        str(run / "traj.json"),
        "--output",
        str(tmp_path / "x.mp4"),
    ]
    with pytest.raises(FileNotFoundError, match="nope.ckpt: checkpoint not found"):
        main(["predict", "--config", str(run / "recipe.yaml"), "--checkpoint", str(tmp_path / "nope.ckpt"), *common])
    doc = yaml.safe_load((run / "recipe.yaml").read_text())
    doc["model"]["init_args"]["adapter"]["init_args"]["config"]["num_layers"] = 1
    doc["model"]["init_args"]["adapter"]["init_args"]["pretrained_path"] = None  # a fresh 1-layer model
    other = tmp_path / "other.yaml"
    other.write_text(yaml.safe_dump(doc))
    with pytest.raises(ValueError, match="does not match the recipe's model BidirectionalModule"):
        main(["predict", "--config", str(other), "--checkpoint", str(run / "checkpoints" / "last.ckpt"), *common])
