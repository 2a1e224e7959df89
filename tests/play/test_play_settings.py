"""Every `solarwm play` setting is checked at start-up: one named line, exit 2, before weights are read or a
port is bound; the URL banner comes only once the socket is bound; a replayed trajectory's image size is bounded."""

from __future__ import annotations

import socket

import numpy as np
import pytest

from solarwm.cli import main

from play_worlds import tiny_spec


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("settings")
    tiny_spec(root)  # exports the adapter and the first frame once
    return root


def one_line_error(capsys, argv: list[str]) -> str:
    code = main(argv)
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and err.startswith("solarwm play: error:"), (code, err)
    assert "solarwm play: http" not in captured.out  # no banner
    return err


@pytest.mark.parametrize("flags, match", [
    (["--num_steps", "0"], "num_steps"),
    (["--smoothing", "-1"], "smoothing"),
    (["--seed", str(2**64)], "seed"),
    (["--seed", "-1"], "seed"),
    (["--width", "0"], "width"),
    (["--height", "100000"], "height"),
    (["--fps", "0"], "fps"),
    (["--fov", "180"], "fov"),
    (["--fov", "0"], "fov"),
    (["--caption", "x" * 10_001], "caption"),
    (["--max_sessions", "0"], "max_sessions"),
    (["--port", "99999"], "--port"),
    (["--port", "abc"], "port"),
    (["--allow_origin", "evil.example"], "--allow_origin"),
])
def test_a_bad_setting_is_one_line_before_anything_is_loaded(tmp_path, capsys, flags, match):
    # The adapter does not exist: an error naming the setting shows the check ran first.
    err = one_line_error(capsys, ["play", "--adapter", str(tmp_path / "no-such-adapter"), *flags])
    assert match in err and "adapter.json" not in err


def test_a_record_path_that_is_a_file_or_cannot_be_written_is_one_line(tmp_path, capsys):
    file = tmp_path / "a-file"
    file.write_text("not a folder")
    err = one_line_error(capsys, ["play", "--adapter", str(tmp_path / "none"), "--record", str(file)])
    assert "--record" in err and "not a folder" in err
    err = one_line_error(capsys, ["play", "--adapter", str(tmp_path / "none"), "--record", str(file / "rec")])
    assert "--record" in err and "cannot write" in err
    new = tmp_path / "new" / "rec"
    err = one_line_error(capsys, ["play", "--adapter", str(tmp_path / "none"), "--record", str(new)])
    assert "adapter.json" in err and not (tmp_path / "new").exists()  # a good --record passed; checking made nothing


def test_a_frame_size_the_route_cannot_take_is_one_line(root, capsys):
    err = one_line_error(capsys, ["play", "--adapter", str(root / "adapter"), "--first_frame", str(root / "first.png"),
                                  "--width", "30", "--height", "30"])
    assert "frame size 30x30" in err and "multiple of" in err


def test_a_port_in_use_is_one_line_without_a_banner(root, capsys):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        err = one_line_error(capsys, ["play", "--adapter", str(root / "adapter"), "--first_frame",
                                      str(root / "first.png"), "--port", str(port)])
    assert f"127.0.0.1:{port}" in err and "in use" in err


def test_a_trajectory_declaring_a_huge_image_is_refused_in_one_line(tmp_path, capsys):
    from solarwm.camera.trajectory import MAX_IMAGE_SIDE, load_trajectory

    path = tmp_path / "huge.npz"
    np.savez(path, c2w=np.eye(4)[None], K=np.array([[10.0, 10.0, 5.0, 5.0]]), fps=np.float64(16.0),
             image_size=np.array([100_000, 100_000]))
    with pytest.raises(ValueError, match=f"above the largest side, {MAX_IMAGE_SIDE}"):
        load_trajectory(path)
    code = main(["predict", "--adapter", str(tmp_path / "none"), "--first_frame", str(tmp_path / "none.png"),
                 "--trajectory", str(path), "--output", str(tmp_path / "out.mp4")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "100000x100000" in err
