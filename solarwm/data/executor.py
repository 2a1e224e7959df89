"""One way to run the data engine's per-item tasks: in-process or on a local process pool.

Every data verb (synth, annotate, ingest, pack, latents) reduces its work to a top-level function of
picklable arguments that returns a JSON-serialisable record and keeps its state on disk, so a rerun
resumes. ``map_tasks`` runs such a function over a list of arguments and yields ``(index, outcome)``
pairs as they finish, where ``outcome`` is the result or the exception that killed the task; the
caller turns an exception into a failed item with a reason, so nothing is lost silently.
"""

from __future__ import annotations

import multiprocessing
import sys
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import Any

from tqdm import tqdm

EXECUTORS = ("process",)


class ExecutorError(ValueError):
    """An executor name or setting that cannot be used."""


def map_tasks(
    fn: Callable[[Any], Any],
    args: Sequence[Any],
    executor: str = "process",
    workers: int = 1,
    desc: str | None = None,
    unit: str = "clip",
) -> Iterator[tuple[int, Any]]:
    """Run ``fn(a)`` for each ``a`` in ``args``; yield ``(index, result or exception)`` in completion order.

    ``workers <= 1`` runs in this process (no pickling, easiest to debug). A progress bar on stderr
    counts finished tasks when ``desc`` is given.
    """
    if executor not in EXECUTORS:
        raise ExecutorError(f"unknown executor {executor!r}; choose one of {', '.join(EXECUTORS)}")
    bar = tqdm(total=len(args), desc=desc, unit=unit, file=sys.stderr, dynamic_ncols=True, disable=desc is None)
    try:
        if workers <= 1 or len(args) <= 1:
            for i, a in enumerate(args):
                try:
                    outcome: Any = fn(a)
                except Exception as e:  # the caller records it as the item's failure
                    outcome = e
                bar.update()
                yield i, outcome
            return
        # spawn: workers must not inherit a parent that already initialised torch/FFmpeg threads.
        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
            futures = {pool.submit(fn, a): i for i, a in enumerate(args)}
            for fut in as_completed(futures):
                try:
                    outcome = fut.result()
                except Exception as e:  # includes a worker that died (BrokenProcessPool)
                    outcome = e
                bar.update()
                yield futures[fut], outcome
    finally:
        bar.close()
