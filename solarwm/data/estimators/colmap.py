"""``colmap``: structure from motion through pycolmap (SIFT on the CPU, sequential matching, mapping).

The pipeline, on a clip window's frames uint8 ``[F, H, W, 3]``:

1. The frames are written as PNGs to a temporary folder; pycolmap extracts SIFT features on the
   CPU and matches each frame with its ``overlap`` successors (sequential matching, no loop
   closure: a clip window is one continuous shot).
2. Mapping. The default, ``mapper="checked"``, asks for a second opinion, because either mapper alone
   can settle on a wrong trajectory with a low reprojection error and nothing to flag it. With K known,
   the incremental mapper runs, then the global mapper (rotation averaging, then global positioning) on
   the same matches with the incremental run's intrinsics held fixed; the global run's cameras are kept
   only if the two trajectories agree (rotation, and camera centres after Sim(3)), else the clip fails
   as ``unstable trajectory`` (global positioning is weak on mostly forward motion, so walks often fail
   this way). When K is estimated the global mapper is no second opinion; instead the incremental
   mapper runs twice, the second run's focal seeded ``second_focal_seed_ratio`` times shorter than the
   first's (COLMAP's prior or the depth model's), each on its own matches, and the first run is kept
   only if both find the same focal and trajectory: a well-observed focal returns to the same value, a
   weakly observed one wanders. ``mapper="incremental"`` or ``"global"`` runs one mapper.
3. Checks, each failing the clip with a named ``EstimationError``: every frame registered (a
   missing frame is never interpolated), one model only, at least ``min_points`` points, mean
   reprojection error at most ``max_reproj_px``, an estimated focal inside ``fov_range_deg``, and
   (``checked``) the two runs' agreement within ``agree_rot_deg`` and ``agree_pos_frac`` (and, K
   estimated, ``agree_focal_frac``); and, K known, the split-half check: the kept run's points split
   at random into two halves, each bundle-adjusted alone, must place the cameras within
   ``split_pos_frac`` of the path of each other, in every split (``uncertain trajectory``), because
   mappers that agree can still share an error that only the observations' own spread reveals.

Every default here was measured on rendered worlds: docs/results/2026-12-pose-estimation.md.

Intrinsics. A known ``K [F, 4]`` (pixels; COLMAP's pixel convention is the project's: the centre
of column ``j`` is at ``u = j + 0.5``) is held fixed, or refined when ``refine_known_K``. An
unknown K is one ``SIMPLE_PINHOLE`` camera for the clip (square pixels, principal point at the
image centre) whose focal is estimated by bundle adjustment; when a depth model that predicts
the field of view is configured, its median over a few frames seeds the focal.

Scale. Without a depth model the poses are up to one global scale (``pose_units = "relative"``,
median point depth 1). With one (``depth=``), ``solarwm.data.estimators.depth.metric_scale``
compares the SfM depths of the points seen in sampled frames with the model's metric depth and
rescales the trajectory to metres (``pose_units = "metric"``).
"""

from __future__ import annotations

import copy
import math
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from solarwm.camera.sim3 import trajectory_errors
from solarwm.data.estimators.registry import EstimationError, EstimatorUnavailable, PoseEstimate, register


