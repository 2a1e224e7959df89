"""Benchmark the training data path: decoded windows/s from a release against raw PyAV decode, and the latent view.

    python benchmarks/loader.py [--clips 16] [--frames 33] [--size 96x64] [--num-frames 17] [--view-size 64x64]
                                [--batch-size 2] [--repeats 3] [--workdir DIR]

Builds a small release in ``--workdir`` (rendered worlds → pack → a recipe of packed windows → a latent view
of the tiny ``wan22_ti2v_5b`` route), then measures, in the same run and interleaved (best of ``--repeats``):

* ``raw_pyav``: the baseline, PyAV decoding every window's video member straight from the shards (no
  windowing, resizing or batching): the floor a loader built on these shards cannot beat;
* ``release``: ``WorldDataModule`` in recipe mode, the batches ``solarwm fit`` trains on (decode, window,
  resize/crop, intrinsics, collate); its ratio to ``raw_pyav`` is the loader's efficiency (goal >= 0.9);
* ``view``: ``WorldDataModule`` on the latent view (no decode, no encode), in windows/s and batches/s.

The loader runs with ``--torch-threads`` (default 1) torch threads, as each DataLoader worker does
(PyTorch sets one thread per worker); on a loaded machine more threads spin against other processes.
Prints one JSON object. Wall time on a shared machine is noisy; the ratios come from the same run.
"""

from __future__ import annotations

import argparse
import io
import json
import tempfile
import time
from pathlib import Path

import av
import torch
import yaml

from solarwm.cli import main as solarwm
from solarwm.data.contract import iter_clip_dirs, update_meta
from solarwm.data.index import ShardReader, read_index, read_member
from solarwm.data.sources.synthetic import synth_corpus
from solarwm.datamodules import WorldDataModule
from solarwm.util.parsing import parse_size


def build(work: Path, clips: int, frames: int, size: str, num_frames: int, view_size: str) -> dict[str, Path]:
    """Rendered corpus → release → recipe (packed windows of ``num_frames``) → latent view; reused when present."""
    corpus, release, recipe, view = work / "corpus", work / "release", work / "recipe", work / "view"
    width, height = parse_size(size)
    synth_corpus(corpus, clips=clips, frames=frames, width=width, height=height, fps=16.0, seed=0)
    for folder in iter_clip_dirs(corpus):  # keep every clip: the benchmark is about reading, not selection
        update_meta(
            folder, lambda doc: doc.update(selection={"policy": "bench", "version": "1", "tier": "high", "reasons": []})
        )
    spec = {
        "name": "bench",
        "owners": ["synthetic"],
        "tiers": ["kept-high"],
        "window": {"frames": num_frames, "mode": "packed"},
        "test_view": {"per_owner": 0},
    }
    (work / "spec.yaml").write_text(yaml.safe_dump(spec))
    vw, vh = parse_size(view_size)
    for argv in (
        ["data", "pack", "--corpus", str(corpus), "--out", str(release)],
        ["data", "recipe", "--release", str(release), "--spec", str(work / "spec.yaml"), "--out", str(recipe)],
        [
            "data",
            "latents",
            "--index",
            str(recipe / "train-index.jsonl.gz"),
            "--root",
            str(release),
            "--out",
            str(view),
            "--route",
            "wan22_ti2v_5b",
            "--num-frames",
            str(num_frames),
            "--width",
            str(vw),
            "--height",
            str(vh),
        ],
    ):
        if solarwm(argv) != 0:
            raise SystemExit(f"failed: solarwm {' '.join(argv)}")
    return {"release": release, "index": recipe / "train-index.jsonl.gz", "view": view}


def raw_pyav(rows: list[dict], release: Path) -> float:
    """Windows/s of PyAV alone: read each row's video member from its shard and decode every frame to RGB."""
    reader = ShardReader()
    t0 = time.perf_counter()
    for row in rows:
        with av.open(io.BytesIO(read_member(row, "video_member", release, reader))) as container:
            frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
        assert frames
    return len(rows) / (time.perf_counter() - t0)


def loader(dm: WorldDataModule) -> tuple[float, float]:
    """(windows/s, batches/s) over one epoch of the datamodule's training batches (main process)."""
    dm.setup("fit")
    windows = batches = 0
    t0 = time.perf_counter()
    for batch in dm.train_dataloader():
        windows += len(batch["sample_id"])
        batches += 1
    wall = time.perf_counter() - t0
    return windows / wall, batches / wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clips", type=int, default=16)
    parser.add_argument("--frames", type=int, default=33)
    parser.add_argument("--size", default="96x64")
    parser.add_argument("--num-frames", type=int, default=17)
    parser.add_argument("--view-size", default="64x64")
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--torch-threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.torch_threads)

    work = Path(args.workdir or tempfile.mkdtemp(prefix="solarwm-loader-"))
    paths = build(work, args.clips, args.frames, args.size, args.num_frames, args.view_size)
    rows = read_index(paths["index"], paths["release"])
    vw, vh = parse_size(args.view_size)
    geometry = dict(num_frames=args.num_frames, width=vw, height=vh, batch_size=args.batch_size, shuffle=False)
    best = {"raw_pyav": 0.0, "release": 0.0, "view": 0.0, "view_batches": 0.0}
    for _ in range(args.repeats):  # interleaved, so load on the machine hits every path alike
        best["raw_pyav"] = max(best["raw_pyav"], raw_pyav(rows, paths["release"]))
        release_dm = WorldDataModule(**geometry, train_index=str(paths["index"]), release_root=str(paths["release"]))
        best["release"] = max(best["release"], loader(release_dm)[0])
        windows, batches = loader(WorldDataModule(**geometry, latent_view=str(paths["view"])))
        best["view"], best["view_batches"] = max(best["view"], windows), max(best["view_batches"], batches)
    print(
        json.dumps(
            {
                "workdir": str(work),
                "windows": len(rows),
                "clip": f"{args.frames} frames {args.size}",
                "window": f"{args.num_frames} frames {args.view_size}",
                "batch_size": args.batch_size,
                "repeats": args.repeats,
                "torch_threads": args.torch_threads,
                "raw_pyav_windows_per_s": round(best["raw_pyav"], 2),
                "release_windows_per_s": round(best["release"], 2),
                "release_vs_raw_pyav": round(best["release"] / best["raw_pyav"], 3),
                "view_windows_per_s": round(best["view"], 2),
                "view_batches_per_s": round(best["view_batches"], 2),
                "view_vs_release": round(best["view"] / best["release"], 2),
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
