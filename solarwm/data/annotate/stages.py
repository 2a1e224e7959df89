"""Annotation stages (paper §5.2, §5.4): each computes a few flat metric keys of one clip.

A stage is a name, the keys it writes with their kinds (declared once, here: the policy's column
vocabulary is built from them), a version and a function ``run(ctx, config) -> {key: value}``. It either
returns the keys it computed (never a placeholder: a value that could not be computed is
left out), raises ``StageSkipped`` when it is not configured here, or raises any error, which
the runner records as the stage's failure. The runner, not the stage, writes ``meta.json``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from solarwm.camera.integrity import camera_integrity
from solarwm.data.annotate import visual
from solarwm.data.annotate.vlm import VLMConfig, caption_frames
from solarwm.data.contract import ClipError, check_alignment, pose_units, read_clip
from solarwm.data.kinds import BOOL, NUMBER, STR_LIST, TEXT
from solarwm.data.video import VideoError, read_video


class AnnotateConfigError(ValueError):
    """The annotation configuration cannot work here (missing checkpoint, unimportable model code, no endpoint)."""


class StageSkipped(Exception):
    """The stage is not configured on this run; the message is the recorded reason."""


@dataclass(frozen=True)
class AnnotateConfig:
    """Everything a stage needs besides the clip; picklable so worker processes (or Ray tasks) get a copy."""

    vlm: VLMConfig | None = None
    unimatch_checkpoint: str | None = None
    dover_checkpoint: str | None = None
    dover_options: str | None = None  # DOVER's dover.yml (model args and view sampling)
    device: str = "cpu"

    def check(self, stages: list[str]) -> None:
        """Fail now, with a clear message, on anything that would make a requested stage unusable."""
        unknown = [s for s in stages if s not in STAGES]
        if unknown:
            raise AnnotateConfigError(f"unknown stage(s) {unknown}; known: {list(STAGES)}")
        if "vlm" in stages and self.vlm is None:
            raise AnnotateConfigError("stage 'vlm' needs an endpoint and a model (--vlm_endpoint, --vlm_model)")
        if self.vlm is not None and not (self.vlm.endpoint and self.vlm.model):
            raise AnnotateConfigError("the VLM needs both an endpoint and a model name")
        if "flow" in stages and self.unimatch_checkpoint:
            _require_file(self.unimatch_checkpoint, "UniMatch checkpoint")
            try:
                visual.import_unimatch()
            except ImportError as e:
                raise AnnotateConfigError(str(e)) from e
        if "dover" in stages and self.dover_checkpoint:
            _require_file(self.dover_checkpoint, "DOVER weights")
            if not self.dover_options:
                raise AnnotateConfigError("DOVER weights are configured but not DOVER's option file (--dover_options dover.yml)")
            _require_file(self.dover_options, "DOVER option file")
            try:
                visual.import_dover()
            except ImportError as e:
                raise AnnotateConfigError(str(e)) from e


def _require_file(path: str, what: str) -> None:
    if not Path(path).is_file():
        raise AnnotateConfigError(f"{what} {path!r} is not a file")


@dataclass
class ClipContext:
    """One clip folder being annotated; decodes the video at most once, for the stages that need frames."""

    folder: Path
    meta: dict[str, Any]
    _frames: np.ndarray | None = field(default=None, repr=False)

    @property
    def video(self) -> Path:
        """Path of the clip's ``video.mp4``."""
        return self.folder / "video.mp4"

    def frames(self) -> np.ndarray:
        """Decoded uint8 RGB ``[N, H, W, 3]``; raises ``ClipError`` if undecodable or not ``meta.num_frames`` long."""
        if self._frames is None:
            try:
                frames = read_video(self.video)
            except VideoError as e:
                raise ClipError(self.folder.name, "video", str(e)) from None
            expected = self.meta["meta"].get("num_frames")
            if len(frames) != expected:
                raise ClipError(self.folder.name, "meta_num_frames", f"meta.json says {expected} frames, video has {len(frames)}")
            self._frames = frames
        return self._frames


@dataclass(frozen=True)
class Stage:
    """A named, versioned per-clip computation; ``version(config)`` changes whenever its output would.

    ``keys`` maps every key the stage may write to its kind (``solarwm.data.kinds``); the runner
    fails a stage that writes an undeclared key or a value of the wrong kind.
    """

    name: str
    run: Callable[[ClipContext, AnnotateConfig], dict[str, Any]]
    version: Callable[[AnnotateConfig], str]
    keys: dict[str, str] = field(default_factory=dict)


def run_camera(ctx: ClipContext, config: AnnotateConfig) -> dict[str, Any]:
    """``camera.*`` keys via ``camera_integrity``; poses are read without requiring them to be valid.

    Non-finite poses or intrinsics give ``camera.finite = False`` and no numeric keys (so no
    gate can pass on them); a pose/intrinsic/video frame-count mismatch fails the stage.
    """
    clip = read_clip(ctx.folder, load_video=False, validate=False)
    m = ctx.meta["meta"]
    c2w, K = np.asarray(clip.c2w), np.asarray(clip.K)
    errors = check_alignment(ctx.folder.name, c2w, K, m.get("num_frames"))
    if errors:
        raise errors[0]
    # scale=None: per-frame Sim(3) scales are not part of the contract yet; relative poses
    # (meta.pose_units) get no scale keys and fail the metric camera gates by name.
    out = camera_integrity(c2w, K, int(m["width"]), int(m["height"]), pose_units=pose_units(m))
    # Belt and braces: a non-finite number must never reach a gate, so it is left out.
    return {k: v for k, v in out.items() if not (isinstance(v, float) and not math.isfinite(v))}


