"""Lightning strategies for the published routes: FSDP2 sharded per transformer block (paper §4, 8–256 GPUs).

A route file names it in YAML (recipes/routes/); the adapter being sharded decides the wrap unit (its class's
``transformer_block``), so the strategy names no route::

    trainer:
      strategy:
        class_path: solarwm.strategies.RouteFSDPStrategy
        init_args: {activation_checkpointing: true}   # + sharding_strategy, state_dict_type, cpu_offload,
                                                      #   sequence_parallel_size
      precision: bf16-mixed                       # bf16 compute, fp32 master weights and gradient reduction

It is Lightning's ``ModelParallelStrategy`` (PyTorch's FSDP2, ``fully_shard``) with a fixed plan instead of a
user-written ``configure_model``: every stage's ``configure_model`` calls ``RouteFSDPStrategy.parallelize``,
which applies ``shard_transformer``. Each transformer block is one FSDP unit (its parameters are all-gathered
just before it runs and freed after) and, with ``activation_checkpointing``, one checkpointed region (its
activations are recomputed in the backward); the transformer is the root unit. The trainable parameters
(LoRA, camera weights) live in the transformer, and the flow map's r-embedding (the adapter's, stage 2) is a
unit of its own, so all of them are sharded and their gradients reduce-scattered; the frozen codec and text
encoder stay whole on each rank. ``sequence_parallel_size: P`` adds Ulysses sequence parallelism
(``solarwm.backbones.sequence_parallel``): P ranks split every sample's tokens.

FSDP2 runs on CPUs too (gloo), unlike FSDP v1 ("FSDP needs a non-CPU accelerator device"), so the same class
the recipes use on GPUs takes real steps in the CPU test (``tests/distributed/test_strategies_fsdp.py``).
"""

from __future__ import annotations

from typing import Literal

import torch
from lightning.pytorch.strategies import ModelParallelStrategy
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
    CheckpointWrapper,
    apply_activation_checkpointing,
)
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, fully_shard

from solarwm.backbones.base import AdapterError, BackboneAdapter, transformer_block_class  # noqa: F401
from solarwm.backbones.sequence_parallel import enable_sequence_parallel
from solarwm.kernels.ulysses import SequenceParallel


def bf16_mixed_policy() -> MixedPrecisionPolicy:
    """bf16 parameters in forward/backward, fp32 gradient reduction; the sharded master weights stay fp32.

    ``cast_forward_inputs`` is off: FSDP2 casts a unit's inputs by rebuilding every container, which turns
    the routes' ``ContextRotary`` (a tuple carrying the call's cameras) into a plain tuple, and the block then
    stops with "camera condition missing". Lightning's ``bf16-mixed`` autocast sets the compute dtype instead.
    """
    return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32, cast_forward_inputs=False)


def shard_transformer(
    transformer: nn.Module,
    block: type[nn.Module],
    mesh: DeviceMesh | None = None,
    activation_checkpointing: bool = True,
    mp_policy: MixedPrecisionPolicy | None = None,
    reshard_after_forward: bool = True,
    cpu_offload: bool = False,
) -> list[nn.Module]:
    """Shard ``transformer`` in place with FSDP2: one unit per ``block``, then the transformer as the root.

    With ``activation_checkpointing`` each block is first wrapped in a ``CheckpointWrapper`` and the wrapper is
    the unit (torchtitan's order), so the recomputation re-gathers the block's parameters. Returns the units.
    Raises ``AdapterError`` when the transformer holds no ``block`` (FSDP would shard nothing per block).
    """
    if not any(isinstance(m, block) for m in transformer.modules()):
        raise AdapterError(f"{type(transformer).__name__} holds no {block.__name__} (the FSDP wrap unit)")
    if activation_checkpointing:
        apply_activation_checkpointing(transformer, check_fn=lambda m: isinstance(m, block))
    units = [
        m
        for m in transformer.modules()
        if (isinstance(m, CheckpointWrapper) and isinstance(m._checkpoint_wrapped_module, block))
        or (isinstance(m, block) and not activation_checkpointing)
    ]
    kwargs = {
        "mesh": mesh,
        "mp_policy": mp_policy or MixedPrecisionPolicy(),
        "offload_policy": CPUOffloadPolicy() if cpu_offload else None,
    }
    kwargs = {k: v for k, v in kwargs.items() if v is not None}
    for unit in units:
        fully_shard(unit, reshard_after_forward=reshard_after_forward, **kwargs)
    fully_shard(transformer, reshard_after_forward=reshard_after_forward, **kwargs)
    return units


