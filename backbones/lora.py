r"""LoRA for any route (peft), used by ``BackboneAdapter.enable_lora`` / ``save_adapter`` / ``load_adapter``.

The adapters are injected with diffusers' PEFT integration (``ModelMixin.add_adapter(peft.LoraConfig)``), so
``adapter.transformer`` stays the diffusers model: its attention processors (PRoPE, KV cache) call the
wrapped ``to_q``/``to_k``/... layers unchanged, and ``save_pretrained`` / ``fuse_lora`` keep working.
Targets are free-form peft ``target_modules``: a list of names (a module matches when its name equals an
entry or ends with ``"." + entry``), e.g. Wan self- and cross-attention ``[to_q, to_k, to_v, to_out.0]``
plus the FFN ``[ffn.net.0.proj, ffn.net.2]``; or one string, a regular expression the whole module name
must match (e.g. only the main blocks:
``transformer_blocks\.\d+\.(attn\.(to_q|to_k|to_v|to_out\.0)|ff\.net\.(0\.proj|2))``).
The published MiniMax-H3 recipe is rank 384 on q/k/v/o + FFN.

Everything here is route-agnostic: it only needs ``peft`` tuner layers inside a ``torch.nn.Module``.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import torch
from safetensors.torch import load_file, save_file

#: peft adapter name used for the one LoRA of an adapter.
ADAPTER_NAME = "default"
#: File of the LoRA weights inside ``dir/lora/`` (diffusers' name; keys as ``peft.get_peft_model_state_dict``).
LORA_WEIGHTS = "pytorch_lora_weights.safetensors"


class LoRAError(ValueError):
    """A LoRA config is invalid, matches nothing, or LoRA weights do not fit the model; the message says which."""


@dataclass
class LoRAConfig:
    """LoRA of a route's transformer, settable from YAML as ``lora: {rank, alpha, target_modules, dropout}``.

    ``rank``: r of every adapted layer. ``alpha``: peft ``lora_alpha`` (the update is scaled by alpha / rank;
    None = rank, i.e. scale 1). ``target_modules``: peft module-name suffixes (free-form; see the module
    docstring: a list of name suffixes, or one full-match regex string). ``dropout``: peft ``lora_dropout`` on the
    LoRA branch's input (training mode only).
    """

    rank: int
    target_modules: list[str] | str
    alpha: float | None = None
    dropout: float = 0.0

    def __post_init__(self) -> None:
        if not isinstance(self.target_modules, str):
            self.target_modules = [str(t) for t in self.target_modules]
        if int(self.rank) != self.rank or self.rank < 1:
            raise LoRAError(f"LoRA rank must be a positive integer, got {self.rank!r}")
        self.rank = int(self.rank)
        if not self.target_modules or any(not t for t in self.target_modules):
            raise LoRAError(
                f"LoRA target_modules must be a non-empty list of module names or a regex, got {self.target_modules!r}"
            )
        if self.alpha is not None and self.alpha <= 0:
            raise LoRAError(f"LoRA alpha must be > 0 (or null = rank), got {self.alpha!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise LoRAError(f"LoRA dropout must be in [0, 1), got {self.dropout!r}")

    @classmethod
    def coerce(cls, value: "LoRAConfig | dict[str, Any]") -> "LoRAConfig":
        """A ``LoRAConfig`` from itself or from its dict form (YAML / ``adapter.json``)."""
        if isinstance(value, cls):
            return dataclasses.replace(value)
        if isinstance(value, dict):
            try:
                return cls(**value)
            except TypeError as e:
                raise LoRAError(f"LoRA config {value!r}: {e}") from e
        raise LoRAError(f"LoRA config must be a LoRAConfig or a dict, got {type(value).__name__}")

    @property
    def scale(self) -> float:
        """The factor of the low-rank update: alpha / rank."""
        return (self.alpha if self.alpha is not None else self.rank) / self.rank

    def to_peft(self) -> Any:
        """The ``peft.LoraConfig`` (B zero-initialised, so the adapted model starts equal to the base)."""
        from peft import LoraConfig

        return LoraConfig(
            r=self.rank,
            lora_alpha=self.alpha if self.alpha is not None else self.rank,
            target_modules=self.target_modules if isinstance(self.target_modules, str) else list(self.target_modules),
            lora_dropout=self.dropout,
            init_lora_weights=True,
        )


def tuner_layers(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """The peft tuner layers (LoRA-wrapped modules) of ``model`` by qualified name, outermost only."""
    if "peft" not in sys.modules:  # no peft layer can exist; keeps exports of plain models from importing peft
        return []
    from peft.tuners.tuners_utils import BaseTunerLayer

    found: list[tuple[str, torch.nn.Module]] = []
    for name, module in model.named_modules():
        if isinstance(module, BaseTunerLayer) and not any(name.startswith(f"{outer}.") for outer, _ in found):
            found.append((name, module))
    return found


def has_lora(model: torch.nn.Module) -> bool:
    """Whether ``model`` holds any peft tuner layer."""
    return bool(tuner_layers(model))


def lora_named_parameters(model: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
    """The LoRA parameters of ``model`` (everything in a tuner layer except its wrapped ``base_layer``)."""
    out = []
    for name, layer in tuner_layers(model):
        for sub, p in layer.named_parameters():
            if not sub.startswith("base_layer."):
                out.append((f"{name}.{sub}" if name else sub, p))
    return out


def inject_lora(model: torch.nn.Module, config: LoRAConfig) -> None:
    """Wrap ``config.target_modules`` of ``model`` in LoRA layers; freezes every non-LoRA weight of ``model``.

    Diffusers models go through ``add_adapter`` (their PEFT integration); other modules through
    ``peft.inject_adapter_in_model``. Raises ``LoRAError`` when a target matches no module.
    """
    peft_config = config.to_peft()
    try:
        if hasattr(model, "add_adapter"):
            model.add_adapter(peft_config, adapter_name=ADAPTER_NAME)
        else:
            from peft import inject_adapter_in_model

            inject_adapter_in_model(peft_config, model, ADAPTER_NAME)
            if not hasattr(model, "peft_config"):
                model.peft_config = {ADAPTER_NAME: peft_config}
    except ValueError as e:  # peft: "Target modules {...} not found in the base model"
        raise LoRAError(f"LoRA target_modules {config.target_modules} on {type(model).__name__}: {e}") from e
    if not has_lora(model):
        raise LoRAError(f"LoRA target_modules {config.target_modules} matched no module of {type(model).__name__}")


def lora_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The LoRA weights in peft's portable form (no adapter name in the keys), detached on the CPU."""
    from peft.utils import get_peft_model_state_dict

    state = get_peft_model_state_dict(model, adapter_name=ADAPTER_NAME)
    return {k: v.detach().cpu().contiguous() for k, v in state.items()}


