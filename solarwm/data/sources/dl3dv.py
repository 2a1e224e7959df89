"""DL3DV-10K → owners ``dl3dv-10s`` (``--spec 160f``) and ``dl3dv-60s`` (``--spec 960f``); poses from an estimator.

Native layout (``DL3DV/DL3DV-ALL-video``)::

    <root>/<batch>/<hash>/video.mp4        # batch 1K..11K, hash = 64 hex

Why no native-pose path: DL3DV's COLMAP poses exist only at ~4-5 Hz (an even extraction of the
whole video), so a per-frame trajectory at 16 fps would interpolate 2 of every 3 poses; the
official engine re-estimates every clip, and so do we. The two owners are the same source cut
into 10-s and 60-s windows.
"""

from __future__ import annotations

from pathlib import Path

from solarwm.data.sources.native import NativeItem, Source
from solarwm.data.sources.video_only import load_video_item


def list_items(root: Path) -> list[NativeItem]:
    """Every ``<batch>/<hash>/video.mp4``."""
    return [NativeItem(p.parent.name, {"video": str(p.relative_to(root))}) for p in sorted(root.glob("*/*/video.mp4"))]


SOURCE = Source("dl3dv", {"160f": "dl3dv-10s", "960f": "dl3dv-60s"}, "estimator", "160f", list_items, load_video_item,
                note="COLMAP GT only at ~4-5 Hz: re-estimated")
