"""Vectorised ray caster for procedurally generated worlds.

A `Scene` is a ground plane (z = 0, world z up), a set of axis-aligned boxes
(walls, crates, pillars) and a sky. Every ray of every frame of a clip is cast
at once with numpy (float32): slab intersection against all boxes, nearest hit
against the ground, world-space texturing (so texture sticks to geometry and
camera motion is unambiguous from pixels), a lambertian sun with hard shadows,
and distance fog.

Pixel convention (the same as `solarwm.camera.intrinsics.project`): continuous
pixel coordinates put the centre of pixel column ``j`` / row ``i`` at
``u = j + 0.5``, ``v = i + 0.5``. A camera-space point ``(x, y, z)`` (OpenCV:
x right, y down, z forward) lands at ``u = fx * x / z + cx``,
``v = fy * y / z + cy``. Pixel ``(i, j)`` therefore shows what the ray through
``((j + 0.5 - cx) / fx, (i + 0.5 - cy) / fy, 1)`` hits first.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

RENDERER_VERSION = "solarwm-raycast/1"

TEXTURE_KINDS = ("checker", "stripes", "bricks", "noise", "solid")

# Rays per chunk: bounds the [rays, boxes, 3] slab temporaries to a few MB.
_CHUNK = 16384
_EPS = 1e-4


@dataclass
class Material:
    """A world-space procedural texture: two colours mixed by a pattern."""

    kind: str  # one of TEXTURE_KINDS
    color_a: tuple[float, float, float]  # RGB in [0, 1]
    color_b: tuple[float, float, float]
    scale: float  # pattern period in metres
    name_a: str = ""  # colour names for captions
    name_b: str = ""
    angle: float = 0.0  # stripe direction in the face's uv plane, radians
    seed: int = 0  # value-noise lattice seed


@dataclass
class Scene:
    """A renderable world: ground, axis-aligned boxes, sky, sun and fog."""

    ground: Material
    box_lo: np.ndarray  # [B, 3] float32, min corner
    box_hi: np.ndarray  # [B, 3] float32, max corner
    box_material: list[Material]  # one per box
    box_kind: list[str]  # "wall" | "crate" | "pillar" | "marker", for captions
    sky_zenith: tuple[float, float, float] = (0.25, 0.45, 0.85)
    sky_horizon: tuple[float, float, float] = (0.75, 0.85, 0.95)
    sun_dir: tuple[float, float, float] = (0.4, 0.3, 0.85)  # towards the sun, unit
    sun_color: tuple[float, float, float] = (1.0, 0.95, 0.85)
    ambient: float = 0.35
    fog_density: float = 0.02  # per metre
    sun_disk: bool = True
    shadows: bool = True
    meta: dict = field(default_factory=dict)  # generator parameters (names for captions)

    @property
    def num_boxes(self) -> int:
        """Number of boxes (walls included)."""
        return int(self.box_lo.shape[0])


def camera_rays(
    c2w: np.ndarray, K: np.ndarray, width: int, height: int
) -> tuple[np.ndarray, np.ndarray]:
    """World-space ray origins and unit directions for every pixel centre.

    c2w: [N, 4, 4] OpenCV camera-to-world; K: [N, 4] (fx, fy, cx, cy) in pixels.
    Returns origins [N, H, W, 3] and directions [N, H, W, 3], float32.
    """
    c2w = np.asarray(c2w, dtype=np.float64)
    K = np.asarray(K, dtype=np.float64)
    n = c2w.shape[0]
    u = np.arange(width, dtype=np.float64) + 0.5
    v = np.arange(height, dtype=np.float64) + 0.5
    fx, fy, cx, cy = (K[:, i, None, None] for i in range(4))
    x = (u[None, None, :] - cx) / fx  # [N, 1, W]
    y = (v[None, :, None] - cy) / fy  # [N, H, 1]
    d_cam = np.stack(np.broadcast_arrays(x, y, np.ones((n, height, width))), axis=-1)
    d_world = (d_cam.reshape(n, -1, 3) @ np.swapaxes(c2w[:, :3, :3], 1, 2)).reshape(d_cam.shape)
    d_world /= np.linalg.norm(d_world, axis=-1, keepdims=True)
    origins = np.broadcast_to(c2w[:, None, None, :3, 3], d_world.shape)
    return origins.astype(np.float32), d_world.astype(np.float32)


def _f32(x: np.ndarray) -> np.ndarray:
    """A float64 result rounded to float32.

    Why: numpy's float32 kernels for exp, power and BLAS dot products differ in the last bit between CPUs (AVX2,
    AVX-512), and one ulp flips a rounded pixel, which was enough to change a COLMAP outcome on a rendered clip.
    Computed in float64, the values round to the same float32 on every CPU but for about 1e-9 of them.
    """
    return np.asarray(x).astype(np.float32)


def _safe_inverse(d: np.ndarray) -> np.ndarray:
    """1/d with zero components replaced by a huge finite value of the right sign."""
    tiny = np.where(d >= 0, 1e-12, -1e-12).astype(d.dtype)
    return 1.0 / np.where(np.abs(d) < 1e-12, tiny, d)


def _intersect_boxes(
    o: np.ndarray, inv_d: np.ndarray, lo: np.ndarray, hi: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Nearest entry distance and box index per ray (inf / -1 for a miss). o, inv_d: [R, 3]."""
    if lo.shape[0] == 0:
        return np.full(o.shape[0], np.inf, np.float32), np.full(o.shape[0], -1, np.int64)
    # Per-axis [R, B] slabs: numpy reductions over a trailing axis of 3 are slow.
    t_near = t_far = None
    for a in range(3):
        t1 = (lo[None, :, a] - o[:, a, None]) * inv_d[:, a, None]
        t2 = (hi[None, :, a] - o[:, a, None]) * inv_d[:, a, None]
        near, far = np.minimum(t1, t2), np.maximum(t1, t2)
        t_near = near if t_near is None else np.maximum(t_near, near)
        t_far = far if t_far is None else np.minimum(t_far, far)
    hit = (t_far >= t_near) & (t_near > _EPS)
    t = np.where(hit, t_near, np.inf)
    idx = t.argmin(axis=-1)
    t_min = np.take_along_axis(t, idx[:, None], axis=-1)[:, 0]
    return t_min, np.where(np.isfinite(t_min), idx, -1)


