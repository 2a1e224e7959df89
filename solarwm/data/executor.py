"""One way to run the data engine's per-item tasks: in-process, on a local process pool, or on Ray.

Every data verb (synth, annotate, ingest, pack, latents) reduces its work to a top-level function of
picklable arguments that returns a JSON-serialisable record and keeps its state on disk, so a rerun
resumes. ``map_tasks`` runs such a function over a list of arguments and yields ``(index, outcome)``
pairs as they finish, where ``outcome`` is the result or the exception that killed the task; the
caller turns an exception into a failed item with a reason, so nothing is lost silently.

Executors:

* ``process`` (default): ``workers <= 1`` runs in this process; more workers use a local
  ``ProcessPoolExecutor`` (spawn). A worker that dies (``os._exit``, OOM kill, segfault) breaks the
  whole pool; the pool is then rebuilt and every unfinished task resubmitted, at most ``max_retries``
  times, so a crash costs a rerun of the tasks in flight, never an item.
* ``ray``: the same functions as Ray tasks (``pip install -e ".[ray]"``). Without ``ray_address`` a
  local Ray of ``workers`` CPUs is started for the call and shut down after it; with an address
  (``auto``, ``ray://host:10001``, ``host:6379``) the call joins that cluster. A session that is already
  initialised (``ray.init`` by the caller) is used as it is. Ray retries a task whose worker died
  (``max_retries``); an exception raised by the task itself is not retried and comes back as the outcome.
  Every worker must see the data folders at the same paths (a shared filesystem) and have this package
  installed.

Retrying is safe because every task is idempotent: it writes atomically and skips work already on disk.
"""

from __future__ import annotations

import multiprocessing
import sys
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from tqdm import tqdm

EXECUTORS = ("process", "ray")
#: Reruns of a task whose worker died (Ray's ``max_retries``; pool rebuilds for ``process``).
DEFAULT_MAX_RETRIES = 2


class ExecutorError(ValueError):
    """An executor name or setting that cannot be used."""


def map_tasks(
    fn: Callable[[Any], Any],
    args: Sequence[Any],
    executor: str = "process",
    workers: int = 1,
    desc: str | None = None,
    unit: str = "clip",
    ray_address: str | None = None,
    max_retries: int = DEFAULT_MAX_RETRIES,
) -> Iterator[tuple[int, Any]]:
    """Run ``fn(a)`` for each ``a`` in ``args``; yield ``(index, result or exception)`` in completion order.

    ``executor="process"`` with ``workers <= 1`` runs in this process (no pickling, easiest to debug).
    A progress bar on stderr counts finished tasks when ``desc`` is given. Each index is yielded once.
    """
    if executor not in EXECUTORS:
        raise ExecutorError(f"unknown executor {executor!r}; choose one of {', '.join(EXECUTORS)}")
    if ray_address is not None and executor != "ray":
        raise ExecutorError(f"ray_address {ray_address!r} needs executor 'ray' (got {executor!r})")
    if max_retries < 0:
        raise ExecutorError(f"max_retries must be >= 0, got {max_retries}")
    bar = tqdm(total=len(args), desc=desc, unit=unit, file=sys.stderr, dynamic_ncols=True, disable=desc is None)
    try:
        if executor == "ray":
            runner = _ray_tasks(fn, args, workers, ray_address, max_retries)
        elif workers <= 1 or len(args) <= 1:
            runner = _local_tasks(fn, args)
        else:
            runner = _pool_tasks(fn, args, workers, max_retries)
        for i, outcome in runner:
            bar.update()
            yield i, outcome
    finally:
        bar.close()


def _local_tasks(fn: Callable[[Any], Any], args: Sequence[Any]) -> Iterator[tuple[int, Any]]:
    for i, a in enumerate(args):
        try:
            outcome: Any = fn(a)
        except Exception as e:  # the caller records it as the item's failure
            outcome = e
        yield i, outcome


def _pool_tasks(
    fn: Callable[[Any], Any], args: Sequence[Any], workers: int, max_retries: int
) -> Iterator[tuple[int, Any]]:
    """A spawn process pool; a dead worker breaks the pool, which is rebuilt and the unfinished tasks resubmitted."""
    # spawn: workers must not inherit a parent that already initialised torch/FFmpeg threads.
    ctx = multiprocessing.get_context("spawn")
    todo = list(range(len(args)))
    for attempt in range(max_retries + 1):
        broken: BrokenProcessPool | None = None
        with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
            futures = {pool.submit(fn, args[i]): i for i in todo}
            for fut in as_completed(futures):
                i = futures[fut]
                try:
                    outcome = fut.result()
                except BrokenProcessPool as e:
                    # Which task killed the worker is unknown: every task still in flight is rerun.
                    broken = e
                    continue
                except Exception as e:
                    outcome = e
                todo.remove(i)
                yield i, outcome
        if broken is None or not todo:
            return
        if attempt == max_retries:
            for i in todo:
                yield i, broken
            return


def _ray_tasks(
    fn: Callable[[Any], Any], args: Sequence[Any], workers: int, address: str | None, max_retries: int
) -> Iterator[tuple[int, Any]]:
    """The tasks as Ray remote functions, collected with ``ray.wait`` in completion order."""
    try:
        import ray
    except ImportError:
        raise ExecutorError('executor "ray" needs Ray: pip install -e ".[ray]" (or pip install "ray>=2.9")') from None
    started = False
    if not ray.is_initialized():
        if address is None:
            ray.init(num_cpus=max(1, workers), include_dashboard=False, logging_level="warning")
        else:
            ray.init(address=address, logging_level="warning")
        started = True
    try:
        # retry_exceptions=False: Ray reruns a task only when its worker died; a raised error is the outcome.
        remote = ray.remote(max_retries=max_retries, retry_exceptions=False)(fn)
        pending = {remote.remote(a): i for i, a in enumerate(args)}
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            for ref in done:
                i = pending.pop(ref)
                try:
                    outcome = ray.get(ref)
                except ray.exceptions.RayTaskError as e:
                    outcome = e.cause if isinstance(e.cause, BaseException) else e
                except ray.exceptions.RayError as e:  # the worker died more than max_retries times
                    outcome = e
                yield i, outcome
    finally:
        if started:
            ray.shutdown()
