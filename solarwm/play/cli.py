"""``solarwm play``: the command (weights, first frame, flags) around ``solarwm.play.server``."""

from __future__ import annotations

import os
import socket
import sys
import tempfile
from pathlib import Path

from solarwm.loading import (
    DEFAULT_CAPTION,
    DEFAULT_FIRST_FRAME,
    default_solver,
    load_causal,
    load_first_frame,
    shipped_adapter,
)
from solarwm.play.server import PlayError, WorldSpec
from solarwm.rollout.settings import check_frame_size, check_world

#: TCP ports (0: any free one, the banner names it).
MAX_PORT = 65535


def check_speeds(speed: float, turn_speed: float, max_speed: float, max_angular: float) -> None:
    """The key map's speeds and the limits a client's twist must keep; raises ``PlayError``."""
    import math

    values = {"speed": speed, "turn_speed": turn_speed, "max_speed": max_speed, "max_angular": max_angular}
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value) and value > 0):
            raise PlayError(f"{name} must be a finite number > 0, got {value!r}")
    if 2 * speed > max_speed or 2 * turn_speed > max_angular:
        raise PlayError(f"Shift doubles the speeds: 2*speed ({2 * speed:g}) and 2*turn_speed ({2 * turn_speed:g}) "
                        f"must not exceed max_speed ({max_speed:g}) and max_angular ({max_angular:g})")


def check_record_dir(record: str | None) -> None:
    """``record`` (if given) is a folder, or can be made, that this process can write into; nothing is created."""
    if record is None:
        return
    path = Path(record)
    if path.exists() and not path.is_dir():
        raise PlayError(f"--record {record}: exists and is not a folder")
    existing = next(p for p in (path, *path.parents) if p.exists())  # where the folder would be made
    if not existing.is_dir():
        raise PlayError(f"--record {record}: cannot write there ({existing} is not a folder)")
    try:
        fd, probe = tempfile.mkstemp(prefix=".solarwm-write-check-", dir=existing)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise PlayError(f"--record {record}: cannot write there ({e.strerror or e})") from None


def check_play_settings(
    caption: str, seed: int, num_steps: int, fps: float, width: int | None, height: int | None, fov: float,
    speed: float, turn_speed: float, max_speed: float, max_angular: float, smoothing: float, record: str | None,
) -> None:
    """Every setting of a served world, before anything is loaded; raises a ``ValueError`` naming the bad one."""
    check_world(caption=caption, seed=seed, num_steps=num_steps, fps=fps, fov=fov, width=width, height=height,
                smoothing=smoothing)
    check_speeds(speed, turn_speed, max_speed, max_angular)
    check_record_dir(record)


