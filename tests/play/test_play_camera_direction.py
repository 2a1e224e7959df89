"""On the shipped tiny model, a held yaw turns the generated view the commanded way.

The frames are the ones `solarwm play` streams (JPEG over the WebSocket); the rotation between frames
i and i+4 is estimated from pixels alone by `solarwm.metrics.camera_following.estimate_relative_pose`.
"""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path

import numpy as np
import pytest

from play_fixtures import PlayServer

SHIPPED = Path(__file__).resolve().parents[2] / "recipes" / "weights" / "tiny_causal"
websockets = pytest.importorskip("websockets")


@pytest.mark.slow
@pytest.mark.skipif(not (SHIPPED / "adapter.json").is_file(),
                    reason="recipes/weights/tiny_causal (the shipped stage-3 export) is not in this checkout yet")
def test_a_held_yaw_turns_the_generated_view_the_commanded_way():
    from PIL import Image
    from scipy.spatial.transform import Rotation

    from solarwm.metrics.camera_following import estimate_relative_pose

    server = PlayServer(["--adapter", str(SHIPPED)])  # the shipped defaults otherwise (first frame, caption)
    turn = 30.0  # deg/s
    frames, blocks = [], []

    async def run() -> None:
        async with websockets.connect(f"ws://127.0.0.1:{server.port}/ws") as ws:
            for sign in (1.0, -1.0):
                await ws.send(json.dumps({"type": "move", "velocity": [0, 0, 0], "angular": [0, sign * turn, 0]}))
                for _ in range(3):
                    while True:
                        message = await asyncio.wait_for(ws.recv(), 300)
                        if isinstance(message, bytes):
                            frames.append(np.asarray(Image.open(io.BytesIO(message)).convert("RGB")))
                        elif json.loads(message)["type"] == "block":
                            blocks.append(json.loads(message))
                            break

    try:
        asyncio.run(run())
    finally:
        server.stop()
    c2w = np.concatenate([np.asarray(b["c2w"]) for b in blocks])
    assert len(c2w) == len(frames)
    cfg = server.config
    f = cfg["width"] / (2 * np.tan(np.radians(60.0) / 2))
    K = np.array([f, f, cfg["width"] / 2, cfg["height"] / 2])
    agree, resolved = 0, 0
    start = 0
    for block in blocks:
        for i in range(start, start + block["frames"] - 4, 4):
            commanded = Rotation.from_matrix((np.linalg.inv(c2w[i + 4]) @ c2w[i])[:3, :3]).as_rotvec()[1]
            estimate = estimate_relative_pose(np.stack(frames[i:i + 5]), K, K)
            if estimate is None or abs(commanded) < 1e-6:
                continue
            resolved += 1
            agree += np.sign(Rotation.from_matrix(estimate.R).as_rotvec()[1]) == np.sign(commanded)
        start += block["frames"]
    assert resolved >= 6, f"the estimator resolved only {resolved} frame pairs"
    assert agree >= 0.75 * resolved, f"the view turned the commanded way in {agree} of {resolved} pairs"
