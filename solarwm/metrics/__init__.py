"""Evaluation metrics for generated videos (torchmetrics `Metric`s): pixel fidelity and camera following.

    psnr, ssim, follow = VideoPSNR(), VideoSSIM(), CameraFollowing()
    psnr.update(generated, batch["video"])          # [B, 3, F, H, W] in [-1, 1]
    ssim.update(generated, batch["video"])
    follow.update(generated, batch["c2w"], batch["K"])  # [B, F, 4, 4], [B, F, 4]
    psnr.compute(), ssim.compute(), follow.compute()    # dB, [0, 1], dict of degrees and counts

`CameraFollowing` on the ground-truth video with its own cameras gives the estimator's floor.
"""

from solarwm.metrics.camera_following import (
    SCORED_PAIR_STEP,
    CameraFollowing,
    PoseEstimate,
    commanded_relative_pose,
    direction_angle_deg,
    estimate_relative_pose,
    rotation_angle_deg,
    video_from_uint8,
)
from solarwm.metrics.video import VideoPSNR, VideoSSIM, generated_frames

__all__ = [
    "SCORED_PAIR_STEP", "CameraFollowing", "PoseEstimate", "VideoPSNR", "VideoSSIM", "commanded_relative_pose",
    "direction_angle_deg", "estimate_relative_pose", "generated_frames", "rotation_angle_deg",
    "video_from_uint8",
]
