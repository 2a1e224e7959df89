"""Block-causal attention masks for the causal stages (teacher forcing, DMD, rollout).

Every mask is defined once, as a FlexAttention ``mask_mod`` — a function
``(b, h, q_idx, kv_idx) -> bool tensor`` — and both representations are built from it:

- dense: a bool tensor ``[N, N]`` (row = query token, column = key token, ``True`` =
  may attend), for CPU and for SDPA; FlexAttention has no CPU backward.
- flex: a FlexAttention ``BlockMask`` for CUDA, which skips fully masked tiles.

Sharing the ``mask_mod`` means the two cannot diverge. Tokens are frame-major:
token ``n`` belongs to frame ``n // tokens_per_frame``; frame ``f`` belongs to block
``f // frames_per_block`` (the last block may be shorter). No row is ever fully
masked (every token sees at least its own block), so SDPA never returns NaN.
"""

from __future__ import annotations

import functools
from typing import Callable

import torch

MaskMod = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]

MASK_KINDS = ("frame_causal", "block_causal", "teacher_forcing")


def _check_sizes(num_frames: int, tokens_per_frame: int, frames_per_block: int = 1) -> None:
    for name, value in (
        ("num_frames", num_frames),
        ("tokens_per_frame", tokens_per_frame),
        ("frames_per_block", frames_per_block),
    ):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"mask: {name} must be a positive int, got {value!r}")


# ---------------------------------------------------------------------------------------
# mask_mod functions (the single definition of each pattern)
# ---------------------------------------------------------------------------------------


