"""Thread pinning for numbers that are thresholded or published: they must not depend on thread counts.

Several libraries split work by their thread count, and the split changes the floating-point result:
torch's bilinear ``F.interpolate`` on the CPU (the Open-Sora flow resize) gives a different
``metrics.flow_dis`` at 1 and at 2 threads, and a process pool inherits every core while a Ray task
gets ``OMP_NUM_THREADS=1``. ``pinned_threads`` fixes OpenCV's, torch's and the BLAS/OpenMP pools'
thread counts for one computation and restores them afterwards, so the same input gives the same
bytes on every executor and machine size.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

#: Threads per task for every pinned computation. One: parallelism comes from the executor's
#: workers, and it is the only count that every machine (and a Ray task by default) can give.
PINNED_THREADS = 1


@contextmanager
def pinned_threads(threads: int = PINNED_THREADS) -> Iterator[None]:
    """Run the body with OpenCV, torch (intra-op) and BLAS/OpenMP limited to ``threads``; restore them after."""
    import cv2
    import torch
    from threadpoolctl import threadpool_limits

    if threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    cv_before, torch_before = cv2.getNumThreads(), torch.get_num_threads()
    cv2.setNumThreads(threads)
    torch.set_num_threads(threads)
    try:
        with threadpool_limits(limits=threads):
            yield
    finally:
        cv2.setNumThreads(cv_before)
        torch.set_num_threads(torch_before)
