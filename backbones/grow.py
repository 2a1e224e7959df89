"""Grow a Wan route's exported transformer to more layers without changing what it computes.

Each block ``i`` of the export is followed by ``factor - 1`` copies of itself whose three residual
outputs (self-attention ``attn1.to_out.0``, cross-attention ``attn2.to_out.0``, feed-forward
``ffn.net.2``) are zero: a Wan block adds exactly those three terms to its input, so every copy starts
as the identity and the grown model's output equals the original's. Training then uses the new depth
from the function the small model already learned (a function-preserving depth expansion, Net2Net:
Chen et al. 2016), instead of from scratch.

    python -m solarwm.backbones.grow SRC DST --factor 2     # SRC, DST: adapter exports (save_adapter)
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from solarwm.backbones.base import AdapterError, read_adapter_json

#: Parameter prefixes of a diffusers WanTransformerBlock whose outputs are added to the residual stream.
RESIDUAL_OUTPUTS = ("attn1.to_out.0.", "attn2.to_out.0.", "ffn.net.2.")
#: Routes built on diffusers' WanTransformer3DModel (the blocks this file knows).
WAN_ROUTES = ("wan22_ti2v_5b", "wan22_i2v_14b")
WEIGHTS = "transformer/diffusion_pytorch_model.safetensors"


def grow_state_dict(state: dict[str, torch.Tensor], num_layers: int, factor: int) -> dict[str, torch.Tensor]:
    """``state`` of a ``num_layers``-block transformer -> ``num_layers * factor`` blocks (block i -> i*factor + c)."""
    if factor < 1:
        raise ValueError(f"grow: factor must be >= 1, got {factor}")
    grown = {k: v for k, v in state.items() if not k.startswith("blocks.")}
    for key, value in state.items():
        if not key.startswith("blocks."):
            continue
        index, rest = key[len("blocks."):].split(".", 1)
        if int(index) >= num_layers:
            raise AdapterError(f"grow: weight {key} is past the config's {num_layers} layers")
        for c in range(factor):
            silent = c > 0 and rest.startswith(RESIDUAL_OUTPUTS)
            grown[f"blocks.{int(index) * factor + c}.{rest}"] = torch.zeros_like(value) if silent else value.clone()
    return grown


def grow_export(src: str | Path, dst: str | Path, factor: int = 2) -> Path:
    """Write ``dst``: the adapter export ``src`` with each transformer block followed by ``factor - 1`` identity copies."""
    src, dst = Path(src), Path(dst)
    meta = read_adapter_json(src)
    if meta["route"] not in WAN_ROUTES:
        raise AdapterError(f"grow: {src} holds route {meta['route']!r}; only the Wan routes {WAN_ROUTES} can be grown")
    if dst.exists():
        raise AdapterError(f"grow: {dst} exists; give a new folder")
    config_path = src / "transformer" / "config.json"
    config = json.loads(config_path.read_text())
    num_layers = int(config["num_layers"])
    state = grow_state_dict(load_file(str(src / WEIGHTS)), num_layers, factor)
    shutil.copytree(src, dst)
    config["num_layers"] = meta["config"]["num_layers"] = num_layers * factor
    (dst / "transformer" / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (dst / "adapter.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    save_file(state, str(dst / WEIGHTS))
    return dst


def main(argv: list[str] | None = None) -> None:
    """``python -m solarwm.backbones.grow SRC DST [--factor N]``."""
    parser = argparse.ArgumentParser(prog="python -m solarwm.backbones.grow", description=__doc__.split("\n\n")[0])
    parser.add_argument("src", help="adapter export to grow")
    parser.add_argument("dst", help="new folder for the grown export")
    parser.add_argument("--factor", type=int, default=2, help="layers per original layer (default 2)")
    args = parser.parse_args(argv)
    print(grow_export(args.src, args.dst, args.factor))


if __name__ == "__main__":
    main()
