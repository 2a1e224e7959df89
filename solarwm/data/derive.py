"""Derived owners (paper §5, reference §11): ``solarwm data derive --transform clean-plate``.

A Clean Plate clip is a parent clip re-rendered by the LTX-2.3 Clean Plate IC-LoRA (people and
clutter removed, camera path unchanged). Lineage, per derived clip, in ``provenance.lineage``:
the parent clip id and owner, the parent frame interval ``[start, end)``, the parent size and
tier. Geometry is the parent's, sliced: poses unchanged, intrinsics resized to the new frame
size with ``resize_intrinsics`` (the factors are recorded in ``provenance.conversions``). No
metric and no caption is copied: the derived clip is annotated like any other clip
(``solarwm data annotate``). A parent whose metric scale cannot be carried over (``pose_units``
relative) fails closed with a named reason; every parent is accounted for (derived + failed),
and a rerun skips what is already derived.
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
from solarwm.data.contract import Clip, ClipError, clip_id, iter_clip_dirs, pose_units, read_clip, read_meta, write_clip
from solarwm.data.executor import map_tasks

# Source owner -> derived owner (the policy's owner ids; the official corpus folders spell them
# miradata-clean, sekai_walking-clean, spatialvid-clean).
CLEAN_OF = {"miradata": "miradata_clean", "sekai_walking": "sekai_walking_clean", "spatialvid": "spatialvid_clean"}
FPS = 16.0
OUTPUT_SIZE = (1280, 720)  # W, H
MODEL_SIZE = (1248, 704)  # W, H the IC-LoRA runs at
MODEL_FPS = 24.0
STEPS, STRENGTH, SEED = 8, 1.0, 42
LEDGER = "derive_ledger.jsonl"

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


@dataclass
class CleanPlate:
    """The LTX-2.3 Clean Plate IC-LoRA through diffusers' ``LTX2InContextPipeline``, from local weights.

    ``pipeline`` is a built pipeline (``from_local`` loads one); the call runs the model at
    1248×704, 24 fps, 8 steps, reference strength 1.0, seed 42, and returns 1280×720 at 16 fps.
    """

    pipeline: Any
    device: str = "cpu"
    model_size: tuple[int, int] = MODEL_SIZE
    output_size: tuple[int, int] = OUTPUT_SIZE
    steps: int = STEPS

    @classmethod
    def from_local(cls, weights: str | Path, lora: str | Path | None = None, device: str = "cpu") -> "CleanPlate":
        """Load a diffusers LTX-2.3 folder (``model_index.json``) and the Clean Plate IC-LoRA safetensors."""
        import torch
        from diffusers import LTX2InContextPipeline

        weights = Path(weights)
        if not (weights / "model_index.json").is_file():
            raise DeriveError("clean_plate_unavailable", f"{weights}: no diffusers model_index.json (LTX-2.3 weights)")
        lora = Path(lora) if lora else next(iter(sorted(weights.glob("*clean*plate*.safetensors"))), None)
        if lora is None or not lora.is_file() or lora.suffix != ".safetensors":
            raise DeriveError("clean_plate_unavailable", f"Clean Plate IC-LoRA safetensors not found ({lora or weights})")
        dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
        pipe = LTX2InContextPipeline.from_pretrained(str(weights), torch_dtype=dtype, use_safetensors=True)
        pipe.load_lora_weights(str(lora.parent), weight_name=lora.name, adapter_name="clean_plate")
        return cls(pipe.to(device), device)

    def __call__(self, frames: np.ndarray, caption: str) -> np.ndarray:
        """Parent frames ``[T, H, W, 3]`` at 16 fps → Clean Plate frames ``[T, 720, 1280, 3]`` at 16 fps."""
        import torch
        from diffusers.pipelines.ltx2.pipeline_ltx2_ic_lora import LTX2ReferenceCondition

        t = len(frames)
        n_model = 8 * int(np.ceil((t / FPS * MODEL_FPS) / 8)) + 1  # LTX frame counts are 8k + 1 (160 -> 241, 81 -> 129)
        ref = resize_frames(frames[resample_indices(n_model, FPS, MODEL_FPS, t)], *self.model_size)
        w, h = self.model_size
        out = self.pipeline(
            prompt=caption or "", reference_conditions=[LTX2ReferenceCondition(frames=ref, strength=STRENGTH)],
            width=w, height=h, num_frames=n_model, frame_rate=MODEL_FPS, num_inference_steps=self.steps,
            generator=torch.Generator(device="cpu").manual_seed(SEED), output_type="np",
        ).frames[0]
        video = (np.clip(np.asarray(out, dtype=np.float32), 0, 1) * 255).round().astype(np.uint8)
        return resize_frames(video[resample_indices(t, MODEL_FPS, FPS, len(video))], *self.output_size)


def derive_clip(parent_dir: Path, out: Path, transform: Transform) -> dict[str, Any]:
    """Derive one parent clip folder into ``out``; returns the ledger record (never raises for bad parents)."""
    record: dict[str, Any] = {"parent": parent_dir.name}
    try:
        doc = read_meta(parent_dir)
        prov = doc.get("provenance", {})
        owner = prov.get("owner")
        if owner not in CLEAN_OF:
            raise DeriveError("not_a_clean_plate_source", f"owner {owner!r}; clean-plate derives {sorted(CLEAN_OF)}")
        meta = doc["meta"]
        if pose_units(meta) != "metric":
            raise DeriveError("metric_scale_unrecoverable", f"parent pose_units is {meta['pose_units']!r}, not metric")
        if float(meta.get("fps", 0)) != FPS:
            raise DeriveError("parent_fps", f"parent is {meta.get('fps')} fps, Clean Plate needs {FPS:g}")
        w, h, n = int(meta["width"]), int(meta["height"]), int(meta["num_frames"])
        if w < h:
            raise DeriveError("parent_not_landscape", f"{w}x{h}")
        plan = slice_plan(n)
        if plan is None:
            raise DeriveError("parent_too_short", f"{n} frames < 81")
        start, end = plan
        owner_out = CLEAN_OF[owner]
        cid = clip_id(owner_out, doc["clip_id"], start, end)
        record["clip"] = cid
        if (out / cid / "meta.json").is_file():
            record["status"] = "cached"
            return record
        parent = read_clip(parent_dir)
        frames = transform(parent.frames[start:end], parent.caption)
        if frames.shape[0] != end - start or frames.dtype != np.uint8:
            raise DeriveError("transform_output", f"got {frames.dtype} {list(frames.shape)} for {end - start} frames")
        ow, oh = frames.shape[2], frames.shape[1]
        sx, sy = ow / w, oh / h
        lineage = {
            "parent_clip_id": doc["clip_id"], "parent_owner": owner, "parent_interval": [start, end],
            "source_width": w, "source_height": h, "geometry_ok": True,
        }
        tier = (doc.get("selection") or {}).get("tier")
        if tier is not None:
            lineage["source_tier"] = tier
        provenance = {
            "owner": owner_out, "original_id": prov.get("original_id", doc["clip_id"]),
            "frame_interval": [start, end], "lineage": lineage,
            "conversions": [{"name": "slice_parent", "version": "1", "interval": [start, end]},
                            {"name": "resize_intrinsics", "version": "1", "scale": [sx, sy]}],
            "versions": {"transform": "ltx2.3-clean-plate-ic-lora", "steps": STEPS, "strength": STRENGTH,
                         "model_size": list(MODEL_SIZE), "seed": SEED},
        }
        clip = Clip(cid, frames, parent.c2w[start:end].copy(), resize_intrinsics(parent.K[start:end], sx, sy),
                    caption="", meta={"fps": FPS, "pose_units": "metric"}, provenance=provenance)
        write_clip(clip, out)
        record["status"] = "derived"
    except DeriveError as e:
        record.update(status="failed", reason=e.reason, detail=e.detail)
    except (ClipError, KeyError, ValueError, OSError) as e:
        record.update(status="failed", reason="parent_unreadable", detail=str(e))
    return record


def derive_corpus(corpus: str | Path, out: str | Path, transform: Transform) -> dict[str, Any]:
    """Derive every parent of ``corpus`` into ``out``; appends to ``out/derive_ledger.jsonl``; returns the summary.

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
    counts = {s: sum(r["status"] == s for r in records) for s in ("derived", "cached", "failed")}
    line = (f"parents {len(records)} = derived {counts['derived']} + already derived {counts['cached']}"
            f" + failed {counts['failed']}")
    return {"command": "derive", "parents": len(records), **counts, "line": line,
            "failed_parents": [r for r in records if r["status"] == "failed"]}


def derive_command(
    corpus: str, out: str, transform: str = "clean-plate", weights: str | None = None, lora: str | None = None,
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
    if transform != "clean-plate":
        print(f"derive: unknown transform {transform!r}; known: clean-plate", file=sys.stderr)
        return 2
    if weights is None:
        weights = os.environ.get("SOLARWM_CLEAN_PLATE_WEIGHTS")
    if not weights:
        print("derive: clean_plate_unavailable: pass --weights DIR (a local diffusers LTX-2.3 folder)", file=sys.stderr)
        return 2
    try:
        model = CleanPlate.from_local(weights, lora, device)
        summary = derive_corpus(corpus, out, model)
    except (DeriveError, FileNotFoundError) as e:
        print(f"derive: {e}", file=sys.stderr)
        return 2
    print(summary["line"], file=sys.stderr)
    print(json.dumps(summary, indent=1))
    return 0
