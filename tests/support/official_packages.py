"""Tiny official packages built from the official Wan code (the ``wan22`` package, installed with ``--no-deps``).

Helpers; the fixtures are in tests/convert/conftest.py.

``wan/__init__.py`` imports the whole pipeline stack (easydict, dashscope, opencv, flash-attn); only
``wan.modules.{model,vae2_2,t5}`` are needed, so ``wan`` and ``wan.modules`` are registered as bare packages
over the installed folders and those modules are imported alone. Flash attention (CUDA only) is replaced by
PyTorch's SDPA, which computes the same softmax attention.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import sys
import types
from pathlib import Path
from typing import Any

import torch

#: A tiny Wan architecture that keeps the published interface (in/out 48, patch (1, 2, 2), qk/cross norms).
TINY_ARCH: dict[str, Any] = {
    "dim": 64,
    "ffn_dim": 96,
    "freq_dim": 32,
    "text_dim": 24,
    "in_dim": 48,
    "out_dim": 48,
    "num_heads": 2,
    "num_layers": 2,
    "patch_size": [1, 2, 2],
    "text_len": 8,
}


def wan_module(name: str) -> types.ModuleType:
    """Import ``wan.modules.<name>`` of the installed official package without running ``wan/__init__.py``."""
    full = f"wan.modules.{name}"
    if full in sys.modules:
        return sys.modules[full]
    if "wan" in sys.modules:
        root = Path(list(sys.modules["wan"].__path__)[0])
    else:
        spec = importlib.util.find_spec("wan")
        if spec is None or not spec.submodule_search_locations:
            raise ImportError("the official Wan code is not installed: pip install --no-deps wan22 (see README)")
        root = Path(list(spec.submodule_search_locations)[0])
    for pkg, folder in (("wan", root), ("wan.modules", root / "modules")):
        if pkg not in sys.modules:
            module = types.ModuleType(pkg)
            module.__path__ = [str(folder)]
            sys.modules[pkg] = module
    if name != "t5":
        return importlib.import_module(full)
    # t5.py evaluates ``torch.cuda.current_device()`` as a default argument of T5EncoderModel (a pipeline class
    # the tests do not use) when it is imported; on a CPU build that raises, so it is answered with 0 meanwhile.
    current = torch.cuda.current_device
    torch.cuda.current_device = lambda: 0
    try:
        return importlib.import_module(full)
    finally:
        torch.cuda.current_device = current


def sdpa_flash_attention(
    q,
    k,
    v,
    q_lens=None,
    k_lens=None,
    dropout_p=0.0,
    softmax_scale=None,
    q_scale=None,
    causal=False,
    window_size=(-1, -1),
    deterministic=False,
    dtype=None,
    version=None,
):
    """``wan.modules.attention.flash_attention``'s contract (``[B, L, N, C]`` in and out) on SDPA, unpadded inputs."""
    assert window_size == (-1, -1) and not causal and q_scale is None
    assert k_lens is None or bool((k_lens == k.shape[1]).all()), "the tests feed unpadded sequences"
    out = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), scale=softmax_scale
    )
    return out.transpose(1, 2).contiguous()


def official_model(module: types.ModuleType, seed: int = 0, arch: dict[str, Any] | None = None) -> torch.nn.Module:
    """A tiny ``WanModel`` (ti2v) with every weight moved off its init (the head starts at zero in Wan)."""
    a = dict(TINY_ARCH, **(arch or {}))
    torch.manual_seed(seed)
    model = module.WanModel(
        model_type="ti2v",
        patch_size=tuple(a["patch_size"]),
        text_len=a["text_len"],
        in_dim=a["in_dim"],
        dim=a["dim"],
        ffn_dim=a["ffn_dim"],
        freq_dim=a["freq_dim"],
        text_dim=a["text_dim"],
        out_dim=a["out_dim"],
        num_heads=a["num_heads"],
        num_layers=a["num_layers"],
        qk_norm=True,
        cross_attn_norm=True,
        eps=1e-6,
    )
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model.eval()


def delta_like(model: torch.nn.Module, seed: int = 1) -> dict[str, torch.Tensor]:
    """A trained-looking stage-1 ``delta_embedding.{0,2}`` (the time MLP's copy, moved)."""
    g = torch.Generator().manual_seed(seed)
    return {
        f"delta_embedding.{k}": v.detach().clone() + 0.1 * torch.randn(v.shape, generator=g)
        for k, v in model.time_embedding.state_dict().items()
    }


def write_package(
    folder: Path,
    checkpoint: dict[str, Any],
    stage: str | None = None,
    release_role: str | None = None,
    step: int = 1200,
) -> Path:
    """A v2 checkpoint transaction as the official store writes it: model.pt, the manifest, COMPLETE.json."""
    folder.mkdir(parents=True)
    torch.save(checkpoint, folder / "model.pt")
    contract = {
        "family": "wan22_ti2v_5b",
        "stage": stage or "",
        "causal_mode": "",
        "objective": "flow_matching",
        "camera_translation_transform": "linear",
        "parameterization": "full-parameter-live-ema",
        "sp_size": 1,
        "data_generation": "inference-portable:v1",
        "extras": {},
    }
    manifest = {
        "schema": "solarwm.checkpoint.v2",
        "step": step,
        "contract": contract,
        "required_components": ["model.pt"],
        "files": [{"path": "model.pt", "size": (folder / "model.pt").stat().st_size}],
        "metadata": {},
    }
    raw = json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()
    (folder / "checkpoint-manifest.json").write_bytes(raw)
    complete = {
        "schema": "solarwm.checkpoint-complete.v2",
        "step": step,
        "manifest_digest": hashlib.blake2s(raw).hexdigest(),
    }
    (folder / "COMPLETE.json").write_text(json.dumps(complete))
    if release_role is not None:
        release = {
            "schema": "solarwm.public-weight-manifest.v1",
            "load": {"format": "solarwm_wan_stage2_transaction_v1", "entrypoint": ".", "default_weights": release_role},
            "identity": {"model": {"weight_role": "live+ema"}},
        }
        (folder / "release-manifest.json").write_text(json.dumps(release))
    return folder


def stage_checkpoint(live: dict[str, torch.Tensor], ema: dict[str, torch.Tensor], prefix: str = "") -> dict[str, Any]:
    """``model.pt`` of a stage: ``generator`` (live) and ``generator_ema`` with an optional ``model.`` prefix."""
    return {
        "generator": {prefix + k: v.detach().clone() for k, v in live.items()},
        "generator_ema": {prefix + k: v.detach().clone() for k, v in ema.items()},
        "global_step": 1200,
        "config": {"model": {"family": "wan22_ti2v_5b"}, "train": {"stage": "tiny"}},
    }


def tiny_tokenizer(folder: Path, words: list[str]) -> Path:
    """A real ``PreTrainedTokenizerFast`` (word level) saved like the release's ``tokenizer/``: pad 0, eos 1, unk 2."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "</s>": 1, "<unk>": 2, **{w: i + 3 for i, w in enumerate(words)}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="</s>", unk_token="<unk>"
    ).save_pretrained(folder)
    return folder
