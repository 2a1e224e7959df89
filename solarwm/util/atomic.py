"""The one atomic file write: a hidden temporary sibling, renamed onto the target only once it is complete.

A reader (or a resumed run) therefore sees the old file or the new one, never a half-written one; a failed
write leaves no temporary behind. The temporary keeps the target's suffix, for writers that choose the format
by it (matplotlib's ``savefig``).
"""

from __future__ import annotations

import os
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


def unique_suffix() -> str:
    """A temporary-name part no other writer has: the process id (which process left it) and a random part
    (two writers of one process, or a process id reused after a crash, never share a temporary)."""
    return f"{os.getpid()}-{uuid.uuid4().hex[:12]}"


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temp path next to ``path`` (parents created); on success it replaces ``path``, on error it is removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{unique_suffix()}{path.suffix}")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (see ``atomic_path``)."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)
    return Path(path)


def atomic_write_text(path: str | Path, text: str, encoding: str = "utf-8") -> Path:
    """Write ``text`` to ``path`` atomically (see ``atomic_path``)."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding=encoding)
    return Path(path)
