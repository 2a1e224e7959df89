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
def make_world(n: int, fps: float, seed: int = 0, fov_x_deg: float = 70.0, width: int = WIDTH,
               height: int = HEIGHT) -> World:
    """A walk along an arc (forward, turning, slight rise) through a random textured world (``width × height``)."""
    sec = (n - 1) / fps
    seg = T.Segment(n - 1, forward=1.2 * sec, yaw=25.0 * sec, up=0.1 * sec)
    traj = T.compose_segments([seg], fps=fps, width=width, height=height, fov_x_deg=fov_x_deg,
                              start=(0.0, 0.0, 1.5), start_yaw=30.0 * seed, blend_steps=0)
    scene = make_scene(np.random.default_rng(seed), traj.c2w)
    frames = render_views(scene, traj.c2w, traj.K, width, height)
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
            self.frames, self.c2w, self.K = d["frames"], d["c2w"], d["K"]
        gauge = np.eye(4)  # an arbitrary rigid change of world frame: the bridge must not care
        gauge[:3, :3] = T.heading_rotations(np.array([40.0]), np.array([-10.0]))[0]
        gauge[:3, 3] = [3.0, -1.0, 0.5]
        self.gauge = gauge

    def estimate(self, frames: np.ndarray, K: np.ndarray | None, fps: float) -> PoseEstimate:
        flat = self.frames.reshape(len(self.frames), -1).astype(np.int32)
        idx = [int(np.argmin(np.abs(flat - f.reshape(-1).astype(np.int32)).sum(1))) for f in frames]
        c2w = self.gauge @ self.c2w[idx]
        return PoseEstimate(c2w, self.K[idx] if K is None else np.asarray(K), "metric", self.name, self.version)


register("truth-oracle")(TruthOracle)


def write_oracle(path: Path, video: Path | bytes, world: World) -> str:
    """The oracle's 'weights': the decoded native frames and their true metric c2w."""
    frames = read_video(video) if isinstance(video, Path) else read_video_bytes(video)
    np.savez(path, frames=frames, c2w=world.c2w, K=world.K)
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



@functools.lru_cache(maxsize=None)
def world_mp4(n: int, fps: float, seed: int = 0, width: int = WIDTH, height: int = HEIGHT) -> bytes:
    """The world's frames as mp4 bytes (encoded once per test session)."""
    return encode_video_bytes(np.asarray(make_world(n, fps, seed, width=width, height=height).frames), fps)


# ---------------------------------------------------------------- abot


def write_abot(root: Path, sample_id: str, world: World, norm: float, actions: int | None = None,
               camera_scale: int = 2, with_annotations: bool = True) -> np.ndarray:
    """``data/<id[:2]>/<id>/{video.mp4, annotations.tar}``: COLMAP w2c (wxyz, translation / norm) per frame,
    a PINHOLE camera given at ``camera_scale`` × the video size, and ``actions`` key rows (default one per frame).
    Returns the uint8 ``[rows, 11]`` actions written."""
    ep = root / "data" / sample_id[:2] / sample_id
    ep.mkdir(parents=True, exist_ok=True)
    (ep / "video.mp4").write_bytes(world_mp4(world.n, world.fps))
    rng = np.random.default_rng(1)
    keys = rng.random((world.n if actions is None else actions, 11)) < 0.3
    if not with_annotations:
        return keys.astype(np.uint8)
    w2c = c2w_to_w2c(world.c2w)
    q, t = rotation_to_quat(w2c[:, :3, :3], "wxyz"), w2c[:, :3, 3] / norm
    lines = [
        "# Image list with two lines of data per image:",
        "#   IMAGE_ID, QW, QX, QY, QZ, TX, TY, TZ, CAMERA_ID, NAME",
    ]
    for i in range(world.n):
        lines += [
            " ".join(
                [str(i + 1), *(f"{v:.17g}" for v in q[i]), *(f"{v:.17g}" for v in t[i]), "1", f"frame_{i + 1:06d}.png"]
            ),
            "",
        ]
    fx, fy, cx, cy = (float(v) for v in world.K[0] * camera_scale)
    cameras = f"# Camera list\n1 PINHOLE {WIDTH * camera_scale} {HEIGHT * camera_scale} {fx!r} {fy!r} {cx!r} {cy!r}\n"
    names = ("W", "A", "S", "D", "Q", "E", "I", "J", "K", "L", "Space")
    action = {"frames": [{"keys": {k: bool(v) for k, v in zip(names, row)}} for row in keys], "control_scheme": "wasd"}
    write_tar(
        ep / "annotations.tar",
        {
            "sparse/0/cameras.txt": cameras.encode(),
            "sparse/0/images.txt": "\n".join(lines).encode(),
            "sparse/0/points3D.txt": b"",
            "action.json": dumps(action),
            "caption.json": dumps({"scene_static": "ignored"}),
        },
    )
    return keys.astype(np.uint8)


# ---------------------------------------------------------------- multicamvideo

SENSOR_MM = 23.76


def unreal_rows(c2w: np.ndarray) -> list[str]:
    """OpenCV metric c2w ``[N, 4, 4]`` → ReCamMaster's Unreal row-vector strings in centimetres."""
    out = []
    for m in c2w:
        ue = np.eye(4)
        ue[:3, :3] = UNREAL_TO_OPENCV.T @ m[:3, :3] @ UNREAL_TO_OPENCV
        ue[:3, 3] = UNREAL_TO_OPENCV.T @ m[:3, 3] * 100.0
        out.append(" ".join("[" + " ".join(f"{v:.17g}" for v in row) + "]" for row in ue.T))
    return out


