"""`solarwm play` end to end: generated fps, real-time factor and control latency through the real server.

    python benchmarks/interactive.py                         # 32x32 and 64x64, 20 trials each
    python benchmarks/interactive.py --adapter DIR --trials 30 --sizes 32

For each size a `solarwm play` process serves the tiny route (default: the shipped
`recipes/weights/tiny_causal`; without it, `recipes/weights/tiny_base4`'s weights exported as a causal
model — the cost of a block does not depend on what the weights are) and a WebSocket client
(`websockets`) drives it like the page does:

* generated fps: frames per second of generation per block (the block messages' `fps`), median and p95
  of the per-block time; the real-time factor is generated fps / target fps (goal >= 1.5 at 16 fps);
* latency: a trial waits a random fraction of a block, sends a `move` with a twist never used before,
  and times the arrival of the first frame generated under it (its block is the first whose cameras move
  at that speed); median and p95 over the trials (goal <= one block's duration + 100 ms).

Prints one JSON object. The figures depend on the machine's load (report it: `uptime` is included).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def default_adapter(workdir: Path) -> tuple[str, str]:
    """The shipped tiny causal model, or tiny_base4's weights exported as a causal model (same cost)."""
    shipped = ROOT / "recipes" / "weights" / "tiny_causal"
    if (shipped / "adapter.json").is_file():
        return str(shipped), "recipes/weights/tiny_causal"
    from solarwm.backbones.base import load_adapter

    out = load_adapter(ROOT / "recipes" / "weights" / "tiny_base4").save_adapter(workdir / "causal", stage="dmd")
    return str(out), "recipes/weights/tiny_base4 exported as a causal model (tiny_causal not present)"


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


async def measure(port: int, fps: float, block_frames: int, trials: int, seed: int) -> dict:
    import websockets

    rng = random.Random(seed)
    arrivals: list[float] = []  # arrival time of every frame
    blocks: list[dict] = []  # block messages with the index of their first frame
    async with websockets.connect(f"ws://127.0.0.1:{port}/ws", max_size=None) as ws:
        async def reader() -> None:
            async for message in ws:
                if isinstance(message, bytes):
                    arrivals.append(time.perf_counter())
                else:
                    data = json.loads(message)
                    if data["type"] == "block":
                        data["first"] = len(arrivals) - data["frames"]
                        blocks.append(data)

        task = asyncio.create_task(reader())
        while len(blocks) < 2:  # warm-up: the first block and one whole block
            await asyncio.sleep(0.01)
        latencies = []
        for k in range(trials):
            await asyncio.sleep(rng.uniform(0, block_frames / fps))
            speed = 0.05 + 0.01 * k  # m/s, a twist no earlier block used
            sent = time.perf_counter()
            await ws.send(json.dumps({"type": "move", "velocity": [0, 0, speed], "angular": [0, 0, 0]}))
            while True:
                hit = next((b for b in blocks if len(b["c2w"]) > 1 and abs(
                    (np.linalg.inv(b["c2w"][0]) @ np.asarray(b["c2w"][1]))[2, 3] * fps - speed) < 1e-6), None)
                if hit is not None:
                    latencies.append(arrivals[hit["first"]] - sent)
                    break
                await asyncio.sleep(0.005)
        task.cancel()
    timed = [b for b in blocks[1:] if b["frames"] == block_frames]  # whole blocks after the first
    gen_fps = [b["fps"] for b in timed]
    return {
        "blocks": len(timed), "generated_fps_median": round(statistics.median(gen_fps), 2),
        "generated_fps_p5": round(percentile(gen_fps, 5), 2),
        "real_time_factor_median": round(statistics.median(gen_fps) / fps, 3),
        "block_gen_ms_median": round(statistics.median(b["gen_ms"] for b in timed), 1),
        "block_gen_ms_p95": round(percentile([b["gen_ms"] for b in timed], 95), 1),
        "latency_ms_median": round(1000 * statistics.median(latencies), 1),
        "latency_ms_p95": round(1000 * percentile(latencies, 95), 1),
        "latency_goal_ms": round(1000 * block_frames / fps + 100, 1), "trials": len(latencies),
    }


def run_size(adapter: str, size: int, fps: float, trials: int, num_steps: int, seed: int) -> dict:
    port = free_port()
    cmd = [sys.executable, "-m", "solarwm.cli", "play", "--adapter", adapter, "--port", str(port),
           "--width", str(size), "--height", str(size), "--fps", str(fps), "--num_steps", str(num_steps)]
    process = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 600
        while True:
            if process.poll() is not None:
                raise RuntimeError(process.stderr.read().decode()[-2000:])
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/config.json", timeout=2) as r:
                    config = json.loads(r.read())
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        result = asyncio.run(measure(port, fps, config["frames_per_block"], trials, seed))
        return {"size": f"{size}x{size}", "target_fps": fps, "frames_per_block": config["frames_per_block"], **result}
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--adapter", help="a causal adapter export (default: see module docstring)")
    parser.add_argument("--sizes", type=int, nargs="+", default=[32, 64])
    parser.add_argument("--fps", type=float, default=16.0)
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--num_steps", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        adapter, source = (args.adapter, args.adapter) if args.adapter else default_adapter(Path(tmp))
        results = [run_size(adapter, s, args.fps, args.trials, args.num_steps, args.seed) for s in args.sizes]
    print(json.dumps({
        "adapter": source, "num_steps": args.num_steps, "cpus": os.cpu_count(),
        "load_average": [round(x, 2) for x in os.getloadavg()], "results": results,
    }, indent=2))


if __name__ == "__main__":
    main()
