"""Per-route test configuration: the clip each route's contract runs on, the published recipes, a tiny adapter.

``ROUTE_TEST_CLIPS`` is a route's *test config*: the clip the contract suite
(``tests/backbones/test_route_contract.py``) runs it on. A new route adds one entry here (the suite fails for a
registered route without one).
"""

from __future__ import annotations

from pathlib import Path

import torch
import yaml

from solarwm.backbones.export import ROUTES

ROOT = Path(__file__).resolve().parents[2]
RECIPES = ROOT / "recipes"

#: Route -> the contract clip: ``num_frames`` on the route's frame rule giving at least two causal blocks,
#: ``height`` x ``width`` pixels, ``batch`` samples (H3 folds a batch of 2 into one packed sequence).
ROUTE_TEST_CLIPS: dict[str, dict[str, int]] = {
    "wan22_ti2v_5b": {"num_frames": 4 * 5 + 1, "height": 32, "width": 32, "batch": 1},  # 6 latents = 2 blocks
    "wan22_i2v_14b": {"num_frames": 4 * 5 + 1, "height": 32, "width": 32, "batch": 1},  # 6 latents = 2 blocks
    "ltx25": {"num_frames": 8 * 5 + 1, "height": 32, "width": 32, "batch": 1},  # 6 latents = 3 blocks
    "minimax_h3": {"num_frames": 17 + 5, "height": 16, "width": 16, "batch": 2},  # 7 latents = blocks of 5 and 2
}


#: Route -> the LoRA the contract's ``check_lora`` clause puts on it: the attention projections (H3: its own targets).
ROUTE_TEST_LORA: dict[str, dict] = {
    route: {"rank": 4, "alpha": 4, "target_modules": ["to_q", "to_k", "to_v", "to_out.0"], "dropout": 0.0}
    for route in ROUTE_TEST_CLIPS
}
ROUTE_TEST_LORA["minimax_h3"] = {
    "rank": 4,
    "alpha": 8,
    "target_modules": ["attn.to_q", "attn.to_k", "attn.to_v", "attn.to_out.0", "ff.net.0.proj", "ff.net.2"],
    "dropout": 0.0,
}


def published_recipes() -> dict[str, str]:
    """Published recipe prefix (``recipes/<prefix>_{bid,tf,dmd}.yaml``) -> route, read from the route file each
    stage-1 entry composes (``compose: [..., routes/<route>.yaml]``), so the list follows the recipes. The
    embedded default (``tiny_*``, which composes ``tiny.yaml``) is not a published recipe."""
    found = {}
    for path in sorted(RECIPES.glob("*_bid.yaml")):
        parts = yaml.safe_load(path.read_text()).get("compose") or []
        if "tiny.yaml" in parts:
            continue
        routes = [Path(p).stem for p in parts if Path(p).parent.name == "routes" and Path(p).stem in ROUTES]
        if routes:
            found[path.name[: -len("_bid.yaml")]] = routes[0]
    return found


def tiny_adapter(route: str, perturbed: bool = True) -> torch.nn.Module:
    """The route's tiny preset, seeded, with its weights moved off their init (``route_contract.perturb``)."""
    from solarwm.backbones.base import route_class

    import route_contract as contract

    torch.manual_seed(0)
    adapter = route_class(route)(preset="tiny")
    if perturbed:
        contract.perturb(adapter)
    return adapter
