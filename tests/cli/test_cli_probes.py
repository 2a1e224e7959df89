"""Defects found by probing the CLI: each bad input ends in one line, `solarwm <verb>: error: ...`, exit 2
(or is a failed record of its clip), leaves nothing behind, and never stores or prints a credential."""

from __future__ import annotations

import gzip
import json
import logging
import os
import re
import shutil
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest
import torch
from PIL import Image

from solarwm.camera.trajectory import compose_segments, forward, save_trajectory
from solarwm.cli import main
from solarwm.data.contract import ClipError, iter_clip_dirs, read_meta

REPO = Path(__file__).resolve().parents[2]
API_KEY = "sk-probe-secret-9f8e7d6c5b4a"


def one_error_line(err: str, command: str) -> str:
    """The single stderr line of an expected error (nothing else: no usage dump, no traceback)."""
    # Lightning's "Seed set to N" info line (a logging handler another test configured may print it) is not an error.
    lines = [line for line in err.splitlines() if line.strip() and "Seed set to" not in line]
    assert len(lines) == 1, err
    assert lines[0].startswith(f"solarwm {command}: error: "), err
    return lines[0]


@pytest.fixture(scope="module")
def corpus_src(render_corpus) -> Path:
    return render_corpus(clips=3, frames=9, width=32, height=32, fps=8.0, seed=2)


@pytest.fixture
def corpus(corpus_src: Path, copy_corpus) -> Path:
    return copy_corpus(corpus_src)


# --- Security: the VLM key and URL credentials never reach meta.json or the summary -------------------------------


class EchoHeaders:
    """An endpoint answering every request with HTTP 401 and the request's headers echoed in the body."""

    def __init__(self) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server API)
                self.rfile.read(int(self.headers["Content-Length"]))
                body = json.dumps({"error": "unauthorized", "request_headers": dict(self.headers)}).encode()
                self.send_response(401)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "EchoHeaders":
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def echo() -> Iterator[EchoHeaders]:
    with EchoHeaders() as server:
        yield server


def _annotate_vlm(corpus: Path, endpoint: str, capsys: pytest.CaptureFixture) -> tuple[str, str]:
    assert main(["data", "annotate", "--corpus", str(corpus), "--stages", "vlm", "--vlm_endpoint", endpoint,
                 "--vlm_model", "probe"]) == 0
    captured = capsys.readouterr()
    return captured.out, captured.err


def test_echoed_bearer_key_is_redacted_everywhere(corpus: Path, echo: EchoHeaders, monkeypatch, capsys) -> None:
    monkeypatch.setenv("SOLARWM_VLM_API_KEY", API_KEY)
    out, err = _annotate_vlm(corpus, f"http://127.0.0.1:{echo.port}/v1", capsys)
    stored = [(d / "meta.json").read_text() for d in iter_clip_dirs(corpus)]
    errors = [read_meta(d)["provenance"]["stages"]["vlm"]["error"] for d in iter_clip_dirs(corpus)]
    assert all("HTTP 401" in e and "Bearer <redacted>" in e for e in errors), errors  # the echo did come back
    for text in [out, err, *stored]:
        assert API_KEY not in text and "sk-probe" not in text


def test_url_credentials_are_redacted(corpus: Path, echo: EchoHeaders, monkeypatch, capsys) -> None:
    monkeypatch.setenv("SOLARWM_VLM_API_KEY", API_KEY)
    out, err = _annotate_vlm(corpus, f"http://alice:hunter2pw@127.0.0.1:{echo.port}/v1", capsys)
    error = read_meta(iter_clip_dirs(corpus)[0])["provenance"]["stages"]["vlm"]["error"]
    assert error.startswith("RuntimeError: vlm.http: ") and "<redacted>" in error
    for text in [out, err, *[(d / "meta.json").read_text() for d in iter_clip_dirs(corpus)]]:
        assert "hunter2pw" not in text and "alice" not in text and API_KEY not in text


def test_redact_covers_tokens_userinfo_and_key_parameters() -> None:
    from solarwm.data.annotate.vlm import redact

    text = ("Authorization: Bearer abc.def-123 from https://bob:s3cret@api.example/v1?api_key=k-1&x=2, "
            "and the raw secret my-key too")
    clean = redact(text, ("my-key",))
    assert clean == ("Authorization: Bearer <redacted> from https://<redacted>@api.example/v1?api_key=<redacted>&x=2, "
                     "and the raw secret <redacted> too")


# --- predict: the trajectory and the counts are checked before generation; a refused run leaves no folders --------


