"""Derived owners (paper §5, reference §11): ``solarwm data derive --transform clean-plate``.

A Clean Plate clip is a parent clip re-rendered by the LTX-2.3 Clean Plate IC-LoRA (people and
clutter removed, camera path unchanged). Lineage, per derived clip, in ``provenance.lineage``:
the parent clip id and owner, the parent frame interval ``[start, end)``, the parent size and
tier. Geometry is the parent's, sliced: poses unchanged, intrinsics resized to the new frame
size with ``resize_intrinsics`` (the factors are recorded in ``provenance.conversions``). No
metric and no caption is copied: the derived clip is annotated like any other clip
(``solarwm data annotate``). A parent whose metric scale cannot be carried over (``pose_units``
relative) fails closed with a named reason. Every eligible parent (a Clean Plate source owner)
ends as a derived clip or as a failed clip record in ``OUT`` (``meta.json`` only,
``provenance.stages.derive`` failed with the reason), so ``accounting.account(OUT)`` counts it;
other parents are only listed in the ledger. A rerun skips what is derived and retries failures.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import cv2
import numpy as np

from solarwm.camera.intrinsics import resize_intrinsics
from solarwm.data.accounting import failed_stages
from solarwm.data.contract import (
    FILES,
    Clip,
    ClipError,
    clip_id,
    iter_clip_dirs,
    pose_units,
    read_clip,
    read_meta,
    write_clip,
    write_failed_clip,
)
from solarwm.data.executor import map_tasks

# Source owner -> derived owner (the policy's owner ids; the official corpus folders spell them
# miradata-clean, sekai_walking-clean, spatialvid-clean).
CLEAN_OF = {"miradata": "miradata_clean", "sekai_walking": "sekai_walking_clean", "spatialvid": "spatialvid_clean"}
FPS = 16.0
OUTPUT_SIZE = (1280, 720)  # W, H
MODEL_SIZE = (1248, 704)  # W, H the IC-LoRA runs at
MODEL_FPS = 24.0
# The IC-LoRA runs on the distilled LTX-2.3: 8 steps on diffusers' DISTILLED_SIGMA_VALUES, no
# guidance; reference conditioning and LoRA scale both 1.0 (the official `--lora F 1.0
# --video-conditioning V 1.0`).
STEPS, STRENGTH, SEED = 8, 1.0, 42
LEDGER = "derive_ledger.jsonl"
DERIVE_VERSION = "solarwm-derive/1"

# A transform maps parent frames uint8 [T, H, W, 3] at 16 fps and the parent caption to the
# derived frames uint8 [T, 720, 1280, 3] at 16 fps.
Transform = Callable[[np.ndarray, str], np.ndarray]


class DeriveError(RuntimeError):
    """One parent cannot be derived; ``reason`` is the recorded failure reason."""

    def __init__(self, reason: str, detail: str):
        self.reason, self.detail = reason, detail
        super().__init__(f"{reason}: {detail}")


def slice_plan(n: int) -> tuple[int, int] | None:
    """Parent frames used: the first 160 if there are that many, else a centred 81, else none."""
    if n >= 160:
        return 0, 160
    if n >= 81:
        start = (n - 81) // 2
        return start, start + 81
    return None


def resample_indices(n_out: int, fps_in: float, fps_out: float, n_in: int) -> np.ndarray:
    """Nearest source frame for each of ``n_out`` output frames when changing rate ``fps_in`` → ``fps_out``."""
    return np.minimum(np.round(np.arange(n_out) * fps_in / fps_out).astype(int), n_in - 1)


def resize_frames(frames: np.ndarray, width: int, height: int) -> np.ndarray:
    """Lanczos resize of uint8 ``[T, H, W, 3]`` to ``[T, height, width, 3]``."""
    return np.stack([cv2.resize(f, (width, height), interpolation=cv2.INTER_LANCZOS4) for f in frames])


def model_frames(n: int) -> int:
    """LTX frame count (8k + 1 at 24 fps) whose span covers ``n`` frames at 16 fps: 81 -> 121, 160 -> 241."""
    return 8 * int(np.ceil((n - 1) * MODEL_FPS / FPS / 8)) + 1


@dataclass
class CleanPlate:
    """The LTX-2.3 Clean Plate IC-LoRA through diffusers' ``LTX2InContextPipeline``, from local weights.

    ``pipeline`` is a built pipeline with the IC-LoRA loaded (``from_local`` loads both). A call
    resamples the parent to 24 fps and ``model_size``, runs 8 distilled steps with the parent as
    the reference video (strength 1.0, seed 42), and returns ``output_size`` frames at 16 fps.
    The sizes default to the published 1248×704 in, 1280×720 out; tests pass tiny ones.
    """

    pipeline: Any
    device: str = "cpu"
    model_size: tuple[int, int] = MODEL_SIZE  # W, H; multiples of 32
    output_size: tuple[int, int] = OUTPUT_SIZE  # W, H
    #: Reference resolution divisor stored in the IC-LoRA's safetensors metadata (1: same as the model).
    reference_downscale_factor: int = 1
    lora_name: str = ""

    @classmethod
    def from_local(
        cls, weights: str | Path, lora: str | Path | None = None, device: str = "cpu",
        model_size: tuple[int, int] = MODEL_SIZE, output_size: tuple[int, int] = OUTPUT_SIZE,
    ) -> "CleanPlate":
        """Load a diffusers LTX-2.3 folder (``model_index.json``) and the Clean Plate IC-LoRA safetensors."""
        import torch
        from diffusers import LTX2InContextPipeline
        from safetensors import safe_open

        weights = Path(weights)
        if not (weights / "model_index.json").is_file():
            raise DeriveError("clean_plate_unavailable", f"{weights}: no diffusers model_index.json (LTX-2.3 weights)")
        lora = Path(lora) if lora else next(iter(sorted(weights.glob("*clean*plate*.safetensors"))), None)
        if lora is None or not lora.is_file() or lora.suffix != ".safetensors":
            raise DeriveError(
                "clean_plate_unavailable", f"Clean Plate IC-LoRA safetensors not found ({lora or weights})"
            )
        with safe_open(str(lora), framework="pt") as f:
            factor = int((f.metadata() or {}).get("reference_downscale_factor", 1))
        dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
        pipe = LTX2InContextPipeline.from_pretrained(str(weights), dtype=dtype, use_safetensors=True)
        pipe.load_lora_weights(str(lora.parent), weight_name=lora.name, adapter_name="clean_plate")
        pipe.set_adapters("clean_plate", STRENGTH)
        pipe.set_progress_bar_config(disable=True)
        return cls(pipe.to(device), device, tuple(model_size), tuple(output_size), factor, lora.name)

    def versions(self, n: int) -> dict[str, Any]:
        """What produced a derived clip of ``n`` frames (recorded in ``provenance.versions``)."""
        return {
            "transform": "ltx2.3-clean-plate-ic-lora",
            "lora": self.lora_name,
            "steps": STEPS,
            "strength": STRENGTH,
            "seed": SEED,
            "model_size": list(self.model_size),
            "model_fps": MODEL_FPS,
            "model_frames": model_frames(n),
            "reference_downscale_factor": self.reference_downscale_factor,
        }

    def __call__(self, frames: np.ndarray, caption: str) -> np.ndarray:
        """Parent frames uint8 ``[T, H, W, 3]`` at 16 fps → Clean Plate frames uint8 ``[T, h, w, 3]`` at 16 fps.

        ``(w, h)`` is ``output_size``.
        """
        import torch
        from diffusers.pipelines.ltx2.pipeline_ltx2_ic_lora import LTX2ReferenceCondition
        from diffusers.pipelines.ltx2.utils import DISTILLED_SIGMA_VALUES

        t = len(frames)
        n_model = model_frames(t)
        w, h = self.model_size
        d = self.reference_downscale_factor
        ref = resize_frames(frames[resample_indices(n_model, FPS, MODEL_FPS, t)], w // d, h // d)
        out = self.pipeline(
            prompt=caption or "",
            # diffusers reads numpy video as float in [0, 1], [F, H, W, 3].
            reference_conditions=[LTX2ReferenceCondition(frames=ref.astype(np.float32) / 255.0, strength=STRENGTH)],
            reference_downscale_factor=d,
            width=w,
            height=h,
            num_frames=n_model,
            frame_rate=MODEL_FPS,
            num_inference_steps=STEPS,
            sigmas=list(DISTILLED_SIGMA_VALUES),
            guidance_scale=1.0,
            stg_scale=0.0,
            audio_stg_scale=0.0,
            modality_scale=1.0,
            audio_modality_scale=1.0,
            guidance_rescale=0.0,
            audio_guidance_rescale=0.0,
            generator=torch.Generator(device="cpu").manual_seed(SEED),
            output_type="np",
        ).frames[0]  # [F, h, w, 3] float in [0, 1]
        video = (np.clip(np.asarray(out, dtype=np.float32), 0, 1) * 255).round().astype(np.uint8)
        if video.shape != (n_model, h, w, 3):
            raise DeriveError(
                "transform_output", f"pipeline returned {list(video.shape)}, expected {[n_model, h, w, 3]}"
            )
        return resize_frames(video[resample_indices(t, MODEL_FPS, FPS, len(video))], *self.output_size)


def _versions(transform: Transform, n: int) -> dict[str, Any]:
    """``transform.versions(n)`` when it has one, else its name."""
    if hasattr(transform, "versions"):
        return transform.versions(n)
    return {"transform": getattr(transform, "__name__", type(transform).__name__)}


def _is_derived(folder: Path) -> bool:
    """True when ``folder`` holds a complete derived clip (not a failed record)."""
    if not all((folder / name).is_file() for name in FILES):
        return False
    try:
        return not failed_stages(read_meta(folder))
    except ClipError:
        return False


def derive_clip(parent_dir: Path, out: Path, transform: Transform) -> dict[str, Any]:
    """Derive one parent clip folder into ``out``; returns the ledger record (never raises for bad parents).

    A failure of an eligible parent (a Clean Plate source owner) is also written to ``out`` as a
    failed clip record; a parent of another owner, or one whose meta.json is unreadable, is only
    in the ledger (status ``skipped`` / ``failed``).
    """
    record: dict[str, Any] = {"parent": parent_dir.name}
    try:
        doc = read_meta(parent_dir)
    except ClipError as e:
        return {**record, "status": "failed", "reason": "parent_unreadable", "detail": str(e)}
    prov = doc.get("provenance", {})
    owner = prov.get("owner")
    if owner not in CLEAN_OF:
        return {
            **record,
            "status": "skipped",
            "reason": "not_a_clean_plate_source",
            "detail": f"owner {owner!r}; clean-plate derives {sorted(CLEAN_OF)}",
        }
    meta = doc.get("meta", {})
    parent_id = doc.get("clip_id", parent_dir.name)
    plan = slice_plan(int(meta.get("num_frames") or 0))
    start, end = plan or (0, 0)  # a parent too short to slice fails with the interval [0, 0)
    cid = record["clip"] = clip_id(CLEAN_OF[owner], parent_id, start, end)
    lineage = {"parent_clip_id": parent_id, "parent_owner": owner, "parent_interval": [start, end]}
    provenance = {
        "owner": CLEAN_OF[owner],
        "original_id": prov.get("original_id", parent_id),
        "frame_interval": [start, end],
        "lineage": lineage,
    }
    try:
        if pose_units(meta) != "metric":
            raise DeriveError("metric_scale_unrecoverable", f"parent pose_units is {meta['pose_units']!r}, not metric")
        if float(meta.get("fps", 0)) != FPS:
            raise DeriveError("parent_fps", f"parent is {meta.get('fps')} fps, Clean Plate needs {FPS:g}")
        w, h = int(meta["width"]), int(meta["height"])
        if w < h:
            raise DeriveError("parent_not_landscape", f"{w}x{h}")
        if plan is None:
            raise DeriveError("parent_too_short", f"{meta.get('num_frames')} frames < 81")
        if _is_derived(out / cid):
            return {**record, "status": "cached"}
        parent = read_clip(parent_dir)
        try:
            frames = transform(parent.frames[start:end], parent.caption)
        except DeriveError:
            raise
        except (RuntimeError, ValueError) as e:  # the model's own errors (shapes, memory) fail this parent only
            raise DeriveError("transform_failed", f"{type(e).__name__}: {e}") from None
        if frames.ndim != 4 or frames.shape[0] != end - start or frames.dtype != np.uint8:
            raise DeriveError("transform_output", f"got {frames.dtype} {list(frames.shape)} for {end - start} frames")
        ow, oh = frames.shape[2], frames.shape[1]
        sx, sy = ow / w, oh / h
        lineage.update(source_width=w, source_height=h, geometry_ok=True)
        tier = (doc.get("selection") or {}).get("tier")
        if tier is not None:
            lineage["source_tier"] = tier
        provenance.update(
            conversions=[
                {"name": "slice_parent", "version": "1", "interval": [start, end]},
                {"name": "resize_intrinsics", "version": "1", "scale": [sx, sy]},
            ],
            versions=_versions(transform, end - start),
            stages={"derive": {"status": "ok", "version": DERIVE_VERSION}},
        )
        clip = Clip(
            cid,
            frames,
            parent.c2w[start:end].copy(),
            resize_intrinsics(parent.K[start:end], sx, sy),
            caption="",
            meta={"fps": FPS, "pose_units": "metric"},
            provenance=provenance,
        )
        write_clip(clip, out)
        record["status"] = "derived"
    except DeriveError as e:
        record.update(status="failed", reason=e.reason, detail=e.detail)
    except (ClipError, KeyError, ValueError, OSError) as e:
        record.update(status="failed", reason="parent_unreadable", detail=f"{type(e).__name__}: {e}")
    if record["status"] == "failed":
        write_failed_clip(out, cid, "derive", DERIVE_VERSION, f"{record['reason']}: {record['detail']}", provenance)
    return record


def derive_corpus(corpus: str | Path, out: str | Path, transform: Transform) -> dict[str, Any]:
    """Derive every parent of ``corpus`` into ``out``; appends to ``out/derive_ledger.jsonl``; returns the summary.

    ``eligible`` parents (of a Clean Plate source owner; each has a ``clip`` id in the ledger) end
    derived, cached or failed with a failed clip record in ``out``; ``skipped`` parents are of
    other owners; a parent whose meta.json cannot be read fails in the ledger only.
    Runs in this process: the transform holds one model, loaded once.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    parents = iter_clip_dirs(corpus)
    records = []
    for i, rec in map_tasks(lambda p: derive_clip(p, out, transform), parents, workers=1, desc="derive"):
        if isinstance(rec, BaseException):
            rec = {"parent": parents[i].name, "status": "failed", "reason": "worker", "detail": repr(rec)}
        records.append(rec)
    with open(out / LEDGER, "a") as f:
        for rec in records:
            f.write(json.dumps(rec, sort_keys=True) + "\n")
    counts = {s: sum(r["status"] == s for r in records) for s in ("derived", "cached", "failed", "skipped")}
    line = (
        f"parents {len(records)} = derived {counts['derived']} + already derived {counts['cached']}"
        f" + failed {counts['failed']} + not a Clean Plate source {counts['skipped']}"
    )
    eligible = sum("clip" in r for r in records)
    return {
        "command": "derive",
        "parents": len(records),
        "eligible": eligible,
        **counts,
        "line": line,
        "failed_parents": [r for r in records if r["status"] == "failed"],
    }


