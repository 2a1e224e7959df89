"""Shared pieces of the video-only sources (DL3DV, MiraData, SpatialVID, Sekai-Walking, MIND).

Their poses come from an estimator (``--estimator``, default ``vipe`` like the official
engine); the source modules only find the videos. Some of them ship poses of some kind; each
module's docstring says why those are not read.
"""

from __future__ import annotations

import tarfile
from pathlib import Path

from solarwm.data.sources.native import NativeClip, NativeItem, SourceDefect, VideoFrames


def tar_members(path: Path, suffix: str = ".mp4") -> list[str]:
    """Names of the members of a tar (plain or gzip) ending in ``suffix``; raises ``SourceDefect``."""
    try:
        with tarfile.open(path) as tar:
            return sorted(m.name for m in tar.getmembers() if m.isfile() and m.name.endswith(suffix))
    except (tarfile.TarError, OSError) as e:
        raise SourceDefect("archive_unreadable", f"{path.name}: {e}") from None


def tar_bytes(path: Path, member: str) -> bytes:
    """One member of a tar as bytes."""
    try:
        with tarfile.open(path) as tar:
            f = tar.extractfile(member)
            if f is None:
                raise SourceDefect("video_unreadable", f"{path.name}:{member} is not a file")
            return f.read()
    except (tarfile.TarError, KeyError, OSError) as e:
        raise SourceDefect("archive_unreadable", f"{path.name}:{member}: {e}") from None


def load_video_item(root: Path, item: NativeItem) -> NativeClip:
    """A video-only item: ``ref`` is ``{"video": rel_path}`` or ``{"tar": rel_path, "member": name}``."""
    if "tar" in item.ref:
        if item.ref["member"] is None:
            raise SourceDefect("archive_unreadable", f"{item.ref['tar']} cannot be listed")
        data = tar_bytes(root / item.ref["tar"], item.ref["member"])
        frames = VideoFrames(data, f"{item.ref['tar']}:{item.ref['member']}")
    else:
        frames = VideoFrames(root / item.ref["video"], item.ref["video"])
    return NativeClip(item.original_id, frames, extra=dict(item.ref))


def tar_items(root: Path, tars: list[Path], keep: set[str] | None = None) -> list[NativeItem]:
    """One item per mp4 member (id = its stem); an unreadable tar is one item that fails."""
    items = []
    for t in tars:
        rel = str(t.relative_to(root))
        try:
            members = tar_members(t)
        except SourceDefect:
            items.append(NativeItem(t.name, {"tar": rel, "member": None}))
            continue
        items += [NativeItem(Path(m).stem, {"tar": rel, "member": m}) for m in members
                  if keep is None or Path(m).stem in keep]
    return items
