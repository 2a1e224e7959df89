"""Long procedural camera paths (``walk``, ``orbit``, ``random``) built from trajectory segments.

Each pattern is an endless seeded stream of `solarwm.camera.trajectory` segments, cut to
exactly the requested number of steps and integrated by `compose_segments` with a blend
window of `BLEND_SECONDS`, so velocities change smoothly. Motion stays plausible for a
walking camera: the translation speed never exceeds ``speed`` (blending averages increments,
so it cannot exceed the fastest segment) and the yaw rate stays at or below `MAX_YAW_RATE`.
"""

from __future__ import annotations

import itertools
import math
from typing import Iterator

import numpy as np

from solarwm.camera import trajectory as T

PATTERNS = ("walk", "orbit", "random")
LOOKS = ("inward", "tangent")
EYE_HEIGHT = 1.6  # metres: a standing person's camera
MAX_YAW_RATE = 45.0  # degrees/s: a brisk head turn; every pattern stays at or below it
# Velocity changes are spread over this long (the blend window), so starting to walk at
# speed v accelerates at most ~2v/BLEND_SECONDS: 1.6 m/s² at 1.2 m/s.
BLEND_SECONDS = 1.5


def _steps(seconds: float, fps: float) -> int:
    return max(1, round(seconds * fps))


def _take_steps(segments: Iterator[T.Segment], steps: int) -> list[T.Segment]:
    """The leading segments totalling exactly ``steps``; the last one cut, its amounts scaled to keep its rate."""
    out: list[T.Segment] = []
    left = steps
    for seg in segments:
        if seg.steps > left:
            k = left / seg.steps
            seg = T.Segment(left, seg.forward * k, seg.right * k, seg.up * k, seg.yaw * k, seg.pitch * k,
                            seg.log_zoom * k)
        out.append(seg)
        left -= seg.steps
        if left == 0:
            break
    return out


def walk_segments(rng: np.random.Generator, fps: float, speed: float) -> Iterator[T.Segment]:
    """Endless walking at ``speed``: straight stretches, gentle turns alternating left and right, some stops."""
    sign = float(rng.choice([-1.0, 1.0]))
    while True:
        n = _steps(rng.uniform(4.0, 10.0), fps)
        yield T.forward(n, speed * n / fps)
        if rng.random() < 0.25:
            yield T.pause(_steps(rng.uniform(2.0, 4.0), fps))
        degrees = rng.uniform(15.0, 45.0)
        n = _steps(degrees / rng.uniform(10.0, 20.0), fps)  # a turn of 10-20 degrees/s
        yield T.Segment(n, forward=speed * n / fps, yaw=sign * degrees)
        sign = -sign


def orbit_segments(
    rng: np.random.Generator, fps: float, speed: float, radius: float, look: str
) -> Iterator[T.Segment]:
    """Endless circling at ``radius`` metres and ``speed``, facing the centre (inward) or the way ahead (tangent)."""
    if look not in LOOKS:
        raise ValueError(f"unknown orbit look {look!r}; choose one of {', '.join(LOOKS)}")
    if radius <= 0:
        raise ValueError(f"orbit radius must be positive, got {radius}")
    yaw_rate = math.degrees(speed / radius)
    if yaw_rate > MAX_YAW_RATE:
        raise ValueError(
            f"an orbit of radius {radius} m at {speed} m/s turns {yaw_rate:.0f} deg/s (at most {MAX_YAW_RATE:.0f}); "
            f"use a radius of at least {speed / math.radians(MAX_YAW_RATE):.2f} m"
        )
    n = _steps(10.0, fps)  # any length: every step is the same
    degrees = float(rng.choice([-1.0, 1.0])) * yaw_rate * n / fps
    if look == "inward":
        return itertools.repeat(T.orbit(n, degrees, radius=radius))
    return itertools.repeat(T.Segment(n, forward=speed * n / fps, yaw=degrees))


def random_segments(rng: np.random.Generator, fps: float, speed: float) -> Iterator[T.Segment]:
    """An endless seeded sequence of forward, lateral, yaw-turn, small pitch-turn and pause segments."""
    kinds = ("forward", "lateral", "yaw", "pitch", "pause")
    weights = np.array([3.0, 1.5, 2.0, 1.0, 1.0])
    while True:
        kind = kinds[int(rng.choice(len(kinds), p=weights / weights.sum()))]
        sign = float(rng.choice([-1.0, 1.0]))
        n = _steps(rng.uniform(1.5, 5.0), fps)
        if kind == "forward":
            yield T.forward(n, rng.uniform(0.7, 1.0) * speed * n / fps)
        elif kind == "lateral":
            yield T.lateral(n, sign * rng.uniform(0.3, 0.6) * speed * n / fps)
        elif kind == "yaw":
            degrees = rng.uniform(20.0, 60.0)
            yield T.yaw_turn(_steps(degrees / rng.uniform(15.0, 30.0), fps), sign * degrees)
        elif kind == "pitch":
            # A glance up or down and back to level, at most 10 degrees/s: moving only while
            # level keeps the camera at eye height over hours.
            degrees = sign * rng.uniform(5.0, 15.0)
            turn = _steps(abs(degrees) / rng.uniform(5.0, 10.0), fps)
            yield T.pitch_turn(turn, degrees)
            yield T.pause(n)
            yield T.pitch_turn(turn, -degrees)
        else:
            yield T.pause(n)


def make_pattern(
    pattern: str,
    frames: int,
    fps: float = 16.0,
    width: int = 64,
    height: int = 64,
    seed: int = 0,
    speed: float = 1.2,
    radius: float = 4.0,
    look: str = "inward",
) -> T.Trajectory:
    """A procedural trajectory of exactly ``frames`` poses at eye height; the same seed gives the same path.

    ``radius`` and ``look`` apply to ``orbit`` only; ``speed`` is the walking speed in m/s.
    """
    if pattern not in PATTERNS:
        raise ValueError(f"unknown pattern {pattern!r}; choose one of {', '.join(PATTERNS)}")
    if frames < 2:
        raise ValueError(f"a trajectory pattern needs at least 2 frames, got {frames}")
    if not (fps > 0 and math.isfinite(fps)):
        raise ValueError(f"fps must be positive, got {fps}")
    if not (speed > 0 and math.isfinite(speed)):
        raise ValueError(f"speed must be positive (m/s), got {speed}")
    if width < 1 or height < 1:
        raise ValueError(f"image size must be positive, got {width}x{height}")
    rng = np.random.default_rng(seed)
    steps = frames - 1  # frame 0 is the start pose
    if pattern == "walk":
        stream = walk_segments(rng, fps, speed)
    elif pattern == "orbit":
        stream = orbit_segments(rng, fps, speed, radius, look)
    else:
        stream = random_segments(rng, fps, speed)
    return T.compose_segments(
        _take_steps(stream, steps), fps=fps, width=width, height=height, start=(0.0, 0.0, EYE_HEIGHT),
        blend_steps=max(4, round(BLEND_SECONDS * fps)),
    )


def path_length(traj: T.Trajectory) -> float:
    """Distance travelled by the camera centre, in metres."""
    return float(np.linalg.norm(np.diff(traj.c2w[:, :3, 3], axis=0), axis=1).sum())
