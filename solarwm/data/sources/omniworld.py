"""OmniWorld-Game → owner ``omniworld`` (ground-truth poses, metric after the per-scene scale).

Native layout (HF ``InternRobotics/OmniWorld``)::

    <root>/metadata/omniworld_game_metadata.csv                    # UID, Metric Scale, FPS, ...
    <root>/videos/OmniWorld-Game/<uid>/<uid>_rgb_0000.tar.gz        # color/<global_frame>.png
    <root>/annotations/OmniWorld-Game/<uid>/<uid>_others.tar.gz
        split_info.json         {"split": [[global frame ids], ...]}
        camera/split_<i>.json   {"quats": [S, 4] wxyz, "trans": [S, 3], "focals": [S], "cx": .., "cy": ..}

Camera json holds OpenCV world-to-camera (``wxyz`` quaternions) per split, each split in its own
local frame (splits are never concatenated), so one item is one split (id ``<uid>_s<i>``).
c2w = inverse, then translations × the scene's Metric Scale. Unlike the official engine, a
missing Metric Scale fails the item (``metric_scale_missing``) instead of leaving relative
units in an owner declared metric. Depth and text windows are not read. 24 fps unless the
csv's FPS says otherwise.
"""

from __future__ import annotations

import csv
import json
import re
import tarfile
from pathlib import Path
from typing import Any

import numpy as np

from solarwm.data.sources import conversions as cv
from solarwm.data.sources.native import ImageFrames, NativeClip, NativeItem, Source, SourceDefect

GAME = "OmniWorld-Game"
META_CSV = Path("metadata/omniworld_game_metadata.csv")
_COLOR = re.compile(r"color/(\d+)\.(?:png|jpg|jpeg)$")


def _others(root: Path, uid: str) -> tarfile.TarFile:
    path = root / "annotations" / GAME / uid / f"{uid}_others.tar.gz"
    if not path.is_file():
        raise SourceDefect("missing_pose_file", f"{path.relative_to(root)} not found")
    return tarfile.open(path)


def _json(tar: tarfile.TarFile, name: str) -> Any:
    try:
        f = tar.extractfile(name)
        return json.loads(f.read()) if f else None
    except KeyError:
        raise SourceDefect("missing_pose_file", f"others tar has no {name}") from None
    except json.JSONDecodeError as e:
        raise SourceDefect("pose_file_invalid", f"{name}: {e}") from None


def _scene_meta(root: Path) -> dict[str, dict[str, str]]:
    path = root / META_CSV
    if not path.is_file():
        return {}
    with path.open(newline="") as f:
        return {row["UID"]: row for row in csv.DictReader(f)}


def list_items(root: Path) -> list[NativeItem]:
    """One item per split of every scene with rgb tars; a scene whose splits cannot be read is one failing item."""
    items = []
    for scene in sorted(p for p in (root / "videos" / GAME).glob("*") if p.is_dir()):
        uid = scene.name
        try:
            with _others(root, uid) as tar:
                splits = _json(tar, "split_info.json")["split"]
            items += [NativeItem(f"{uid}_s{i}", {"uid": uid, "split": i}) for i in range(len(splits))]
        except (SourceDefect, tarfile.TarError, KeyError, TypeError):
            items.append(NativeItem(uid, {"uid": uid, "split": None}))
    return items


def load(root: Path, item: NativeItem) -> NativeClip:
    """Frames of one split from the rgb tars; metric OpenCV c2w and pixel K from its camera json."""
    uid, i = item.ref["uid"], item.ref["split"]
    with _others(root, uid) as tar:
        info = _json(tar, "split_info.json")
        if i is None or not isinstance(info, dict):
            raise SourceDefect("pose_file_invalid", "split_info.json has no split list")
        ids = [int(v) for v in info["split"][i]]
        cam = _json(tar, f"camera/split_{i}.json")
    row = _scene_meta(root).get(uid, {})
    fps = float(row.get("FPS") or 24.0)
    images: dict[int, bytes] = {}
    wanted = set(ids)
    for rgb in sorted((root / "videos" / GAME / uid).glob(f"{uid}_rgb_*.tar.gz")):
        with tarfile.open(rgb) as tar:
            for m in tar.getmembers():
                hit = _COLOR.search(m.name)
                if hit and int(hit.group(1)) in wanted:
                    images[int(hit.group(1))] = tar.extractfile(m).read()
    frames = ImageFrames([images[g] for g in ids if g in images], f"{uid} split {i}", fps)
    try:
        q, t, f = np.asarray(cam["quats"], float), np.asarray(cam["trans"], float), np.asarray(cam["focals"], float)
        cx, cy = float(cam["cx"]), float(cam["cy"])
    except (KeyError, TypeError, ValueError) as e:
        raise SourceDefect("pose_file_invalid", f"camera/split_{i}.json: {e!r}") from None
    scale = row.get("Metric Scale")
    if not scale:
        raise SourceDefect("metric_scale_missing", f"{META_CSV} has no Metric Scale for {uid}")
    c2w = cv.scale_translation(cv.quaternion_w2c_to_c2w(q, t, "wxyz"), float(scale))
    K = np.stack([f, f, np.full_like(f, cx), np.full_like(f, cy)], axis=1)
    conversions = [cv.record(cv.quaternion_w2c_to_c2w, order="wxyz"),
                   cv.record(cv.scale_translation, scale=float(scale), method="omniworld_metric_scale")]
    extra = {"uid": uid, "split": i, "global_frames": [ids[0], ids[-1] + 1]}
    return NativeClip(item.original_id, frames, c2w, K, "metric", conversions, {}, extra)


SOURCE = Source("omniworld", {"*": "omniworld"}, "gt_pose_metric", "81f", list_items, load,
                note="per split: w2c wxyz quats, x Metric Scale; PNG frames")
