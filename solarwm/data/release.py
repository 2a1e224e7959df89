"""The physical raw-wds release (paper §5.6): every selected clip packed under its tier.

Layout under the release root ``out``::

    raw-wds/<owner>/shards/<partition>-NNNNNN.tar   partition: kept-xhigh | kept-high | rejected
    raw-wds/<owner>/<partition>.journal.json        completed shards of that partition (resume state)
    raw-wds/index.jsonl.gz                          one row per packed clip (see INDEX_FIELDS)
    raw-wds/release.json                            summary: accounting, clips not packed

Each sample is five tar members named ``<key>.<ext>``: ``video.mp4`` (the clip's stored video,
byte for byte), ``camera.npz`` (``c2w`` float32 [N,4,4]), ``intrinsics.npy`` (K float32 [N,4],
pixels), ``manifest.json`` (meta, metrics, provenance, tier, reasons, caption) and
``prompt.txt``. A WebDataset reader splits member names at the first dot, so the key is the
clip id with every character outside ``[A-Za-z0-9_-]`` replaced by ``_``.

Crash safety: a shard is written as ``<name>.tar.partial`` and renamed when closed, then the
partition journal is rewritten atomically. Clips are packed in a deterministic order (sorted
by clip id), so a rerun deletes stray partial/unjournaled shards and continues after the
last journaled shard: nothing is duplicated or lost, and a finished release reruns as a no-op.
Each (owner, partition) is one task of `solarwm.data.executor.map_tasks` (``--executor process|ray``);
partitions share no file, so they run in parallel and the release is the same bytes on any executor.
"""

from __future__ import annotations

import io
import json
import os
import re
import zipfile
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import numpy as np
from webdataset import TarWriter

from solarwm.data.accounting import account, outcome
from solarwm.data.contract import ClipError, iter_clip_dirs, read_clip, read_meta
from solarwm.data.executor import map_tasks
from solarwm.data.index import read_rows, write_rows
from solarwm.util.atomic import atomic_write_bytes

# selection.tier -> physical partition
PARTITIONS: dict[str, str] = {"xhigh": "kept-xhigh", "high": "kept-high", "rejected": "rejected"}
# outcome(meta) -> selection tier, for the outcomes that are packed
_PACKED_OUTCOMES: dict[str, str] = {"kept-xhigh": "xhigh", "kept-high": "high", "rejected": "rejected"}
MEMBER_EXTS: dict[str, str] = {
    "video_member": "video.mp4",
    "camera_member": "camera.npz",
    "intrinsics_member": "intrinsics.npy",
    "manifest_member": "manifest.json",
    "prompt_member": "prompt.txt",
}
INDEX_FIELDS: tuple[str, ...] = (
    "sample_id", "key", "shard", "shard_size", "dataset", "kept_tier", "num_frames", "fps",
    "width", "height", "caption", *MEMBER_EXTS,
)
INDEX_PATH = "raw-wds/index.jsonl.gz"
SUMMARY_PATH = "raw-wds/release.json"
MANIFEST_SCHEMA = "solarwm.manifest/1"
_KEY_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
_TAR_BLOCK = 512
_TAR_END = 2 * _TAR_BLOCK


class ReleaseError(ValueError):
    """The corpus cannot be packed, or an existing release folder disagrees with it."""


def sample_key(sample_id: str) -> str:
    """WebDataset key of a clip id: every character outside ``[A-Za-z0-9_-]`` becomes ``_``."""
    return _KEY_UNSAFE.sub("_", sample_id)


def npy_bytes(array: np.ndarray) -> bytes:
    """An ``.npy`` file's bytes (``np.save``)."""
    buf = io.BytesIO()
    np.lib.format.write_array(buf, np.ascontiguousarray(array), allow_pickle=False)
    return buf.getvalue()


def npz_bytes(**arrays: np.ndarray) -> bytes:
    """An ``.npz`` (readable by ``np.load``) with fixed zip timestamps, so reruns are byte-identical."""
    # np.savez stamps each zip entry with the current time; a resumed pack must reproduce bytes.
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_STORED) as zf:
        for name, array in arrays.items():
            zf.writestr(zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0)), npy_bytes(array))
    return buf.getvalue()


