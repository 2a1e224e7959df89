"""Fused PRoPE: naive per-token reference, relative-pose invariance, shared camera == SDPA, grads."""

import math

import pytest
import torch
import torch.nn.functional as F

from solarwm.kernels.masks import block_causal_mask
from solarwm.kernels.prope import PRoPEError, cameras_per_token, projective_matrices, prope_attention

W, H = 64, 48  # image size the pixel intrinsics refer to


def random_se3(n, gen, dtype=torch.float64):
    """n random rigid transforms [n, 4, 4] (rotation from QR with det +1)."""
    a = torch.randn(n, 3, 3, generator=gen, dtype=dtype)
    rot, r = torch.linalg.qr(a)
    rot = rot * torch.sign(torch.diagonal(r, dim1=-2, dim2=-1))[:, None, :]
    rot[torch.det(rot) < 0, :, 0] *= -1
    out = torch.eye(4, dtype=dtype).repeat(n, 1, 1)
    out[:, :3, :3] = rot
    out[:, :3, 3] = torch.randn(n, 3, generator=gen, dtype=dtype)
    return out


def random_cameras(batch, count, gen, dtype=torch.float64):
    """World->camera [B, count, 4, 4] and pixel K [B, count, 4]."""
    w2c = random_se3(batch * count, gen, dtype).view(batch, count, 4, 4)
    focal = 40 + 60 * torch.rand(batch, count, 2, generator=gen, dtype=dtype)
    centre = torch.tensor([W / 2, H / 2], dtype=dtype) + 4 * torch.randn(batch, count, 2, generator=gen, dtype=dtype)
    return w2c, torch.cat((focal, centre), dim=-1)


def naive_prope(q, k, v, w2c_q, K_q, w2c_kv, K_kv, dims, mask=None):
    """Token-by-token PRoPE with explicit 4x4 matrices and a generic matrix inverse."""

    def projection(w2c, K):
        fx, fy, cx, cy = K.tolist()
        lift = torch.tensor(
            [[fx / W, 0, cx / W - 0.5, 0], [0, fy / H, cy / H - 0.5, 0], [0, 0, 1, 0], [0, 0, 0, 1]],
            dtype=w2c.dtype,
        )
        return lift @ w2c

    def blockwise(mat, x):  # apply a 4x4 to every 4-dim block of x[dims]
        x = x.clone()
        for s in range(dims.start, dims.stop, 4):
            x[s : s + 4] = mat @ x[s : s + 4]
        return x

    B, nh, nq, D = q.shape
    nk = k.shape[2]
    out = torch.zeros_like(q)
    for b in range(B):
        Pq = [projection(w2c_q[b, i], K_q[b, i]) for i in range(nq)]
        Pk_inv = [torch.linalg.inv(projection(w2c_kv[b, j], K_kv[b, j])) for j in range(nk)]
        for h in range(nh):
            keys = [blockwise(Pk_inv[j], k[b, h, j]) for j in range(nk)]
            values = [blockwise(Pk_inv[j], v[b, h, j]) for j in range(nk)]
            for i in range(nq):
                qi = blockwise(Pq[i].T, q[b, h, i])
                logits = torch.stack([qi @ keys[j] for j in range(nk)]) / math.sqrt(D)
                if mask is not None:
                    logits = logits.masked_fill(~mask[i], float("-inf"))
                weights = torch.softmax(logits, dim=0)
                o = sum(weights[j] * values[j] for j in range(nk))
                out[b, h, i] = blockwise(Pq[i], o)
    return out


def make_qkv(B, nh, nq, nk, D, gen, dtype=torch.float64):
    return (
        torch.randn(B, nh, nq, D, generator=gen, dtype=dtype),
        torch.randn(B, nh, nk, D, generator=gen, dtype=dtype),
        torch.randn(B, nh, nk, D, generator=gen, dtype=dtype),
    )


