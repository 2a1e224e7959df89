"""Ulysses all-to-all attention on 2 gloo processes equals single-process attention, forward and backward.

Kernel level: fused PRoPE with per-token cameras and a block-causal mask on a token count that does not
divide by 2 (the padded, stripped path). Processor level: each route's self-attention processor on inputs
captured from a real teacher-forcing call (its block-causal mask, rotary tables and cameras), with the
hidden states split over the ranks as the block hooks split them.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from solarwm.kernels.masks import block_causal_mask
from solarwm.kernels.prope import cameras_per_token, prope_attention
from solarwm.kernels.ulysses import SequenceParallel, SequenceParallelError

from dist_helpers import spawn

pytestmark = pytest.mark.multiprocess

TOL = dict(rtol=1e-5, atol=1e-5)


def _cameras(b: int, frames: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random rigid w2c ``[B, F, 4, 4]`` and pixel ``K [B, F, 4]``."""
    g = torch.Generator().manual_seed(seed)
    rot, _ = torch.linalg.qr(torch.randn(b, frames, 3, 3, generator=g, dtype=torch.float64))
    w2c = torch.eye(4, dtype=torch.float64).repeat(b, frames, 1, 1)
    w2c[..., :3, :3], w2c[..., :3, 3] = rot, torch.randn(b, frames, 3, generator=g, dtype=torch.float64)
    K = torch.tensor([40.0, 42.0, 24.0, 16.0]).repeat(b, frames, 1) + torch.rand(b, frames, 4, generator=g)
    return w2c.float(), K


def _kernel_worker(rank: int, world: int) -> None:
    b, heads, dim, frames, tpf = 2, 4, 16, 3, 5  # N = 15 tokens: 8 per rank, the last padded
    n = frames * tpf
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(b, n, heads, dim, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3))
    grad_out = torch.randn(b, n, heads, dim, generator=g, dtype=torch.float64)
    w2c, K = cameras_per_token(*_cameras(b, frames, 1), tpf)  # per-token cameras [B, N, 4, 4]
    w2c, K = w2c.double(), K.double()
    mask = block_causal_mask(frames, tpf, 2)

    def attend(q, k, v):  # [B, N, h, D] with the full sequence
        out = prope_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), w2c, K, w2c, K, (48, 32),
                              head_dims=slice(0, 8), attn_mask=mask)
        return out.transpose(1, 2)

    ref = attend(q, k, v)
    ref_grads = torch.autograd.grad(ref, (q, k, v), grad_out)

    sp = SequenceParallel()
    assert sp.local_tokens(n) == 8 and sp.token_range(n) == ((0, 8) if rank == 0 else (8, 15))
    local = [sp.shard(t) for t in (q, k, v)]
    out = sp.to_tokens(attend(*(sp.to_heads(t, n) for t in local)))
    assert out.shape == (b, 8, heads, dim)
    start, stop = sp.token_range(n)
    torch.testing.assert_close(out[:, : stop - start], ref[:, start:stop], **TOL)
    grads = torch.autograd.grad(out, (q, k, v), sp.shard(grad_out))
    for got, want in zip(grads, ref_grads):
        got = got.contiguous()  # gloo reduces a tensor's storage as if it were contiguous
        dist.all_reduce(got)  # each rank holds the gradient of its tokens' outputs
        torch.testing.assert_close(got, want, **TOL)
    # The gather used for the output head: the full sequence, identical on both ranks.
    full = sp.gather(out, n)
    torch.testing.assert_close(full, ref, **TOL)
    with pytest.raises(SequenceParallelError, match="3 attention heads do not divide by sequence_parallel_size=2"):
        sp.check_heads(3, "test")


@pytest.mark.slow
def test_ulysses_prope_attention_equals_one_process_with_padding() -> None:
    spawn(_kernel_worker, 2)


def _capture(adapter: torch.nn.Module) -> dict:
    """Run a teacher-forcing call of ``adapter`` and keep the first self-attention's inputs."""
    from solarwm.backbones.sequence_parallel import _processors

    attn, processor = _processors(adapter)[0]
    seen: dict = {}
    original = type(processor).__call__

    def record(self, module, hidden_states, *args, **kwargs):
        if not seen:
            seen.update(attn=module, hidden=hidden_states.detach().clone(), args=args, kwargs=kwargs)
        return original(self, module, hidden_states, *args, **kwargs)

    type(processor).__call__ = record
    try:
        from route_inputs import teacher_forcing_call

        teacher_forcing_call(adapter)
    finally:
        type(processor).__call__ = original
    seen["processor"] = processor
    return seen


