"""Pixel fidelity of generated videos against ground truth: `VideoPSNR` and `VideoSSIM`.

Both are torchmetrics' own `PeakSignalNoiseRatio` / `StructuralSimilarityIndexMeasure`
(the formulas, states and distributed sync are the library's); the subclasses only take
videos ``[B, 3, F, H, W]`` in [-1, 1], map them to [0, 1] and drop the context frames.

Context frames: the model is given the first ``num_context_frames`` frames (TI2V: frame 0
is the input image), so copying them is no achievement; only generated frames are scored.
"""

from __future__ import annotations

from typing import Any

import torch
from torchmetrics.image import PeakSignalNoiseRatio, StructuralSimilarityIndexMeasure


def generated_frames(video: torch.Tensor, num_context_frames: int) -> torch.Tensor:
    """``[B, 3, F, H, W]`` in [-1, 1] → the generated frames ``[B, 3, F - c, H, W]`` in [0, 1]."""
    if video.ndim != 5 or video.shape[1] != 3:
        raise ValueError(f"expected a video batch [B, 3, F, H, W], got {list(video.shape)}")
    if not 0 <= num_context_frames < video.shape[2]:
        raise ValueError(f"num_context_frames={num_context_frames} leaves no generated frame of {video.shape[2]}")
    # Clamp as writing the video to a file would, so out-of-range decoder values are not scored.
    return (video[:, :, num_context_frames:].float().clamp(-1.0, 1.0) + 1.0) / 2.0


def per_video_psnr(generated: torch.Tensor, target: torch.Tensor, num_context_frames: int = 1) -> torch.Tensor:
    """Each video's PSNR (dB) on its generated frames, as `VideoPSNR` averages them: ``[B, 3, F, H, W]`` → ``[B]``."""
    mse = (generated_frames(generated, num_context_frames) - generated_frames(target, num_context_frames)).pow(2)
    return 10.0 * torch.log10(1.0 / mse.flatten(1).mean(1))


class VideoPSNR(PeakSignalNoiseRatio):
    """Mean over videos of each video's PSNR (dB) on its generated frames, data range [0, 1].

    The mean of per-video PSNR, not the PSNR of the pooled MSE: every video counts equally,
    and one badly broken video cannot hide behind many good ones (nor the reverse), which is
    how video-generation papers report it. A video identical to its target has PSNR +inf,
    and so then has the mean; that is the correct value, so it is not capped.
    """

    def __init__(self, num_context_frames: int = 1, **kwargs: Any) -> None:
        # dim over (C, F, H, W): one MSE per video; the library averages the per-video PSNRs.
        super().__init__(data_range=1.0, dim=(1, 2, 3, 4), reduction="elementwise_mean", **kwargs)
        self.num_context_frames = num_context_frames

    def update(self, generated: torch.Tensor, target: torch.Tensor) -> None:  # type: ignore[override]
        """Add a batch: ``generated`` and ``target`` ``[B, 3, F, H, W]`` in [-1, 1]."""
        if generated.shape != target.shape:
            raise ValueError(f"generated {list(generated.shape)} and target {list(target.shape)} differ")
        super().update(generated_frames(generated, self.num_context_frames),
                       generated_frames(target, self.num_context_frames))


class VideoSSIM(StructuralSimilarityIndexMeasure):
    """Mean SSIM over every generated frame (2-D SSIM per frame, Gaussian 11×11 window), range [0, 1]."""

    def __init__(self, num_context_frames: int = 1, **kwargs: Any) -> None:
        super().__init__(data_range=1.0, reduction="elementwise_mean", **kwargs)
        self.num_context_frames = num_context_frames

    def update(self, generated: torch.Tensor, target: torch.Tensor) -> None:  # type: ignore[override]
        """Add a batch: ``generated`` and ``target`` ``[B, 3, F, H, W]`` in [-1, 1]."""
        if generated.shape != target.shape:
            raise ValueError(f"generated {list(generated.shape)} and target {list(target.shape)} differ")
        # Frames as images [B·F', 3, H, W]: a 5-D input would be read as one 3-D volume.
        frames = [generated_frames(v, self.num_context_frames).transpose(1, 2).flatten(0, 1)
                  for v in (generated, target)]
        super().update(*frames)
