"""``solarwm play --record DIR``: a world written as it runs, replayable by ``solarwm predict``.

Per world: ``first_frame.png`` (the exact first frame the session used), ``session.json`` (``adapter``,
``first_frame``, ``caption``, ``seed``, ``num_steps``, ``solver``, plus ``fps``/``width``/``height``),
``trajectory.npz`` (every generated frame's camera, in ``solarwm predict --trajectory``'s format;
rewritten atomically after each block, so it is complete whenever the process stops) and ``video.mp4``
(the streamed frames; finished when the world ends, also on Ctrl-C). Replay::

    solarwm predict --adapter A --first_frame DIR/first_frame.png --caption C --seed S \\
        --num_steps N --trajectory DIR/trajectory.npz --output replay.mp4
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from solarwm.camera.trajectory import save_trajectory
from solarwm.data.video import VideoWriter


class Recorder:
    """Writes one world's recording into ``directory`` (created); ``close`` finishes the mp4."""

    def __init__(self, directory: str | Path, session: Any, adapter: str, first_frame: np.ndarray) -> None:
        from PIL import Image

        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.session = session
        Image.fromarray(first_frame).save(self.directory / "first_frame.png")
        meta = {
            "adapter": adapter, "first_frame": str((self.directory / "first_frame.png").resolve()),
            "caption": session.caption, "seed": session.seed, "num_steps": session.num_steps,
            "solver": session.solver, "fps": session.fps, "width": session.width, "height": session.height,
        }
        (self.directory / "session.json").write_text(json.dumps(meta, indent=2) + "\n")
        self.writer = VideoWriter(self.directory / "video.mp4", session.fps)

    def write(self, frames: np.ndarray) -> None:
        """Append a block's frames to the video and rewrite the camera track so far."""
        self.writer.write(frames)
        save_trajectory(self.session.trajectory(), self.directory / "trajectory.npz")

    def close(self) -> None:
        """Finish the mp4 (a world with no frames leaves none)."""
        if self.writer.num_frames:
            self.writer.close()
        else:
            self.writer.abort()
