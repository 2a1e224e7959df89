"""`solarwm data ingest` keys an item by what it reads, not by its file name; an unknown estimator is refused
up front."""

from __future__ import annotations

from collections import Counter

import pytest

from solarwm.cli import main
from solarwm.data.contract import iter_clip_dirs, read_meta
from solarwm.data.sources.ingest import ingest

from native_fixtures import world_mp4

SRC_FPS, N = 30.0, 310  # two 81f windows per video


@pytest.mark.slow
def test_same_named_videos_and_a_symlinked_alias_each_get_their_own_records(tmp_path):
    native, out = tmp_path / "native", tmp_path / "corpus"
    videos = native / "videos"
    for group, name, seed in (("group_0001", "a", 0), ("group_0001", "b", 1), ("group_0002", "a", 2)):
        (videos / group).mkdir(parents=True, exist_ok=True)
        (videos / group / f"{name}.mp4").write_bytes(world_mp4(N, SRC_FPS, seed=seed))
    (videos / "group_0003").symlink_to("group_0001")  # an alias: the same two videos listed again

    # vipe is a known estimator that cannot run here: every real window is a failed record, quickly.
    summary = ingest("spatialvid", native, out, spec="81f", progress=False, estimator="vipe")

    metas = [read_meta(d) for d in iter_clip_dirs(out)]
    assert len(metas) == 3 * 2 + 2 == len({m["clip_id"] for m in metas})  # 3 videos x 2 windows, 2 aliases
    assert summary["items"] == 5 and summary["duplicates"] == 2
    assert len(summary["records"]) == summary["items"]  # every item listed has its record(s)
    assert sum(summary["clips"].values()) == sum(len(r["windows"]) for r in summary["records"]) == len(metas)
    assert summary["failed_reasons"] == {"estimator_unavailable": 3 * 2, "duplicate_item": 2}
    by_item = Counter(m["provenance"]["original_id"] for m in metas)
    # The two real videos named a.mp4 are two items; b keeps its plain name.
    assert by_item["b"] == 2
    assert by_item["a@videos/group_0001/a.mp4"] == by_item["a@videos/group_0002/a.mp4"] == 2
    duplicates = [m for m in metas if "duplicate_item" in m["provenance"]["stages"]["ingest"]["error"]]
    assert sorted(m["provenance"]["original_id"] for m in duplicates) == [
        "a@videos/group_0003/a.mp4",
        "b@videos/group_0003/b.mp4",
    ]
    assert all("group_0001" in m["provenance"]["stages"]["ingest"]["error"] for m in duplicates)

    again = ingest("spatialvid", native, out, spec="81f", progress=False, estimator="vipe")
    assert again["clips"] == summary["clips"] and len(list(iter_clip_dirs(out))) == len(metas)  # a rerun adds nothing


def test_an_unknown_estimator_is_one_line_before_any_work(tmp_path, capsys):
    native, out = tmp_path / "native", tmp_path / "corpus"
    (native / "videos" / "group_0001").mkdir(parents=True)
    (native / "videos" / "group_0001" / "a.mp4").write_bytes(world_mp4(N, SRC_FPS))
    code = main(
        ["data", "ingest", "--source", "spatialvid", "--root", str(native), "--out", str(out), "--estimator", "nosuch"]
    )
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1 and "unknown estimator 'nosuch'" in err and "colmap" in err
    assert not out.exists()  # no work done, nothing written
