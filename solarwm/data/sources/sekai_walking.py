"""Sekai-Real-Walking-HQ → owner ``sekai_walking``; poses from an estimator.

Native layout (HF ``mvp-lab/Sekai`` videos, ``Lixsp11/Sekai-Project`` HQ list)::

    <root>/sekai-real-walking/sekai-real-walking_part000.tar   # members <youtube_id>_<start:07d>_<end:07d>.mp4
    <root>/train/sekai-real-walking-hq.csv                     # column videoFile: the curated HQ clips

The items are the clips the HQ list names (the owner is Walking-HQ); an HQ clip missing from
every tar is a failed record (``video_missing``). Without the csv every member is an item.
Sekai-Real's own normalised cameras are not read: their conventions are unverified.
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

from solarwm.data.sources.native import NativeClip, NativeItem, Source, SourceDefect
from solarwm.data.sources.video_only import load_video_item, tar_items

HQ_CSV = Path("train/sekai-real-walking-hq.csv")


def hq_stems(root: Path) -> list[str] | None:
    """Stems listed in the HQ csv, or ``None`` when it is absent."""
    path = root / HQ_CSV
    if not path.is_file():
        return None
    csv.field_size_limit(min(sys.maxsize, 2**31 - 1))  # the csv carries long caption fields
    with path.open(newline="") as f:
        return [row["videoFile"].rsplit(".", 1)[0] for row in csv.DictReader(f) if row.get("videoFile")]


def list_items(root: Path) -> list[NativeItem]:
    """HQ clips found in the tars, plus one item per HQ clip found nowhere (it will fail)."""
    tars = sorted((root / "sekai-real-walking").glob("*.tar"))
    hq = hq_stems(root)
    items = tar_items(root, tars, None if hq is None else set(hq))
    found = {it.original_id for it in items}
    return items + [NativeItem(s, {"missing": True}) for s in (hq or []) if s not in found]


def load(root: Path, item: NativeItem) -> NativeClip:
    """The member's frames; an HQ clip with no video fails."""
    if item.ref.get("missing"):
        raise SourceDefect("video_missing", f"{item.original_id} is in {HQ_CSV} but in no tar")
    return load_video_item(root, item)


SOURCE = Source("sekai_walking", {"*": "sekai_walking"}, "estimator", "960f", list_items, load,
                note="HQ csv filter; Sekai-Real cameras not read")
