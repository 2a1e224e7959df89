"""Native-layout fixtures: rendered worlds with known metric OpenCV cameras, written as each source ships them.

A `World` is a rendered clip (64×36) with its exact c2w and pixel K at some native fps. Each
``write_<source>`` function converts it into that source's native files and conventions (an
mp4 plus the source's pose files), so a test can check ``ingest(native(world))`` against the
world. ``TruthOracle`` is a metric reference estimator for the bridge tests: it recognises the
decoded native frames it is given and answers their true poses in an arbitrary rigid gauge.
"""

from __future__ import annotations

import functools
import io
import json
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from solarwm.camera import trajectory as T
from solarwm.camera.conventions import UNREAL_TO_OPENCV, c2w_to_w2c, rotation_to_quat
from solarwm.camera.se3 import se3_inverse
from solarwm.data.estimators import PoseEstimate, register
from solarwm.data.sources.render import render_views
from solarwm.data.sources.synthetic import make_scene
from solarwm.data.video import encode_video_bytes, read_video, read_video_bytes, write_video

WIDTH, HEIGHT = 64, 36


@dataclass(frozen=True)
class World:
    """Frames uint8 ``[N, H, W, 3]`` rendered from c2w ``[N, 4, 4]`` (OpenCV, metres) with K ``[N, 4]`` pixels."""

    frames: np.ndarray
    c2w: np.ndarray
    K: np.ndarray
    fps: float

    @property
    def n(self) -> int:
        return len(self.c2w)


@functools.lru_cache(maxsize=None)
def make_world(n: int, fps: float, seed: int = 0) -> World:
    """A walk along an arc (forward, turning, slight rise) through a random textured world."""
    sec = (n - 1) / fps
    seg = T.Segment(n - 1, forward=1.2 * sec, yaw=25.0 * sec, up=0.1 * sec)
    traj = T.compose_segments([seg], fps=fps, width=WIDTH, height=HEIGHT, fov_x_deg=70.0,
                              start=(0.0, 0.0, 1.5), start_yaw=30.0 * seed, blend_steps=0)
    scene = make_scene(np.random.default_rng(seed), traj.c2w)
    frames = render_views(scene, traj.c2w, traj.K, WIDTH, HEIGHT)
    frames.setflags(write=False)
    return World(frames, traj.c2w, traj.K, float(fps))


def expected_indices(n: int, src_fps: float, frames: int, w: int) -> np.ndarray:
    """Source indices of window ``w`` (independent restatement of the rule: nearest frame at j/16 s)."""
    win = int(np.floor(frames / 16.0 * src_fps + 0.5))
    return np.minimum(n - 1, w * win + np.floor(np.arange(frames) * win / frames + 0.5).astype(int))


# ---------------------------------------------------------------- realcam_vid


def realcam_entry(world: World, stem: str, align_factor: float) -> dict:
    """RealCam-Vid metadata: w2c in relative units (metric / align_factor), K normalised."""
    w2c = c2w_to_w2c(world.c2w)
    w2c[:, :3, 3] /= align_factor
    k = world.K[0] / np.array([WIDTH, HEIGHT, WIDTH, HEIGHT])
    return {"dataset_source": "RealEstate10K", "video_path": f"RealEstate10K/train/scene0/{stem}.mp4",
            "short_caption": "a room", "camera_intrinsics": k, "camera_extrinsics": w2c,
            "align_factor": np.float64(align_factor), "camera_scale": 1.0}


def write_realcam(root: Path, clips: list[tuple[str, np.ndarray, dict | None]], fps: float) -> None:
    """``zip/RealEstate10K/part0.zip`` with each clip's mp4, and ``RealCam-Vid_train.npz`` with the entries."""
    (root / "zip" / "RealEstate10K").mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(root / "zip" / "RealEstate10K" / "part0.zip", "w") as z:
        for stem, frames, _ in clips:
            z.writestr(f"RealEstate10K/train/scene0/{stem}.mp4", encode_video_bytes(frames, fps))
    entries = np.empty(sum(e is not None for _, _, e in clips), dtype=object)
    entries[:] = [e for _, _, e in clips if e is not None]
    np.savez(root / "RealCam-Vid_train.npz", entries)


# ---------------------------------------------------------------- sekai_game


def write_sekai_game(root: Path, stem: str, world: World, norm: float, subset: str = "walking",
                     extrinsic: np.ndarray | None = None, with_npz: bool = True) -> None:
    """``<subset>/<stem>.mp4`` + ``.npz{extrinsic: c2w OpenCV, translation / norm; intrinsic: K / (W, H)}``."""
    d = root / subset
    d.mkdir(parents=True, exist_ok=True)
    write_video(d / f"{stem}.mp4", np.asarray(world.frames), world.fps)
    if not with_npz:
        return
    if extrinsic is None:
        extrinsic = world.c2w.copy()
        extrinsic[:, :3, 3] /= norm
    k = world.K[0]
    intrinsic = np.array([[k[0] / WIDTH, 0, k[2] / WIDTH], [0, k[1] / HEIGHT, k[3] / HEIGHT], [0, 0, 1.0]])
    np.savez(d / f"{stem}.npz", extrinsic=extrinsic, intrinsic=intrinsic)


# ---------------------------------------------------------------- the metric oracle


class TruthOracle:
    """A metric estimator that knows the true poses of the decoded native frames (test double for the bridge)."""

    name, version = "truth-oracle", "1"

    def __init__(self, weights: str | None = None, **_: object):
        with np.load(weights) as d:
            self.frames, self.c2w = d["frames"], d["c2w"]
        gauge = np.eye(4)  # an arbitrary rigid change of world frame: the bridge must not care
        gauge[:3, :3] = T.heading_rotations(np.array([40.0]), np.array([-10.0]))[0]
        gauge[:3, 3] = [3.0, -1.0, 0.5]
        self.gauge = gauge

    def estimate(self, frames: np.ndarray, K: np.ndarray | None, fps: float) -> PoseEstimate:
        flat = self.frames.reshape(len(self.frames), -1).astype(np.int32)
        idx = [int(np.argmin(np.abs(flat - f.reshape(-1).astype(np.int32)).sum(1))) for f in frames]
        c2w = self.gauge @ self.c2w[idx]
        return PoseEstimate(c2w, np.asarray(K), "metric", self.name, self.version)


register("truth-oracle")(TruthOracle)


def write_oracle(path: Path, video: Path | bytes, world: World) -> str:
    """The oracle's 'weights': the decoded native frames and their true metric c2w."""
    frames = read_video(video) if isinstance(video, Path) else read_video_bytes(video)
    np.savez(path, frames=frames, c2w=world.c2w)
    return str(path)


def write_tar(path: Path, members: dict[str, bytes], mode: str = "w") -> None:
    """A tar (``mode`` ``w`` or ``w:gz``) with in-memory members."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, mode) as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def dumps(obj: object) -> bytes:
    """JSON bytes."""
    return json.dumps(obj).encode()

