"""Stage 2 through the CLI: `solarwm fit` of tiny_tf.yaml from a stage-1 export, then a long causal `predict`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from solarwm.backbones.base import read_adapter_json
from solarwm.camera.trajectory import compose_segments, forward, save_trajectory, yaw_turn
from solarwm.data.contract import iter_clip_dirs
from solarwm.data.video import probe_video, read_video
from solarwm.stages.checkpoints import StageCheckpointError
from solarwm.train_cli import SolarCLI, main

from runs import tiny_recipe as _tiny_recipe


def _shrink(path: Path, **data) -> Path:
    doc = yaml.safe_load(path.read_text())
    doc["data"]["init_args"].update(data)
    doc["data"]["init_args"]["synth"].update(frames=17)
    # A small RoPE table (24 latent frames, above the 18-frame window) so a short rollout runs past it.
    doc["model"]["init_args"]["adapter"]["init_args"].setdefault("config", {})["rope_max_seq_len"] = 24
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """Stage 1 (2 steps) then stage 2 (2 steps) initialised from stage 1's export."""
    root = tmp_path_factory.mktemp("causal")
    bid = _shrink(_tiny_recipe(root / "bid"), num_frames=13)
    assert main(["fit", "--config", str(bid)]) == 0
    tf = _tiny_recipe(root / "tf", recipe="tiny_tf.yaml", corpus=root / "bid" / "corpus")
    doc = yaml.safe_load(tf.read_text())
    doc["model"]["init_args"]["init_from"] = str(root / "bid" / "adapter")
    tf.write_text(yaml.safe_dump(doc))
    tf = _shrink(tf, num_frames=13)
    assert main(["fit", "--config", str(tf)]) == 0
    dmd = _tiny_recipe(root / "dmd", recipe="tiny_dmd.yaml", corpus=root / "bid" / "corpus")
    doc = yaml.safe_load(dmd.read_text())
    doc["model"]["init_args"]["init_from"].update(
        generator=str(root / "tf" / "adapter"), score=str(root / "bid" / "adapter")
    )
    doc["model"]["init_args"]["student_update_every"] = 1
    dmd.write_text(yaml.safe_dump(doc))
    dmd = _shrink(dmd, num_frames=13)
    assert main(["fit", "--config", str(dmd)]) == 0
    long = compose_segments([forward(60, 6.0), yaw_turn(40, 60.0), forward(60, 6.0)], fps=8.0, width=32, height=32)
    save_trajectory(long, root / "long.json")  # 161 frames -> 41 latent frames, past the 24-row RoPE table
    return {"root": root, "bid": bid, "tf": tf, "dmd": dmd}


@pytest.mark.slow
def test_stage2_starts_from_stage1_and_exports_a_causal_model(runs) -> None:
    meta = read_adapter_json(runs["root"] / "tf" / "adapter")
    assert meta["stage"] == "tf_anyflow" and meta["flow_map_gate"] == 0.25
    assert read_adapter_json(runs["root"] / "bid" / "adapter")["stage"] == "bidirectional"
    ckpt = torch.load(runs["root"] / "tf" / "checkpoints" / "last.ckpt", weights_only=True)
    assert (ckpt["solarwm"]["stage"], ckpt["solarwm"]["route"]) == ("tf_anyflow", "wan22_ti2v_5b")
    assert any(k.startswith("adapter.delta_embedding.") for k in ckpt["state_dict"])
    assert len(list((runs["root"] / "tf").glob("tb/version_*/eval_videos/*.mp4"))) >= 1


def _predict(runs, capsys, *extra: str) -> dict:
    first = str(iter_clip_dirs(runs["root"] / "bid" / "corpus")[0])
    assert main(["predict", "--first_frame", first, "--caption", "a room", "--progress", "false", *extra]) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


