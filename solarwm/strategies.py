"""Lightning strategies for the published routes: FSDP wrapped per transformer block (paper §4, 8–256 GPUs).

A recipe names it in YAML; the route decides the wrap unit (its adapter's ``transformer_block``)::

    trainer:
      strategy:
        class_path: solarwm.strategies.RouteFSDPStrategy
        init_args: {route: wan22_i2v_14b}        # + activation_checkpointing, sharding_strategy, ...
      precision: bf16-mixed                       # FSDP's MixedPrecision: bf16 compute, fp32 master weights

Each transformer block is one FSDP unit (its parameters are gathered just before it runs and freed after)
and, with ``activation_checkpointing``, one checkpointed region (its activations are recomputed in the
backward). The codec, text encoder and camera weights stay in the root unit. ``use_orig_params`` is on
because a unit mixes frozen and trainable parameters (LoRA, the root's frozen codec next to camera weights).
"""

from __future__ import annotations

import importlib
from typing import Literal

from lightning.pytorch.strategies import FSDPStrategy
from torch import nn

from solarwm.backbones.base import AdapterError, route_class


def route_block_class(route: str) -> type[nn.Module]:
    """The transformer block class of ``route`` (its adapter's ``transformer_block``, ``"module:Class"``)."""
    target = route_class(route).transformer_block
    if not target:
        raise AdapterError(f"route {route!r} names no transformer_block (the FSDP wrap unit)")
    module_name, _, class_name = target.partition(":")
    block = getattr(importlib.import_module(module_name), class_name, None)
    if not (isinstance(block, type) and issubclass(block, nn.Module)):
        raise AdapterError(f"route {route!r}: transformer_block {target} is not an nn.Module class")
    return block


class RouteFSDPStrategy(FSDPStrategy):
    """``FSDPStrategy`` with the route's transformer block as wrap and activation-checkpointing unit.

    Args:
        route: the backbone route (``wan22_ti2v_5b``, ``wan22_i2v_14b``, ``ltx25``, ``minimax_h3``).
        activation_checkpointing: recompute each block's activations in the backward.
        sharding_strategy: ``FULL_SHARD`` (ZeRO-3), ``SHARD_GRAD_OP`` (ZeRO-2), ``HYBRID_SHARD``, ``NO_SHARD``.
        state_dict_type: ``full`` (one checkpoint file, gathered on rank 0) or ``sharded`` (one per rank).
        cpu_offload: keep parameters and gradients on the CPU between uses.
        process_group_backend: ``nccl`` on GPUs (default), ``gloo`` on CPUs.
    """

    def __init__(
        self,
        route: str,
        activation_checkpointing: bool = True,
        sharding_strategy: Literal["FULL_SHARD", "SHARD_GRAD_OP", "HYBRID_SHARD", "NO_SHARD"] = "FULL_SHARD",
        state_dict_type: Literal["full", "sharded"] = "full",
        cpu_offload: bool = False,
        process_group_backend: str | None = None,
    ) -> None:
        block = route_block_class(route)
        self.route = route
        super().__init__(
            auto_wrap_policy={block},
            activation_checkpointing_policy={block} if activation_checkpointing else None,
            sharding_strategy=sharding_strategy,
            state_dict_type=state_dict_type,
            cpu_offload=cpu_offload,
            process_group_backend=process_group_backend,
            use_orig_params=True,
        )