@dataclass(frozen=True)
class ColmapOptions:
    """Tuning of ``colmap``; the defaults were measured on rendered worlds (docs/results/2026-12-pose-estimation.md)."""

    mapper: str = "checked"  # a second opinion (module docstring, 2.), or one mapper by name
    agree_rot_deg: float = 2.0  # checked: worst rotation difference of the two runs' trajectories
    agree_pos_frac: float = 0.05  # checked: worst centre difference after Sim(3), as a fraction of the path
    agree_focal_frac: float = 0.03  # checked, K estimated: relative difference of the two runs' focals
    # checked, K estimated: the second run's focal seed is the first's divided by this (a wider field of view);
    # a nudge, because from the far end of the range even well-observed focals land in another basin.
    second_focal_seed_ratio: float = 1.2
    refine_known_K: bool = False
    max_features: int = 4096
    # Frames are enlarged this many times before SIFT; None: 2 when the short side is under 320 px, else 1.
    # Small frames give too few and too coarse keypoints to fix the focal and the camera centres.
    upscale: int | None = None
    # SIFT's DoG contrast threshold, a third of COLMAP's 0.0066: small clips need the weaker features.
    peak_threshold: float = 0.002
    # K known: the kept run's points are split into two halves, each bundle-adjusted alone, and the clip fails as
    # `uncertain trajectory` when the halves' camera centres differ (after Sim(3)) by more than this fraction of the
    # path in any of `split_draws` random splits (the median let wrong clips through); None skips the check.
    split_pos_frac: float | None = 0.007
    split_draws: int = 3
    max_scale_spread: float = 0.15  # metric scale: bound on the per-frame depth ratios' robust spread
    overlap: int = 12
    # Inlier threshold (px of the input frames) of two-view RANSAC, registration (3x), triangulation and the
    # mapper's point filter; None keeps COLMAP's 4 px. Tighter is more accurate on small frames but can keep a
    # wrong trajectory with no failure, so it is opt-in.
    max_error_px: float | None = None
    guided_matching: bool = False
    min_frames: int = 8
    min_points: int = 100
    max_reproj_px: float = 1.5
    fov_range_deg: tuple[float, float] = (20.0, 130.0)
    threads: int = 1
    seed: int = 0


def _pycolmap() -> Any:
    try:
        import pycolmap
    except ImportError as e:  # declared as a dependency; a broken install is named, not hidden
        raise EstimatorUnavailable("colmap", f"package not importable: pycolmap ({e}); pip install pycolmap") from None
    # COLMAP logs every frame at INFO; a clip's outcome is in the estimate's diagnostics instead.
    pycolmap.logging.minloglevel = max(int(pycolmap.logging.minloglevel), 2)
    return pycolmap


def _w2c_matrix(rigid: Any) -> np.ndarray:
    """A pycolmap ``Rigid3d`` (cam_from_world) → 4×4 world-to-camera matrix."""
    T = np.eye(4)
    T[:3, :4] = np.asarray(rigid.matrix(), dtype=np.float64)
    return T


@dataclass
class Observed:
    """What the metric-scale step needs of one frame: pixels ``uv [M, 2]`` of its 3D points and their depths
    ``z [M]``."""

    uv: np.ndarray
    z: np.ndarray


