"""Ground-truth sources: ingest(native(world)) gives back the world's poses, K and frames; bad items fail by name."""

from pathlib import Path

import numpy as np
import pytest

from solarwm.data.accounting import account
from solarwm.data.contract import clip_id, iter_clip_dirs, read_clip, read_meta
from solarwm.data.sources.ingest import ingest

from native_fixtures import (
    expected_indices,
    fov_for_focal,
    make_world,
    realcam_entry,
    write_abot,
    write_multicam,
    write_omniworld,
    write_oracle,
    write_realcam,
    write_sekai_game,
)

SRC_FPS, N = 30.0, 310  # two whole 81f windows of 152 source frames each


def _failures(out: Path) -> dict[str, str]:
    """original_id → ingest error of every failed record."""
    found = {}
    for d in iter_clip_dirs(out):
        prov = read_meta(d)["provenance"]
        stage = prov["stages"]["ingest"]
        if stage["status"] == "failed":
            found[prov["original_id"]] = stage["error"]
    return found


def check_windows(out: Path, owner: str, oid: str, world, spec_frames: int = 81, src_fps: float = SRC_FPS,
                  windows: int = 2, frame_tol: float = 12.0) -> None:
    """Each window clip equals the world at the expected source frames."""
    n = world.n
    win = int(np.floor(spec_frames / 16.0 * src_fps + 0.5))
    for w in range(windows):
        idx = expected_indices(n, src_fps, spec_frames, w)
        clip = read_clip(out / clip_id(owner, oid, w * win, (w + 1) * win))
        np.testing.assert_allclose(clip.c2w, world.c2w[idx], atol=1e-5)
        np.testing.assert_allclose(clip.K, world.K[idx], atol=1e-5)
        err = np.abs(clip.frames.astype(np.float64) - world.frames[idx]).mean()
        assert err < frame_tol, f"window {w}: mean abs frame error {err:.2f}"
        prov = clip.provenance
        assert prov["original_id"] == oid and prov["frame_interval"] == [w * win, (w + 1) * win]
        assert prov["owner"] == owner and prov["source_fps"] == pytest.approx(src_fps)
        assert clip.meta["fps"] == 16.0 and clip.meta["num_frames"] == spec_frames
        assert clip.meta["pose_units"] == "metric" and prov["pose_units"] == "metric"
        assert "resample_fps" in [c["name"] for c in prov["conversions"]]


def test_realcam_vid_roundtrip_and_malformed_items(tmp_path):
    world = make_world(N, SRC_FPS)
    frames = np.asarray(world.frames)
    good = realcam_entry(world, "re10k_good", align_factor=2.5)
    nan = realcam_entry(world, "re10k_nan", 2.5)
    nan["camera_extrinsics"][7, 0, 3] = np.nan
    flip = realcam_entry(world, "re10k_det", 2.5)
    flip["camera_extrinsics"][3, :3, 0] *= -1.0  # an improper rotation (det -1)
    short = realcam_entry(world, "re10k_count", 2.5)
    short["camera_extrinsics"] = short["camera_extrinsics"][:-1]
    write_realcam(
        tmp_path / "native",
        [
            ("re10k_good", frames, good),
            ("re10k_nometa", frames[:40], None),
            ("re10k_nan", frames, nan),
            ("re10k_det", frames, flip),
            ("re10k_count", frames, short),
            ("re10k_brief", frames[:100], realcam_entry(make_world(100, SRC_FPS), "re10k_brief", 1.0)),
        ],
        SRC_FPS,
    )
    out = tmp_path / "corpus"
    summary = ingest("realcam_vid", tmp_path / "native", out, spec="81f", progress=False)

    check_windows(out, "realcam_vid", "re10k_good", world)
    conv = read_clip(out / clip_id("realcam_vid", "re10k_good", 0, 152), load_video=False).provenance["conversions"]
    assert [c["name"] for c in conv] == ["scale_w2c_translation", "w2c_to_c2w", "normalized_to_pixel_K", "resample_fps"]
    assert conv[0]["scale"] == 2.5 and all(isinstance(c["version"], int) for c in conv)
    fails = _failures(out)
    assert fails["re10k_nometa"].startswith("missing_pose_file")
    assert fails["re10k_nan"].startswith("pose_nonfinite")
    assert fails["re10k_det"].startswith("pose_improper_rotation")
    assert fails["re10k_count"].startswith("frame_pose_count_mismatch")
    assert fails["re10k_brief"].startswith("too_short")
    assert summary["items"] == 6 and summary["clips"] == {"written": 2, "skipped": 0, "failed": 5}

    total = account(out).total()
    assert total["ingested"] == 7 == total["pending"] + total["failed"] and total["failed"] == 5

    before = sorted(p.name for p in out.iterdir())
    again = ingest("realcam_vid", tmp_path / "native", out, spec="81f", progress=False)
    assert again["clips"] == {"written": 0, "skipped": 2, "failed": 5}
    assert sorted(p.name for p in out.iterdir()) == before
    assert account(out).total() == total


