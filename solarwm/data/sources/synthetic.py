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

import copy
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from solarwm.camera import trajectory as T
from solarwm.data.executor import map_tasks
from solarwm.data.sources.render import RENDERER_VERSION, Material, Scene, depth_views, render_views
from solarwm.util.parsing import parse_size

OWNER = "synthetic"
DEFECTS = ("static_camera", "near_black", "count_mismatch", "nan_pose", "fov_out_of_range", "scene_cut")

# Named colours so captions can say what the pixels show.
GROUND_COLOURS = {
    "grey": (0.55, 0.55, 0.55), "sand": (0.80, 0.70, 0.50), "grass green": (0.30, 0.55, 0.25),
    "earth brown": (0.50, 0.38, 0.25), "slate": (0.35, 0.40, 0.45), "cream": (0.90, 0.87, 0.78),
    "dark grey": (0.25, 0.25, 0.27), "terracotta": (0.72, 0.40, 0.28),
}
OBJECT_COLOURS = {
    "red": (0.80, 0.15, 0.12), "orange": (0.95, 0.55, 0.10), "yellow": (0.92, 0.85, 0.20),
    "green": (0.20, 0.65, 0.25), "teal": (0.10, 0.60, 0.60), "blue": (0.15, 0.30, 0.85),
    "purple": (0.50, 0.25, 0.70), "pink": (0.95, 0.55, 0.70), "white": (0.92, 0.92, 0.90),
    "black": (0.08, 0.08, 0.09), "brown": (0.45, 0.30, 0.18), "grey": (0.55, 0.55, 0.55),
}
WALL_COLOURS = {
    "brick red": (0.65, 0.28, 0.20), "beige": (0.82, 0.75, 0.60), "concrete grey": (0.60, 0.60, 0.58),
    "white": (0.90, 0.90, 0.88), "ochre": (0.80, 0.60, 0.25), "blue-grey": (0.45, 0.52, 0.62),
}
# (name, zenith, horizon, sun disk, ambient, sun strength)
SKIES = (
    ("a clear blue sky", (0.20, 0.42, 0.85), (0.72, 0.84, 0.95), True, 0.35, 1.0),
    ("a pale hazy sky", (0.55, 0.65, 0.80), (0.85, 0.87, 0.88), True, 0.45, 0.8),
    ("an orange dusk sky", (0.30, 0.30, 0.55), (0.95, 0.60, 0.35), True, 0.30, 0.9),
    ("an overcast grey sky", (0.55, 0.57, 0.60), (0.75, 0.76, 0.78), False, 0.70, 0.35),
)
PATTERN_WORDS = {
    "checker": "checkerboard", "stripes": "striped", "bricks": "brick-patterned",
    "noise": "mottled", "solid": "plain",
}


def _pick(rng: np.random.Generator, table: dict) -> tuple[str, tuple[float, float, float]]:
    name = list(table)[int(rng.integers(len(table)))]
    jitter = rng.uniform(-0.04, 0.04, 3)
    return name, tuple(float(c) for c in np.clip(np.asarray(table[name]) + jitter, 0.0, 1.0))


def _material(rng: np.random.Generator, kinds: tuple[str, ...], table: dict, scale: tuple[float, float]) -> Material:
    kind = kinds[int(rng.integers(len(kinds)))]
    name_a, a = _pick(rng, table)
    name_b, b = _pick(rng, OBJECT_COLOURS if kind == "stripes" else table)
    if name_b == name_a:  # keep the pattern visible
        b = tuple(float(c) for c in np.clip(np.asarray(a) * 0.55, 0, 1))
        name_b = f"dark {name_a}"
    if kind == "bricks":
        b = (0.80, 0.78, 0.72)  # mortar
        name_b = "mortar"
    return Material(kind=kind, color_a=a, color_b=b, scale=float(rng.uniform(*scale)),
                    name_a=name_a, name_b=name_b, angle=float(rng.choice([0.0, math.pi / 2, math.pi / 4])),
                    seed=int(rng.integers(1 << 30)))