@pytest.mark.parametrize("dims", [slice(None), slice(4, 12)], ids=["all_dims", "slice_4_12"])
def test_matches_naive_reference_per_token_cameras(dims):
    g = torch.Generator().manual_seed(0)
    q, k, v = make_qkv(2, 2, 5, 7, 16, g)  # Nq != Nk: KV-cache-like cross attention
    w2c_q, K_q = random_cameras(2, 5, g)
    w2c_kv, K_kv = random_cameras(2, 7, g)
    out = prope_attention(q, k, v, w2c_q, K_q, w2c_kv, K_kv, (W, H), head_dims=dims)
    ref = naive_prope(q, k, v, w2c_q, K_q, w2c_kv, K_kv, range(16)[dims])
    torch.testing.assert_close(out, ref, rtol=1e-9, atol=1e-9)


def test_per_frame_cameras_equal_expanded_per_token_and_reference_with_mask():
    g = torch.Generator().manual_seed(1)
    frames, tpf = 3, 2
    q, k, v = make_qkv(1, 2, frames * tpf, frames * tpf, 8, g)
    w2c, K = random_cameras(1, frames, g)
    w2c_tok, K_tok = cameras_per_token(w2c, K, tpf)
    assert w2c_tok.shape == (1, 6, 4, 4) and K_tok.shape == (1, 6, 4)
    assert torch.equal(w2c_tok[0, 2], w2c[0, 1]) and torch.equal(K_tok[0, 3], K[0, 1])
    mask = block_causal_mask(frames, tpf, 1)
    per_frame = prope_attention(q, k, v, w2c, K, w2c, K, (W, H), attn_mask=mask)
    per_token = prope_attention(q, k, v, w2c_tok, K_tok, w2c_tok, K_tok, (W, H), attn_mask=mask)
    torch.testing.assert_close(per_frame, per_token, rtol=1e-10, atol=1e-10)
    ref = naive_prope(q, k, v, w2c_tok, K_tok, w2c_tok, K_tok, range(8), mask)
    torch.testing.assert_close(per_frame, ref, rtol=1e-9, atol=1e-9)


def test_global_rigid_transform_leaves_output_unchanged():
    g = torch.Generator().manual_seed(2)
    q, k, v = make_qkv(2, 3, 8, 8, 16, g)
    w2c, K = random_cameras(2, 4, g)  # 4 frames x 2 tokens
    out = prope_attention(q, k, v, w2c, K, w2c, K, (W, H), head_dims=slice(8, 16))
    for seed in range(3):
        G = random_se3(1, torch.Generator().manual_seed(100 + seed))[0]
        G[:3, 3] *= 5.0  # a large world shift too
        moved = w2c @ torch.linalg.inv(G)
        out_moved = prope_attention(q, k, v, moved, K, moved, K, (W, H), head_dims=slice(8, 16))
        torch.testing.assert_close(out_moved, out, rtol=1e-8, atol=1e-8)
    # Sanity: a per-frame (non-global) change does move the output.
    w2c_other = w2c.clone()
    w2c_other[:, 1] = random_se3(2, g)
    assert not torch.allclose(prope_attention(q, k, v, w2c_other, K, w2c_other, K, (W, H)), out)


def test_shared_camera_equals_plain_sdpa():
    g = torch.Generator().manual_seed(3)
    q, k, v = make_qkv(2, 2, 6, 9, 16, g)
    w2c, K = random_cameras(2, 1, g)
    out = prope_attention(
        q, k, v, w2c.expand(2, 6, 4, 4), K.expand(2, 6, 4), w2c.expand(2, 9, 4, 4), K.expand(2, 9, 4), (W, H)
    )
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v), rtol=1e-9, atol=1e-9)
    # Same with per-frame cameras (one frame spanning all tokens).
    out_frame = prope_attention(q, k, v, w2c, K, w2c, K, (W, H))
    torch.testing.assert_close(out_frame, F.scaled_dot_product_attention(q, k, v), rtol=1e-9, atol=1e-9)


