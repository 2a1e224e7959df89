"""Fused PRoPE vs plain SDPA at the same shapes on CPU, forward and forward+backward.

Run: ``python benchmarks/prope_attention.py`` (``--help`` for shapes). Prints one row per
(shape, camera layout, pass) with median milliseconds and the ratio PRoPE / SDPA,
both measured in this run. Target: ratio <= 1.3 on CPU.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from solarwm.kernels.prope import cameras_per_token, prope_attention

IMAGE_SIZE = (832, 480)


def random_cameras(batch: int, frames: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """World->camera ``[B, F, 4, 4]`` (random rotation, metric translation) and pixel ``K [B, F, 4]``."""
    rot, _ = torch.linalg.qr(torch.randn(batch * frames, 3, 3, generator=gen))
    w2c = torch.eye(4).repeat(batch * frames, 1, 1)
    w2c[:, :3, :3] = rot
    w2c[:, :3, 3] = 3 * torch.randn(batch * frames, 3, generator=gen)
    K = torch.tensor([500.0, 500.0, IMAGE_SIZE[0] / 2, IMAGE_SIZE[1] / 2]).repeat(batch, frames, 1)
    return w2c.view(batch, frames, 4, 4), K


def time_ms(fns: dict, warmup: int, repeats: int) -> dict:
    """``(median, min)`` wall time in ms of each ``fns[name]()``, calls interleaved round-robin.

    Interleaving makes load from other processes hit baseline and candidate alike; the
    minimum is the figure least disturbed by such load.
    """
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times: dict = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append((time.perf_counter() - start) * 1e3)
    return {name: (statistics.median(t), min(t)) for name, t in times.items()}


def bench_shape(heads, frames, tokens_per_frame, dim, head_dims, warmup, repeats, rows):
    """Time SDPA and PRoPE (per-frame and per-token cameras) at one shape; append table rows."""
    gen = torch.Generator().manual_seed(0)
    n = frames * tokens_per_frame
    q, k, v = (torch.randn(1, heads, n, dim, generator=gen) for _ in range(3))
    w2c, K = random_cameras(1, frames, gen)
    w2c_tok, K_tok = cameras_per_token(w2c, K, tokens_per_frame)
    layouts = {
        "per-frame": lambda a, b, c: prope_attention(a, b, c, w2c, K, w2c, K, IMAGE_SIZE, head_dims=head_dims),
        "per-token": lambda a, b, c: prope_attention(
            a, b, c, w2c_tok, K_tok, w2c_tok, K_tok, IMAGE_SIZE, head_dims=head_dims
        ),
    }

    def forward(fn):
        def run():
            with torch.no_grad():
                fn(q, k, v)

        return run

    def forward_backward(fn):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]

        def run():
            for t in leaves:
                t.grad = None
            fn(*leaves).sum().backward()

        return run

    shape = f"H={heads} N={n} ({frames}x{tokens_per_frame}) D={dim} dims={head_dims.start or 0}:{head_dims.stop or dim}"
    for pass_name, wrap in (("fwd", forward), ("fwd+bwd", forward_backward)):
        fns = {"sdpa": wrap(F.scaled_dot_product_attention)}
        fns.update({layout: wrap(fn) for layout, fn in layouts.items()})
        ms = time_ms(fns, warmup, repeats)
        (base_med, base_min) = ms["sdpa"]
        for layout in layouts:
            med, best = ms[layout]
            rows.append((shape, layout, pass_name, base_med, med, med / base_med, best / base_min))


def main() -> None:
    """Parse shapes, run the benchmark, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    parser.add_argument("--large", action="store_true", help="add H=8 N=4096 D=128 (slow on small CPUs)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    # (heads, frames, tokens_per_frame, head_dim, PRoPE head dims)
    shapes = [
        (4, 16, 128, 64, slice(None)),
        (4, 8, 384, 128, slice(None)),
        (4, 8, 384, 128, slice(96, 128)),  # the MiniMax-H3 split: PRoPE on dims [96:128)
    ]
    if args.large:
        shapes.append((8, 16, 256, 128, slice(None)))

    print(f"torch {torch.__version__}, threads={torch.get_num_threads()}, warmup={args.warmup}, repeats={args.repeats}")
    rows: list[tuple] = []
    for heads, frames, tpf, dim, dims in shapes:
        bench_shape(heads, frames, tpf, dim, dims, args.warmup, args.repeats, rows)

    header = (
        f"{'shape':<44} {'cameras':<10} {'pass':<8} {'sdpa ms':>9} {'prope ms':>9} {'ratio':>6} {'ratio(min)':>10}"
    )
    print(header)
    print("-" * len(header))
    for shape, layout, pass_name, base, ms, ratio, ratio_min in rows:
        print(f"{shape:<44} {layout:<10} {pass_name:<8} {base:9.1f} {ms:9.1f} {ratio:6.2f} {ratio_min:10.2f}")
    print("sdpa/prope ms are medians; ratio = median/median, ratio(min) = min/min")
    print(f"worst ratio {max(r[5] for r in rows):.2f}, worst ratio(min) {max(r[6] for r in rows):.2f} (target <= 1.30)")


if __name__ == "__main__":
    main()