@pytest.fixture
def frame(tmp_path: Path) -> Path:
    path = tmp_path / "frame.png"
    Image.fromarray(np.full((32, 32, 3), 90, np.uint8)).save(path)
    return path


def _trajectory_json(tmp_path: Path, **override: Any) -> Path:
    path = tmp_path / "traj.json"
    save_trajectory(compose_segments([forward(4, 0.5)], fps=8.0, width=32, height=32), path)
    doc = json.loads(path.read_text())
    doc.update(override)
    path.write_text(json.dumps(doc))
    return path


def _trajectory_npz(tmp_path: Path, name: str = "traj.npz", **override: Any) -> Path:
    traj = compose_segments([forward(4, 0.5)], fps=8.0, width=32, height=32)
    arrays = {"c2w": traj.c2w, "K": traj.K, "fps": np.float64(traj.fps), "image_size": np.array([32, 32])}
    arrays.update(override)
    path = tmp_path / name
    np.savez(path, **arrays)
    return path


def _predict(frame: Path, trajectory: Path, output: Path, *extra: str) -> list[str]:
    return ["predict", "--adapter", str(frame.parent / "no-adapter"), "--first_frame", str(frame),
            "--trajectory", str(trajectory), "--output", str(output), *extra]


@pytest.mark.parametrize("kind, match", [
    ("json_fps_0", "fps must be a finite number > 0, got 0.0"),
    ("json_fps_negative", "fps must be a finite number > 0, got -8.0"),
    ("json_size_0", "image size must be at least 1x1 pixels, got 0x32"),
    ("npz_fps_0", "fps must be a finite number > 0, got 0.0"),
    ("npz_size_0", "image size must be at least 1x1 pixels, got 0x0"),
    ("npz_truncated", "not a readable .npz archive (BadZipFile"),
    ("npz_empty", "not a readable .npz archive (EOFError"),
    ("json_list", "the top level is a JSON list, expected an object"),
])
def test_bad_trajectory_is_one_line_and_leaves_no_folders(tmp_path, frame, capsys, kind: str, match: str) -> None:
    if kind == "json_fps_0":
        traj = _trajectory_json(tmp_path, fps=0)
    elif kind == "json_fps_negative":
        traj = _trajectory_json(tmp_path, fps=-8)
    elif kind == "json_size_0":
        traj = _trajectory_json(tmp_path, width=0)
    elif kind == "npz_fps_0":
        traj = _trajectory_npz(tmp_path, fps=np.float64(0))
    elif kind == "npz_size_0":
        traj = _trajectory_npz(tmp_path, image_size=np.array([0, 0]))
    elif kind == "npz_truncated":
        traj = _trajectory_npz(tmp_path)
        traj.write_bytes(traj.read_bytes()[: traj.stat().st_size // 2])
    elif kind == "npz_empty":
        traj = tmp_path / "empty.npz"
        traj.write_bytes(b"")
    else:
        traj = tmp_path / "list.json"
        traj.write_text("[1, 2, 3]")
    output = tmp_path / "new" / "deep" / "out.mp4"
    assert main(_predict(frame, traj, output)) == 2
    line = one_error_line(capsys.readouterr().err, "predict")
    assert str(traj) in line and match in line
    assert not (tmp_path / "new").exists()


@pytest.mark.parametrize("option", ["--num_frames", "--num_steps", "--width", "--height"])
def test_zero_counts_are_refused_not_defaulted(tmp_path, frame, capsys, option: str) -> None:
    assert main(_predict(frame, _trajectory_json(tmp_path), tmp_path / "o" / "out.mp4", option, "0")) == 2
    line = one_error_line(capsys.readouterr().err, "predict")
    assert line.endswith(f"{option} must be >= 1, got 0")
    assert not (tmp_path / "o").exists()


def test_failed_generation_removes_only_the_folders_it_made(tmp_path, frame, capsys) -> None:
    """An error after the folders were made (here: no adapter) removes them; an existing folder stays."""
    (tmp_path / "kept").mkdir()
    output = tmp_path / "kept" / "made" / "deeper" / "out.mp4"
    assert main(_predict(frame, _trajectory_json(tmp_path), output)) == 2
    assert "adapter export folder not found" in one_error_line(capsys.readouterr().err, "predict")
    assert (tmp_path / "kept").is_dir() and not (tmp_path / "kept" / "made").exists()


# --- predict: a damaged adapter export is a named error ----------------------------------------------------------


@pytest.fixture(scope="module")
def export(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from solarwm.backbones.wan22_ti2v_5b import Wan22TI2V5BAdapter

    out = tmp_path_factory.mktemp("export") / "adapter"
    torch.manual_seed(0)
    Wan22TI2V5BAdapter(preset="tiny").save_adapter(out)
    return out


@pytest.mark.parametrize("damage, match", [
    ("adapter_list", "expected an object of schema"),
    ("route_list", "'route' has the wrong type (list)"),
    ("config_list", "'config' has the wrong type (list)"),
    ("field_type", "config field 'num_layers' = 'four' does not fit its type"),
    ("literal", "config field 'codec' = 'jpeg' does not fit its type"),
    ("camera_truncated", "camera.safetensors: not a readable safetensors file"),
])
def test_damaged_export_is_one_line(export, tmp_path, frame, capsys, damage: str, match: str) -> None:
    broken = tmp_path / "adapter"
    shutil.copytree(export, broken)
    meta_path = broken / "adapter.json"
    meta = json.loads(meta_path.read_text())
    if damage == "adapter_list":
        meta = [meta]
    elif damage == "route_list":
        meta["route"] = [meta["route"]]
    elif damage == "config_list":
        meta["config"] = list(meta["config"].values())
    elif damage == "field_type":
        meta["config"]["num_layers"] = "four"
    elif damage == "literal":
        meta["config"]["codec"] = "jpeg"
    else:
        camera = broken / "camera.safetensors"
        camera.write_bytes(camera.read_bytes()[: camera.stat().st_size // 2])
    meta_path.write_text(json.dumps(meta))
    args = ["predict", "--adapter", str(broken), "--first_frame", str(frame), "--trajectory",
            str(_trajectory_json(tmp_path)), "--output", str(tmp_path / "out" / "o.mp4"), "--num_frames", "1"]
    assert main(args) == 2
    assert match in one_error_line(capsys.readouterr().err, "predict")
    assert not (tmp_path / "out").exists()


# --- meta.json: valid JSON of the wrong structure is a failed clip in every verb --------------------------------


@pytest.mark.parametrize("edit, match", [
    (lambda d: d.update(provenance=[1, 2]), "`provenance` must be an object, got list"),
    (lambda d: d.pop("meta"), "has no `meta` object"),
    (lambda d: d.pop("provenance"), "has no `provenance` object"),
    (lambda d: d.update(metrics="fast"), "`metrics` must be an object, got str"),
    (lambda d: d.update(selection=["xhigh"]), "`selection` must be an object, got list"),
    (lambda d: d["provenance"].update(stages=[]), "`provenance.stages` must be an object, got list"),
    (lambda d: d["provenance"].update(stages={"vmaf": "ok"}), "`provenance.stages.vmaf` must be an object, got str"),
    (lambda d: d["provenance"].update(owner=["a"]), "`provenance.owner` must be a string, got list"),
    (lambda d: d.update(clip_id=7), "`clip_id` must be a string, got int"),
])
def test_read_meta_checks_the_structure(corpus: Path, edit, match: str) -> None:
    folder = iter_clip_dirs(corpus)[0]
    doc = json.loads((folder / "meta.json").read_text())
    edit(doc)
    (folder / "meta.json").write_text(json.dumps(doc))
    with pytest.raises(ClipError, match=re.escape(match)) as exc:
        read_meta(folder)
    assert exc.value.check == "meta"


def _break_two(corpus: Path) -> list[str]:
    """One clip with a list as provenance, one without ``meta``; returns their folder names."""
    first, second = iter_clip_dirs(corpus)[:2]
    for folder, edit in ((first, lambda d: d.update(provenance=[1, 2])), (second, lambda d: d.pop("meta"))):
        doc = json.loads((folder / "meta.json").read_text())
        edit(doc)
        (folder / "meta.json").write_text(json.dumps(doc))
    return [first.name, second.name]


@pytest.mark.slow
def test_wrong_structure_is_a_failed_clip_in_every_verb(corpus: Path, tmp_path: Path, capsys) -> None:
    broken = _break_two(corpus)

    assert main(["data", "inspect", str(corpus)]) == 1  # 1: some clips failed validation (the verb finished)
    summary = json.loads(capsys.readouterr().out)
    assert summary["valid"] == 1 and sorted(f["clip"] for f in summary["failed"]) == sorted(broken)
    assert summary["failures_by_check"] == {"meta": 2}

    assert main(["data", "annotate", "--corpus", str(corpus), "--stages", "saturation"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["per_stage"]["saturation"] == {"ok": 1, "cached": 0, "skipped": 0, "failed": 2}
    assert summary["accounting"]["total"]["failed"] == 2

    assert main(["data", "select", "--corpus", str(corpus)]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert len(summary["unreadable"]) == 2 and summary["accounting"].endswith("failed 2")

    assert main(["data", "report", "--corpus", str(corpus), "--out", str(tmp_path / "report")]) == 0
    capsys.readouterr()
    assert (tmp_path / "report" / "index.html").is_file()


def test_pack_counts_an_unreadable_clip_as_failed(corpus: Path, tmp_path: Path, capsys) -> None:
    assert main(["data", "select", "--corpus", str(corpus)]) == 0
    bad = iter_clip_dirs(corpus)[0]
    (bad / "meta.json").write_text("{not json")
    capsys.readouterr()
    assert main(["data", "pack", "--corpus", str(corpus), "--out", str(tmp_path / "release")]) == 0
    summary = json.loads(capsys.readouterr().out)
    failed = [c for c in summary["not_packed"] if c["outcome"] == "failed"]
    assert [c["clip_id"] for c in failed] == [bad.name] and "not valid JSON" in failed[0]["error"]
    assert summary["outcomes"]["unknown/failed"] == 1
    assert summary["rows"] + len(summary["not_packed"]) == 3


# --- Corrupt index files ------------------------------------------------------------------------------------------


def _truncated_index(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = b"".join(json.dumps({"sample_id": f"s{i}", "pad": "x" * 200}).encode() + b"\n" for i in range(200))
    data = gzip.compress(rows)
    path.write_bytes(data[:40])  # cut inside the first line: no row can be read
    return path


def test_truncated_index_is_one_line_in_inspect_and_recipe(tmp_path: Path, capsys) -> None:
    index = _truncated_index(tmp_path / "release" / "raw-wds" / "index.jsonl.gz")
    assert main(["data", "inspect", "--index", str(index), "--root", str(tmp_path / "release")]) == 2
    line = one_error_line(capsys.readouterr().err, "data inspect")
    assert f"{index}: not a readable index (EOFError" in line
    spec = REPO / "recipes" / "data"
    spec = next(iter(sorted(spec.glob("*.yaml"))))
    assert main(["data", "recipe", "--release", str(tmp_path / "release"), "--spec", str(spec),
                 "--out", str(tmp_path / "recipe")]) == 2
    assert "not a readable index (EOFError" in one_error_line(capsys.readouterr().err, "data recipe")


def test_bad_gzip_bytes_are_one_line(tmp_path: Path, capsys) -> None:
    index = tmp_path / "index.jsonl.gz"
    index.write_bytes(b"\x1f\x8b\x08\x00" + os.urandom(64))
    assert main(["data", "inspect", "--index", str(index), "--root", str(tmp_path)]) == 2
    assert "not a readable index" in one_error_line(capsys.readouterr().err, "data inspect")


# --- synth ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fps", ["0", "-8"])
def test_synth_bad_fps_is_one_line_before_anything_is_written(tmp_path: Path, capsys, fps: str) -> None:
    out = tmp_path / "worlds"
    assert main(["data", "synth", "--out", str(out), "--clips", "1", "--frames", "3", "--size", "16x16",
                 "--fps", fps]) == 2
    assert "fps must be a finite number > 0" in one_error_line(capsys.readouterr().err, "data synth")
    assert not out.exists()


def test_zero_size_is_refused(tmp_path: Path, capsys) -> None:
    assert main(["data", "synth", "--out", str(tmp_path / "w"), "--size", "0x16"]) == 2
    assert "size must be at least 1x1 pixels" in one_error_line(capsys.readouterr().err, "data synth")


# --- Formats: every verb's error is one line on stderr with its prefix ----------------------------------------------


@pytest.mark.parametrize("argv, command, match", [
    (["data", "annotate", "--corpus", "{tmp}/missing"], "data annotate", "missing: corpus folder not found"),
    (["data", "select"], "data select", "give exactly one of --corpus DIR or --metrics TABLE.parquet"),
    (["data", "select", "--metrics", "m.parquet"], "data select", "--metrics needs --out TIERS.parquet"),
    (["data", "select", "--corpus", "{tmp}/missing"], "data select", "corpus folder not found"),
    (["data", "derive", "--corpus", "{tmp}", "--out", "{tmp}/d", "--transform", "blur"], "data derive",
     "unknown transform 'blur'; known: clean-plate"),
    (["data", "inspect"], "data inspect", "give a clip/corpus PATH or --index FILE --root ROOT"),
    (["data", "report", "--out", "{tmp}/r"], "data report", "give exactly one of --corpus or --release"),
    (["data", "synth", "--out", "{tmp}/w", "--clips", "many"], "data synth", "clips"),
    (["predict", "--first_frame", "x.png"], "predict", "required"),
])
def test_error_format_of_every_verb(tmp_path: Path, capsys, argv: list[str], command: str, match: str) -> None:
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert match in one_error_line(captured.err, command)


# --- fit / test -----------------------------------------------------------------------------------------------------


class _CurrentStderr:
    """A stream that is always the current ``sys.stderr`` (pytest swaps it per test and phase)."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


@pytest.fixture
def recipe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> Path:
    import lightning.pytorch  # noqa: F401  (its log handlers exist from here on)

    from runs import tiny_recipe as _tiny_recipe

    # Lightning's log handlers keep the stderr of the test that first imported it; make them write to the current one.
    for name in [n for n in logging.Logger.manager.loggerDict if n.split(".")[0] == "lightning"]:
        for handler in logging.getLogger(name).handlers:
            if isinstance(handler, logging.StreamHandler):
                monkeypatch.setattr(handler, "stream", _CurrentStderr())
    monkeypatch.chdir(REPO)  # the recipe's pretrained_path is relative to the repository
    return _tiny_recipe(tmp_path / "run")


def test_fit_parse_error_is_one_line(recipe: Path, capsys) -> None:
    assert main(["fit", "--config", str(recipe), "--trainer.bogus", "1"]) == 2
    line = one_error_line(capsys.readouterr().err, "fit")
    assert line == "solarwm fit: error: unrecognized arguments: --trainer.bogus 1"


@pytest.mark.slow
def test_truncated_ckpt_path_is_one_line_and_leaves_no_log_folder(recipe: Path, tmp_path: Path, capsys) -> None:
    ckpt = tmp_path / "last.ckpt"
    torch.save({"state_dict": {"w": torch.zeros(1000)}, "epoch": 0}, ckpt)
    ckpt.write_bytes(ckpt.read_bytes()[: ckpt.stat().st_size // 2])
    assert main(["test", "--config", str(recipe), "--ckpt_path", str(ckpt)]) == 2
    line = one_error_line(capsys.readouterr().err, "test")
    assert f"{ckpt}: not a readable checkpoint" in line and "weights_only=False" not in line
    assert not (recipe.parent / "tb").exists()
    assert main(["fit", "--config", str(recipe), "--ckpt_path", str(tmp_path / "absent.ckpt")]) == 2
    assert "absent.ckpt: checkpoint not found" in one_error_line(capsys.readouterr().err, "fit")


@pytest.mark.slow
def test_bad_trainer_value_is_one_line(recipe: Path, capsys) -> None:
    assert main(["fit", "--config", str(recipe), "--trainer.max_steps", "-5"]) == 2
    err = capsys.readouterr().err
    # Lightning's own "Seed set to 0" info line may precede it; the error is the last line and is one line.
    assert err.rstrip().splitlines()[-1] == (
        "solarwm fit: error: `max_steps` must be a non-negative integer or -1 (infinite steps). You passed in -5.")
    assert "Traceback" not in err and "usage:" not in err
    assert not (recipe.parent / "tb").exists()


@pytest.mark.slow
def test_resume_loads_with_weights_only(recipe: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`fit` hands Lightning weights_only=True for a `--ckpt_path` resume (torch < 2.6 defaulted to False)."""
    from lightning.pytorch import Trainer

    seen: list[Any] = []
    # Trainer.fit itself stays real (LightningCLI builds the options from its signature); its body is replaced.
    monkeypatch.setattr(Trainer, "_fit_impl", lambda self, model, *args: seen.append(args))
    from solarwm.train_cli import main as train_main

    assert train_main(["fit", "--config", str(recipe)]) == 0
    assert seen and seen[0][-1] is True  # (train_dataloaders, val_dataloaders, datamodule, ckpt_path, weights_only)


def test_every_torch_load_is_weights_only_and_torch_floor_is_safe() -> None:
    sources = [p for d in ("solarwm", "backbones", "callbacks", "datamodules", "kernels", "benchmarks", "examples")
               for p in (REPO / d).rglob("*.py")]
    calls = [(p, m.group(0)) for p in sources
             for m in re.finditer(r"torch\.load\((?:[^()]|\([^()]*\))*\)", p.read_text())]
    assert calls, "expected torch.load calls to check"
    assert [c for c in calls if "weights_only=True" not in c[1]] == []
    pyproject = (REPO / "pyproject.toml").read_text()
    assert re.search(r'"torch>=2\.(6|[7-9]|\d\d)', pyproject), "torch.load defaults to weights_only=True from 2.6"
