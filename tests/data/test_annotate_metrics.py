"""Metric stages on generated clips with known properties (saturation, VMAF Motion, cuts, flow, camera)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import cv2
import numpy as np
import pytest

from solarwm.data.annotate import visual
from solarwm.data.annotate.runner import annotate_clip
from solarwm.data.annotate.stages import AnnotateConfig, AnnotateConfigError
from solarwm.data.contract import Clip, read_meta, write_clip


def make_clip(corpus: Path, name: str, frames: np.ndarray, fps: float = 16.0, c2w: np.ndarray | None = None) -> Path:
    """Write a canonical clip with identity poses (or ``c2w``) and a 60-degree pinhole."""
    n, h, w = frames.shape[:3]
    if c2w is None:
        c2w = np.tile(np.eye(4), (n, 1, 1))
    K = np.tile([w / (2 * np.tan(np.radians(30))), w / (2 * np.tan(np.radians(30))), w / 2, h / 2], (n, 1))
    clip = Clip(clip_id=name, frames=frames, c2w=c2w, K=K, caption="test clip", meta={"fps": fps},
                provenance={"owner": "test", "original_id": name, "frame_interval": [0, n]})
    return write_clip(clip, corpus, validate=False)


def texture(h: int, w: int, seed: int = 0) -> np.ndarray:
    """Smooth multi-scale colour texture (trackable by optical flow, not periodic)."""
    rng = np.random.default_rng(seed)
    coarse = cv2.resize(
        rng.integers(0, 255, (h // 8, w // 8, 3)).astype(np.uint8), (w, h), interpolation=cv2.INTER_CUBIC
    )
    return cv2.add(coarse, rng.integers(0, 40, (h, w, 3), dtype=np.uint8))


def translated(n: int, h: int, w: int, shift: int, seed: int = 0) -> np.ndarray:
    """``n`` frames of a texture translated left by ``shift`` px per frame, ``[n, h, w, 3]``."""
    tex = texture(h, w + shift * n, seed)
    return np.stack([tex[:, shift * i : shift * i + w] for i in range(n)])


def metrics_of(folder: Path, stages: list[str]) -> dict:
    result = annotate_clip(str(folder), stages, AnnotateConfig())
    assert not result.errors, result.errors
    return read_meta(folder)["metrics"]


def test_saturation_grey_vs_saturated(tmp_path: Path) -> None:
    grey = np.full((20, 64, 64, 3), 128, np.uint8)
    colours = np.zeros((20, 64, 64, 3), np.uint8)
    colours[:, :, :32, 0] = 255  # pure red | pure blue halves
    colours[:, :, 32:, 2] = 255
    m_grey = metrics_of(make_clip(tmp_path, "grey", grey), ["saturation"])
    m_col = metrics_of(make_clip(tmp_path, "colour", colours), ["saturation"])
    assert m_grey["metrics.saturation"] < 3.0
    assert m_col["metrics.saturation"] > 200.0


def test_saturation_samples_evenly() -> None:
    assert list(visual.evenly_spaced(10, 16)) == list(range(10))
    idx = visual.evenly_spaced(100, 16)
    assert len(idx) == 16 and idx[0] == 0 and idx[-1] == 99


def test_vmaf_static_vs_moving(tmp_path: Path) -> None:
    static = np.repeat(texture(64, 96)[None], 24, axis=0)
    moving = translated(24, 64, 96, shift=2)
    m_static = metrics_of(make_clip(tmp_path, "static", static), ["vmaf"])
    m_moving = metrics_of(make_clip(tmp_path, "moving", moving), ["vmaf"])
    assert m_static["metrics.vmaf"] < 0.1
    assert m_moving["metrics.vmaf"] > 1.0


@pytest.mark.skipif(
    shutil.which("ffmpeg") is None, reason="Debian ffmpeg binary not installed (apt-get install ffmpeg)"
)
def test_vmaf_equals_ffmpeg_binary(tmp_path: Path) -> None:
    folder = make_clip(tmp_path, "moving", translated(30, 64, 96, shift=3, seed=1))
    ours = metrics_of(folder, ["vmaf"])["metrics.vmaf"]
    proc = subprocess.run(
        ["ffmpeg", "-hide_banner", "-nostats", "-i", str(folder / "video.mp4"), "-vf", "vmafmotion", "-f", "null", "-"],
        capture_output=True,
        text=True,
        check=True,
    )
    printed = float(re.search(r"VMAF Motion avg: ([0-9.]+)", proc.stderr).group(1))
    assert ours == printed
    assert ours > 0


def test_hard_cut_detected(tmp_path: Path) -> None:
    a = np.repeat(texture(64, 96, seed=1)[None], 20, axis=0)
    b = np.repeat((255 - texture(64, 96, seed=2))[None], 20, axis=0)
    m_cut = metrics_of(make_clip(tmp_path, "cut", np.concatenate([a, b])), ["cuts"])
    m_none = metrics_of(make_clip(tmp_path, "nocut", translated(40, 64, 96, shift=1)), ["cuts"])
    assert m_cut["metrics.scene_cuts"] >= 1
    assert m_none["metrics.scene_cuts"] == 0


def test_flow_dis_matches_known_shift(tmp_path: Path) -> None:
    # 1 px/frame at width 288 -> 10 px between Open-Sora's frames 0,10,20,30 -> 20 px at width 576.
    m = metrics_of(make_clip(tmp_path, "shift", translated(31, 160, 288, shift=1)), ["flow"])
    assert m["metrics.flow_dis"] == pytest.approx(20.0, abs=2.0)
    assert "metrics.unimatch" not in m  # no checkpoint configured: absent, not a placeholder
    m0 = metrics_of(make_clip(tmp_path, "still", np.repeat(texture(160, 288)[None], 31, axis=0)), ["flow"])
    assert m0["metrics.flow_dis"] < 0.5


def test_flow_indices_clip_to_available_frames() -> None:
    assert visual.flow_frame_indices(33) == [0, 10, 20, 30]
    assert visual.flow_frame_indices(15) == [0, 10]
    with pytest.raises(visual.MetricError, match="flow.frames"):
        visual.flow_frames(np.zeros((1, 8, 8, 3), np.uint8))
    portrait = visual.flow_frames(np.zeros((11, 64, 32, 3), np.uint8))
    assert portrait.shape == (2, 3, 320, 576)


def test_camera_nan_poses_leave_only_finite_flag_and_units(tmp_path: Path) -> None:
    """NaN poses: no geometry metric is computed, only the flag (and the recorded units the gate reads)."""
    frames = np.repeat(texture(32, 32)[None], 8, axis=0)
    c2w = np.tile(np.eye(4), (8, 1, 1))
    c2w[3, 0, 3] = np.nan
    folder = make_clip(tmp_path, "nan", frames, c2w=c2w)
    m = metrics_of(folder, ["camera"])
    assert m == {"camera.finite": False, "camera.pose_units": "metric"}
    good = metrics_of(make_clip(tmp_path, "good", frames), ["camera"])
    assert good["camera.finite"] is True
    assert good["camera.fov_x_min"] == pytest.approx(60.0)
    rec = read_meta(folder)["provenance"]["stages"]["camera"]
    assert rec["status"] == "ok" and rec["keys"] == ["camera.finite", "camera.pose_units"]


def test_undecodable_video_fails_stage_with_named_check(tmp_path: Path) -> None:
    folder = make_clip(tmp_path, "broken", np.repeat(texture(32, 32)[None], 8, axis=0))
    (folder / "video.mp4").write_bytes(b"not a video")
    result = annotate_clip(str(folder), ["camera", "saturation", "vmaf"], AnnotateConfig())
    assert result.stages == {"camera": "ok", "saturation": "failed", "vmaf": "failed"}
    stages = read_meta(folder)["provenance"]["stages"]
    assert stages["saturation"]["error"].startswith("video:")
    assert "metrics.saturation" not in read_meta(folder)["metrics"]


def test_model_configuration_errors(tmp_path: Path) -> None:
    with pytest.raises(AnnotateConfigError, match="not a file"):
        AnnotateConfig(unimatch_checkpoint=str(tmp_path / "missing.pth")).check(["flow"])
    ckpt = tmp_path / "gmflow.pth"
    ckpt.write_bytes(b"x")
    with pytest.raises(AnnotateConfigError, match="UniMatch model code is not importable"):
        AnnotateConfig(unimatch_checkpoint=str(ckpt)).check(["flow"])
    with pytest.raises(AnnotateConfigError, match="option file"):
        AnnotateConfig(dover_checkpoint=str(ckpt)).check(["dover"])
    with pytest.raises(AnnotateConfigError, match="unknown stage"):
        AnnotateConfig().check(["sharpness"])
    with pytest.raises(AnnotateConfigError, match="endpoint"):
        AnnotateConfig().check(["vlm"])
    json.dumps(AnnotateConfig().__dict__, default=str)  # config stays plain data (picklable, loggable)
