"""Reading stage weights: Lightning checkpoints (with their EMA average) and adapter exports.

Every stage initialises from the previous one by path (``init_from:`` in its YAML), and
``solarwm predict`` loads a checkpoint or export the same way; this is the one reader they share.
Checkpoints are read with ``torch.load(..., weights_only=True)``: tensors and plain containers only.

LoRA (``solarwm.backbones.lora``): a LoRA adapter's weights load into an adapter with the same LoRA by key;
plain weights (a full fine-tune or a merged export) load into a LoRA adapter as its frozen base (``x.weight``
-> ``x.base_layer.weight``; the LoRA keeps its zero-update init); a LoRA *export* loads into a plain adapter
merged. A LoRA *checkpoint* into a plain adapter is refused (export it, or merge it, first).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from solarwm.backbones.lora import base_key, is_lora_key


class StageCheckpointError(ValueError):
    """A checkpoint or export is missing, unreadable, or of another stage or route; the message names it."""


def read_checkpoint(path: str | Path, mmap: bool = False) -> dict[str, Any]:
    """A Lightning checkpoint as a dict (``state_dict``, ``callbacks``, ``solarwm`` stage tag).

    ``mmap`` maps the tensors instead of reading them: a cheap check of a large checkpoint before a run.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: checkpoint not found")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as e:  # a truncated or foreign file: name it, whatever torch raised
        if mmap:  # only zip-format files can be mapped; an old-format one is read in full instead
            return read_checkpoint(path)
        reason = str(e).split(". ")[0]  # torch's first sentence; its advice (weights_only=False) is not ours
        raise StageCheckpointError(f"{path}: not a readable checkpoint ({type(e).__name__}: {reason})") from e
    if not isinstance(state, dict) or "state_dict" not in state:
        raise StageCheckpointError(f"{path}: not a Lightning checkpoint (no state_dict)")
    return state


def ema_shadow(checkpoint: dict[str, Any]) -> dict[str, torch.Tensor] | None:
    """The EMA callback's averaged parameters (by module parameter name), if the checkpoint has them."""
    for key, value in checkpoint.get("callbacks", {}).items():
        if key.startswith("EMA") and isinstance(value, dict) and value.get("shadow") and value.get("started", True):
            return value["shadow"]
    return None


def module_state(checkpoint: dict[str, Any], use_ema: bool = True) -> tuple[dict[str, torch.Tensor], bool]:
    """The module's ``state_dict`` with the EMA average swapped in when asked and present; ``(state, ema_used)``."""
    state = dict(checkpoint["state_dict"])
    shadow = ema_shadow(checkpoint) if use_ema else None
    if shadow:
        for name, value in shadow.items():
            if name in state:
                state[name] = value.to(state[name].dtype)
    return state, bool(shadow)


def checkpoint_stage(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """The ``{"stage", "route"}`` tag a SolarWM stage writes into its checkpoints (empty for foreign ones)."""
    return dict(checkpoint.get("solarwm") or {})


def adapter_state(
    path: str | Path, prefix: str = "adapter.", use_ema: bool = True, merge_lora: bool = False
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Adapter weights from a Lightning checkpoint (keys under ``prefix``) or an adapter export folder.

    Returns ``(state_dict, info)`` with ``info = {"stage", "route", "ema", "config"}`` as far as known.
    ``merge_lora``: an export with a LoRA is returned merged (plain keys).
    """
    path = Path(path)
    if path.is_dir():
        from solarwm.backbones.base import load_adapter, read_adapter_json

        meta = read_adapter_json(path)
        adapter = load_adapter(path)
        if merge_lora:
            adapter.merge_lora()
        return adapter.state_dict(), {"stage": meta.get("stage"), "route": meta["route"], "ema": None,
                                      "config": meta.get("config")}
    checkpoint = read_checkpoint(path)
    state, ema = module_state(checkpoint, use_ema)
    picked = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
    if not picked:
        raise StageCheckpointError(f"{path}: no weights under {prefix!r} (a checkpoint of another stage?)")
    return picked, dict(checkpoint_stage(checkpoint), ema=ema)


def load_adapter_weights(
    adapter: torch.nn.Module,
    path: str | Path,
    expect_stage: tuple[str, ...] | None = None,
    prefix: str = "adapter.",
    use_ema: bool = True,
    ignore: tuple[str, ...] = (),
) -> dict[str, Any]:
    """Load ``path``'s adapter weights into ``adapter`` (strict, except keys starting with ``ignore``).

    ``expect_stage``: the stages this may come from; a checkpoint tagged with another stage or another
    route is refused with a message naming both.
    """
    own_keys = set(adapter.state_dict())
    own_lora = any(is_lora_key(k) for k in own_keys)
    state, info = adapter_state(path, prefix, use_ema, merge_lora=not own_lora)
    route = getattr(adapter, "route", None)
    if info.get("route") and route and info["route"] != route:
        raise StageCheckpointError(f"{path} holds route {info['route']!r}, the recipe builds {route!r}")
    if expect_stage and info.get("stage") and info["stage"] not in expect_stage:
        raise StageCheckpointError(f"{path} is a {info['stage']!r} checkpoint, expected one of {list(expect_stage)}")
    if info.get("config") and hasattr(adapter, "check_weight_config"):
        adapter.check_weight_config(info["config"], str(path))
    state = {k: v for k, v in state.items() if not k.startswith(ignore)} if ignore else state
    own = {k for k in own_keys if not k.startswith(ignore)} if ignore else own_keys
    state_lora = any(is_lora_key(k) for k in state)
    if state_lora and not own_lora:
        raise StageCheckpointError(
            f"{path} holds LoRA weights, the recipe builds {type(adapter).__name__} without LoRA: add the same "
            "`lora:` to the recipe's adapter, or load a merged export (save_adapter(..., merge_lora=True))"
        )
    if own_lora and not state_lora:
        # Plain weights as the frozen base of this LoRA adapter; the LoRA keeps its init (B = 0).
        plain = {base_key(k): k for k in own if ".base_layer." in k}
        state = {plain.get(k, k) if k not in own else k: v for k, v in state.items()}
        own = {k for k in own if not is_lora_key(k)}
    missing, unexpected = sorted(own - set(state)), sorted(set(state) - own)
    if missing or unexpected:
        raise StageCheckpointError(
            f"{path} does not match {type(adapter).__name__}: {len(missing)} missing keys (e.g. {missing[:3]}), "
            f"{len(unexpected)} unexpected keys (e.g. {unexpected[:3]})"
        )
    adapter.load_state_dict(state, strict=False)
    return info
