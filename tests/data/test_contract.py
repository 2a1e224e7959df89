"""Canonical clip write/read/validate, including each named failure, and `data inspect`."""

import json

import numpy as np
import pytest

from solarwm.camera.trajectory import compose_segments, forward
from solarwm.cli import main
from solarwm.data.accounting import account, outcome
from solarwm.data.contract import (
    Clip,
    ClipError,
    clip_id,
    iter_clip_dirs,
    read_clip,
    read_meta,
    update_meta,
    validate_clip,
    write_clip,
)
from solarwm.data.inspect import inspect_corpus


def make_clip(n=9, owner="synthetic", oid="x0", seed=0):
    rng = np.random.default_rng(seed)
    traj = compose_segments([forward(n - 1, 1.0)], width=32, height=32)
    # smooth gradient frames compress well and survive H.264 almost losslessly
    yy, xx = np.mgrid[0:32, 0:32]
    frames = np.stack([np.stack([xx * 7 + t, yy * 7, np.full_like(xx, 128 + t)], -1) for t in range(n)]).astype(
        np.uint8
    )
    return Clip(
        clip_id=clip_id(owner, oid, 0, n),
        frames=frames,
        c2w=traj.c2w,
        K=traj.K,
        caption=f"a test world {rng.integers(100)}",
        meta={"fps": 8.0},
        provenance={
            "owner": owner,
            "original_id": oid,
            "frame_interval": [0, n],
            "conversions": [],
            "versions": {},
            "stages": {},
        },
    )


def test_clip_id_is_deterministic():
    assert clip_id("a", "b", 0, 10) == clip_id("a", "b", 0, 10)
    assert (
        len({clip_id("a", "b", 0, 10), clip_id("a", "b", 0, 11), clip_id("a", "c", 0, 10), clip_id("d", "b", 0, 10)})
        == 4
    )


def test_write_read_round_trip(tmp_path):
    clip = make_clip()
    folder = write_clip(clip, tmp_path)
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        ["intrinsics.npy", "meta.json", "poses.npy", "prompt.txt", "video.mp4"]
    )
    assert (folder / "prompt.txt").read_text() == clip.caption + "\n"
    back = read_clip(folder)
    assert back.frames.shape == (9, 32, 32, 3)
    assert np.abs(back.frames.astype(int) - clip.frames).mean() < 3
    np.testing.assert_array_equal(back.c2w, clip.c2w)
    assert back.c2w.dtype == np.float64 and back.K.dtype == np.float64
    assert back.meta == {"fps": 8.0, "width": 32, "height": 32, "num_frames": 9, "codec": "h264"}
    assert validate_clip(folder) == []
    assert not any(p.name.startswith(".") for p in tmp_path.iterdir())


def _break(folder, what):
    if what == "frame_count":
        np.save(folder / "poses.npy", np.concatenate([np.load(folder / "poses.npy"), np.eye(4)[None]]))
    elif what == "pose_finite":
        p = np.load(folder / "poses.npy")
        p[2, 0, 3] = np.nan
        np.save(folder / "poses.npy", p)
    elif what == "pose_det":
        p = np.load(folder / "poses.npy")
        p[1, :3, 0] *= -1
        np.save(folder / "poses.npy", p)
    elif what == "focal_positive":
        k = np.load(folder / "intrinsics.npy")
        k[0, 0] = -5
        np.save(folder / "intrinsics.npy", k)
    elif what == "video":
        (folder / "video.mp4").write_bytes(b"not an mp4 at all")
    elif what == "missing_file":
        (folder / "intrinsics.npy").unlink()
    elif what == "meta":
        (folder / "meta.json").write_text("{broken")


@pytest.mark.parametrize(
    "what", ["frame_count", "pose_finite", "pose_det", "focal_positive", "video", "missing_file", "meta"]
)
def test_each_failure_is_named(tmp_path, what):
    folder = write_clip(make_clip(), tmp_path)
    _break(folder, what)
    errors = validate_clip(folder)
    assert [e.check for e in errors][:1] == [what]
    assert folder.name in str(errors[0])
    with pytest.raises(ClipError) as e:
        read_clip(folder)
    assert e.value.check == what


def test_write_refuses_invalid_unless_asked(tmp_path):
    clip = make_clip()
    clip.c2w = clip.c2w[:-1]
    with pytest.raises(ClipError, match="frame_count"):
        write_clip(clip, tmp_path)
    assert list(tmp_path.iterdir()) == []
    write_clip(clip, tmp_path, validate=False)
    assert validate_clip(tmp_path / clip.clip_id)[0].check == "frame_count"


def test_interrupted_write_leaves_nothing(tmp_path, monkeypatch):
    import solarwm.data.contract as contract

    def boom(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(contract.np, "save", boom)
    with pytest.raises(KeyboardInterrupt):
        write_clip(make_clip(), tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_update_meta_and_accounting(tmp_path):
    a = write_clip(make_clip(oid="a"), tmp_path)
    b = write_clip(make_clip(oid="b"), tmp_path)
    write_clip(make_clip(oid="c"), tmp_path)
    update_meta(a, lambda m: m.update(selection={"policy": "p", "version": "1", "tier": "xhigh", "reasons": []}))
    update_meta(
        b,
        lambda m: m["provenance"]["stages"].update(
            vmaf={"status": "failed", "version": "1", "error": "video: cannot decode"}
        ),
    )
    assert outcome(read_meta(a)) == "kept-xhigh" and outcome(read_meta(b)) == "failed"
    acc = account(tmp_path)
    assert acc.line() == "ingested 3 = kept-xhigh 1 + kept-high 0 + rejected 0 + failed 1 (+ pending 1)"
    assert not acc.balanced()
    assert acc.failures[0]["stage"] == "vmaf"


def test_inspect_lists_broken_and_passes_rest(tmp_path, capsys):
    folders = [write_clip(make_clip(oid=str(i)), tmp_path) for i in range(4)]
    _break(folders[1], "pose_finite")
    _break(folders[3], "video")
    summary = inspect_corpus(tmp_path)
    assert summary["clips"] == 4 and summary["valid"] == 2 and summary["frames"] == 18
    assert summary["failures_by_check"] == {"pose_finite": 1, "video": 1}
    assert main(["data", "inspect", str(tmp_path)]) == 1
    assert json.loads(capsys.readouterr().out)["valid"] == 2
    assert main(["data", "inspect", str(folders[0])]) == 0
    assert len(iter_clip_dirs(tmp_path)) == 4


def test_video_encoding_is_reproducible_across_processes(tmp_path):
    import subprocess
    import sys

    code = (
        "import numpy as np, hashlib, sys; from solarwm.data.video import encode_video_bytes;"
        "junk = np.empty(int(sys.argv[1]) * 1000);"
        "f = (np.random.default_rng(0).random((9, 48, 64, 3)) * 255).astype(np.uint8);"
        "print(hashlib.sha256(encode_video_bytes(f, 16)).hexdigest())"
    )
    digests = {
        subprocess.run([sys.executable, "-c", code, str(n)], capture_output=True, text=True, check=True).stdout
        for n in (1, 777)
    }
    assert len(digests) == 1
