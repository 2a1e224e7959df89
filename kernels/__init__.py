"""Attention kernels shared by every route: backend dispatch, fused PRoPE, block-causal masks."""

from .attention import AttentionBackendError, attention, available_backends, select_backend
from .masks import (
    block_causal_block_mask,
    block_causal_mask,
    block_causal_mask_mod,
    causal_mask,
    frame_causal_block_mask,
    frame_causal_mask,
    frame_causal_mask_mod,
    teacher_forcing_block_mask,
    teacher_forcing_mask,
    teacher_forcing_mask_mod,
)
from .prope import PRoPEError, cameras_per_token, projective_matrices, prope_attention

__all__ = [
    "AttentionBackendError",
    "PRoPEError",
    "attention",
    "available_backends",
    "block_causal_block_mask",
    "block_causal_mask",
    "block_causal_mask_mod",
    "cameras_per_token",
    "causal_mask",
    "frame_causal_block_mask",
    "frame_causal_mask",
    "frame_causal_mask_mod",
    "projective_matrices",
    "prope_attention",
    "select_backend",
    "teacher_forcing_block_mask",
    "teacher_forcing_mask",
    "teacher_forcing_mask_mod",
]
