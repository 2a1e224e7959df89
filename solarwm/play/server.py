"""``solarwm play``: a causal world model in the browser.

FastAPI + uvicorn. ``GET /`` serves the one static page (``solarwm/play/static/index.html``, plain HTML +
JavaScript); ``GET /config.json`` tells it the target fps, the block size and the key map's speeds; the
world streams over the WebSocket ``/ws`` (the wire protocol: docs/play-protocol.md). Each connection is one
world (a ``RolloutSession`` driven by a ``CameraController``): the twist in force when a block starts
drives all of that block's frames, so control latency is one block.

The server paces generation to real time: it starts a block only when the client has less than one block
of frames left to show, so a command waits at most one block (plus the block's generation) and a fast
machine does not run ahead of the viewer; the clock runs on across a reset. Safe by default: 127.0.0.1, the
``Host``/``Origin``/token rules of ``solarwm.play.access``, at most ``max_sessions`` worlds at once (another
client gets ``{"type": "error", "message": "busy: ..."}``), the limits below on what one client can make the
server do, a disconnect frees its world after the block in flight, and Ctrl-C finishes every recording.
Worlds share one model, whose forward keeps per-call state on its modules, so the model runs one world's
call at a time (``WorldServer.model_lock``).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import logging
import math
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from fastapi import WebSocket  # at module level: FastAPI resolves the endpoint's annotation here

from solarwm.camera.controller import CameraController, ControlError, check_twist
from solarwm.play.access import Access, access_for, guard
from solarwm.play.recording import RecordBudget, Recorder

STATIC = Path(__file__).parent / "static"
log = logging.getLogger("solarwm.play")
#: Resets one connection may ask for; later ones get an error and change nothing.
MAX_RESETS = 100
#: The longest client message (characters) that is parsed; a longer one gets an error.
MAX_MESSAGE_CHARS = 4096
#: The largest WebSocket message the transport takes (bytes); a larger one closes the connection (code 1009).
MAX_WS_MESSAGE_BYTES = 1 << 20
#: Bytes all recordings of one server may hold together; recording stops after the block that crosses it.
MAX_RECORDED_BYTES = 8 << 30


class PlayError(ValueError):
    """A bad ``solarwm play`` setting (weights that are not causal, a frame size the route cannot take)."""


@dataclass
class WorldSpec:
    """Everything a new world is built from (one per server)."""

    adapter: Any  # the loaded causal route adapter
    model: dict[str, Any]  # what session.json records about the weights (``recording.model_record``)
    first_frame: np.ndarray  # uint8 [H, W, 3] at the generated size: exactly what the session uses
    caption: str
    seed: int
    num_steps: int
    solver: str
    fps: float
    fov: float
    max_speed: float
    max_angular: float
    smoothing: float = 0.0
    speed: float = 1.0
    turn_speed: float = 45.0
    record: str | None = None
    jpeg_quality: int = 90

    @property
    def K(self) -> np.ndarray:
        """Pixel intrinsics of the generated frames: square pixels, centred, horizontal field of view ``fov``."""
        h, w = self.first_frame.shape[:2]
        f = w / (2.0 * math.tan(math.radians(self.fov) / 2.0))
        return np.array([f, f, w / 2.0, h / 2.0])

    def new_session(self) -> Any:
        """A fresh ``RolloutSession`` at the start pose."""
        from solarwm.rollout.session import RolloutSession

        return RolloutSession(self.adapter, self.first_frame, self.caption, self.K, self.fps, self.seed,
                              self.num_steps, self.solver)


def parse_message(text: str, max_speed: float, max_angular: float) -> dict[str, Any]:
    """One client message, checked: ``move`` (with its twist), ``reset``, ``pause`` or ``resume``; raises
    ``ControlError`` for anything else, whatever the input."""
    if len(text) > MAX_MESSAGE_CHARS:
        raise ControlError(f"message has {len(text)} characters, at most {MAX_MESSAGE_CHARS}")
    try:
        message = json.loads(text, parse_constant=lambda c: float("nan"))
    except (ValueError, RecursionError):  # JSONDecodeError, or nesting deeper than the parser's recursion
        raise ControlError("message is not JSON (or nested too deeply)") from None
    if not isinstance(message, dict) or not isinstance(message.get("type"), str):
        raise ControlError('message must be a JSON object with a "type"')
    kind = message["type"]
    if kind == "move":
        for key in ("velocity", "angular"):
            value = message.get(key)
            numbers = isinstance(value, list) and all(
                isinstance(x, (int, float)) and not isinstance(x, bool) for x in value)
            if not numbers:
                raise ControlError(f'move needs "{key}": a list of 3 numbers')
        try:
            twist = check_twist(message["velocity"], message["angular"], max_speed, max_angular)
        except OverflowError:  # an integer beyond float range
            raise ControlError("velocity and angular must be finite numbers") from None
        return {"type": "move", "twist": twist}
    if kind in ("reset", "pause", "resume"):
        return {"type": kind}
    raise ControlError(f"unknown message type {kind!r} (move, reset, pause, resume)")


def jpeg(frame: np.ndarray, quality: int) -> bytes:
    """A uint8 ``[H, W, 3]`` frame as JPEG bytes."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(frame).save(buffer, format="JPEG", quality=quality)
    return buffer.getvalue()