@pytest.mark.slow
def test_sekai_game_bridge_restores_metres_and_fails_closed(tmp_path):
    world = make_world(N, SRC_FPS)
    native, out = tmp_path / "native", tmp_path / "corpus"
    stem = "00100100001_0004650_0004960"
    write_sekai_game(native, stem, world, norm=4.0)
    write_sekai_game(native, "00100100002_0000000_0000310", world, 4.0, with_npz=False)
    bad = world.c2w.copy()
    bad[5, :3, 1] *= -1.0
    write_sekai_game(native, "00100100003_0000000_0000310", world, 1.0, subset="drone", extrinsic=bad)

    # The default colmap without a depth model is relative, so it is no metric reference: the clip
    # fails closed before any SfM runs, and no scale is made up.
    first = ingest("sekai_game", native, out, spec="81f", progress=False)
    fails = _failures(out)
    assert first["failed_reasons"] == {
        "metric_reference_not_metric": 2,
        "missing_pose_file": 1,
        "pose_improper_rotation": 1,
    }
    assert fails[stem].startswith("metric_reference_not_metric: estimator colmap returns relative")
    window_records = [
        read_meta(d)["provenance"] for d in iter_clip_dirs(out) if read_meta(d)["provenance"]["original_id"] == stem
    ]
    assert sorted(p["frame_interval"] for p in window_records) == [[0, 152], [152, 304]]

    # With a metric reference the same run resumes: the failed windows become clips under the same ids.
    weights = write_oracle(tmp_path / "oracle.npz", native / "walking" / f"{stem}.mp4", world)
    second = ingest(
        "sekai_game", native, out, spec="81f", estimator="truth-oracle", estimator_weights=weights, progress=False
    )
    assert second["clips"] == {"written": 2, "skipped": 0, "failed": 2}
    check_windows(out, "sekai_game", stem, world)
    clip = read_clip(out / clip_id("sekai_game", stem, 0, 152), load_video=False)
    scale = [c for c in clip.provenance["conversions"] if c["name"] == "metric_scale"][0]
    assert scale["scale"] == pytest.approx(4.0, rel=1e-9) and scale["method"] == "windowed_bridge"
    assert clip.provenance["metric_bridge"]["accepted"] >= 3
    assert clip.provenance["native"]["game_frame_range"] == [4650, 4960]
    total = account(out).total()
    assert total["ingested"] == 4 and total["failed"] == 2 and total["pending"] == 2