class ColmapEstimator:
    """Structure from motion with pycolmap; metric when a ``DepthEstimator`` is given, else relative."""

    name = "colmap"

    def __init__(self, weights: str | None = None, depth: Any = None, **options: Any):
        if weights:
            raise EstimationError("colmap takes no weights (a depth model is given as depth=)")
        self.pycolmap = _pycolmap()
        self.version = f"1+pycolmap-{self.pycolmap.__version__}"
        self.opts = ColmapOptions(**options)
        if self.opts.mapper not in ("checked", "incremental", "global"):
            raise ValueError(f"mapper must be checked, incremental or global, got {self.opts.mapper!r}")
        if not (self.opts.second_focal_seed_ratio > 0 and self.opts.second_focal_seed_ratio != 1):
            # 1 would repeat the first run (no second opinion); <= 0 is no focal at all.
            raise ValueError("second_focal_seed_ratio must be positive and not 1, "
                             f"got {self.opts.second_focal_seed_ratio!r}")
        if self.opts.split_pos_frac is not None and not self.opts.split_pos_frac > 0:
            raise ValueError(f"split_pos_frac must be positive or None, got {self.opts.split_pos_frac!r}")
        if not self.opts.split_draws >= 1:
            raise ValueError(f"split_draws must be at least 1, got {self.opts.split_draws!r}")
        self.depth = depth
        # Declared up front: the metric bridge refuses a relative reference before running it.
        self.pose_units = "metric" if depth is not None else "relative"

    # ------------------------------------------------------------------ pycolmap calls

    def _extract(self, frames: np.ndarray, K: np.ndarray | None, focal_seed: float | None, s: int, work: Path) -> Path:
        """Write the frames, enlarged ``s`` times, and extract their features into ``work/database.db``."""
        p, o = self.pycolmap, self.opts
        n, h, w = frames.shape[:3]
        images = work / "images"
        images.mkdir()
        names = [f"{i:06d}.png" for i in range(n)]
        for name, f in zip(names, frames):
            if s > 1:
                f = cv2.resize(f, (w * s, h * s), interpolation=cv2.INTER_CUBIC)
            cv2.imwrite(str(images / name), cv2.cvtColor(f, cv2.COLOR_RGB2BGR))
        # Continuous pixel coordinates (centre of column j at j + 0.5) scale exactly with the image.
        K = None if K is None else K * s
        w, h = w * s, h * s
        focal_seed = None if focal_seed is None else focal_seed * s
        db_path = work / "database.db"
        reader = p.ImageReaderOptions()
        same_K = K is not None and bool(np.allclose(K, K[:1]))
        if K is not None:
            reader.camera_model = "PINHOLE"
            reader.camera_params = ",".join(f"{v:.9g}" for v in K[0])
        else:
            reader.camera_model = "SIMPLE_PINHOLE"
            if focal_seed is not None:
                reader.camera_params = f"{focal_seed:.9g},{w / 2.0:.9g},{h / 2.0:.9g}"
        extraction = p.FeatureExtractionOptions()
        extraction.num_threads = o.threads
        extraction.sift.max_num_features = o.max_features
        extraction.sift.peak_threshold = o.peak_threshold
        mode = p.CameraMode.PER_IMAGE if (K is not None and not same_K) else p.CameraMode.SINGLE
        p.extract_features(db_path, images, image_names=names, camera_mode=mode, reader_options=reader,
                           extraction_options=extraction, device=p.Device.cpu)
        with p.Database.open(db_path) as db:
            by_name = {im.name: im for im in db.read_all_images()}
            for i, name in enumerate(names):
                cam = db.read_camera(by_name[name].camera_id)
                if K is not None:
                    cam.params = K[i]
                    cam.has_prior_focal_length = True
                elif focal_seed is not None:
                    cam.has_prior_focal_length = True
                db.update_camera(cam)
        return db_path

    def _seed_focal(self, db_path: Path, focal: float) -> None:
        """Seed the one estimated camera of an extracted database at ``focal`` (pixels of its images)."""
        with self.pycolmap.Database.open(db_path) as db:
            for cam in db.read_all_cameras():
                cam.params = [focal, cam.width / 2.0, cam.height / 2.0]
                cam.has_prior_focal_length = True
                db.update_camera(cam)

    def _match(self, db_path: Path, s: int) -> None:
        """Sequential matching and two-view verification of an extracted database (frames enlarged ``s`` times)."""
        p, o = self.pycolmap, self.opts
        matching = p.FeatureMatchingOptions()
        matching.num_threads = o.threads
        matching.guided_matching = o.guided_matching
        verification = p.TwoViewGeometryOptions()
        if o.max_error_px is not None:
            verification.ransac.max_error = o.max_error_px * s
        pairing = p.SequentialPairingOptions()
        pairing.overlap = o.overlap
        pairing.loop_detection = False
        p.match_sequential(db_path, matching_options=matching, pairing_options=pairing,
                           verification_options=verification, device=p.Device.cpu)

    def _incremental_options(self, refine: bool, s: int) -> Any:
        """The incremental mapper's options: ``s`` is the frames' enlargement."""
        p, o = self.pycolmap, self.opts
        opts = p.IncrementalPipelineOptions()
        opts.num_threads = o.threads
        opts.random_seed = o.seed
        opts.multiple_models = True  # several models are reported as such, not silently merged
        opts.min_model_size = 3
        opts.ba_refine_focal_length = refine
        opts.ba_refine_principal_point = False
        opts.ba_refine_extra_params = False
        if o.max_error_px is not None:
            e, m = o.max_error_px * s, opts.mapper
            m.init_max_error = m.filter_max_reproj_error = e
            m.abs_pose_max_error = 3 * e
            opts.triangulation.merge_max_reproj_error = opts.triangulation.complete_max_reproj_error = e
        return opts

    def _map(self, db_path: Path, out: Path, mapper: str, refine: bool, s: int) -> list[Any]:
        """Mapping of a matched database by ``mapper`` into ``out``; ``s`` is the frames' enlargement."""
        p, o = self.pycolmap, self.opts
        images = db_path.parent / "images"
        out.mkdir()
        if mapper == "incremental":
            models = p.incremental_mapping(db_path, images, out, options=self._incremental_options(refine, s))
        else:
            opts = p.GlobalPipelineOptions()
            opts.num_threads = o.threads
            opts.random_seed = o.seed
            ba = opts.mapper.bundle_adjustment  # pycolmap 4: the global mapper's BA options are nested
            ba.refine_focal_length = refine
            ba.refine_principal_point = False
            ba.refine_extra_params = False
            models = p.global_mapping(db_path, images, out, options=opts)
        return [models[k] for k in sorted(models)]

    def _upscale(self, h: int, w: int) -> int:
        """The enlargement factor of this clip's frames (``ColmapOptions.upscale``)."""
        if self.opts.upscale is not None:
            return int(self.opts.upscale)
        return 2 if min(h, w) < 320 else 1

    # ------------------------------------------------------------------ the estimator

    def estimate(self, frames: np.ndarray, K: np.ndarray | None, fps: float) -> PoseEstimate:
        """Poses for every frame of ``frames`` uint8 ``[F, H, W, 3]``; ``K [F, 4]`` pixels if known, else estimated."""
        frames = np.asarray(frames)
        if frames.ndim != 4 or frames.shape[-1] != 3 or frames.dtype != np.uint8:
            raise EstimationError(f"frames must be uint8 [F,H,W,3], got {frames.dtype} {list(frames.shape)}")
        n, h, w = frames.shape[:3]
        o = self.opts
        if n < o.min_frames:
            raise EstimationError(f"too few frames: {n} < {o.min_frames}")
        if K is not None:
            K = np.asarray(K, dtype=np.float64)
            if K.shape != (n, 4) or not np.isfinite(K).all() or (K[:, :2] <= 0).any():
                raise EstimationError(f"K must be finite [F,4] with positive focals, got shape {list(K.shape)}")
        diag: dict[str, Any] = {"mapper": o.mapper, "focal_source": "given" if K is not None else "estimated"}
        focal_seed = None
        if K is None and self.depth is not None and getattr(self.depth, "predicts_fov", False):
            focal_seed = self._focal_from_depth_model(frames)
            diag["focal_source"] = "estimated, seeded by the depth model's field of view"
        if K is None:
            first_seed, second_seed = self._focal_seeds(focal_seed, w, h)
            diag["focal_seed_px"] = round(first_seed, 3)
        up = self._upscale(h, w)
        diag["upscale"] = up
        with tempfile.TemporaryDirectory(prefix="solarwm-colmap-") as tmp:
            t0 = time.perf_counter()
            db_path = self._extract(frames, K, focal_seed, up, Path(tmp))
            second = None
            if o.mapper == "checked" and K is None:
                # The second opinion's own matches: the seed decides calibrated two-view geometry too.
                second = Path(tmp) / "database_second.db"
                shutil.copyfile(db_path, second)
                self._seed_focal(second, second_seed * up)
                diag["second_focal_seed_px"] = round(second_seed, 3)
            t1 = time.perf_counter()
            for db in (db_path, second):
                if db is not None:
                    self._match(db, up)
            t2 = time.perf_counter()
            rec, (c2w, K_out, observed) = self._mapped(db_path, second, n, w, h, K is None, up, diag)
            if K is not None and o.split_pos_frac is not None:
                self._split_check(rec, n, up, diag)
            diag.update(features_s=round(t1 - t0, 3), matching_s=round(t2 - t1, 3),
                        mapping_s=round(time.perf_counter() - t2, 3))
        units = "relative"
        depths = np.concatenate([ob.z for ob in observed])
        rel_scale = 1.0 / float(np.median(depths[depths > 0]))
        if self.depth is None:
            scale = rel_scale
            diag["scale_note"] = "median point depth = 1"
        else:
            from solarwm.data.estimators.depth import metric_scale

            scale, sdiag = metric_scale(observed, frames, self.depth, max_spread=o.max_scale_spread)
            diag["metric_scale"] = sdiag
            units = "metric"
        c2w[:, :3, 3] *= scale
        diag["options"] = asdict(o)
        if self.depth is not None:
            diag["depth_model"] = self.depth.describe()
        return PoseEstimate(c2w=c2w, K=K_out, pose_units=units, estimator=self.name, version=self.version,
                            diagnostics=diag)

    def _focal_from_depth_model(self, frames: np.ndarray) -> float:
        """The focal (pixels) implied by the depth model's median field of view on up to 3 frames."""
        w = frames.shape[2]
        fovs = []
        for i in np.unique(np.linspace(0, len(frames) - 1, 3).round().astype(int)):
            fov = self.depth.predict(frames[i]).fov_x_deg
            if fov is not None and 1.0 < fov < 179.0:
                fovs.append(fov)
        if not fovs:
            raise EstimationError("focal: the depth model predicted no usable field of view")
        return float(w / (2.0 * math.tan(math.radians(float(np.median(fovs))) / 2.0)))

    def _focal_seeds(self, focal_seed: float | None, w: int, h: int) -> tuple[float, float]:
        """The two runs' focal seeds (pixels of the input frames): the first's, and it over
        ``second_focal_seed_ratio``."""
        first = 1.2 * max(w, h) if focal_seed is None else focal_seed  # COLMAP's own prior when nothing seeds it
        return first, first / self.opts.second_focal_seed_ratio

    def _mapped(self, db_path: Path, second: Path | None, n: int, w: int, h: int, focal_free: bool, up: int,
                diag: dict[str, Any]) -> tuple[Any, tuple[np.ndarray, np.ndarray, list[Observed]]]:
        """The kept reconstruction of the configured mapper(s) (module docstring, 2.) and its export;
        ``second``: the second seed's database."""
        o = self.opts
        refine = focal_free or o.refine_known_K
        first = "global" if o.mapper == "global" else "incremental"
        rec = self._check(self._map(db_path, db_path.parent / "sparse", first, refine, up),
                          n, w, h, focal_free, up, diag)
        out = self._export(rec, n, up)
        if o.mapper != "checked":
            return rec, out
        check: dict[str, Any] = {}
        if focal_free:
            # The global mapper is no check of an estimated focal (it went wrong on walks the incremental mapper
            # got right): the incremental mapper again, from a nudged focal seed.
            assert second is not None
            diag["second_run"] = check
            try:
                other = self._export(self._check(self._map(second, db_path.parent / "sparse_second", "incremental",
                                                           True, up), n, w, h, True, up, check), n, up)
            except EstimationError as e:
                raise EstimationError(f"unstable focal: the run seeded at {diag['second_focal_seed_px']:.1f} px "
                                      f"failed where the first passed ({e})") from None
            f1, f2 = float(out[1][0, 0]), float(other[1][0, 0])
            apart = abs(f2 / f1 - 1.0)
            check["focal_frac"] = round(apart, 5)
            if not apart <= o.agree_focal_frac:
                seeds = (diag["focal_seed_px"], diag["second_focal_seed_px"])
                fov = [math.degrees(2.0 * math.atan(w / (2.0 * f))) for f in seeds]
                raise EstimationError(f"unstable focal: incremental runs seeded at {fov[0]:.0f} and {fov[1]:.0f} deg "
                                      f"field of view estimate {f1:.1f} and {f2:.1f} px, {100 * apart:.1f}% apart "
                                      f"(bound {100 * o.agree_focal_frac:g}%)")
            self._agree(out, other, "the incremental runs from the two focal seeds", check)
            return rec, out
        # The global run starts from the incremental run's intrinsics (K, or K as refined), held fixed.
        with self.pycolmap.Database.open(db_path) as db:
            for camera_id, camera in rec.cameras.items():
                cam = db.read_camera(camera_id)
                cam.params, cam.has_prior_focal_length = camera.params, True
                db.update_camera(cam)
        diag["global_run"] = check
        grec = self._check(self._map(db_path, db_path.parent / "sparse_global", "global", False, up),
                           n, w, h, False, up, check)
        other = self._export(grec, n, up)
        self._agree(out, other, "the incremental and global mappers", check)
        return grec, other

    def _split_check(self, rec: Any, n: int, up: int, diag: dict[str, Any]) -> None:
        """Known K: how far the observations fix the kept trajectory, or ``uncertain trajectory``.

        The run's 3D points are split at random into two halves; each half is bundle-adjusted alone (poses
        and points free, K fixed) from the kept solution, and the two trajectories are compared (worst
        centre difference after Sim(3), as a fraction of the path). In each of ``split_draws`` splits it
        must be at most ``split_pos_frac`` (the median let wrong clips through).
        """
        p, o = self.pycolmap, self.opts
        ids = np.array(sorted(rec.points3D))
        ba = p.BundleAdjustmentOptions()
        ba.refine_focal_length = ba.refine_principal_point = ba.refine_extra_params = False
        ba.print_summary = False
        ba.ceres.solver_options.num_threads = o.threads  # Ceres' threads reorder sums; one thread repeats exactly
        pos, rot = [], []
        for d in range(o.split_draws):
            order = np.random.default_rng(o.seed + d).permutation(ids)
            halves = []
            for drop in (order[len(ids) // 2:], order[: len(ids) // 2]):  # keeps the first half, then the second
                half = copy.deepcopy(rec)
                for pid in drop.tolist():
                    half.delete_point3D(pid)
                p.bundle_adjustment(half, ba)
                halves.append(self._export(half, n, up))
            err = trajectory_errors(halves[1][0], halves[0][0])
            pos.append(err["pos_max_frac"])
            rot.append(err["rot_max_deg"])
        apart = max(pos)
        diag["split_check"] = {"pos_max_frac": [round(v, 5) for v in pos], "rot_max_deg": [round(v, 4) for v in rot],
                               "worst_pos_frac": round(apart, 5)}
        if not apart <= o.split_pos_frac:
            raise EstimationError(f"uncertain trajectory: two halves of the {len(ids)} points, each adjusted alone, "
                                  f"place the cameras {100 * apart:.2f}% of the path apart (worst of "
                                  f"{o.split_draws} splits; bound {100 * o.split_pos_frac:g}%)")

    def _apart(self, a: tuple, b: tuple) -> tuple[dict[str, float], bool]:
        """Two runs' trajectory differences (``sim3.trajectory_errors``) and whether they are within the bounds."""
        err = trajectory_errors(b[0], a[0])
        return err, err["rot_max_deg"] <= self.opts.agree_rot_deg and err["pos_max_frac"] <= self.opts.agree_pos_frac

    def _agree(self, a: tuple, b: tuple, who: str, check: dict[str, Any]) -> None:
        """Two runs' trajectories agree within ``agree_rot_deg`` and ``agree_pos_frac``, or ``unstable trajectory``."""
        o = self.opts
        err, ok = self._apart(a, b)
        check["vs_first"] = {"rot_max_deg": round(err["rot_max_deg"], 4), "pos_max_frac": round(err["pos_max_frac"], 5)}
        if not ok:
            raise EstimationError(f"unstable trajectory: {who} disagree by {err['rot_max_deg']:.1f} deg and "
                                  f"{100 * err['pos_max_frac']:.1f}% of the path "
                                  f"(bounds {o.agree_rot_deg:g} deg, {100 * o.agree_pos_frac:g}%)")

    def _check(self, models: list[Any], n: int, w: int, h: int, focal_free: bool, up: int,
               diag: dict[str, Any]) -> Any:
        """The one model that explains every frame, or a named ``EstimationError``."""
        o = self.opts
        if not models:
            raise EstimationError(f"no model: the mapper found no initial pair among {n} frames "
                                  "(no parallax, too few features, or too few matches)")
        sizes = [m.num_reg_images() for m in models]
        diag["models"] = sizes
        rec = models[int(np.argmax(sizes))]
        registered = {int(rec.image(i).name.split(".")[0]) for i in rec.reg_image_ids()}
        missing = sorted(set(range(n)) - registered)
        diag["registered"] = len(registered)
        # The mapper may also seed a small model among frames the big one already holds: only
        # models that leave frames out of the largest one are disconnected pieces of the clip.
        if missing and sum(s >= 3 for s in sizes) > 1:
            raise EstimationError(f"several disconnected models: {len(sizes)} models of {sorted(sizes, reverse=True)} "
                                  f"frames; the largest misses {len(missing)} of {n} "
                                  "(a scene cut or a break in the matches)")
        if missing:
            shown = missing if len(missing) <= 12 else missing[:12] + ["..."]
            raise EstimationError(f"too few registered frames: {len(missing)} of {n} frames not registered {shown}")
        points = rec.num_points3D()
        diag["points"] = int(points)
        if points < o.min_points:
            raise EstimationError(f"too few points: {points} < {o.min_points}")
        err = float(rec.compute_mean_reprojection_error()) / up  # in pixels of the input frames
        diag["reprojection_px"] = round(err, 4)
        diag["mean_track_length"] = round(float(rec.compute_mean_track_length()), 3)
        if not err <= o.max_reproj_px:
            raise EstimationError(f"reprojection error: mean {err:.3f} px > {o.max_reproj_px} px")
        if focal_free:
            f = float(next(iter(rec.cameras.values())).mean_focal_length()) / up
            fov = math.degrees(2.0 * math.atan(w / (2.0 * f)))
            diag["focal_px"], diag["fov_x_deg"] = round(f, 3), round(fov, 3)
            lo, hi = o.fov_range_deg
            if not lo <= fov <= hi:
                raise EstimationError(f"focal: estimated field of view {fov:.1f} deg is outside {lo:g}-{hi:g} deg")
        return rec

    def _export(self, rec: Any, n: int, up: int) -> tuple[np.ndarray, np.ndarray, list[Observed]]:
        """c2w ``[F, 4, 4]`` (OpenCV axes: COLMAP's own), K ``[F, 4]`` and each frame's observed points."""
        c2w, K = np.zeros((n, 4, 4)), np.zeros((n, 4))
        observed: list[Observed] = [Observed(np.zeros((0, 2)), np.zeros(0))] * n
        xyz = {pid: pt.xyz for pid, pt in rec.points3D.items()}
        for image_id in rec.reg_image_ids():
            im = rec.image(image_id)
            i = int(im.name.split(".")[0])
            w2c = _w2c_matrix(im.cam_from_world())
            c2w[i] = np.linalg.inv(w2c)
            cam = im.camera
            if cam.model_name == "SIMPLE_PINHOLE":
                f, cx, cy = cam.params
                K[i] = np.array([f, f, cx, cy]) / up
            else:
                K[i] = np.asarray(cam.params[:4]) / up
            pts = [(p2.xy, xyz[p2.point3D_id]) for p2 in im.points2D if p2.has_point3D()]
            if pts:
                uv = np.array([a for a, _ in pts], dtype=np.float64) / up
                X = np.array([b for _, b in pts], dtype=np.float64)
                observed[i] = Observed(uv, X @ w2c[2, :3] + w2c[2, 3])
        return c2w, K, observed


register("colmap")(ColmapEstimator)
