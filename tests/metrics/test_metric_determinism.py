"""Machine-independent numbers: pinned threads, and the camera-following metric scored under any thread count.

The same rendered videos are scored with the caller at 1 and at 2 threads (OpenCV, torch, BLAS),
twice each, after disturbing OpenCV's RNG, and in fresh interpreters started with
``OMP_NUM_THREADS`` 1 and 2: every number must be identical (``repr`` equality, so every digit).
With the SIMD kernels of another CPU (numpy, OpenCV and OpenBLAS dispatch turned down), the pair counts are
identical and every figure agrees to 1e-9.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from threadpoolctl import threadpool_info

from solarwm.camera import trajectory as T
from solarwm.data.sources.synthetic import make_scene, render_clip
from solarwm.metrics import CameraFollowing, estimate_relative_pose, video_from_uint8
from solarwm.util.threads import pinned_threads

# Worlds with parallax (walk while turning, at 64x64 and 96x64) and without (a pan).
WORLDS = [("walk", 64, 64, 0), ("walk", 96, 64, 3), ("pan", 96, 64, 2)]
SEGMENTS = {"walk": [T.forward(8, 1.0), T.Segment(24, forward=3.0, yaw=60.0)], "pan": [T.yaw_turn(16, 40.0)]}


def score_worlds() -> list[dict[str, str]]:
    """CameraFollowing of each world's ground-truth video with its own cameras, every value as repr."""
    out = []
    for name, width, height, seed in WORLDS:
        traj = T.compose_segments(SEGMENTS[name], width=width, height=height)
        frames = render_clip(make_scene(np.random.default_rng(seed), traj.c2w), traj)
        metric = CameraFollowing()
        metric.update(video_from_uint8(frames), torch.as_tensor(traj.c2w)[None], torch.as_tensor(traj.K)[None])
        out.append({k: repr(float(v)) for k, v in metric.compute().items()})
    return out


def at_threads(n: int, fn):
    """``fn()`` with the caller's OpenCV, torch and BLAS pools set to ``n`` threads; settings restored after."""
    from threadpoolctl import threadpool_limits

    before = cv2.getNumThreads(), torch.get_num_threads()
    cv2.setNumThreads(n)
    torch.set_num_threads(n)
    try:
        with threadpool_limits(limits=n):
            return fn()
    finally:
        cv2.setNumThreads(before[0])
        torch.set_num_threads(before[1])


def test_pinned_threads_pins_every_pool_and_restores_it():
    at_two = at_threads(2, lambda: (cv2.getNumThreads(), torch.get_num_threads()))
    assert at_two == (2, 2)

    def inside_and_after():
        with pinned_threads():
            pools = {p["num_threads"] for p in threadpool_info()}
            inside = cv2.getNumThreads(), torch.get_num_threads(), pools
        return inside, (cv2.getNumThreads(), torch.get_num_threads())

    inside, after = at_threads(2, inside_and_after)
    assert inside[:2] == (1, 1) and inside[2] <= {1}
    assert after == (2, 2)
    with pytest.raises(ValueError, match="threads must be >= 1"):
        with pinned_threads(0):
            pass


@pytest.mark.slow
def test_camera_following_is_identical_at_1_and_2_threads_and_run_twice():
    runs = [at_threads(n, score_worlds) for n in (1, 2, 1, 2)]
    assert all(r == runs[0] for r in runs[1:])
    first = runs[0]
    assert len(first) == len(WORLDS)
    assert all(float(w["pairs"]) > 0 and float(w["failed_pairs"]) < float(w["pairs"]) for w in first)
    assert first[0]["trans_dir_err_deg"] != "nan" and first[2]["trans_dir_err_deg"] == "nan"  # walk | pan

    # Whatever used OpenCV's RNG before (another RANSAC, cv2.randu), the estimate is the same.
    cv2.setRNGSeed(987654321)
    cv2.randu(np.empty((1000,), np.float32), 0, 1)
    assert score_worlds() == first


def test_estimate_relative_pose_is_bitwise_identical_under_any_thread_count():
    traj = T.compose_segments(SEGMENTS["walk"], width=64, height=64)
    frames = render_clip(make_scene(np.random.default_rng(0), traj.c2w), traj)
    estimates = [at_threads(n, lambda: estimate_relative_pose(frames[8:13], traj.K[8], traj.K[12])) for n in (1, 2, 1)]
    assert estimates[0] is not None and estimates[0].t is not None
    for est in estimates[1:]:
        assert est.R.tobytes() == estimates[0].R.tobytes() and est.t.tobytes() == estimates[0].t.tobytes()
        assert (est.tracks, est.inliers) == (estimates[0].tracks, estimates[0].inliers)


def scored_in_a_fresh_interpreter(**env: str) -> list[dict[str, str]]:
    """``score_worlds()`` in a new Python process with ``env`` added to this one's environment."""
    here = Path(__file__).resolve().parent
    code = f"import json, sys; sys.path.insert(0, {str(here)!r}); import test_metric_determinism as t; " \
           "print(json.dumps(t.score_worlds()))"
    done = subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_fresh_interpreters_with_1_and_2_omp_threads_score_the_same():
    outputs = [scored_in_a_fresh_interpreter(OMP_NUM_THREADS=n, OPENBLAS_NUM_THREADS=n, MKL_NUM_THREADS=n)
               for n in ("1", "2")]
    assert outputs[0] == outputs[1] == score_worlds()


@pytest.mark.slow
def test_fresh_interpreters_on_another_cpus_kernels_score_the_same():
    """As on an older CPU: numpy's and OpenCV's SIMD dispatch turned off, OpenBLAS's oldest x86 kernel.

    The rendered videos are bitwise the same (tests/data/test_synthetic_render.py), the pair counts are identical, and
    every figure agrees to 1e-9 (measured 3e-11: vector kernels sum in another order, which moves the last digits).
    """
    from numpy._core._multiarray_umath import __cpu_dispatch__, __cpu_features__

    env = {"OPENCV_CPU_DISABLE": "AVX512_SKX,AVX2,FMA3,FP16,AVX", "OPENBLAS_CORETYPE": "Prescott"}
    numpy_simd = " ".join(k for k in __cpu_dispatch__ if __cpu_features__.get(k))
    if numpy_simd:
        env["NPY_DISABLE_CPU_FEATURES"] = numpy_simd
    other, ours = scored_in_a_fresh_interpreter(**env), score_worlds()
    for a, b in zip(other, ours, strict=True):
        assert a.keys() == b.keys()
        for key in a:
            if key.endswith("pairs"):
                assert a[key] == b[key], key
            else:
                assert float(a[key]) == pytest.approx(float(b[key]), rel=1e-9, nan_ok=True), key