def run_saturation(ctx: ClipContext, config: AnnotateConfig) -> dict[str, Any]:
    """``metrics.saturation``: mean OpenCV HSV saturation (0–255) over >= 16 evenly spaced frames."""
    return {"metrics.saturation": visual.mean_saturation(ctx.frames())}


def run_vmaf(ctx: ClipContext, config: AnnotateConfig) -> dict[str, Any]:
    """``metrics.vmaf``: FFmpeg's vmafmotion average, identical to the ffmpeg CLI's "VMAF Motion avg"."""
    ctx.frames()  # fail on undecodable / miscounted clips with the same named checks as other stages
    return {"metrics.vmaf": visual.vmaf_motion(ctx.video)}


def run_cuts(ctx: ClipContext, config: AnnotateConfig) -> dict[str, Any]:
    """``metrics.scene_cuts``: PySceneDetect ContentDetector (defaults) cut count."""
    ctx.frames()
    return {"metrics.scene_cuts": visual.scene_cuts(ctx.video)}


_MODELS: dict[tuple, Any] = {}  # per-process cache: one model load per worker, not per clip


def _cached(kind: str, *args: Any) -> Any:
    key = (kind, *args)
    if key not in _MODELS:
        _MODELS[key] = visual.UniMatchScorer(*args) if kind == "unimatch" else visual.DoverScorer(*args)
    return _MODELS[key]


def run_flow(ctx: ClipContext, config: AnnotateConfig) -> dict[str, Any]:
    """``metrics.flow_dis`` (OpenCV DIS) always; ``metrics.unimatch`` only with a UniMatch checkpoint configured."""
    frames = ctx.frames()
    out = {"metrics.flow_dis": visual.dis_flow_magnitude(frames)}
    if config.unimatch_checkpoint:
        out["metrics.unimatch"] = _cached("unimatch", config.unimatch_checkpoint, config.device)(frames)
    return out


def run_dover(ctx: ClipContext, config: AnnotateConfig) -> dict[str, Any]:
    """``metrics.dover_tech`` / ``metrics.dover_aes`` from DOVER weights; skipped when none are configured."""
    if not config.dover_checkpoint:
        raise StageSkipped("no DOVER weights configured")
    ctx.frames()
    scores = _cached("dover", config.dover_checkpoint, config.dover_options, config.device)(ctx.video)
    return {"metrics.dover_tech": scores["technical"], "metrics.dover_aes": scores["aesthetic"]}


def run_vlm(ctx: ClipContext, config: AnnotateConfig) -> dict[str, Any]:
    """Table 2 captioner: ``caption`` (-> meta caption and prompt.txt) and the ``metrics.vlm_*`` keys."""
    if config.vlm is None:
        raise StageSkipped("no VLM endpoint configured")
    caption, metrics = caption_frames(ctx.frames(), float(ctx.meta["meta"]["fps"]), config.vlm)
    return {"caption": caption, **metrics}


def _libs(*names: str) -> str:
    """Versions of the libraries whose numbers a stage reports, for the stage version string."""
    import importlib.metadata as md

    out = []
    for n in names:
        if n == "opencv":
            import cv2

            out.append(f"opencv-{cv2.__version__}")
        elif n == "libavfilter":
            import av

            out.append("libavfilter-" + ".".join(map(str, av.library_versions["libavfilter"])))
        else:
            out.append(f"{n}-{md.version(n)}")
    return "+".join(out)


_CAMERA_KEYS = {
    "camera.finite": BOOL, "camera.pose_units": TEXT,  # "metric" or "relative" (up to scale)
    **dict.fromkeys(("camera.fov_x_min", "camera.fov_x_max", "camera.fov_y_min", "camera.fov_y_max",
                     "camera.focal_div_max", "camera.scale_cov"), NUMBER),
}
_VLM_KEYS = {  # Table 2's captioner: Q, R, T, E of Table 3
    "caption": TEXT, "metrics.vlm_quality": NUMBER, "metrics.vlm_reject_flags": STR_LIST,
    "metrics.vlm_transition_count": NUMBER, "metrics.vlm_transition_label": TEXT,
    "metrics.vlm_entity_density": NUMBER, "metrics.vlm_scene_type": TEXT,
}

STAGES: dict[str, Stage] = {
    s.name: s
    for s in (
        Stage("camera", run_camera, lambda c: "2", _CAMERA_KEYS),  # 2: camera.pose_units
        Stage("saturation", run_saturation, lambda c: "1/" + _libs("opencv"), {"metrics.saturation": NUMBER}),  # S
        Stage("vmaf", run_vmaf, lambda c: "1/" + _libs("libavfilter"), {"metrics.vmaf": NUMBER}),  # V
        Stage("cuts", run_cuts, lambda c: "1/" + _libs("scenedetect"), {"metrics.scene_cuts": NUMBER}),  # J
        # 2: torch/OpenCV/BLAS pinned to one thread (runner.annotate_clip); 1 varied with the worker's threads.
        # metrics.flow_dis: DIS optical-flow magnitude, the CPU stand-in for U = metrics.unimatch.
        Stage("flow", run_flow, lambda c: "2/" + _libs("opencv")
              + (f"/unimatch:{Path(c.unimatch_checkpoint).name}" if c.unimatch_checkpoint else ""),
              {"metrics.flow_dis": NUMBER, "metrics.unimatch": NUMBER}),
        Stage("dover", run_dover, lambda c: "1" + (f"/dover:{Path(c.dover_checkpoint).name}" if c.dover_checkpoint else ""),
              {"metrics.dover_tech": NUMBER, "metrics.dover_aes": NUMBER}),  # D = their mean
        Stage("vlm", run_vlm, lambda c: "1" + (f"/{c.vlm.model}" if c.vlm else ""), _VLM_KEYS),
    )
}
