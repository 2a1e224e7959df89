"""``solarwm predict`` under ``torchrun --nproc_per_node 2`` (gloo) writes the video of one process (rank 0 writes).

The two processes form one sequence-parallel group: every causal block's tokens are split over them, each keeps
its half of the heads in its KV cache, and rank 0 decodes and writes the mp4.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from solarwm.data.video import read_video

from commands import solarwm_argv
from play_fixtures import first_frame_png, free_port, reference_trajectory, tiny_causal_adapter

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]


@pytest.mark.slow
def test_predict_under_torchrun_writes_the_one_process_video(tmp_path: Path) -> None:
    adapter = tiny_causal_adapter(tmp_path / "adapter")
    args = ["predict", "--adapter", str(adapter), "--first_frame", str(first_frame_png(tmp_path / "first.png")),
            "--trajectory", str(reference_trajectory(tmp_path / "walk.json")), "--num_steps", "2",
            "--progress", "false"]
    env = dict(os.environ)
    for name in ("LOCAL_RANK", "RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)  # a fresh launch, not a child of this process
    one = subprocess.run([*solarwm_argv(), *args, "--output", str(tmp_path / "one.mp4")],
                         capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert one.returncode == 0, one.stderr[-3000:]
    torchrun = str(Path(solarwm_argv()[0]).with_name("torchrun"))
    two = subprocess.run([torchrun, "--nproc_per_node", "2", "--master_port", str(free_port()), "--no-python",
                          *solarwm_argv(), *args, "--output", str(tmp_path / "two.mp4")],
                         capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert two.returncode == 0, two.stderr[-3000:]
    assert "sequence parallel over 2 ranks" in two.stdout + two.stderr
    single, parallel = read_video(tmp_path / "one.mp4"), read_video(tmp_path / "two.mp4")
    assert single.shape == parallel.shape and single.shape[0] == 33
    diff = np.abs(single.astype(np.int16) - parallel.astype(np.int16))
    assert diff.max() <= 1, (diff.max(), (diff > 0).mean())
