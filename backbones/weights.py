"""The weights side of a backbone adapter: what trains, LoRA, the AnyFlow r-embedding, camera weights, weight-config
checks, export.

``AdapterWeights`` is a mixin of ``solarwm.backbones.base.BackboneAdapter`` (kept apart from the model call so
each file stays one concern); it uses the adapter's ``route``, ``config``, ``transformer``, ``lora_config`` and
``delta_embedding``.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path
from typing import Any, ClassVar

import torch

from solarwm.backbones import lora as _lora
from solarwm.backbones.export import AdapterError, load_adapter, read_adapter_json, read_export, write_export
from solarwm.backbones.lora import LoRAConfig, LoRAError


class AdapterWeights:
    """Weight handling shared by every route (mixed into ``BackboneAdapter``)."""

    route: ClassVar[str] = ""
    transformer: torch.nn.Module
    config: Any
    lora_config: LoRAConfig | None
    delta_embedding: torch.nn.Module | None
    flow_map_gate: float | None
    _flow_map_r: torch.Tensor | None

    @classmethod
    def require_weights(cls, preset: str, pretrained_path: str | None, device: str | None) -> None:
        """Refuse ``preset="published"`` without ``pretrained_path`` (before anything is built).

        A published-size model with random weights is never what a recipe means, and would take tens of GB;
        on the meta device (parameter counting) it is allowed.
        """
        if preset == "published" and pretrained_path is None and str(device) != "meta":
            raise AdapterError(
                f"{cls.route}: the published config needs its weights: set pretrained_path (the local diffusers "
                "checkpoint folder, e.g. --model.init_args.adapter.init_args.pretrained_path DIR); "
                "for the CPU configuration of this recipe add --config recipes/tiny.yaml"
            )

    #: Config keys that decide what trained weights mean; an export folder given as ``pretrained_path`` must agree.
    weight_config_keys: ClassVar[tuple[str, ...]] = (
        "prediction", "codec", "patchify_spatial", "text_encoder", "text_dim", "text_max_length", "camera_head_dims",
        "latent_camera", "intrinsics",
    )

    def check_weight_config(self, config: dict[str, Any], source: str) -> None:
        """Refuse weights from ``source`` trained under a ``config`` that reads them differently from this one.

        Keys like ``prediction`` change what the output means without changing a shape, so a strict
        state-dict load alone would accept them.
        """
        mine = self.config_dict()
        wrong = [f"{k}: {source} has {config[k]!r}, the config {mine[k]!r}" for k in self.weight_config_keys
                 if k in config and k in mine and config[k] != mine[k]]
        if wrong:
            raise AdapterError(
                f"{self.route}: weights trained under another config (" + "; ".join(wrong)
                + "); set the same values in the adapter's config"
            )

    def check_pretrained_export(self, root: Path | None) -> None:
        """An export folder given as ``pretrained_path`` must share the weight config (a diffusers folder has none)."""
        if root is not None and (root / "adapter.json").is_file():
            self.check_weight_config(read_adapter_json(root).get("config", {}), str(root))


    # ------------------------------------------------------------------ parameters
    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        """Parameters a stage optimises (transformer + camera weights; frozen parts excluded).

        With LoRA (``enable_lora``): exactly the LoRA weights, the camera weights (``camera_state_dict``) and
        the flow map's ``delta_embedding`` — never a base weight of the transformer, whatever its flag.
        """
        if self.lora_config is None:
            return [p for p in self.parameters() if p.requires_grad]
        allowed = {id(p) for _, p in _lora.lora_named_parameters(self.transformer)}
        allowed |= {id(p) for p in self.camera_parameters(self.transformer)}
        in_transformer = {id(p) for p in self.transformer.parameters()}
        return [p for p in self.parameters() if p.requires_grad and (id(p) in allowed or id(p) not in in_transformer)]

    def camera_parameters(self, module: torch.nn.Module) -> list[torch.nn.Parameter]:
        """``module``'s parameters (e.g. the transformer) that ``camera_state_dict`` returns (matched by storage)."""
        ptrs = {(t.data_ptr(), tuple(t.shape)) for t in self.camera_state_dict().values() if t.numel()}
        return [p for p in module.parameters() if (p.data_ptr(), tuple(p.shape)) in ptrs]

    # ------------------------------------------------------------------ LoRA (peft)
    def enable_lora(self, config: LoRAConfig | dict[str, Any] | None) -> None:
        """Wrap ``config.target_modules`` of the transformer in LoRA layers (peft; B = 0, so outputs are unchanged).

        Afterwards only the LoRA weights, the camera weights and (when enabled) the flow map train; the
        transformer's base weights get ``requires_grad=False``. ``None`` does nothing, so ``BackboneAdapter.__init__``
        ends with ``self.enable_lora(lora)`` for a route's ``lora: LoRAConfig | None = None`` argument (settable
        in YAML as ``init_args.lora: {rank, alpha, target_modules, dropout}``); a route never calls it itself.
        Call it before ``enable_flow_map`` (``BackboneAdapter.__init__`` does, before any stage enables the flow map),
        so the flow map's copy of the time embedding has the same layers whatever the order of a later reload.
        """
        if config is None:
            return
        if self.lora_config is not None:
            raise AdapterError(f"{self.route}: LoRA is already enabled ({self.lora_config}); merge_lora() first")
        try:
            config = LoRAConfig.coerce(config)
        except LoRAError as e:
            raise AdapterError(f"{self.route}: {e}") from e
        camera = self.camera_parameters(self.transformer)
        camera_flags = [p.requires_grad for p in camera]
        try:
            _lora.inject_lora(self.transformer, config)  # freezes every non-LoRA transformer weight
        except LoRAError as e:
            raise AdapterError(f"{self.route}: {e}") from e
        for p, flag in zip(camera, camera_flags):
            p.requires_grad_(flag)
        self.lora_config = config

    def lora_parameters(self) -> list[torch.nn.Parameter]:
        """The transformer's LoRA weights (empty without LoRA)."""
        return [p for _, p in _lora.lora_named_parameters(self.transformer)]

    def merge_lora(self) -> None:
        """Fold the LoRA into the transformer's base weights in place; the transformer becomes plain diffusers.

        The merged weights keep their frozen flag: call ``enable_lora`` again for a new LoRA on the merged
        base, or ``transformer.requires_grad_(True)`` to fine-tune all of it.
        """
        if self.lora_config is None:
            return
        _lora.merge_and_unload(self.transformer)
        if self.delta_embedding is not None and _lora.has_lora(self.delta_embedding):
            _lora.merge_and_unload(self.delta_embedding)
        self.lora_config = None

    def camera_state_dict(self) -> dict[str, torch.Tensor]:
        """Camera-injection weights (e.g. per-head gates) by name; empty for parameter-free PRoPE."""
        return {}

    def load_camera_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Load what ``camera_state_dict`` returned; raises on missing/unexpected keys."""
        own = self.camera_state_dict()
        if set(own) != set(state):
            raise AdapterError(
                f"{self.route}: camera weights mismatch: missing {sorted(set(own) - set(state))}, "
                f"unexpected {sorted(set(state) - set(own))}"
            )
        with torch.no_grad():
            for name, tensor in own.items():
                tensor.copy_(state[name])

    # ------------------------------------------------------------------ export
    def config_dict(self) -> dict[str, Any]:
        """The route config as plain JSON types (tuples as lists), as ``adapter.json`` and checkpoints hold it."""
        return json.loads(json.dumps(dataclasses.asdict(self.config)))

    def _export_extra(self, directory: Path) -> None:
        """Hook: write route-specific frozen parts needed by ``load_adapter`` (e.g. ``vae/``)."""

    def save_adapter(self, directory: str | Path, stage: str | None = None, merge_lora: bool = False) -> Path:
        """Write ``transformer/``, ``camera.safetensors`` and ``adapter.json`` atomically into ``directory``.

        ``stage`` (``bidirectional``, ``tf_anyflow``, ``dmd``) is recorded so ``solarwm predict`` knows
        whether the export is a causal model. With LoRA, ``transformer/`` is the frozen base (diffusers keys)
        and ``lora/`` the LoRA weights, the config in ``adapter.json["lora"]``; ``merge_lora=True`` writes the
        merged model as a plain ``transformer/`` and no LoRA (this adapter is left as it is).
        The layout: ``solarwm.backbones.export``.
        """
        return write_export(self, directory, stage, merge_lora)

    @classmethod
    def from_export(cls, directory: Path, config: Any, **kwargs: Any) -> "AdapterWeights":
        """Hook: build an adapter of this route from an export folder and its parsed config.

        Default: ``cls(config=config, pretrained_path=directory, **kwargs)`` — the export folder has the
        same ``transformer/`` (+ ``vae/``) layout as a diffusers checkpoint folder.
        """
        return cls(config=config, pretrained_path=str(directory), **kwargs)

    @classmethod
    def load_adapter(cls, directory: str | Path, **kwargs: Any) -> "AdapterWeights":
        """Rebuild an identical adapter from ``save_adapter`` output; errors name the folder and the check."""
        if not cls.route:  # BackboneAdapter itself: the route is read from adapter.json
            return load_adapter(directory, **kwargs)
        return read_export(cls, directory, **kwargs)

    # ------------------------------------------------------------------ AnyFlow flow map (eq. 2)
    def time_embedding(self) -> torch.nn.Module:
        """The pretrained time-embedding MLP whose output the r-embedding is mixed into (route hook)."""
        raise NotImplementedError(f"{self.route}: this route has no flow-map time embedding")

    def time_features(self, timesteps: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        """The input of ``time_embedding()`` for per-token model timesteps shaped like the model's own (route hook)."""
        raise NotImplementedError(f"{self.route}: this route has no flow-map time embedding")

    def enable_flow_map(self, gate: float = 0.25) -> None:
        """Add the AnyFlow r-embedding: a copy of the time embedding, mixed in as ``(1-g)·emb(t) + g·delta(r)``.

        At ``r = t`` the model's output is unchanged (the copy equals the original), so stage 2 starts
        exactly at the stage-1 model.
        """
        if not 0.0 < gate < 1.0:
            raise AdapterError(f"{self.route}: flow-map gate must be in (0, 1), got {gate}")
        if self.delta_embedding is None:
            self.delta_embedding = copy.deepcopy(self.time_embedding()).requires_grad_(True)
            self._flow_map_hook = self.time_embedding().register_forward_hook(self._mix_flow_map)
        self.flow_map_gate = float(gate)

    def disable_flow_map(self) -> None:
        """Drop the r-embedding (the DMD student is a plain t-conditioned causal model)."""
        if self.delta_embedding is not None:
            self._flow_map_hook.remove()
            self.delta_embedding = None
        self.flow_map_gate = None

    def _mix_flow_map(self, module: torch.nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
        if self.delta_embedding is None:
            return output
        r = self._flow_map_r
        features = args[0] if r is None else self.time_features(r, like=args[0])
        gate = self.flow_map_gate
        return ((1.0 - gate) * output + gate * self.delta_embedding(features)).type_as(output)
