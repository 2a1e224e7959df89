"""The latent-cache model view (paper §5.1): a recipe's windows encoded once by one route's codec and text encoder.

"Changing a VAE does not alter the underlying data selection": the recipe (which windows, how often)
stays the same; a view is a derived copy of its windows in one codec's latent space, so training
skips video decode and ``encode``. A view made for another route or codec is refused by name.

Layout under the view folder ``out``::

    shards/latents-NNNNNN.tar   WebDataset samples, members ``<key>.<ext>``:
                                  latents.safetensors  latents float32 [C, f, h, w]
                                  text.safetensors     text_embeds float32 [L, D], text_mask bool [L]
                                  camera.npz           c2w float32 [F, 4, 4] (the window's frames)
                                  intrinsics.npy       K float32 [F, 4], pixels of the view's width x height
                                  manifest.json        sample id, route, codec hash, caption, source row
    index.jsonl.gz              one row per source recipe row, in the recipe's row format (sample_id, shard,
                                shard_size, epoch_repeats, *_member, ...) plus route, codec_hash and source
    view.json                   route, codec config and its hash, window geometry, source index, failures
    view.journal.json           completed shards (resume state)

A window is exactly what the datamodule would hand the stage for that row (`ClipWindowDataset` with a
fixed start: the row's ``start_frame``, or the centre for rows without one), so a stage sees the same
``latents`` as ``adapter.encode(video)`` of the raw path. ``text_embeds`` is the route's text encoder
output, the batch key every route reads before its own text processing.

Each shard is one task of `solarwm.data.executor.map_tasks` (any executor); the shard plan is fixed by
the source index and ``shard_max_samples``, so a killed run resumes: journaled shards are kept, stray and
partial ones are deleted and rewritten, and the result is byte-identical to an uninterrupted run.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load as load_safetensors
from safetensors.torch import save as save_safetensors

from solarwm.data.executor import map_tasks
from solarwm.data.index import read_index, write_rows
from solarwm.data.release import npy_bytes, npz_bytes, sample_key
from solarwm.datamodules.view_rows import is_view_row, load_view_row, view_tag  # noqa: F401  (the view's row reader)
from solarwm.util.atomic import atomic_write_bytes

VIEW_SCHEMA = "solarwm.latent-view/1"
INDEX_NAME = "index.jsonl.gz"
VIEW_JSON = "view.json"
JOURNAL = "view.journal.json"
MEMBERS: dict[str, str] = {
    "latents_member": "latents.safetensors",
    "text_member": "text.safetensors",
    "camera_member": "camera.npz",
    "intrinsics_member": "intrinsics.npy",
    "manifest_member": "manifest.json",
}
#: Route-config keys that decide what the codec and the text encoder produce (paths excluded: the weights count).
_CODEC_KEYS = ("codec", "patchify_spatial", "vae_config", "text_encoder", "text_max_length", "text_dim")
#: Values sampled per tensor for the weights fingerprint (hashing every byte of a 20 GB text encoder is minutes).
_FINGERPRINT_VALUES = 4096


class LatentViewError(ValueError):
    """A latent view cannot be built, read or used with this model (the message names both sides)."""


@dataclass(frozen=True)
class ViewSpec:
    """How a view is made: the route's adapter and the window geometry of the datamodule."""

    route: str
    preset: str = "tiny"
    pretrained_path: str | None = None
    num_frames: int = 17
    width: int = 64
    height: int = 64
    frame_stride: int = 1
    device: str = "cpu"


# --------------------------------------------------------------------------------------------
# The codec's identity


