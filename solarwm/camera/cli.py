"""``solarwm camera <verb>``: camera tools that need no model and no data."""

from __future__ import annotations

import json
from pathlib import Path

from solarwm.camera.patterns import make_pattern, path_length
from solarwm.camera.trajectory import save_trajectory
from solarwm.util.parsing import parse_size


def trajectory_command(
    out: str,
    pattern: str,
    frames: int,
    fps: float = 16.0,
    size: str = "64x64",
    seed: int = 0,
    speed: float = 1.2,
    radius: float = 4.0,
    look: str = "inward",
) -> int:
    """Write a procedural camera trajectory (.json or .npz) and print a one-line JSON summary.

    Args:
        out: the trajectory file; .npz (compact, for long tracks) or .json.
        pattern: walk (forward with gentle alternating turns and stops), orbit (circle at
            --radius) or random (a seeded mix of forward, lateral, turns, glances and pauses).
        frames: exact number of poses (an hour at 16 fps is 57600).
        fps: frame rate the motion is timed for.
        size: WIDTHxHEIGHT in pixels of the intrinsics K.
        seed: the same seed gives the same trajectory.
        speed: walking speed in m/s.
        radius: orbit radius in metres (orbit only).
        look: orbit only: inward (facing the centre) or tangent (facing the way ahead).
    """
    width, height = parse_size(size)
    path = Path(out)
    if path.suffix not in (".json", ".npz"):
        raise ValueError(f"{path}: trajectory files are .json or .npz")
    traj = make_pattern(pattern, frames, fps, width, height, seed=seed, speed=speed, radius=radius, look=look)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_trajectory(traj, path)
    print(json.dumps({
        "path": str(path), "frames": len(traj), "fps": traj.fps, "size": f"{width}x{height}",
        "pattern": pattern, "seed": seed, "path_length_m": round(path_length(traj), 3),
    }))
    return 0