def _hash2(ix: np.ndarray, iy: np.ndarray, seed: int) -> np.ndarray:
    """Deterministic lattice hash in [0, 1) from integer coordinates."""
    h = ix.astype(np.uint32) * np.uint32(374761393) + iy.astype(np.uint32) * np.uint32(668265263)
    h = h + np.uint32((seed * 2654435761) & 0xFFFFFFFF)
    h = (h ^ (h >> np.uint32(13))) * np.uint32(1274126177)
    h = h ^ (h >> np.uint32(16))
    return (h & np.uint32(0xFFFFFF)).astype(np.float32) / np.float32(0x1000000)


def value_noise(u: np.ndarray, v: np.ndarray, seed: int, octaves: int = 2) -> np.ndarray:
    """Fractal value noise in [0, 1] at continuous lattice coordinates (u, v)."""
    total = np.zeros_like(u, dtype=np.float32)
    amp, norm = 1.0, 0.0
    for octave in range(octaves):
        fu, fv = np.floor(u), np.floor(v)
        iu, iv = fu.astype(np.int64), fv.astype(np.int64)
        su, sv = u - fu, v - fv
        su, sv = su * su * (3 - 2 * su), sv * sv * (3 - 2 * sv)  # smoothstep fade
        s = seed + 1013 * octave
        a = _hash2(iu, iv, s) * (1 - su) + _hash2(iu + 1, iv, s) * su
        b = _hash2(iu, iv + 1, s) * (1 - su) + _hash2(iu + 1, iv + 1, s) * su
        total += amp * (a * (1 - sv) + b * sv)
        norm += amp
        amp *= 0.5
        u, v = u * 2.0 + 17.3, v * 2.0 + 5.1
    return total / norm


def _contrast(footprint: np.ndarray | None, period: float) -> np.ndarray | float:
    """Pattern contrast kept at a pixel footprint (metres): 1 when resolved, 0 past Nyquist.

    Fading a pattern to its mean where a pixel covers more than a quarter period is cheap
    analytic anti-aliasing: distant textures stop shimmering, which also keeps the
    encoded video faithful to the render.
    """
    if footprint is None:
        return 1.0
    return np.clip(2.0 - 4.0 * footprint / period, 0.0, 1.0)


