"""RolloutSession: the rollout as a stepwise session."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from solarwm.backbones.base import load_adapter
from solarwm.camera.trajectory import load_trajectory
from solarwm.rollout.session import RolloutSession, SessionError

from play_fixtures import (
    REFERENCE,
    REFERENCE_CAPTION,
    REFERENCE_SEED,
    first_frame_png,
    reference_trajectory,
    tiny_causal_adapter,
)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("world")
    return {
        "adapter": tiny_causal_adapter(root / "adapter"),
        "png": first_frame_png(root / "first.png"),
        "trajectory": reference_trajectory(root / "traj.npz"),
    }


def _image(path) -> np.ndarray:
    from PIL import Image

    return np.asarray(Image.open(path).convert("RGB"))


@pytest.mark.slow
def test_predict_is_a_session_and_reproduces_the_recorded_output_bit_for_bit(world, tmp_path):
    """`solarwm predict` (now a session fed from the trajectory) equals the output recorded before the refactor."""
    from solarwm.data.video import read_video
    from solarwm.train_cli import predict

    reference = np.load(REFERENCE)
    out = tmp_path / "out.mp4"
    predict(first_frame=str(world["png"]), trajectory=str(world["trajectory"]), output=str(out),
            caption=REFERENCE_CAPTION, adapter=str(world["adapter"]), seed=REFERENCE_SEED, progress=False)
    decoded = read_video(out)
    # Bit for bit on the recording's torch; another build may round float kernels differently.
    same_torch = str(reference["torch_version"]) == torch.__version__
    if same_torch:
        assert np.array_equal(decoded, reference["mp4_frames"])
    else:
        assert np.abs(decoded.astype(int) - reference["mp4_frames"]).mean() < 2.0

    adapter = load_adapter(world["adapter"]).eval()
    traj = load_trajectory(world["trajectory"])
    session = RolloutSession(adapter, _image(world["png"]), REFERENCE_CAPTION, traj.K[0], traj.fps, seed=REFERENCE_SEED)
    assert session.next_block_frames == 9
    blocks = []
    pos = 0
    while pos < len(traj):
        n = session.next_block_frames
        blocks.append(session.step(traj.c2w[pos:pos + n], traj.K[pos:pos + n]))
        pos += n
    assert [len(b) for b in blocks] == [9, 12, 12]
    frames = np.concatenate(blocks)
    assert frames.dtype == np.uint8 and frames.shape == (33, 32, 32, 3)
    if same_torch:
        assert np.array_equal(frames, reference["frames"])
    np.testing.assert_allclose(session.trajectory().c2w, traj.c2w)


def test_a_seed_changes_the_world_and_a_wrong_block_size_is_refused(world):
    adapter = load_adapter(world["adapter"]).eval()
    traj = load_trajectory(world["trajectory"])
    image = _image(world["png"])
    a = RolloutSession(adapter, image, "x", traj.K[0], 16.0, seed=0).step(traj.c2w[:9])
    b = RolloutSession(adapter, image, "x", traj.K[0], 16.0, seed=1).step(traj.c2w[:9])
    assert not np.array_equal(a, b)
    with pytest.raises(SessionError, match="pixel frames"):
        RolloutSession(adapter, image, "x", traj.K[0], 16.0).step(traj.c2w[:8])


@pytest.mark.slow
def test_two_sessions_forked_from_one_state_share_their_history(world):
    """A world branched after one block: same state, same cameras -> identical; other cameras -> they differ."""
    adapter = load_adapter(world["adapter"]).eval()
    traj = load_trajectory(world["trajectory"])
    root = RolloutSession(adapter, _image(world["png"]), "a hallway", traj.K[0], 16.0, seed=5)
    root.step(traj.c2w[:9])
    state = root.state_dict()
    left = RolloutSession(adapter, _image(world["png"]), "a hallway", traj.K[0], 16.0, seed=99)
    left.load_state_dict(state)
    right = root.fork()
    same_cameras = traj.c2w[9:21]
    turned = traj.c2w[21:33]
    a, b = left.step(same_cameras), right.step(same_cameras)
    assert np.array_equal(a, b)
    a2, b2 = left.step(same_cameras @ np.diag([1.0, 1.0, 1.0, 1.0])), right.step(turned)
    assert not np.array_equal(a2, b2)
    assert left.num_frames == right.num_frames == 33
    # the root is untouched by its branches
    assert root.num_frames == 9 and root.state_dict()["latent_frames"] == 3


def test_the_i2v_image_condition_comes_block_by_block_and_equals_the_whole_clips():
    """The 14B route's ``y`` streamed per block (causal VAE encoder across blocks) equals ``image_condition``."""
    from solarwm.backbones.wan22_i2v_14b import Wan22I2V14BAdapter, Wan22I2V14BConfig

    torch.manual_seed(0)
    adapter = Wan22I2V14BAdapter(config=Wan22I2V14BConfig.tiny()).eval()
    image = torch.rand(1, 3, 32, 32) * 2 - 1
    whole = adapter.image_condition(image, 4 * 7 + 1)  # 8 latent frames
    stream = adapter.frame_condition_stream(image)
    blocks = torch.cat([stream(n)["y"] for n in (3, 3, 2)], 1)
    assert blocks.shape == whole.shape
    torch.testing.assert_close(blocks, whole, atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_an_i2v_session_equals_the_whole_horizon_rollout_and_forks_its_vae_streams(world):
    """The 14B route (Wan VAE codec, streamed ``y``): a session block by block = the whole-clip rollout, and a
    fork (VAE encoder and decoder caches included) continues exactly like its parent."""
    from solarwm.backbones.wan22_i2v_14b import Wan22I2V14BAdapter, Wan22I2V14BConfig
    from solarwm.data.video import to_uint8_frames
    from solarwm.rollout.engine import Rollout

    torch.manual_seed(0)
    adapter = Wan22I2V14BAdapter(config=Wan22I2V14BConfig.tiny()).eval()
    traj = load_trajectory(world["trajectory"])
    image = _image(world["png"])
    first = torch.from_numpy(image.copy()).permute(2, 0, 1)[None].float() / 127.5 - 1.0
    rollout = Rollout(adapter, num_steps=2)
    cond = rollout.conditions(
        first, torch.as_tensor(traj.c2w)[None], torch.as_tensor(traj.K, dtype=torch.float32)[None], ["x"]
    )
    whole = np.concatenate(
        [to_uint8_frames(v[0]) for v in rollout.video_blocks(cond, torch.Generator().manual_seed(7))]
    )
    session = RolloutSession(adapter, image, "x", traj.K[0], 16.0, seed=7, num_steps=2)
    a = session.step(traj.c2w[:9], traj.K[:9])
    branch = session.fork()
    b = session.step(traj.c2w[9:21], traj.K[9:21])
    assert np.array_equal(branch.step(traj.c2w[9:21], traj.K[9:21]), b)
    c = session.step(traj.c2w[21:], traj.K[21:])
    streamed = np.concatenate([a, b, c])
    assert streamed.shape == whole.shape
    assert np.abs(streamed.astype(int) - whole).max() <= 1
