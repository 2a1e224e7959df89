"""The adapter export folder and the route registry: how a trained adapter is written, found and rebuilt.

Layout written by ``write_export`` (``BackboneAdapter.save_adapter``)::

    dir/adapter.json         {"schema": "solarwm.adapter/1", "route": ..., "config": {...}, "lora": {...}|absent}
    dir/transformer/         diffusers save_pretrained (safetensors) of the base (or the LoRA-merged) model
    dir/lora/pytorch_lora_weights.safetensors  the LoRA (peft keys; only with LoRA, not merged)
    dir/camera.safetensors   camera weights (``camera_state_dict()``; may be empty)
    dir/flow_map.safetensors the AnyFlow r-embedding (only when ``enable_flow_map`` was called)
    dir/<extra>/             route-specific frozen parts needed to rebuild (e.g. ``vae/``)

Every tensor is read with safetensors; nothing in an export is unpickled.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import json
import shutil
import types
import typing
import uuid
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from solarwm.backbones import lora as _lora
from solarwm.backbones.lora import LoRAError

ADAPTER_SCHEMA = "solarwm.adapter/1"

#: Route name -> "module:Class". Resolved lazily so that listing routes imports no heavy module.
ROUTES: dict[str, str] = {
    "wan22_ti2v_5b": "solarwm.backbones.wan22_ti2v_5b:Wan22TI2V5BAdapter",
    "minimax_h3": "solarwm.backbones.minimax_h3:MiniMaxH3Adapter",
    "wan22_i2v_14b": "solarwm.backbones.wan22_i2v_14b:Wan22I2V14BAdapter",
    "ltx25": "solarwm.backbones.ltx25:LTX25Adapter",
}


class AdapterError(RuntimeError):
    """A backbone adapter could not be built, loaded or called; the message names the path/check."""


def register_route(name: str, target: str) -> None:
    """Register a route name -> ``"module:Class"`` (for routes living outside this package)."""
    ROUTES[name] = target


def route_class(name: str) -> type:
    """Resolve a route name to its ``BackboneAdapter`` subclass (imports the route module on first use)."""
    if name not in ROUTES:
        raise AdapterError(f"unknown backbone route {name!r}; known routes: {sorted(ROUTES)}")
    module_name, _, class_name = ROUTES[name].partition(":")
    cls = getattr(importlib.import_module(module_name), class_name)
    # By name, not issubclass: this module sits below the contract (solarwm.backbones.base imports it).
    if not (isinstance(cls, type) and any(f"{c.__module__}.{c.__qualname__}" == "solarwm.backbones.base.BackboneAdapter"
                                          for c in cls.__mro__)):
        raise AdapterError(f"route {name!r} resolves to {ROUTES[name]}, which is not a BackboneAdapter")
    return cls


def transformer_block_class(adapter: Any) -> type:
    """The block a route's transformer repeats (the FSDP wrap unit, what sequence parallelism splits tokens for) of an
    adapter class or instance: its class's ``transformer_block``, ``"module:Class"``."""
    cls = adapter if isinstance(adapter, type) else type(adapter)
    target = getattr(cls, "transformer_block", "")
    if not target:
        raise AdapterError(f"{cls.__name__} names no transformer_block (the FSDP wrap unit)")
    module_name, _, class_name = target.partition(":")
    block = getattr(importlib.import_module(module_name), class_name, None)
    if not (isinstance(block, type) and issubclass(block, torch.nn.Module)):
        raise AdapterError(f"{cls.__name__}: transformer_block {target} is not an nn.Module class")
    return block


def read_adapter_json(directory: str | Path) -> dict[str, Any]:
    """Read and check ``dir/adapter.json``; raises ``AdapterError`` naming the path on any problem."""
    directory = Path(directory)
    if not directory.is_dir():
        raise AdapterError(f"adapter export folder not found: {directory}")
    meta_path = directory / "adapter.json"
    if not meta_path.is_file():
        raise AdapterError(f"{meta_path} missing: {directory} is not a SolarWM adapter export")
    try:
        meta = json.loads(meta_path.read_text())
    except json.JSONDecodeError as e:
        raise AdapterError(f"{meta_path} is not valid JSON: {e}") from e
    if (
        not isinstance(meta, dict)
        or meta.get("schema") != ADAPTER_SCHEMA
        or "route" not in meta
        or "config" not in meta
    ):
        raise AdapterError(f"{meta_path}: expected an object of schema {ADAPTER_SCHEMA!r} with 'route' and 'config'")
    for key, kinds, optional in (
        ("route", str, False),
        ("config", dict, False),
        ("stage", str, True),
        ("lora", dict, True),
        ("flow_map_gate", (int, float), True),
        ("sink_frames", int, True),
    ):
        value = meta.get(key)
        if (value is None and optional) or (isinstance(value, kinds) and not isinstance(value, bool)):
            continue
        raise AdapterError(f"{meta_path}: '{key}' has the wrong type ({type(value).__name__})")
    return meta


