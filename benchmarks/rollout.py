"""Causal rollout of the tiny route: is per-block time and memory flat in the horizon?

    python benchmarks/rollout.py                  # blocks 20 vs 2,000: time and RSS ratios (goal <= 1.10)
    python benchmarks/rollout.py --hour           # an hour at 16 fps: 57,597 frames = 14,400 latent frames

Random weights of the tiny Wan2.2-5B config (the cost does not depend on what the weights are), the
4-step re-noising sampler, a procedural walk trajectory, and the full path of `solarwm predict`: streaming
decode and H.264 mp4 writing. Per-block time is the median over 11 blocks around each point, the early
and the late blocks timed alternately so that load on the machine affects both alike; RSS is the
process's resident set (from /proc) after that block of the long rollout. Prints one JSON object.
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


def setup(
    num_frames: int, size: int, fps: float, adapter: Wan22TI2V5BAdapter | None = None, height: int | None = None,
    device: str = "cpu",
) -> tuple[Rollout, dict]:
    """A route (default: the tiny one with random weights), the 4-step sampler and the conditions of a walk.

    ``num_frames`` frames of ``size`` (width) x ``height`` (default: square), on ``device``.
    """
    torch.manual_seed(0)
    height = height or size
    adapter = (adapter or Wan22TI2V5BAdapter(config=Wan22TI2V5BConfig.tiny())).eval()
    traj = make_pattern("walk", num_frames, fps, size, height, seed=0)
    rollout = Rollout(adapter, num_steps=4, solver="renoise")
    cond = rollout.conditions(
        torch.zeros(1, 3, height, size, device=device), torch.as_tensor(traj.c2w, device=device)[None],
        torch.as_tensor(traj.K, dtype=torch.float32, device=device)[None], ["a walk"],
    )
    return rollout, cond


def blocks_to_mp4(rollout: Rollout, cond: dict, writer: VideoWriter):
    """The predict path block by block: generate, stream-decode, encode into the mp4."""
    for video in rollout.video_blocks(cond, torch.Generator().manual_seed(0)):
        writer.write(to_uint8_frames(video[0]))
        yield


def timed(step) -> float:
    start = time.perf_counter()
    next(step)
    return time.perf_counter() - start


def flatness(late: int, size: int, out_dir: Path, window: int = 11) -> dict:
    """Per-block time and RSS at block 20 against block ``late`` of one long rollout.

    Machines under load drift over minutes, so the two times are taken in the same minute: the long
    rollout is advanced past block ``late``, a fresh rollout to block ``20 - window/2``, and then their next
    ``window`` blocks are timed alternately. RSS is read from the long rollout alone, at blocks 20 and ``late``.
    """
    fps, half = 16.0, window // 2
    latent = 3 * (late + window + 2)
    rollout, cond = setup(4 * (latent - 1) + 1, size, fps)
    rss: dict[int, float] = {}
    start = time.perf_counter()
    with VideoWriter(out_dir / "long.mp4", fps) as long_writer, VideoWriter(out_dir / "short.mp4", fps) as short_writer:
        long_run = blocks_to_mp4(rollout, cond, long_writer)
        for index in range(late + 1):
            next(long_run)
            if index in (20, late):
                rss[index] = rss_mib()
        fresh = blocks_to_mp4(rollout, cond, short_writer)
        for _ in range(20 - half):
            next(fresh)
        early_s, late_s = [], []
        for _ in range(window):
            late_s.append(timed(long_run))
            early_s.append(timed(fresh))
    return {"blocks": late + window + 1, "seconds": time.perf_counter() - start,
            "per_block_s": {20: statistics.median(early_s), late: statistics.median(late_s)}, "rss_mib": rss}


def hour(size: int, out_dir: Path) -> dict:
    """Wall time of an hour-scale rollout to mp4: 57,597 frames at 16 fps = 14,400 latent frames."""
    fps = 16.0
    rollout, cond = setup(4 * 14_399 + 1, size, fps)
    rss: dict[int, float] = {}
    start = time.perf_counter()
    with VideoWriter(out_dir / "hour.mp4", fps) as writer:
        for index, _ in enumerate(blocks_to_mp4(rollout, cond, writer)):
            if index in (20, 2000, 4000):
                rss[index] = rss_mib()
        frames = writer.num_frames
    seconds = time.perf_counter() - start
    return {"frames": frames, "latent_frames": int(cond["c2w"].shape[1]), "seconds": seconds, "rss_mib": rss,
            "video_seconds": frames / fps, "generated_fps": frames / seconds}


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
        if args.hour:
            result = hour(args.size, Path(tmp))
        else:
            result = flatness(args.blocks, args.size, Path(tmp))
            late = args.blocks
            result["time_ratio"] = result["per_block_s"][late] / result["per_block_s"][20]
            result["rss_ratio"] = result["rss_mib"][late] / result["rss_mib"][20]
            result["per_block_s"] = {k: round(v, 4) for k, v in result["per_block_s"].items()}
        result.update(size=args.size, threads=torch.get_num_threads())
    result["rss_mib"] = {k: round(v, 1) for k, v in result["rss_mib"].items()}
    print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in result.items()}))


if __name__ == "__main__":
    main()
