"""Real mp4 read/write with PyAV: H.264 yuv420p, frames as uint8 ``[N, H, W, 3]`` RGB."""

from __future__ import annotations

import io
from fractions import Fraction
from pathlib import Path
from typing import Any

import av
import numpy as np

from solarwm.util.atomic import unique_suffix


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


class _H264Stream:
    """The one encoder path: uint8 RGB chunks → H.264 yuv420p packets muxed into ``container``.

    Deterministic output: fixed x264 options, one thread (frame threading reorders bits),
    mb-tree off (libx264's asm mb-tree path gave run-to-run different bytes for the same frames
    at small sizes, e.g. 64x64 and 48x32, so two executors could not produce the same corpus)
    and the numpy colour conversion of `rgb_to_yuv420p`.
    Each frame is converted, encoded and muxed as it arrives, so memory does not grow with
    the number of frames.
    """

    def __init__(self, container: Any, fps: float, crf: int, name: str) -> None:
        self.container, self.fps, self.crf, self.name = container, fps, crf, name
        self.stream: Any = None
        self.num_frames = 0

    def write(self, frames: np.ndarray) -> None:
        """Encode a uint8 ``[n, H, W, 3]`` chunk; the first non-empty chunk fixes H and W."""
        frames = np.asarray(frames)
        if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[-1] != 3:
            raise VideoError(f"{self.name}: frames must be uint8 [N,H,W,3], got {frames.dtype} {list(frames.shape)}")
        if len(frames) == 0:
            return
        height, width = frames.shape[1:3]
        if self.stream is None:
            if height % 2 or width % 2:
                raise VideoError(f"{self.name}: yuv420p needs even width and height, got {width}x{height}")
            self.stream = self.container.add_stream("libx264", rate=Fraction(self.fps).limit_denominator(1001))
            self.stream.width, self.stream.height = width, height
            self.stream.pix_fmt = "yuv420p"
            self.stream.options = {"crf": str(self.crf), "preset": "medium", "threads": "1", "x264-params": "mbtree=0"}
            self.stream.codec_context.thread_count = 1
        elif (width, height) != (self.stream.width, self.stream.height):
            raise VideoError(
                f"{self.name}: frame size {width}x{height} differs from the first frames' "
                f"{self.stream.width}x{self.stream.height}"
            )
        for frame in frames:
            yuv = av.VideoFrame.from_ndarray(rgb_to_yuv420p(frame), format="yuv420p")
            for packet in self.stream.encode(yuv):
                self.container.mux(packet)
        self.num_frames += len(frames)

    def flush(self) -> None:
        """Drain the encoder's delayed packets; a video needs at least one frame."""
        if self.stream is None:
            raise VideoError(f"{self.name}: no frames written")
        for packet in self.stream.encode():
            self.container.mux(packet)


class VideoWriter:
    """Stream frames into an H.264 mp4 chunk by chunk; the file appears only when closed.

    ``with VideoWriter(path, fps) as w: w.write(chunk)`` — frames go to a temporary file
    next to ``path`` that `close` renames into place; an exception inside the ``with`` block
    (or `abort`) removes it, so a reader never sees a half-written video.
    """

    def __init__(self, path: str | Path, fps: float, crf: int = 18) -> None:
        self.path = Path(path)
        self._tmp = self.path.with_name(f".{self.path.name}.{unique_suffix()}.tmp")
        try:
            self._container = av.open(str(self._tmp), mode="w", format="mp4")
        except av.error.FFmpegError as e:
            raise VideoError(f"{self.path}: cannot open for writing: {e}") from e
        self._encoder = _H264Stream(self._container, fps, crf, str(self.path))
        self._closed = False

    @property
    def num_frames(self) -> int:
        """Frames written so far."""
        return self._encoder.num_frames

    def write(self, frames: np.ndarray) -> None:
        """Append uint8 ``[n, H, W, 3]`` RGB frames (even H and W, fixed by the first chunk)."""
        if self._closed:
            raise VideoError(f"{self.path}: writer is closed")
        try:
            self._encoder.write(frames)
        except av.error.FFmpegError as e:
            raise VideoError(f"{self.path}: cannot encode video: {e}") from e

    @property
    def temporary(self) -> Path:
        """The file the frames go to until ``close`` moves it into place."""
        return self._tmp

    def close(self, keep_on_error: bool = False) -> Path:
        """Flush the encoder and move the finished file into place; on failure no file appears at ``path``, and
        the temporary file is removed unless ``keep_on_error`` (then it holds what was encoded)."""
        if self._closed:
            return self.path
        try:
            self._encoder.flush()
            self._container.close()
            self._closed = True
            self._tmp.replace(self.path)
        except av.error.FFmpegError as e:
            self._fail(keep_on_error)
            raise VideoError(f"{self.path}: cannot encode video: {e}") from e
        except BaseException:
            self._fail(keep_on_error)
            raise
        return self.path

    def _fail(self, keep: bool) -> None:
        if not keep:
            self.abort()
        elif not self._closed:
            self._closed = True
            try:
                self._container.close()
            except Exception:  # the caller's error is the one that matters; what reached the file stays
                pass

    def abort(self) -> None:
        """Drop everything written so far: close the encoder and remove the temporary file."""
        if not self._closed:
            self._closed = True
            try:
                self._container.close()
            except Exception:  # the file is discarded; the caller's error is the one that matters
                pass
        self._tmp.unlink(missing_ok=True)

    def __enter__(self) -> "VideoWriter":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


