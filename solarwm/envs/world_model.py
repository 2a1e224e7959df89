"""``solarwm/WorldModel-v0``: a causal world model as a Gymnasium environment.

One ``step(action)`` is one block of the rollout (``RolloutSession``): ``action`` is the camera twist
``[vx, vy, vz, wx, wy, wz]`` — m/s and degrees/s in the camera's OpenCV axes (x right, y down, z forward),
as in ``solarwm.camera.controller`` — held for all of the block's frames. Bounds: ``|v_i| <= max_speed``
(default 2 m/s) and ``|w_i| <= max_angular`` (default 90 deg/s) per axis. The observation is the block's
last frame, uint8 ``[H, W, 3]``; ``info["frames"]`` holds all its frames ``[n, H, W, 3]`` and
``info["c2w"]`` their cameras ``[n, 4, 4]``. The world has no end (``terminated`` is always False);
``max_blocks`` (default none) truncates it. ``reset(seed=..., options={"first_frame": ..., "caption": ...})``
starts a new world (``first_frame``: an image path or a uint8 ``[H, W, 3]`` array); the reset
observation is the first frame itself. ``render_mode="rgb_array"``: ``render()`` returns the last frame.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium
import numpy as np
from gymnasium import spaces

from solarwm.camera.controller import CameraController


class WorldModelEnv(gymnasium.Env):
    """A world generated block by block under camera twists (see module docstring)."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 16}

    def __init__(
        self,
        adapter: str | None = None,
        first_frame: str | np.ndarray | None = None,
        caption: str | None = None,
        seed: int = 0,
        num_steps: int = 4,
        fps: float = 16.0,
        fov: float = 60.0,
        width: int | None = None,
        height: int | None = None,
        max_speed: float = 2.0,
        max_angular: float = 90.0,
        max_blocks: int | None = None,
        render_mode: str | None = "rgb_array",
    ) -> None:
        from solarwm.loading import DEFAULT_CAPTION, DEFAULT_FIRST_FRAME, default_solver, load_causal
        from solarwm.rollout.settings import SettingsError, check_world

        if render_mode not in (None, "rgb_array"):
            raise ValueError(f"WorldModelEnv: render_mode must be 'rgb_array' or None, got {render_mode!r}")
        caption = DEFAULT_CAPTION if caption is None else caption
        try:  # the checks of `solarwm play`, before any weights are read
            check_world(caption=caption, seed=seed, num_steps=num_steps, fps=fps, fov=fov, width=width, height=height)
            for name, value in (("max_speed", max_speed), ("max_angular", max_angular)):
                if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
                    raise SettingsError(f"{name} must be a finite number > 0, got {value!r}")
            if max_blocks is not None and (isinstance(max_blocks, bool) or not isinstance(max_blocks, int)
                                           or max_blocks < 1):
                raise SettingsError(f"max_blocks must be None or an integer >= 1, got {max_blocks!r}")
        except SettingsError as e:
            raise SettingsError(f"WorldModelEnv: {e}") from None
        self.render_mode = render_mode
        self.model = load_causal(adapter)
        self.size = (width, height)
        self.caption = caption
        self.image = self._image(DEFAULT_FIRST_FRAME if first_frame is None else first_frame)
        self.base_seed, self.num_steps, self.fps, self.fov = int(seed), int(num_steps), float(fps), float(fov)
        self.max_blocks = max_blocks
        self.metadata = dict(self.metadata, render_fps=self.fps)
        self.solver = default_solver(self.model)
        high = np.array([max_speed] * 3 + [max_angular] * 3, dtype=np.float32)
        self.action_space = spaces.Box(-high, high, dtype=np.float32)
        h, w = self.image.shape[:2]
        self.observation_space = spaces.Box(0, 255, (h, w, 3), dtype=np.uint8)
        self.session: Any = None
        self.last = self.image

    def _image(self, first_frame: str | np.ndarray) -> np.ndarray:
        """The first frame as uint8 ``[H, W, 3]``, of a size the route can generate; raises ``ValueError``."""
        from solarwm.loading import load_first_frame
        from solarwm.rollout.settings import SettingsError, check_frame_size

        if isinstance(first_frame, np.ndarray):
            if first_frame.dtype != np.uint8 or first_frame.ndim != 3 or first_frame.shape[2] != 3:
                raise ValueError(f"WorldModelEnv: first_frame arrays must be uint8 [H, W, 3], got "
                                 f"{first_frame.dtype} {list(first_frame.shape)}")
            image = first_frame
        elif isinstance(first_frame, (str, Path)):
            image = load_first_frame(str(first_frame), *self.size)
        else:
            raise ValueError(f"WorldModelEnv: first_frame must be a path or a uint8 array, "
                             f"got {type(first_frame).__name__}")
        try:
            check_frame_size(self.model, *image.shape[:2])
        except SettingsError as e:
            raise SettingsError(f"WorldModelEnv: {e}") from None
        return image

    def _K(self, image: np.ndarray) -> np.ndarray:
        h, w = image.shape[:2]
        f = w / (2.0 * np.tan(np.radians(self.fov) / 2.0))
        return np.array([f, f, w / 2.0, h / 2.0])

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        """A new world from ``options``' ``first_frame``/``caption`` (else the current ones), noise ``seed``.

        All or nothing: every option is checked and the new world built before the environment changes, so a
        failed reset leaves the previous world as it was."""
        from solarwm.rollout.session import RolloutSession
        from solarwm.rollout.settings import SettingsError, check_caption, check_seed

        options = options or {}
        unknown = set(options) - {"first_frame", "caption"}
        if unknown:
            raise ValueError(f"WorldModelEnv: unknown reset options {sorted(unknown)} (first_frame, caption)")
        image = self.image
        if "first_frame" in options:
            image = self._image(options["first_frame"])
            if image.shape != self.observation_space.shape:
                raise ValueError(f"WorldModelEnv: first_frame is {list(image.shape)}, "
                                 f"the space {list(self.observation_space.shape)}")
        try:
            caption = check_caption(options.get("caption", self.caption))
            world_seed = self.base_seed if seed is None else check_seed(seed)
        except SettingsError as e:
            raise SettingsError(f"WorldModelEnv: {e}") from None
        session = RolloutSession(self.model, image, caption, self._K(image), self.fps, world_seed, self.num_steps,
                                 self.solver)
        super().reset(seed=seed)
        self.image, self.caption, self.session = image, caption, session
        self.controller = CameraController(self.fps)
        self.last = self.image
        return self.image.copy(), {"frames": self.image[None].copy(), "c2w": np.eye(4)[None]}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        """One block under the twist ``action`` [6]: observation, reward 0, not terminated, truncated, info."""
        if self.session is None:
            raise RuntimeError("WorldModelEnv: call reset() before step()")
        twist = np.asarray(action, dtype=np.float64).reshape(6)
        if not np.isfinite(twist).all():
            raise ValueError(f"WorldModelEnv: action must be finite, got {twist.tolist()}")
        twist = np.clip(twist, self.action_space.low, self.action_space.high)
        cameras = self.controller.frames(self.session.next_block_frames, twist[:3], twist[3:])
        frames = self.session.step(cameras)
        self.last = frames[-1]
        truncated = self.max_blocks is not None and self.session.blocks >= self.max_blocks
        return (
            frames[-1].copy(),
            0.0,
            False,
            truncated,
            {"frames": frames, "c2w": cameras, "block": self.session.blocks - 1},
        )

    def render(self) -> np.ndarray | None:
        """The last frame, uint8 ``[H, W, 3]`` (``rgb_array``)."""
        return None if self.render_mode is None else self.last.copy()
