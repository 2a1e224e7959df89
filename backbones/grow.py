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
import dataclasses
from pathlib import Path

import torch

from solarwm.backbones.base import AdapterError, load_adapter, read_adapter_json

#: Parameter prefixes of a diffusers WanTransformerBlock whose outputs are added to the residual stream.
RESIDUAL_OUTPUTS = ("attn1.to_out.0.", "attn2.to_out.0.", "ffn.net.2.")
#: Routes built on diffusers' WanTransformer3DModel (the blocks this file knows).
WAN_ROUTES = ("wan22_ti2v_5b", "wan22_i2v_14b")


def grow_state_dict(
    state: dict[str, torch.Tensor], num_layers: int, factor: int, prefix: str = ""
) -> dict[str, torch.Tensor]:
    """``state`` with ``num_layers`` blocks under ``{prefix}blocks.`` -> ``num_layers * factor`` (i -> i*factor + c)."""
    if factor < 1:
        raise ValueError(f"grow: factor must be >= 1, got {factor}")
    blocks = f"{prefix}blocks."
    grown = {k: v for k, v in state.items() if not k.startswith(blocks)}
    for key, value in state.items():
        if not key.startswith(blocks):
            continue
        index, rest = key[len(blocks) :].split(".", 1)
        if int(index) >= num_layers:
            raise AdapterError(f"grow: weight {key} is past the config's {num_layers} layers")
        for c in range(factor):
            silent = c > 0 and rest.startswith(RESIDUAL_OUTPUTS)
            grown[f"{blocks}{int(index) * factor + c}.{rest}"] = torch.zeros_like(value) if silent else value.clone()
    return grown


def grow_export(src: str | Path, dst: str | Path, factor: int = 2) -> Path:
    """Write ``dst``: the adapter export ``src`` with each transformer block followed by ``factor - 1`` identity copies.

    Read with ``load_adapter`` and written with ``save_adapter``, so codec, camera and flow-map weights travel as
    in any export. A LoRA export is refused: merge it first (``save_adapter(dir, merge_lora=True)``).
    """
    src, dst = Path(src), Path(dst)
    meta = read_adapter_json(src)
    if meta["route"] not in WAN_ROUTES:
        raise AdapterError(f"grow: {src} holds route {meta['route']!r}; only the Wan routes {WAN_ROUTES} can be grown")
    if meta.get("lora") is not None:
        raise AdapterError(f"grow: {src} is a LoRA export; merge it first (save_adapter(dir, merge_lora=True))")
    if dst.exists():
        raise AdapterError(f"grow: {dst} exists; give a new folder")
    small = load_adapter(src)
    layers = small.config.num_layers
    big = type(small)(config=dataclasses.replace(small.config, num_layers=layers * factor))
    if small.delta_embedding is not None:
        big.enable_flow_map(small.flow_map_gate)
    big.load_state_dict(grow_state_dict(small.state_dict(), layers, factor, prefix="transformer."))
    return big.save_adapter(dst, stage=meta.get("stage"))


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
