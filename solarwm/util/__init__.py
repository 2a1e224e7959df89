"""Helpers below every other layer (no torch, no solarwm imports): shared by the CLI, the data engine and the rest."""

from solarwm.util.atomic import atomic_path, atomic_write_bytes, atomic_write_text
from solarwm.util.parsing import parse_size

__all__ = ["atomic_path", "atomic_write_bytes", "atomic_write_text", "parse_size"]
