"""`VideoWriter`: chunked mp4 encoding, byte-identical to `write_video`, atomic on close."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from solarwm.data.video import (
    VideoError,
    VideoWriter,
    encode_video_bytes,
    probe_video,
    read_video,
    read_video_bytes,
    write_video,
)


def _frames(n: int, h: int = 48, w: int = 64) -> np.ndarray:
    """Smooth moving gradients (what H.264 at crf 18 reproduces closely)."""
    t, y, x = np.meshgrid(np.arange(n), np.arange(h), np.arange(w), indexing="ij")
    return np.stack([(3 * x + 5 * t) % 256, 4 * y, (x + y + 7 * t) % 256], axis=-1).astype(np.uint8)


def _noise(n: int, h: int = 48, w: int = 64) -> np.ndarray:
    # For byte comparisons: libx264's asm mbtree path gives run-to-run different bytes for some
    # small frame sizes with motion (even in one process); uncorrelated noise does not reach it.
    return (np.random.default_rng(0).random((n, h, w, 3)) * 255).astype(np.uint8)


def test_chunks_give_the_same_bytes_as_write_video(tmp_path):
    frames = _noise(11)
    write_video(tmp_path / "whole.mp4", frames, 16.0)
    with VideoWriter(tmp_path / "chunks.mp4", 16.0) as writer:
        bounds = [0, 3, 4, 9, 11]  # uneven chunks, one of a single frame
        for start, stop in zip(bounds, bounds[1:]):
            writer.write(frames[start:stop])
        assert writer.num_frames == 11
    assert (tmp_path / "chunks.mp4").read_bytes() == (tmp_path / "whole.mp4").read_bytes()
    assert probe_video(tmp_path / "chunks.mp4")["num_frames"] == 11
    # In-memory encoding shares the encoder path: the same pixels (the containers' headers differ).
    assert np.array_equal(read_video_bytes(encode_video_bytes(frames, 16.0)), read_video(tmp_path / "chunks.mp4"))


def test_written_video_decodes_to_the_frames(tmp_path):
    frames = _frames(9)
    with VideoWriter(tmp_path / "v.mp4", 12.0) as writer:
        writer.write(frames[:5])
        writer.write(frames[5:])
    decoded = read_video(tmp_path / "v.mp4")
    assert decoded.shape == frames.shape
    assert np.abs(decoded.astype(int) - frames.astype(int)).mean() < 4  # lossy, but close
    assert probe_video(tmp_path / "v.mp4")["fps"] == 12.0


def test_exception_inside_with_leaves_no_file(tmp_path):
    out = tmp_path / "out.mp4"
    with pytest.raises(RuntimeError, match="producer failed"):
        with VideoWriter(out, 16.0) as writer:
            writer.write(_frames(4))
            raise RuntimeError("producer failed")
    assert list(tmp_path.iterdir()) == []


def test_size_mismatch_names_the_file_and_leaves_no_file(tmp_path):
    out = tmp_path / "out.mp4"
    with pytest.raises(VideoError, match=r"out\.mp4.*32x32.*64x48"):
        with VideoWriter(out, 16.0) as writer:
            writer.write(_frames(2))
            writer.write(_frames(2, h=32, w=32))
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("frames, match", [
    (np.zeros((2, 48, 64, 3), np.float32), "uint8"),
    (np.zeros((48, 64, 3), np.uint8), r"\[N,H,W,3\]"),
    (np.zeros((2, 47, 64, 3), np.uint8), "even width and height"),
    (np.zeros((0, 48, 64, 3), np.uint8), "no frames written"),
])
def test_bad_frames_are_named_errors(tmp_path, frames, match):
    with pytest.raises(VideoError, match=match):
        write_video(tmp_path / "bad.mp4", frames, 16.0)
    assert list(tmp_path.iterdir()) == []


def test_close_is_idempotent_and_write_after_close_fails(tmp_path):
    writer = VideoWriter(tmp_path / "v.mp4", 8.0)
    writer.write(_frames(3))
    assert writer.close() == tmp_path / "v.mp4"
    assert writer.close() == tmp_path / "v.mp4"
    with pytest.raises(VideoError, match="closed"):
        writer.write(_frames(1))
    assert [p.name for p in tmp_path.iterdir()] == ["v.mp4"]


def test_memory_does_not_grow_with_frames(tmp_path):
    chunk = _frames(8)

    def peak_bytes(chunks: int) -> int:
        tracemalloc.start()
        with VideoWriter(tmp_path / f"m{chunks}.mp4", 16.0) as writer:
            for _ in range(chunks):
                writer.write(chunk)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        return peak

    small, large = peak_bytes(4), peak_bytes(40)
    # Ten times the frames: a writer that kept frames would hold ~10x the 74 KB per chunk.
    assert large < small + 4 * chunk.nbytes