def _box_distance(points: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Euclidean distance from points [M, 3] to one axis-aligned box."""
    return np.linalg.norm(np.maximum(np.maximum(lo - points, 0.0), points - hi), axis=-1)


def make_scene(rng: np.random.Generator, c2w: np.ndarray | None = None, clearance: float = 0.8) -> Scene:
    """A random textured world. Boxes stay ``clearance`` metres from every camera in c2w [N, 4, 4].

    Without ``c2w`` the world is built around a camera at (0, 0, 1.5) looking along +x.
    About half the objects are placed in front of random frames of the path, so the camera
    looks at content; walls stand beyond the path's bounding box.
    """
    if c2w is None:
        c2w = T.heading_c2w((0.0, 0.0, 1.5), 0.0, 0.0)[None]
    pos = np.asarray(c2w, dtype=np.float64)[:, :3, 3]
    fwd = np.asarray(c2w, dtype=np.float64)[:, :3, 2]

    ground = _material(rng, ("checker", "noise", "bricks", "checker", "noise"), GROUND_COLOURS, (0.6, 2.0))
    sky_name, zenith, horizon, sun_disk, ambient, sun_strength = SKIES[int(rng.integers(len(SKIES)))]
    sun_elev = math.radians(rng.uniform(15, 65))
    sun_az = rng.uniform(0, 2 * math.pi)
    sun_dir = (math.cos(sun_elev) * math.cos(sun_az), math.cos(sun_elev) * math.sin(sun_az), math.sin(sun_elev))
    warm = rng.uniform(0.0, 0.15)
    sun_color = tuple(float(sun_strength * c) for c in (1.0, 1.0 - 0.5 * warm, 1.0 - warm))

    lo_list: list[np.ndarray] = []
    hi_list: list[np.ndarray] = []
    mats: list[Material] = []
    kinds: list[str] = []

    # Walls: thin, tall boxes on some sides of the path's bounding box.
    margin = rng.uniform(4.0, 9.0)
    bb_lo, bb_hi = pos[:, :2].min(0) - margin, pos[:, :2].max(0) + margin
    wall_mat = _material(rng, ("bricks", "stripes", "noise", "checker"), WALL_COLOURS, (0.8, 2.0))
    n_walls = int(rng.integers(0, 5))
    height = rng.uniform(2.0, 5.0)
    for side in rng.permutation(4)[:n_walls]:
        lo, hi = np.array([bb_lo[0], bb_lo[1], 0.0]), np.array([bb_hi[0], bb_hi[1], height])
        axis, at_max = int(side % 2), bool(side // 2)
        if at_max:
            lo[axis] = bb_hi[axis]
            hi[axis] = bb_hi[axis] + 0.5
        else:
            hi[axis] = bb_lo[axis]
            lo[axis] = bb_lo[axis] - 0.5
        lo_list.append(lo)
        hi_list.append(hi)
        mats.append(wall_mat)
        kinds.append("wall")

    # Objects: crates (cube-ish) and pillars (tall, thin).
    n_crates, n_pillars = int(rng.integers(2, 9)), int(rng.integers(0, 5))
    obj_kinds = ("checker", "stripes", "noise", "solid", "bricks", "checker", "stripes")
    n_placed = {"crate": 0, "pillar": 0}
    for kind in ["crate"] * n_crates + ["pillar"] * n_pillars:
        for _ in range(20):  # rejection sampling for free space
            if rng.random() < 0.6:
                k = int(rng.integers(len(pos)))
                heading = fwd[k, :2] / max(np.linalg.norm(fwd[k, :2]), 1e-6)
                side = np.array([-heading[1], heading[0]])
                dist = rng.uniform(2.0, 8.0)
                centre = pos[k, :2] + heading * dist + side * rng.uniform(-0.6, 0.6) * dist
            else:
                centre = rng.uniform(bb_lo + 1.0, bb_hi - 1.0)
            if kind == "crate":
                half = rng.uniform(0.25, 0.8, 2)
                h = rng.uniform(0.4, 1.6)
            else:
                half = np.full(2, rng.uniform(0.15, 0.45))
                h = rng.uniform(2.0, 6.0)
            lo = np.array([centre[0] - half[0], centre[1] - half[1], 0.0])
            hi = np.array([centre[0] + half[0], centre[1] + half[1], h])
            if _box_distance(pos, lo, hi).min() > clearance:
                lo_list.append(lo)
                hi_list.append(hi)
                mats.append(_material(rng, obj_kinds, OBJECT_COLOURS, (0.2, 0.6)))
                kinds.append(kind)
                n_placed[kind] += 1
                break

    # Scenery along a long path, past where a short clip's camera ever goes (short clips' worlds stay as they were).
    along = _along_path(copy.deepcopy(rng), pos, fwd, clearance)  # a copy: the caller's draws stay the same
    for lo, hi, mat, kind in along:
        lo_list.append(lo)
        hi_list.append(hi)
        mats.append(mat)
        kinds.append(kind)
        n_placed[kind] += 1

    scene = Scene(
        ground=ground,
        box_lo=np.asarray(lo_list, np.float32).reshape(-1, 3),
        box_hi=np.asarray(hi_list, np.float32).reshape(-1, 3),
        box_material=mats,
        box_kind=kinds,
        sky_zenith=zenith,
        sky_horizon=horizon,
        sun_dir=sun_dir,
        sun_color=sun_color,
        ambient=ambient,
        fog_density=float(rng.uniform(0.005, 0.05)),
        sun_disk=sun_disk,
        shadows=sun_disk,  # overcast light casts no hard shadows
        meta={"sky": sky_name, "sun_elevation_deg": math.degrees(sun_elev), "walls": n_walls,
              "wall_height": height, **{f"{k}s": v for k, v in n_placed.items()}},
    )
    return scene


#: Along-path scenery stands only where the camera is farther than this from its start (metres, horizontally):
#: beyond every short clip's reach (a 10 s walk at the fastest 2 m/s is 20 m), so short clips' worlds are unchanged.
ALONG_PATH_AFTER_M = 24.0
#: One object of along-path scenery every this many metres of travel (on alternate sides of the path).
ALONG_PATH_SPACING_M = 3.0
#: A step longer than this (metres) is the seam between two concatenated paths (the views of one world), not travel.
_SEAM_M = 5.0


def _along_path(
    rng: np.random.Generator, pos: np.ndarray, fwd: np.ndarray, clearance: float
) -> list[tuple[np.ndarray, np.ndarray, Material, str]]:
    """A crate or pillar every ``ALONG_PATH_SPACING_M`` of travel where the path is past ``ALONG_PATH_AFTER_M``.

    Each stands ahead of the camera where it passes its mark, 1.5-6 m to alternate sides of its heading, so a walk
    of minutes or hours keeps passing content. Objects keep ``clearance`` from every camera position near them.
    """
    steps = np.linalg.norm(np.diff(pos[:, :2], axis=0), axis=1)
    travel = np.concatenate([[0.0], np.cumsum(np.where(steps > _SEAM_M, 0.0, steps))])
    far = np.linalg.norm(pos[:, :2] - pos[:1, :2], axis=1) > ALONG_PATH_AFTER_M
    if not far.any():
        return []
    out, last = [], -np.inf
    obj_kinds = ("checker", "stripes", "noise", "solid", "bricks", "checker", "stripes")
    for k in np.flatnonzero(far):
        if travel[k] - last < ALONG_PATH_SPACING_M:
            continue
        last = travel[k]
        heading = fwd[k, :2] / max(np.linalg.norm(fwd[k, :2]), 1e-6)
        side = np.array([-heading[1], heading[0]])
        near = pos[np.linalg.norm(pos[:, :2] - pos[k, :2], axis=1) < 20.0]
        sign = 1.0 if len(out) % 2 else -1.0
        kind = "pillar" if rng.random() < 0.3 else "crate"
        centre = pos[k, :2] + heading * rng.uniform(2.0, 8.0) + sign * side * rng.uniform(1.5, 6.0)
        half = np.full(2, rng.uniform(0.15, 0.45)) if kind == "pillar" else rng.uniform(0.25, 0.8, 2)
        h = rng.uniform(2.0, 6.0) if kind == "pillar" else rng.uniform(0.4, 1.6)
        lo = np.array([centre[0] - half[0], centre[1] - half[1], 0.0])
        hi = np.array([centre[0] + half[0], centre[1] + half[1], h])
        material = _material(rng, obj_kinds, OBJECT_COLOURS, (0.2, 0.6))
        if _box_distance(near, lo, hi).min() > clearance:
            out.append((lo, hi, material, kind))
    return out


def _count_words(n: int, word: str) -> str:
    names = ("no", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten")
    return f"{names[n] if n < len(names) else n} {word}{'' if n == 1 else 's'}"


def _join(words: list[str]) -> str:
    words = list(dict.fromkeys(words))  # unique, ordered
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def describe_scene(scene: Scene) -> str:
    """A caption of the world's persistent content, generated from its parameters (20-60 words)."""
    g = scene.ground
    parts = [f"A rendered outdoor scene with {PATTERN_WORDS[g.kind]} {g.name_a} ground."]
    walls = [m for m, k in zip(scene.box_material, scene.box_kind) if k == "wall"]
    if walls:
        w = walls[0]
        word = {1: "One side is", 2: "Two sides are", 3: "Three sides are", 4: "It is"}[len(walls)]
        tail = " enclosed by" if len(walls) == 4 else " bounded by"
        parts.append(f"{word}{tail} {PATTERN_WORDS[w.kind]} {w.name_a} walls.")
    objs = [(m, k) for m, k in zip(scene.box_material, scene.box_kind) if k in ("crate", "pillar")]
    if objs:
        counts = [_count_words(sum(k == kind for _, k in objs), kind) for kind in ("crate", "pillar")
                  if any(k == kind for _, k in objs)]
        colours = _join([m.name_a for m, _ in objs][:4])
        patterns = _join([PATTERN_WORDS[m.kind] for m, _ in objs][:3])
        parts.append(f"{_join(counts).capitalize()} stand around, coloured {colours}, with {patterns} textures.")
    else:
        parts.append("The ground is otherwise empty.")
    light = "soft diffuse light" if not scene.sun_disk else (
        "low sunlight casting long shadows" if scene.meta.get("sun_elevation_deg", 45) < 30
        else "bright sunlight casting hard shadows")
    haze = "thick haze" if scene.fog_density > 0.03 else "light haze"
    parts.append(f"Under {scene.meta.get('sky', 'a sky')}, {light}, {haze} in the distance.")
    return " ".join(parts)


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