@dataclass
class _Client:
    """What the receiving task shares with the generating loop of one connection."""

    twist: np.ndarray = field(default_factory=lambda: np.zeros(6))
    running: asyncio.Event = field(default_factory=asyncio.Event)
    reset: bool = False
    resets: int = 0
    gone: bool = False


class WorldServer:
    """The ASGI app of ``solarwm play`` around one ``WorldSpec``; ``app`` is the application behind the access
    rules (``access``, default: a loopback bind), ``api`` the FastAPI application inside it."""

    def __init__(self, spec: WorldSpec, max_sessions: int = 1, access: Access | None = None,
                 max_recorded_bytes: int = MAX_RECORDED_BYTES) -> None:
        from fastapi import FastAPI
        from fastapi.responses import FileResponse, JSONResponse

        if max_sessions < 1:
            raise PlayError(f"max_sessions must be >= 1, got {max_sessions}")
        self.spec, self.max_sessions = spec, max_sessions
        self.access = access if access is not None else access_for("127.0.0.1")
        self.active = 0
        self.recorders: set[Recorder] = set()
        self.budget = RecordBudget(max_recorded_bytes)
        self.model_lock = threading.Lock()  # one model call at a time: worlds share the model's modules

        @contextlib.asynccontextmanager
        async def lifespan(app: Any) -> Any:
            yield
            self.close_recordings()  # server shutdown (Ctrl-C): every mp4 is finished

        # No /docs, /redoc or /openapi.json: the server has three routes and exposes nothing else.
        self.api = FastAPI(title="solarwm play", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
        page = STATIC / "index.html"
        self.api.add_api_route("/", lambda: FileResponse(page, media_type="text/html"), methods=["GET"])
        self.api.add_api_route("/config.json", lambda: JSONResponse(self.config()), methods=["GET"])
        self.api.add_api_websocket_route("/ws", self.serve)
        self.app = guard(self.api, self.access)

    def config(self) -> dict[str, Any]:
        """What the page needs: target fps, frames per block, frame size, speeds and limits."""
        s = self.spec
        session_frames = s.adapter.latent_to_pixel_frame(2 * s.adapter.frames_per_block)
        block = int(session_frames[-1] - session_frames[s.adapter.frames_per_block - 1])
        return {
            "fps": s.fps, "frames_per_block": block, "block_seconds": block / s.fps,
            "width": int(s.first_frame.shape[1]), "height": int(s.first_frame.shape[0]),
            "speed": s.speed, "turn_speed": s.turn_speed, "max_speed": s.max_speed, "max_angular": s.max_angular,
            "caption": s.caption, "recording": s.record is not None,
        }

    def close_recordings(self) -> None:
        """Finish every open recording (server shutdown, Ctrl-C)."""
        for recorder in list(self.recorders):
            self._end_world(recorder)

    def _new_world(self) -> tuple[Any, CameraController, Recorder | None]:
        """A session, its controller and (with ``--record``) its recorder, which makes the world's folder at its
        first block."""
        with self.model_lock:
            session = self.spec.new_session()
        controller = CameraController(self.spec.fps, smoothing=self.spec.smoothing)
        recorder = None
        if self.spec.record is not None:
            recorder = Recorder(self.spec.record, session, self.spec.model, self.spec.first_frame, self.budget)
            self.recorders.add(recorder)
        return session, controller, recorder

    def _step(self, session: Any, cameras: np.ndarray) -> np.ndarray:
        with self.model_lock:
            return session.step(cameras)

    def _end_world(self, recorder: Recorder | None) -> None:
        """Finish a world's recording (never raises: a failure is one log line)."""
        if recorder is not None:
            self.recorders.discard(recorder)
            recorder.close()

    async def _receive(self, websocket: Any, client: _Client) -> None:
        """Read client messages until it disconnects; a bad one gets an error message and changes nothing."""
        try:
            while True:
                message = await websocket.receive()
                if message["type"] == "websocket.disconnect":
                    break
                text = message.get("text")
                try:
                    if text is None:
                        raise ControlError("messages must be JSON text, not binary")
                    parsed = parse_message(text, self.spec.max_speed, self.spec.max_angular)
                    if parsed["type"] == "reset" and client.resets >= MAX_RESETS:
                        raise ControlError(f"reset refused: a connection may reset at most {MAX_RESETS} times")
                except Exception as e:  # whatever one message raises, the world goes on
                    why = str(e) if isinstance(e, ControlError) else f"message not understood ({type(e).__name__})"
                    await websocket.send_json({"type": "error", "message": why})
                    continue
                if parsed["type"] == "move":
                    client.twist = parsed["twist"]
                elif parsed["type"] == "pause":
                    client.running.clear()
                elif parsed["type"] == "resume":
                    client.running.set()
                else:
                    client.resets += 1
                    client.reset = True
                    client.running.set()
        except Exception:  # a broken connection ends the world like a disconnect
            pass
        finally:
            client.gone = True
            client.running.set()

    async def serve(self, websocket: WebSocket) -> None:
        """One connection: a world streamed block after block until the client leaves."""
        await websocket.accept()
        if self.active >= self.max_sessions:
            await websocket.send_json({"type": "error", "message": f"busy: {self.active} of {self.max_sessions} "
                                                                    "worlds are running; try again later"})
            await websocket.close(code=1013)
            return
        self.active += 1
        client = _Client()
        client.running.set()
        receiver = asyncio.create_task(self._receive(websocket, client))
        world: list[Any] = [None]  # the current world's recorder, also after a reset
        try:
            await self._stream(websocket, client, world)
        except Exception as e:  # the world ends; the server goes on
            log.warning("solarwm play: a world stopped: %s: %s", type(e).__name__, e)
            if not client.gone:
                with contextlib.suppress(Exception):
                    await websocket.send_json({"type": "error", "message": f"world stopped: {e}"})
        finally:
            self.active -= 1  # first: nothing below may keep the slot
            receiver.cancel()
            await asyncio.to_thread(self._end_world, world[0])
            with contextlib.suppress(Exception):
                await websocket.close()

    async def _stream(self, websocket: Any, client: _Client, world: list[Any]) -> None:
        spec = self.spec
        session, controller, world[0] = await asyncio.to_thread(self._new_world)
        # The client's playback clock: frames sent against wall time. It runs on across resets, so a reset
        # cannot make the server generate faster than the client plays.
        t0, shown = time.perf_counter(), 0
        while True:
            await client.running.wait()
            if client.gone:
                return
            if client.reset:
                client.reset = False
                recorder, world[0] = world[0], None
                await asyncio.to_thread(self._end_world, recorder)
                session, controller, world[0] = await asyncio.to_thread(self._new_world)
            block = session.next_block_frames
            # Pace to real time: start a block once the client has at most one block of frames left to show.
            ahead = shown / spec.fps - (time.perf_counter() - t0)
            if ahead > block / spec.fps:
                await asyncio.sleep(ahead - block / spec.fps)
                continue  # re-check pause/reset/disconnect; the twist is read when the block starts
            if ahead < 0:
                t0 = time.perf_counter() - shown / spec.fps  # generation fell behind: no catch-up burst
            twist = client.twist.copy()  # the twist in force when the block starts drives all its frames
            cameras = controller.frames(block, twist[:3], twist[3:])
            start = time.perf_counter()
            frames = await asyncio.to_thread(self._step, session, cameras)
            seconds = time.perf_counter() - start
            if world[0] is not None and not await asyncio.to_thread(world[0].write, frames):
                recorder, world[0] = world[0], None
                await asyncio.to_thread(self._end_world, recorder)
                if not client.gone:
                    await websocket.send_json({"type": "error", "message": "recording stopped: the recordings of "
                                               f"this server reached their limit of {self.budget.limit} bytes"})
            if client.gone:
                return
            for frame in frames:
                await websocket.send_bytes(jpeg(frame, spec.jpeg_quality))
            shown += len(frames)
            await websocket.send_json({
                "type": "block", "index": session.blocks - 1, "frames": len(frames), "c2w": cameras.tolist(),
                "gen_ms": round(seconds * 1000.0, 1), "fps": round(len(frames) / max(seconds, 1e-9), 2),
            })