def _weights_fingerprint(parts: dict[str, torch.nn.Module]) -> str:
    """sha256 over every tensor's name, dtype, shape and an evenly strided sample of its values."""
    h = hashlib.sha256()
    for part, module in parts.items():
        for name, tensor in sorted(chain(module.named_parameters(), module.named_buffers()), key=lambda kv: kv[0]):
            h.update(f"{part}.{name}:{tensor.dtype}:{tuple(tensor.shape)}\n".encode())
            flat = tensor.detach().reshape(-1)
            step = max(1, flat.numel() // _FINGERPRINT_VALUES)
            h.update(flat[::step][:_FINGERPRINT_VALUES].to("cpu", torch.float64).numpy().tobytes())
    return h.hexdigest()


def codec_config(adapter: Any) -> dict[str, Any]:
    """What determines a view's latents and text embeddings: route, codec/text config, latent geometry, weights."""
    parts = {n: getattr(adapter, n) for n in ("codec", "text_encoder") if getattr(adapter, n, None) is not None}
    config = adapter.config_dict()
    return {
        "route": adapter.route,
        "config": {k: config[k] for k in _CODEC_KEYS if k in config},
        "latent": {"channels": int(adapter.latent_channels), "temporal": int(adapter.temporal_compression),
                   "spatial": int(adapter.spatial_compression)},
        "parts": {name: type(module).__name__ for name, module in parts.items()},
        "weights": _weights_fingerprint(parts),
    }


def codec_hash(adapter: Any) -> str:
    """16 hex digits of sha256 over `codec_config` (cached on the adapter: its codec is frozen)."""
    cached = getattr(adapter, "_solarwm_codec_hash", None)
    if cached is None:
        text = json.dumps(codec_config(adapter), sort_keys=True)
        cached = hashlib.sha256(text.encode()).hexdigest()[:16]
        adapter._solarwm_codec_hash = cached
    return cached


def check_view_codec(tags: str | list[str], adapter: Any, where: str = "latent view") -> None:
    """Refuse latents made for another route or codec than ``adapter``'s, naming both."""
    mine = view_tag(adapter.route, codec_hash(adapter))
    for tag in [tags] if isinstance(tags, str) else list(tags):
        if tag != mine:
            route, _, hash_ = tag.partition(":")
            raise LatentViewError(
                f"{where} was made for route {route!r} codec {hash_}; this model is route {adapter.route!r} "
                f"codec {codec_hash(adapter)}: rebuild the view with `solarwm data latents --route {adapter.route}` "
                "and this model's codec settings"
            )


# --------------------------------------------------------------------------------------------
# Encoding (one shard per task)

_ADAPTERS: dict[ViewSpec, Any] = {}  # one adapter per worker process and spec


def build_adapter(spec: ViewSpec) -> Any:
    """The route's adapter for ``spec`` in eval mode on ``spec.device`` (cached per process)."""
    if spec not in _ADAPTERS:
        from solarwm.backbones.base import route_class

        adapter = route_class(spec.route)(preset=spec.preset, pretrained_path=spec.pretrained_path)
        _ADAPTERS[spec] = adapter.to(spec.device).eval()
    return _ADAPTERS[spec]


def _window_dataset(rows: list[dict], root: str, spec: ViewSpec) -> Any:
    from solarwm.datamodules.clips import ClipWindowDataset, Row

    window_rows = []
    for r in rows:  # as WorldDataModule reads a recipe index: a window row starts at 0 of its window
        windowed = "window_frames" in r
        window_rows.append(
            Row(
                sample_id=r["sample_id"],
                num_frames=int(r["window_frames"] if windowed else r["num_frames"]),
                start_frame=0 if windowed else r.get("start_frame"),
                index_row=r,
            )
        )
    return ClipWindowDataset(
        window_rows, spec.num_frames, spec.width, spec.height, spec.frame_stride, random_start=False, release_root=root
    )


@torch.no_grad()
def _encode_sample(adapter: Any, item: dict[str, Any], device: str) -> dict[str, bytes]:
    """One window → its tar members (latents, text, cameras, intrinsics)."""
    if adapter.text_encoder is None:
        raise LatentViewError(
            f"route {adapter.route!r} has no text encoder (text_encoder='none'): nothing to cache text with"
        )
    latents = adapter.encode(item["video"][None].to(device)).float()[0].cpu().contiguous()
    embeds, mask = adapter.text_encoder([item["caption"]])
    text = {"text_embeds": embeds[0].float().cpu().contiguous(), "text_mask": mask[0].bool().cpu().contiguous()}
    return {
        "latents.safetensors": save_safetensors({"latents": latents}),
        "text.safetensors": save_safetensors(text),
        "camera.npz": npz_bytes(c2w=item["c2w"].numpy().astype(np.float32)),
        "intrinsics.npy": npy_bytes(item["K"].numpy().astype(np.float32)),
    }


def _write_samples(
    writer: Any,
    adapter: Any,
    dataset: Any,
    rows: list[dict],
    spec: ViewSpec,
    hash_: str,
    index_rows: list[dict],
    failed: list[dict],
) -> None:
    """Encode ``rows`` into ``writer``; append each one's index row (without shard fields) or its failure."""
    for i, src in enumerate(rows):
        try:
            item = dataset[i]
            members = _encode_sample(adapter, item, spec.device)
        except (ValueError, OSError, KeyError) as e:  # a bad row fails alone, with its reason
            failed.append({"sample_id": src["sample_id"], "error": f"{type(e).__name__}: {e}"})
            continue
        key = sample_key(src["sample_id"])
        manifest = {
            "schema": VIEW_SCHEMA,
            "sample_id": src["sample_id"],
            "route": spec.route,
            "codec_hash": hash_,
            "caption": item["caption"],
            "source": src,
        }
        members["manifest.json"] = (json.dumps(manifest, sort_keys=True, ensure_ascii=False) + "\n").encode("utf-8")
        writer.write({"__key__": key, **members})
        latent_shape = list(load_safetensors(members["latents.safetensors"])["latents"].shape)
        index_rows.append(
            {
                "sample_id": src["sample_id"],
                "key": key,
                "epoch_repeats": int(src.get("epoch_repeats", 1)),
                "dataset": src.get("dataset"),
                "kept_tier": src.get("kept_tier"),
                "caption": item["caption"],
                "num_frames": spec.num_frames,
                "width": spec.width,
                "height": spec.height,
                "frame_stride": spec.frame_stride,
                "latent_shape": latent_shape,
                "route": spec.route,
                "codec_hash": hash_,
                "source": src,
                **{field: f"{key}.{ext}" for field, ext in MEMBERS.items()},
            }
        )


def _encode_shard(task: tuple[str, str, str, list[dict], ViewSpec, str]) -> dict[str, Any]:
    """Encode one shard's rows and write ``shards/<name>`` atomically; returns its journal record."""
    from webdataset import TarWriter

    out, name, root, rows, spec, hash_ = task
    adapter = build_adapter(spec)
    if codec_hash(adapter) != hash_:  # a worker that resolved other weights must not mix codecs
        raise LatentViewError(f"worker built codec {codec_hash(adapter)}, the view is codec {hash_}")
    dataset = _window_dataset(rows, root, spec)
    shard_dir = Path(out) / "shards"
    shard_dir.mkdir(parents=True, exist_ok=True)
    partial = shard_dir / f"{name}.partial"
    index_rows, failed = [], []
    with open(partial, "wb") as fh:
        # mtime fixed and encoder off: members are bytes, and reruns must be byte-identical
        writer = TarWriter(fh, encoder=False, mtime=0, user="solarwm", group="solarwm", mode=0o444)
        try:
            _write_samples(writer, adapter, dataset, rows, spec, hash_, index_rows, failed)
        finally:  # a killed shard stays .partial, deleted and rewritten by the next run
            writer.close()
        fh.flush()
        os.fsync(fh.fileno())
    final = shard_dir / name
    os.replace(partial, final)
    size = final.stat().st_size
    shard = f"shards/{name}"
    for row in index_rows:
        row.update(shard=shard, shard_size=size)
    return {"name": name, "size": size, "rows": index_rows, "failed": failed}


# --------------------------------------------------------------------------------------------
# Building a view


def _settings(spec: ViewSpec, rows: list[dict], shard_max_samples: int) -> dict[str, Any]:
    """What fixes the shard plan and its contents; a resumed run must match it."""
    ids = hashlib.sha256("\n".join(r["sample_id"] for r in rows).encode()).hexdigest()[:16]
    spec_dict = {k: v for k, v in dataclasses.asdict(spec).items() if k != "device"}
    return {**spec_dict, "shard_max_samples": shard_max_samples, "source_rows": len(rows), "source_ids": ids}


def build_view(
    index: str,
    root: str,
    out: str,
    spec: ViewSpec,
    shard_max_samples: int = 256,
    workers: int = 1,
    executor: str = "process",
    ray_address: str | None = None,
) -> dict[str, Any]:
    """Encode every row of the recipe index ``index`` (paths under ``root``) into a view at ``out``; resumable."""
    if shard_max_samples < 1:
        raise LatentViewError("shard_max_samples must be >= 1")
    rows = read_index(index, root)
    keys: dict[str, str] = {}
    for r in rows:
        key = sample_key(r["sample_id"])
        if key in keys:
            raise LatentViewError(f"key collision: sample ids {keys[key]!r} and {r['sample_id']!r} both map to {key!r}")
        keys[key] = r["sample_id"]
    adapter = build_adapter(spec)
    from solarwm.datamodules.clips import ClipWindowDataset  # noqa: F401  (fail here, not in every task)

    if adapter.text_encoder is None:
        raise LatentViewError(
            f"route {spec.route!r} has no text encoder (text_encoder='none'): nothing to cache text with"
        )
    if not adapter.valid_num_frames(spec.num_frames):
        raise LatentViewError(f"num_frames={spec.num_frames} is not a valid clip length for route {spec.route!r}")
    hash_ = codec_hash(adapter)
    settings = _settings(spec, rows, shard_max_samples)
    out_path = Path(out)
    journal_path = out_path / JOURNAL
    journal = json.loads(journal_path.read_text()) if journal_path.exists() else None
    if journal is not None and (journal["settings"] != settings or journal["codec_hash"] != hash_):
        raise LatentViewError(
            f"{out_path} holds a view made with {journal['settings']} codec {journal['codec_hash']}; this command "
            f"asks for {settings} codec {hash_}: write the view into a fresh folder"
        )
    shards: dict[str, dict] = {s["name"]: s for s in (journal or {}).get("shards", [])}
    for name, s in shards.items():
        path = out_path / "shards" / name
        if not path.is_file() or path.stat().st_size != s["size"]:
            raise LatentViewError(
                f"{path}: journaled shard is missing or changed size; write the view into a fresh folder"
            )
    removed = []
    for path in sorted((out_path / "shards").glob("*")) if (out_path / "shards").is_dir() else []:
        if path.name not in shards:  # a .partial from a kill, or a shard finished just before its journal write
            path.unlink()
            removed.append(path.name)

    plan = [
        (f"latents-{n:06d}.tar", rows[start : start + shard_max_samples])
        for n, start in enumerate(range(0, len(rows), shard_max_samples))
    ]
    tasks = [(str(out_path), name, str(root), chunk, spec, hash_) for name, chunk in plan if name not in shards]

    def save_journal() -> None:
        doc = {
            "schema": VIEW_SCHEMA,
            "settings": settings,
            "codec_hash": hash_,
            "shards": [shards[n] for n in sorted(shards)],
        }
        atomic_write_bytes(journal_path, (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode("utf-8"))

    out_path.mkdir(parents=True, exist_ok=True)
    errors = []
    for i, result in map_tasks(
        _encode_shard, tasks, executor, workers, desc="latents", unit="shard", ray_address=ray_address
    ):
        if isinstance(result, BaseException):
            errors.append(result)
            continue
        shards[result["name"]] = result
        save_journal()
    if errors:  # finished shards are journaled; a rerun does the rest
        raise errors[0]
    if journal is None and not tasks:
        save_journal()  # an empty index still gets its journal

    view_rows = [row for name in sorted(shards) for row in shards[name]["rows"]]
    failed = [f for name in sorted(shards) for f in shards[name]["failed"]]
    index_path = out_path / INDEX_NAME
    if not index_path.exists() or _read_rows(index_path) != view_rows:  # a finished view reruns as a no-op
        write_rows(index_path, view_rows)
    summary = {
        "schema": VIEW_SCHEMA,
        "index": INDEX_NAME,
        "route": spec.route,
        "codec": codec_config(adapter),
        "codec_hash": hash_,
        "num_frames": spec.num_frames,
        "width": spec.width,
        "height": spec.height,
        "frame_stride": spec.frame_stride,
        "source_index": str(index),
        "source_rows": len(rows),
        "rows": len(view_rows),
        "shards": len(shards),
        "failed": failed,
        "accounting": f"source rows {len(rows)} = encoded {len(view_rows)} + failed {len(failed)}",
    }
    data = (json.dumps(summary, indent=1, sort_keys=True) + "\n").encode("utf-8")
    view_json = out_path / VIEW_JSON
    if not view_json.exists() or view_json.read_bytes() != data:
        atomic_write_bytes(view_json, data)
    return {**summary, "removed_stray": removed, "written_shards": len(tasks)}


def _read_rows(path: Path) -> list[dict]:
    from solarwm.data.index import read_rows

    return read_rows(path)


# --------------------------------------------------------------------------------------------
# Reading a view


def read_view(view: str | Path) -> tuple[dict[str, Any], list[dict]]:
    """``(view.json, validated index rows)`` of a view folder."""
    view = Path(view)
    meta_path = view / VIEW_JSON
    if not meta_path.is_file():
        raise LatentViewError(f"{view}: not a latent view (no {VIEW_JSON}); build one with `solarwm data latents`")
    meta = json.loads(meta_path.read_text())
    if meta.get("schema") != VIEW_SCHEMA:
        raise LatentViewError(f"{meta_path}: schema {meta.get('schema')!r}, expected {VIEW_SCHEMA!r}")
    return meta, read_index(view / INDEX_NAME, view)


def latents_command(
    index: str,
    root: str,
    route: str,
    out: str,
    preset: str = "tiny",
    pretrained_path: str | None = None,
    num_frames: int = 17,
    width: int = 64,
    height: int = 64,
    frame_stride: int = 1,
    shard_max_samples: int = 256,
    workers: int = 1,
    executor: str = "process",
    ray_address: str | None = None,
    device: str = "cpu",
) -> int:
    """Encode each window of a recipe index once with a route's codec and text encoder (the latent-cache view).

    Args:
        index: recipe index (train-index.jsonl.gz of `data recipe`) or a release index.
        root: release root the index's shard paths are relative to.
        route: route whose codec and text encoder encode the windows (wan22_ti2v_5b, wan22_i2v_14b, ltx25, minimax_h3).
        out: view folder (shards/, index.jsonl.gz, view.json); a rerun resumes it.
        preset: the route's config preset (tiny | published), as in the training recipe.
        pretrained_path: local diffusers checkpoint folder of the route (published preset).
        num_frames: frames per window, as the datamodule's num_frames.
        width: window width in pixels, as the datamodule's width.
        height: window height in pixels, as the datamodule's height.
        frame_stride: frame step inside a window, as the datamodule's frame_stride.
        shard_max_samples: samples per view shard (one task per shard).
        workers: parallel shard tasks (Ray: CPUs of the local Ray); 1 runs in-process.
        executor: where the shard tasks run: process (local pool) or ray.
        ray_address: Ray cluster to join (e.g. auto, ray://head:10001); default: a local Ray of `workers` CPUs.
        device: torch device that runs the codec and text encoder.
    """
    spec = ViewSpec(route, preset, pretrained_path, num_frames, width, height, frame_stride, device)
    summary = build_view(index, root, out, spec, shard_max_samples, workers, executor, ray_address)
    print(json.dumps({"view": out, **{k: v for k, v in summary.items() if k != "codec"}}, indent=1))
    return 0
