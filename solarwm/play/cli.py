"""``solarwm play``: the command (weights, first frame, flags) around ``solarwm.play.server``."""

from __future__ import annotations

from pathlib import Path


from solarwm.loading import DEFAULT_CAPTION, DEFAULT_FIRST_FRAME, default_solver, load_causal, load_first_frame
from solarwm.play.server import PlayError, WorldSpec


def build_spec(
    adapter: str | None = None, config: str | None = None, checkpoint: str | None = None,
    first_frame: str = DEFAULT_FIRST_FRAME, caption: str = DEFAULT_CAPTION, seed: int = 0, num_steps: int = 4,
    fps: float = 16.0, width: int | None = None, height: int | None = None, fov: float = 60.0,
    speed: float = 1.0, turn_speed: float = 45.0, max_speed: float = 10.0, max_angular: float = 360.0,
    smoothing: float = 0.0, record: str | None = None,
) -> WorldSpec:
    """The ``WorldSpec`` of the flags (shared by ``solarwm play``, the Gym environment and the benchmark)."""
    if not (fps > 0 and 0 < fov < 180 and speed > 0 and turn_speed > 0 and max_speed > 0 and max_angular > 0):
        raise PlayError("fps, speed, turn_speed, max_speed and max_angular must be > 0 and fov in (0, 180)")
    if 2 * speed > max_speed or 2 * turn_speed > max_angular:
        raise PlayError(f"Shift doubles the speeds: 2*speed ({2 * speed:g}) and 2*turn_speed ({2 * turn_speed:g}) "
                        f"must not exceed max_speed ({max_speed:g}) and max_angular ({max_angular:g})")
    model = load_causal(adapter, config, checkpoint)
    image = load_first_frame(first_frame, width, height)
    solver = default_solver(model)
    s = model.spatial_compression * model.patch_size
    if image.shape[0] % s or image.shape[1] % s:
        raise PlayError(f"frame size {image.shape[1]}x{image.shape[0]} must be a multiple of {s} for route {model.route}")
    return WorldSpec(
        adapter=model, adapter_path=str(Path(adapter).resolve()) if adapter else str(checkpoint), first_frame=image,
        caption=caption, seed=seed, num_steps=num_steps, solver=solver, fps=fps, fov=fov, max_speed=max_speed,
        max_angular=max_angular, smoothing=smoothing, speed=speed, turn_speed=turn_speed, record=record,
    )


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
) -> int:
    """Serve a causal world model in the browser: steer the camera with the keyboard, watch the world stream.

    Args:
        adapter: an exported causal adapter folder (default: the shipped recipes/weights/tiny_causal).
        config: the recipe of --checkpoint (instead of --adapter).
        checkpoint: a Lightning checkpoint of a causal stage (needs --config).
        first_frame: an image file or a clip folder (default: a frame of the synthetic renderer).
        caption: the text prompt.
        host: address to bind (127.0.0.1: this machine only).
        port: TCP port of the page and the WebSocket.
        seed: the noise seed of every world (a reset starts the same world again).
        record: write each world (trajectory.npz, video.mp4, first_frame.png, session.json) into this folder.
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
    """
    import uvicorn

    from solarwm.play.server import WorldServer

    spec = build_spec(adapter, config, checkpoint, first_frame, caption, seed, num_steps, fps, width, height, fov,
                      speed, turn_speed, max_speed, max_angular, smoothing, record)
    server = WorldServer(spec, max_sessions)
    print(f"solarwm play: http://{host}:{port}/  ({spec.first_frame.shape[1]}x{spec.first_frame.shape[0]} at "
          f"{fps:g} fps, route {spec.adapter.route}; Ctrl-C to stop)", flush=True)
    try:
        uvicorn.run(server.app, host=host, port=port, log_level="warning")
    finally:
        server.close_recordings()
    return 0
