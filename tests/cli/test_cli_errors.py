"""`solarwm` reports expected errors in one line (exit 2); `--debug` and bugs keep the traceback."""

from __future__ import annotations

import subprocess

import pytest

import solarwm.camera.cli
from solarwm.cli import is_expected_error, main

from commands import solarwm_argv


def _one_error_line(stderr: str, command: str) -> str:
    lines = stderr.splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith(f"solarwm {command}: error: ")
    assert "Traceback" not in stderr
    return lines[0]


def test_missing_corpus_is_one_line(tmp_path, capsys):
    missing = tmp_path / "no-corpus"
    assert main(["data", "inspect", str(missing)]) == 2
    captured = capsys.readouterr()
    line = _one_error_line(captured.err, "data inspect")
    assert str(missing) in line and "no such clip or corpus folder" in line
    assert captured.out == ""


@pytest.mark.slow
def test_predict_with_missing_trajectory_is_one_line_and_writes_nothing(tmp_path):
    # The real entry point in a fresh interpreter: exactly what a user's terminal shows.
    cmd = [*solarwm_argv(), "predict", "--adapter", "/nonexistent", "--first_frame", "x.png",
           "--trajectory", "missing.json", "--output", "o.mp4"]
    result = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 2
    line = _one_error_line(result.stderr, "predict")
    assert line == "solarwm predict: error: missing.json: trajectory file not found"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_debug_shows_the_traceback(tmp_path):
    cmd = [*solarwm_argv(), "data", "inspect", str(tmp_path / "missing"), "--debug"]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert result.returncode == 1
    assert "Traceback (most recent call last)" in result.stderr
    assert result.stderr.rstrip().splitlines()[-1].startswith("FileNotFoundError: ")


@pytest.mark.parametrize("where", [0, 1, 3])
def test_debug_is_accepted_anywhere_and_removed_before_dispatch(tmp_path, where):
    argv = ["data", "inspect", str(tmp_path / "missing")]
    argv.insert(where, "--debug")
    with pytest.raises(FileNotFoundError, match="no such clip or corpus folder"):
        main(argv)


def test_bad_pattern_is_one_line(tmp_path, capsys):
    out = tmp_path / "t.json"
    assert main(["camera", "trajectory", "--pattern", "spiral", "--frames", "10", "--out", str(out)]) == 2
    line = _one_error_line(capsys.readouterr().err, "camera trajectory")
    assert "unknown pattern 'spiral'" in line and "walk, orbit, random" in line
    assert not out.exists()


def test_argument_errors_are_one_line_too(tmp_path, capsys):
    assert (
        main(["camera", "trajectory", "--pattern", "walk", "--frames", "ten", "--out", str(tmp_path / "t.json")]) == 2
    )
    line = _one_error_line(capsys.readouterr().err, "camera trajectory")
    assert "frames" in line and "ten" in line


def _broken_verb(exc: BaseException):
    def trajectory_command(out: str, pattern: str, frames: int) -> int:
        """A verb that fails."""
        raise exc

    return trajectory_command


def test_project_runtime_errors_are_one_line(monkeypatch, capsys):
    from solarwm.backbones.base import AdapterError

    monkeypatch.setattr(solarwm.camera.cli, "trajectory_command", _broken_verb(AdapterError("route says no\nat all")))
    assert main(["camera", "trajectory", "--pattern", "walk", "--frames", "3", "--out", "t.json"]) == 2
    assert _one_error_line(capsys.readouterr().err, "camera trajectory").endswith("error: route says no at all")


def test_bugs_keep_their_traceback(monkeypatch):
    monkeypatch.setattr(solarwm.camera.cli, "trajectory_command", _broken_verb(TypeError("a bug")))
    with pytest.raises(TypeError, match="a bug"):
        main(["camera", "trajectory", "--pattern", "walk", "--frames", "3", "--out", "t.json"])


def test_expected_error_classes():
    from solarwm.backbones.base import AdapterError
    from solarwm.data.contract import ClipError
    from solarwm.data.video import VideoError

    # Any error class defined in the solarwm packages counts, whatever it derives from.
    project_error = type("SomeProjectError", (FloatingPointError,), {"__module__": "solarwm.stages.base"})
    for exc in (
        FileNotFoundError("x"),
        PermissionError("x"),
        ValueError("x"),
        VideoError("x"),
        AdapterError("x"),
        project_error("x"),
    ):
        assert is_expected_error(exc), exc
    assert issubclass(ClipError, ValueError)
    for exc in (TypeError("x"), AssertionError("x"), KeyError("x"), RuntimeError("x"), ZeroDivisionError("x")):
        assert not is_expected_error(exc), exc


@pytest.mark.parametrize(
    "given",
    [["--stages", "vmaf", "cuts"], ["--stages", "vmaf,cuts"], ["--stages=vmaf,cuts"], ["--stages", "[vmaf, cuts]"]],
)
def test_list_options_accept_plain_words_and_commas(given: list[str]) -> None:
    """`--stages vmaf cuts` and `--stages vmaf,cuts` reach the verb as the list ["vmaf", "cuts"]."""
    from solarwm.cli import _normalise_args
    from solarwm.data.annotate.runner import annotate_command

    out = _normalise_args(annotate_command, ["--corpus", "c", *given, "--workers", "2"])
    assert out == ["c", '--stages=["vmaf", "cuts"]', "--workers", "2"]