def write_video(path: str | Path, frames: np.ndarray, fps: float, crf: int = 18) -> Path:
    """Encode ``frames`` uint8 ``[N, H, W, 3]`` (even H and W) to an H.264 mp4, atomically."""
    with VideoWriter(path, fps, crf) as writer:
        writer.write(frames)
    return writer.path


def encode_video_bytes(frames: np.ndarray, fps: float, crf: int = 18) -> bytes:
    """Encode ``frames`` uint8 ``[N, H, W, 3]`` to mp4 bytes in memory."""
    buf = io.BytesIO()
    with av.open(buf, mode="w", format="mp4") as container:
        encoder = _H264Stream(container, fps, crf, "<bytes>")
        encoder.write(frames)
        encoder.flush()
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


def probe_video(path: str | Path | bytes) -> dict[str, Any]:
    """Container metadata without decoding pixels: fps, width, height, num_frames, codec (file path or mp4 bytes)."""
    source = io.BytesIO(path) if isinstance(path, bytes) else str(path)
    path = "<bytes>" if isinstance(path, bytes) else Path(path)
    try:
        with av.open(source) as container:
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


def read_video_frames(source: str | Path | bytes, indices: Any, name: str | None = None) -> np.ndarray:
    """Decode only frames ``indices`` (any order, repeats allowed) → uint8 ``[len(indices), H, W, 3]``.

    Streams the file once and keeps just the frames asked for, so a window of an hour-long
    video costs the memory of the window; raises ``VideoError`` if the video ends first.
    """
    idx = np.asarray(indices, dtype=np.int64).reshape(-1)
    name = name or ("<bytes>" if isinstance(source, bytes) else str(source))
    if isinstance(source, (str, Path)) and not Path(source).is_file():
        raise VideoError(f"{name}: video file not found")
    wanted = set(int(i) for i in idx)
    last = int(idx.max()) if len(idx) else -1
    kept: dict[int, np.ndarray] = {}
    try:
        with av.open(io.BytesIO(source) if isinstance(source, bytes) else str(source)) as container:
            for n, frame in enumerate(container.decode(video=0)):
                if n in wanted:
                    kept[n] = frame.to_ndarray(format="rgb24")
                if n >= last:
                    break
    except (av.error.FFmpegError, ValueError, IndexError) as e:
        raise VideoError(f"{name}: cannot decode video: {e}") from e
    missing = sorted(wanted - set(kept))
    if missing:
        raise VideoError(f"{name}: video ends before frame {missing[0]}")
    return np.stack([kept[int(i)] for i in idx]) if len(idx) else np.zeros((0, 0, 0, 3), np.uint8)


def to_uint8_frames(video: Any) -> np.ndarray:
    """A video tensor ``[3, F, H, W]`` in [-1, 1] → uint8 RGB frames ``[F, H, W, 3]`` (for ``write_video``)."""
    # Rounded in float, then cast through numpy: this module stays importable without torch.
    x = ((video.detach().float().clamp(-1, 1) + 1) * 127.5).round()
    return x.permute(1, 2, 3, 0).cpu().numpy().astype(np.uint8)
