"""One pixel convention end to end: the renderer, its K, and COLMAP's keypoints.

The project's convention (``solarwm.camera.intrinsics``): the centre of pixel column ``j`` is at
``u = j + 0.5``, ``cx = W / 2`` for a centred principal point. COLMAP's is the same. A half-pixel
disagreement anywhere (rays through ``j``, ``cx = (W - 1) / 2``, a focal from ``W - 1``, keypoints
at ``j``) would bias every pose with K held fixed; these tests pin each side without going
through the other.
"""

from __future__ import annotations

import math

import cv2
import numpy as np
import pytest

from solarwm.data.sources.render import Material, Scene, depth_views

W, H, FOV = 160, 120, 70.0


def _camera() -> tuple[np.ndarray, np.ndarray]:
    """A level camera at (0, 0, 1.5) looking along world +y (OpenCV axes): c2w ``[1, 4, 4]``, K ``[1, 4]``."""
    c2w = np.eye(4)
    c2w[:3, :3] = np.array([[1, 0, 0], [0, 0, -1], [0, 1, 0]], float).T  # columns: x right, y down, z forward
    c2w[:3, 3] = (0.0, 0.0, 1.5)
    f = W / (2.0 * math.tan(math.radians(FOV) / 2.0))
    return c2w[None], np.array([[f, f, W / 2.0, H / 2.0]])


def test_rendered_edges_fall_where_K_puts_them():
    """A wall whose left/top edges project (by K alone) 0.05 px right of / below a column's and a row's left edge."""
    c2w, K = _camera()
    fx, fy, cx, cy = K[0]
    dist, u_edge, v_edge = 5.0, 10.05, 30.05  # 0.45 px inside pixel 10 / row 30; a 0.5 px slip flips them
    x0 = (u_edge - cx) / fx * dist
    z_top = 1.5 - (v_edge - cy) / fy * dist
    mat = Material("solid", (0.5, 0.5, 0.5), (0.5, 0.5, 0.5), 1.0)
    scene = Scene(
        ground=mat,
        box_lo=np.array([[x0, dist, -1.0]], np.float32),
        box_hi=np.array([[20.0, dist + 0.2, z_top]], np.float32),
        box_material=[mat],
        box_kind=["wall"],
    )
    depth = depth_views(scene, c2w, K, W, H)[0]
    row, col = H // 2 - 1, W // 2  # this row looks slightly up: it misses the ground, so off the wall is sky
    assert np.isinf(depth[row, :10]).all() and np.isfinite(depth[row, 10:]).all()
    assert np.isinf(depth[:30, col]).all() and np.isfinite(depth[30 : row + 1, col]).all()
    assert depth[row, 10:] == pytest.approx(dist, rel=1e-5)  # z along the optical axis, not the ray length


def test_colmap_keypoints_use_the_same_pixel_centres(tmp_path):
    """SIFT keypoints of Gaussian blobs at known continuous positions (j + 0.5 convention) land within 0.05 px."""
    pycolmap = pytest.importorskip("pycolmap")
    pycolmap.logging.minloglevel = max(int(pycolmap.logging.minloglevel), 2)
    rng = np.random.default_rng(0)
    centres = rng.uniform(30, [290, 210], (20, 2))
    u, v = np.meshgrid(np.arange(320) + 0.5, np.arange(240) + 0.5)
    img = sum(np.exp(-((u - a) ** 2 + (v - b) ** 2) / (2 * 3.0**2)) for a, b in centres)
    (tmp_path / "images").mkdir()
    cv2.imwrite(str(tmp_path / "images" / "a.png"), np.clip(img * 220 + 20, 0, 255).astype(np.uint8))
    opts = pycolmap.FeatureExtractionOptions()
    opts.num_threads = 1
    pycolmap.extract_features(
        tmp_path / "db.db", tmp_path / "images", extraction_options=opts, device=pycolmap.Device.cpu
    )
    with pycolmap.Database.open(tmp_path / "db.db") as db:
        kp = np.asarray(db.read_keypoints(db.read_all_images()[0].image_id))[:, :2]
    d = np.linalg.norm(kp[:, None] - centres[None], axis=-1)
    near = d.min(1) < 1.0
    assert near.sum() >= 15
    offset = kp[near] - centres[d[near].argmin(1)]
    assert np.abs(offset.mean(0)).max() < 0.05, offset.mean(0)  # a j-convention would read -0.5
