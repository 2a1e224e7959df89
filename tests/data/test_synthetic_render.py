"""The ray caster draws exactly what the stored camera (c2w, K) projects, and worlds are well formed."""

import numpy as np
import pytest

from solarwm.camera.intrinsics import project
from solarwm.camera.trajectory import Trajectory
from solarwm.data.sources.render import Material, Scene, render_views, shade_material
from solarwm.data.sources.synthetic import describe_scene, make_scene, render_clip, sample_trajectory


def _inside_convex_hull(points: np.ndarray, hull: np.ndarray) -> np.ndarray:
    """Boolean [M]: points [M, 2] strictly inside the convex polygon hull [V, 2] (any winding)."""
    import cv2

    hull = cv2.convexHull(hull.astype(np.float32)).reshape(-1, 2).astype(np.float64)
    edges = np.roll(hull, -1, axis=0) - hull
    rel = points[:, None, :] - hull[None]
    cross = edges[None, :, 0] * rel[..., 1] - edges[None, :, 1] * rel[..., 0]
    return (cross > 0).all(axis=1) | (cross < 0).all(axis=1)


def _marker_scene(base: Scene, lo: np.ndarray, hi: np.ndarray) -> Scene:
    marker = Material("solid", (1.0, 0.0, 1.0), (1.0, 0.0, 1.0), 1.0, name_a="magenta")
    return Scene(
        ground=base.ground,
        box_lo=np.concatenate([base.box_lo, lo[None]]).astype(np.float32),
        box_hi=np.concatenate([base.box_hi, hi[None]]).astype(np.float32),
        box_material=base.box_material + [marker], box_kind=base.box_kind + ["marker"],
        sky_zenith=base.sky_zenith, sky_horizon=base.sky_horizon, sun_dir=base.sun_dir,
        sun_color=base.sun_color, ambient=base.ambient, fog_density=base.fog_density,
        sun_disk=base.sun_disk, shadows=False, meta=base.meta,
    )


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_marker_drawn_where_camera_projects_it(seed):
    """A box placed in view occupies exactly the pixels whose centres fall inside its projected hull."""
    rng = np.random.default_rng(seed)
    width, height = 96, 64
    traj = sample_trajectory(rng, 9, width, height, 16.0)
    # Non-square pixels and an off-centre principal point exercise every K entry.
    K = traj.K.copy()
    K[:, 1] *= 1.1
    K[:, 2] += 3.7
    K[:, 3] -= 2.3
    traj = Trajectory(traj.c2w, K, traj.fps, width, height)
    scene = make_scene(rng, traj.c2w)
    scene.shadows = False
    k = 4
    c2w = traj.c2w[k]
    centre = c2w[:3, 3] + 1.5 * c2w[:3, 2] + 0.2 * c2w[:3, 0]
    lo, hi = centre - 0.12, centre + 0.12
    base = render_views(scene, traj.c2w[k : k + 1], K[k : k + 1], width, height)[0]
    marked = render_views(_marker_scene(scene, lo, hi), traj.c2w[k : k + 1], K[k : k + 1], width, height)[0]
    drawn = (base != marked).any(-1)

    corners = np.array([[x, y, z] for x in (lo[0], hi[0]) for y in (lo[1], hi[1]) for z in (lo[2], hi[2])])
    uv, depth = project(corners, c2w, K[k])
    assert (depth > 0).all()
    jj, ii = np.meshgrid(np.arange(width) + 0.5, np.arange(height) + 0.5)
    centres = np.stack([jj.ravel(), ii.ravel()], axis=1)
    expected = _inside_convex_hull(centres, uv).reshape(height, width)

    assert expected.sum() > 20
    # Only pixels whose centre lies within float32 rounding of the silhouette edge may differ.
    assert (drawn != expected).sum() <= 2
    got = np.argwhere(drawn)[:, ::-1].mean(0) + 0.5
    want = np.argwhere(expected)[:, ::-1].mean(0) + 0.5
    assert np.abs(got - want).max() < 0.1


