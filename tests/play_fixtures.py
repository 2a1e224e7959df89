"""Shared fixtures of the interactive-world tests: a tiny random-weight causal adapter, a first frame, a track."""

from __future__ import annotations

from pathlib import Path

import numpy as np

#: The predict run the session must reproduce bit for bit (recorded before the session refactor).
REFERENCE = Path(__file__).parent / "data" / "session_reference.npz"
REFERENCE_SEED = 3
REFERENCE_CAPTION = "a hallway"


def tiny_causal_adapter(directory: Path, seed: int = 0) -> Path:
    """Export a tiny random-weight ``wan22_ti2v_5b`` adapter tagged as a causal (``dmd``) model into ``directory``."""
    import torch

    from solarwm.backbones.wan22_ti2v_5b import Wan22TI2V5BAdapter, Wan22TI2V5BConfig

    torch.manual_seed(seed)
    return Wan22TI2V5BAdapter(config=Wan22TI2V5BConfig.tiny()).save_adapter(directory, stage="dmd")


def first_frame_png(path: Path, size: int = 32) -> Path:
    """A deterministic uint8 gradient image ``[size, size, 3]`` written as PNG."""
    from PIL import Image

    y, x = np.mgrid[0:size, 0:size]
    image = np.stack([x * 255 // (size - 1), y * 255 // (size - 1), (x + y) * 255 // (2 * size - 2)], -1)
    Image.fromarray(image.astype(np.uint8)).save(path)
    return path


def reference_trajectory(path: Path) -> Path:
    """33 frames at 32x32, 16 fps (blocks of 9, 12, 12 pixel frames): a walk forward, then a turn."""
    from solarwm.camera import trajectory as T

    traj = T.compose_segments([T.forward(16, 1.0), T.yaw_turn(16, 20.0)], fps=16.0, width=32, height=32)
    return T.save_trajectory(traj, path)
