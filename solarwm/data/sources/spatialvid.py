"""SpatialVID-HQ → owner ``spatialvid``; poses from an estimator.

Native layout (HF ``SpatialVID/SpatialVID-HQ``)::

    <root>/videos/group_0001.tar.gz       # members group_0001/<uuid>.mp4  (or extracted: videos/group_0001/<uuid>.mp4)
    <root>/annotations/group_0001/<uuid>/{poses.npy, intrinsics.npy, indexes.txt, ...}   (not read)

Why no native-pose path: the annotation arrays are MegaSaM estimates whose conventions
(axes, w2c/c2w, units, which frames ``indexes.txt`` covers) the reference could not verify,
and the official engine does not read them; reading them on a guess would put wrong poses in
the corpus silently. They can become a ``--poses native`` path once verified.
"""

from __future__ import annotations

from pathlib import Path

from solarwm.data.sources.native import NativeItem, Source
from solarwm.data.sources.video_only import load_video_item, tar_items


def list_items(root: Path) -> list[NativeItem]:
    """Every mp4 in the group tarballs and in extracted group folders."""
    videos = root / "videos"
    items = tar_items(root, sorted(videos.glob("group_*.tar.gz")))
    items += [NativeItem(p.stem, {"video": str(p.relative_to(root))}) for p in sorted(videos.glob("group_*/*.mp4"))]
    return items


SOURCE = Source("spatialvid", {"*": "spatialvid"}, "estimator", "160f", list_items, load_video_item,
                note="annotations (MegaSaM, unverified conventions) not read")
