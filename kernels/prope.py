"""Fused PRoPE: camera-relative projective positional encoding inside one attention call.

PRoPE ("Cameras as Relative Positional Encoding", Li et al. 2025), used as in
MosaicMem and SolarWM §6.1. Every token carries the projective matrix of its camera

    P = lift(K̃) · w2c            (image <- world, 4x4)

with K̃ the intrinsics normalised by image size and centred like the reference
implementation: (fx/W, fy/H, cx/W - 0.5, cy/H - 0.5), so a centred principal point
gives a diagonal K̃. On the chosen head dims, viewed as 4-vectors ``[..., D/4, 4]``:

    q <- Pᵀ q,   k <- P⁻¹ k,   v <- P⁻¹ v,   o = attention(q, k, v),   o <- P o

so the logits become qᵢᵀ Pᵢ Pⱼ⁻¹ kⱼ and the output depends on cameras only through the
relative transforms Pᵢ Pⱼ⁻¹: a global rigid motion of the world changes nothing.
The route's native RoPE has already been applied to q and k by the caller; the head
dims outside ``head_dims`` pass through untouched.

Cameras may be given per token (``[B, N, 4, 4]``) or per frame (``[B, F, 4, 4]`` with
``N = F * T`` frame-major tokens). Per-frame input is the fast path: the 4x4s are
built once per frame and applied to all ``T`` tokens of that frame with one batched
matmul, never expanded to per-token matrices.
"""

from __future__ import annotations

import torch

from solarwm.camera.se3 import se3_inverse

from .attention import attention

__all__ = [
    "PRoPEError",
    "cameras_per_token",
    "normalized_intrinsics",
    "projective_matrices",
    "prope_attention",
]


class PRoPEError(ValueError):
    """Inputs to PRoPE have inconsistent shapes or an invalid head-dim slice."""


def normalized_intrinsics(K: torch.Tensor, image_size: tuple[int, int]) -> torch.Tensor:
    """Pixel ``K [..., 4] = (fx, fy, cx, cy)`` -> image-size-normalised, centred ``[..., 4]``."""
    width, height = image_size
    fx, fy, cx, cy = K.unbind(-1)
    return torch.stack((fx / width, fy / height, cx / width - 0.5, cy / height - 0.5), dim=-1)


def _projection(viewmats: torch.Tensor, Kn: torch.Tensor) -> torch.Tensor:
    """``P = lift(K̃) · w2c`` written row by row: ``[..., 4, 4]``."""
    fx, fy, cx, cy = (c[..., None] for c in Kn.unbind(-1))
    r0, r1, r2, r3 = viewmats.unbind(-2)
    return torch.stack((fx * r0 + cx * r2, fy * r1 + cy * r2, r2, r3), dim=-2)


def _projection_inverse(viewmats: torch.Tensor, Kn: torch.Tensor) -> torch.Tensor:
    """``P⁻¹ = w2c⁻¹ · lift(K̃)⁻¹`` analytically (SE(3) and pinhole inverses): ``[..., 4, 4]``."""
    c2w = se3_inverse(viewmats)
    # lift(K̃)⁻¹ = [[1/fx, 0, -cx/fx, 0], [0, 1/fy, -cy/fy, 0], [0, 0, 1, 0], [0, 0, 0, 1]];
    # right-multiplying mixes only the first three columns of c2w.
    fx, fy, cx, cy = (c[..., None] for c in Kn.unbind(-1))
    col0, col1, col2, col3 = c2w.unbind(-1)
    return torch.stack(
        (col0 / fx, col1 / fy, col2 - (cx / fx) * col0 - (cy / fy) * col1, col3), dim=-1
    )


