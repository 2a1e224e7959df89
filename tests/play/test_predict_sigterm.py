"""`solarwm predict` (the replay of a recording) stopped with SIGTERM cleans up like Ctrl-C: no temporary left."""

from __future__ import annotations

import signal
import subprocess
import time

import pytest

from commands import solarwm_argv
from play_fixtures import first_frame_png, tiny_causal_adapter


@pytest.mark.slow
def test_sigterm_during_predict_leaves_no_partial_output(tmp_path):
    from solarwm.camera import trajectory as T

    adapter = tiny_causal_adapter(tmp_path / "adapter")
    png = first_frame_png(tmp_path / "first.png")
    track = T.compose_segments([T.forward(4000, 100.0)], fps=16.0, width=32, height=32)  # minutes of rollout
    T.save_trajectory(track, tmp_path / "long.npz")
    out = tmp_path / "out" / "replay.mp4"
    log = tmp_path / "predict.log"
    with open(log, "w") as sink:
        process = subprocess.Popen(
            [*solarwm_argv(), "predict", "--adapter", str(adapter), "--first_frame", str(png), "--trajectory",
             str(tmp_path / "long.npz"), "--output", str(out), "--num_steps", "2", "--progress", "false"],
            stdout=sink, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 300
            while not list(out.parent.glob(".replay.mp4.*")) and time.monotonic() < deadline:
                assert process.poll() is None, log.read_text()
                time.sleep(0.2)
            assert list(out.parent.glob(".replay.mp4.*")), "predict never started writing"
            time.sleep(1.0)  # well into the rollout
            process.send_signal(signal.SIGTERM)
            code = process.wait(120)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    assert not out.exists()
    assert not out.parent.exists() or not any(out.parent.iterdir()), list(out.parent.iterdir())  # no temporary
    assert code == 128 + signal.SIGTERM, log.read_text()
