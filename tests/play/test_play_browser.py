"""`solarwm play` in a real browser: headless Chromium holds a key and the recorded camera obeys it."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from play_fixtures import PlayServer, first_frame_png, tiny_causal_adapter

CHROMIUM = "/usr/bin/chromium"
TIMEOUT_MS = 300_000


@pytest.mark.slow
@pytest.mark.skipif(shutil.which(CHROMIUM) is None, reason=f"{CHROMIUM} is not installed (apt-get install chromium)")
def test_holding_w_walks_forward_at_the_commanded_speed(tmp_path):
    sync_api = pytest.importorskip("playwright.sync_api")
    from solarwm.camera.trajectory import load_trajectory

    adapter = tiny_causal_adapter(tmp_path / "adapter")
    png = first_frame_png(tmp_path / "first.png")
    record = tmp_path / "rec"
    server = PlayServer(["--adapter", str(adapter), "--first_frame", str(png), "--caption", "a hallway",
                         "--record", str(record), "--speed", "1.5", "--num_steps", "2"])
    try:
        with sync_api.sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
            page = browser.new_page()
            page.goto(server.url + "/")
            page.wait_for_function("window.solarwm.framesReceived > 0", timeout=TIMEOUT_MS)
            assert "W" in page.inner_text("#keys") and "control latency is one block" in page.inner_text("body")
            start = page.evaluate("window.solarwm.blocks")
            page.keyboard.down("w")
            page.wait_for_function(f"window.solarwm.blocks >= {start + 3}", timeout=TIMEOUT_MS)
            page.keyboard.up("w")
            held = page.evaluate("window.solarwm.blocks")
            page.wait_for_function(f"window.solarwm.blocks >= {held + 2}", timeout=TIMEOUT_MS)
            frames = page.evaluate("window.solarwm.framesReceived")
            errors = page.evaluate("window.solarwm.errors")
            path_points = page.evaluate("window.solarwm.path.length")
            browser.close()
    finally:
        server.stop()

    assert errors == [] and frames >= 9 + 12 * 4 and path_points >= frames - 12
    traj = load_trajectory(record / "world-0" / "trajectory.npz")  # the first world's own folder
    steps = np.linalg.inv(traj.c2w[:-1]) @ traj.c2w[1:]  # per-frame motion in the camera's own axes
    moving = np.linalg.norm(steps[:, :3, 3], axis=1) > 1e-9
    # Holding W: whole blocks at +z, 1.5 m/s at 16 fps; never any other motion.
    assert moving.sum() >= 2 * 12
    np.testing.assert_allclose(steps[moving, 2, 3], 1.5 / 16, rtol=1e-9)
    np.testing.assert_allclose(steps[moving, :2, 3], 0.0, atol=1e-12)
    np.testing.assert_allclose(steps[:, :3, :3], np.broadcast_to(np.eye(3), steps[:, :3, :3].shape), atol=1e-12)
    # Released again: the last block stands still.
    assert not moving[-11:].any()
