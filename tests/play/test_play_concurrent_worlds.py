"""Two worlds served at once (``--max_sessions 2``) on one model stay apart: each equals its solo run, frame
for frame."""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest

from solarwm.play.server import WorldServer, jpeg

from play_worlds import client, connect, read_block, tiny_spec

BLOCKS = 4


@pytest.mark.slow
def test_two_clients_steering_differently_at_once_each_get_their_solo_world(tmp_path):
    spec = tiny_spec(tmp_path, num_steps=4)
    server = WorldServer(spec, max_sessions=2)
    twists = {"walker": ([0, 0, 1.5], [0, 0, 0]), "turner": ([0.5, 0, 0], [0, -60.0, 10.0])}
    seen: dict[str, list[tuple[list[bytes], np.ndarray]]] = {}
    failures: list[BaseException] = []
    ready = threading.Barrier(2)

    def world(c, name: str) -> None:
        try:
            with connect(c) as ws:
                velocity, angular = twists[name]
                ws.send_text(json.dumps({"type": "move", "velocity": velocity, "angular": angular}))
                ready.wait()
                blocks = []
                for _ in range(BLOCKS):
                    frames, block, _ = read_block(ws)
                    blocks.append((frames, np.asarray(block["c2w"])))
                seen[name] = blocks
        except BaseException as e:  # reported below, from the test's thread
            failures.append(e)

    with client(server) as c:
        threads = [threading.Thread(target=world, args=(c, name)) for name in twists]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not failures, failures
    assert not np.allclose(seen["walker"][-1][1], seen["turner"][-1][1])  # they did steer differently

    for name, blocks in seen.items():
        solo = spec.new_session()  # the same world alone, under the cameras the server reported
        for index, (frames, c2w) in enumerate(blocks):
            expected = [jpeg(f, spec.jpeg_quality) for f in solo.step(c2w)]
            assert frames == expected, f"{name}: block {index} differs from its solo run"