def shade_material(
    mat: Material, u: np.ndarray, v: np.ndarray, footprint: np.ndarray | None = None
) -> np.ndarray:
    """Albedo [M, 3] of `mat` at world-space surface coordinates u, v [M] (metres).

    ``footprint`` [M] is the size of a pixel on the surface in metres (None: no filtering).
    """
    s = np.float32(mat.scale)
    if mat.kind == "checker":
        w = ((np.floor(u / s) + np.floor(v / s)) % 2).astype(np.float32)
        mean, period = 0.5, 2 * s
    elif mat.kind == "stripes":
        c, sn = np.cos(mat.angle), np.sin(mat.angle)
        w = (np.floor((u * c + v * sn) / s) % 2).astype(np.float32)
        mean, period = 0.5, 2 * s
    elif mat.kind == "bricks":
        row_h = s * 0.5
        row = np.floor(v / row_h)
        bu = u / s + 0.5 * (row % 2)  # running bond: odd rows shifted half a brick
        fu, fv = bu - np.floor(bu), v / row_h - row
        mortar = 0.06
        w = ((fu < mortar) | (fv < 2 * mortar)).astype(np.float32)
        # Per-brick tint so neighbouring bricks differ.
        w = np.maximum(w, 0.25 * _hash2(np.floor(bu).astype(np.int64), row.astype(np.int64), mat.seed))
        mean, period = 0.3, row_h
    elif mat.kind == "noise":
        w = value_noise(u / s, v / s, mat.seed, octaves=3)
        w = np.clip((w - 0.5) * 2.2 + 0.5, 0.0, 1.0)
        mean, period = 0.5, s
    elif mat.kind == "solid":
        w = np.zeros_like(u, dtype=np.float32)
        mean, period = 0.0, 1.0
    else:
        raise ValueError(f"unknown texture kind {mat.kind!r}; expected one of {TEXTURE_KINDS}")
    w = mean + (w - mean) * _contrast(footprint, period)
    a = np.asarray(mat.color_a, np.float32)
    b = np.asarray(mat.color_b, np.float32)
    albedo = a[None] * (1 - w[:, None]) + b[None] * w[:, None]
    if mat.kind != "solid":
        # Fine grain on every patterned surface gives texture inside flat pattern cells.
        grain = value_noise(u * 3.0, v * 3.0, mat.seed + 7, octaves=1) - 0.5
        albedo = albedo * (1.0 + 0.3 * grain * _contrast(footprint, 1 / 3.0))[:, None]
    return albedo


def _sky(scene: Scene, d: np.ndarray) -> np.ndarray:
    """Sky colour [R, 3] for unit directions d [R, 3]: vertical gradient plus a sun disk."""
    zen = np.asarray(scene.sky_zenith, np.float32)
    hor = np.asarray(scene.sky_horizon, np.float32)
    w = np.sqrt(np.clip(d[:, 2], 0.0, 1.0))[:, None]
    col = hor[None] * (1 - w) + zen[None] * w
    if scene.sun_disk:
        sun = np.asarray(scene.sun_dir, np.float32)
        c = np.clip(d.astype(np.float64) @ sun.astype(np.float64), 0.0, 1.0)
        glow = _f32(c**400 * 1.5 + c**16 * 0.15)
        col = col + glow[:, None] * np.asarray(scene.sun_color, np.float32)[None]
    return col


def _shade_chunk(scene: Scene, o: np.ndarray, d: np.ndarray, pix: np.ndarray | None) -> np.ndarray:
    """Linear RGB [R, 3] for rays o, d [R, 3]; pix [R] is the pixel's angular size (radians)."""
    inv_d = _safe_inverse(d)
    t_box, idx = _intersect_boxes(o, inv_d, scene.box_lo, scene.box_hi)
    with np.errstate(divide="ignore", invalid="ignore"):
        t_ground = np.where((d[:, 2] < 0) & (o[:, 2] > 0), -o[:, 2] / d[:, 2], np.inf)
    t = np.minimum(t_box, t_ground)
    hit_box = t_box < t_ground
    hit = np.isfinite(t)
    color = np.empty_like(d)
    if not hit.all():
        color[~hit] = _sky(scene, d[~hit])
    if not hit.any():
        return color

    p = o + np.where(hit, t, 0.0)[:, None] * d
    normal = np.zeros_like(p)
    normal[:, 2] = 1.0
    albedo = np.zeros_like(p)

    # Pixel size on the surface, stretched at grazing incidence.
    footprint = None
    if pix is not None:
        footprint = np.where(hit, t, 0.0) * pix

    ground = hit & ~hit_box
    if ground.any():
        fp = None if footprint is None else footprint[ground] / np.maximum(np.abs(d[ground, 2]), 0.05)
        albedo[ground] = shade_material(scene.ground, p[ground, 0], p[ground, 1], fp)

    if hit_box.any():
        rows = np.nonzero(hit_box)[0]
        b = idx[rows]
        lo, hi = scene.box_lo[b], scene.box_hi[b]
        t1 = (lo - o[rows]) * inv_d[rows]
        t2 = (hi - o[rows]) * inv_d[rows]
        axis = np.minimum(t1, t2).argmax(axis=-1)  # the slab entered last is the face hit
        n = np.zeros((rows.size, 3), np.float32)
        n[np.arange(rows.size), axis] = -np.sign(d[rows, axis])
        normal[rows] = n
        pb = p[rows]
        # World-space uv on the face plane: drop the normal axis.
        uv_axes = np.array([[1, 2], [0, 2], [0, 1]])[axis]
        u = np.take_along_axis(pb, uv_axes[:, :1], axis=1)[:, 0]
        v = np.take_along_axis(pb, uv_axes[:, 1:], axis=1)[:, 0]
        fp = None
        if footprint is not None:
            cos = np.abs(d[rows, axis])
            fp = footprint[rows] / np.maximum(cos, 0.05)
        for m in np.unique(b):
            sel = b == m
            albedo[rows[sel]] = shade_material(scene.box_material[m], u[sel], v[sel], None if fp is None else fp[sel])

    sun = np.asarray(scene.sun_dir, np.float32)
    lambert = _f32(np.clip(normal.astype(np.float64) @ sun.astype(np.float64), 0.0, None))
    if scene.shadows and scene.num_boxes:
        lit = hit & (lambert > 0)
        if lit.any():
            rows = np.nonzero(lit)[0]
            origin = p[rows] + normal[rows] * 1e-3
            sun_rays = np.broadcast_to(sun, origin.shape)
            t_occ, _ = _intersect_boxes(origin, _safe_inverse(sun_rays), scene.box_lo, scene.box_hi)
            lambert[rows] *= ~np.isfinite(t_occ)
    light = scene.ambient + lambert[:, None] * np.asarray(scene.sun_color, np.float32)[None]
    surf = albedo * light

    fog_col = np.asarray(scene.sky_horizon, np.float32)
    f = _f32(np.exp(-scene.fog_density * np.where(hit, t, 0.0).astype(np.float64)))[:, None]
    surf = surf * f + fog_col[None] * (1 - f)
    color[hit] = surf[hit]
    return color


