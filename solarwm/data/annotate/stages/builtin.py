"""The built-in annotation stages (paper §5.2, §5.4): camera, saturation, vmaf, cuts, flow, dover, vlm.

Each is a ``Stage`` (``solarwm.data.annotate.registry``) registered here in this order, the order
they run in: its keys with their kinds, its options, its checks and its default. The runner, not
the stage, writes ``meta.json``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable

import numpy as np

from solarwm.camera.integrity import camera_integrity
from solarwm.data.annotate import visual
from solarwm.data.annotate.registry import (
    AnnotateConfig,
    AnnotateConfigError,
    ClipContext,
    Option,
    Stage,
    StageSkipped,
    register_stage,
)
from solarwm.data.annotate.vlm import VLMConfig, caption_frames
from solarwm.data.contract import check_alignment, pose_units, read_clip
from solarwm.data.kinds import BOOL, NUMBER, STR_LIST, TEXT


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


def vlm_config(config: AnnotateConfig) -> VLMConfig | None:
    """The captioner's client settings from the ``vlm_*`` options; ``None`` without an endpoint."""
    if not config.vlm_endpoint:
        return None
    return VLMConfig(config.vlm_endpoint, config.vlm_model or "", config.vlm_api_key_env, config.vlm_max_retries)


def run_vlm(ctx: ClipContext, config: AnnotateConfig) -> dict[str, Any]:
    """Table 2 captioner: ``caption`` (-> meta caption and prompt.txt) and the ``metrics.vlm_*`` keys."""
    vlm = vlm_config(config)
    if vlm is None:
        raise StageSkipped("no VLM endpoint configured")
    caption, metrics = caption_frames(ctx.frames(), float(ctx.meta["meta"]["fps"]), vlm)
    return {"caption": caption, **metrics}


def _require_file(path: str, what: str) -> None:
    if not Path(path).is_file():
        raise AnnotateConfigError(f"{what} {path!r} is not a file")


def _require_import(load: Callable[[], Any]) -> None:
    """A model's code must import; its ImportError (which names what to install) becomes a config error."""
    try:
        load()
    except ImportError as e:
        raise AnnotateConfigError(str(e)) from e


def check_flow(config: AnnotateConfig) -> None:
    """A configured UniMatch checkpoint must be a file and UniMatch's model code importable."""
    if config.unimatch_checkpoint:
        _require_file(config.unimatch_checkpoint, "UniMatch checkpoint")
        _require_import(visual.import_unimatch)


def check_dover(config: AnnotateConfig) -> None:
    """Configured DOVER weights need DOVER's option file, both files, and DOVER's model code importable."""
    if config.dover_checkpoint:
        _require_file(config.dover_checkpoint, "DOVER weights")
        if not config.dover_options:
            raise AnnotateConfigError(
                "DOVER weights are configured but not DOVER's option file (--dover_options dover.yml)"
            )
        _require_file(config.dover_options, "DOVER option file")
        _require_import(visual.import_dover)


def check_vlm(config: AnnotateConfig) -> None:
    """The captioner needs an endpoint and a model name."""
    if not config.vlm_endpoint:
        raise AnnotateConfigError("stage 'vlm' needs an endpoint and a model (--vlm_endpoint, --vlm_model)")
    if not config.vlm_model:
        raise AnnotateConfigError("the VLM needs both an endpoint and a model name (--vlm_model)")


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
    "camera.finite": BOOL,
    "camera.pose_units": TEXT,  # "metric" or "relative" (up to scale)
    **dict.fromkeys(
        (
            "camera.fov_x_min",
            "camera.fov_x_max",
            "camera.fov_y_min",
            "camera.fov_y_max",
            "camera.focal_div_max",
            "camera.scale_cov",
        ),
        NUMBER,
    ),
}
_VLM_KEYS = {  # Table 2's captioner: Q, R, T, E of Table 3
    "caption": TEXT,
    "metrics.vlm_quality": NUMBER,
    "metrics.vlm_reject_flags": STR_LIST,
    "metrics.vlm_transition_count": NUMBER,
    "metrics.vlm_transition_label": TEXT,
    "metrics.vlm_entity_density": NUMBER,
    "metrics.vlm_scene_type": TEXT,
}

for _stage in (
    Stage("camera", run_camera, lambda c: "2", _CAMERA_KEYS),  # 2: camera.pose_units
    Stage("saturation", run_saturation, lambda c: "1/" + _libs("opencv"), {"metrics.saturation": NUMBER}),  # S
    Stage("vmaf", run_vmaf, lambda c: "1/" + _libs("libavfilter"), {"metrics.vmaf": NUMBER}),  # V
    Stage("cuts", run_cuts, lambda c: "1/" + _libs("scenedetect"), {"metrics.scene_cuts": NUMBER}),  # J
    # 2: torch/OpenCV/BLAS pinned to one thread (runner.annotate_clip); 1 varied with the worker's threads.
    # metrics.flow_dis: DIS optical-flow magnitude, the CPU stand-in for U = metrics.unimatch.
    Stage(
        "flow",
        run_flow,
        lambda c: (
            "2/" + _libs("opencv") + (f"/unimatch:{Path(c.unimatch_checkpoint).name}" if c.unimatch_checkpoint else "")
        ),
        {"metrics.flow_dis": NUMBER, "metrics.unimatch": NUMBER},
        options=(
            Option(
                "unimatch_checkpoint",
                str | None,
                None,
                "local UniMatch/GMFlow checkpoint; adds metrics.unimatch to the flow stage.",
            ),
        ),
        check=check_flow,
    ),
    Stage(
        "dover",
        run_dover,
        lambda c: "1" + (f"/dover:{Path(c.dover_checkpoint).name}" if c.dover_checkpoint else ""),
        {"metrics.dover_tech": NUMBER, "metrics.dover_aes": NUMBER},  # D = their mean
        options=(
            Option("dover_checkpoint", str | None, None, "local DOVER weights (DOVER.pth); enables the dover stage."),
            Option(
                "dover_options", str | None, None, "DOVER's option file (dover.yml), required with dover_checkpoint."
            ),
        ),
        check=check_dover,
        enabled_by_default=lambda c: bool(c.dover_checkpoint),
    ),
    Stage(
        "vlm",
        run_vlm,
        lambda c: "1" + (f"/{c.vlm_model or ''}" if c.vlm_endpoint else ""),
        _VLM_KEYS,
        options=(
            Option(
                "vlm_endpoint",
                str | None,
                None,
                "OpenAI-compatible base URL (POST {endpoint}/chat/completions); enables the vlm stage.",
            ),
            Option("vlm_model", str | None, None, "model name sent to the endpoint."),
            Option(
                "vlm_api_key_env",
                str,
                "SOLARWM_VLM_API_KEY",
                "environment variable holding the API key (the key is never written anywhere).",
            ),
            Option("vlm_max_retries", int, 2, "re-asks after an invalid reply, with the validation error fed back."),
        ),
        check=check_vlm,
        enabled_by_default=lambda c: bool(c.vlm_endpoint),
    ),
):
    register_stage(_stage)
