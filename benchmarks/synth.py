"""Throughput of `solarwm data synth`: clips/s and frames/s, split into rendering and encoding.

    python benchmarks/synth.py [--clips 200] [--frames 33] [--size 64x64] [--workers 2]

Renders a corpus into a temporary folder twice, with one worker (the baseline) and with
``--workers``, and prints the figures of both runs plus the parallel speed-up.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time

from solarwm.data.sources.synthetic import synth_corpus
from solarwm.util.parsing import parse_size


def run(clips: int, frames: int, width: int, height: int, workers: int, bad_fraction: float) -> dict:
    """One timed corpus render into a fresh temporary folder."""
    with tempfile.TemporaryDirectory() as out:
        t0 = time.perf_counter()
        s = synth_corpus(out, clips=clips, frames=frames, width=width, height=height,
                         seed=0, bad_fraction=bad_fraction, workers=workers)
        wall = time.perf_counter() - t0
    busy = s["render_s"] + s["write_s"]
    return {
        "workers": workers, "clips": clips, "frames_per_clip": frames, "size": f"{width}x{height}",
        "wall_s": round(wall, 2),
        "clips_per_s": round(clips / wall, 2),
        "frames_per_s": round(clips * frames / wall, 1),
        # Per-process CPU seconds summed over workers: where the time goes.
        "render_s": s["render_s"], "encode_write_s": s["write_s"],
        "render_share": round(s["render_s"] / busy, 3) if busy else None,
        "render_frames_per_s": round(clips * frames / s["render_s"], 1) if s["render_s"] else None,
        "encode_frames_per_s": round(clips * frames / s["write_s"], 1) if s["write_s"] else None,
    }


def main() -> None:
    """Parse arguments, time the baseline and the parallel run, print JSON lines."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clips", type=int, default=200)
    p.add_argument("--frames", type=int, default=33)
    p.add_argument("--size", default="64x64")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--bad-fraction", type=float, default=0.0)
    a = p.parse_args()
    width, height = parse_size(a.size)
    base = run(a.clips, a.frames, width, height, 1, a.bad_fraction)
    print(json.dumps(base))
    if a.workers > 1:
        par = run(a.clips, a.frames, width, height, a.workers, a.bad_fraction)
        print(json.dumps(par))
        print(json.dumps({"speedup_vs_1_worker": round(base["wall_s"] / par["wall_s"], 2)}))


if __name__ == "__main__":
    main()
