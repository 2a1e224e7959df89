"""Ulysses sequence parallelism on a route's transformer: token-sharded blocks, all-to-all in self-attention.

``enable_sequence_parallel(adapter, sp)`` makes every transformer block of ``adapter`` run on this rank's
contiguous ``1/P`` of the token sequence (``solarwm.kernels.ulysses``):

* a forward pre-hook on each block (the FSDP unit, ``transformer_block``) slices the block's per-token
  arguments (``BLOCK_SHARDING``: the hidden states entering the first block, per-token AdaLN inputs of
  every block); the first block records the full token count on the call's attention context (carried by
  the rotary tuple every block receives, so an activation-checkpoint recomputation sees the same count);
* a block that works per latent frame (LTX: per-frame AdaLN, cross-attention grouped by frame) is split
  into whole frames instead: each rank holds ``ceil(f/P)`` frames (the last ranks padded with whole zero
  frames), its per-frame arguments are sliced alike and its frame groups renumbered to its own frames;
* every self-attention processor gets the group (``processor.sequence_parallel``) and does the two
  all-to-alls around the unchanged attention;
* a forward hook on the last block gathers the tokens back, so the output head, the loss and everything a
  stage does with the prediction see the full sequence, identical on every rank of the group.

Cross-attention to text needs nothing (each rank's query tokens attend to the full text). Heads that do not
divide by ``P`` fail here, at set-up.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_info

from solarwm.backbones.base import AdapterError, BackboneAdapter
from solarwm.backbones.export import transformer_block_class
from solarwm.kernels.ulysses import SequenceParallel, SequenceParallelError


@dataclass(frozen=True)
class BlockSharding:
    """How one route's FSDP block (``transformer_block``) is split over a sequence-parallel group.

    ``token_args``: the ``forward`` arguments indexed by token (name -> token dim), ``hidden_states`` first among
    them; ``context_arg``: the argument carrying the call's attention context (``.context``). With
    ``frame_args`` (name -> latent-frame dim) the split is in whole latent frames, those arguments are sliced
    by frame, and ``frame_groups_arg`` names the per-sample lists of frame indices the block groups by.
    """

    token_args: dict[str, int]
    context_arg: str
    frame_args: dict[str, int] = field(default_factory=dict)
    frame_groups_arg: str | None = None


BLOCK_SHARDING: dict[str, BlockSharding] = {
    # Wan: per-token timesteps give temb [B, N, 6, D] (Wan2.2's expand_timesteps path).
    "diffusers.models.transformers.transformer_wan:WanTransformerBlock": BlockSharding(
        {"hidden_states": 1, "temb": 1}, "rotary_emb"
    ),
    # H3: one packed sequence [1, rows, D]; adaln_indices [rows] picks each row's AdaLN entry.
    "diffusers.models.transformers.transformer_minimax_h3:MiniMaxH3TransformerBlock": BlockSharding(
        {"hidden_states": 1, "adaln_indices": 0}, "rotary_emb"
    ),
    # LTX: frame-major tokens [B, f*T, D]; AdaLN inputs per latent frame [B, f, n*D]; text cross-attention by
    # groups of frames that share a timestep.
    "solarwm.backbones.ltx25_model:LTX25VideoBlock": BlockSharding(
        {"hidden_states": 1}, "video_rotary_emb", {"temb": 1, "temb_prompt": 1}, "frame_groups"
    ),
}


def local_frame_groups(groups: list[list[torch.Tensor]], sp: SequenceParallel,
                       frames: int) -> list[list[torch.Tensor]]:
    """Each sample's frame groups renumbered to this rank's ``ceil(frames/P)`` frames; its padding frames are one
    more group, so every local frame is computed (a padded row left uncomputed could hold NaN, and NaN times a
    zero gradient is NaN in the weight gradients)."""
    local = -(-frames // sp.size)
    start = sp.rank * local
    out = []
    for sample in groups:
        mine = [g[(g >= start) & (g < start + local)] - start for g in sample]
        mine = [g for g in mine if g.numel()]
        first_pad = max(min(frames - start, local), 0)
        if first_pad < local:
            mine.append(torch.arange(first_pad, local, device=sample[0].device if sample else None))
        out.append(mine)
    return out


def _blocks(adapter: BackboneAdapter) -> list[torch.nn.Module]:
    block = transformer_block_class(adapter)
    return [m for m in adapter.transformer.modules() if isinstance(m, block)]


def _processors(adapter: BackboneAdapter) -> list[tuple[torch.nn.Module, Any]]:
    """``(attention module, processor)`` of every self-attention whose processor speaks Ulysses."""
    found = []
    for module in adapter.transformer.modules():
        processor = getattr(module, "processor", None)
        if processor is not None and hasattr(processor, "sequence_parallel"):
            found.append((module, processor))
    return found


def enable_sequence_parallel(adapter: BackboneAdapter, sp: SequenceParallel) -> None:
    """Run ``adapter``'s transformer with its tokens sharded over ``sp`` (idempotent; ``sp.size == 1``: nothing)."""
    if sp.size == 1 or getattr(adapter, "_sequence_parallel", None) is not None:
        return
    spec = BLOCK_SHARDING.get(type(adapter).transformer_block)
    if spec is None:
        raise SequenceParallelError(
            f"{adapter.route}: sequence parallelism is not supported for its block "
            f"{type(adapter).transformer_block} (supported: {sorted(BLOCK_SHARDING)}); use sequence_parallel_size=1"
        )
    processors = _processors(adapter)
    if not processors:
        raise AdapterError(f"{adapter.route}: no self-attention processor supports sequence parallelism")
    for attn, processor in processors:
        sp.check_heads(int(attn.heads), f"{adapter.route} self-attention")
    blocks = _blocks(adapter)
    signature = inspect.signature(type(blocks[0]).forward)
    token_dim = spec.token_args["hidden_states"]

    def shard_inputs(module: torch.nn.Module, args: tuple, kwargs: dict, first: bool) -> tuple[tuple, dict]:
        bound = signature.bind(module, *args, **kwargs)
        context = getattr(bound.arguments[spec.context_arg], "context", None)
        if context is None:
            raise AdapterError(f"{adapter.route}: a sequence-parallel block was called without its attention context")
        if first:
            context.sequence_tokens = int(bound.arguments["hidden_states"].shape[token_dim])
            if spec.frame_args:  # whole frames: the unit is one latent frame's tokens
                name, dim = next(iter(spec.frame_args.items()))
                context.sequence_frames = int(bound.arguments[name].shape[dim])
                context.sequence_unit = context.sequence_tokens // context.sequence_frames
            if spec.frame_groups_arg is not None:  # the same for every block of the call: renumbered once
                groups = bound.arguments[spec.frame_groups_arg]
                context.local_frame_groups = local_frame_groups(groups, sp, context.sequence_frames)
        tokens, unit = context.sequence_tokens, getattr(context, "sequence_unit", 1)
        for name, dim in spec.token_args.items():
            value = bound.arguments.get(name)
            # Full-length inputs are sliced; the hidden states after the first block are already this rank's.
            if isinstance(value, torch.Tensor) and value.dim() > dim and value.shape[dim] == tokens:
                bound.arguments[name] = sp.shard(value, dim, unit)
        for name, dim in spec.frame_args.items():  # the model passes these whole to every block
            value = bound.arguments.get(name)
            if isinstance(value, torch.Tensor):
                bound.arguments[name] = sp.shard(value, dim)
        if spec.frame_groups_arg is not None:
            bound.arguments[spec.frame_groups_arg] = context.local_frame_groups
        return bound.args[1:], bound.kwargs

    def gather_output(module: torch.nn.Module, args: tuple, kwargs: dict, output: torch.Tensor) -> torch.Tensor:
        context = signature.bind(module, *args, **kwargs).arguments[spec.context_arg].context
        return sp.gather(output, context.sequence_tokens, dim=token_dim, unit=getattr(context, "sequence_unit", 1))

    for index, block in enumerate(blocks):
        block.register_forward_pre_hook(
            lambda m, a, k, first=index == 0: shard_inputs(m, a, k, first), with_kwargs=True
        )
    blocks[-1].register_forward_hook(gather_output, with_kwargs=True)
    for _, processor in processors:
        processor.sequence_parallel = sp
    adapter._sequence_parallel = sp
    rank_zero_info(f"{adapter.route}: sequence parallel over {sp.size} ranks ({len(blocks)} "
                   f"{'frame' if spec.frame_args else 'token'}-sharded blocks, {len(processors)} all-to-all "
                   f"self-attentions)")
