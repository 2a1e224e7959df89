"""``solarwm.loading``: first frames (bit depths, sizes, bad files), the solver rule, and the models it loads."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from solarwm.loading import (
    DEFAULT_FIRST_FRAME,
    MAX_FIRST_FRAME_PIXELS,
    LoadError,
    default_solver,
    load_causal,
    load_first_frame,
    read_first_frame,
)


def test_a_16_bit_grey_png_is_scaled_to_8_bits_not_clipped(tmp_path: Path) -> None:
    ramp = np.linspace(0, 65535, 64 * 48).reshape(48, 64).astype(np.uint16)
    path = tmp_path / "deep.png"
    Image.fromarray(ramp).save(path)
    assert Image.open(path).mode.startswith("I;16")  # the file really is 16-bit
    frame = read_first_frame(path)
    assert frame.dtype == np.uint8 and frame.shape == (48, 64, 3)
    expected = np.rint(ramp / 257.0).astype(np.uint8)
    assert np.array_equal(frame[..., 0], expected) and np.array_equal(frame[..., 2], expected)
    assert (frame == 255).mean() < 0.01  # clipping made almost every pixel white


def test_an_8_bit_png_reads_as_it_is(tmp_path: Path) -> None:
    rgb = np.random.default_rng(0).integers(0, 256, (16, 24, 3), dtype=np.uint8)
    Image.fromarray(rgb).save(tmp_path / "a.png")
    assert np.array_equal(read_first_frame(tmp_path / "a.png"), rgb)


def test_a_32_bit_image_is_refused_by_name(tmp_path: Path) -> None:
    Image.fromarray(np.zeros((8, 8), dtype=np.int32), mode="I").save(tmp_path / "wide.tiff")
    with pytest.raises(LoadError, match="32-bit integer image"):
        read_first_frame(tmp_path / "wide.tiff")


def test_a_header_declaring_a_huge_image_is_refused_before_decoding(tmp_path: Path) -> None:
    side = int(MAX_FIRST_FRAME_PIXELS ** 0.5) + 1
    path = tmp_path / "bomb.png"
    Image.new("L", (side, side)).save(path, optimize=True)  # a small file that declares side^2 pixels
    assert path.stat().st_size < 2_000_000
    with pytest.raises(LoadError, match=f"a {side}x{side} image; a first frame holds at most"):
        read_first_frame(path)


def test_not_an_image_and_missing_paths_are_named(tmp_path: Path) -> None:
    (tmp_path / "x.png").write_bytes(b"not a png")
    with pytest.raises(LoadError, match="not an image file"):
        read_first_frame(tmp_path / "x.png")
    with pytest.raises(FileNotFoundError, match="first frame not found"):
        read_first_frame(tmp_path / "nope.png")
    with pytest.raises(FileNotFoundError, match="not a clip folder"):
        read_first_frame(tmp_path)


def test_load_first_frame_resizes_and_crops_to_the_asked_size() -> None:
    full = load_first_frame(DEFAULT_FIRST_FRAME)
    small = load_first_frame(DEFAULT_FIRST_FRAME, width=16, height=8)
    assert small.shape == (8, 16, 3) and small.dtype == np.uint8
    assert full.shape[:2] != (8, 16)


def test_the_shipped_model_loads_causal_with_its_solver() -> None:
    adapter = load_causal()
    assert not adapter.training
    assert default_solver(adapter) == ("flowmap" if adapter.delta_embedding is not None else "renoise")


def test_default_solver_follows_the_flow_map() -> None:
    class Plain:
        delta_embedding = None

    class Flow:
        delta_embedding = object()

    assert default_solver(Plain()) == "renoise" and default_solver(Flow()) == "flowmap"


def test_weights_given_twice_or_not_causal_are_refused(tmp_path: Path) -> None:
    with pytest.raises(LoadError, match="not both"):
        load_causal("a", "b.yaml", "c.ckpt")
    with pytest.raises(FileNotFoundError, match="no adapter.json"):
        load_causal(str(tmp_path))
