"""Long-horizon evaluation of a causal export: one-minute worlds of an unseen seed, per 5-s window against the truth.

    python benchmarks/long_horizon.py ADAPTER [--worlds 12] [--seed 9000] [--frames 481] [--fps 8]
        [--window_blocks N] [--strip docs/images/X.png] [--json OUT.json]
    python benchmarks/long_horizon.py ADAPTER --hour [--hour_minutes 60] [--json OUT.json]   # detail curve only

Each world is clip ``i`` of ``solarwm data synth --frames 481 --size 96x64 --fps 8 --seed SEED --motion mixed``
(rendered in process, not written), resized and centre-cropped to the model's 32x32 as the datamodule does. The
export generates it from the truth's first frame under the truth's cameras through a ``RolloutSession`` (what
``solarwm predict``/``play`` run). Per 5-s window: PSNR to the truth, the same for the first frame repeated, and the
detail ratio (generated / truth mean |gradient|), with 95% bootstrap intervals over worlds
(``solarwm.metrics.long_horizon``). ``--strip``: truth over generation, 9 columns per world (0 s .. the end).
``--hour``: one world rolled out for ``--hour_minutes`` at 16 fps; only the generated frames' detail per minute
is kept (no truth is rendered), and the last minute's over the first minute's is reported.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from solarwm.data.sources.synthetic import SynthSpec, build_clip, make_scene, sample_trajectory
from solarwm.datamodules.clips import resize_crop
from solarwm.metrics.long_horizon import detail, summarise, window_figures
from solarwm.rollout.session import RolloutSession

SIZE = 32


def small(frames: np.ndarray, K: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """uint8 ``[N, H, W, 3]`` and K ``[N, 4]`` → the model's 32x32 frames (the datamodule's resize and crop) and K."""
    video = torch.from_numpy(np.ascontiguousarray(frames)).permute(0, 3, 1, 2)
    x, k = resize_crop(video, K, SIZE, SIZE)
    return x.round().clamp(0, 255).byte().permute(0, 2, 3, 1).numpy(), k


def load(
    adapter_dir: str,
    window_blocks: int | None,
    max_offset: int | None = None,
    commit_sigma: float | None = None,
    sink_frames: int | None = None,
) -> torch.nn.Module:
    """The export in eval mode, optionally with another causal window (blocks, the query block included),
    history positions clamped to ``max_offset`` frames before the window's last frame (a training-free probe),
    the committed history re-noised to ``commit_sigma`` (for a model trained with context noise) and another
    attention sink than the export's (``sink_frames``)."""
    from solarwm.backbones import load_adapter

    adapter = load_adapter(adapter_dir).eval()
    if window_blocks is not None:
        adapter.window_blocks = window_blocks  # read by new_cache: the rollout's history is window_blocks - 1 blocks
    if max_offset is not None:
        clamp_history_positions(adapter, max_offset)
    if commit_sigma is not None:
        adapter.commit_sigma = commit_sigma
    if sink_frames is not None:
        adapter.set_sink(sink_frames)
    return adapter


def clamp_history_positions(adapter: torch.nn.Module, max_offset: int) -> None:
    """Probe of positional parity: cached keys older than ``max_offset`` frames before the window's last frame read at
    that offset (RoPE only; cameras unchanged), so no query sees a temporal offset it never saw in training."""
    build = adapter.cached_attention_context

    def clamped(x_t, cond, window, cache, commit):  # noqa: ANN001, ANN202
        context = build(x_t, cond, window, cache, commit)
        context.kv_positions = context.kv_positions.clamp_min(max(0, window.width - 1 - max_offset))
        return context

    adapter.cached_attention_context = clamped


def roll(adapter: torch.nn.Module, first: np.ndarray, caption: str, c2w: np.ndarray, K: np.ndarray, fps: float,
         steps: int, seed: int, keep: bool = True, on_block=None) -> np.ndarray | None:
    """Generate ``len(c2w)`` frames from ``first`` uint8 ``[H, W, 3]`` under ``c2w``/``K``, block by block."""
    session = RolloutSession(adapter, first, caption, K[0], fps, seed, steps)
    out, pos = [], 0
    while pos < len(c2w):
        n = min(session.next_block_frames, len(c2w) - pos)
        frames = session.step(c2w[pos : pos + n], K[pos : pos + n])
        if keep:
            out.append(frames)
        if on_block is not None:
            on_block(pos, frames)
        pos += n
    return np.concatenate(out) if keep else None


