"""Loading a route's diffusers transformer and VAE from a local checkpoint folder and checking against the config."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Mapping

import torch

from solarwm.backbones.base import AdapterError


def _plain(value: Any) -> Any:
    """JSON round trips turn tuples into lists; compare them as tuples."""
    return tuple(value) if isinstance(value, (list, tuple)) else value


def check_config_keys(
    route: str, folder: Path, found: Mapping[str, Any], expected: Mapping[str, Any], keys: Iterable[str]
) -> None:
    """Refuse a checkpoint whose config ``found`` differs from ``expected`` on any of ``keys`` it holds.

    The ``AdapterError`` names the folder and every differing key with both values.
    """
    wrong = [
        f"{k}: checkpoint {found[k]!r} != config {expected[k]!r}"
        for k in keys
        if k in found and _plain(found[k]) != _plain(expected[k])
    ]
    if wrong:
        raise AdapterError(f"{route}: checkpoint {folder} does not match the config: " + "; ".join(wrong))


def load_transformer(
    route: str,
    model_class: type,
    root: Path | None,
    expected: dict[str, Any],
    checked: Iterable[str] | None = None,
    layout: str = "transformer/",
) -> torch.nn.Module:
    """``model_class(**expected)`` without ``root``; else ``root/transformer`` loaded with safetensors.

    The loaded config must equal ``expected`` on the ``checked`` keys (default: all of them); a mismatch
    or a missing folder raises ``AdapterError`` naming the folder, each differing key and ``layout`` (what a
    checkpoint folder of this route holds).
    """
    if root is None:
        return model_class(**expected)
    tdir = root / "transformer"
    if not (tdir / "config.json").is_file():
        raise AdapterError(
            f"{route}: {tdir} missing or has no config.json: pretrained_path must be a diffusers checkpoint folder "
            f"with {layout}"
        )
    model = model_class.from_pretrained(str(tdir), use_safetensors=True)
    # diffusers configs record every constructor argument, so each key of ``expected`` is in model.config.
    check_config_keys(route, tdir, model.config, expected, list(expected) if checked is None else checked)
    return model


def load_vae(
    route: str, vae_class: type, root: Path | None, codec: str, vae_config: str, configs: dict[str, dict[str, Any]]
) -> torch.nn.Module:
    """The route's diffusers VAE: ``root/vae`` loaded with safetensors, else ``vae_class(**configs[vae_config])``."""
    if root is not None:
        vae_dir = root / "vae"
        if not vae_dir.is_dir():
            raise AdapterError(f"{route}: {vae_dir} missing (codec={codec!r} needs pretrained_path/vae/)")
        return vae_class.from_pretrained(str(vae_dir), use_safetensors=True)
    if vae_config not in configs:
        raise AdapterError(f"{route}: unknown vae_config {vae_config!r}; expected one of {sorted(configs)}")
    return vae_class(**configs[vae_config])
