"""Reading one row of a latent view as a batch item (the half of the latent-cache view that the clip dataset needs).

Its own module so that ``datamodules.clips`` (which reads view rows) and ``datamodules.latents`` (which builds
views with the clip dataset) need not import each other.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load as load_safetensors

from solarwm.data.index import ShardReader, read_member


def view_tag(route: str, hash_: str) -> str:
    """``route:codec_hash``, the string a view batch carries as ``view_codec``."""
    return f"{route}:{hash_}"


def is_view_row(row: dict | None) -> bool:
    """Whether an index row points into a latent view (rather than a raw-wds release)."""
    return row is not None and "latents_member" in row


def load_view_row(row: dict, root: str | Path, reader: ShardReader | None = None) -> dict[str, Any]:
    """One view row as a batch item: ``latents`` [C, f, h, w], ``text_embeds`` [L, D], ``text_mask`` [L],
    ``c2w`` [F, 4, 4], ``K`` [F, 4], ``caption``, ``sample_id`` and ``view_codec`` (``route:codec_hash``)."""
    latents = load_safetensors(read_member(row, "latents_member", root, reader))["latents"]
    text = load_safetensors(read_member(row, "text_member", root, reader))
    with np.load(io.BytesIO(read_member(row, "camera_member", root, reader)), allow_pickle=False) as npz:
        c2w = torch.from_numpy(np.asarray(npz["c2w"], dtype=np.float32))
    K = torch.from_numpy(
        np.asarray(
            np.load(io.BytesIO(read_member(row, "intrinsics_member", root, reader)), allow_pickle=False),
            dtype=np.float32,
        )
    )
    return {
        "latents": latents,
        "text_embeds": text["text_embeds"],
        "text_mask": text["text_mask"],
        "c2w": c2w,
        "K": K,
        "caption": row.get("caption", ""),
        "sample_id": row["sample_id"],
        "view_codec": view_tag(row["route"], row["codec_hash"]),
    }
