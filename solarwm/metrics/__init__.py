"""Evaluation metrics for generated videos (torchmetrics `Metric`s): pixel fidelity and camera following."""

from solarwm.metrics.camera_following import (
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
    "CameraFollowing", "PoseEstimate", "VideoPSNR", "VideoSSIM", "commanded_relative_pose",
    "direction_angle_deg", "estimate_relative_pose", "generated_frames", "rotation_angle_deg",
    "video_from_uint8",
]