@pytest.mark.slow
def test_causal_predict_rolls_out_past_the_rope_table(runs, capsys) -> None:
    """The export rolls out 161 frames (41 latents > the 24-row table); checkpoint == export; seeded."""
    out = runs["root"] / "long.mp4"
    summary = _predict(
        runs,
        capsys,
        "--adapter",
        str(runs["root"] / "tf" / "adapter"),
        "--trajectory",
        str(runs["root"] / "long.json"),
        "--output",
        str(out),
    )
    assert summary["causal"] is True and summary["num_frames"] == 161
    assert probe_video(out)["num_frames"] == 161
    again = runs["root"] / "again.mp4"
    _predict(
        runs,
        capsys,
        "--config",
        str(runs["tf"]),
        "--checkpoint",
        str(runs["root"] / "tf" / "checkpoints" / "last.ckpt"),
        "--trajectory",
        str(runs["root"] / "long.json"),
        "--output",
        str(again),
    )
    # Same weights and seed give the same rollout; compared through H.264, which may round differently.
    diff = read_video(again).astype(int) - read_video(out).astype(int)
    assert abs(diff).mean() < 0.5


def test_causal_predict_refuses_bad_input_without_writing(runs, tmp_path) -> None:
    common = [
        "--first_frame",
        str(iter_clip_dirs(runs["root"] / "bid" / "corpus")[0]),
        "--trajectory",
        str(runs["root"] / "long.json"),
    ]
    export = ["--adapter", str(runs["root"] / "tf" / "adapter")]
    with pytest.raises(ValueError, match="--num_frames 100 is not a valid length"):
        main(["predict", *export, *common, "--num_frames", "100", "--output", str(tmp_path / "a.mp4")])
    with pytest.raises(ValueError, match="trajectory has 161 frames, --num_frames is 165"):
        main(["predict", *export, *common, "--num_frames", "165", "--output", str(tmp_path / "b.mp4")])
    with pytest.raises(
        StageCheckpointError, match="is a 'bidirectional' checkpoint; the recipe builds stage 'tf_anyflow'"
    ):
        main(
            [
                "predict",
                "--config",
                str(runs["tf"]),
                "--checkpoint",
                str(runs["root"] / "bid" / "checkpoints" / "last.ckpt"),
                *common,
                "--output",
                str(tmp_path / "c.mp4"),
            ]
        )
    assert not list(tmp_path.iterdir())


@pytest.mark.slow
def test_stage2_init_from_missing_export_names_the_command(runs, tmp_path) -> None:
    doc = yaml.safe_load(runs["tf"].read_text())
    doc["model"]["init_args"]["init_from"] = str(tmp_path / "missing")
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(doc))
    # LightningCLI reports the constructor's error inside its own ValueError; the message survives.
    with pytest.raises(
        ValueError, match=r"missing not found; make it with `solarwm fit --config recipes/tiny_bid.yaml`"
    ):
        main(["fit", "--config", str(bad)])


