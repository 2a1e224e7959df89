"""``solarwm play --record DIR``: each world written as it runs, replayable by ``solarwm predict``.

Every world gets its own new folder ``DIR/world-<k>``, made exclusively (``mkdir``) when its first block is
written, so nothing is ever overwritten (an earlier run's worlds stay, ``k`` goes on after them), two worlds
starting together never share a folder, and a world left before its first block leaves no folder. It holds:
``first_frame.png`` (the exact first frame the session used), ``session.json`` (``adapter`` - the resolved
model folder, or ``config`` and ``checkpoint`` - ``weights_sha256``, ``first_frame``, ``first_frame_sha256``,
``caption``, ``seed``, ``num_steps``, ``solver``, ``fps``, ``width``, ``height``), ``trajectory.npz`` (every
generated frame's camera, in ``solarwm predict --trajectory``'s format; rewritten atomically after each
block, so it is complete whenever the process stops) and ``video.mp4`` (the streamed frames; finished when
the world ends, also on Ctrl-C). All recordings of one server together hold at most a byte budget
(``RecordBudget``). Replay::

    solarwm predict --adapter A --first_frame DIR/world-0/first_frame.png --caption C --seed S \\
        --num_steps N --trajectory DIR/world-0/trajectory.npz --output replay.mp4
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import re
import threading
from pathlib import Path
from typing import Any

import numpy as np

from solarwm.camera.trajectory import save_trajectory
from solarwm.data.video import VideoWriter
from solarwm.util.atomic import atomic_write_bytes, atomic_write_text

log = logging.getLogger("solarwm.play")
WORLD_FOLDER = re.compile(r"world-(\d+)")


def sha256_of(path: str | Path) -> str:
    """sha256 of a file, or of a folder's files (their relative paths and contents, in sorted order)."""
    path = Path(path)
    digest = hashlib.sha256()
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    for file in files:
        if file != path:
            digest.update(file.relative_to(path).as_posix().encode() + b"\0")
        with open(file, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()


def model_record(adapter: str | None, config: str | None, checkpoint: str | None) -> dict[str, Any]:
    """What ``session.json`` says about the weights: resolved paths and the sha256 of the weights."""
    weights = adapter if adapter is not None else checkpoint
    return {
        "adapter": str(Path(adapter).resolve()) if adapter else None,
        "config": str(Path(config).resolve()) if config else None,
        "checkpoint": str(Path(checkpoint).resolve()) if checkpoint else None,
        "weights_sha256": sha256_of(weights) if weights else None,
    }


def allocate_world_folder(root: str | Path) -> Path:
    """A new empty folder ``root/world-<k>``, ``k`` after every existing world, made exclusively."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    k = 1 + max((int(m.group(1)) for p in root.iterdir() if (m := WORLD_FOLDER.fullmatch(p.name))), default=-1)
    while True:
        folder = root / f"world-{k}"
        try:
            folder.mkdir()  # exclusive: a folder another writer made first is never shared
            return folder
        except FileExistsError:
            k += 1


class RecordBudget:
    """The bytes all recordings of a server may hold together (thread-safe)."""

    def __init__(self, limit: int) -> None:
        self.limit, self.used = int(limit), 0
        self._lock = threading.Lock()

    def charge(self, nbytes: int) -> bool:
        """Count ``nbytes`` more; whether the total is still within the limit."""
        with self._lock:
            self.used += nbytes
            return self.used <= self.limit

    @property
    def exhausted(self) -> bool:
        """Whether no more may be recorded."""
        return self.used >= self.limit


class Recorder:
    """Writes one world's recording into a new folder under ``root`` (made at the first block); ``close`` finishes
    the mp4 and never raises."""

    def __init__(self, root: str | Path, session: Any, model: dict[str, Any], first_frame: np.ndarray,
                 budget: RecordBudget) -> None:
        self.root, self.session, self.model, self.budget = Path(root), session, model, budget
        self.first_frame = first_frame
        self.directory: Path | None = None
        self.writer: VideoWriter | None = None
        self.size = 0  # bytes this world's files hold (charged to the budget)
        self.closed = False

    def _open(self) -> None:
        from PIL import Image

        self.directory = allocate_world_folder(self.root)
        png, buffer = self.directory / "first_frame.png", io.BytesIO()
        Image.fromarray(self.first_frame).save(buffer, format="PNG")
        atomic_write_bytes(png, buffer.getvalue())
        s = self.session
        meta = {
            **self.model, "first_frame": str(png.resolve()), "first_frame_sha256": sha256_of(png),
            "caption": s.caption, "seed": s.seed, "num_steps": s.num_steps, "solver": s.solver, "fps": s.fps,
            "width": s.width, "height": s.height,
        }
        atomic_write_text(self.directory / "session.json", json.dumps(meta, indent=2) + "\n")
        self.writer = VideoWriter(self.directory / "video.mp4", s.fps)

    def write(self, frames: np.ndarray) -> bool:
        """Append a block's frames to the video and rewrite the camera track so far; False (nothing written) once
        the budget is spent."""
        if self.closed or self.budget.exhausted:
            return False
        if self.writer is None:
            self._open()
        self.writer.write(frames)
        save_trajectory(self.session.trajectory(), self.directory / "trajectory.npz")
        size = sum(p.stat().st_size for p in (self.directory / "first_frame.png", self.directory / "session.json",
                                              self.directory / "trajectory.npz", self.writer.temporary) if p.exists())
        self.size, grown = size, size - self.size
        return self.budget.charge(grown)

    def close(self) -> None:
        """Finish the mp4 (a world with no frames leaves no folder); a failure is one log line, and the frames
        encoded so far stay in the temporary file it names."""
        if self.closed:
            return
        self.closed = True
        if self.writer is None:
            return
        try:
            self.writer.close(keep_on_error=True)
        except Exception as e:
            kept = self.writer.temporary
            where = f"; the encoded frames are kept in {kept}" if kept.exists() else ""
            log.warning("solarwm play: recording %s: cannot finish video.mp4 (%s: %s)%s",
                        self.directory, type(e).__name__, e, where)

