"""`solarwm play`'s wire protocol through the real server and a plain WebSocket client.

One server (tiny random-weight causal adapter, --max_sessions 1, --record) serves the tests in order.
"""

from __future__ import annotations

import asyncio
import io
import json

import numpy as np
import pytest

from play_fixtures import PlayServer, first_frame_png, open_world, tiny_causal_adapter

websockets = pytest.importorskip("websockets")
TIMEOUT = 240.0  # seconds per wait: the CI machine may be loaded by a training run


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("play")
    adapter = tiny_causal_adapter(root / "adapter")
    png = first_frame_png(root / "first.png")
    srv = PlayServer(["--adapter", str(adapter), "--first_frame", str(png), "--caption", "a hallway", "--seed", "4",
                      "--record", str(root / "rec"), "--max_sessions", "1", "--max_speed", "4", "--max_angular", "180"])
    srv.root, srv.adapter, srv.png = root, adapter, png
    yield srv
    srv.stop()


def ws_url(server) -> str:
    return f"ws://127.0.0.1:{server.port}/ws"


async def collect(ws, blocks: int, frames: list | None = None, texts: list | None = None) -> tuple[list, list]:
    """Read until ``blocks`` block messages arrived; returns (frames as bytes, JSON messages)."""
    frames = [] if frames is None else frames
    texts = [] if texts is None else texts
    seen = 0
    while seen < blocks:
        message = await asyncio.wait_for(ws.recv(), TIMEOUT)
        if isinstance(message, bytes):
            frames.append(message)
        else:
            texts.append(json.loads(message))
            seen += texts[-1]["type"] == "block"
    return frames, texts


async def next_text(ws, skip_blocks: bool = False) -> dict:
    """The next JSON message (with ``skip_blocks``: the next one that is not a block report)."""
    while True:
        message = await asyncio.wait_for(ws.recv(), TIMEOUT)
        if isinstance(message, str):
            text = json.loads(message)
            if not (skip_blocks and text["type"] == "block"):
                return text


def decode_jpeg(data: bytes) -> np.ndarray:
    from PIL import Image

    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


@pytest.mark.slow
def test_page_and_config_are_served(server):
    import urllib.request

    with urllib.request.urlopen(server.url + "/") as r:
        page = r.read().decode()
    assert "<canvas" in page and "WebSocket" in page and "control latency is one block" in page
    assert server.config["fps"] == 16.0 and server.config["frames_per_block"] == 12
    assert server.config["width"] == server.config["height"] == 32


def test_frames_then_a_block_message_and_the_camera_follows_the_move(server):
    async def run():
        ws = await open_world(server.port, TIMEOUT)
        if True:
            await ws.send(json.dumps({"type": "move", "velocity": [0.0, 0.0, 2.0], "angular": [0.0, 30.0, 0.0]}))
            frames, texts = await collect(ws, 2)
            # The server works up to a block ahead: on a loaded machine block 1 may have started before the
            # move arrived, and then block 2 is the first under it (control latency is one block).
            if np.allclose(np.asarray(texts[-1]["c2w"])[0], np.asarray(texts[-1]["c2w"])[-1]):
                await collect(ws, 1, frames, texts)
            await ws.close()
            return frames, texts

    frames, texts = asyncio.run(run())
    blocks = [t for t in texts if t["type"] == "block"]
    assert [b["index"] for b in blocks[:2]] == [0, 1] and [b["frames"] for b in blocks] == [9] + [12] * (
        len(blocks) - 1
    )
    assert len(frames) == 9 + 12 * (len(blocks) - 1)
    image = decode_jpeg(frames[0])
    assert image.shape == (32, 32, 3) and image.dtype == np.uint8
    for block in blocks:
        assert np.asarray(block["c2w"]).shape == (block["frames"], 4, 4)
        assert block["gen_ms"] > 0 and block["fps"] > 0
    # The first block that started after the move moves 2 m/s forward, 30 deg/s right, in all of its frames.
    c2w = np.asarray(blocks[-1]["c2w"])
    step = np.linalg.inv(c2w[0]) @ c2w[1]
    yaw = np.degrees(np.arctan2(step[0, 2], step[2, 2]))
    assert np.isclose(yaw, 30.0 / 16.0, atol=1e-6)  # +wy turns right: forward swings toward +x
    theta = np.radians(30.0 / 16.0)  # turning while walking follows an arc: the step is its chord
    assert np.isclose(np.linalg.norm(step[:3, 3]), 2.0 / 16.0 * 2 * np.sin(theta / 2) / theta, rtol=1e-9)
    assert step[2, 3] > 0 and step[0, 3] > 0 and abs(step[1, 3]) < 1e-12