def derive_command(
    corpus: str,
    out: str,
    transform: str = "clean-plate",
    weights: str | None = None,
    lora: str | None = None,
    device: str = "cpu",
) -> int:
    """Derive a new owner's clips from a corpus (Clean Plate: miradata, sekai_walking, spatialvid parents).

    Args:
        corpus: corpus folder of parent clips.
        out: corpus folder for the derived clips (created; reruns skip what is derived).
        transform: the derivation; only ``clean-plate`` (LTX-2.3 Clean Plate IC-LoRA).
        weights: local diffusers LTX-2.3 folder (with model_index.json).
        lora: the Clean Plate IC-LoRA .safetensors (default: *clean*plate*.safetensors in weights).
        device: torch device.
    """
    from solarwm.util.errors import print_error

    if transform != "clean-plate":
        return print_error("data derive", f"unknown transform {transform!r}; known: clean-plate")
    if weights is None:
        weights = os.environ.get("SOLARWM_CLEAN_PLATE_WEIGHTS")
    if not weights:
        return print_error(
            "data derive", "clean_plate_unavailable: pass --weights DIR (a local diffusers LTX-2.3 folder)"
        )
    try:
        model = CleanPlate.from_local(weights, lora, device)
        summary = derive_corpus(corpus, out, model)
    except (DeriveError, FileNotFoundError) as e:
        return print_error("data derive", e)
    print(summary["line"], file=sys.stderr)
    print(json.dumps(summary, indent=1))
    return 0