def projective_matrices(
    viewmats: torch.Tensor, K: torch.Tensor, image_size: tuple[int, int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """PRoPE matrices ``(P, P⁻¹)``, each ``[..., 4, 4]``, from w2c ``[..., 4, 4]`` and pixel ``K [..., 4]``."""
    Kn = normalized_intrinsics(K, image_size)
    return _projection(viewmats, Kn), _projection_inverse(viewmats, Kn)


def cameras_per_token(
    viewmats: torch.Tensor, K: torch.Tensor, tokens_per_frame: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Expand per-frame cameras ``[B, F, 4, 4]``, ``[B, F, 4]`` to per-token ``[B, F*T, 4, 4]``, ``[B, F*T, 4]``.

    Token order is frame-major. Prefer passing per-frame cameras to ``prope_attention``
    directly (the fast path); expand only when frames hold different token counts.
    """
    if viewmats.dim() != 4 or viewmats.shape[-2:] != (4, 4):
        raise PRoPEError(f"cameras_per_token: viewmats must be [B, F, 4, 4], got {tuple(viewmats.shape)}")
    if K.shape != viewmats.shape[:2] + (4,):
        raise PRoPEError(f"cameras_per_token: K must be [B, F, 4] matching viewmats, got {tuple(K.shape)}")
    if tokens_per_frame < 1:
        raise PRoPEError(f"cameras_per_token: tokens_per_frame must be >= 1, got {tokens_per_frame}")
    return (
        viewmats.repeat_interleave(tokens_per_frame, dim=1),
        K.repeat_interleave(tokens_per_frame, dim=1),
    )


def _resolve_head_dims(head_dims: slice | None, head_dim: int) -> tuple[int, int]:
    """``head_dims`` -> ``(start, stop)`` on a head of size ``head_dim``; length must be a positive multiple of 4."""
    if head_dims is None:
        head_dims = slice(None)
    if not isinstance(head_dims, slice):
        raise PRoPEError(f"prope_attention: head_dims must be a slice, got {type(head_dims).__name__}")
    start, stop, step = head_dims.indices(head_dim)
    length = stop - start
    if step != 1 or length <= 0 or length % 4 != 0:
        raise PRoPEError(
            f"prope_attention: head_dims {head_dims} selects {max(length, 0)} of {head_dim} dims with step {step}; "
            "PRoPE needs a contiguous, non-empty slice whose length is a multiple of 4"
        )
    return start, stop


def _check_cameras(name: str, viewmats: torch.Tensor, K: torch.Tensor, batch: int, num_tokens: int) -> None:
    if viewmats.dim() != 4 or viewmats.shape[-2:] != (4, 4) or viewmats.shape[0] not in (1, batch):
        raise PRoPEError(
            f"prope_attention: viewmats_{name} must be [B, N or F, 4, 4] with B={batch}, got {tuple(viewmats.shape)}"
        )
    if K.shape != viewmats.shape[:2] + (4,):
        raise PRoPEError(
            f"prope_attention: K_{name} must be {tuple(viewmats.shape[:2]) + (4,)} to match viewmats_{name}, "
            f"got {tuple(K.shape)}"
        )
    cams = viewmats.shape[1]
    if cams == 0 or num_tokens % cams != 0:
        raise PRoPEError(
            f"prope_attention: {name} has {num_tokens} tokens but {cams} cameras; "
            "give one camera per token or per frame (tokens frame-major, N divisible by F)"
        )


def _right_multiply(x: torch.Tensor, mats: torch.Tensor) -> torch.Tensor:
    """``x [B, H, N, C*4]`` -> every 4-vector row ``r`` of a token in frame f becomes ``r @ mats[b, f]``.

    ``mats`` is ``[B, F, 4, 4]`` with N = F * T: the view ``[B, H, F, T*C, 4]`` lets one
    batched matmul apply each frame's matrix to all its tokens and 4-dim blocks.
    """
    batch, heads, tokens, dims = x.shape
    frames = mats.shape[1]
    rows = x.reshape(batch, heads, frames, (tokens // frames) * (dims // 4), 4)
    return torch.matmul(rows, mats.unsqueeze(1)).reshape(batch, heads, tokens, dims)


def _transform(x: torch.Tensor, mats: torch.Tensor, start: int, stop: int) -> torch.Tensor:
    """Apply ``_right_multiply`` on head dims ``[start, stop)``; the rest pass through."""
    if start == 0 and stop == x.shape[-1]:
        return _right_multiply(x, mats)
    moved = _right_multiply(x[..., start:stop], mats)
    return torch.cat((x[..., :start], moved, x[..., stop:]), dim=-1)


def prope_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    viewmats_q: torch.Tensor,
    K_q: torch.Tensor,
    viewmats_kv: torch.Tensor,
    K_kv: torch.Tensor,
    image_size: tuple[int, int],
    head_dims: slice | None = None,
    attn_mask: torch.Tensor | object | None = None,
) -> torch.Tensor:
    """Fused-PRoPE attention: ``[B, H, Nq, D]`` from q ``[B, H, Nq, D]``, k/v ``[B, H, Nk, D]``.

    ``viewmats_*`` are world->camera ``[B, N, 4, 4]`` per token or ``[B, F, 4, 4]`` per
    frame (frame-major tokens); ``K_*`` the matching pixel ``(fx, fy, cx, cy)``;
    ``image_size`` is ``(W, H)`` in the pixels of K. Query and key cameras are separate
    so a KV cache can hold keys from earlier frames. ``head_dims`` selects the slice of
    each head that gets PRoPE (default: all; length a multiple of 4). ``attn_mask`` goes
    to :func:`solarwm.kernels.attention.attention` unchanged.
    """
    if q.dim() != 4 or k.shape != v.shape or k.dim() != 4 or q.shape[:2] != k.shape[:2] or q.shape[3] != k.shape[3]:
        raise PRoPEError(
            "prope_attention: q must be [B, H, Nq, D] and k, v [B, H, Nk, D]; got "
            f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    batch, _, num_q, head_dim = q.shape
    start, stop = _resolve_head_dims(head_dims, head_dim)
    _check_cameras("q", viewmats_q, K_q, batch, num_q)
    _check_cameras("kv", viewmats_kv, K_kv, batch, k.shape[2])

    # Build the 4x4s in at least fp32 (poses carry metric translations), apply them in q's dtype.
    geo_dtype = torch.promote_types(viewmats_q.dtype, torch.float32)
    Kn_q = normalized_intrinsics(K_q.to(geo_dtype), image_size)
    Kn_kv = normalized_intrinsics(K_kv.to(geo_dtype), image_size)
    P_q = _projection(viewmats_q.to(geo_dtype), Kn_q).to(q.dtype)
    P_kv_inv = _projection_inverse(viewmats_kv.to(geo_dtype), Kn_kv).to(q.dtype)

    # Row-vector form: Pᵀq == (qᵀ P)ᵀ, P⁻¹k == (kᵀ P⁻ᵀ)ᵀ, P o == (oᵀ Pᵀ)ᵀ.
    kv_mats = P_kv_inv.transpose(-1, -2)
    q_t = _transform(q, P_q, start, stop)
    k_t = _transform(k, kv_mats, start, stop)
    v_t = _transform(v, kv_mats, start, stop)
    out = attention(q_t, k_t, v_t, attn_mask)
    return _transform(out, P_q.transpose(-1, -2), start, stop)
