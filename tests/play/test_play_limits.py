"""What one client can make a served world do: resets keep the pace and are bounded, and no message ends a world."""

from __future__ import annotations

import json
import time

import pytest

from solarwm.play.server import MAX_MESSAGE_CHARS, MAX_RESETS, WorldServer

from play_worlds import client, connect, read_block, read_text, tiny_spec


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("limits")


@pytest.mark.slow
def test_resets_keep_the_pace_and_make_no_empty_worlds(root, tmp_path):
    # At 0.5 fps a 9-frame first block is 18 s of playback: after the first block and the one the server keeps
    # ahead, the next may start only some 18 s later, reset or not.
    spec = tiny_spec(root, fps=0.5, record=str(tmp_path / "rec"))
    server = WorldServer(spec)
    steps: list[float] = []
    step = server._step
    server._step = lambda session, cameras: (steps.append(time.monotonic()), step(session, cameras))[1]
    with client(server) as c, connect(c) as ws:
        read_block(ws)
        start = time.monotonic()
        resets = 0
        while time.monotonic() - start < 12.0:
            ws.send_text(json.dumps({"type": "reset"}))
            resets += 1
            time.sleep(0.25)
        generated = len(steps)
        assert resets >= 20
        assert generated <= 3, f"{generated} blocks in 12 s of resets at 0.5 fps: the pacing clock restarted"
        for _ in range(MAX_RESETS - resets + 1):
            ws.send_text(json.dumps({"type": "reset"}))
        refused = read_text(ws, "error")
    assert "reset refused" in refused["message"] and str(MAX_RESETS) in refused["message"]
    folders = sorted(p.name for p in (tmp_path / "rec").iterdir())
    assert 1 <= len(folders) <= len(steps), folders  # a world gets a folder only with its first block


@pytest.mark.slow
@pytest.mark.parametrize("text, match", [
    ('{"type": "move", "velocity": [1' + "0" * 400 + ', 0, 0], "angular": [0, 0, 0]}', "finite"),
    ("[" * 100_000 + "]" * 100_000, "characters"),
    ("[" * 2000 + "]" * 2000, "not JSON"),  # nested beyond the parser's recursion, within the length limit
    ('{"type": "move", "velocity": [0, 0, 1], "angular": [0, 0, 0], "pad": "' + "x" * MAX_MESSAGE_CHARS + '"}',
     "characters"),
])
def test_any_message_gets_an_error_and_the_world_goes_on(root, text, match):
    assert len(text) > 100
    server = WorldServer(tiny_spec(root))
    with client(server) as c, connect(c) as ws:
        read_block(ws)
        ws.send_text(text)
        error = read_text(ws, "error")
        assert match in error["message"]
        ws.send_text(json.dumps({"type": "move", "velocity": [0, 0, 1.0], "angular": [0, 0, 0]}))
        frames, block, others = read_block(ws)  # the world goes on
        assert frames and block["index"] >= 1 and all(t["type"] != "error" for t in others)


def test_recordings_stop_at_their_byte_limit_and_the_world_goes_on(root, tmp_path):
    from solarwm.camera.trajectory import load_trajectory

    record = tmp_path / "rec"
    server = WorldServer(tiny_spec(root, record=str(record)), max_recorded_bytes=1)  # the first block crosses it
    with client(server) as c, connect(c) as ws:
        _, block, texts = read_block(ws)  # the error comes before the frames of the block that crossed it
        stopped = [t["message"] for t in texts if t["type"] == "error"]
        assert len(stopped) == 1 and "recording stopped" in stopped[0] and "limit of 1 bytes" in stopped[0]
        frames, later, _ = read_block(ws)  # the world goes on, unrecorded
        assert frames and later["index"] > block["index"]
    assert server.budget.used > 1
    assert [p.name for p in record.iterdir()] == ["world-0"]
    assert len(load_trajectory(record / "world-0" / "trajectory.npz")) == 9  # only the block that crossed it
