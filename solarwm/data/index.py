"""The one index reader (paper §5.6): every consumer of release and recipe rows goes through here.

An index is gzipped (or plain) JSON lines, one row per sample or window. Paths in a row
(``shard`` and every ``*_member``) are relative to a release root; ``shard`` is a POSIX path
below the root and each member is a name inside that tar. :func:`read_index` validates every
row before returning any; :func:`check_index` collects all failures instead (for ``inspect``);
:func:`load_row` reads one row's members from its shard by random access and decodes them.

Checks, by name: ``json``, ``fields``, ``duplicate_id``, ``path``, ``epoch_repeats``,
``window``, ``shard_missing``, ``shard_size``, ``member_missing``.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import tarfile
import zlib
from collections import Counter
from pathlib import Path, PurePosixPath
from typing import Any, Iterator

import numpy as np

from solarwm.data.contract import check_alignment
from solarwm.data.video import VideoError, read_video_bytes
from solarwm.util.atomic import atomic_path

# Every index row names its sample and the shard holding it; members are the `*_member` fields.
REQUIRED_FIELDS: tuple[str, ...] = ("sample_id", "shard", "shard_size")
MEMBER_FIELDS: tuple[str, ...] = ("video_member", "camera_member", "intrinsics_member", "manifest_member")


class IndexValidationError(ValueError):
    """A row of an index failed a named check; ``row`` is ``(line_number, sample_id)``."""

    def __init__(self, row: tuple[int, str | None], check: str, detail: str, index: str = "") -> None:
        self.row, self.check, self.detail, self.index = row, check, detail, index
        line, sample_id = row
        where = f"{index}:" if index else ""
        super().__init__(f"{where}line {line} (sample_id={sample_id!r}): {check}: {detail}")


class IndexFileError(ValueError):
    """An index file cannot be read as text lines at all (a truncated or corrupt gzip, not UTF-8)."""


def _open_text(path: Path) -> io.TextIOBase:
    """Open an index for reading, gzipped or not (decided by the magic bytes, not the name)."""
    with open(path, "rb") as fh:
        magic = fh.read(2)
    if magic == b"\x1f\x8b":
        return gzip.open(path, "rt", encoding="utf-8")
    return open(path, encoding="utf-8")


def _lines(path: Path) -> Iterator[str]:
    """The text lines of an index; a corrupt file raises `IndexFileError` naming it, wherever the damage is."""
    try:
        with _open_text(path) as fh:
            yield from fh
    except (EOFError, zlib.error, gzip.BadGzipFile, UnicodeDecodeError) as exc:
        raise IndexFileError(f"{path}: not a readable index ({type(exc).__name__}: {exc})") from None


def write_rows(path: str | Path, rows: list[dict]) -> Path:
    """Write rows as gzipped JSON lines, atomically and byte-reproducibly (gzip mtime 0)."""
    path = Path(path)
    with (
        atomic_path(path) as tmp,
        open(tmp, "wb") as raw,
        gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="") as gz,
    ):
        for row in rows:
            gz.write((json.dumps(row, sort_keys=True, ensure_ascii=False) + "\n").encode("utf-8"))
    return path


def read_rows(path: str | Path) -> list[dict]:
    """Parse an index's rows without validating them (for writers; consumers use read_index)."""
    try:
        return [json.loads(line) for line in _lines(Path(path)) if line.strip()]
    except json.JSONDecodeError as exc:
        raise IndexFileError(f"{path}: a line is not valid JSON ({exc})") from None


def _safe_relative(value: Any) -> str | None:
    """Return why ``value`` is not a safe relative POSIX path, or None when it is."""
    if not isinstance(value, str) or not value:
        return f"expected a non-empty string, got {value!r}"
    if "\\" in value or value.startswith("/") or PurePosixPath(value).is_absolute() or os.path.isabs(value):
        return f"absolute path {value!r}"
    if ".." in PurePosixPath(value).parts:
        return f"path {value!r} contains '..'"
    return None


