"""The settings of a world and their limits: checked once, the same way for ``solarwm play`` and
the Gymnasium environment, so a bad value is one named line before any model is loaded or socket bound."""

from __future__ import annotations

import math
from numbers import Integral, Real
from typing import Any

from solarwm.camera.trajectory import MAX_IMAGE_SIDE

#: The field of view (degrees, horizontal) a world may ask for: near 0 or 180 the focal length degenerates.
MIN_FOV, MAX_FOV = 1.0, 170.0
#: The frame rates a world may run at (frames per second).
MIN_FPS, MAX_FPS = 0.1, 240.0
#: Denoising steps per block (each step is a full forward of the model per block).
MAX_NUM_STEPS = 1000
#: Seeds are unsigned 64-bit: what ``torch.Generator.manual_seed`` takes.
MAX_SEED = 2**64 - 1
#: The longest caption accepted (characters); the text encoder truncates far below this anyway.
MAX_CAPTION_CHARS = 10_000


class SettingsError(ValueError):
    """A world setting out of range (the message names the setting and its allowed range)."""


def _number(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(float(value)):
        raise SettingsError(f"{name} must be a finite number, got {value!r}")
    return float(value)


def _integer(name: str, value: Any, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, Integral) or not low <= int(value) <= high:
        raise SettingsError(f"{name} must be an integer in [{low}, {high}], got {value!r}")
    return int(value)


def check_seed(seed: Any) -> int:
    """``seed`` as an int in ``[0, MAX_SEED]``; raises ``SettingsError``."""
    return _integer("seed", seed, 0, MAX_SEED)


def check_caption(caption: Any) -> str:
    """``caption`` if it is a string of at most ``MAX_CAPTION_CHARS``; raises ``SettingsError``."""
    if not isinstance(caption, str):
        raise SettingsError(f"caption must be a string, got {type(caption).__name__}")
    if len(caption) > MAX_CAPTION_CHARS:
        raise SettingsError(f"caption has {len(caption)} characters, at most {MAX_CAPTION_CHARS}")
    return caption


def check_world(
    *, caption: Any, seed: Any, num_steps: Any, fps: Any, fov: Any, width: Any = None, height: Any = None,
    smoothing: Any = 0.0,
) -> None:
    """Check the settings every world has (play and the environment); raises ``SettingsError`` naming the first
    bad one."""
    check_caption(caption)
    check_seed(seed)
    _integer("num_steps", num_steps, 1, MAX_NUM_STEPS)
    if not MIN_FPS <= _number("fps", fps) <= MAX_FPS:
        raise SettingsError(f"fps must be in [{MIN_FPS:g}, {MAX_FPS:g}], got {fps!r}")
    if not MIN_FOV <= _number("fov", fov) <= MAX_FOV:
        raise SettingsError(f"fov must be in [{MIN_FOV:g}, {MAX_FOV:g}] degrees, got {fov!r}")
    for name, side in (("width", width), ("height", height)):
        if side is not None:
            _integer(name, side, 1, MAX_IMAGE_SIDE)
    if _number("smoothing", smoothing) < 0:
        raise SettingsError(f"smoothing must be >= 0 seconds, got {smoothing!r}")


def check_frame_size(adapter: Any, height: int, width: int) -> None:
    """A frame the route can generate: each side a multiple of its pixel stride and at most ``MAX_IMAGE_SIDE``."""
    s = adapter.spatial_compression * adapter.patch_size
    if height % s or width % s or not (s <= height <= MAX_IMAGE_SIDE and s <= width <= MAX_IMAGE_SIDE):
        raise SettingsError(f"frame size {width}x{height}: each side must be a multiple of {s} in [{s}, "
                            f"{MAX_IMAGE_SIDE}] for route {adapter.route}")
