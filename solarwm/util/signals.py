"""SIGTERM handled like Ctrl-C: the work in progress unwinds through its ``finally`` and ``with`` blocks.

Python's default SIGTERM ends the process at once, so a writer's temporary file (``VideoWriter``,
``atomic_path``) stays behind; Ctrl-C (``KeyboardInterrupt``) unwinds and removes it. ``terminate_unwinds``
makes SIGTERM unwind the same way, ending with exit status ``128 + SIGTERM`` as a killed process would.
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Any, Iterator


class Terminated(SystemExit):
    """Raised in the main thread by SIGTERM inside ``terminate_unwinds`` (exit status 143)."""


def _raise(signum: int, frame: Any) -> None:
    raise Terminated(128 + signum)


@contextmanager
def terminate_unwinds() -> Iterator[None]:
    """Inside: SIGTERM raises ``Terminated`` (cleanup runs, exit status 143); outside: the handler before."""
    if threading.current_thread() is not threading.main_thread():  # signal handlers live in the main thread
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