def strip(rows: list[tuple[np.ndarray, np.ndarray]], path: str, columns: int = 9) -> None:
    """A PNG of truth over generation per world, ``columns`` evenly spaced frames (first to last), 3x nearest."""
    from PIL import Image

    blocks = []
    for truth, gen in rows:
        idx = np.linspace(0, len(truth) - 1, columns).round().astype(int)
        pad = np.zeros((SIZE, 2, 3), np.uint8)
        line = lambda v: np.concatenate([np.concatenate([v[i], pad], 1) for i in idx], 1)  # noqa: E731
        blocks += [line(truth), line(gen), np.zeros((3, line(truth).shape[1], 3), np.uint8)]
    image = Image.fromarray(np.concatenate(blocks, 0))
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    image.resize((image.width * 3, image.height * 3), Image.NEAREST).save(path)


def world(spec: SynthSpec, index: int, cache: str | None) -> tuple[np.ndarray, np.ndarray, np.ndarray, str]:
    """World ``index``'s 32x32 truth, K, c2w and caption (read from / written to ``cache`` when given: rendering
    a minute takes longer than generating it)."""
    path = None if cache is None else Path(cache) / f"{spec.seed}-{spec.motion}-{spec.frames}-{spec.fps}-{index}.npz"
    if path is not None and path.is_file():
        z = np.load(path)
        return z["truth"], z["K"], z["c2w"], str(z["caption"])
    clip, _ = build_clip(spec, index)
    truth, K = small(clip.frames, clip.K)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        np.savez(path, truth=truth, K=K, c2w=clip.c2w, caption=np.array(clip.caption))
    return truth, K, clip.c2w, clip.caption


def one_minute(args: argparse.Namespace) -> dict:
    """The per-window figures of ``args.worlds`` worlds (see module docstring)."""
    adapter = load(args.adapter, args.window_blocks, args.max_offset, args.commit_sigma, args.sink_frames)
    spec = SynthSpec(frames=args.frames, width=96, height=64, fps=args.fps, seed=args.seed, motion=args.motion)
    window = int(round(5 * args.fps))
    per_world, rows, seconds = [], [], 0.0
    for i in range(args.worlds):
        truth, K, c2w, caption = world(spec, i, args.cache)
        t0 = time.perf_counter()
        gen = roll(adapter, truth[0], caption, c2w, K, args.fps, args.steps, args.draw)
        seconds += time.perf_counter() - t0
        figures = window_figures(gen, truth, window)
        per_world.append(figures)
        rows.append((truth, gen))
        print(f"world {i}: detail ratio per 5 s {np.round(figures['detail_ratio'], 2).tolist()} "
              f"psnr-static {np.round(figures['psnr'] - figures['psnr_static'], 2).tolist()}", flush=True)
    if args.strip:
        strip(rows[: args.strip_worlds], args.strip)
    result = summarise(per_world)
    result["per_world_detail_ratio"] = [w["detail_ratio"].round(3).tolist() for w in per_world]
    result["per_world_gap"] = [(w["psnr"] - w["psnr_static"]).round(3).tolist() for w in per_world]
    result["generated_frames_per_second"] = round(args.worlds * args.frames / seconds, 1)
    return result


