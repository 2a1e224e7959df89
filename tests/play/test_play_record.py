"""`solarwm play --record`: the recording is complete after Ctrl-C and replays exactly with `solarwm predict`."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest

from play_fixtures import PlayServer, first_frame_png, open_world, tiny_causal_adapter

websockets = pytest.importorskip("websockets")
TIMEOUT = 240.0


async def drive(port: int, moves: list[tuple[list, list]]) -> int:
    """One world: each move holds for one block; returns the frames received."""
    ws = await open_world(port, TIMEOUT)
    try:
        frames = 0
        for velocity, angular in moves:
            await ws.send(json.dumps({"type": "move", "velocity": velocity, "angular": angular}))
            while True:
                message = await asyncio.wait_for(ws.recv(), TIMEOUT)
                if isinstance(message, bytes):
                    frames += 1
                elif json.loads(message)["type"] == "block":
                    break
                else:
                    raise AssertionError(message)
        return frames
    finally:
        await ws.close()


@pytest.mark.slow
def test_a_recorded_world_replays_exactly_and_ctrl_c_leaves_complete_files(tmp_path):
    from solarwm.camera.trajectory import load_trajectory
    from solarwm.data.video import read_video
    from solarwm.train_cli import predict

    adapter = tiny_causal_adapter(tmp_path / "adapter")
    png = first_frame_png(tmp_path / "first.png")
    record = tmp_path / "rec"
    server = PlayServer(["--adapter", str(adapter), "--first_frame", str(png), "--caption", "a hallway",
                         "--seed", "11", "--record", str(record), "--num_steps", "2"])
    try:
        received = asyncio.run(drive(server.port, [([0, 0, 1.0], [0, 0, 0]), ([0.5, 0, 0], [0, 40.0, 0]),
                                                   ([0, -0.3, 0], [10.0, 0, 20.0])]))
        assert received == 9 + 12 + 12
        # A second world, stopped with Ctrl-C while its client is still connected.
        async def interrupted() -> None:
            ws = await open_world(server.port, TIMEOUT)
            await ws.send(json.dumps({"type": "move", "velocity": [0, 0, 2.0], "angular": [0, -30.0, 0]}))
            while not (isinstance(m := await asyncio.wait_for(ws.recv(), TIMEOUT), str) and '"block"' in m):
                pass
            server.stop()  # SIGINT, as Ctrl-C
        asyncio.run(interrupted())
    finally:
        server.stop()

    assert sorted(p.name for p in record.iterdir()) == ["world-0", "world-1"]  # one new folder per world
    for folder in (record / "world-0", record / "world-1"):
        meta = json.loads((folder / "session.json").read_text())
        assert set(meta) >= {"adapter", "first_frame", "caption", "seed", "num_steps", "solver"}
        traj = load_trajectory(folder / "trajectory.npz")
        video = read_video(folder / "video.mp4")
        assert len(video) == len(traj) >= 9 and video.shape[1:] == (32, 32, 3)
    first = record / "world-0"
    meta = json.loads((first / "session.json").read_text())
    assert meta["seed"] == 11 and meta["num_steps"] == 2 and meta["caption"] == "a hallway"

    replay = tmp_path / "replay.mp4"
    predict(first_frame=meta["first_frame"], trajectory=str(first / "trajectory.npz"), output=str(replay),
            caption=meta["caption"], adapter=meta["adapter"], seed=meta["seed"], num_steps=meta["num_steps"],
            progress=False)
    assert np.array_equal(read_video(replay), read_video(first / "video.mp4"))
