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
from solarwm.train_cli import main, parse_recipe

RECIPES = Path(__file__).resolve().parents[1] / "recipes"


def _tiny_recipe(root: Path, recipe: str = "tiny_bid.yaml", corpus: Path | None = None, **adapter_init) -> Path:
    """A shipped tiny recipe as fit resolves it with ``--root root`` (every output under ``root``), shrunk to 2 steps
    on 3 rendered 9-frame clips (rendered by the datamodule itself); the shipped file is read, never rewritten."""
    cfg = parse_recipe(str(RECIPES / recipe), "--root", str(root), "--trainer.default_root_dir", str(root))
    doc = cfg.as_dict()
    doc.pop("config", None)
    doc["trainer"].update(max_steps=2, val_check_interval=2, log_every_n_steps=1)
    for cb in doc["trainer"]["callbacks"]:
        args = cb["init_args"]
        if cb["class_path"].endswith("EvalVideoLogger"):
            args.update(every_n_steps=2, num_steps=2)
        elif cb["class_path"].endswith(("ModelCheckpoint", "StepCheckpoint")):
            args.update(dirpath=str(root / "checkpoints"), every_n_train_steps=2)
    doc["model"]["init_args"]["adapter"]["init_args"].update(adapter_init)
    corpus = corpus or root / "corpus"
    doc["data"]["init_args"].update(corpus_dir=str(corpus), num_frames=5, width=32, height=32, num_val_clips=1)
    # One view per world: with 3 clips, a 4-view world would be held out whole and leave nothing to train on.
    doc["data"]["init_args"]["synth"].update(clips=3, frames=9, width=48, height=32, views=1)
    # `solarwm test` on the held-out clip (tests/test_datamodules_windows.py covers a separate test corpus).
    doc["data"]["init_args"].update(test_corpus_dir=None, test_synth=None)
    root.mkdir(parents=True, exist_ok=True)
    path = root / "recipe.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """One real `solarwm fit` of 2 steps."""
    root = tmp_path_factory.mktemp("tiny_bid")
    assert main(["fit", "--config", str(_tiny_recipe(root))]) == 0
    traj = compose_segments([forward(4, 0.5), yaw_turn(4, 10.0)], fps=8.0, width=48, height=32)
    save_trajectory(traj, root / "traj.json")
    save_trajectory(traj.slice(0, 4), root / "short.json")
    return root


def test_fit_writes_checkpoint_export_and_videos(run: Path) -> None:
    """The fit rendered its corpus, stepped twice and wrote a checkpoint, an export and an eval video."""
    assert len(iter_clip_dirs(run / "corpus")) == 3
    assert (run / "checkpoints" / "last.ckpt").is_file()
    assert json.loads((run / "adapter" / "adapter.json").read_text())["route"] == "wan22_ti2v_5b"
    assert len(list(run.glob("tb/version_*/eval_videos/step0000002_*.mp4"))) == 1


def _predict(run: Path, capsys, *extra: str) -> dict:
    first = str(iter_clip_dirs(run / "corpus")[0])
    args = ["predict", "--first_frame", first, "--caption", "a room", "--trajectory", str(run / "traj.json"), "--num_steps", "2", *extra]
    assert main(args) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_predict_from_checkpoint_and_from_export(run: Path, capsys) -> None:
    """Both weight sources give an mp4 of the recipe's frame count; EMA checkpoint == EMA export."""
    out_ckpt = run / "pred_ckpt.mp4"
    summary = _predict(run, capsys, "--config", str(run / "recipe.yaml"), "--checkpoint",
                       str(run / "checkpoints" / "last.ckpt"), "--output", str(out_ckpt))
    assert summary["ema"] is True and summary["num_frames"] == 5
    frames_ckpt = read_video(out_ckpt)
    assert frames_ckpt.shape == (5, 32, 32, 3)
    out_export = run / "pred_export.mp4"
    _predict(run, capsys, "--adapter", str(run / "adapter"), "--num_frames", "5", "--width", "32", "--height", "32",
             "--output", str(out_export))
    assert np.array_equal(read_video(out_export), frames_ckpt)


def test_predict_short_trajectory_is_an_error(run: Path) -> None:
    """A 4-frame trajectory for a 5-frame clip is refused (no padding)."""
    with pytest.raises(ValueError, match="trajectory has 4 frames, --num_frames is 5"):
        main(["predict", "--config", str(run / "recipe.yaml"), "--checkpoint", str(run / "checkpoints" / "last.ckpt"),
              "--first_frame", str(iter_clip_dirs(run / "corpus")[0]), "--trajectory", str(run / "short.json"),
              "--output", str(run / "never.mp4")])
    assert not (run / "never.mp4").exists()


def test_predict_bad_checkpoints_say_so(run: Path, tmp_path: Path) -> None:
    """A missing checkpoint names its path; one of another model shape names the mismatch."""
    common = ["--first_frame", str(iter_clip_dirs(run / "corpus")[0]), "--trajectory", str(run / "traj.json"),
              "--output", str(tmp_path / "x.mp4")]
    with pytest.raises(FileNotFoundError, match="nope.ckpt: checkpoint not found"):
        main(["predict", "--config", str(run / "recipe.yaml"), "--checkpoint", str(tmp_path / "nope.ckpt"), *common])
    doc = yaml.safe_load((run / "recipe.yaml").read_text())
    doc["model"]["init_args"]["adapter"]["init_args"]["config"]["num_layers"] = 1
    doc["model"]["init_args"]["adapter"]["init_args"]["pretrained_path"] = None  # a fresh 1-layer model
    other = tmp_path / "other.yaml"
    other.write_text(yaml.safe_dump(doc))
    with pytest.raises(ValueError, match="does not match the recipe's model BidirectionalModule"):
        main(["predict", "--config", str(other), "--checkpoint", str(run / "checkpoints" / "last.ckpt"), *common])
