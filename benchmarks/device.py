"""GPU figures at Wan2.2-TI2V-5B size, for when a machine with a GPU is lent. Prints one JSON object.

    python benchmarks/device.py              # CUDA: attention, a training step, a 200-block causal rollout
    python benchmarks/device.py --dry-run    # the same code at tiny shapes on the CPU (seconds; CI runs it)

* ``attention``: fused PRoPE against plain SDPA (FlashAttention's kernel on CUDA) at 24 heads x 128,
  480p (832x480 -> 26x15 tokens per latent frame), 21 latent frames; forward and forward+backward, bf16.
* ``train_step``: the published Wan2.2-5B transformer and VAE with random weights (hashing text instead of
  UMT5, which needs its weights), bf16 autocast, activation checkpointing per block, 480p, 81 frames,
  batch 1, AdamW: seconds per step and peak memory.
* ``rollout``: a student of that size, random weights, 480p, 4 steps per block over 200 blocks with the
  streaming decode: generated frames per second, and memory at block 20 against block 200 (it must not grow).

* ``official`` (``--official``): the published 5B in the official SolarWM layout (original Wan key names in a v2
  checkpoint transaction) with random weights, converted by ``solarwm convert official`` and rolled out as the
  released stage-2 student is sampled (4 steps, 3-latent blocks, bf16 timesteps) at 480x864 for 81 frames, under
  bf16 autocast with a random Wan2.2 VAE and hashing text: conversion seconds, generated frames per second, peak
  memory. ``--dry-run --official`` runs it at a tiny architecture.
* ``sequence_parallel`` (``--sequence-parallel``): a stage-1 step per Ulysses sequence-parallel size P at a fixed
  global batch (``benchmarks/sequence_parallel.py``): step time, peak memory per rank, tokens per second.

Ratios are taken against a baseline measured in the same run; nothing here is compared to a fixed number.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
from typing import Any

import torch
import torch.nn.functional as F
from prope_attention import IMAGE_SIZE, random_cameras, time_ms
from rollout import rss_mib
from rollout import setup as rollout_setup
from train_step import make_batch

from solarwm.backbones.wan22_ti2v_5b import Wan22TI2V5BAdapter, Wan22TI2V5BConfig
from solarwm.kernels.prope import prope_attention
from solarwm.stages.bidirectional import BidirectionalModule

#: Full-size and dry-run shapes: (heads, head_dim, latent frames, tokens per latent frame, pixel frames, W, H, blocks).
SHAPES = {
    "published": {"heads": 24, "head_dim": 128, "latent_frames": 21, "tokens_per_frame": 26 * 15,
                  "frames": 81, "width": 832, "height": 480, "blocks": 200, "early": 20},
    "dry_run": {"heads": 2, "head_dim": 32, "latent_frames": 3, "tokens_per_frame": 16,
                "frames": 5, "width": 32, "height": 32, "blocks": 4, "early": 2},
}


def memory_mib(device: torch.device, peak: bool = False) -> float:
    """Allocated (or peak allocated) CUDA memory, or the process's resident set on the CPU, in MiB."""
    if device.type == "cuda":
        return (torch.cuda.max_memory_allocated(device) if peak else torch.cuda.memory_allocated(device)) / 2**20
    return rss_mib()


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def attention(shape: dict, device: torch.device, dtype: torch.dtype, repeats: int) -> dict:
    """Median ms of SDPA and PRoPE (per-frame cameras), forward and forward+backward, and their ratios."""
    gen = torch.Generator().manual_seed(0)
    n = shape["latent_frames"] * shape["tokens_per_frame"]
    q, k, v = (torch.randn(1, shape["heads"], n, shape["head_dim"], generator=gen).to(device, dtype) for _ in range(3))
    w2c, K = (t.to(device) for t in random_cameras(1, shape["latent_frames"], gen))

    def prope(a, b, c):
        return prope_attention(a, b, c, w2c, K, w2c, K, IMAGE_SIZE)

    def forward(fn):
        def run():
            with torch.no_grad():
                fn(q, k, v)
            sync(device)
        return run

    def forward_backward(fn):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]

        def run():
            for t in leaves:
                t.grad = None
            fn(*leaves).float().sum().backward()
            sync(device)
        return run

    out: dict[str, Any] = {"tokens": n, "heads": shape["heads"], "head_dim": shape["head_dim"], "dtype": str(dtype)}
    for name, wrap in (("fwd", forward), ("fwd_bwd", forward_backward)):
        ms = time_ms({"sdpa": wrap(F.scaled_dot_product_attention), "prope": wrap(prope)}, warmup=2, repeats=repeats)
        out[f"{name}_sdpa_ms"], out[f"{name}_prope_ms"] = ms["sdpa"][0], ms["prope"][0]
        out[f"{name}_ratio_prope_over_sdpa"] = ms["prope"][0] / ms["sdpa"][0]
    return out


