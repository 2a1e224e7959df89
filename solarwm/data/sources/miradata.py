"""MiraData → owner ``miradata``; poses from an estimator (MiraData ships none).

Native layout read (the HF mirror the official engine ingests)::

    <root>/shards/shard-00000.tar     # members MiraData/clip_video/<id>.mp4 (+ <id>.json, ignored)

Clip ids are mp4 stems such as ``000000008165.3`` (a dot inside; our clip ids are uuids, so
it is harmless). Native captions are not read: the VLM pass writes captions.
"""

from __future__ import annotations

from pathlib import Path

from solarwm.data.sources.native import NativeItem, Source
from solarwm.data.sources.video_only import load_video_item, tar_items


def list_items(root: Path) -> list[NativeItem]:
    """Every mp4 member of every shard."""
    return tar_items(root, sorted((root / "shards").glob("*.tar")))


SOURCE = Source("miradata", {"*": "miradata"}, "estimator", "960f", list_items, load_video_item,
                note="video only (tar shards)")
