"""Shared fixtures of the interactive-world tests: a tiny random-weight causal adapter, a first frame, a track."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from commands import solarwm_argv

#: The predict run the session must reproduce bit for bit (recorded before the session refactor).
REFERENCE = Path(__file__).parents[1] / "fixtures" / "session_reference.npz"
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


def free_port() -> int:
    """A TCP port nobody listens on now."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PlayServer:
    """``solarwm play ARGS`` as a subprocess on a free port; ``stop()`` sends Ctrl-C (SIGINT) and waits."""

    def __init__(self, args: list[str], startup_s: float = 300.0) -> None:
        import os
        import subprocess
        import time
        import urllib.request

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(Path(os.environ.get("TMPDIR", "/tmp")) / f"solarwm-play-{self.port}.log", "w+")
        self.process = subprocess.Popen(
            [*solarwm_argv(), "play", "--port", str(self.port), *args],
            stdout=self.log, stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + startup_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"solarwm play exited with {self.process.returncode}: {self.output()}")
            try:
                with urllib.request.urlopen(self.url + "/config.json", timeout=2) as r:
                    self.config = __import__("json").loads(r.read())
                    return
            except OSError:
                time.sleep(1.0)
        self.stop()
        raise RuntimeError(f"solarwm play did not start in {startup_s} s: {self.output()}")

    def output(self) -> str:
        self.log.flush()
        self.log.seek(0)
        return self.log.read()[-4000:]

    def stop(self, timeout: float = 120.0) -> int:
        import signal
        import subprocess

        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


class World:
    """A client connection that got a world (not a busy error); ``recv`` sees messages read while checking."""

    def __init__(self, ws, pending: list) -> None:
        self.ws, self.pending = ws, pending

    async def recv(self):
        return self.pending.pop(0) if self.pending else await self.ws.recv()

    async def send(self, message) -> None:
        await self.ws.send(message)

    async def close(self) -> None:
        await self.ws.close()


async def open_world(port: int, timeout: float = 240.0) -> World:
    """Connect to ``solarwm play`` on ``port``, retrying while the server is busy.

    The previous world's in-flight block may still run.
    """
    import asyncio
    import time

    import websockets

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ws = await websockets.connect(f"ws://127.0.0.1:{port}/ws")
        try:
            first = await asyncio.wait_for(ws.recv(), 1.0)
        except asyncio.TimeoutError:
            return World(ws, [])
        if isinstance(first, str) and "busy" in first:
            await ws.close()
            await asyncio.sleep(1.0)
            continue
        return World(ws, [first])
    raise AssertionError("the server never freed its session")