def build_adapter(dry_run: bool, device: torch.device) -> Wan22TI2V5BAdapter:
    """Random weights: the published 5B config (hashing text) or, for a dry run, the tiny config."""
    torch.manual_seed(0)
    if dry_run:
        config = Wan22TI2V5BConfig.tiny()
    else:
        config = dataclasses.replace(Wan22TI2V5BConfig.published(), text_encoder="hashing")
    return Wan22TI2V5BAdapter(config=config, device=str(device)).to(device)


def train_step(shape: dict, dry_run: bool, device: torch.device, steps: int) -> dict:
    """Seconds/step (median after a warm-up step) and peak memory of stage 1 in bf16 with activation checkpointing."""
    adapter = build_adapter(dry_run, device)
    adapter.transformer.enable_gradient_checkpointing()
    module = BidirectionalModule(adapter, optimizer=lambda p: torch.optim.AdamW(p, lr=1e-5), lr_scheduler=None).to(
        device
    )
    module.train()
    optimizer = module.configure_optimizers()["optimizer"]
    params = adapter.trainable_parameters()
    batch = make_batch(shape["frames"], shape["width"], 1, height=shape["height"])
    batch = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    times = []
    for _ in range(steps + 1):
        start = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss, _ = module.flow_loss(batch)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        sync(device)
        times.append(time.perf_counter() - start)
    return {
        "frames": shape["frames"],
        "width": shape["width"],
        "height": shape["height"],
        "params": sum(p.numel() for p in params),
        "loss": loss.item(),
        "steps": steps,
        "s_per_step": statistics.median(times[1:]),
        "peak_memory_mib": memory_mib(device, peak=True),
    }


def rollout(shape: dict, dry_run: bool, device: torch.device) -> dict:
    """Generated frames/s over ``blocks`` blocks of the 4-step causal rollout; memory at the early block vs the last."""
    adapter = build_adapter(dry_run, device)
    blocks, early = shape["blocks"], shape["early"]
    latent = adapter.frames_per_block * blocks
    num_frames = adapter.temporal_compression * (latent - 1) + 1
    runner, cond = rollout_setup(
        num_frames, shape["width"], 16.0, adapter=adapter, height=shape["height"], device=str(device)
    )
    memory: dict[int, float] = {}
    peak: dict[int, float] = {}
    frames, start = 0, time.perf_counter()
    with torch.no_grad():
        for index, video in enumerate(runner.video_blocks(cond, torch.Generator().manual_seed(0)), start=1):
            frames += video.shape[2]
            if index in (early, blocks):
                sync(device)
                memory[index], peak[index] = memory_mib(device), memory_mib(device, peak=True)
    sync(device)
    seconds = time.perf_counter() - start
    return {
        "blocks": index,
        "frames": frames,
        "seconds": seconds,
        "generated_fps": frames / seconds,
        f"memory_mib_block{early}": memory[early],
        f"memory_mib_block{blocks}": memory[blocks],
        f"peak_mib_block{early}": peak[early],
        f"peak_mib_block{blocks}": peak[blocks],
        "memory_ratio_late_over_early": memory[blocks] / memory[early],
        "peak_ratio_late_over_early": peak[blocks] / peak[early],
    }


#: The official-layout section: architecture overrides (Wan constructor names), VAE config, frame size and frames.
OFFICIAL = {
    "published": {"architecture": None, "vae_config": "wan2.2", "width": 864, "height": 480, "frames": 81},
    "dry_run": {
        "architecture": {
            "dim": 64,
            "ffn_dim": 96,
            "freq_dim": 32,
            "text_dim": 24,
            "num_heads": 2,
            "num_layers": 2,
            "text_len": 8,
        },
        "vae_config": "tiny48",
        "width": 32,
        "height": 32,
        "frames": 9,
    },
}


def write_official_package(folder: Any, state: dict[str, torch.Tensor], step: int = 0) -> None:
    """A stage-2 package as the official store writes it: model.pt (``model.``-prefixed), manifest, COMPLETE.json."""
    import hashlib

    folder.mkdir(parents=True)
    prefixed = {f"model.{k}": v for k, v in state.items()}
    torch.save({"generator": prefixed, "generator_ema": prefixed, "global_step": step}, folder / "model.pt")
    manifest = {
        "schema": "solarwm.checkpoint.v2",
        "step": step,
        "contract": {"stage": "stage2"},
        "metadata": {},
        "files": [{"path": "model.pt", "size": (folder / "model.pt").stat().st_size}],
    }
    raw = json.dumps(manifest, sort_keys=True).encode()
    (folder / "checkpoint-manifest.json").write_bytes(raw)
    (folder / "COMPLETE.json").write_text(
        json.dumps(
            {
                "schema": "solarwm.checkpoint-complete.v2",
                "step": step,
                "manifest_digest": hashlib.blake2s(raw).hexdigest(),
            }
        )
    )