def _processor_worker(rank: int, world: int, route: str) -> None:
    from route_inputs import tiny_route

    adapter = tiny_route(route).double()
    seen = _capture(adapter)
    attn, processor, args, kwargs = seen["attn"], seen["processor"], seen["args"], seen["kwargs"]
    context = next(a.context for a in list(args) + list(kwargs.values()) if hasattr(a, "context"))
    assert context.attn_mask is not None  # the teacher-forcing (block-causal) mask
    hidden = seen["hidden"].requires_grad_(True)
    n = hidden.shape[1]
    g = torch.Generator().manual_seed(3)
    grad_out = torch.randn(hidden.shape, generator=g, dtype=hidden.dtype)
    params = [p for p in attn.parameters()]

    ref = processor(attn, hidden, *args, **kwargs)
    ref_grads = torch.autograd.grad(ref, [hidden, *params], grad_out)

    sp = SequenceParallel()
    processor.sequence_parallel, context.sequence_tokens = sp, n
    try:
        out = processor(attn, sp.shard(hidden), *args, **kwargs)
    finally:
        processor.sequence_parallel = None
    start, stop = sp.token_range(n)
    torch.testing.assert_close(out[:, : stop - start], ref[:, start:stop], **TOL)
    grads = torch.autograd.grad(out, [hidden, *params], sp.shard(grad_out))
    for got, want in zip(grads, ref_grads):
        got = got.contiguous().clone()
        dist.all_reduce(got)
        torch.testing.assert_close(got, want, **TOL)


@pytest.mark.slow
@pytest.mark.parametrize("route", ["wan22_ti2v_5b", "wan22_i2v_14b", "ltx25", "minimax_h3"])
def test_route_processor_under_ulysses_equals_one_process(route: str) -> None:
    spawn(_processor_worker, 2, route)


def _model_worker(rank: int, world: int, route: str, call_name: str) -> None:
    from solarwm.backbones.sequence_parallel import enable_sequence_parallel

    import route_inputs

    call = getattr(route_inputs, call_name)
    adapter = route_inputs.tiny_route(route).double()
    ref = call(adapter)
    params = [p for p in adapter.transformer.parameters()]
    ref_grads = torch.autograd.grad(ref.square().sum(), params, allow_unused=True)  # H3: the audio head is unused
    enable_sequence_parallel(adapter, SequenceParallel())
    out = call(adapter)
    torch.testing.assert_close(out, ref, **TOL)  # gathered: the full prediction on every rank
    grads = torch.autograd.grad(out.square().sum(), params, allow_unused=True)
    for got, want in zip(grads, ref_grads):
        assert (got is None) == (want is None)
        if got is None:
            continue
        got = got.contiguous().clone()
        dist.all_reduce(got)
        torch.testing.assert_close(got / world, want, **TOL)  # the group's mean is the one-process gradient


@pytest.mark.slow
@pytest.mark.parametrize("route", ["wan22_ti2v_5b", "minimax_h3", "ltx25"])
def test_sharded_transformer_equals_one_process(route: str) -> None:
    """The whole teacher-forcing call with its tokens split over 2 ranks: same prediction, same mean gradient."""
    spawn(_model_worker, 2, route, "teacher_forcing_call")


@pytest.mark.slow
def test_ltx_whole_frame_split_of_an_odd_frame_count_equals_one_process() -> None:
    """LTX's blocks work per latent frame, so its split is whole frames: 5 latent frames at 5 noise levels give
    rank 0 three frames and rank 1 two and a padding frame; prediction and mean gradient are one process's."""
    spawn(_model_worker, 2, "ltx25", "plain_call")


def _heads_worker(rank: int, world: int) -> None:
    from solarwm.backbones.sequence_parallel import enable_sequence_parallel
    from solarwm.backbones.wan22_ti2v_5b import Wan22TI2V5BAdapter, Wan22TI2V5BConfig

    config = Wan22TI2V5BConfig.tiny()
    config.num_attention_heads = 3  # 3 x 64: not divisible by 2
    adapter = Wan22TI2V5BAdapter(config=config)
    with pytest.raises(SequenceParallelError, match=r"3 attention heads do not divide by sequence_parallel_size=2; "
                                                    r"use one of \[1, 3\]"):
        enable_sequence_parallel(adapter, SequenceParallel())
    assert all(p.sequence_parallel is None for p in (b.attn1.processor for b in adapter.transformer.blocks))


@pytest.mark.slow
def test_heads_not_divisible_by_the_group_fail_at_set_up() -> None:
    spawn(_heads_worker, 2)