def render_rays(
    scene: Scene, origins: np.ndarray, dirs: np.ndarray, pixel_angle: np.ndarray | None = None
) -> np.ndarray:
    """Shade rays: origins, dirs [..., 3] → uint8 RGB [..., 3].

    ``pixel_angle`` [...] (radians per pixel, about 1/f) enables texture anti-aliasing.
    """
    shape = dirs.shape[:-1]
    o = np.ascontiguousarray(origins, dtype=np.float32).reshape(-1, 3)
    d = np.ascontiguousarray(dirs, dtype=np.float32).reshape(-1, 3)
    pix = None
    if pixel_angle is not None:
        pix = np.ascontiguousarray(np.broadcast_to(pixel_angle, shape), dtype=np.float32).reshape(-1)
    out = np.empty((d.shape[0], 3), np.float32)
    for s in range(0, d.shape[0], _CHUNK):
        chunk = slice(s, s + _CHUNK)
        out[chunk] = _shade_chunk(scene, o[chunk], d[chunk], None if pix is None else pix[chunk])
    # Display gamma: colours above are "linear-ish"; a mild curve lifts the shadows.
    out = _f32(np.clip(out, 0.0, 1.0).astype(np.float64) ** (1 / 1.4))
    return np.round(out * 255.0).astype(np.uint8).reshape(*shape, 3)


def render_views(
    scene: Scene, c2w: np.ndarray, K: np.ndarray, width: int, height: int
) -> np.ndarray:
    """Render N pinhole views. c2w: [N, 4, 4] OpenCV; K: [N, 4] px → uint8 [N, H, W, 3]."""
    origins, dirs = camera_rays(c2w, K, width, height)
    K = np.asarray(K, dtype=np.float64)
    pixel_angle = 1.0 / np.sqrt(K[:, 0] * K[:, 1])
    return render_rays(scene, origins, dirs, pixel_angle[:, None, None])


def depth_views(scene: Scene, c2w: np.ndarray, K: np.ndarray, width: int, height: int) -> np.ndarray:
    """True depth of N pinhole views: z along each camera's optical axis, metres, float32 ``[N, H, W]``; inf = sky.

    The same rays and intersections as ``render_views`` (pixel centres at ``j + 0.5``), without shading.
    """
    origins, dirs = camera_rays(c2w, K, width, height)
    n = dirs.shape[0]
    o = origins.reshape(-1, 3)
    d = dirs.reshape(-1, 3)
    t = np.empty(d.shape[0], np.float32)
    for s in range(0, d.shape[0], _CHUNK):
        oc, dc = o[s:s + _CHUNK], d[s:s + _CHUNK]
        t_box, _ = _intersect_boxes(oc, _safe_inverse(dc), scene.box_lo, scene.box_hi)
        with np.errstate(divide="ignore", invalid="ignore"):
            t_ground = np.where((dc[:, 2] < 0) & (oc[:, 2] > 0), -oc[:, 2] / dc[:, 2], np.inf)
        t[s:s + _CHUNK] = np.minimum(t_box, t_ground)
    axis = np.asarray(c2w, np.float64)[:, :3, 2]  # optical axis (OpenCV +z) in world coordinates
    cos = (dirs.reshape(n, -1, 3) * axis[:, None, :]).sum(-1)
    return (t.reshape(n, -1) * cos).reshape(n, height, width).astype(np.float32)