def test_head_dims_outside_slice_are_plain_attention():
    g = torch.Generator().manual_seed(4)
    q, k, v = make_qkv(1, 2, 6, 6, 16, g)
    w2c, K = random_cameras(1, 3, g)
    dims = slice(8, 16)
    # With the PRoPE dims of q and k zeroed, logits come from the plain dims alone, so the
    # plain output dims must be SDPA over the plain dims (at the full head's scale).
    q0, k0 = q.clone(), k.clone()
    q0[..., dims] = 0
    k0[..., dims] = 0
    out = prope_attention(q0, k0, v, w2c, K, w2c, K, (W, H), head_dims=dims)
    plain = F.scaled_dot_product_attention(q[..., :8], k[..., :8], v[..., :8], scale=1 / math.sqrt(16))
    torch.testing.assert_close(out[..., :8], plain, rtol=1e-9, atol=1e-9)
    assert not torch.allclose(out[..., 8:], F.scaled_dot_product_attention(q0, k0, v)[..., 8:])


def test_gradients_reach_qkv_and_cameras():
    g = torch.Generator().manual_seed(5)
    q, k, v = (t.float().requires_grad_() for t in make_qkv(1, 2, 8, 8, 16, g))
    w2c, K = (t.float() for t in random_cameras(1, 4, g))
    w2c.requires_grad_()
    out = prope_attention(q, k, v, w2c, K, w2c, K, (W, H), head_dims=slice(4, 16), attn_mask=block_causal_mask(4, 2, 2))
    assert out.dtype == torch.float32
    out.square().sum().backward()
    for t in (q, k, v, w2c):
        assert t.grad is not None and torch.isfinite(t.grad).all() and t.grad.abs().sum() > 0


def test_projective_matrices_inverse_is_analytic_and_exact():
    g = torch.Generator().manual_seed(6)
    w2c, K = random_cameras(3, 5, g)
    P, P_inv = projective_matrices(w2c, K, (W, H))
    eye = torch.eye(4, dtype=torch.float64).expand(3, 5, 4, 4)
    torch.testing.assert_close(P @ P_inv, eye, rtol=0, atol=1e-12)
    torch.testing.assert_close(P_inv, torch.linalg.inv(P), rtol=1e-10, atol=1e-10)


def test_dtype_follows_q():
    g = torch.Generator().manual_seed(7)
    q, k, v = (t.to(torch.bfloat16) for t in make_qkv(1, 2, 4, 4, 8, g))
    w2c, K = random_cameras(1, 4, g)  # float64 cameras
    out = prope_attention(q, k, v, w2c, K, w2c, K, (W, H))
    assert out.dtype == torch.bfloat16
    ref = prope_attention(q.double(), k.double(), v.double(), w2c, K, w2c, K, (W, H))
    torch.testing.assert_close(out.double(), ref, rtol=0.1, atol=0.1)


def test_bad_inputs_raise_named_errors():
    g = torch.Generator().manual_seed(8)
    q, k, v = make_qkv(1, 2, 6, 6, 16, g)
    w2c, K = random_cameras(1, 6, g)
    with pytest.raises(PRoPEError, match="multiple of 4"):
        prope_attention(q, k, v, w2c, K, w2c, K, (W, H), head_dims=slice(0, 6))
    with pytest.raises(PRoPEError, match="step 2"):
        prope_attention(q, k, v, w2c, K, w2c, K, (W, H), head_dims=slice(0, 16, 2))
    with pytest.raises(PRoPEError, match="must be a slice"):
        prope_attention(q, k, v, w2c, K, w2c, K, (W, H), head_dims=(0, 8))
    w2c4, K4 = random_cameras(1, 4, g)
    with pytest.raises(PRoPEError, match="6 tokens but 4 cameras"):
        prope_attention(q, k, v, w2c4, K4, w2c, K, (W, H))
    with pytest.raises(PRoPEError, match="K_kv"):
        prope_attention(q, k, v, w2c, K, w2c, K[:, :3], (W, H))
    with pytest.raises(PRoPEError, match="tokens_per_frame"):
        cameras_per_token(w2c, K, 0)