def _tar_size(members: dict[str, bytes]) -> int:
    """Bytes a sample occupies in a tar: one header block plus padded data per member."""
    return sum(_TAR_BLOCK + -(-len(v) // _TAR_BLOCK) * _TAR_BLOCK for v in members.values())


def _sample_members(clip_dir: Path, meta: dict, key: str) -> dict[str, bytes]:
    """Encode one clip as its tar members, keyed by extension (``video.mp4``, ``camera.npz``, ...)."""
    selection = meta.get("selection") or {}
    # Rejected clips are released as they are (a NaN pose is their rejection reason); kept
    # clips must satisfy the contract.
    clip = read_clip(clip_dir, load_video=False, validate=selection.get("tier") != "rejected")
    manifest = {
        "schema": MANIFEST_SCHEMA,
        "sample_id": meta["clip_id"],
        "key": key,
        "dataset": meta["provenance"]["owner"],
        "kept_tier": selection.get("tier"),
        "caption": meta.get("caption", ""),
        "meta": meta.get("meta", {}),
        "metrics": meta.get("metrics", {}),
        "provenance": meta.get("provenance", {}),
        "selection": selection,
        "reasons": list(selection.get("reasons", [])),
    }
    return {
        "video.mp4": (clip_dir / "video.mp4").read_bytes(),
        "camera.npz": npz_bytes(c2w=np.asarray(clip.c2w, dtype=np.float32)),
        "intrinsics.npy": npy_bytes(np.asarray(clip.K, dtype=np.float32)),
        "manifest.json": (json.dumps(manifest, sort_keys=True, ensure_ascii=False, indent=1) + "\n").encode("utf-8"),
        "prompt.txt": (meta.get("caption", "") + "\n").encode("utf-8"),
    }


def _index_row(meta: dict, key: str) -> dict:
    """The index row of one packed clip, without its shard fields (filled when the shard closes)."""
    m = meta.get("meta", {})
    return {
        "sample_id": meta["clip_id"],
        "key": key,
        "dataset": meta["provenance"]["owner"],
        "kept_tier": meta["selection"]["tier"],
        "num_frames": m.get("num_frames"),
        "fps": m.get("fps"),
        "width": m.get("width"),
        "height": m.get("height"),
        "caption": meta.get("caption", ""),
        **{field: f"{key}.{ext}" for field, ext in MEMBER_EXTS.items()},
        # The views of one world share a scene: the recipe split holds them out together (absent: the clip alone).
        **({"scene": meta["provenance"]["scene"]} if meta["provenance"].get("scene") else {}),
    }


# --------------------------------------------------------------------------------------------
# Journals: one per (owner, partition); the list of completed shards with their rows.


def _journal_path(out: Path, owner: str, partition: str) -> Path:
    return out / "raw-wds" / owner / f"{partition}.journal.json"


def _save_journal(path: Path, owner: str, partition: str, shards: list[dict]) -> None:
    doc = {"owner": owner, "partition": partition, "shards": shards}
    atomic_write_bytes(path, (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode("utf-8"))


def _clean_partition(out: Path, owner: str, partition: str, shards: list[dict]) -> list[str]:
    """Check journaled shards are intact; delete partial and unjournaled shards of this partition."""
    shard_dir = out / "raw-wds" / owner / "shards"
    journaled = {s["name"]: s["size"] for s in shards}
    for name, size in journaled.items():
        path = shard_dir / name
        if not path.is_file() or path.stat().st_size != size:
            raise ReleaseError(f"{path}: journaled shard is missing or changed size; pack into a fresh folder")
    removed = []
    if shard_dir.is_dir():
        for path in sorted(shard_dir.glob(f"{partition}-*")):
            if path.name not in journaled:
                path.unlink()  # a .partial from a kill, or a shard closed just before its journal write
                removed.append(path.name)
    return removed


def _pack_partition(out: Path, owner: str, partition: str, clips: list[tuple[Path, dict, str]],
                    shards: list[dict], shard_max_bytes: int, shard_max_samples: int) -> int:
    """Pack the not-yet-journaled clips of one partition into new shards; returns samples written."""
    shard_dir = out / "raw-wds" / owner / "shards"
    shard_dir.mkdir(parents=True, exist_ok=True)
    journal = _journal_path(out, owner, partition)
    done = {row["sample_id"] for s in shards for row in s["rows"]}
    todo = [c for c in clips if c[1]["clip_id"] not in done]
    written = 0
    writer: TarWriter | None = None
    fh = None
    rows: list[dict] = []
    used = 0
    name = ""

    def close_shard() -> None:
        nonlocal writer, fh
        writer.close()  # ends the tar stream; `fh` is ours to sync and close
        fh.flush()
        os.fsync(fh.fileno())
        fh.close()
        writer = fh = None
        final = shard_dir / name
        os.replace(shard_dir / f"{name}.partial", final)
        size = final.stat().st_size
        rel = final.relative_to(out).as_posix()
        for row in rows:
            row.update(shard=rel, shard_size=size)
        shards.append({"name": name, "size": size, "rows": list(rows)})
        _save_journal(journal, owner, partition, shards)

    try:
        for clip_dir, meta, key in todo:
            members = _sample_members(clip_dir, meta, key)
            size = _tar_size(members)
            if writer is not None and (len(rows) >= shard_max_samples or used + size + _TAR_END > shard_max_bytes):
                close_shard()
            if writer is None:
                name = f"{partition}-{len(shards):06d}.tar"
                fh = open(shard_dir / f"{name}.partial", "wb")
                # mtime fixed and encoder off: members are bytes, and reruns must be byte-identical
                writer = TarWriter(fh, encoder=False, mtime=0, user="solarwm", group="solarwm", mode=0o444)
                rows, used = [], 0
            writer.write({"__key__": key, **members})
            rows.append(_index_row(meta, key))
            used += size
            written += 1
        if writer is not None:
            close_shard()
    finally:
        if writer is not None:  # interrupted: leave the .partial for the next run to delete
            writer.close()
            fh.close()
    return written


def _pack_task(task: tuple[str, str, str, list[tuple[Path, dict, str]], list[dict], int, int]) -> dict[str, Any]:
    """``_pack_partition`` on one ``(out, owner, partition, clips, shards, max_bytes, max_samples)`` tuple.

    Returns ``{"written": samples, "shards": the partition's journaled shards}`` (the executor's record).
    """
    out, owner, partition, clips, shards, shard_max_bytes, shard_max_samples = task
    shards = list(shards)
    written = _pack_partition(Path(out), owner, partition, clips, shards, shard_max_bytes, shard_max_samples)
    return {"written": written, "shards": shards}


def _plan(corpus: Path) -> tuple[dict[tuple[str, str], list[tuple[Path, dict, str]]], list[dict], Counter]:
    """Group packable clips by (owner, partition) in clip-id order; list the clips not packed."""
    groups: dict[tuple[str, str], list[tuple[Path, dict, str]]] = defaultdict(list)
    not_packed: list[dict] = []
    outcomes: Counter = Counter()
    keys: dict[str, str] = {}
    for clip_dir in iter_clip_dirs(corpus):
        try:
            meta = read_meta(clip_dir)
        except ClipError as e:  # counted as failed, as every other verb (and the accounting) does
            outcomes[("unknown", "failed")] += 1
            not_packed.append({"clip_id": clip_dir.name, "owner": "unknown", "outcome": "failed", "num_frames": None,
                               "error": str(e)})
            continue
        owner = meta["provenance"].get("owner", "unknown")
        result = outcome(meta)
        outcomes[(owner, result)] += 1
        if result not in _PACKED_OUTCOMES:
            not_packed.append({"clip_id": meta["clip_id"], "owner": owner, "outcome": result,
                               "num_frames": meta.get("meta", {}).get("num_frames")})
            continue
        if _KEY_UNSAFE.search(owner):
            raise ReleaseError(f"{clip_dir}: owner {owner!r} is not a safe folder name")
        key = sample_key(meta["clip_id"])
        if key in keys:
            raise ReleaseError(f"key collision: clip ids {keys[key]!r} and {meta['clip_id']!r} both map to key {key!r}")
        keys[key] = meta["clip_id"]
        partition = PARTITIONS[_PACKED_OUTCOMES[result]]
        groups[(owner, partition)].append((clip_dir, meta, key))
    for clips in groups.values():
        clips.sort(key=lambda c: c[1]["clip_id"])
    return dict(sorted(groups.items())), not_packed, outcomes


def pack_command(
    corpus: str, out: str, shard_max_bytes: int = 256 * 2**20, shard_max_samples: int = 1000,
    workers: int = 1, executor: str = "process", ray_address: str | None = None,
) -> int:
    """Pack a selected corpus into the raw-wds release (tier partitions, index, summary); resumable.

    Args:
        corpus: corpus folder of canonical clips (after `data select`).
        out: release root; `raw-wds/` is written below it.
        shard_max_bytes: close a shard before it would exceed this size (a larger sample gets its own shard).
        shard_max_samples: at most this many samples per shard.
        workers: partitions packed in parallel (Ray: CPUs of the local Ray); 1 runs in-process.
        executor: where the per-partition tasks run: process (local pool) or ray.
        ray_address: Ray cluster to join (e.g. auto, ray://head:10001); default: a local Ray of `workers` CPUs.
    """
    if shard_max_samples < 1 or shard_max_bytes < 1:
        raise ReleaseError("shard_max_samples and shard_max_bytes must be >= 1")
    corpus_path, out_path = Path(corpus), Path(out)
    groups, not_packed, outcomes = _plan(corpus_path)

    # A clip journaled under another owner/partition means the corpus was re-selected after a
    # partial pack; continuing would pack it twice.
    journals = {}
    for journal in sorted(out_path.glob("raw-wds/*/*.journal.json")):
        doc = json.loads(journal.read_text())
        journals[(doc["owner"], doc["partition"])] = doc["shards"]
    current = {meta["clip_id"]: grp for grp, clips in groups.items() for _, meta, _ in clips}
    for grp, shards in journals.items():
        for s in shards:
            for row in s["rows"]:
                if current.get(row["sample_id"]) != grp:
                    raise ReleaseError(
                        f"{out_path}: clip {row['sample_id']!r} is packed in {grp[0]}/{grp[1]} but the corpus now "
                        f"puts it in {current.get(row['sample_id'])}; pack into a fresh folder"
                    )

    # One task per (owner, partition): each writes only its own shards and journal, so partitions
    # run in parallel on any executor while each one packs its clips in order (byte-identical shards).
    written, removed = 0, []
    tasks = []
    for (owner, partition), clips in groups.items():
        shards = journals.get((owner, partition), [])
        removed += _clean_partition(out_path, owner, partition, shards)
        tasks.append((str(out_path), owner, partition, clips, shards, shard_max_bytes, shard_max_samples))
    errors = []
    for i, result in map_tasks(
        _pack_task, tasks, executor, workers, desc="pack", unit="partition", ray_address=ray_address
    ):
        if isinstance(result, BaseException):
            errors.append(result)
            continue
        _, owner, partition = tasks[i][:3]
        journals[(owner, partition)] = result["shards"]
        written += result["written"]
    if errors:  # the other partitions are journaled; a rerun resumes the failed ones
        raise errors[0]

    rows = [row for grp in sorted(journals) for s in journals[grp] for row in s["rows"]]
    index_path = out_path / INDEX_PATH
    if not index_path.exists() or read_rows(index_path) != rows:  # a finished release reruns as a no-op
        write_rows(index_path, rows)

    accounting = account(corpus_path)
    packed = Counter((r["dataset"], PARTITIONS[r["kept_tier"]]) for r in rows)
    summary: dict[str, Any] = {  # nothing run- or location-specific: a rerun leaves it unchanged
        "index": INDEX_PATH,
        "rows": len(rows),
        "shards": sum(len(s) for s in journals.values()),
        "packed": {f"{o}/{p}": n for (o, p), n in sorted(packed.items())},
        "outcomes": {f"{o}/{r}": n for (o, r), n in sorted(outcomes.items())},
        "not_packed": not_packed,
        "accounting": accounting.line(),
    }
    summary_bytes = (json.dumps(summary, indent=1, sort_keys=True) + "\n").encode("utf-8")
    summary_path = out_path / SUMMARY_PATH
    if not summary_path.exists() or summary_path.read_bytes() != summary_bytes:
        atomic_write_bytes(summary_path, summary_bytes)
    print(json.dumps({"release": str(out_path), **summary, "written": written, "removed_stray": removed}, indent=2))
    return 0
