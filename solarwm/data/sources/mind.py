"""MIND → owner ``mind``; poses from an estimator, actions from ``action.json``.

Native layout (HF ``CSU-JPG/MIND``)::

    <root>/{1st_data,3rd_data}/<split>/data-<N>/video.mp4
    <root>/{1st_data,3rd_data}/<split>/data-<N>/action.json
        {"data": [{"time": i, "ws": .., "ad": .., "ud": .., "lr": ..,
                   "actor_pos": {"x","y","z"}, "actor_rpy": {"x","y","z"}}, ...]}   # one row per frame

Sidecars, sliced with the video: ``action.npy`` int16 ``[T, 4]`` (ws, ad, ud, lr) and
``actor_pose.npy`` float64 ``[T, 6]`` (position xyz, rpy xyz). ``time`` must be 0..N-1.
Why no native-pose path: COLMAP ``images.txt`` ships only with the test splits, so pose
provenance would differ between one owner's splits (the official engine ignores it too).
The clip's original id is its path with ``/`` → ``_``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from solarwm.data.sources.native import NativeClip, NativeItem, Source, SourceDefect, read_text
from solarwm.data.sources.video_only import load_video_item


def list_items(root: Path) -> list[NativeItem]:
    """Every folder with a video.mp4 under the two views."""
    found = sorted(p for view in ("1st_data", "3rd_data") for p in (root / view).rglob("video.mp4"))
    return [NativeItem(str(p.parent.relative_to(root)).replace("/", "_").replace(".", "_"),
                       {"video": str(p.relative_to(root))}) for p in found]


def parse_actions(text: str) -> tuple[np.ndarray, np.ndarray]:
    """action.json → (action int16 ``[N, 4]``, actor_pose float64 ``[N, 6]``); ``time`` must count 0..N-1."""
    try:
        rows = json.loads(text)["data"]
        action = np.array([[r["ws"], r["ad"], r["ud"], r["lr"]] for r in rows], dtype=np.int16).reshape(-1, 4)
        pose = np.array([[r["actor_pos"][a] for a in "xyz"] + [r["actor_rpy"][a] for a in "xyz"] for r in rows],
                        dtype=np.float64).reshape(-1, 6)
        times = [r["time"] for r in rows]
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        raise SourceDefect("action_file_invalid", f"action.json: {e}") from None
    if times != list(range(len(rows))):
        raise SourceDefect("action_file_invalid", "action.json times are not 0..N-1")
    return action, pose


def load(root: Path, item: NativeItem) -> NativeClip:
    """Frames plus the per-frame action and actor pose sidecars."""
    clip = load_video_item(root, item)
    action, actor = parse_actions(read_text((root / item.ref["video"]).parent / "action.json", "missing_action_file"))
    clip.arrays = {"action": action, "actor_pose": actor}
    return clip


SOURCE = Source("mind", {"*": "mind"}, "estimator", "960f", list_items, load,
                note="actions [T,4] + actor pose [T,6]; test-split COLMAP not read")
