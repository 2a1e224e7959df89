"""`solarwm/WorldModel-v0` checks its settings as `solarwm play` does, in `__init__` and `reset`, and a failed
reset changes nothing."""

from __future__ import annotations

import numpy as np
import pytest

from solarwm.envs.world_model import WorldModelEnv
from solarwm.rollout.settings import SettingsError

from play_fixtures import first_frame_png, tiny_causal_adapter

ACTION = np.array([0, 0, 1.0, 0, 30.0, 0], dtype=np.float32)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("env-checks")
    odd = first_frame_png(root / "odd.png", size=30)
    return {"adapter": str(tiny_causal_adapter(root / "adapter")), "png": str(first_frame_png(root / "first.png")),
            "odd": str(odd)}


@pytest.mark.parametrize("setting, match", [
    ({"fps": 0}, "fps"),
    ({"fov": 0}, "fov"),
    ({"fov": 180}, "fov"),
    ({"num_steps": 0}, "num_steps"),
    ({"caption": 42}, "caption must be a string"),
    ({"seed": 2**70}, "seed"),
    ({"seed": -1}, "seed"),
    ({"width": 0}, "width"),
    ({"max_speed": float("inf")}, "max_speed"),
    ({"max_blocks": 0}, "max_blocks"),
])
def test_a_bad_setting_is_refused_by_name_before_the_weights_are_read(tmp_path, setting, match):
    with pytest.raises(SettingsError, match=f"WorldModelEnv: .*{match}"):
        WorldModelEnv(adapter=str(tmp_path / "no-such-adapter"), **setting)


def test_a_frame_size_the_route_cannot_take_is_refused_by_name(world):
    with pytest.raises(SettingsError, match="WorldModelEnv: frame size 30x30.*multiple of"):
        WorldModelEnv(adapter=world["adapter"], first_frame=world["odd"])


def test_a_failed_reset_leaves_the_world_as_it_was(world):
    env = WorldModelEnv(adapter=world["adapter"], first_frame=world["png"], caption="a hallway", seed=2, num_steps=1)
    env.reset(seed=5)
    _, _, _, _, info = env.step(ACTION)
    session, image, caption = env.session, env.image.copy(), env.caption
    for seed, options, match in [
        (None, {"caption": 7}, "caption must be a string"),
        (2**70, {"caption": "a field"}, "seed"),
        (None, {"caption": "a field", "first_frame": world["odd"]}, "frame size 30x30"),
        (None, {"caption": "a field", "first_frame": np.zeros((16, 16, 3), np.uint8)}, "the space"),
        (None, {"caption": "a field", "weather": "rain"}, "unknown reset options"),
    ]:
        with pytest.raises(ValueError, match=match):
            env.reset(seed=seed, options=options)
        assert env.session is session and env.caption == caption and np.array_equal(env.image, image)
    _, _, _, _, after = env.step(ACTION)  # the old world goes on: its second block
    assert after["block"] == 1 and after["frames"].shape[0] == 12
