"""Procedurally rendered worlds with exact metric cameras: the embedded data source.

A fresh machine has no datasets, so `solarwm data synth` renders canonical clips of owner
``synthetic``: a random camera path (segments from `solarwm.camera.trajectory`), a textured
world built around it (boxes kept clear of the path, many of them placed where the camera
looks), and the ray caster of `solarwm.data.sources.render`. Poses are the exact c2w the
pixels were rendered from (OpenCV axes, metres) and K is the exact pinhole in pixels, so no
conversion is recorded. Every random choice of clip ``i`` comes from ``seed`` and ``i`` only,
so a corpus is reproducible and a rerun skips what is already written.

``bad_fraction`` adds deliberately broken clips (label in ``provenance.defect``) so every
rejection path of the data engine can be exercised on real files.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from solarwm.camera import trajectory as T
from solarwm.data.executor import map_tasks
from solarwm.data.sources.render import RENDERER_VERSION, Scene, depth_views, render_views
from solarwm.data.sources.synthetic_world import describe_scene, make_scene
from solarwm.util.parsing import parse_size

OWNER = "synthetic"
DEFECTS = ("static_camera", "near_black", "count_mismatch", "nan_pose", "fov_out_of_range", "scene_cut")

#: Pan and tilt speed ranges (deg/s) of the tripod motions: ``slow_pan`` keeps most of the first frame
#: in view over a 2 s clip (6-20 deg of a 30-70 deg field of view), so its frames are mostly the first
#: frame re-projected and a small network can learn to follow the camera exactly.
PAN_SPEEDS = {"pan": ((12.0, 35.0), 8.0), "slow_pan": ((3.0, 10.0), 3.0)}
MOTIONS = ("mixed", *PAN_SPEEDS)

#: The ``mixed`` (default) family, 6-DoF: segment kind -> relative weight. Every kind is a move a player makes
#: (W/S, A/D, Q/E, arrows): walks, strafes, climbs, turns, tilts, orbits, walking turns. No zoom: the interactive
#: controls (a twist) have none, and a tiny model that must tell zoom from a forward walk at 32x32 spends its
#: capacity on a move nobody commands. No pauses: a clip that does not move teaches nothing about the camera.
WALK_KINDS = {"forward": 3.0, "backward": 1.5, "strafe": 2.0, "climb": 1.0, "turn": 2.0, "tilt": 1.0,
              "orbit": 1.5, "forward_turn": 2.0}
#: Translation speeds (m/s) of the ``mixed`` family: 1-4 m over a 17-frame 8 fps clip, which at a 45-90 deg
#: field of view moves the near scene by several pixels a frame even at 32x32.
WALK_SPEEDS = {"forward": (0.5, 2.0), "backward": (0.5, 1.5), "strafe": (0.5, 1.5), "climb": (0.3, 0.8)}
#: Yaw speed (deg/s) of a ``mixed`` turn: 10-60 deg over a 2 s clip.
TURN_SPEEDS = (5.0, 30.0)


def _pan_segment(
    rng: np.random.Generator, n: int, sec: float, pitch: float, motion: str = "pan"
) -> tuple[T.Segment, float]:
    """One rotation-only segment: a pan at ``PAN_SPEEDS[motion]``, sometimes with a tilt keeping pitch in [-25, 5]."""
    (low, high), tilt = PAN_SPEEDS[motion]
    yaw = float(rng.choice([-1.0, 1.0])) * rng.uniform(low, high) * sec
    target = float(np.clip(pitch + rng.uniform(-tilt, tilt) * sec, -25.0, 5.0)) if rng.random() < 0.5 else pitch
    return T.Segment(n, yaw=yaw, pitch=target - pitch), target


@dataclass(frozen=True)
class StartPose:
    """Where a trajectory starts: camera height (m), heading and pitch (degrees), horizontal field of view."""

    z: float
    yaw: float
    pitch: float
    fov_x: float

    @classmethod
    def sample(cls, rng: np.random.Generator) -> "StartPose":
        """A random start (the draws and their order are those of ``sample_trajectory``)."""
        pitch = float(rng.uniform(-15.0, 0.0))
        z = float(rng.uniform(0.8, 2.5))
        fov_x = float(rng.uniform(45.0, 90.0))
        return cls(z=z, yaw=float(rng.uniform(0.0, 360.0)), pitch=pitch, fov_x=fov_x)


def sample_trajectory(
    rng: np.random.Generator, frames: int, width: int, height: int, fps: float, motion: str = "mixed",
    start: StartPose | None = None,
) -> T.Trajectory:
    """A random composition of 1-3 camera segments with ``frames`` poses (world z up, metric).

    ``motion`` picks the segment family: ``mixed`` (6-DoF: ``WALK_KINDS`` at ``WALK_SPEEDS`` / ``TURN_SPEEDS``)
    or ``pan`` / ``slow_pan`` (a camera turning on a tripod: pans and tilts only, so every pixel's
    motion follows from the camera and the first frame; the embedded default's worlds, where a tiny
    model can learn camera control on a CPU). ``start``: a given first pose (default: drawn from ``rng``).
    """
    if motion not in MOTIONS:
        raise ValueError(f"motion must be one of {MOTIONS}, got {motion!r}")
    steps_total = frames - 1
    n_seg = int(min(rng.integers(1, 4), max(steps_total, 1)))
    cuts = np.sort(rng.choice(np.arange(1, steps_total), size=n_seg - 1, replace=False)) if n_seg > 1 else []
    lengths = np.diff(np.concatenate([[0], cuts, [steps_total]])).astype(int)
    start = start if start is not None else StartPose.sample(rng)
    pitch, z = start.pitch, start.z
    segments = []
    kinds = tuple(WALK_KINDS)
    weights = np.array([WALK_KINDS[k] for k in kinds])
    for n in lengths:
        sec = n / fps
        if motion in PAN_SPEEDS:
            segment, pitch = _pan_segment(rng, int(n), sec, pitch, motion)
            segments.append(segment)
            continue
        kind = kinds[int(rng.choice(len(kinds), p=weights / weights.sum()))]
        sign = float(rng.choice([-1.0, 1.0]))
        if kind in ("forward", "backward", "strafe", "climb"):
            distance = rng.uniform(*WALK_SPEEDS[kind]) * sec
            if kind == "forward":
                segments.append(T.forward(n, distance))
            elif kind == "backward":
                segments.append(T.backward(n, distance))
            elif kind == "strafe":
                segments.append(T.lateral(n, sign * distance))
            else:  # a climb or a descent, keeping the camera 0.6-3 m above the ground
                step = float(np.clip(z + sign * distance, 0.6, 3.0)) - z
                segments.append(T.vertical(n, step))
                z += step
        elif kind == "turn":
            segments.append(T.yaw_turn(n, sign * rng.uniform(*TURN_SPEEDS) * sec))
        elif kind == "tilt":
            target = float(np.clip(pitch + sign * rng.uniform(5.0, 20.0) * sec, -30.0, 10.0))
            segments.append(T.pitch_turn(n, target - pitch))
            pitch = target
        elif kind == "orbit":
            segments.append(T.orbit(n, sign * rng.uniform(10.0, 30.0) * sec, radius=rng.uniform(2.5, 6.0)))
        else:  # walking while turning
            segments.append(T.Segment(n, forward=rng.uniform(0.5, 1.5) * sec, yaw=sign * rng.uniform(5.0, 25.0) * sec))
    traj = T.compose_segments(
        segments, fps=fps, width=width, height=height, fov_x_deg=start.fov_x,
        start=(0.0, 0.0, start.z), start_yaw=start.yaw, start_pitch=start.pitch,
    )
    if steps_total / fps > LEVEL_AFTER_S:
        traj = _keep_above_ground(traj)
    return traj


#: Clips longer than this (seconds) keep the camera between ``CAMERA_Z`` metres: a walk follows the camera's
#: pitched axis, so a minute of walking while looking down would go through the ground (a short clip's few
#: metres stay as they always were).
LEVEL_AFTER_S = 20.0
CAMERA_Z = (0.5, 3.0)


def _keep_above_ground(traj: T.Trajectory) -> T.Trajectory:
    """``traj`` with its camera heights clamped into ``CAMERA_Z`` (the walker goes on level, looking as before)."""
    c2w = traj.c2w.copy()
    c2w[:, 2, 3] = np.clip(c2w[:, 2, 3], *CAMERA_Z)
    return T.Trajectory(c2w, traj.K, traj.fps, traj.width, traj.height)


def render_clip(scene: Scene, traj: T.Trajectory) -> np.ndarray:
    """Render every frame of ``traj`` in ``scene`` → uint8 ``[N, H, W, 3]`` (pixel centres at j + 0.5)."""
    return render_views(scene, traj.c2w, traj.K, traj.width, traj.height)


@dataclass(frozen=True)
class SynthSpec:
    """What one corpus run renders; clip ``i`` depends only on this and ``i``."""

    frames: int = 33
    width: int = 64
    height: int = 64
    fps: float = 16.0
    seed: int = 0
    motion: str = "mixed"
    #: Camera paths per world: clips ``g*views .. g*views+views-1`` share world ``g`` and their first pose
    #: (a multi-camera capture, as in MultiCamVideo), so only the camera tells their videos apart.
    views: int = 1


def _id_prefix(motion: str, views: int) -> str:
    """What a non-default motion or views prefixes to the ids of a corpus."""
    return ("" if motion == "mixed" else f"{motion}-") + ("" if views == 1 else f"v{views}-")


def original_id(seed: int, index: int, motion: str = "mixed", views: int = 1) -> str:
    """The source-side id of clip ``index`` of world seed ``seed`` (a non-default motion or views prefixes it)."""
    return f"{_id_prefix(motion, views)}world-{seed}-{index:06d}"


def scene_id(seed: int, group: int, motion: str, views: int) -> str:
    """The id of world ``group`` of a multi-view corpus, shared by its ``views`` clips (``provenance.scene``)."""
    return f"{_id_prefix(motion, views)}scene-{seed}-{group:06d}"


def _clip_trajectory(
    spec: SynthSpec, index: int, frames: int,
) -> tuple[np.random.Generator, T.Trajectory, np.random.Generator, np.ndarray]:
    """Clip ``index``'s RNG (for what follows), its trajectory, and its world's RNG and c2w ``[M, 4, 4]``.

    With ``spec.views > 1`` the world is its group's: built from the group's RNG around every path of the group.
    """
    rng = np.random.default_rng([spec.seed, index])
    if spec.views == 1:
        traj = sample_trajectory(rng, frames, spec.width, spec.height, spec.fps, spec.motion)
        return rng, traj, rng, traj.c2w
    group = index // spec.views
    start = StartPose.sample(np.random.default_rng([spec.seed, group, 0x57A7]))
    paths = []
    for member in range(group * spec.views, (group + 1) * spec.views):
        if member == index:
            traj = sample_trajectory(rng, frames, spec.width, spec.height, spec.fps, spec.motion, start)
            paths.append(traj.c2w)
        else:
            other = np.random.default_rng([spec.seed, member])
            paths.append(
                sample_trajectory(other, spec.frames, spec.width, spec.height, spec.fps, spec.motion, start).c2w
            )
    return rng, traj, np.random.default_rng([spec.seed, group, 0x3D]), np.concatenate(paths)


def assign_defects(clips: int, bad_fraction: float, seed: int) -> dict[int, str]:
    """Clip index → defect label for ``round(clips * bad_fraction)`` clips, deterministic in ``seed``.

    Kinds are dealt round-robin in a seeded order, so every kind appears once there are
    at least ``len(DEFECTS)`` broken clips.
    """
    if not 0.0 <= bad_fraction <= 1.0:
        raise ValueError(f"bad_fraction must be in [0, 1], got {bad_fraction}")
    rng = np.random.default_rng([seed, 0xBAD])
    n_bad = int(round(clips * bad_fraction))
    chosen = sorted(int(i) for i in rng.permutation(clips)[:n_bad])
    order = rng.permutation(len(DEFECTS))
    return {i: DEFECTS[order[j % len(DEFECTS)]] for j, i in enumerate(chosen)}


def build_clip(
    spec: SynthSpec, index: int, defect: str | None = None, with_depth: bool = False
) -> tuple[Any, dict[str, Any]]:
    """Render clip ``index`` (optionally with a deliberate ``defect``) → (Clip, extras).

    Extras: ``render_s`` (seconds) and, with ``with_depth``, ``depth`` float32 ``[F, H, W]``: the true
    z-depth of every pixel in metres (inf where the ray meets the sky).
    """
    from solarwm.data.contract import Clip, clip_id

    extra = 1 if defect == "count_mismatch" else 0
    rng, traj, world_rng, world_path = _clip_trajectory(spec, index, spec.frames + extra)
    if defect == "static_camera":
        traj = T.Trajectory(
            np.repeat(traj.c2w[:1], len(traj), 0),
            np.repeat(traj.K[:1], len(traj), 0),
            traj.fps,
            traj.width,
            traj.height,
        )
    if defect == "fov_out_of_range":
        fov = 150.0 if rng.random() < 0.5 else 12.0
        f = spec.width / (2.0 * math.tan(math.radians(fov) / 2.0))
        K = traj.K.copy()
        K[:, 0] = K[:, 1] = f
        traj = T.Trajectory(traj.c2w, K, traj.fps, traj.width, traj.height)
    scene = make_scene(world_rng, world_path)

    t0 = time.perf_counter()
    render_traj = traj.slice(0, spec.frames)
    frames = render_clip(scene, render_traj)
    caption = describe_scene(scene)
    depth = depth_views(scene, render_traj.c2w, render_traj.K, spec.width, spec.height) if with_depth else None
    if defect == "scene_cut":
        other = make_scene(np.random.default_rng([spec.seed, index, 1]), traj.c2w)
        half = spec.frames // 2
        frames[half:] = render_clip(other, render_traj.slice(half, spec.frames))
        if depth is not None:
            second = render_traj.slice(half, spec.frames)
            depth[half:] = depth_views(other, second.c2w, second.K, spec.width, spec.height)
    if defect == "near_black":
        frames = (frames.astype(np.float32) * 0.03).round().astype(np.uint8)
    render_s = time.perf_counter() - t0

    c2w, K = traj.c2w.copy(), traj.K.copy()
    if defect == "nan_pose":
        c2w[int(rng.integers(len(c2w))), int(rng.integers(3)), 3] = np.nan
    provenance: dict[str, Any] = {
        "owner": OWNER,
        "original_id": original_id(spec.seed, index, spec.motion, spec.views),
        "frame_interval": [0, spec.frames],
        "conversions": [],  # rendered directly in OpenCV axes, metric, pixel K
        "versions": {OWNER: RENDERER_VERSION},
    }
    if spec.views > 1:
        # The views of one world are one scene: a held-out split takes them together (datamodules.world).
        provenance["scene"] = scene_id(spec.seed, index // spec.views, spec.motion, spec.views)
    if defect is not None:
        provenance["defect"] = defect
    clip = Clip(
        clip_id=clip_id(OWNER, provenance["original_id"], 0, spec.frames),
        frames=frames,
        c2w=c2w,
        K=K,
        caption=caption,
        meta={"fps": float(spec.fps), "width": spec.width, "height": spec.height, "num_frames": spec.frames},
        provenance=provenance,
    )
    extras: dict[str, Any] = {"render_s": render_s}
    if depth is not None:
        extras["depth"] = depth
    return clip, extras


def _is_done(folder: Path, spec: SynthSpec, defect: str | None) -> bool:
    """True when ``folder`` already holds this exact clip (same renderer, size, length, defect)."""
    from solarwm.data.contract import FILES, ClipError, read_meta, validate_clip

    if not all((folder / name).is_file() for name in FILES):
        return False
    try:
        doc = read_meta(folder)
    except ClipError:
        return False
    prov, meta = doc.get("provenance", {}), doc.get("meta", {})
    same = (
        prov.get("versions", {}).get(OWNER) == RENDERER_VERSION
        and prov.get("defect") == defect
        and prov.get("frame_interval") == [0, spec.frames]
        and meta.get("width") == spec.width
        and meta.get("height") == spec.height
        and meta.get("fps") is not None
        and abs(float(meta["fps"]) - spec.fps) < 1e-6
    )
    # Broken clips fail validation by design; their files and labels are what we check.
    return same and (defect is not None or not validate_clip(folder))


def _synth_one(args: tuple[SynthSpec, int, str | None, str, bool]) -> dict[str, Any]:
    """Render and write one clip unless it is already there; returns a per-clip record."""
    from solarwm.data.contract import clip_id, write_clip

    spec, index, defect, out, with_depth = args
    folder = Path(out) / clip_id(OWNER, original_id(spec.seed, index, spec.motion, spec.views), 0, spec.frames)
    if _is_done(folder, spec, defect) and (not with_depth or (folder / "depth.npy").is_file()):
        return {"index": index, "status": "skipped", "defect": defect}
    clip, timing = build_clip(spec, index, defect, with_depth)
    t0 = time.perf_counter()
    write_clip(clip, out, validate=defect is None)
    if with_depth:  # a sidecar: the true depth the oracle depth model answers with (estimators.depth)
        np.save(folder / "depth.npy", timing["depth"])
    return {
        "index": index,
        "status": "written",
        "defect": defect,
        "render_s": timing["render_s"],
        "write_s": time.perf_counter() - t0,
    }


def synth_corpus(
    out: str | Path,
    clips: int = 16,
    frames: int = 33,
    width: int = 64,
    height: int = 64,
    fps: float = 16.0,
    seed: int = 0,
    bad_fraction: float = 0.0,
    workers: int = 1,
    executor: str = "process",
    ray_address: str | None = None,
    motion: str = "mixed",
    views: int = 1,
    depth: bool = False,
) -> dict[str, Any]:
    """Render ``clips`` canonical clips of owner ``synthetic`` into ``out`` on ``executor``; returns a summary dict."""
    if clips < 0 or frames < 2:
        raise ValueError(f"need clips >= 0 and frames >= 2, got clips={clips}, frames={frames}")
    if width % 2 or height % 2 or width < 2 or height < 2:
        raise ValueError(f"H.264 yuv420p needs even width and height, got {width}x{height}")
    if motion not in MOTIONS:
        raise ValueError(f"motion must be one of {MOTIONS}, got {motion!r}")
    if views < 1:
        raise ValueError(f"views must be >= 1, got {views}")
    if not (math.isfinite(fps) and fps > 0):  # checked before the output folder exists or anything renders
        raise ValueError(f"fps must be a finite number > 0, got {fps}")
    spec = SynthSpec(frames=frames, width=width, height=height, fps=float(fps), seed=seed, motion=motion, views=views)
    defects = assign_defects(clips, bad_fraction, seed)
    created = not Path(out).exists()
    Path(out).mkdir(parents=True, exist_ok=True)
    jobs = [(spec, i, defects.get(i), str(out), depth) for i in range(clips)]
    t0 = time.perf_counter()
    records = []
    try:
        for _, outcome in map_tasks(_synth_one, jobs, executor, workers, ray_address=ray_address):
            if isinstance(outcome, BaseException):  # rendering is deterministic code: a failure is a bug
                raise outcome
            records.append(outcome)
    except BaseException:
        if created and not any(Path(out).iterdir()):  # a run that wrote nothing leaves no folder
            Path(out).rmdir()
        raise
    wall = time.perf_counter() - t0
    written = [r for r in records if r["status"] == "written"]
    defect_counts: dict[str, int] = {}
    for label in defects.values():
        defect_counts[label] = defect_counts.get(label, 0) + 1
    return {
        "out": str(out),
        "owner": OWNER,
        "renderer": RENDERER_VERSION,
        "seed": seed,
        "motion": motion,
        "views": views,
        "clips": clips,
        "frames": frames,
        "width": width,
        "height": height,
        "fps": float(fps),
        "written": len(written),
        "skipped": len(records) - len(written),
        "defects": defect_counts,
        "wall_s": round(wall, 3),
        "render_s": round(sum(r["render_s"] for r in written), 3),
        "write_s": round(sum(r["write_s"] for r in written), 3),
    }


def synth_command(
    out: str,
    clips: int = 16,
    frames: int = 33,
    size: str = "64x64",
    fps: float = 16.0,
    seed: int = 0,
    bad_fraction: float = 0.0,
    workers: int = 1,
    executor: str = "process",
    ray_address: str | None = None,
    motion: str = "mixed",
    views: int = 1,
    depth: bool = False,
) -> int:
    """Render procedurally generated worlds with exact metric cameras as canonical clips.

    Args:
        out: corpus folder; one sub-folder per clip (owner ``synthetic``).
        clips: number of clips.
        frames: frames per clip.
        size: WIDTHxHEIGHT in pixels (even numbers).
        fps: frame rate written to the videos.
        seed: world seed; the same seed gives the same clips.
        bad_fraction: fraction of deliberately broken clips (label in ``provenance.defect``).
        workers: parallel worker processes (Ray: CPUs of the local Ray).
        executor: where the per-clip tasks run: process (local pool) or ray.
        ray_address: Ray cluster to join (e.g. auto, ray://head:10001); default: a local Ray of `workers` CPUs.
        motion: camera motion family: mixed (6-DoF walks, strafes, climbs, turns, tilts, orbits), pan (pans and tilts
            only, 12-35 deg/s) or slow_pan (3-10 deg/s).
        views: camera paths per world; the clips of one world share their first frame (multi-camera capture).
        depth: also write each clip's true per-frame depth (depth.npy, float32 [F,H,W] metres; inf = sky), the
            input of the oracle depth model (ingest --depth_model oracle:DIR).
    """
    width, height = parse_size(size)
    summary = synth_corpus(
        out, clips, frames, width, height, fps, seed, bad_fraction, workers, executor, ray_address, motion, views, depth
    )
    print(json.dumps(summary, sort_keys=True))
    return 0
