"""`data pack`: the raw-wds layout, key sanitisation, whole samples per shard, kill-and-resume."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import numpy as np
import pytest

from solarwm.data import release
from solarwm.data.index import read_index, read_rows
from solarwm.data.release import INDEX_FIELDS, ReleaseError, pack_command, sample_key

from corpora import DEFAULT_CLIPS, make_corpus  # noqa: F401


def shard_contents(out: Path) -> dict[str, list[tuple[str, bytes]]]:
    """Every shard's members in tar order, with their bytes."""
    result = {}
    for shard in sorted(out.glob("raw-wds/*/shards/*")):
        with tarfile.open(shard) as tar:
            result[shard.relative_to(out).as_posix()] = [(m.name, tar.extractfile(m).read()) for m in tar]
    return result


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return make_corpus(tmp_path_factory.mktemp("pack"))


def test_layout_index_and_summary(corpus: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "release"
    assert pack_command(str(corpus), str(out), shard_max_samples=2) == 0
    printed = json.loads(capsys.readouterr().out)
    shards = sorted(p.relative_to(out).as_posix() for p in out.glob("raw-wds/*/shards/*"))
    assert shards == [
        "raw-wds/abot/shards/kept-high-000000.tar",
        "raw-wds/abot/shards/rejected-000000.tar",
        "raw-wds/synthetic/shards/kept-high-000000.tar",
        "raw-wds/synthetic/shards/kept-xhigh-000000.tar",
        "raw-wds/synthetic/shards/rejected-000000.tar",
    ]
    rows = read_index(out / "raw-wds/index.jsonl.gz", out)
    assert len(rows) == 7 and printed["rows"] == 7
    for row in rows:
        assert set(INDEX_FIELDS) <= set(row)
        assert row["key"] == sample_key(row["sample_id"]) and "." not in row["key"]
        assert row["shard"].startswith(f"raw-wds/{row['dataset']}/shards/")
        assert Path(row["shard"]).name.startswith(
            {"xhigh": "kept-xhigh", "high": "kept-high", "rejected": "rejected"}[row["kept_tier"]]
        )
        assert row["shard_size"] == (out / row["shard"]).stat().st_size
        assert row["video_member"] == f"{row['key']}.video.mp4"
    not_packed = {c["clip_id"]: c["outcome"] for c in printed["not_packed"]}
    assert not_packed == {"clip-h.7": "failed", "clip-i.8": "pending"}
    assert all(c["num_frames"] == 5 for c in printed["not_packed"])
    assert printed["accounting"].startswith("ingested 9 = kept-xhigh 2 + kept-high 3 + rejected 2 + failed 1")
    # the manifest member carries tier, reasons, metrics and provenance
    row = next(r for r in rows if r["sample_id"] == "clip-d.3")
    with tarfile.open(out / row["shard"]) as tar:
        manifest = json.loads(tar.extractfile(row["manifest_member"]).read())
        c2w = np.load(io.BytesIO(tar.extractfile(row["camera_member"]).read()))["c2w"]
    assert manifest["kept_tier"] == "rejected" and manifest["reasons"] == ["metrics.vmaf >= 0.5"]
    assert manifest["provenance"]["owner"] == "synthetic" and "metrics.vmaf" in manifest["metrics"]
    assert c2w.dtype == np.float32 and c2w.shape == (4, 4, 4)


def test_key_sanitisation_and_collision(tmp_path: Path) -> None:
    assert sample_key("ab.c/d e:f-g_h") == "ab_c_d_e_f-g_h"
    corpus = make_corpus(tmp_path, clips=(("x.y", "synthetic", "high", 4), ("x_y", "synthetic", "high", 4)))
    with pytest.raises(ReleaseError, match=r"'x\.y'.*'x_y'"):
        pack_command(str(corpus), str(tmp_path / "out"))
    assert not list((tmp_path / "out").glob("raw-wds/*/shards/*"))


@pytest.mark.parametrize("max_bytes", [1, 6000, 2**30])
def test_shards_never_split_a_sample(corpus: Path, tmp_path: Path, max_bytes: int) -> None:
    out = tmp_path / "release"
    pack_command(str(corpus), str(out), shard_max_bytes=max_bytes, shard_max_samples=3)
    contents = shard_contents(out)
    home: dict[str, str] = {}
    for shard, members in contents.items():
        keys = {}
        for name, _ in members:
            key = name.split(".", 1)[0]
            keys.setdefault(key, []).append(name.split(".", 1)[1])
        for key, exts in keys.items():
            assert sorted(exts) == ["camera.npz", "intrinsics.npy", "manifest.json", "prompt.txt", "video.mp4"]
            assert key not in home, f"{key} in both {home.get(key)} and {shard}"
            home[key] = shard
        assert len(keys) <= 3
    assert len(home) == 7
    if max_bytes == 1:  # each sample alone in its own shard
        assert len(contents) == 7


def test_kill_and_resume_is_identical(corpus: Path, tmp_path: Path, monkeypatch) -> None:
    clean = tmp_path / "clean"
    pack_command(str(corpus), str(clean), shard_max_samples=1)

    resumed = tmp_path / "resumed"
    original = release._sample_members
    calls = {"n": 0}

    def dying(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] > 3:
            raise KeyboardInterrupt("simulated kill")
        return original(*args, **kwargs)

    monkeypatch.setattr(release, "_sample_members", dying)
    with pytest.raises(KeyboardInterrupt):
        pack_command(str(corpus), str(resumed), shard_max_samples=1)
    assert [p.name for p in resumed.glob("raw-wds/*/shards/*.partial")] == ["kept-high-000000.tar.partial"]
    # a kill between closing a shard and recording it in the journal: the shard is orphaned
    calls["n"] = 0
    saves = {"n": 0}
    original_save = release._save_journal

    def dying_save(*args, **kwargs):
        saves["n"] += 1
        if saves["n"] == 2:
            raise KeyboardInterrupt("killed before the journal write")
        return original_save(*args, **kwargs)

    monkeypatch.setattr(release, "_sample_members", original)
    monkeypatch.setattr(release, "_save_journal", dying_save)
    with pytest.raises(KeyboardInterrupt):
        pack_command(str(corpus), str(resumed), shard_max_samples=1)
    monkeypatch.setattr(release, "_save_journal", original_save)
    assert pack_command(str(corpus), str(resumed), shard_max_samples=1) == 0

    assert shard_contents(resumed) == shard_contents(clean)
    assert read_rows(resumed / "raw-wds/index.jsonl.gz") == read_rows(clean / "raw-wds/index.jsonl.gz")
    assert not list(resumed.rglob("*.partial"))

    # a finished release reruns as a no-op: no file is rewritten
    stamps = {p: p.stat().st_mtime_ns for p in resumed.rglob("*") if p.is_file()}
    assert pack_command(str(corpus), str(resumed), shard_max_samples=1) == 0
    assert {p: p.stat().st_mtime_ns for p in resumed.rglob("*") if p.is_file()} == stamps


def test_kill_leaves_partial_and_resume_removes_it(corpus: Path, tmp_path: Path, monkeypatch) -> None:
    out = tmp_path / "release"
    original = release._sample_members
    calls = {"n": 0}

    def dying(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 4:  # the second clip of synthetic/kept-high: its shard is open
            raise KeyboardInterrupt("simulated kill")
        return original(*args, **kwargs)

    monkeypatch.setattr(release, "_sample_members", dying)
    with pytest.raises(KeyboardInterrupt):
        pack_command(str(corpus), str(out), shard_max_samples=5)
    partials = list(out.glob("raw-wds/*/shards/*.partial"))
    assert len(partials) == 1
    monkeypatch.setattr(release, "_sample_members", original)
    pack_command(str(corpus), str(out), shard_max_samples=5)
    assert not partials[0].exists()
    rows = read_index(out / "raw-wds/index.jsonl.gz", out)
    assert sorted(r["sample_id"] for r in rows) == sorted(
        c[0] for c in DEFAULT_CLIPS if c[2] in ("xhigh", "high", "rejected")
    )
