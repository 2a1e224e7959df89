"""Hand-made canonical clips with chosen outcomes (tier, failed, pending): the data engine's fixtures."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from solarwm.data.contract import Clip, write_clip
from solarwm.datamodules import WorldDataModule
from solarwm.datamodules.world import SynthCorpus

# (clip_id, owner, outcome, num_frames); outcome is a tier, "failed" or "pending"
DEFAULT_CLIPS = (
    ("clip-a.0", "synthetic", "xhigh", 6),
    ("clip-b.1", "synthetic", "high", 8),
    ("clip-c.2", "synthetic", "high", 5),
    ("clip-d.3", "synthetic", "rejected", 4),
    ("clip-e.4", "synthetic", "xhigh", 7),
    ("clip-f.5", "abot", "high", 9),
    ("clip-g.6", "abot", "rejected", 6),
    ("clip-h.7", "abot", "failed", 5),
    ("clip-i.8", "abot", "pending", 5),
)


def make_corpus(root: Path, clips=DEFAULT_CLIPS, size: int = 16, seed: int = 0) -> Path:
    """Write tiny canonical clips (smooth frames, valid cameras) with the given outcomes."""
    rng = np.random.default_rng(seed)
    corpus = root / "corpus"
    for clip_id, owner, result, n in clips:
        t = np.arange(n, dtype=np.float64)
        yy, xx = np.mgrid[0:size, 0:size]
        base = rng.integers(0, 200)
        frames = np.stack(
            [
                np.stack([(xx * 8 + 4 * i + base) % 256, (yy * 8 + base) % 256, np.full_like(xx, 40 * (i % 5))], -1)
                for i in range(n)
            ]
        ).astype(np.uint8)
        c2w = np.tile(np.eye(4), (n, 1, 1))
        c2w[:, 0, 3] = 0.1 * t + rng.normal()
        K = np.tile([20.0 + rng.random(), 20.0, size / 2, size / 2], (n, 1))
        stages = {"annotate": {"status": "ok", "version": "1", "keys": ["metrics.vmaf"]}}
        if result == "failed":
            stages["annotate"] = {"status": "failed", "version": "1", "error": "decoder exploded"}
        selection = None
        if result in ("xhigh", "high", "rejected"):
            reasons = ["metrics.vmaf >= 0.5"] if result == "rejected" else []
            selection = {"policy": "solarwm-v1", "version": "1.0.0", "tier": result, "reasons": reasons}
        clip = Clip(
            clip_id=clip_id,
            frames=frames,
            c2w=c2w,
            K=K,
            caption=f"a test world {clip_id}",
            meta={"fps": 8.0},
            metrics={
                "metrics.vmaf": float(rng.uniform(0, 10)),
                "metrics.saturation": float(rng.uniform(0, 200)),
                "camera.finite": True,
            },
            provenance={
                "owner": owner,
                "original_id": clip_id,
                "frame_interval": [0, n],
                "conversions": [],
                "versions": {},
                "stages": stages,
            },
            selection=selection,
        )
        write_clip(clip, corpus)
    return corpus


def synth_worlds(root: Path, frames: int, clips: int = 2) -> WorldDataModule:
    """A 32×32 ``WorldDataModule`` of whole ``frames``-frame clips over rendered worlds in ``root`` (rendered once,
    one held out, batch 1, in order): what the causal-stage tests train and roll out on."""
    dm = WorldDataModule(corpus_dir=str(root), synth=SynthCorpus(clips=clips, frames=frames, width=32, height=32,
                         fps=8.0), num_frames=frames, width=32, height=32, num_val_clips=1, batch_size=1, shuffle=False)
    dm.prepare_data()
    return dm


def first_batch(dm: WorldDataModule) -> dict:
    """The first training batch of ``dm``."""
    dm.setup("fit")
    return next(iter(dm.train_dataloader()))
