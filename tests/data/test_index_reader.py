"""The one index reader: each rejection by name, check_index, load_row round trip, inspect."""

from __future__ import annotations

import gzip
import io
import json
import tarfile
from pathlib import Path

import numpy as np
import pytest

from solarwm.data.contract import read_clip
from solarwm.data.index import (
    IndexValidationError,
    ShardReader,
    check_index,
    inspect_index_command,
    load_row,
    read_index,
    read_member,
    read_rows,
    write_rows,
)
from solarwm.data.release import pack_command

from corpora import make_corpus


@pytest.fixture(scope="module")
def packed(tmp_path_factory) -> tuple[Path, Path, list[dict]]:
    root = tmp_path_factory.mktemp("index")
    corpus = make_corpus(root)
    out = root / "release"
    pack_command(str(corpus), str(out), shard_max_samples=2)
    return corpus, out, read_rows(out / "raw-wds/index.jsonl.gz")


def _reject(rows: list[dict], root: Path, tmp_path: Path) -> IndexValidationError:
    path = write_rows(tmp_path / "bad.jsonl.gz", rows)
    with pytest.raises(IndexValidationError) as info:
        read_index(path, root)
    return info.value


def test_valid_index_reads(packed) -> None:
    _, out, rows = packed
    assert read_index(out / "raw-wds/index.jsonl.gz", out) == rows
    # a plain (not gzipped) index reads the same
    plain = out / "plain.jsonl"
    plain.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert read_index(plain, out) == rows


def test_duplicate_id(packed, tmp_path) -> None:
    _, out, rows = packed
    err = _reject(rows + [dict(rows[0])], out, tmp_path)
    assert err.check == "duplicate_id" and err.row == (len(rows) + 1, rows[0]["sample_id"])
    assert rows[0]["sample_id"] in str(err) and f"line {len(rows) + 1}" in str(err)


@pytest.mark.parametrize("field,value", [
    ("shard", "/abs/raw-wds/x.tar"),
    ("shard", "raw-wds/../../etc/x.tar"),
    ("video_member", "/tmp/x.video.mp4"),
    ("manifest_member", "../x.manifest.json"),
])
def test_unsafe_paths(packed, tmp_path, field, value) -> None:
    _, out, rows = packed
    bad = [dict(r) for r in rows]
    bad[2][field] = value
    err = _reject(bad, out, tmp_path)
    assert err.check == "path" and err.row == (3, rows[2]["sample_id"])


def test_shard_escaping_root_through_symlink(packed, tmp_path) -> None:
    _, out, rows = packed
    root = tmp_path / "root"
    root.mkdir()
    (root / "raw-wds").symlink_to(out / "raw-wds")  # resolves outside `root`
    err = _reject(rows, root, tmp_path)
    assert err.check == "path" and "outside the root" in err.detail


@pytest.mark.parametrize("value", [0, 1.5, True, "2", -1, None])
def test_epoch_repeats(packed, tmp_path, value) -> None:
    _, out, rows = packed
    bad = [dict(r, epoch_repeats=2) for r in rows]
    assert read_index(write_rows(tmp_path / "ok.jsonl.gz", bad), out)  # integers >= 1 pass
    bad[1]["epoch_repeats"] = value
    err = _reject(bad, out, tmp_path)
    assert err.check == "epoch_repeats" and err.row == (2, rows[1]["sample_id"])


def test_missing_shard_wrong_size_missing_member(packed, tmp_path) -> None:
    _, out, rows = packed
    err = _reject([dict(rows[0], shard="raw-wds/synthetic/shards/kept-high-999999.tar")], out, tmp_path)
    assert err.check == "shard_missing"
    err = _reject([dict(rows[0], shard_size=rows[0]["shard_size"] + 512)], out, tmp_path)
    assert err.check == "shard_size"
    err = _reject([dict(rows[0], camera_member="nope.camera.npz")], out, tmp_path)
    assert err.check == "member_missing" and "nope.camera.npz" in err.detail


def test_bad_window_and_bad_json(packed, tmp_path) -> None:
    _, out, rows = packed
    err = _reject([dict(rows[0], start_frame=rows[0]["num_frames"], window_frames=1)], out, tmp_path)
    assert err.check == "window"
    path = tmp_path / "broken.jsonl.gz"
    with gzip.open(path, "wt") as fh:
        fh.write(json.dumps(rows[0]) + "\n{not json\n")
    with pytest.raises(IndexValidationError) as info:
        read_index(path, out)
    assert info.value.check == "json" and info.value.row[0] == 2


