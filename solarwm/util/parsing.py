"""Parsers of option values shared by the CLI and the data engine."""

from __future__ import annotations


def parse_size(size: str) -> tuple[int, int]:
    """``"WIDTHxHEIGHT"`` → ``(width, height)`` in pixels, for the ``--size`` options."""
    try:
        w, h = (int(v) for v in size.lower().split("x"))
    except ValueError:
        raise ValueError(f"size must look like WIDTHxHEIGHT (e.g. 64x64), got {size!r}") from None
    if w < 1 or h < 1:
        raise ValueError(f"size must be at least 1x1 pixels, got {size!r}")
    return w, h
