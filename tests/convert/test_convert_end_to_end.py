"""A converted official package is an export like any other: predict, play's loader and fit's init_from read it,
with the official conventions chosen from ``adapter.json`` and our own defaults untouched."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from solarwm.backbones.base import load_adapter, read_adapter_json
from solarwm.backbones.official import WAN_FIXED_FX, WAN_FIXED_FY
from solarwm.backbones.wan22_ti2v_5b import Wan22TI2V5BAdapter
from solarwm.camera.trajectory import compose_segments, forward, save_trajectory, yaw_turn
from solarwm.convert import convert_official
from solarwm.rollout.session import RolloutSession
from solarwm.train_cli import main as train_main


@pytest.fixture
def converted(tiny_packages, tmp_path) -> dict[str, Path]:
    """The three tiny packages converted."""
    out = {}
    for name in ("stage0p5", "stage1", "stage2"):
        out[name] = convert_official(tiny_packages[name], tmp_path / f"export_{name}",
                                     architecture=tiny_packages["architecture"])["output"]
    return {k: Path(v) for k, v in out.items()}


def test_conventions_are_route_settings_chosen_from_adapter_json(converted) -> None:
    """The converted export picks the official camera frame and intrinsics; our own tiny route keeps 4i and K."""
    official = load_adapter(converted["stage2"])
    ours = Wan22TI2V5BAdapter(preset="tiny")
    assert official.latent_camera_frames(5).tolist() == [0, 1, 5, 9, 13]  # 4i - 3: the first frame of each group
    assert official.latent_to_pixel_frame(5).tolist() == [0, 4, 8, 12, 16]  # decoding is unchanged
    assert ours.latent_camera_frames(5).tolist() == [0, 4, 8, 12, 16]
    K = torch.tensor([[[30.0, 40.0, 10.0, 12.0]]])
    fixed = official.prope_K(K, (64, 32))
    assert torch.allclose(fixed, torch.tensor([[[WAN_FIXED_FX * 64, WAN_FIXED_FY * 32, 32.0, 16.0]]]))
    assert torch.equal(ours.prope_K(K, (64, 32)), K)
    assert official.model_timesteps(torch.tensor([0.9375])).item() == 936.0
    assert ours.model_timesteps(torch.tensor([0.9375])).item() == 937.5
    c2w = torch.eye(4).repeat(1, 17, 1, 1)
    c2w[0, :, 0, 3] = torch.arange(17.0)  # x = frame index
    picked, _ = official.latent_cameras(c2w, torch.ones(1, 17, 4))
    assert picked[0, :, 0, 3].tolist() == [0.0, 1.0, 5.0, 9.0, 13.0]


def test_a_session_feeds_each_latent_the_first_camera_of_its_group(converted) -> None:
    """Play and predict step a ``RolloutSession``: the block's cameras reach the model at frames 4i-3."""
    adapter = load_adapter(converted["stage2"]).eval()
    seen = []
    original = adapter.forward

    def spy(x_t, sigma, cond, **kwargs):
        seen.append(cond["c2w"][0, :, 0, 3].tolist())
        return original(x_t, sigma, cond, **kwargs)

    adapter.forward = spy
    session = RolloutSession(adapter, torch.zeros(1, 3, 16, 16), "a room", [10.0, 10.0, 8.0, 8.0], fps=8.0, num_steps=1)
    for start, n in ((0, session.next_block_frames), (session.next_block_frames, None)):
        n = n or session.next_block_frames
        c2w = np.repeat(np.eye(4)[None], n, 0)
        c2w[:, 0, 3] = np.arange(start, start + n)
        frames = session.step(c2w)
        assert frames.shape == (n, 16, 16, 3)
    assert seen[0] == [0.0, 1.0, 5.0] and seen[-1] == [9.0, 13.0, 17.0]


def _first_frame(path: Path) -> Path:
    from PIL import Image

    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)).save(path)
    return path


@pytest.mark.slow
@pytest.mark.parametrize("stage", ["stage1", "stage2"])
def test_predict_rolls_out_a_converted_package(stage, converted, tmp_path, capsys) -> None:
    """``solarwm predict --adapter`` on a converted stage-1 (flow map) and stage-2 (re-noise) package."""
    traj = compose_segments([forward(9, 1.0), yaw_turn(9, 30.0)], fps=8.0, width=32, height=32)
    save_trajectory(traj, tmp_path / "traj.json")
    out = tmp_path / "out.mp4"
    first = str(_first_frame(tmp_path / "f.png"))
    assert train_main(["predict", "--adapter", str(converted[stage]), "--first_frame", first,
                       "--trajectory", str(tmp_path / "traj.json"), "--output", str(out), "--num_frames", "17",
                       "--progress", "false"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["causal"] is True and summary["num_frames"] == 17 and out.stat().st_size > 0


def test_play_loads_a_converted_package(converted) -> None:
    """``solarwm play --adapter`` loads it as a causal world (the loader only; the browser test is play's)."""
    from solarwm.loading import load_causal

    model = load_causal(str(converted["stage2"]), None, None)
    assert model.route == "wan22_ti2v_5b" and model.config.latent_camera == "group_first"
    tf = load_causal(str(converted["stage1"]), None, None)
    assert tf.delta_embedding is not None and tf.flow_map_gate == 0.25


@pytest.mark.slow
def test_fit_one_step_from_a_converted_package(converted, tmp_path) -> None:
    """One step of stage 2 (``tiny_tf.yaml``) with ``init_from`` at a converted stage-0.5 package."""
    recipes = Path(__file__).resolve().parents[2] / "recipes"
    # The recipe builds the converted architecture with the same settings (None fields are the defaults).
    config = {k: v for k, v in read_adapter_json(converted["stage0p5"])["config"].items() if v is not None}
    root = tmp_path / "fit"
    args = [
        "fit", "--config", str(recipes / "tiny_tf.yaml"), "--root", str(root),
        "--trainer.default_root_dir", str(root / "stage2"), "--trainer.max_steps", "1",
        "--model.init_args.init_from", str(converted["stage0p5"]),
        "--model.init_args.adapter.init_args.config", json.dumps(config),
        "--data.init_args.num_frames", "13", "--data.init_args.num_val_clips", "1",
        "--data.init_args.synth.frames", "17", "--data.init_args.synth.clips", "3",
        "--data.init_args.synth.views", "1",
    ]
    assert train_main(args) == 0
    export = root / "stage2" / "adapter"
    meta = read_adapter_json(export)
    assert meta["stage"] == "tf_anyflow" and meta["config"]["latent_camera"] == "group_first"
    trained = load_adapter(export).transformer.state_dict()
    start = load_adapter(converted["stage0p5"]).transformer.state_dict()
    assert trained.keys() == start.keys()
    assert any(not torch.equal(trained[k], start[k]) for k in start)  # the step changed the converted weights
