"""Metric depth for one frame, and the metric scale of a structure-from-motion reconstruction.

``DepthEstimator``: one frame uint8 ``[H, W, 3]`` → ``DepthMap`` (metres ``[H, W]``, optionally the
horizontal field of view). Two implementations:

* ``TransformersDepth`` — a ``transformers`` depth model loaded with ``from_pretrained(local_dir)``
  only (DepthPro, which also predicts the field of view, and Depth Anything's metric variants);
* ``OracleDepth`` — the renderer's true depth, for tests and benchmarks: it reads the
  ``depth.npy`` that ``solarwm data synth --depth`` writes next to each clip and answers for a frame
  it recognises among those clips' decoded videos.

``metric_scale`` turns relative SfM poses into metres: on a sample of frames it compares the
camera-space depth of every SfM point seen in the frame with the model's metric depth at that
pixel, takes the per-frame median ratio, then the median over frames; the frames' robust spread is
kept as a diagnostic and, above ``max_spread``, fails the clip (``EstimationError``).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from solarwm.data.estimators.registry import EstimationError, EstimatorUnavailable


@dataclass
class DepthMap:
    """Metric depth (z along the optical axis, metres) float32 ``[H, W]``; NaN/inf where unknown (e.g. sky)."""

    depth: np.ndarray
    fov_x_deg: float | None = None


class DepthEstimator(Protocol):
    """What every depth model provides; ``predicts_fov`` says whether ``DepthMap.fov_x_deg`` is filled."""

    name: str
    version: str
    predicts_fov: bool

    def predict(self, frame: np.ndarray) -> DepthMap:
        """Metric depth of ``frame`` uint8 ``[H, W, 3]`` at the frame's own resolution."""
        ...

    def describe(self) -> dict[str, Any]:
        """Name, version and weights hash for provenance."""
        ...