def load_lora_state_dict(model: torch.nn.Module, state: dict[str, torch.Tensor], source: str = "state") -> None:
    """Load what ``lora_state_dict`` returned into ``model`` (same LoRA config); raises on any key mismatch."""
    from peft.utils import set_peft_model_state_dict

    own = set(lora_state_dict(model))
    missing, unexpected = sorted(own - set(state)), sorted(set(state) - own)
    if missing or unexpected:
        raise LoRAError(
            f"{source}: LoRA weights do not match the model: {len(missing)} missing (e.g. {missing[:3]}), "
            f"{len(unexpected)} unexpected (e.g. {unexpected[:3]})"
        )
    result = set_peft_model_state_dict(model, state, adapter_name=ADAPTER_NAME)
    if getattr(result, "unexpected_keys", None):
        raise LoRAError(f"{source}: peft did not place LoRA weights {sorted(result.unexpected_keys)[:3]}")


def save_lora(model: torch.nn.Module, directory: Path, config: LoRAConfig) -> Path:
    """Write ``directory/pytorch_lora_weights.safetensors`` (diffusers' model-level LoRA layout)."""
    import json

    directory.mkdir(parents=True, exist_ok=True)
    path = directory / LORA_WEIGHTS
    metadata = {"format": "pt", "lora_adapter_metadata": json.dumps(_peft_dict(config), sort_keys=True)}
    save_file(lora_state_dict(model), str(path), metadata=metadata)
    return path


def load_lora(model: torch.nn.Module, directory: Path) -> None:
    """Load ``save_lora`` output into ``model`` (already injected with the same config)."""
    path = directory / LORA_WEIGHTS
    if not path.is_file():
        raise LoRAError(f"{path} missing: the export's adapter.json names a LoRA")
    load_lora_state_dict(model, load_file(str(path)), source=str(path))


def _peft_dict(config: LoRAConfig) -> dict[str, Any]:
    out = config.to_peft().to_dict()
    return {k: (sorted(v) if isinstance(v, set) else v) for k, v in out.items() if _jsonable(v)}


def _jsonable(value: Any) -> bool:
    return value is None or isinstance(value, (str, int, float, bool, list, dict, set))


def _set_child(model: torch.nn.Module, name: str, module: torch.nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent_name) if parent_name else model, child, module)


def merged_layer(layer: torch.nn.Module) -> torch.nn.Module:
    """A copy of the base layer of tuner ``layer`` with the LoRA update merged in (``layer`` is untouched)."""
    copied = copy.deepcopy(layer)
    copied.merge(safe_merge=True)
    return copied.get_base_layer()


@contextlib.contextmanager
def plain_modules(model: torch.nn.Module, merge: bool = False) -> Iterator[torch.nn.Module]:
    """Temporarily put plain layers in place of every tuner layer of ``model`` and yield ``model``.

    ``merge=False``: the frozen base layers (the model computes the base network; its ``state_dict`` has the
    base model's own keys). ``merge=True``: merged copies (the model computes base + LoRA as plain layers; the
    copies cost the memory of the targeted weights). The tuner layers are put back on exit.
    """
    layers = tuner_layers(model)
    try:
        for name, layer in layers:
            _set_child(model, name, merged_layer(layer) if merge else layer.get_base_layer())
        yield model
    finally:
        for name, layer in layers:
            _set_child(model, name, layer)


def merge_and_unload(model: torch.nn.Module) -> None:
    """Merge every LoRA into its base weight in place and drop the tuner layers (a plain model remains)."""
    for name, layer in tuner_layers(model):
        layer.merge(safe_merge=True)
        _set_child(model, name, layer.get_base_layer())
    if hasattr(model, "peft_config"):
        del model.peft_config
    if getattr(model, "_hf_peft_config_loaded", None):
        model._hf_peft_config_loaded = None


def base_key(key: str) -> str:
    """The plain-model key of a LoRA model's state-dict key (``x.to_q.base_layer.weight`` -> ``x.to_q.weight``)."""
    return key.replace(".base_layer.", ".")


def is_lora_key(key: str) -> bool:
    """Whether a LoRA model's state-dict key belongs to a LoRA weight (not the wrapped base layer)."""
    return any(part.startswith("lora_") for part in key.split("."))