def one_hour(args: argparse.Namespace) -> dict:
    """One world rolled out for ``args.hour_minutes`` minutes at 16 fps: generated detail per minute."""
    fps, per_minute = 16.0, 16 * 60
    frames = int(args.hour_minutes * per_minute) + 1
    adapter = load(args.adapter, args.window_blocks, args.max_offset, args.commit_sigma, args.sink_frames)
    rng = np.random.default_rng([args.seed, 0, 0x40])
    traj = sample_trajectory(rng, frames, 96, 64, fps, args.motion)
    scene = make_scene(rng, traj.c2w)
    from solarwm.data.sources.render import render_views

    first = render_views(scene, traj.c2w[:1], traj.K[:1], 96, 64)
    first_small, K = small(first, np.repeat(traj.K[:1], frames, 0))
    sums = np.zeros(int(np.ceil(frames / per_minute)))
    counts = np.zeros_like(sums)
    t0 = time.perf_counter()

    def on_block(pos: int, block: np.ndarray) -> None:
        d = detail(block)
        for j, value in enumerate(d):
            sums[(pos + j) // per_minute] += value
            counts[(pos + j) // per_minute] += 1
        if (pos // per_minute) != ((pos + len(block)) // per_minute):
            print(f"minute {(pos + len(block)) // per_minute}: {time.perf_counter() - t0:.0f} s", flush=True)

    roll(adapter, first_small[0], "", traj.c2w, K, fps, args.steps, args.draw, keep=False, on_block=on_block)
    seconds = time.perf_counter() - t0
    curve = (sums / np.maximum(counts, 1)).round(5).tolist()
    full = [c for c, n in zip(curve, counts) if n >= per_minute // 2]
    return {
        "minutes": args.hour_minutes,
        "frames": frames,
        "detail_per_minute": curve,
        "last_over_first": round(full[-1] / full[0], 3),
        "truth_first_frame_detail": round(float(detail(first_small)[0]), 5),
        "generated_frames_per_second": round(frames / seconds, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("adapter")
    parser.add_argument("--worlds", type=int, default=12)
    parser.add_argument("--seed", type=int, default=9000, help="world seed (unseen by every recipe)")
    parser.add_argument("--frames", type=int, default=481)
    parser.add_argument("--fps", type=float, default=8.0)
    parser.add_argument("--motion", default="mixed")
    parser.add_argument("--steps", type=int, default=2, help="steps per block (recipes/tiny_dmd.yaml: 2)")
    parser.add_argument("--draw", type=int, default=0, help="noise seed of the rollouts")
    parser.add_argument(
        "--window_blocks", type=int, default=None, help="causal window in blocks (default: the export's)"
    )
    parser.add_argument(
        "--max_offset",
        type=int,
        default=None,
        help="probe: clamp cached keys' temporal positions to this many frames before the last",
    )
    parser.add_argument("--commit_sigma", type=float, default=None, help="noise level of the committed history")
    parser.add_argument("--sink_frames", type=int, default=None, help="attention sink (default: the export's)")
    parser.add_argument("--strip", default=None, help="PNG path of the truth-over-generation strip")
    parser.add_argument("--strip_worlds", type=int, default=4)
    parser.add_argument("--hour", action="store_true", help="the hour-long detail curve instead")
    parser.add_argument("--hour_minutes", type=float, default=60.0)
    parser.add_argument("--json", default=None)
    parser.add_argument("--cache", default=None, help="folder for the rendered truths (reused across models)")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    result = one_hour(args) if args.hour else one_minute(args)
    result["command"] = vars(args)
    text = json.dumps(result, indent=1)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(text + "\n")
        print_summary(result)
        print(f"wrote {args.json}")
    else:
        print(text)


def print_summary(r: dict) -> None:
    """The figures the targets read, in a few lines."""
    if "detail_per_minute" in r:
        print(
            f"hour ({r['minutes']} min at 16 fps): generated detail per minute {r['detail_per_minute']}; "
            f"last / first minute {r['last_over_first']}; {r['generated_frames_per_second']} frames/s"
        )
        return
    print(f"one minute, {r['worlds']} unseen worlds, per 5-s window:")
    print("  detail ratio (mean)   " + " ".join(f"{v:6.2f}" for v in r["detail_ratio_per_window"]))
    print("  PSNR - first frame dB " + " ".join(f"{v:6.2f}" for v in r["gap_per_window"]))
    lo, hi = r["detail_in_band_ci"]
    print(
        f"  (world, window) pairs with detail in [0.6, 1.6]: {r['detail_in_band']:.2f} [{lo:.2f}, {hi:.2f}]; "
        f"worst mean gap from 5 s on {r['worst_gap_db']:.2f} dB {r['worst_gap_ci']} (window {r['worst_gap_window']})"
    )


if __name__ == "__main__":
    main()