def official(dry_run: bool, device: torch.device) -> dict:
    """Random official-layout package -> ``convert_official`` -> one 4-step stage-2 rollout (see module docstring)."""
    import tempfile
    from pathlib import Path

    from diffusers import AutoencoderKLWan

    from solarwm.backbones.base import load_adapter
    from solarwm.backbones.official import official_shapes, resolve_architecture
    from solarwm.backbones.wan22_ti2v_5b import VAE_CONFIGS
    from solarwm.convert import convert_official

    spec = OFFICIAL["dry_run" if dry_run else "published"]
    arch = resolve_architecture(spec["architecture"])
    gen = torch.Generator().manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        # bf16 in model.pt halves the disk and time of writing 5 B weights; the converter writes fp32.
        state = {
            k: (torch.randn(shape, generator=gen) * 0.02).to(torch.bfloat16)
            for k, shape in official_shapes(arch).items()
        }
        write_official_package(root / "package", state)
        del state
        start = time.perf_counter()
        convert_official(root / "package", root / "export", architecture=json.dumps(spec["architecture"] or {}))
        convert_s = time.perf_counter() - start
        # The released VAE and UMT5 need their weights: a random Wan2.2 VAE and hashing text stand in.
        meta = json.loads((root / "export" / "adapter.json").read_text())
        meta["config"].update(codec="wan_vae", vae_config=spec["vae_config"], text_encoder="hashing")
        (root / "export" / "adapter.json").write_text(json.dumps(meta))
        AutoencoderKLWan(**VAE_CONFIGS[spec["vae_config"]]).save_pretrained(root / "export" / "vae")
        adapter = load_adapter(root / "export").to(device).eval()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    runner, cond = rollout_setup(
        spec["frames"], spec["width"], 16.0, adapter=adapter, height=spec["height"], device=str(device)
    )
    frames, start = 0, time.perf_counter()
    with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
        for video in runner.video_blocks(cond, torch.Generator(device=device).manual_seed(0)):
            frames += video.shape[2]
    sync(device)
    seconds = time.perf_counter() - start
    return {
        "parameters": sum(p.numel() for p in adapter.transformer.parameters()),
        "convert_s": convert_s,
        "width": spec["width"],
        "height": spec["height"],
        "frames": frames,
        "seconds": seconds,
        "generated_fps": frames / seconds,
        "peak_memory_mib": memory_mib(device, peak=True),
        "timestep_rounding": adapter.config.timestep_rounding,
        "latent_camera": adapter.config.latent_camera,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="tiny shapes on the CPU (what CI runs)")
    parser.add_argument("--repeats", type=int, default=10, help="timed attention calls per kernel and pass")
    parser.add_argument("--steps", type=int, default=3, help="timed training steps (after one warm-up)")
    parser.add_argument("--skip", nargs="*", default=[], choices=["attention", "train_step", "rollout"])
    parser.add_argument(
        "--official",
        action="store_true",
        help="also time the published 5B converted from the official layout (a 4-step stage-2 rollout)",
    )
    parser.add_argument(
        "--sequence-parallel",
        action="store_true",
        help="also a stage-1 step per sequence-parallel size P (benchmarks/sequence_parallel.py: P in {1, 2, 4, 8} "
        "up to the GPUs present; --dry-run: {1, 2} on 2 CPU processes)",
    )
    args = parser.parse_args()
    if not args.dry_run and not torch.cuda.is_available():
        parser.error("no CUDA device: run with --dry-run for the CPU version")
    device = torch.device("cpu" if args.dry_run else "cuda")
    shape = SHAPES["dry_run" if args.dry_run else "published"]
    result: dict[str, Any] = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "dry_run": args.dry_run,
    }
    if "attention" not in args.skip:
        result["attention"] = attention(
            shape,
            device,
            torch.bfloat16 if device.type == "cuda" else torch.float32,
            args.repeats if not args.dry_run else 2,
        )
    if "train_step" not in args.skip:
        result["train_step"] = train_step(shape, args.dry_run, device, args.steps if not args.dry_run else 1)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    if "rollout" not in args.skip:
        result["rollout"] = rollout(shape, args.dry_run, device)
    if args.official:
        if device.type == "cuda":
            torch.cuda.empty_cache()
        result["official"] = official(args.dry_run, device)
    if args.sequence_parallel:
        import sequence_parallel

        if device.type == "cuda":
            torch.cuda.empty_cache()
        result["sequence_parallel"] = sequence_parallel.run(args.dry_run, args.steps)
    print(json.dumps(result, allow_nan=True))


if __name__ == "__main__":
    main()
