"""Causal rollout of the tiny route: is per-block time and memory flat in the horizon?

    python benchmarks/rollout.py                  # blocks 20 vs 2,000: time and RSS ratios (goal <= 1.10)
    python benchmarks/rollout.py --hour           # an hour at 16 fps: 57,597 frames = 14,400 latent frames

Random weights of the tiny Wan2.2-5B config (the cost does not depend on what the weights are), the
4-step re-noising sampler, a procedural walk trajectory, and the full path of `solarwm predict`: streaming
decode and H.264 mp4 writing. Per-block time is the median over 11 blocks around each point; RSS is the
process's resident set (from /proc) right after that block. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

from solarwm.backbones.wan22_ti2v_5b import Wan22TI2V5BAdapter, Wan22TI2V5BConfig
from solarwm.camera.patterns import make_pattern
from solarwm.data.video import VideoWriter, to_uint8_frames
from solarwm.rollout.engine import Rollout


def rss_mib() -> float:
    """Current resident set size of this process in MiB."""
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def run(num_frames: int, size: int, fps: float, marks: tuple[int, ...], out: Path) -> dict:
    """Roll out ``num_frames`` frames; per-block seconds and RSS around each block index in ``marks``."""
    torch.manual_seed(0)
    adapter = Wan22TI2V5BAdapter(config=Wan22TI2V5BConfig.tiny()).eval()
    traj = make_pattern("walk", num_frames, fps, size, size, seed=0)
    rollout = Rollout(adapter, num_steps=4, solver="renoise")
    cond = rollout.conditions(
        torch.zeros(1, 3, size, size), torch.as_tensor(traj.c2w)[None], torch.as_tensor(traj.K, dtype=torch.float32)[None], ["a walk"]
    )
    seconds: list[float] = []
    rss: dict[int, float] = {}
    start = last = time.perf_counter()
    with VideoWriter(out, fps) as writer:
        for index, video in enumerate(rollout.video_blocks(cond, torch.Generator().manual_seed(0))):
            writer.write(to_uint8_frames(video[0]))
            now = time.perf_counter()
            seconds.append(now - last)
            last = now
            if index in marks:
                rss[index] = rss_mib()
        frames = writer.num_frames
    total = time.perf_counter() - start
    per_block = {m: statistics.median(seconds[max(0, m - 5): m + 6]) for m in marks if m < len(seconds)}
    return {"frames": frames, "latent_frames": int(cond["c2w"].shape[1]), "blocks": len(seconds), "seconds": total,
            "per_block_s": per_block, "rss_mib": rss}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=32, help="frame side in pixels (32: 8x8 tokens per latent frame)")
    parser.add_argument("--blocks", type=int, default=2000, help="late mark (block index)")
    parser.add_argument("--hour", action="store_true", help="roll out 57,597 frames at 16 fps (14,400 latent frames)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rollout.mp4"
        if args.hour:
            fps = 16.0
            result = run(4 * 14_399 + 1, args.size, fps, (20, 2000, 4000), out)
            result.update(video_seconds=result["frames"] / fps, realtime_factor=(result["frames"] / fps) / result["seconds"])
        else:
            late = args.blocks
            latent = 3 * (late + 6)
            result = run(4 * (latent - 1) + 1, args.size, 16.0, (20, late), out)
            result["time_ratio"] = result["per_block_s"][late] / result["per_block_s"][20]
            result["rss_ratio"] = result["rss_mib"][late] / result["rss_mib"][20]
        result.update(size=args.size, threads=torch.get_num_threads(), mp4_bytes=out.stat().st_size)
    result["per_block_s"] = {k: round(v, 4) for k, v in result["per_block_s"].items()}
    result["rss_mib"] = {k: round(v, 1) for k, v in result["rss_mib"].items()}
    print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in result.items()}))


if __name__ == "__main__":
    main()