def _is_positive_int(value: Any) -> bool:
    """True for an int >= 1; bool is not an integer here (JSON `true` must not mean 1)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


# --------------------------------------------------------------------------------------------
# Shard access: member offsets are read once per shard per process (a DataLoader worker is a
# process), and file handles are kept open so each worker opens each shard once.


class ShardReader:
    """Random access to tar members by name, caching each shard's member table and handle."""

    def __init__(self, max_open: int = 16) -> None:
        self.max_open = max_open
        self._tables: dict[str, dict[str, tuple[int, int]]] = {}
        self._handles: dict[str, Any] = {}
        self._pid = os.getpid()

    def _fork_guard(self) -> None:
        # A forked worker must not share seek positions with its parent's handles.
        if os.getpid() != self._pid:
            self._handles = {}
            self._pid = os.getpid()

    def members(self, shard: str | Path) -> dict[str, tuple[int, int]]:
        """Map member name -> (data offset, size) for one shard (read once, then cached)."""
        key = str(Path(shard).resolve())
        table = self._tables.get(key)
        if table is None:
            table = {}
            with tarfile.open(key, "r:") as tar:
                for info in tar:
                    if info.isfile():
                        table[info.name] = (info.offset_data, info.size)
            self._tables[key] = table
        return table

    def read(self, shard: str | Path, member: str) -> bytes:
        """Bytes of one member; raises KeyError naming the shard when it is absent."""
        self._fork_guard()
        key = str(Path(shard).resolve())
        table = self.members(key)
        if member not in table:
            raise KeyError(f"{key} has no member {member!r}")
        offset, size = table[member]
        fh = self._handles.get(key)
        if fh is None:
            if len(self._handles) >= self.max_open:
                oldest = next(iter(self._handles))
                self._handles.pop(oldest).close()
            fh = self._handles[key] = open(key, "rb")
        fh.seek(offset)
        data = fh.read(size)
        if len(data) != size:
            raise OSError(f"{key}: member {member!r} truncated ({len(data)} of {size} bytes)")
        return data

    def close(self) -> None:
        """Close every open shard handle (tables stay cached)."""
        for fh in self._handles.values():
            fh.close()
        self._handles = {}


_DEFAULT_READER = ShardReader()


# --------------------------------------------------------------------------------------------
# Validation


def _row_failures(row: Any, root: Path, seen: set[str], reader: ShardReader) -> Iterator[tuple[str, str]]:
    """Yield (check, detail) for every way one parsed row is invalid."""
    if not isinstance(row, dict):
        yield "fields", f"row is {type(row).__name__}, not an object"
        return
    missing = [f for f in REQUIRED_FIELDS if f not in row]
    if missing:
        yield "fields", f"missing field(s) {missing}"
        return
    sample_id = row["sample_id"]
    if not isinstance(sample_id, str) or not sample_id:
        yield "fields", f"sample_id must be a non-empty string, got {sample_id!r}"
    elif sample_id in seen:
        yield "duplicate_id", f"sample_id {sample_id!r} appears more than once"
    else:
        seen.add(sample_id)

    if "epoch_repeats" in row and not _is_positive_int(row["epoch_repeats"]):
        yield "epoch_repeats", f"must be an integer >= 1, got {row['epoch_repeats']!r}"

    if "window_frames" in row or "start_frame" in row:
        start, length, total = row.get("start_frame", 0), row.get("window_frames"), row.get("num_frames")
        ints = all(isinstance(v, int) and not isinstance(v, bool) for v in (start, length, total))
        if not ints or start < 0 or length < 1 or start + length > total:
            yield (
                "window",
                f"start_frame={start!r} window_frames={length!r} num_frames={total!r} is not a window inside the clip",
            )

    members = {f: row[f] for f in sorted(row) if f.endswith("_member")}
    bad_path = False
    for field_name, value in (("shard", row["shard"]), *members.items()):
        why = _safe_relative(value)
        if why:
            bad_path = True
            yield "path", f"{field_name}: {why}"
    if bad_path:
        return
    shard = (root / row["shard"]).resolve()
    if not shard.is_relative_to(root):
        yield "path", f"shard {row['shard']!r} resolves outside the root {root}"
        return
    if not shard.is_file():
        yield "shard_missing", f"shard {row['shard']!r} not found under {root}"
        return
    size = shard.stat().st_size
    if not _is_positive_int(row["shard_size"]) or size != row["shard_size"]:
        yield "shard_size", f"shard {row['shard']!r} is {size} bytes, the row says {row['shard_size']!r}"
        return
    try:
        table = reader.members(shard)
    except tarfile.TarError as exc:
        yield "shard_missing", f"shard {row['shard']!r} is not a readable tar: {exc}"
        return
    for field_name, name in members.items():
        if name not in table:
            yield "member_missing", f"{field_name} {name!r} is not in shard {row['shard']!r}"


