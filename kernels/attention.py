"""One attention entry point for every route: flash-attn, FlexAttention or torch SDPA.

``attention(q, k, v, attn_mask)`` picks the backend from what is installed, the
device and the kind of mask:

============  ====================================================================
backend       used by ``"auto"`` when
============  ====================================================================
``flash``     flash-attn is installed, tensors are on CUDA in fp16/bf16, no mask
``flex``      ``attn_mask`` is a FlexAttention ``BlockMask`` (meant for CUDA)
``sdpa``      everything else: no mask or a dense bool mask (the CPU path)
============  ====================================================================

Mask semantics everywhere: bool, ``True`` = may attend. A dense mask broadcasts to
``[B, H, Nq, Nk]`` (``[Nq, Nk]`` is typical, see :mod:`solarwm.kernels.masks`).
"""

from __future__ import annotations

import functools
import importlib.util
from typing import Literal

import torch
import torch.nn.functional as F

Backend = Literal["auto", "sdpa", "flash", "flex"]
BACKENDS = ("auto", "sdpa", "flash", "flex")


class AttentionBackendError(RuntimeError):
    """A requested attention backend cannot run these inputs (not installed, wrong device, mask)."""


def _is_block_mask(mask: object) -> bool:
    if mask is None:
        return False
    from torch.nn.attention.flex_attention import BlockMask

    return isinstance(mask, BlockMask)


@functools.cache
def flash_attn_installed() -> bool:
    """Whether the optional ``flash_attn`` package (extra ``solarwm[gpu]``) can be imported."""
    return importlib.util.find_spec("flash_attn") is not None


def available_backends(device: torch.device | str) -> list[str]:
    """Backends that can run on ``device`` (without regard to mask or dtype)."""
    device = torch.device(device)
    names = ["sdpa", "flex"]
    if device.type == "cuda" and flash_attn_installed():
        names.insert(0, "flash")
    return names


def select_backend(q: torch.Tensor, attn_mask: object = None) -> str:
    """The backend ``backend="auto"`` resolves to for these inputs."""
    if _is_block_mask(attn_mask):
        return "flex"
    if (
        attn_mask is None
        and q.is_cuda
        and q.dtype in (torch.float16, torch.bfloat16)
        and flash_attn_installed()
    ):
        return "flash"
    return "sdpa"


@functools.cache
def _compiled_flex_attention():
    # FlexAttention is only fast when compiled; compile once per process.
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


def _run_flex(q, k, v, attn_mask, scale):
    from torch.nn.attention.flex_attention import flex_attention

    if not q.is_cuda and torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        raise AttentionBackendError(
            "attention(backend='flex'): FlexAttention has no CPU backward; "
            "on CPU pass a dense bool mask (solarwm.kernels.masks.*_mask) instead of a BlockMask"
        )
    fn = _compiled_flex_attention() if q.is_cuda else flex_attention
    return fn(q, k, v, block_mask=attn_mask, scale=scale)


def _run_flash(q, k, v, scale):
    from flash_attn import flash_attn_func

    # flash-attn wants [B, N, H, D]; callers speak [B, H, N, D].
    out = flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), softmax_scale=scale)
    return out.transpose(1, 2)


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_mask: torch.Tensor | object | None = None,
    *,
    backend: Backend = "auto",
    scale: float | None = None,
) -> torch.Tensor:
    """Scaled dot-product attention ``[B, H, Nq, D]`` over keys/values ``[B, H, Nk, D]``.

    ``attn_mask``: None, a bool tensor broadcastable to ``[B, H, Nq, Nk]`` (True = may
    attend), or a FlexAttention ``BlockMask``. ``scale`` defaults to ``1/sqrt(D)``.
    ``backend`` forces one of ``"sdpa"``, ``"flash"``, ``"flex"``; an impossible choice
    raises :class:`AttentionBackendError` saying why.
    """
    if backend not in BACKENDS:
        raise AttentionBackendError(f"attention: unknown backend {backend!r}; expected one of {BACKENDS}")
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(
            f"attention: q, k, v must be [B, H, N, D]; got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    is_block_mask = _is_block_mask(attn_mask)
    if attn_mask is not None and not is_block_mask:
        if not isinstance(attn_mask, torch.Tensor) or attn_mask.dtype != torch.bool:
            raise TypeError(
                "attention: attn_mask must be a bool tensor (True = may attend) or a FlexAttention BlockMask, "
                f"got {type(attn_mask).__name__}"
                + (f" of dtype {attn_mask.dtype}" if isinstance(attn_mask, torch.Tensor) else "")
            )

    chosen = select_backend(q, attn_mask) if backend == "auto" else backend

    if chosen == "flex":
        if not is_block_mask:
            raise AttentionBackendError(
                "attention(backend='flex') needs attn_mask to be a FlexAttention BlockMask "
                "(solarwm.kernels.masks.*_block_mask)"
            )
        return _run_flex(q, k, v, attn_mask, scale)
    if is_block_mask:
        raise AttentionBackendError(
            f"attention(backend={chosen!r}) cannot take a BlockMask; use backend='flex' or a dense bool mask"
        )

    if chosen == "flash":
        if not flash_attn_installed():
            raise AttentionBackendError(
                "attention(backend='flash'): flash_attn is not installed (pip install 'solarwm[gpu]')"
            )
        if not q.is_cuda:
            raise AttentionBackendError(f"attention(backend='flash') needs CUDA tensors, got device {q.device}")
        if attn_mask is not None:
            raise AttentionBackendError("attention(backend='flash') does not take a dense mask; use 'sdpa' or 'flex'")
        if q.dtype not in (torch.float16, torch.bfloat16):
            raise AttentionBackendError(f"attention(backend='flash') needs fp16/bf16, got {q.dtype}")
        return _run_flash(q, k, v, scale)

    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, scale=scale)
