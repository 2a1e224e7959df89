"""`--record` never overwrites, gives each world its own folder and unique temporaries, says what replays it,
and a recording that cannot be finished frees its world's slot and keeps what was encoded."""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from pathlib import Path

import numpy as np
import pytest

from solarwm.play.recording import RecordBudget, Recorder, allocate_world_folder, sha256_of
from solarwm.play.server import WorldServer

from play_worlds import client, connect, read_block, tiny_spec


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("recording")


def one_world(server: WorldServer, blocks: int = 1) -> None:
    with client(server) as c, connect(c) as ws:
        for _ in range(blocks):
            read_block(ws)


def test_a_second_run_on_the_same_folder_overwrites_nothing(root, tmp_path):
    record = tmp_path / "rec"
    spec = tiny_spec(root, record=str(record))
    one_world(WorldServer(spec))
    first = {p.relative_to(record): p.read_bytes() for p in record.rglob("*") if p.is_file()}
    assert {p.parent for p in first} == {Path("world-0")}
    one_world(WorldServer(spec))  # a new server (a second `solarwm play --record` run) on the same folder
    assert sorted(p.name for p in record.iterdir()) == ["world-0", "world-1"]
    assert all((record / p).read_bytes() == data for p, data in first.items())  # the earlier run is intact
    for world in ("world-0", "world-1"):
        assert sorted(p.name for p in (record / world).iterdir()) == [
            "first_frame.png", "session.json", "trajectory.npz", "video.mp4"]


def test_a_world_left_before_its_first_block_leaves_no_folder(root, tmp_path):
    spec = tiny_spec(root)
    session = spec.new_session()
    Recorder(tmp_path / "rec", session, spec.model, spec.first_frame, RecordBudget(1 << 30)).close()
    assert not (tmp_path / "rec").exists() or not any((tmp_path / "rec").iterdir())


def test_worlds_starting_together_get_their_own_folders_and_temporaries(root, tmp_path):
    from solarwm.data.video import VideoWriter, read_video
    from solarwm.util.atomic import atomic_path

    folders: list[Path] = []
    barrier = threading.Barrier(12)

    def allocate() -> None:
        barrier.wait()
        folders.append(allocate_world_folder(tmp_path / "rec"))

    threads = [threading.Thread(target=allocate) for _ in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(folders)) == 12 and all(f.is_dir() and not any(f.iterdir()) for f in folders)

    # Two writers of one path in one process: each has its own temporary, both finish, the last one wins.
    frames = np.zeros((3, 32, 32, 3), np.uint8)
    a, b = VideoWriter(tmp_path / "v.mp4", 8), VideoWriter(tmp_path / "v.mp4", 8)
    assert a.temporary != b.temporary
    a.write(frames)
    b.write(frames[:2] + 200)
    a.close()
    b.close()
    assert len(read_video(tmp_path / "v.mp4")) == 2
    with atomic_path(tmp_path / "t.npz") as one, atomic_path(tmp_path / "t.npz") as two:
        assert one != two
        np.savez(one, x=1)
        np.savez(two, x=2)
    assert int(np.load(tmp_path / "t.npz")["x"]) == 1  # the outer (later finished) write is the file


def test_two_clients_at_once_record_two_complete_worlds(root, tmp_path):
    from solarwm.camera.trajectory import load_trajectory
    from solarwm.data.video import read_video

    record = tmp_path / "rec"
    server = WorldServer(tiny_spec(root, record=str(record)), max_sessions=2)

    def world(c) -> None:
        with connect(c) as ws:
            read_block(ws)
            read_block(ws)

    with client(server) as c:
        threads = [threading.Thread(target=world, args=(c,)) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    worlds = sorted(record.iterdir())
    assert [w.name for w in worlds] == ["world-0", "world-1"]
    for folder in worlds:
        assert len(read_video(folder / "video.mp4")) == len(load_trajectory(folder / "trajectory.npz")) >= 9 + 12
        assert not [p for p in folder.iterdir() if p.name.startswith(".")]  # no temporary left behind


def test_session_json_names_the_weights_and_the_first_frame_with_their_hashes(root, tmp_path):
    from solarwm.loading import shipped_adapter

    record = tmp_path / "rec"
    spec = tiny_spec(root, record=str(record))
    one_world(WorldServer(spec))
    meta = json.loads((record / "world-0" / "session.json").read_text())
    assert meta["adapter"] == str((root / "adapter").resolve()) and meta["checkpoint"] is None
    assert meta["weights_sha256"] == sha256_of(root / "adapter") and len(meta["weights_sha256"]) == 64
    png = Path(meta["first_frame"])
    assert meta["first_frame_sha256"] == hashlib.sha256(png.read_bytes()).hexdigest()

    # The default model (no --adapter): its resolved folder, not "None".
    from solarwm.play.cli import build_spec

    default = build_spec(first_frame=str(root / "first.png"), record=str(tmp_path / "default"))
    assert default.model["adapter"] == str(Path(shipped_adapter()).resolve())
    assert default.model["weights_sha256"] == sha256_of(shipped_adapter())


def test_a_recording_that_cannot_be_finished_frees_the_slot_and_keeps_its_frames(root, tmp_path, caplog):
    from solarwm.data.video import read_video

    record = tmp_path / "rec"
    server = WorldServer(tiny_spec(root, record=str(record)))
    with client(server) as c:
        with connect(c) as ws:
            read_block(ws)
            (record / "world-0" / "video.mp4").mkdir()  # the finished mp4 cannot be moved into place
            (record / "world-0" / "video.mp4" / "x").write_text("in the way")
        with caplog.at_level(logging.WARNING, logger="solarwm.play"), connect(c) as ws:
            frames, block, _ = read_block(ws)  # the next client gets a world, not "busy"
            assert frames and block["index"] == 0
    lines = [r.getMessage() for r in caplog.records if "cannot finish video.mp4" in r.getMessage()]
    assert len(lines) == 1 and "world-0" in lines[0] and "kept in" in lines[0]
    kept = [p for p in (record / "world-0").iterdir() if p.name.startswith(".video.mp4.")]
    assert len(kept) == 1 and len(read_video(kept[0])) == 9  # the encoded frames are kept
