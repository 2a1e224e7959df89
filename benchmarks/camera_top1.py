"""Camera top-1 of a causal export on multi-view worlds, with a 95% interval: does the world move as told?

    python benchmarks/camera_top1.py ADAPTER [--dir runs/tiny/test_multiview] [--seed 4102] [--worlds 16] [--draw 0]

The multi-view test set of the tiny recipes (``recipes/tiny_chain.yaml``'s ``test_multiview``: V cameras per world
from one start pose, ``solarwm data synth --views V``; rendered into ``--dir`` when missing). Every view is generated
from the shared first frame under its own camera, exactly as ``solarwm test`` does (``StageModule.camera_top1_step``,
the same rollout seeds for ``--draw 0``), and counts when it is closer (PSNR) to its own camera's truth than to every
other view's. The interval resamples worlds (``examples/stage_metrics.py``'s ``camera_top1``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from solarwm.datamodules import WorldDataModule
from solarwm.datamodules.world import SynthCorpus
from solarwm.metrics.video import per_video_psnr
from solarwm.rollout.engine import Rollout
from solarwm.stages.base import StageModule

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from stage_metrics import camera_top1  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("adapter")
    parser.add_argument("--dir", default="runs/tiny/test_multiview")
    parser.add_argument("--seed", type=int, default=4102)
    parser.add_argument("--worlds", type=int, default=16)
    parser.add_argument("--views", type=int, default=4)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--draw", type=int, default=0, help="0: solarwm test's rollout seeds; others: other noise")
    parser.add_argument("--window_blocks", type=int, default=None)
    parser.add_argument("--commit_sigma", type=float, default=None, help="noise level of the committed history")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)  # two threads spin-wait on a shared, loaded CPU
    from solarwm.backbones import load_adapter

    adapter = load_adapter(args.adapter).eval()
    if args.window_blocks is not None:
        adapter.window_blocks = args.window_blocks
    if args.commit_sigma is not None:
        adapter.commit_sigma = args.commit_sigma
    spec = SynthCorpus(clips=args.worlds * args.views, frames=17, width=96, height=64, fps=8.0, seed=args.seed,
                       motion="mixed", views=args.views)
    dm = WorldDataModule(corpus_dir=args.dir, synth=spec, test_multiview_dir=args.dir, test_multiview=spec,
                         num_frames=17, width=32, height=32, num_val_clips=0, batch_size=1)
    dm.prepare_data()
    dm.setup("test")
    rollout = Rollout(adapter, args.steps, "renoise")
    records = []
    with torch.no_grad():
        for index, batch in enumerate(dm.test_dataloader()[1]):
            video, views = batch["video"].float(), batch["video"].shape[0]
            first = video[:1, :, 0].expand(views, -1, -1, -1)
            seed = StageModule.test_seed + StageModule.multiview_seed_offset + index + 7919 * args.draw
            cond = rollout.conditions(first, batch["c2w"], batch["K"], list(batch["caption"]))
            generated = torch.cat(list(rollout.video_blocks(cond, torch.Generator().manual_seed(seed))), 2).float()
            for v in range(views):
                scores = per_video_psnr(generated[v : v + 1].expand_as(video), video)
                others = torch.cat([scores[:v], scores[v + 1 :]])
                records.append({"world": index, "view": v, "top1": bool(scores[v] > others.max()),
                                "margin_db": float(scores[v] - others.max())})
    result = dict(camera_top1(records), command=vars(args), records=records)
    print(json.dumps({k: v for k, v in result.items() if k != "records"}))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