def build_spec(
    adapter: str | None = None, config: str | None = None, checkpoint: str | None = None,
    first_frame: str = DEFAULT_FIRST_FRAME, caption: str = DEFAULT_CAPTION, seed: int = 0, num_steps: int = 4,
    fps: float = 16.0, width: int | None = None, height: int | None = None, fov: float = 60.0,
    speed: float = 1.0, turn_speed: float = 45.0, max_speed: float = 10.0, max_angular: float = 360.0,
    smoothing: float = 0.0, record: str | None = None,
) -> WorldSpec:
    """The ``WorldSpec`` of the flags (shared by ``solarwm play`` and the benchmark), every setting checked."""
    from solarwm.play.recording import model_record

    check_play_settings(caption, seed, num_steps, fps, width, height, fov, speed, turn_speed, max_speed,
                        max_angular, smoothing, record)
    if adapter is None and checkpoint is None:
        adapter = shipped_adapter()  # named in session.json, so a recording says what replays it
    model = load_causal(adapter, config, checkpoint)
    image = load_first_frame(first_frame, width, height)
    check_frame_size(model, *image.shape[:2])
    return WorldSpec(
        adapter=model, model=model_record(adapter, config, checkpoint), first_frame=image,
        caption=caption, seed=seed, num_steps=num_steps, solver=default_solver(model), fps=fps, fov=fov,
        max_speed=max_speed, max_angular=max_angular, smoothing=smoothing, speed=speed, turn_speed=turn_speed,
        record=record,
    )


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port``; raises ``PlayError`` in one line (address in use, not this machine's)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host.strip("[]"), port), family=family)
    except OSError as e:
        raise PlayError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None


def play_command(
    adapter: str | None = None,
    config: str | None = None,
    checkpoint: str | None = None,
    first_frame: str = DEFAULT_FIRST_FRAME,
    caption: str = DEFAULT_CAPTION,
    host: str = "127.0.0.1",
    port: int = 7860,
    seed: int = 0,
    record: str | None = None,
    max_sessions: int = 1,
    num_steps: int = 4,
    fps: float = 16.0,
    width: int | None = None,
    height: int | None = None,
    fov: float = 60.0,
    speed: float = 1.0,
    turn_speed: float = 45.0,
    max_speed: float = 10.0,
    max_angular: float = 360.0,
    smoothing: float = 0.0,
    allow_origin: list[str] | None = None,
) -> int:
    """Serve a causal world model in the browser: steer the camera with the keyboard, watch the world stream.

    Args:
        adapter: an exported causal adapter folder (default: the shipped recipes/weights/tiny_causal).
        config: the recipe of --checkpoint (instead of --adapter).
        checkpoint: a Lightning checkpoint of a causal stage (needs --config).
        first_frame: an image file or a clip folder (default: a frame of the synthetic renderer).
        caption: the text prompt.
        host: address to bind (127.0.0.1: this machine only; any other address needs the token the URL carries).
        port: TCP port of the page and the WebSocket (0: any free one).
        seed: the noise seed of every world (a reset starts the same world again).
        record: write each world (trajectory.npz, video.mp4, first_frame.png, session.json) into a new folder
            DIR/world-<k> (never overwriting).
        max_sessions: worlds served at once; other clients get a "busy" error.
        num_steps: denoising steps per block.
        fps: frames per second of the world (the cameras' time step and the page's playback rate).
        width: generated width (default: the first frame's).
        height: generated height (default: the first frame's).
        fov: horizontal field of view of the camera, degrees.
        speed: W/A/S/D/Q/E speed in m/s (Shift doubles it).
        turn_speed: arrow-key and Z/C rotation speed in degrees/s (Shift doubles it).
        max_speed: the largest linear speed a move message may ask for (m/s).
        max_angular: the largest angular speed a move message may ask for (degrees/s).
        smoothing: damping time constant of the camera in seconds (0: off).
        allow_origin: further web origins (e.g. https://example.org) whose pages may open the WebSocket.
    """
    import uvicorn

    from solarwm.play.access import access_for, is_loopback
    from solarwm.play.server import MAX_WS_MESSAGE_BYTES, WorldServer

    if isinstance(max_sessions, bool) or not isinstance(max_sessions, int) or max_sessions < 1:
        raise PlayError(f"--max_sessions must be an integer >= 1, got {max_sessions!r}")
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= MAX_PORT:
        raise PlayError(f"--port must be an integer in [0, {MAX_PORT}], got {port!r}")
    access = access_for(host, allow_origin)
    spec = build_spec(adapter, config, checkpoint, first_frame, caption, seed, num_steps, fps, width, height,
                      fov, speed, turn_speed, max_speed, max_angular, smoothing, record)
    server = WorldServer(spec, max_sessions, access)
    listener = bind(host, port)  # the banner comes only once the socket is ours
    try:
        bound = listener.getsockname()[1]
        shown = socket.gethostname() if host in ("0.0.0.0", "::") else host
        url = f"http://{'[' + shown + ']' if ':' in shown else shown}:{bound}/"
        if access.token is not None:
            url += f"?token={access.token}"
        if not is_loopback(host):
            print(f"solarwm play: WARNING: listening on {host}: the world is exposed to the network; "
                  "only clients with the URL's token get in", file=sys.stderr, flush=True)
        print(f"solarwm play: {url}  ({spec.first_frame.shape[1]}x{spec.first_frame.shape[0]} at "
              f"{fps:g} fps, route {spec.adapter.route}; Ctrl-C to stop)", flush=True)
        config_ = uvicorn.Config(server.app, log_level="warning", ws_max_size=MAX_WS_MESSAGE_BYTES)
        try:
            uvicorn.Server(config_).run(sockets=[listener])
        finally:
            server.close_recordings()
    finally:
        listener.close()
    return 0
