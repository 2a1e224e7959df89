"""Attention dispatch: CPU falls back to SDPA, dense masks are honoured, bad requests are named."""

import math

import pytest
import torch

from solarwm.kernels.attention import AttentionBackendError, attention, available_backends, select_backend
from solarwm.kernels.masks import block_causal_block_mask, block_causal_mask


def softmax_reference(q, k, v, mask=None):
    """Plain softmax(q kᵀ / sqrt(D)) v with a bool mask (True = may attend)."""
    logits = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if mask is not None:
        logits = logits.masked_fill(~mask, float("-inf"))
    return torch.softmax(logits, dim=-1) @ v


def qkv(nq=10, nk=10, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(2, 3, nq, 8, generator=g, dtype=torch.float64),
        torch.randn(2, 3, nk, 8, generator=g, dtype=torch.float64),
        torch.randn(2, 3, nk, 8, generator=g, dtype=torch.float64),
    )


def test_cpu_auto_falls_back_to_sdpa():
    q, k, v = qkv()
    assert select_backend(q) == "sdpa"
    assert select_backend(q.half()) == "sdpa"  # flash is CUDA-only
    assert "flash" not in available_backends("cpu")
    torch.testing.assert_close(attention(q, k, v), softmax_reference(q, k, v))
    torch.testing.assert_close(attention(q, k, v, backend="sdpa"), softmax_reference(q, k, v))


def test_dense_mask_is_honoured():
    q, k, v = qkv(nq=10, nk=10)
    mask = block_causal_mask(5, 2, 1)
    out = attention(q, k, v, mask)
    torch.testing.assert_close(out, softmax_reference(q, k, v, mask))
    # The first frame only sees itself: changing later keys/values must not move it.
    v2 = v.clone()
    v2[:, :, 2:] += 100.0
    torch.testing.assert_close(attention(q, k, v2, mask)[:, :, :2], out[:, :, :2])


def test_rectangular_mask_for_kv_cache():
    q, k, v = qkv(nq=4, nk=12, seed=1)
    mask = torch.rand(4, 12, generator=torch.Generator().manual_seed(2)) > 0.5
    mask[:, 0] = True  # no fully masked rows
    torch.testing.assert_close(attention(q, k, v, mask), softmax_reference(q, k, v, mask))


def test_gradients_flow_through_dispatch():
    q, k, v = (t.requires_grad_() for t in qkv())
    attention(q, k, v, block_causal_mask(5, 2, 1)).square().sum().backward()
    for t in (q, k, v):
        assert t.grad is not None and torch.isfinite(t.grad).all() and t.grad.abs().sum() > 0


def test_unavailable_backends_raise_named_errors():
    q, k, v = qkv()
    with pytest.raises(AttentionBackendError, match="flash"):
        attention(q, k, v, backend="flash")
    with pytest.raises(AttentionBackendError, match="BlockMask"):
        attention(q, k, v, backend="flex")
    with pytest.raises(AttentionBackendError, match="unknown backend"):
        attention(q, k, v, backend="xformers")
    with pytest.raises(TypeError, match="bool"):
        attention(q, k, v, torch.zeros(10, 10))
    with pytest.raises(ValueError, match=r"\[B, H, N, D\]"):
        attention(q[0], k[0], v[0])


def test_block_mask_routes_to_flex_and_refuses_cpu_backward():
    q, k, v = (t.float() for t in qkv())
    bm = block_causal_block_mask(5, 2, 1, device="cpu", block_size=4)
    assert select_backend(q, bm) == "flex"
    with pytest.raises(AttentionBackendError, match="cannot take a BlockMask"):
        attention(q, k, v, bm, backend="sdpa")
    with pytest.raises(AttentionBackendError, match="no CPU backward"):
        attention(q.requires_grad_(), k, v, bm)
