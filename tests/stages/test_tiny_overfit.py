"""The tiny wan22_ti2v_5b route + stage 1 can learn: overfit ONE rendered clip, then generate it.

A smoke test of the whole stage-1 path (patchify codec, clean TI2V anchor at sigma 0 in training
and sampling, x0 output, flow loss, Euler sampler from sigma 1): after a short bare training loop
on a single 17-frame 32x32 window, ``generate`` from that window's first frame and cameras must
reproduce it clearly better than the trivial baseline (the first frame repeated). It proves the
pipeline can fit, not that it generalises.
"""

import math

import numpy as np
import pytest
import torch

from solarwm.backbones.wan22_ti2v_5b import Wan22TI2V5BAdapter, Wan22TI2V5BConfig
from solarwm.data.sources.synthetic import SynthSpec, build_clip
from solarwm.stages.bidirectional import BidirectionalModule

STEPS = 250


def _psnr(a: torch.Tensor, b: torch.Tensor) -> float:
    """PSNR on [0, 1] of videos in [-1, 1], generated frames 1.. only."""
    mse = (((a[:, :, 1:] - b[:, :, 1:]) / 2).clamp(-1, 1) ** 2).mean().item()
    return -10.0 * math.log10(max(mse, 1e-10))


def _fit(batch: dict, steps: int) -> BidirectionalModule:
    """A fresh tiny stage-1 module fitted to ``batch`` for ``steps`` AdamW steps (lr 2e-3, clip 1), in eval mode."""
    module = BidirectionalModule(Wan22TI2V5BAdapter(Wan22TI2V5BConfig.tiny()), timestep_sampling="uniform")
    params = module.adapter.trainable_parameters()
    opt = torch.optim.AdamW(params, lr=2e-3, weight_decay=0.0)
    module.train()
    for _ in range(steps):
        loss, _ = module.flow_loss(batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
    return module.eval()


@pytest.mark.slow
def test_overfit_one_clip_beats_static_baseline() -> None:
    torch.manual_seed(0)
    clip, _ = build_clip(SynthSpec(frames=17, width=32, height=32, fps=16.0, seed=0), 3)
    video = torch.from_numpy(clip.frames).float().div(127.5).sub(1.0).permute(3, 0, 1, 2)[None]  # [1,3,17,32,32]
    batch = {
        "video": video, "c2w": torch.from_numpy(clip.c2w).float()[None], "K": torch.from_numpy(clip.K).float()[None],
        "caption": [clip.caption], "sample_id": ["one"],
    }
    module = _fit(batch, STEPS)
    generated = module.generate(
        video[:, :, 0], batch["caption"], batch["c2w"], batch["K"], num_steps=8,
        generator=torch.Generator().manual_seed(0),
    )
    assert generated.shape == video.shape
    assert torch.equal(generated[:, :, 0], video[:, :, 0])  # the lossless anchor comes back exactly
    static = video[:, :, :1].expand_as(video)
    psnr, psnr_static = _psnr(generated, video), _psnr(static, video)
    assert psnr > psnr_static + 2.0, f"overfit psnr {psnr:.2f} dB vs static {psnr_static:.2f} dB"


@pytest.mark.slow
def test_camera_decides_the_generated_motion() -> None:
    """The camera path end to end: one world, one first frame, two trajectories (yaw 40° left / right).

    The same tiny route is fitted to both clips; the only input that tells them apart is the camera (the
    first frame and caption are identical), so generating with the swapped camera must score clearly
    worse. Measured at 500 steps: 23.9 dB with its own camera, 21.3 dB swapped, 20.0 dB static.
    """
    from solarwm.camera import trajectory as T
    from solarwm.data.sources.synthetic import describe_scene, make_scene, render_clip

    def turn(degrees: float) -> T.Trajectory:
        return T.compose_segments([T.yaw_turn(16, degrees)], fps=16, width=32, height=32, fov_x_deg=70,
                                  start=(0.0, 0.0, 1.5), start_yaw=40.0)

    left, right = turn(40.0), turn(-40.0)
    scene = make_scene(np.random.default_rng(3), np.concatenate([left.c2w, right.c2w]))
    video = torch.stack([torch.from_numpy(render_clip(scene, t)).float().div(127.5).sub(1.0).permute(3, 0, 1, 2)
                         for t in (left, right)])  # [2, 3, 17, 32, 32]
    assert torch.equal(video[0, :, 0], video[1, :, 0])  # the same first frame
    c2w = torch.stack([torch.from_numpy(t.c2w).float() for t in (left, right)])
    K = torch.stack([torch.from_numpy(t.K).float() for t in (left, right)])
    batch = {"video": video, "c2w": c2w, "K": K, "caption": [describe_scene(scene)] * 2, "sample_id": ["l", "r"]}

    torch.manual_seed(0)
    module = _fit(batch, 500)

    def generate(cameras: torch.Tensor) -> torch.Tensor:
        return module.generate(video[:, :, 0], batch["caption"], cameras, K, num_steps=8,
                               generator=torch.Generator().manual_seed(0))

    own, swapped = _psnr(generate(c2w), video), _psnr(generate(c2w.flip(0)), video)
    static = _psnr(video[:, :, :1].expand_as(video), video)
    assert own > swapped + 1.5, f"own camera {own:.2f} dB vs swapped {swapped:.2f} dB"
    assert own > static + 2.0, f"own camera {own:.2f} dB vs static {static:.2f} dB"