def test_check_index_collects_all(packed, tmp_path) -> None:
    _, out, rows = packed
    bad = [dict(r) for r in rows]
    bad[0]["epoch_repeats"] = 0
    bad[3]["shard"] = "/abs.tar"
    bad.append(dict(rows[1]))
    ok, failures = check_index(write_rows(tmp_path / "bad.jsonl.gz", bad), out)
    assert len(ok) == len(rows) - 2
    assert sorted((f.row[0], f.check) for f in failures) == [
        (1, "epoch_repeats"),
        (4, "path"),
        (len(bad), "duplicate_id"),
    ]


def test_load_row_round_trip(packed) -> None:
    corpus, out, rows = packed
    reader = ShardReader()
    for row in rows:
        sample = load_row(row, out, reader)
        clip = read_clip(corpus / row["sample_id"], load_video=True)
        assert sample["frames"].dtype == np.uint8 and np.array_equal(sample["frames"], clip.frames)
        assert sample["c2w"].dtype == np.float64 and sample["K"].dtype == np.float64
        np.testing.assert_allclose(sample["c2w"], clip.c2w.astype(np.float32), rtol=0, atol=0)
        np.testing.assert_allclose(sample["K"], clip.K.astype(np.float32), rtol=0, atol=0)
        assert sample["caption"] == clip.caption and sample["manifest"]["sample_id"] == row["sample_id"]
    # a window row returns only its window
    row = max(rows, key=lambda r: r["num_frames"])
    window = load_row(dict(row, start_frame=2, window_frames=3), out, reader)
    full = load_row(row, out, reader)
    assert np.array_equal(window["frames"], full["frames"][2:5]) and np.array_equal(window["c2w"], full["c2w"][2:5])
    reader.close()


def test_load_row_rejects_misaligned_members(packed, tmp_path) -> None:
    _, out, rows = packed
    short = min(rows, key=lambda r: r["num_frames"])
    long = max(rows, key=lambda r: r["num_frames"])
    # a shard holding one clip's video with another clip's (shorter) camera track
    root = tmp_path / "root"
    root.mkdir()
    members = {
        "m.video.mp4": read_member(long, "video_member", out),
        "m.camera.npz": read_member(short, "camera_member", out),
        "m.intrinsics.npy": read_member(long, "intrinsics_member", out),
        "m.manifest.json": read_member(long, "manifest_member", out),
        "m.prompt.txt": read_member(long, "prompt_member", out),
    }
    with tarfile.open(root / "mixed.tar", "w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    row = dict(
        long,
        shard="mixed.tar",
        shard_size=(root / "mixed.tar").stat().st_size,
        video_member="m.video.mp4",
        camera_member="m.camera.npz",
        intrinsics_member="m.intrinsics.npy",
        manifest_member="m.manifest.json",
        prompt_member="m.prompt.txt",
    )
    assert read_index(write_rows(tmp_path / "mixed.jsonl.gz", [row]), root) == [row]
    with pytest.raises(IndexValidationError) as info:
        load_row(row, root)
    assert info.value.check == "frame_alignment"


def test_inspect_index_command(packed, tmp_path, capsys) -> None:
    _, out, rows = packed
    assert inspect_index_command(str(out / "raw-wds/index.jsonl.gz"), str(out), decode=True) == 0
    summary = json.loads(capsys.readouterr().out)
    assert (
        summary["rows_ok"] == len(rows)
        and summary["failures"] == []
        and summary["shards"] == len({r["shard"] for r in rows})
    )
    bad = [dict(r) for r in rows]
    bad[1]["epoch_repeats"] = "2"
    bad[2]["shard_size"] = 1
    assert inspect_index_command(str(write_rows(tmp_path / "bad.jsonl.gz", bad)), str(out)) == 1
    summary = json.loads(capsys.readouterr().out)
    assert summary["failures_by_check"] == {"epoch_repeats": 1, "shard_size": 1}
    assert [(f["line"], f["sample_id"]) for f in summary["failures"]] == [
        (2, rows[1]["sample_id"]),
        (3, rows[2]["sample_id"]),
    ]