class RouteFSDPStrategy(ModelParallelStrategy):
    """FSDP2 (``ModelParallelStrategy``, data-parallel only) with the adapter's transformer block as the unit.

    Args:
        activation_checkpointing: recompute each block's activations in the backward.
        sharding_strategy: ``FULL_SHARD`` (ZeRO-3: re-shard after forward) or ``SHARD_GRAD_OP`` (ZeRO-2: keep
            the gathered parameters from forward to backward).
        state_dict_type: ``full`` (one checkpoint file, gathered on rank 0) or ``sharded`` (one per rank).
        cpu_offload: keep sharded parameters, gradients and optimizer states on the CPU between uses.
        process_group_backend: ``nccl`` on GPUs (the default there), ``gloo`` on CPUs (the default there).
        sequence_parallel_size: ``P`` ranks share each sample's tokens (Ulysses; ``backbones.sequence_parallel``).
            The mesh is ``(world / P, P)`` = ``("data_parallel", "sequence_parallel")``; the sampler shards over
            the data-parallel ranks only, so a group's ranks read the same batch; FSDP shards over all ranks
            (the group's ranks hold partial gradients of the same samples, which its reduce-scatter sums).
            1: today's data-parallel-only mesh.
    """

    def __init__(
        self,
        activation_checkpointing: bool = True,
        sharding_strategy: Literal["FULL_SHARD", "SHARD_GRAD_OP"] = "FULL_SHARD",
        state_dict_type: Literal["full", "sharded"] = "full",
        cpu_offload: bool = False,
        process_group_backend: str | None = None,
        sequence_parallel_size: int = 1,
    ) -> None:
        if sharding_strategy not in ("FULL_SHARD", "SHARD_GRAD_OP"):
            raise ValueError(
                f"sharding_strategy {sharding_strategy!r}: use FULL_SHARD or SHARD_GRAD_OP "
                "(for no sharding use `--trainer.strategy ddp`)"
            )
        self.activation_checkpointing = activation_checkpointing
        self.sharding_strategy = sharding_strategy
        self.cpu_offload = cpu_offload
        if not isinstance(sequence_parallel_size, int) or sequence_parallel_size < 1:
            raise ValueError(f"sequence_parallel_size must be a positive int, got {sequence_parallel_size!r}")
        self.sequence_parallel_size = sequence_parallel_size
        self._sequence_parallel: SequenceParallel | None = None
        self._shard_mesh: DeviceMesh | None = None
        super().__init__(
            tensor_parallel_size=1,
            save_distributed_checkpoint=state_dict_type == "sharded",
            process_group_backend=process_group_backend,
        )

    def setup_environment(self) -> None:
        """P = 1: every rank is a data-parallel rank, mesh ``(world, 1)``; else ``(world / P, P)`` (see the class)."""
        world = self.num_nodes * self.num_processes
        size = self.sequence_parallel_size
        if size == 1:
            self._data_parallel_size = world
            super().setup_environment()
            return
        if world % size:
            raise ValueError(f"sequence_parallel_size={size} does not divide the {world} ranks")
        self._data_parallel_size = world // size
        super(ModelParallelStrategy, self).setup_environment()
        self._setup_distributed()
        self._device_mesh = init_device_mesh(
            self.root_device.type, (world // size, size), mesh_dim_names=("data_parallel", "sequence_parallel")
        )
        self.lightning_module._device_mesh = self._device_mesh

    def sequence_parallel(self) -> SequenceParallel | None:
        """This rank's sequence-parallel group (None when ``sequence_parallel_size`` is 1)."""
        if self.sequence_parallel_size == 1:
            return None
        if self._sequence_parallel is None:
            self._sequence_parallel = SequenceParallel(self.device_mesh["sequence_parallel"].get_group())
        return self._sequence_parallel

    def shard_mesh(self) -> DeviceMesh:
        """The mesh FSDP shards over: the data-parallel ranks (P = 1), else all ranks (dp x sp flattened)."""
        if self.sequence_parallel_size == 1:
            return self.device_mesh["data_parallel"]
        if self._shard_mesh is None:
            self._shard_mesh = self.device_mesh["data_parallel", "sequence_parallel"]._flatten("data_sequence")
        return self._shard_mesh

    def mixed_precision_policy(self) -> MixedPrecisionPolicy | None:
        """FSDP2's bf16 policy when the trainer's precision is ``bf16-mixed``; None otherwise."""
        return bf16_mixed_policy() if self.precision_plugin.precision == "bf16-mixed" else None

    def parallelize(self, adapter: BackboneAdapter) -> None:
        """Shard ``adapter.transformer`` per ``transformer_block`` and the flow map's r-embedding; with
        ``sequence_parallel_size`` > 1 first split its tokens over the group (idempotent: ``configure_model`` may
        run twice)."""
        if self.sequence_parallel_size > 1:
            enable_sequence_parallel(adapter, self.sequence_parallel())
        reshard = self.sharding_strategy == "FULL_SHARD"
        transformer = adapter.transformer
        if not isinstance(transformer, FSDPModule):
            shard_transformer(
                transformer,
                transformer_block_class(adapter),
                mesh=self.shard_mesh(),
                activation_checkpointing=self.activation_checkpointing,
                mp_policy=self.mixed_precision_policy(),
                reshard_after_forward=reshard,
                cpu_offload=self.cpu_offload,
            )
        # The flow map's r-embedding (stage 2) is the adapter's, outside the transformer: its own unit, or its
        # parameters would stay plain tensors whose gradients no rank shares (and clipping would mix the two).
        delta = getattr(adapter, "delta_embedding", None)
        if delta is not None and not isinstance(delta, FSDPModule):
            kwargs = {"mesh": self.shard_mesh(), "reshard_after_forward": reshard}
            if self.mixed_precision_policy() is not None:
                kwargs["mp_policy"] = self.mixed_precision_policy()
            if self.cpu_offload:
                kwargs["offload_policy"] = CPUOffloadPolicy()
            fully_shard(delta, **kwargs)