@pytest.mark.slow
def test_solarwm_test_reports_fidelity_baselines_and_camera_following(runs, capsys) -> None:
    """`solarwm test` on a stage-2 checkpoint scores its few-step rollout against the static baseline."""
    assert (
        main(
            [
                "test",
                "--config",
                str(runs["tf"]),
                "--ckpt_path",
                str(runs["root"] / "tf" / "checkpoints" / "last.ckpt"),
                "--trainer.logger",
                "false",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    for name in ("test/psnr", "test/psnr_static", "test/ssim", "test/cam_rot_err_deg", "test/cam_rot_err_deg_gt"):
        assert name in out


@pytest.mark.slow
def test_solarwm_test_pools_its_metrics_over_test_draws(runs) -> None:
    """`--data.init_args.test_draws 2` generates every held-out clip twice (other noise) and pools the pairs."""

    def tested(*extra: str) -> dict[str, float]:
        cli = SolarCLI(
            args=[
                "test",
                "--config",
                str(runs["tf"]),
                "--ckpt_path",
                str(runs["root"] / "tf" / "checkpoints" / "last.ckpt"),
                "--trainer.logger",
                "false",
                *extra,
            ]
        )
        return {k: float(v) for k, v in cli.trainer.callback_metrics.items()}

    one, two = tested("--data.init_args.test_draws", "1"), tested("--data.init_args.test_draws", "2")
    assert two["test/cam_pairs"] == 2 * one["test/cam_pairs"] > 0
    # The ground truth and the static baseline do not depend on the draw; the generated video does.
    assert two["test/psnr_static"] == pytest.approx(one["test/psnr_static"])
    assert two["test/cam_rot_err_deg_gt"] == pytest.approx(one["test/cam_rot_err_deg_gt"])
    assert two["test/psnr"] != one["test/psnr"]
    # `--data.init_args.test_seed` draws other noise for the same clips.
    other = tested("--data.init_args.test_draws", "1", "--data.init_args.test_seed", "7000")
    assert other["test/cam_pairs"] == one["test/cam_pairs"]
    assert other["test/psnr_static"] == pytest.approx(one["test/psnr_static"])
    assert other["test/psnr"] != one["test/psnr"]


@pytest.mark.slow
def test_solarwm_test_keeps_a_record_per_video_that_pools_to_its_metrics(runs) -> None:
    """``test_records``: one per generated video, in loader order; their means are the logged pooled metrics."""
    cli = SolarCLI(
        args=[
            "test",
            "--config",
            str(runs["tf"]),
            "--ckpt_path",
            str(runs["root"] / "tf" / "checkpoints" / "last.ckpt"),
            "--trainer.logger",
            "false",
            "--data.init_args.test_draws",
            "2",
        ]
    )
    logged = {k: float(v) for k, v in cli.trainer.callback_metrics.items()}
    records = cli.model.test_records
    assert len(records) == 2 * len(cli.datamodule.val_dataset)
    for name in ("psnr", "psnr_static"):
        assert sum(r[name] for r in records) / len(records) == pytest.approx(logged[f"test/{name}"], rel=1e-5)
    rot = [e for r in records for e in r["cam_rot_err_deg"]]
    assert len(rot) + logged["test/cam_failed_pairs"] == logged["test/cam_pairs"]
    # A camera pair starts at every frame (stride 4): F - 4 pairs per video, not F // 4.
    assert logged["test/cam_pairs"] == len(records) * (cli.datamodule.num_frames - 4)
    assert sum(rot) / len(rot) == pytest.approx(logged["test/cam_rot_err_deg"], rel=1e-5)


def test_solarwm_test_command_line_wins_over_checkpoint_hyperparameters(runs) -> None:
    """`--model.init_args.sample_steps 3` with `--config` and `--ckpt_path` tests at 3 steps, not the saved number."""

    class Built(SolarCLI):
        def _run_subcommand(self, subcommand: str) -> None:
            """Build the model only."""

    ckpt = runs["root"] / "tf" / "checkpoints" / "last.ckpt"
    saved = torch.load(ckpt, weights_only=True)["hyper_parameters"]["sample_steps"]
    args = ["test", "--config", str(runs["tf"]), "--ckpt_path", str(ckpt), "--trainer.logger", "false"]
    assert Built(args=args).model.sample_steps == saved
    assert Built(args=[*args, "--model.init_args.sample_steps", str(saved + 1)]).model.sample_steps == saved + 1


@pytest.mark.slow
def test_stage3_exports_a_causal_student_and_predicts_from_checkpoint_and_export(runs, capsys) -> None:
    """The DMD export is the student alone (no r-embedding); checkpoint and export roll out alike."""
    meta = read_adapter_json(runs["root"] / "dmd" / "adapter")
    assert meta["stage"] == "dmd" and meta.get("flow_map_gate") is None
    ckpt = torch.load(runs["root"] / "dmd" / "checkpoints" / "last.ckpt", weights_only=True)
    assert ckpt["solarwm"]["stage"] == "dmd" and len(ckpt["optimizer_states"]) == 2
    a, b = runs["root"] / "dmd_export.mp4", runs["root"] / "dmd_ckpt.mp4"
    _predict(
        runs,
        capsys,
        "--adapter",
        str(runs["root"] / "dmd" / "adapter"),
        "--trajectory",
        str(runs["root"] / "long.json"),
        "--num_frames",
        "41",
        "--output",
        str(a),
    )
    summary = _predict(
        runs,
        capsys,
        "--config",
        str(runs["dmd"]),
        "--checkpoint",
        str(runs["root"] / "dmd" / "checkpoints" / "last.ckpt"),
        "--trajectory",
        str(runs["root"] / "long.json"),
        "--num_frames",
        "41",
        "--output",
        str(b),
    )
    assert summary["causal"] is True and summary["num_frames"] == 41
    assert abs(read_video(a).astype(int) - read_video(b).astype(int)).mean() < 0.5
