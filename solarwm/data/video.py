"""Real mp4 read/write with PyAV: H.264 yuv420p, frames as uint8 ``[N, H, W, 3]`` RGB."""

from __future__ import annotations

import io
import os
from fractions import Fraction
from pathlib import Path
from typing import Any

import av
import numpy as np


class VideoError(ValueError):
    """A video could not be decoded or encoded; the message names the file."""


def rgb_to_yuv420p(frame: np.ndarray) -> np.ndarray:
    """RGB uint8 ``[H, W, 3]`` → planar yuv420p ``[H·3/2, W]`` (BT.601, limited range).

    Done in numpy because swscale's RGB→YUV path gave different bytes for the same frames
    across processes; this makes encoded mp4 files reproducible for a seed.
    """
    rgb = frame.astype(np.float32) / 255.0
    r, g, b = rgb[..., 0], rgb[..., 1], rgb[..., 2]
    y = 16.0 + 65.481 * r + 128.553 * g + 24.966 * b
    cb = 128.0 - 37.797 * r - 74.203 * g + 112.0 * b
    cr = 128.0 + 112.0 * r - 93.786 * g - 18.214 * b
    h, w = y.shape

    def half(c: np.ndarray) -> np.ndarray:
        return c.reshape(h // 2, 2, w // 2, 2).mean(axis=(1, 3)).reshape(h // 4, w)

    planes = [y, half(cb), half(cr)]
    return np.clip(np.rint(np.concatenate(planes, axis=0)), 0, 255).astype(np.uint8)


def _encode(container: Any, frames: np.ndarray, fps: float, crf: int) -> None:
    stream = container.add_stream("libx264", rate=Fraction(fps).limit_denominator(1001))
    stream.width, stream.height = frames.shape[2], frames.shape[1]
    stream.pix_fmt = "yuv420p"
    # Deterministic output: fixed x264 options, one thread (frame threading reorders bits).
    stream.options = {"crf": str(crf), "preset": "medium", "threads": "1"}
    stream.codec_context.thread_count = 1
    for frame in frames:
        for packet in stream.encode(av.VideoFrame.from_ndarray(rgb_to_yuv420p(frame), format="yuv420p")):
            container.mux(packet)
    for packet in stream.encode():
        container.mux(packet)


def write_video(path: str | Path, frames: np.ndarray, fps: float, crf: int = 18) -> Path:
    """Encode ``frames`` uint8 ``[N, H, W, 3]`` (even H and W) to an H.264 mp4, atomically."""
    path = Path(path)
    frames = np.asarray(frames)
    if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[-1] != 3 or len(frames) == 0:
        raise VideoError(f"{path}: frames must be uint8 [N,H,W,3] with N>0, got {frames.dtype} {list(frames.shape)}")
    if frames.shape[1] % 2 or frames.shape[2] % 2:
        raise VideoError(f"{path}: yuv420p needs even width and height, got {frames.shape[2]}x{frames.shape[1]}")
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with av.open(str(tmp), mode="w", format="mp4") as container:
            _encode(container, frames, fps, crf)
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def encode_video_bytes(frames: np.ndarray, fps: float, crf: int = 18) -> bytes:
    """Encode ``frames`` uint8 ``[N, H, W, 3]`` to mp4 bytes in memory."""
    buf = io.BytesIO()
    with av.open(buf, mode="w", format="mp4") as container:
        _encode(container, np.asarray(frames), fps, crf)
    return buf.getvalue()


def _decode(source: Any, name: str) -> np.ndarray:
    try:
        with av.open(source) as container:
            frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    except (av.error.FFmpegError, ValueError, IndexError) as e:
        raise VideoError(f"{name}: cannot decode video: {e}") from e
    if not frames:
        raise VideoError(f"{name}: no video frames decoded")
    return np.stack(frames)


def read_video(path: str | Path) -> np.ndarray:
    """Decode every frame of a video file to uint8 ``[N, H, W, 3]`` RGB; raises ``VideoError``."""
    path = Path(path)
    if not path.is_file():
        raise VideoError(f"{path}: video file not found")
    return _decode(str(path), str(path))


def read_video_bytes(data: bytes, name: str = "<bytes>") -> np.ndarray:
    """Decode an in-memory video (e.g. a WebDataset member) to uint8 ``[N, H, W, 3]``."""
    return _decode(io.BytesIO(data), name)


def probe_video(path: str | Path) -> dict[str, Any]:
    """Container metadata without decoding pixels: fps, width, height, num_frames, codec."""
    path = Path(path)
    try:
        with av.open(str(path)) as container:
            s = container.streams.video[0]
            num_frames = s.frames or sum(1 for p in container.demux(s) if p.size)
            return {
                "fps": float(s.average_rate) if s.average_rate else None,
                "width": s.codec_context.width,
                "height": s.codec_context.height,
                "num_frames": int(num_frames),
                "codec": s.codec_context.name,
            }
    except (av.error.FFmpegError, IndexError) as e:
        raise VideoError(f"{path}: cannot probe video: {e}") from e
