"""Lane ``tests/convert``: importing the official SolarWM checkpoints and base (``solarwm convert``).

Fixtures built from the official Wan code; the helpers they use live in ``tests/support/official_packages.py``.
"""

from __future__ import annotations

import json
import types
from typing import Any

import pytest
import torch

from official_packages import (
    TINY_ARCH,
    delta_like,
    official_model,
    sdpa_flash_attention,
    stage_checkpoint,
    tiny_tokenizer,
    wan_module,
    write_package,
)


@pytest.fixture
def wan_model_module(monkeypatch) -> types.ModuleType:
    """``wan.modules.model`` with its flash attention on SDPA."""
    module = wan_module("model")
    monkeypatch.setattr(module, "flash_attention", sdpa_flash_attention)
    return module


@pytest.fixture
def tiny_packages(tmp_path, wan_model_module) -> dict[str, Any]:
    """Stage-0.5, stage-1 (with delta) and stage-2 (``model.`` prefix, release manifest) tiny packages.

    Live and EMA weights differ (two seeds), so a test can tell which role was converted.
    """
    ema_model = official_model(wan_model_module, seed=0)
    live_model = official_model(wan_model_module, seed=5)
    ema, live = ema_model.state_dict(), live_model.state_dict()
    delta = delta_like(ema_model)
    root = tmp_path / "packages"
    return {
        "ema_model": ema_model,
        "live_model": live_model,
        "delta": delta,
        "module": wan_model_module,
        "stage0p5": write_package(root / "bid", stage_checkpoint(live, ema), "stage0p5"),
        "stage1": write_package(root / "tf", stage_checkpoint(dict(live, **delta), dict(ema, **delta)), "stage1"),
        "stage2": write_package(
            root / "sgf",
            dict(stage_checkpoint(live, ema, "model."), checkpoint_format="solarwm.wan22-stage2-sgf.v1"),
            "stage2",
            release_role="ema",
        ),
        "architecture": json.dumps(TINY_ARCH),
    }


@pytest.fixture
def tiny_official_base(tmp_path, wan_model_module) -> dict[str, Any]:
    """A base folder in the release's original layout: Wan's own VAE (48 channels, tiny), T5 encoder, tokenizer
    and transformer (``transformer/*.safetensors``, original key names)."""
    from safetensors.torch import save_file

    from solarwm.backbones.wan22_ti2v_5b import TINY48_WAN_VAE_CONFIG

    root = tmp_path / "SolarWM-5B-base"
    cfg = TINY48_WAN_VAE_CONFIG
    torch.manual_seed(7)
    vae = (
        wan_module("vae2_2")
        .WanVAE_(
            dim=cfg["base_dim"],
            dec_dim=cfg["decoder_base_dim"],
            z_dim=48,
            dim_mult=cfg["dim_mult"],
            num_res_blocks=cfg["num_res_blocks"],
            temperal_downsample=cfg["temperal_downsample"],
        )
        .eval()
    )
    t5 = (
        wan_module("t5")
        .T5Encoder(
            vocab=40,
            dim=TINY_ARCH["text_dim"],
            dim_attn=TINY_ARCH["text_dim"],
            dim_ffn=32,
            num_heads=4,
            num_layers=2,
            num_buckets=32,
            shared_pos=False,
            dropout=0.0,
        )
        .eval()
    )
    with torch.no_grad():
        for p in list(vae.parameters()) + list(t5.parameters()):
            p.add_(0.05 * torch.randn_like(p))
    model = official_model(wan_model_module, seed=3)
    for sub in ("vae", "text_encoder", "transformer"):
        (root / sub).mkdir(parents=True)
    torch.save(vae.state_dict(), root / "vae" / "Wan2.2_VAE.pth")
    torch.save(
        {k: v.to(torch.bfloat16) for k, v in t5.state_dict().items()},
        root / "text_encoder" / "models_t5_umt5-xxl-enc-bf16.pth",
    )
    tiny_tokenizer(root / "tokenizer", ["a", "room", "with", "red", "walls", "street"])
    save_file(
        {k: v.contiguous() for k, v in model.state_dict().items()},
        str(root / "transformer" / "diffusion_pytorch_model.safetensors"),
    )
    return {"root": root, "vae": vae, "t5": t5, "model": model, "architecture": json.dumps(TINY_ARCH)}
