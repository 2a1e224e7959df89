"""A PNG of what a stage-1 export generates on held-out clips, next to the truth and a wrong camera.

    python experiments/sample_grid.py ADAPTER_DIR CORPUS OUT.png [CLIPS] [STEPS]

Per clip, three rows of frames 0, 2, .., 16 (32x32 windows, the datamodule's validation split):
the ground truth, the video generated from its first frame and cameras, and the one generated
from the same first frame with the next clip's cameras (what `test/psnr_wrong_camera` scores).
"""

from __future__ import annotations

import sys

import numpy as np
import torch
from PIL import Image

from solarwm.backbones.base import load_adapter
from solarwm.data.video import to_uint8_frames
from solarwm.datamodules import WorldDataModule
from solarwm.stages.bidirectional import BidirectionalModule


def frames_row(video: torch.Tensor) -> np.ndarray:
    """``video [3, F, H, W]`` in [-1, 1] -> every other frame side by side, uint8 ``[H, W * ceil(F/2), 3]``."""
    return np.concatenate(list(to_uint8_frames(video[:, ::2])), axis=1)


def main() -> None:
    adapter_dir, corpus, out = sys.argv[1:4]
    clips = int(sys.argv[4]) if len(sys.argv) > 4 else 4
    steps = int(sys.argv[5]) if len(sys.argv) > 5 else 2  # recipes/tiny_bid.yaml sample_steps
    module = BidirectionalModule(adapter=load_adapter(adapter_dir)).eval()
    data = WorldDataModule(corpus_dir=corpus, num_val_clips=8, num_frames=17, width=32, height=32, batch_size=clips)
    data.setup("fit")
    batch = next(iter(data.val_dataloader()))
    video, c2w, K, caption = batch["video"], batch["c2w"], batch["K"], list(batch["caption"])
    with torch.no_grad():
        own = module.generate(video[:, :, 0], caption, c2w, K, num_steps=steps,
                              generator=torch.Generator().manual_seed(0))
        wrong = module.generate(video[:, :, 0], caption, c2w.roll(1, 0), K, num_steps=steps,
                                generator=torch.Generator().manual_seed(0))
    rows = []
    for i in range(len(video)):
        truth = frames_row(video[i])
        rows += [truth, frames_row(own[i]), frames_row(wrong[i]), np.zeros_like(truth[:3])]
    image = Image.fromarray(np.concatenate(rows, axis=0))
    image.resize((image.width * 2, image.height * 2), Image.NEAREST).save(out)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
