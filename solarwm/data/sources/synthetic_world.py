"""The worlds of the embedded data source: textured ground, walls, crates and pillars around a camera path, and
the caption that says what they are.

`solarwm.data.sources.synthetic` films these worlds; this module only builds them. Every draw comes from the
``rng`` a caller passes, so a world is a function of its seed.
"""

from __future__ import annotations

import copy
import math

import numpy as np

from solarwm.camera import trajectory as T
from solarwm.data.sources.render import Material, Scene

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
    along = along_path(copy.deepcopy(rng), pos, fwd, clearance)  # a copy: the caller's draws stay the same
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


def along_path(
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