@pytest.mark.slow
@pytest.mark.parametrize(
    "bad, match",
    [
        ("not json", "not JSON"),
        ('{"type": "fly"}', "unknown message type"),
        ('{"type": "move", "velocity": [1, 2], "angular": [0, 0, 0]}', "3 numbers"),
        ('{"type": "move", "velocity": [NaN, 0, 0], "angular": [0, 0, 0]}', "finite"),
        ('{"type": "move", "velocity": [0, 0, 9], "angular": [0, 0, 0]}', "above the maximum"),
        ('{"type": "move", "velocity": [0, 0, 0], "angular": [0, 500, 0]}', "above the maximum"),
        ("[1, 2, 3]", "JSON object"),
        (b"\x00\x01", "binary"),
    ],
)
def test_a_malformed_message_gets_an_error_and_the_world_goes_on(server, bad, match):
    async def run():
        ws = await open_world(server.port, TIMEOUT)
        if True:
            await ws.send(bad)
            error = await next_text(ws, skip_blocks=True)
            frames, texts = await collect(ws, 1)
            await ws.close()
            return error, frames, texts

    error, frames, texts = asyncio.run(run())
    assert error["type"] == "error" and match in error["message"]
    assert texts[-1]["type"] == "block" and len(frames) >= 9


@pytest.mark.slow
def test_a_second_client_is_told_busy_and_a_disconnect_mid_block_frees_the_world(server):
    async def run():
        first = await open_world(server.port, TIMEOUT)
        await first.send(json.dumps({"type": "move", "velocity": [0, 0, 1], "angular": [0, 0, 0]}))
        await asyncio.sleep(0.2)
        async with websockets.connect(ws_url(server)) as second:
            busy = await next_text(second)
        # Leave in the middle of the first block (nothing received yet).
        await first.close()
        return busy

    busy = asyncio.run(run())
    assert busy["type"] == "error" and busy["message"].startswith("busy")

    async def again():  # the disconnected world is gone after its in-flight block: a new client gets a world
        ws = await open_world(server.port, TIMEOUT)
        frames, texts = await collect(ws, 1)
        await ws.close()
        return frames, texts

    frames, texts = asyncio.run(again())
    assert texts[-1]["type"] == "block" and texts[-1]["index"] == 0 and len(frames) == 9


@pytest.mark.slow
def test_pause_holds_the_world_resume_and_reset_start_it_again(server):
    async def run():
        ws = await open_world(server.port, TIMEOUT)
        if True:
            frames, texts = await collect(ws, 1)
            await ws.send(json.dumps({"type": "pause"}))
            await collect(ws, 0)
            # at most the block in flight when pause arrived may still come
            late = []
            try:
                while True:
                    late.append(await asyncio.wait_for(ws.recv(), 3 * 12 / 16 + 20))
                    if len([m for m in late if isinstance(m, str)]) > 1:
                        break
            except asyncio.TimeoutError:
                pass
            await ws.send(json.dumps({"type": "resume"}))
            _, after = await collect(ws, 1)
            await ws.send(json.dumps({"type": "reset"}))
            blocks = []
            while not blocks or blocks[-1]["index"] != 0:
                _, more = await collect(ws, 1)
                blocks += [m for m in more if m["type"] == "block"]
            await ws.close()
            return late, after, blocks[-1]

    late, after, reset_block = asyncio.run(run())
    assert len([m for m in late if isinstance(m, str)]) <= 1  # no new blocks while paused
    assert after[-1]["type"] == "block"
    assert reset_block["frames"] == 9 and np.allclose(reset_block["c2w"][0], np.eye(4))