@pytest.mark.slow
def test_abot_colmap_actions_and_bridge(tmp_path):
    world = make_world(N, SRC_FPS)
    native, out = tmp_path / "native", tmp_path / "corpus"
    sid = "0006949c46a4494be1f43365691e344c"
    keys = write_abot(native, sid, world, norm=0.37)
    write_abot(native, "11aa" + "0" * 28, world, 1.0, actions=N - 3)  # wrong action row count
    write_abot(native, "22bb" + "0" * 28, world, 1.0, with_annotations=False)
    weights = write_oracle(tmp_path / "oracle.npz", native / "data" / sid[:2] / sid / "video.mp4", world)
    summary = ingest(
        "abot", native, out, spec="81f", estimator="truth-oracle", estimator_weights=weights, progress=False
    )
    assert summary["failed_reasons"] == {"action_count_mismatch": 1, "missing_pose_file": 1}
    check_windows(out, "abot", sid, world)
    for w in range(2):
        folder = out / clip_id("abot", sid, w * 152, (w + 1) * 152)
        np.testing.assert_array_equal(np.load(folder / "action.npy"), keys[expected_indices(N, SRC_FPS, 81, w)])
    conv = read_clip(folder, load_video=False).provenance["conversions"]
    assert [c["name"] for c in conv] == ["quaternion_w2c_to_c2w", "resize_K", "resample_fps", "metric_scale"]
    assert conv[-1]["scale"] == pytest.approx(0.37, rel=1e-9)


def test_multicamvideo_unreal_centimetres_relabelled(tmp_path):
    focal = 24.0
    worlds = {
        "cam01": make_world(81, 15.0, 0, fov_for_focal(focal)),
        "cam02": make_world(81, 15.0, 1, fov_for_focal(focal)),
    }
    native, out = tmp_path / "native", tmp_path / "corpus"
    write_multicam(native, focal, worlds)
    summary = ingest("multicamvideo", native, out, progress=False)  # default spec 81f
    assert summary["clips"]["written"] == 2
    for cam, world in worlds.items():
        oid = f"train_f24_aperture2.4_scene1_{cam}"
        clip = read_clip(out / clip_id("multicamvideo", oid, 0, 81))
        np.testing.assert_allclose(clip.c2w, world.c2w, atol=1e-5)
        np.testing.assert_allclose(clip.K, world.K, atol=1e-5)
        assert np.abs(clip.frames.astype(float) - world.frames).mean() < 12.0
        assert np.linalg.det(clip.c2w[:, :3, :3]) == pytest.approx(np.ones(81))
        names = [c["name"] for c in clip.provenance["conversions"]]
        assert names == ["unreal_to_opencv", "centimetres_to_metres", "focal_mm_to_pixel_K", "relabel_fps"]
        assert clip.provenance["source_fps"] == 15.0 and clip.meta["fps"] == 16.0


def test_multicamvideo_refuses_to_resample_at_a_longer_spec(tmp_path):
    world = make_world(81, 15.0, 0, fov_for_focal(35.0))
    write_multicam(tmp_path / "native", 35.0, {"cam01": world})
    summary = ingest("multicamvideo", tmp_path / "native", tmp_path / "corpus", spec="160f", progress=False)
    assert summary["failed_reasons"] == {"too_short": 1}


def test_omniworld_split_pngs_metric_scale(tmp_path):
    world = make_world(130, 24.0, 2)
    native, out = tmp_path / "native", tmp_path / "corpus"
    write_omniworld(native, "a1b2c3", world, first_frame=100, scale=3.5)
    write_omniworld(native, "d4e5f6", make_world(130, 24.0, 2), first_frame=0, scale=None)
    summary = ingest("omniworld", native, out, progress=False)
    assert summary["failed_reasons"] == {"metric_scale_missing": 1}
    check_windows(out, "omniworld", "a1b2c3_s0", world, src_fps=24.0, windows=1, frame_tol=8.0)
    clip = read_clip(out / clip_id("omniworld", "a1b2c3_s0", 0, 122), load_video=False)
    assert clip.provenance["native"]["global_frames"] == [100, 230]
    assert [c["name"] for c in clip.provenance["conversions"]] == [
        "quaternion_w2c_to_c2w",
        "metric_scale",
        "resample_fps",
    ]
