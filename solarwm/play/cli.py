"""``solarwm play``: the command (weights, first frame, flags) around ``solarwm.play.server``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from solarwm.play.server import DEFAULT_ADAPTER, DEFAULT_CAPTION, DEFAULT_FIRST_FRAME, PlayError, WorldSpec


def load_causal(adapter: str | None, config: str | None = None, checkpoint: str | None = None) -> Any:
    """The causal route adapter (eval mode) of an export folder or of a recipe + Lightning checkpoint."""
    from solarwm.train_cli import _build_generator, _recipe

    if checkpoint is not None and adapter is not None:
        raise PlayError("give --adapter or --config with --checkpoint, not both")
    if checkpoint is not None and config is None:
        raise PlayError("--checkpoint needs the --config recipe it was trained with")
    if checkpoint is None and adapter is None:
        # The shipped model: relative to the working directory, else to this checkout's root.
        repo = Path(__file__).resolve().parents[2] / DEFAULT_ADAPTER
        adapter = DEFAULT_ADAPTER if Path(DEFAULT_ADAPTER).is_dir() or not repo.is_dir() else str(repo)
    if adapter is not None and not (Path(adapter) / "adapter.json").is_file():
        raise FileNotFoundError(f"{adapter}: not an adapter export folder (no adapter.json)"
                                + (" - the shipped tiny model is not in this checkout" if adapter.endswith(DEFAULT_ADAPTER) else ""))
    model, causal, _ = _build_generator(_recipe(config), config, checkpoint, adapter, True)
    if not causal:
        raise PlayError(f"{adapter or checkpoint}: play needs a causal model (a tf_anyflow or dmd export), "
                        "this one is bidirectional")
    return model.eval()


def load_first_frame(path: str, width: int | None = None, height: int | None = None) -> np.ndarray:
    """uint8 ``[H, W, 3]``: an image file or a clip folder's first frame, resized and centre-cropped like
    ``solarwm predict`` (default: its own size) and rounded, so a recording replays exactly."""
    import torch

    from solarwm.datamodules.clips import resize_crop
    from solarwm.train_cli import _first_frame

    image = _first_frame(Path(path))
    height, width = height or image.shape[0], width or image.shape[1]
    if (height, width) == image.shape[:2]:
        return np.ascontiguousarray(image)
    frame, _ = resize_crop(torch.from_numpy(image.copy()).permute(2, 0, 1)[None], np.zeros((1, 4)), width, height)
    return frame[0].round().clamp(0, 255).to(torch.uint8).permute(1, 2, 0).numpy()


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
    solver = "flowmap" if model.delta_embedding is not None else "renoise"
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