def weights_hash(folder: Path) -> str:
    """sha256 over the weight files of ``folder`` (names and bytes, sorted): which weights ran, for provenance."""
    h = hashlib.sha256()
    files = sorted(p for p in folder.iterdir() if p.suffix in (".safetensors", ".bin", ".pt", ".pth"))
    if not files:
        raise EstimatorUnavailable("depth", f"{folder} holds no weight file (*.safetensors)")
    for p in files:
        h.update(p.name.encode())
        with open(p, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


class TransformersDepth:
    """A ``transformers`` metric-depth model (DepthPro, Depth Anything metric) from a local folder.

    The model loads with ``AutoModelForDepthEstimation.from_pretrained(folder)``; pre- and
    post-processing follow the folder's ``preprocessor_config.json`` in plain torch (the
    transformers processors of these models need torchvision, which this project does not
    install): rescale and normalise, bilinear resize to the model's size, then DepthPro's
    ``depth · W / f`` with f from its predicted field of view and ``1 / x`` (its
    ``post_process_depth_estimation``), or Depth Anything's metric depth resized to the frame.
    """

    def __init__(self, folder: str | Path, device: str = "cpu"):
        folder = Path(folder)
        if not (folder / "config.json").is_file() or not (folder / "preprocessor_config.json").is_file():
            raise EstimatorUnavailable("depth", f"{folder}: not a transformers model folder "
                                                "(needs config.json and preprocessor_config.json)")
        try:
            import torch
            import transformers
            from transformers import AutoModelForDepthEstimation
        except ImportError as e:
            raise EstimatorUnavailable("depth", f"package not importable: transformers/torch ({e})") from None
        self.torch = torch
        self.model = AutoModelForDepthEstimation.from_pretrained(folder, local_files_only=True).eval().to(device)
        cfg = self.model.config
        if cfg.model_type not in ("depth_pro", "depth_anything"):
            raise EstimatorUnavailable(
                "depth", f"{folder}: model type {cfg.model_type!r}; DepthPro or Depth Anything (metric)"
            )
        if cfg.model_type == "depth_anything" and getattr(cfg, "depth_estimation_type", "relative") != "metric":
            raise EstimatorUnavailable("depth", f"{folder}: a relative Depth Anything model; a metric one is needed")
        pre = json.loads((folder / "preprocessor_config.json").read_text())
        size = pre.get("size", {})
        self.size = (
            int(size.get("height", size.get("shortest_edge", 518))),
            int(size.get("width", size.get("shortest_edge", 518))),
        )
        if cfg.model_type == "depth_anything":  # its ViT needs multiples of the patch size
            self.size = tuple(max(14, int(round(v / 14)) * 14) for v in self.size)
        self.mean = np.asarray(pre.get("image_mean", [0.5, 0.5, 0.5]), np.float32)
        self.std = np.asarray(pre.get("image_std", [0.5, 0.5, 0.5]), np.float32)
        self.rescale = float(pre.get("rescale_factor", 1 / 255)) if pre.get("do_rescale", True) else 1.0
        self.device, self.kind = device, cfg.model_type
        self.name = f"transformers:{cfg.model_type}"
        self.version = f"transformers-{transformers.__version__}"
        self.predicts_fov = bool(getattr(cfg, "use_fov_model", False))
        self.folder = folder
        self.hash = weights_hash(folder)

    def predict(self, frame: np.ndarray) -> DepthMap:
        """Metric depth of ``frame`` uint8 ``[H, W, 3]`` at the frame's resolution (and DepthPro's field of view)."""
        torch, F = self.torch, self.torch.nn.functional
        h, w = frame.shape[:2]
        x = (frame.astype(np.float32) * self.rescale - self.mean) / self.std
        x = torch.from_numpy(np.ascontiguousarray(x.transpose(2, 0, 1)))[None].to(self.device)
        x = F.interpolate(x, size=self.size, mode="bilinear", align_corners=False)
        with torch.no_grad():
            out = self.model(pixel_values=x)
        pred = out.predicted_depth.reshape(1, 1, *out.predicted_depth.shape[-2:]).float()
        fov_deg = None
        if self.kind == "depth_pro":
            fov = getattr(out, "field_of_view", None)
            if fov is not None:  # depth_pro's output is an inverse depth in units of the focal
                fov_deg = float(fov.reshape(-1)[0])
                focal = 0.5 * w / np.tan(0.5 * np.radians(fov_deg))
                pred = pred * (w / focal)
            pred = F.interpolate(pred, size=(h, w), mode="bilinear", align_corners=False)
            depth = 1.0 / pred.clamp(min=1e-4, max=1e4)
        else:
            depth = F.interpolate(pred, size=(h, w), mode="bilinear", align_corners=False)
        return DepthMap(depth[0, 0].cpu().numpy().astype(np.float32), fov_deg)

    def describe(self) -> dict[str, Any]:
        """Name, version, folder and weights hash."""
        return {"name": self.name, "version": self.version, "weights": str(self.folder), "weights_sha256": self.hash}


class OracleDepth:
    """The renderer's true depth: ``depth.npy`` ``[F, H, W]`` next to each clip's ``video.mp4`` under ``root``."""

    name, version, predicts_fov = "oracle", "1", False

    def __init__(self, root: str | Path, max_mean_abs: float = 2.0):
        from solarwm.data.video import read_video

        self.root = Path(root)
        frames, depths = [], []
        for d in sorted(p.parent for p in self.root.rglob("depth.npy")):
            if (d / "video.mp4").is_file():
                video = read_video(d / "video.mp4")
                depth = np.load(d / "depth.npy")
                if len(video) == len(depth):
                    frames.append(np.asarray(video))
                    depths.append(depth)
        if not frames:
            raise EstimatorUnavailable(
                "oracle",
                f"{self.root}: no clip folder with video.mp4 and depth.npy "
                "(write them with `solarwm data synth --depth`)",
            )
        self.frames, self.depths = frames, depths
        self.max_mean_abs = max_mean_abs
        # A coarse thumbnail per frame finds the candidates fast; the full frame decides.
        self.thumbs = [self._thumb(f) for f in frames]

    @staticmethod
    def _thumb(frames: np.ndarray) -> np.ndarray:
        """``[N, H, W, 3]`` → ``[N, (H//4)*(W//4)*3]`` 4×4 block means."""
        f = np.asarray(frames, np.float32)
        n, h, w = f.shape[:3]
        f = f[:, : h - h % 4, : w - w % 4]
        return f.reshape(n, h // 4, 4, w // 4, 4, 3).mean((2, 4)).reshape(n, -1)

    def predict(self, frame: np.ndarray) -> DepthMap:
        """The stored depth of the stored frame that ``frame`` is (mean absolute difference ≤ ``max_mean_abs``)."""
        t = self._thumb(frame[None])[0]
        best: tuple[float, int, int] | None = None
        for c, frames in enumerate(self.frames):
            if frames.shape[1:3] != frame.shape[:2]:
                continue
            i = int(np.abs(self.thumbs[c] - t).mean(1).argmin())
            err = float(np.abs(frames[i].astype(np.float32) - frame).mean())
            if best is None or err < best[0]:
                best = (err, c, i)
        if best is None or best[0] > self.max_mean_abs:
            raise EstimationError(f"oracle depth: this frame is none of the rendered frames under {self.root}")
        return DepthMap(np.asarray(self.depths[best[1]][best[2]], np.float32))

    def describe(self) -> dict[str, Any]:
        """Name, version and root."""
        return {"name": self.name, "version": self.version, "weights": str(self.root), "weights_sha256": None}


def get_depth_model(spec: str, device: str = "cpu") -> DepthEstimator:
    """``oracle:DIR`` → ``OracleDepth(DIR)``; any other value is a local transformers model folder."""
    if spec.startswith("oracle:"):
        return OracleDepth(spec.split(":", 1)[1])
    if spec == "oracle":
        raise EstimatorUnavailable("oracle", "give the rendered corpus as oracle:DIR")
    if not Path(spec).is_dir():
        raise EstimatorUnavailable("depth", f"depth model folder not found: {spec}")
    return TransformersDepth(spec, device)


def sample_frames(n: int, count: int) -> np.ndarray:
    """``count`` frame indices spread evenly over ``n`` frames."""
    return np.unique(np.linspace(0, n - 1, min(count, n)).round().astype(int))


def metric_scale(
    observed: list[Any],
    frames: np.ndarray,
    depth: DepthEstimator,
    samples: int = 8,
    min_points: int = 15,
    max_spread: float = 0.15,
) -> tuple[float, dict[str, Any]]:
    """The factor taking SfM units to metres, and its diagnostics.

    ``observed[f]`` has ``uv [M, 2]`` (continuous pixels) and ``z [M]`` (SfM camera-space depths)
    of the points seen in frame ``f`` of ``frames`` uint8 ``[F, H, W, 3]``. Spread is
    ``1.4826 · MAD / median`` of the per-frame ratios; above ``max_spread`` the clip fails.
    """
    h, w = frames.shape[1:3]
    rows, ratios = [], []
    for f in sample_frames(len(frames), samples):
        ob = observed[int(f)]
        dm = depth.predict(frames[int(f)])
        if dm.depth.shape != (h, w):
            raise EstimationError(f"depth model returned {list(dm.depth.shape)} for a {h}x{w} frame")
        # Nearest pixel: SfM points sit on texture edges, where bilinear mixes two surfaces.
        j = np.clip(np.floor(ob.uv[:, 0]).astype(int), 0, w - 1)
        i = np.clip(np.floor(ob.uv[:, 1]).astype(int), 0, h - 1)
        d = dm.depth[i, j].astype(np.float64)
        ok = np.isfinite(d) & (d > 0) & (ob.z > 0)
        row: dict[str, Any] = {"frame": int(f), "points": int(ok.sum())}
        if ok.sum() >= min_points:
            r = float(np.median(d[ok] / ob.z[ok]))
            row["ratio"] = r
            ratios.append(r)
        rows.append(row)
    if len(ratios) < max(2, (len(rows) + 1) // 2):
        raise EstimationError(
            f"metric scale: only {len(ratios)} of {len(rows)} sampled frames have "
            f">= {min_points} points with a metric depth"
        )
    r = np.array(ratios)
    scale = float(np.median(r))
    spread = float(1.4826 * np.median(np.abs(r - scale)) / scale)
    diag = {"scale": scale, "spread": spread, "max_spread": max_spread, "frames": rows, "depth_model": depth.describe()}
    if not spread <= max_spread:
        raise EstimationError(f"metric scale: per-frame depth ratios disagree (spread {spread:.3f} > {max_spread})")
    return scale, diag
