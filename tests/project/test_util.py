"""solarwm.util: the one atomic file write and the --size parser."""

from __future__ import annotations

import pytest

from solarwm.util import atomic_path, atomic_write_bytes, atomic_write_text, parse_size


def test_atomic_write_replaces_whole_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "sub" / "report.json"
    assert atomic_write_text(target, "one\n") == target  # parents are created
    atomic_write_bytes(target, b"two\n")
    assert target.read_bytes() == b"two\n"
    assert [p.name for p in target.parent.iterdir()] == ["report.json"]


def test_a_failed_write_keeps_the_old_file_and_removes_the_temporary(tmp_path):
    target = tmp_path / "figure.png"
    target.write_text("old")
    with pytest.raises(RuntimeError, match="half-way"):
        with atomic_path(target) as tmp:
            assert tmp.parent == tmp_path and tmp.suffix == ".png" and tmp.name.startswith(".")
            tmp.write_text("half")
            raise RuntimeError("half-way")
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["figure.png"]


def test_parse_size():
    assert parse_size("64x48") == (64, 48) and parse_size("64X48") == (64, 48)
    with pytest.raises(ValueError, match="WIDTHxHEIGHT"):
        parse_size("64")
