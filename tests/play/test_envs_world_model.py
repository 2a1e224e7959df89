"""`solarwm/WorldModel-v0`: one step is one block under a camera twist."""

from __future__ import annotations

import gymnasium
import numpy as np
import pytest

import solarwm.envs  # noqa: F401  (registers the environment)

from play_fixtures import first_frame_png, tiny_causal_adapter


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("env")
    return {"adapter": str(tiny_causal_adapter(root / "adapter")), "png": str(first_frame_png(root / "first.png"))}


def test_the_env_passes_gymnasiums_checker(world):
    from gymnasium.utils.env_checker import check_env

    env = gymnasium.make("solarwm/WorldModel-v0", adapter=world["adapter"], first_frame=world["png"],
                         caption="a hallway", seed=2, num_steps=1)
    check_env(env.unwrapped, skip_render_check=False)


def test_a_step_is_a_block_and_reset_starts_a_new_world(world):
    env = gymnasium.make("solarwm/WorldModel-v0", adapter=world["adapter"], first_frame=world["png"],
                         caption="a hallway", seed=2, num_steps=1, render_mode="rgb_array")
    assert env.action_space.shape == (6,) and env.observation_space.shape == (32, 32, 3)
    obs, info = env.reset(seed=5)
    assert obs.dtype == np.uint8 and obs.shape == (32, 32, 3)
    obs, reward, terminated, truncated, info = env.step(np.array([0, 0, 1.0, 0, 30.0, 0], dtype=np.float32))
    assert info["frames"].shape == (9, 32, 32, 3) and info["c2w"].shape == (9, 4, 4)
    assert np.array_equal(obs, info["frames"][-1]) and np.array_equal(env.render(), obs)
    assert not terminated and not truncated and reward == 0.0
    _, _, _, _, info = env.step(np.array([0, 0, 1.0, 0, 30.0, 0], dtype=np.float32))
    assert info["frames"].shape[0] == 12
    step = np.linalg.inv(info["c2w"][0]) @ info["c2w"][1]
    theta = np.radians(30.0 / 16)  # walking while turning: the step is the chord of the arc
    assert np.isclose(np.linalg.norm(step[:3, 3]), 1.0 / 16 * 2 * np.sin(theta / 2) / theta, rtol=1e-9)
    assert step[2, 3] > 0 and step[0, 2] > 0  # forward, turning right
    other = np.full((32, 32, 3), 90, np.uint8)
    obs, _ = env.reset(seed=5, options={"first_frame": other, "caption": "a field"})
    assert np.array_equal(obs, other)
    with pytest.raises(ValueError, match="uint8"):
        env.reset(options={"first_frame": np.zeros((32, 32, 3), np.float32)})
    env.close()
