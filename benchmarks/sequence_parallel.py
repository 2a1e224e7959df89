"""Ulysses sequence parallelism: one stage-1 step per sequence-parallel size P at a fixed global batch of 1 sample.

    python benchmarks/sequence_parallel.py              # CUDA (nccl): P in {1, 2, 4, 8} up to the GPUs present
    python benchmarks/sequence_parallel.py --dry-run    # CPU (gloo): P in {1, 2}, tiny Wan2.2-5B, 2 processes
    python benchmarks/sequence_parallel.py --dry-run --route ltx25   # the same for tiny LTX-2.5 (whole-frame split)
    python benchmarks/device.py --sequence-parallel     # the same, inside device.py's figures

For each P, P processes split every token of the sample (``solarwm.backbones.sequence_parallel``) and take
stage-1 steps (``BidirectionalModule.flow_loss``, backward, the group's gradient average, AdamW). Printed per P
(one JSON object): seconds per step (median after a warm-up), tokens per second (the sample's tokens / step
time), and per rank the peak memory: CUDA's peak allocation on a GPU; on the CPU the bytes of the tensors
autograd saves for the backward (the activations, counted once per storage) and the process's peak resident
set (``ru_maxrss``, which also holds the interpreter, the libraries and the weights). A CPU rank uses one thread.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

#: Shapes: the published Wan2.2-5B at 480p for 81 frames (21 latents x 390 tokens), and a tiny CPU one.
SHAPES = {
    "published": {"frames": 81, "width": 832, "height": 480, "checkpointing": True},
    "dry_run": {"frames": 17, "width": 64, "height": 64, "checkpointing": False},
}


class SavedBytes:
    """Bytes of the distinct storages autograd saves for the backward while active (the activations)."""

    def __init__(self) -> None:
        self.storages: dict[int, int] = {}

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        self.storages[storage.data_ptr()] = storage.nbytes()
        return t

    @property
    def mib(self) -> float:
        return sum(self.storages.values()) / 2**20


#: Routes it measures; on a GPU only Wan2.2-5B (the others' published sizes need FSDP, which this does not shard).
ROUTES = ("wan22_ti2v_5b", "ltx25")


def _worker(rank: int, world: int, init: str, dry_run: bool, steps: int, out: str, route: str) -> None:
    from train_step import make_batch

    from solarwm.backbones.base import route_class
    from solarwm.backbones.sequence_parallel import enable_sequence_parallel
    from solarwm.kernels.ulysses import SequenceParallel
    from solarwm.stages.bidirectional import BidirectionalModule

    cuda = not dry_run
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(1)  # one core per rank: P ranks use P cores, as P GPUs would
    dist.init_process_group("nccl" if cuda else "gloo", init_method=f"file://{init}", rank=rank, world_size=world)
    shape = SHAPES["dry_run" if dry_run else "published"]
    torch.manual_seed(0)
    adapter_class = route_class(route)
    config = adapter_class.config_class.tiny()
    if not dry_run:
        config = dataclasses.replace(adapter_class.config_class.published(), text_encoder="hashing")
    adapter = adapter_class(config=config, device=str(device)).to(device)
    if shape["checkpointing"]:
        adapter.transformer.enable_gradient_checkpointing()
    if world > 1:
        enable_sequence_parallel(adapter, SequenceParallel())
    module = BidirectionalModule(adapter, optimizer=lambda p: torch.optim.AdamW(p, lr=1e-5), lr_scheduler=None)
    module = module.to(device)
    module.train()
    optimizer = module.configure_optimizers()["optimizer"]
    params = adapter.trainable_parameters()
    batch = make_batch(shape["frames"], shape["width"], 1, height=shape["height"])
    batch = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
    f = adapter.latent_frames(shape["frames"])
    h, w = shape["height"] // adapter.spatial_compression, shape["width"] // adapter.spatial_compression
    tokens = f * adapter.tokens_per_frame(h, w)
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    times, saved = [], SavedBytes()
    for step in range(steps + 1):
        dist.barrier()
        start = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
            with torch.autograd.graph.saved_tensors_hooks(saved.pack if step == 0 else (lambda t: t), lambda t: t):
                loss, _ = module.flow_loss(batch)
        loss.backward()
        for p in params:  # the group's ranks hold partial gradients of the same sample: their mean (FSDP's reduce)
            if p.grad is not None:
                dist.all_reduce(p.grad)
                p.grad /= world
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    seconds = statistics.median(times[1:])
    row = {"rank": rank, "loss": loss.item(), "s_per_step": seconds, "tokens": tokens, "tokens_per_s": tokens / seconds,
           "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    if cuda:
        row["peak_memory_mib"] = torch.cuda.max_memory_allocated(device) / 2**20
    else:
        row["saved_activations_mib"] = saved.mib
    Path(out, f"rank{rank}.json").write_text(json.dumps(row))
    dist.destroy_process_group()


def measure(size: int, dry_run: bool, steps: int, route: str = "wan22_ti2v_5b") -> dict[str, Any]:
    """One stage-1 step on ``size`` processes sharing the sample's tokens: per-rank figures and their worst."""
    with tempfile.TemporaryDirectory() as tmp:
        args = (size, os.path.join(tmp, "init"), dry_run, steps, tmp, route)
        mp.spawn(_worker, args=args, nprocs=size, join=True)
        rows = [json.loads(Path(tmp, f"rank{r}.json").read_text()) for r in range(size)]
    memory_key = "saved_activations_mib" if dry_run else "peak_memory_mib"
    return {
        "P": size, "tokens_per_sample": rows[0]["tokens"], "loss": rows[0]["loss"],
        "s_per_step": max(r["s_per_step"] for r in rows),
        "tokens_per_s": min(r["tokens_per_s"] for r in rows),
        f"{memory_key}_per_rank": [round(r[memory_key], 2) for r in rows],
        "peak_rss_mib_per_rank": [round(r["peak_rss_mib"], 1) for r in rows],
    }


def run(dry_run: bool, steps: int = 3, sizes: list[int] | None = None, route: str = "wan22_ti2v_5b") -> dict[str, Any]:
    """Figures for each P in ``sizes`` (default: {1, 2} on the CPU; {1, 2, 4, 8} up to the GPUs present)."""
    if route not in ROUTES or (route != "wan22_ti2v_5b" and not dry_run):
        raise SystemExit(f"--route {route}: measured here with --dry-run only, or wan22_ti2v_5b on a GPU")
    if sizes is None:
        available = 2 if dry_run else torch.cuda.device_count()
        sizes = [p for p in (1, 2, 4, 8) if p <= available]
    shape = SHAPES["dry_run" if dry_run else "published"]
    return {"device": "cpu (gloo)" if dry_run else torch.cuda.get_device_name(0), "route": route, "shape": shape,
            "global_batch": 1, "by_P": [measure(p, dry_run, steps, route) for p in sizes]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="tiny shapes on CPU processes (gloo)")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per P (after one warm-up)")
    parser.add_argument("--sizes", type=int, nargs="*", default=None, help="sequence-parallel sizes to measure")
    parser.add_argument("--route", default="wan22_ti2v_5b", choices=ROUTES)
    args = parser.parse_args()
    if not args.dry_run and not torch.cuda.is_available():
        raise SystemExit("no CUDA device: run with --dry-run on the CPU")
    print(json.dumps(run(args.dry_run, args.steps, args.sizes, args.route), indent=1))


if __name__ == "__main__":
    main()