def write_multicam(root: Path, focal_mm: float, worlds: dict[str, World], scene: str = "scene1") -> Path:
    """``train/f<focal>_aperture2.4/<scene>/{videos/camNN.mp4, cameras/camera_extrinsics.json}``."""
    d = root / "train" / f"f{focal_mm:g}_aperture2.4" / scene
    (d / "videos").mkdir(parents=True, exist_ok=True)
    (d / "cameras").mkdir(parents=True, exist_ok=True)
    n = min(w.n for w in worlds.values())
    rows = {cam: unreal_rows(w.c2w) for cam, w in worlds.items()}
    doc = {f"frame{i}": {cam: rows[cam][i] for cam in worlds} for i in range(n)}
    (d / "cameras" / "camera_extrinsics.json").write_text(json.dumps(doc))
    for cam, w in worlds.items():
        (d / "videos" / f"{cam}.mp4").write_bytes(encode_video_bytes(np.asarray(w.frames), w.fps))
    return d


def fov_for_focal(focal_mm: float) -> float:
    """Horizontal field of view of ``focal_mm`` on the MultiCamVideo sensor."""
    return float(np.degrees(2.0 * np.arctan(SENSOR_MM / (2.0 * focal_mm))))


# ---------------------------------------------------------------- omniworld


def write_omniworld(root: Path, uid: str, world: World, first_frame: int, scale: float | None) -> None:
    """Scene ``uid``: one split of the world's frames as PNGs (global ids from ``first_frame``), its camera json
    (w2c wxyz, translation / scale) and a metadata csv row (no Metric Scale when ``scale`` is None)."""
    import cv2

    ids = list(range(first_frame, first_frame + world.n))
    pngs = {
        f"color/{g:06d}.png": cv2.imencode(".png", np.ascontiguousarray(f[..., ::-1]))[1].tobytes()
        for g, f in zip(ids, world.frames)
    }
    write_tar(root / "videos" / "OmniWorld-Game" / uid / f"{uid}_rgb_0000.tar.gz", pngs, "w:gz")
    w2c = c2w_to_w2c(world.c2w)
    cam = {
        "quats": rotation_to_quat(w2c[:, :3, :3], "wxyz").tolist(),
        "trans": (w2c[:, :3, 3] / (scale or 1.0)).tolist(),
        "focals": world.K[:, 0].tolist(),
        "cx": float(world.K[0, 2]),
        "cy": float(world.K[0, 3]),
    }
    write_tar(
        root / "annotations" / "OmniWorld-Game" / uid / f"{uid}_others.tar.gz",
        {"split_info.json": dumps({"split": [ids]}), "camera/split_0.json": dumps(cam), "fps.txt": b"24"},
        "w:gz",
    )
    csv = root / "metadata" / "omniworld_game_metadata.csv"
    csv.parent.mkdir(parents=True, exist_ok=True)
    if not csv.exists():
        csv.write_text("UID,Metric Scale,FPS,Resolution\n")
    with csv.open("a") as f:
        f.write(f"{uid},{'' if scale is None else repr(scale)},24,64x36\n")


# ---------------------------------------------------------------- video-only sources


def write_dl3dv(root: Path, video: bytes, hashes: list[str]) -> None:
    """``1K/<hash>/video.mp4`` for each hash."""
    for h in hashes:
        (root / "1K" / h).mkdir(parents=True, exist_ok=True)
        (root / "1K" / h / "video.mp4").write_bytes(video)


def write_miradata(root: Path, video: bytes, ids: list[str]) -> None:
    """``shards/shard-00000.tar`` with ``MiraData/clip_video/<id>.mp4`` and its ignored json."""
    members = {}
    for i in ids:
        members[f"MiraData/clip_video/{i}.mp4"] = video
        members[f"MiraData/clip_video/{i}.json"] = dumps({"dense_caption": "ignored"})
    write_tar(root / "shards" / "shard-00000.tar", members)


def write_spatialvid(root: Path, video: bytes, uuids: list[str]) -> None:
    """``videos/group_0001.tar.gz`` with ``group_0001/<uuid>.mp4``."""
    write_tar(root / "videos" / "group_0001.tar.gz", {f"group_0001/{u}.mp4": video for u in uuids}, "w:gz")


def write_sekai_walking(root: Path, video: bytes, stems: list[str], hq: list[str]) -> None:
    """``sekai-real-walking/sekai-real-walking_part000.tar`` with the stems, and the HQ csv listing ``hq``."""
    write_tar(root / "sekai-real-walking" / "sekai-real-walking_part000.tar", {f"{s}.mp4": video for s in stems})
    (root / "train").mkdir(parents=True, exist_ok=True)
    rows = "".join(f"{s}.mp4,a long caption\n" for s in hq)
    (root / "train" / "sekai-real-walking-hq.csv").write_text("videoFile,caption\n" + rows)


def mind_actions(n: int) -> dict:
    """MIND action.json rows 0..n-1."""
    return {
        "data": [
            {
                "time": i,
                "ws": i % 3 - 1,
                "ad": (i // 2) % 3 - 1,
                "ud": 0,
                "lr": (i // 5) % 3 - 1,
                "actor_pos": {"x": 0.1 * i, "y": 0.0, "z": 1.0},
                "actor_rpy": {"x": 0.0, "y": 0.0, "z": 0.01 * i},
            }
            for i in range(n)
        ]
    }


def write_mind(root: Path, video: bytes, n: int, items: dict[str, int | None]) -> None:
    """``1st_data/train/<item>/{video.mp4, action.json}``; ``items`` maps folder → action rows (None: no file)."""
    for name, rows in items.items():
        d = root / "1st_data" / "train" / name
        d.mkdir(parents=True, exist_ok=True)
        (d / "video.mp4").write_bytes(video)
        if rows is not None:
            (d / "action.json").write_text(json.dumps(mind_actions(rows)))