def _iter_checked(path: Path, root: Path, reader: ShardReader) -> Iterator[tuple[int, Any, list[tuple[str, str]]]]:
    """Yield (line number, row, failures) for every non-blank line of an index."""
    seen: set[str] = set()
    for number, line in enumerate(_lines(path), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            yield number, None, [("json", f"not valid JSON: {exc}")]
            continue
        yield number, row, list(_row_failures(row, root, seen, reader))


def _sample_id(row: Any) -> str | None:
    return row.get("sample_id") if isinstance(row, dict) else None


def read_index(path: str | Path, root: str | Path, reader: ShardReader | None = None) -> list[dict]:
    """Read and validate every row of an index; raise IndexValidationError on the first bad row."""
    path, root = Path(path), Path(root).resolve()
    rows = []
    for number, row, failures in _iter_checked(path, root, reader or _DEFAULT_READER):
        if failures:
            check, detail = failures[0]
            raise IndexValidationError((number, _sample_id(row)), check, detail, index=str(path))
        rows.append(row)
    return rows


def check_index(
    path: str | Path, root: str | Path, reader: ShardReader | None = None
) -> tuple[list[dict], list[IndexValidationError]]:
    """Validate every row, collecting all failures: returns (valid rows, failures)."""
    path, root = Path(path), Path(root).resolve()
    rows, failures = [], []
    for number, row, row_failures in _iter_checked(path, root, reader or _DEFAULT_READER):
        for check, detail in row_failures:
            failures.append(IndexValidationError((number, _sample_id(row)), check, detail, index=str(path)))
        if not row_failures:
            rows.append(row)
    return rows, failures


# --------------------------------------------------------------------------------------------
# Loading a row


def read_member(row: dict, field_name: str, root: str | Path, reader: ShardReader | None = None) -> bytes:
    """Bytes of one member of a row (``field_name`` like ``manifest_member``)."""
    return (reader or _DEFAULT_READER).read(Path(root) / row["shard"], row[field_name])


def load_row(row: dict, root: str | Path, reader: ShardReader | None = None) -> dict:
    """Load one row: frames uint8 [N,H,W,3], c2w float64 [N,4,4], K float64 [N,4], caption, manifest.

    A window row (``start_frame`` + ``window_frames``) returns only its window's frames.
    """
    reader = reader or _DEFAULT_READER
    where = f"row sample_id={row.get('sample_id')!r} shard={row.get('shard')!r}"
    frames = read_video_bytes(
        read_member(row, "video_member", root, reader), name=f"{row.get('shard')}:{row.get('video_member')}"
    )
    with np.load(io.BytesIO(read_member(row, "camera_member", root, reader)), allow_pickle=False) as npz:
        c2w = np.asarray(npz["c2w"], dtype=np.float64)
    K = np.asarray(
        np.load(io.BytesIO(read_member(row, "intrinsics_member", root, reader)), allow_pickle=False), dtype=np.float64
    )
    manifest = json.loads(read_member(row, "manifest_member", root, reader))
    errors = check_alignment(where, c2w, K, len(frames))  # the contract's one frame-alignment check
    if errors:
        raise IndexValidationError(
            (0, row.get("sample_id")), "frame_alignment", f"{errors[0].check}: {errors[0].detail}"
        )
    if "window_frames" in row:
        start, length = int(row.get("start_frame", 0)), int(row["window_frames"])
        frames, c2w, K = frames[start : start + length], c2w[start : start + length], K[start : start + length]
    caption = manifest.get("caption")
    if caption is None:
        caption = row.get("caption", "")
    return {"frames": frames, "c2w": c2w, "K": K, "caption": caption, "manifest": manifest}


def inspect_index_command(index: str, root: str, decode: bool = False) -> int:
    """Validate every row of an index against a release root and print a JSON summary.

    Args:
        index: index file (gzipped JSON lines), e.g. a recipe's train-index.jsonl.gz.
        root: release root the index's paths are relative to.
        decode: also load and decode every valid row (slow; checks frame alignment).
    """
    rows, failures = check_index(index, root)
    if decode:
        for row in rows:
            try:
                load_row(row, root)
            except (IndexValidationError, VideoError, ValueError, OSError, KeyError) as exc:
                failures.append(IndexValidationError((0, row.get("sample_id")), "decode", str(exc), index=index))
    summary = {
        "index": index,
        "root": str(Path(root).resolve()),
        "rows": len(rows) + len({f.row for f in failures if f.row[0] > 0}),
        "rows_ok": len(rows) - sum(1 for f in failures if f.check == "decode"),
        "shards": len({r["shard"] for r in rows}),
        "owners": dict(sorted(Counter(str(r.get("dataset")) for r in rows).items())),
        "failures_by_check": dict(sorted(Counter(f.check for f in failures).items())),
        "failures": [{"line": f.row[0], "sample_id": f.row[1], "check": f.check, "detail": f.detail} for f in failures],
    }
    print(json.dumps(summary, indent=2))
    return 1 if failures else 0
