"""Block-causal masks: exact small patterns, teacher-forcing layout, dense == FlexAttention."""

import warnings

import pytest
import torch
import torch.nn.functional as F

from solarwm.kernels.attention import attention
from solarwm.kernels.masks import (
    block_causal_block_mask,
    block_causal_mask,
    causal_mask,
    frame_causal_block_mask,
    frame_causal_mask,
    teacher_forcing_block_mask,
    teacher_forcing_mask,
)


def test_frame_causal_exact_pattern():
    mask = frame_causal_mask(3, 2)
    expected = torch.tensor(
        [
            [1, 1, 0, 0, 0, 0],
            [1, 1, 0, 0, 0, 0],
            [1, 1, 1, 1, 0, 0],
            [1, 1, 1, 1, 0, 0],
            [1, 1, 1, 1, 1, 1],
            [1, 1, 1, 1, 1, 1],
        ],
        dtype=torch.bool,
    )
    assert mask.dtype == torch.bool and mask.shape == (6, 6)
    assert torch.equal(mask, expected)


def test_block_causal_exact_pattern_with_short_last_block():
    # 5 frames, 1 token each, blocks of 2 frames: blocks {0,1} {2,3} {4}.
    mask = block_causal_mask(5, 1, 2)
    expected = torch.tensor(
        [
            [1, 1, 0, 0, 0],
            [1, 1, 0, 0, 0],
            [1, 1, 1, 1, 0],
            [1, 1, 1, 1, 0],
            [1, 1, 1, 1, 1],
        ],
        dtype=torch.bool,
    )
    assert torch.equal(mask, expected)
    assert torch.equal(block_causal_mask(4, 3, 1), frame_causal_mask(4, 3))


def test_teacher_forcing_exact_pattern():
    # 2 frames, 1 token, 1 frame per block: order [c0, c1, n0, n1].
    mask = teacher_forcing_mask(2, 1, 1)
    expected = torch.tensor(
        [
            [1, 0, 0, 0],  # c0: itself
            [1, 1, 0, 0],  # c1: c0, c1
            [0, 0, 1, 0],  # n0: no clean history, itself
            [1, 0, 0, 1],  # n1: c0 and itself, not c1 (its own clean copy)
        ],
        dtype=torch.bool,
    )
    assert mask.shape == (4, 4)
    assert torch.equal(mask, expected)


def test_teacher_forcing_sink_adds_the_first_clean_frames_to_every_noisy_window():
    # 4 frames, 1 token, 1 frame per block, a 1-block window: noisy frame k sees clean k-1, itself, and clean 0.
    plain = teacher_forcing_mask(4, 1, 1, max_prior_blocks=1)
    sink = teacher_forcing_mask(4, 1, 1, max_prior_blocks=1, sink_frames=1)
    assert plain[4 + 3, :4].nonzero().flatten().tolist() == [2]
    assert sink[4 + 3, :4].nonzero().flatten().tolist() == [0, 2]
    assert sink[4 + 2, :4].nonzero().flatten().tolist() == [0, 1]
    assert not sink[4 + 0, :4].any()  # the first block has no history: its own clean copy stays hidden
    changed = (sink != plain).nonzero().tolist()
    assert changed == [[6, 0], [7, 0]]  # only noisy queries past the window gain the sink, only the sink's keys
    assert torch.equal(causal_mask("teacher_forcing", 4, 1, 1, max_prior_blocks=1, sink_frames=1), sink)


@pytest.mark.parametrize("frames,tokens,fpb", [(6, 2, 2), (5, 3, 2), (4, 1, 1)])
def test_teacher_forcing_layout_properties(frames, tokens, fpb):
    mask = teacher_forcing_mask(frames, tokens, fpb)
    half = frames * tokens
    assert mask.shape == (2 * half, 2 * half)

    def block(n):
        return (n % half) // (tokens * fpb)

    for qi in range(2 * half):
        for ki in range(2 * half):
            q_noisy, k_noisy = qi >= half, ki >= half
            if not q_noisy:
                expected = (not k_noisy) and block(ki) <= block(qi)  # clean never sees noisy
            elif not k_noisy:
                expected = block(ki) < block(qi)  # never its own clean copy, never the future
            else:
                expected = block(ki) == block(qi)
            assert bool(mask[qi, ki]) == expected, (qi, ki)
    # The clean half is exactly block-causal; every row sees something.
    assert torch.equal(mask[:half, :half], block_causal_mask(frames, tokens, fpb))
    assert mask.any(dim=1).all()


def test_causal_mask_on_cpu_is_dense_and_validates():
    assert torch.equal(causal_mask("block_causal", 4, 2, 2, device="cpu"), block_causal_mask(4, 2, 2))
    assert torch.equal(causal_mask("frame_causal", 3, 2), frame_causal_mask(3, 2))
    assert torch.equal(causal_mask("teacher_forcing", 3, 2, 1), teacher_forcing_mask(3, 2, 1))
    with pytest.raises(ValueError, match="unknown kind"):
        causal_mask("causal", 3, 2)
    with pytest.raises(ValueError, match="frames_per_block"):
        block_causal_mask(3, 2, 0)


@pytest.mark.parametrize(
    "dense,flex",
    [
        (frame_causal_mask(5, 3), frame_causal_block_mask(5, 3, device="cpu", block_size=4)),
        (block_causal_mask(6, 2, 2), block_causal_block_mask(6, 2, 2, device="cpu", block_size=4)),
        (teacher_forcing_mask(4, 3, 2), teacher_forcing_block_mask(4, 3, 2, device="cpu", block_size=4)),
        (
            teacher_forcing_mask(6, 3, 2, max_prior_blocks=1, sink_frames=1),
            teacher_forcing_block_mask(6, 3, 2, device="cpu", block_size=4, max_prior_blocks=1, sink_frames=1),
        ),
    ],
    ids=["frame_causal", "block_causal", "teacher_forcing", "teacher_forcing_sink"],
)
def test_flex_block_mask_matches_dense(dense, flex):
    n = dense.shape[0]
    assert flex.shape[-2:] == (n, n)
    # Block level: a tile is kept iff some token pair in it may attend.
    blocks = -(-n // 4)
    padded = torch.zeros(blocks * 4, blocks * 4, dtype=torch.bool)
    padded[:n, :n] = dense
    any_in_tile = padded.view(blocks, 4, blocks, 4).any(dim=3).any(dim=1)
    assert torch.equal(flex.to_dense()[0, 0].bool(), any_in_tile)
    # Token level: FlexAttention (eager, forward-only on CPU) == SDPA with the dense mask.
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, n, 8, generator=g) for _ in range(3))
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out_flex = attention(q, k, v, flex)
    out_dense = F.scaled_dot_product_attention(q, k, v, attn_mask=dense)
    torch.testing.assert_close(out_flex, out_dense, atol=1e-5, rtol=1e-5)
