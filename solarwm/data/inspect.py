"""`solarwm data inspect`: validate every clip of a corpus (or every row of an index) and summarise."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from solarwm.data.contract import iter_clip_dirs, read_meta, validate_clip


def inspect_corpus(path: str | Path) -> dict:
    """Validate a clip folder or every clip of a corpus folder; a summary dict of passes and failures."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such clip or corpus folder")
    folders = [path] if (path / "meta.json").exists() else iter_clip_dirs(path)
    by_check: Counter = Counter()
    failures, frames, owners = [], 0, Counter()
    for folder in folders:
        errors = validate_clip(folder)
        if errors:
            by_check.update(e.check for e in errors)
            failures.append({"clip": folder.name, "checks": [{"check": e.check, "detail": e.detail} for e in errors]})
            continue
        meta = read_meta(folder)
        frames += meta["meta"]["num_frames"]
        owners[meta["provenance"].get("owner", "unknown")] += 1
    return {
        "path": str(path), "clips": len(folders), "valid": len(folders) - len(failures),
        "frames": frames, "owners": dict(owners), "failures_by_check": dict(by_check), "failed": failures,
    }


def inspect_command(path: str | None = None, index: str | None = None, root: str | None = None) -> int:
    """Validate a clip/corpus folder (PATH) or a release index (--index FILE --root ROOT); print JSON.

    Args:
        path: a clip folder or a corpus folder.
        index: a gzipped JSON-lines index (release or recipe) to check row by row.
        root: the release root the index's paths are relative to.
    """
    if index is not None:
        from solarwm.data.index import inspect_index_command

        return inspect_index_command(index=index, root=root or str(Path(index).parent))
    if path is None:
        raise ValueError("give a clip/corpus PATH or --index FILE --root ROOT")
    summary = inspect_corpus(path)
    print(json.dumps(summary, indent=1))
    return 0 if not summary["failed"] else 1