def test_render_is_deterministic_and_shows_motion():
    rng = np.random.default_rng([5, 0])
    traj = sample_trajectory(rng, 9, 48, 32, 16.0)
    scene = make_scene(rng, traj.c2w)
    a, b = render_clip(scene, traj), render_clip(scene, traj)
    assert a.shape == (9, 32, 48, 3) and a.dtype == np.uint8
    assert np.array_equal(a, b)
    moved = np.abs(np.diff(traj.c2w, axis=0)).max(axis=(1, 2)) > 1e-3
    diffs = np.abs(np.diff(a.astype(np.int16), axis=0)).mean(axis=(1, 2, 3))
    assert moved.any()
    # Every step the camera moves changes the image; a walk at 0.5 m/s moves little per frame at 16 fps,
    # so the clip as a whole must show it (first vs last frame), not each step by a fixed amount.
    assert (diffs[moved] > 0.05).all()
    assert np.abs(a[-1].astype(np.int16) - a[0]).mean() > 2.0


def test_cameras_stay_in_free_space_and_look_at_content():
    for i in range(20):
        rng = np.random.default_rng([11, i])
        traj = sample_trajectory(rng, 33, 32, 32, 16.0)
        scene = make_scene(rng, traj.c2w)
        pos = traj.c2w[:, :3, 3]
        assert (pos[:, 2] > 0.3).all(), "camera must stay above the ground"
        for lo, hi in zip(scene.box_lo, scene.box_hi):
            dist = np.linalg.norm(np.maximum(np.maximum(lo - pos, 0), pos - hi), axis=-1)
            assert dist.min() > 0.5, "camera must stay outside every box"
        assert sum(k in ("crate", "pillar") for k in scene.box_kind) >= 1
        # Optical axes look no more than 45 degrees up or down.
        assert (np.abs(traj.c2w[:, 2, 2]) < np.sin(np.radians(45))).all()


def test_caption_describes_scene_parameters():
    for i in range(10):
        scene = make_scene(np.random.default_rng([3, i]))
        caption = describe_scene(scene)
        assert 20 <= len(caption.split()) <= 60, caption
        assert scene.ground.name_a in caption
        assert scene.meta["sky"] in caption


@pytest.mark.parametrize("kind", ["checker", "stripes", "bricks", "noise", "solid"])
def test_textures_are_world_space_and_bounded(kind):
    mat = Material(kind, (0.9, 0.2, 0.1), (0.1, 0.3, 0.9), 0.5, seed=4)
    u = np.linspace(-3, 3, 500, dtype=np.float32)
    v = np.linspace(2, -1, 500, dtype=np.float32)
    col = shade_material(mat, u, v)
    assert col.shape == (500, 3) and np.isfinite(col).all() and col.min() >= 0 and col.max() <= 1.3
    assert np.array_equal(col, shade_material(mat, u, v))
    if kind != "solid":
        assert col.std(axis=0).max() > 0.02, "a patterned surface must vary across space"
    with pytest.raises(ValueError, match="unknown texture kind"):
        shade_material(Material("plaid", (0, 0, 0), (1, 1, 1), 1.0), u, v)


_DIGEST = """
import hashlib, numpy as np
from solarwm.data.sources.synthetic import make_scene, render_clip, sample_trajectory
traj = sample_trajectory(np.random.default_rng([7, 1]), 9, 160, 120, 16.0)
print(hashlib.sha256(render_clip(make_scene(np.random.default_rng(101), traj.c2w), traj).tobytes()).hexdigest())
"""


@pytest.mark.slow
def test_frames_do_not_depend_on_the_cpu_kernels_numpy_picks():
    """The same world renders to the same bytes whichever SIMD kernels numpy and its BLAS dispatch to.

    A float32 exp, power or BLAS dot differs in the last bit between CPUs (AVX2, AVX-512); before the renderer
    computed them in float64, 12 pixels of an 81-frame clip moved by one level, and COLMAP's unknown-K outcome on
    that clip flipped from "focal within 1%" to "unstable focal". Here the kernels are swapped in fresh
    interpreters: numpy's dispatch turned off down to its baseline, and OpenBLAS's oldest x86 kernel.
    """
    import os
    import subprocess
    import sys

    from numpy._core._multiarray_umath import __cpu_dispatch__, __cpu_features__

    def digest(**env: str) -> str:
        run = subprocess.run([sys.executable, "-c", _DIGEST], env={**os.environ, **env}, capture_output=True,
                             text=True, check=True)
        return run.stdout.strip()

    here = digest()
    assert len(here) == 64
    assert digest(OPENBLAS_CORETYPE="Prescott") == here
    dispatched = [k for k in __cpu_dispatch__ if __cpu_features__.get(k)]
    if not dispatched:
        pytest.skip("this CPU has no SIMD kernels beyond numpy's baseline to turn off")
    assert digest(NPY_DISABLE_CPU_FEATURES=" ".join(dispatched)) == here