def _type_problem(hint: Any, value: Any) -> bool:
    """Whether JSON ``value`` plainly does not fit the config field type ``hint`` (unknown kinds pass)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Literal:
        return value not in args
    if origin in (typing.Union, types.UnionType):
        return all(_type_problem(a, value) for a in args)
    if hint is type(None):
        return value is not None
    if hint is bool:
        return not isinstance(value, bool)
    if hint is int:
        return isinstance(value, bool) or not isinstance(value, int)
    if hint is float:
        return isinstance(value, bool) or not isinstance(value, (int, float))
    if hint is str:
        return not isinstance(value, str)
    if hint in (tuple, list) or origin in (tuple, list):
        return not isinstance(value, (list, tuple))
    if hint is dict or origin is dict:
        return not isinstance(value, dict)
    return False


def _check_config_types(config_class: type, config: dict[str, Any], source: Path) -> None:
    """Refuse an ``adapter.json`` config whose fields have the wrong JSON types, naming the first such field."""
    hints = typing.get_type_hints(config_class)
    for name, value in config.items():
        if name in hints and _type_problem(hints[name], value):
            raise AdapterError(f"{source}: config field {name!r} = {value!r} does not fit its type {hints[name]}")


def _load_tensors(path: Path) -> dict[str, Any]:
    """A safetensors file's tensors; a truncated or foreign file is an `AdapterError` naming it."""
    try:
        return load_file(str(path))
    except Exception as e:  # safetensors raises its own SafetensorError (and OSError) on a damaged file
        raise AdapterError(f"{path}: not a readable safetensors file ({type(e).__name__}: {e})") from e


def load_adapter(directory: str | Path, **kwargs: Any) -> Any:
    """Rebuild the adapter exported in ``directory`` whatever its route (see ``write_export``)."""
    meta = read_adapter_json(directory)
    return route_class(meta["route"]).load_adapter(directory, **kwargs)


def write_export(adapter: Any, directory: str | Path, stage: str | None, merge_lora: bool) -> Path:
    """Write ``adapter``'s export into ``directory`` atomically (a temporary folder renamed into place)."""
    directory = Path(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = directory.with_name(f".{directory.name}.tmp-{uuid.uuid4().hex[:8]}")
    try:
        tmp.mkdir()
        lora_on = adapter.lora_config is not None
        with _lora.plain_modules(adapter.transformer, merge=merge_lora):
            adapter.transformer.save_pretrained(tmp / "transformer", safe_serialization=True)
        if lora_on and not merge_lora:
            _lora.save_lora(adapter.transformer, tmp / "lora", adapter.lora_config)
        camera = {k: v.detach().cpu().contiguous() for k, v in adapter.camera_state_dict().items()}
        save_file(camera, str(tmp / "camera.safetensors"))
        adapter._export_extra(tmp)
        meta = {"schema": ADAPTER_SCHEMA, "route": adapter.route, "config": adapter.config_dict(), "stage": stage}
        if lora_on and not merge_lora:
            meta["lora"] = dataclasses.asdict(adapter.lora_config)
        if adapter.delta_embedding is not None:
            # A flow map copied from a LoRA-adapted time embedding is merged along with the transformer.
            with _lora.plain_modules(adapter.delta_embedding, merge=True) if merge_lora else contextlib.nullcontext():
                delta = {k: v.detach().cpu().contiguous() for k, v in adapter.delta_embedding.state_dict().items()}
            save_file(delta, str(tmp / "flow_map.safetensors"))
            meta["flow_map_gate"] = adapter.flow_map_gate
        if adapter.sink_frames:
            meta["sink_frames"] = adapter.sink_frames
        (tmp / "adapter.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
        old = None
        if directory.exists():
            old = directory.with_name(f".{directory.name}.old-{uuid.uuid4().hex[:8]}")
            directory.rename(old)
        tmp.rename(directory)
        if old is not None:
            shutil.rmtree(old)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return directory


def read_export(cls: type, directory: str | Path, **kwargs: Any) -> Any:
    """Rebuild an adapter of route class ``cls`` from ``write_export`` output; errors name the folder and the check."""
    directory = Path(directory)
    meta = read_adapter_json(directory)
    if meta["route"] != cls.route:
        raise AdapterError(
            f"{directory} holds an adapter of route {meta['route']!r}, not {cls.route!r} ({cls.__name__})"
        )
    _check_config_types(cls.config_class, meta["config"], directory / "adapter.json")
    try:
        config = cls.config_class(**meta["config"])
    except (TypeError, ValueError) as e:
        raise AdapterError(
            f"{directory / 'adapter.json'}: config does not match {cls.config_class.__name__}: {e}"
        ) from e
    camera_path = directory / "camera.safetensors"
    if not camera_path.is_file():
        raise AdapterError(f"{camera_path} missing in adapter export {directory}")
    kwargs.pop("lora", None)  # the export decides: adapter.json["lora"]
    adapter = cls.from_export(directory, config, **kwargs)
    try:
        adapter.load_camera_state_dict(_load_tensors(camera_path))
    except RuntimeError as e:  # shapes or keys of another configuration
        raise AdapterError(f"{camera_path} does not fit the adapter of {directory / 'adapter.json'}: {e}") from e
    if meta.get("lora") is not None:
        adapter.enable_lora(meta["lora"])
        try:
            _lora.load_lora(adapter.transformer, directory / "lora")
        except LoRAError as e:
            raise AdapterError(f"{directory}: {e}") from e
    if meta.get("flow_map_gate") is not None:
        delta_path = directory / "flow_map.safetensors"
        if not delta_path.is_file():
            raise AdapterError(f"{delta_path} missing: adapter.json names a flow map (flow_map_gate)")
        adapter.enable_flow_map(meta["flow_map_gate"])
        adapter.delta_embedding.load_state_dict(_load_tensors(delta_path))
    adapter.set_sink(meta.get("sink_frames") or 0)
    return adapter
