"""Gymnasium environments of SolarWM; importing this package registers ``solarwm/WorldModel-v0``.

``gymnasium.make("solarwm/WorldModel-v0", adapter=DIR, first_frame=..., caption=..., seed=...)``: one
``step(action)`` generates one block of a causal world model under the camera twist ``action``. See
``solarwm.envs.world_model.WorldModelEnv`` and docs/play.md.
"""

from __future__ import annotations

import gymnasium

from solarwm.envs.world_model import WorldModelEnv

__all__ = ["WorldModelEnv"]

if "solarwm/WorldModel-v0" not in gymnasium.registry:
    gymnasium.register(id="solarwm/WorldModel-v0", entry_point="solarwm.envs.world_model:WorldModelEnv")