def block_causal_mask_mod(tokens_per_frame: int, frames_per_block: int) -> MaskMod:
    """mask_mod: a token sees every token of its own block and of all earlier blocks."""
    tokens_per_block = tokens_per_frame * frames_per_block

    def mask_mod(b, h, q_idx, kv_idx):
        return (q_idx // tokens_per_block) >= (kv_idx // tokens_per_block)

    return mask_mod


def frame_causal_mask_mod(tokens_per_frame: int) -> MaskMod:
    """mask_mod: a token sees every token of its own frame and of all earlier frames."""
    return block_causal_mask_mod(tokens_per_frame, 1)


def teacher_forcing_mask_mod(
    num_frames: int,
    tokens_per_frame: int,
    frames_per_block: int,
    max_prior_blocks: int | None = None,
    sink_frames: int = 0,
) -> MaskMod:
    """mask_mod for the teacher-forcing layout ``[clean | noisy]`` of ``2 * num_frames`` frames.

    Clean block k sees clean blocks <= k. Noisy block k sees clean blocks < k (only the last
    ``max_prior_blocks`` of them when given: the rollout's sliding window, plus the clip's first
    ``sink_frames`` clean frames: the rollout's attention sink) and noisy block k itself: never its own
    clean copy, never the future, never other noisy blocks. Clean tokens never see noisy ones.
    """
    half = num_frames * tokens_per_frame
    tokens_per_block = tokens_per_frame * frames_per_block
    horizon = num_frames if max_prior_blocks is None else max_prior_blocks
    sink_tokens = sink_frames * tokens_per_frame

    def mask_mod(b, h, q_idx, kv_idx):
        q_noisy = q_idx >= half
        kv_noisy = kv_idx >= half
        q_blk = (q_idx - q_noisy * half) // tokens_per_block
        kv_blk = (kv_idx - kv_noisy * half) // tokens_per_block
        clean_q = ~q_noisy & ~kv_noisy & (kv_blk <= q_blk)
        in_window = (kv_blk >= q_blk - horizon) | (kv_idx < sink_tokens)
        noisy_sees_history = q_noisy & ~kv_noisy & (kv_blk < q_blk) & in_window
        noisy_sees_itself = q_noisy & kv_noisy & (kv_blk == q_blk)
        return clean_q | noisy_sees_history | noisy_sees_itself

    return mask_mod


# ---------------------------------------------------------------------------------------
# dense builders
# ---------------------------------------------------------------------------------------


def dense_mask(mask_mod: MaskMod, num_tokens: int, device: torch.device | str | None = None) -> torch.Tensor:
    """Evaluate a mask_mod on every (query, key) pair: bool ``[N, N]``, True = may attend."""
    idx = torch.arange(num_tokens, device=device)
    zero = torch.zeros((), dtype=torch.long, device=device)
    return mask_mod(zero, zero, idx[:, None], idx[None, :])


def frame_causal_mask(num_frames: int, tokens_per_frame: int, device: torch.device | str | None = None) -> torch.Tensor:
    """Frame-causal mask, bool ``[F*T, F*T]``: a token sees its own and earlier frames."""
    _check_sizes(num_frames, tokens_per_frame)
    return dense_mask(frame_causal_mask_mod(tokens_per_frame), num_frames * tokens_per_frame, device)


def block_causal_mask(
    num_frames: int, tokens_per_frame: int, frames_per_block: int, device: torch.device | str | None = None
) -> torch.Tensor:
    """Block-causal mask, bool ``[F*T, F*T]``: a token sees its own and earlier blocks."""
    _check_sizes(num_frames, tokens_per_frame, frames_per_block)
    mod = block_causal_mask_mod(tokens_per_frame, frames_per_block)
    return dense_mask(mod, num_frames * tokens_per_frame, device)


def teacher_forcing_mask(
    num_frames: int,
    tokens_per_frame: int,
    frames_per_block: int,
    device: torch.device | str | None = None,
    max_prior_blocks: int | None = None,
    sink_frames: int = 0,
) -> torch.Tensor:
    """Teacher-forcing mask, bool ``[2*F*T, 2*F*T]`` over the layout ``[clean | noisy]``."""
    _check_sizes(num_frames, tokens_per_frame, frames_per_block)
    mod = teacher_forcing_mask_mod(num_frames, tokens_per_frame, frames_per_block, max_prior_blocks, sink_frames)
    return dense_mask(mod, 2 * num_frames * tokens_per_frame, device)


# ---------------------------------------------------------------------------------------
# FlexAttention builders (CUDA; CPU works forward-only, which the tests use)
# ---------------------------------------------------------------------------------------


def flex_block_mask(
    mask_mod: MaskMod, num_tokens: int, device: torch.device | str = "cuda", block_size: int = 128
):
    """Build a FlexAttention ``BlockMask`` (``[1, 1, N, N]``, broadcast over batch and heads)."""
    from torch.nn.attention.flex_attention import create_block_mask

    return create_block_mask(mask_mod, None, None, num_tokens, num_tokens, device=device, BLOCK_SIZE=block_size)


def frame_causal_block_mask(
    num_frames: int, tokens_per_frame: int, device: torch.device | str = "cuda", block_size: int = 128
):
    """FlexAttention ``BlockMask`` equivalent of :func:`frame_causal_mask`."""
    _check_sizes(num_frames, tokens_per_frame)
    mod = frame_causal_mask_mod(tokens_per_frame)
    return flex_block_mask(mod, num_frames * tokens_per_frame, device, block_size)


def block_causal_block_mask(
    num_frames: int,
    tokens_per_frame: int,
    frames_per_block: int,
    device: torch.device | str = "cuda",
    block_size: int = 128,
):
    """FlexAttention ``BlockMask`` equivalent of :func:`block_causal_mask`."""
    _check_sizes(num_frames, tokens_per_frame, frames_per_block)
    mod = block_causal_mask_mod(tokens_per_frame, frames_per_block)
    return flex_block_mask(mod, num_frames * tokens_per_frame, device, block_size)


def teacher_forcing_block_mask(
    num_frames: int,
    tokens_per_frame: int,
    frames_per_block: int,
    device: torch.device | str = "cuda",
    block_size: int = 128,
    max_prior_blocks: int | None = None,
    sink_frames: int = 0,
):
    """FlexAttention ``BlockMask`` equivalent of :func:`teacher_forcing_mask`."""
    _check_sizes(num_frames, tokens_per_frame, frames_per_block)
    mod = teacher_forcing_mask_mod(num_frames, tokens_per_frame, frames_per_block, max_prior_blocks, sink_frames)
    return flex_block_mask(mod, 2 * num_frames * tokens_per_frame, device, block_size)


@functools.lru_cache(maxsize=32)
def causal_mask(
    kind: str,
    num_frames: int,
    tokens_per_frame: int,
    frames_per_block: int = 1,
    device: torch.device | str | None = None,
    max_prior_blocks: int | None = None,
    sink_frames: int = 0,
):
    """The mask a causal stage should pass to ``attention``: a ``BlockMask`` on CUDA, dense bool elsewhere.

    ``kind`` is one of ``"frame_causal"``, ``"block_causal"``, ``"teacher_forcing"``;
    ``max_prior_blocks`` limits the history of teacher-forcing's noisy blocks (the sliding window) and
    ``sink_frames`` adds the clip's first clean frames to it (the attention sink).
    Cached per shape: every training step of a stage asks for the same mask, and building it (a
    FlexAttention ``create_block_mask`` on CUDA) belongs at set-up, not in the step. Callers must not
    modify the returned mask.
    """
    if kind not in MASK_KINDS:
        raise ValueError(f"causal_mask: unknown kind {kind!r}; expected one of {MASK_KINDS}")
    on_cuda = torch.device(device).type == "cuda" if device is not None else False
    if kind == "frame_causal":
        build = frame_causal_block_mask if on_cuda else frame_causal_mask
        return build(num_frames, tokens_per_frame, device=device)
    if kind == "teacher_forcing":
        build = teacher_forcing_block_mask if on_cuda else teacher_forcing_mask
        return build(
            num_frames,
            tokens_per_frame,
            frames_per_block,
            device=device,
            max_prior_blocks=max_prior_blocks,
            sink_frames=sink_frames,
        )
    build = block_causal_block_mask if on_cuda else block_causal_mask
    return build(num_frames, tokens_per_frame, frames_per_block, device=device)
