"""The official base's VAE and text encoder (original Wan layouts) onto diffusers / transformers classes.

* VAE: ``vae/Wan2.2_VAE.pth`` is Wan's own 48-channel ``WanVAE_`` state (3a1b2c3/SolarWM
  ``src/solarwm/backends/wan22/runtime/assets.py``; Junchao-cs/SolarWM ``.../wan22/runtime/components.py``
  ``Wan5BVAE``: the deterministic mean, normalised ``(mu - mean) / std`` with the published statistics). It maps
  onto diffusers' ``AutoencoderKLWan`` by the renames of diffusers' ``scripts/convert_wan_to_diffusers.py``
  (``convert_vae_22``): ``middle.{0,1,2}`` -> ``mid_block.{resnets.0, attentions.0, resnets.1}``, residual
  ``{0,2,3,6}`` -> ``{norm1, conv1, norm2, conv2}``, ``shortcut`` -> ``conv_shortcut``, ``head.{0,2}`` ->
  ``{norm_out, conv_out}``, ``conv{1,2}`` -> ``{quant_conv, post_quant_conv}``, ``{en,de}coder.conv1`` ->
  ``conv_in``, ``downsamples.X.downsamples.Y`` -> ``down_blocks.X.{resnets.Y | downsampler}`` (and ``up``).
* Text encoder: ``text_encoder/models_t5_umt5-xxl-enc-bf16.pth`` is Wan's ``T5Encoder`` (``umt5_xxl(encoder_only=
  True)``, loaded strict; Junchao-cs/SolarWM ``.../wan22/runtime/components.py`` ``WanTextEncoder``): per-layer
  relative position buckets (``shared_pos=False``), gated-GELU FFN (tanh GELU), RMS norms without bias, no
  attention scaling, which is transformers' ``UMT5EncoderModel`` with the names mapped below.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any, Mapping

import torch

from solarwm.backbones.official import (
    OfficialCheckpointError,
    StagingFolder,
    architecture_from_json,
    convert_state,
    load_model_pt,
    names,
    strip_model_prefix,
)

_RESIDUAL = {"residual.0.gamma": "norm1.gamma", "residual.2.weight": "conv1.weight", "residual.2.bias": "conv1.bias",
             "residual.3.gamma": "norm2.gamma", "residual.6.weight": "conv2.weight", "residual.6.bias": "conv2.bias",
             "shortcut.weight": "conv_shortcut.weight", "shortcut.bias": "conv_shortcut.bias"}


def vae_key(key: str) -> str:
    """The diffusers ``AutoencoderKLWan`` name of a Wan2.2 ``WanVAE_`` key (unchanged where the names agree)."""
    top = {"conv1.weight": "quant_conv.weight", "conv1.bias": "quant_conv.bias",
           "conv2.weight": "post_quant_conv.weight", "conv2.bias": "post_quant_conv.bias"}
    if key in top:
        return top[key]
    m = re.fullmatch(r"(encoder|decoder)\.(conv1|head\.0|head\.2)\.(.+)", key)
    if m:
        name = {"conv1": "conv_in", "head.0": "norm_out", "head.2": "conv_out"}[m.group(2)]
        return f"{m.group(1)}.{name}.{m.group(3)}"
    m = re.fullmatch(r"(encoder|decoder)\.middle\.([012])\.(.+)", key)
    if m:
        part, rest = m.group(2), m.group(3)
        if part == "1":
            return f"{m.group(1)}.mid_block.attentions.0.{rest}"
        return f"{m.group(1)}.mid_block.resnets.{int(part) // 2}.{_RESIDUAL.get(rest, rest)}"
    m = re.fullmatch(r"(encoder)\.downsamples\.(\d+)\.downsamples\.(\d+)\.(.+)", key) or re.fullmatch(
        r"(decoder)\.upsamples\.(\d+)\.upsamples\.(\d+)\.(.+)", key
    )
    if m:
        side, block, inner, rest = m.groups()
        group = "down_blocks" if side == "encoder" else "up_blocks"
        if rest in _RESIDUAL:
            return f"{side}.{group}.{block}.resnets.{inner}.{_RESIDUAL[rest]}"
        if rest.startswith(("resample.", "time_conv.")):
            return f"{side}.{group}.{block}.{'downsampler' if side == 'encoder' else 'upsampler'}.{rest}"
    return key


def convert_vae_state(
    state: Mapping[str, torch.Tensor], expected: Mapping[str, torch.Size], source: str
) -> dict[str, torch.Tensor]:
    """Wan2.2 VAE state -> diffusers ``AutoencoderKLWan`` state, every key placed once and every shape checked."""
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        name = vae_key(key)
        if name in out:
            raise OfficialCheckpointError(f"{source}: {key} maps onto {name}, which another key already filled")
        out[name] = value
    _check(out, expected, source, "AutoencoderKLWan")
    return out


def _check(out: Mapping[str, torch.Tensor], expected: Mapping[str, torch.Size], source: str, target: str) -> None:
    """Every expected parameter filled with its shape, nothing extra; errors name the keys."""
    extra = [k for k in out if k not in expected]
    if extra:
        raise OfficialCheckpointError(f"{source}: keys with no place in {target}: {names(extra)}")
    missing = [k for k in expected if k not in out]
    if missing:
        raise OfficialCheckpointError(f"{source}: {target} parameters missing: {names(missing)}")
    for name, shape in expected.items():
        if tuple(out[name].shape) != tuple(shape):
            raise OfficialCheckpointError(
                f"{source}: {name} has shape {list(out[name].shape)}, {target} needs {list(shape)}"
            )


def t5_key(key: str) -> str | None:
    """The ``UMT5EncoderModel`` name of a Wan ``T5Encoder`` key, or None for one with no place."""
    if key == "token_embedding.weight":
        return "shared.weight"
    if key == "norm.weight":
        return "encoder.final_layer_norm.weight"
    m = re.fullmatch(r"blocks\.(\d+)\.(.+)", key)
    if not m:
        return None
    names = {
        "norm1.weight": "layer.0.layer_norm.weight", "attn.q.weight": "layer.0.SelfAttention.q.weight",
        "attn.k.weight": "layer.0.SelfAttention.k.weight", "attn.v.weight": "layer.0.SelfAttention.v.weight",
        "attn.o.weight": "layer.0.SelfAttention.o.weight",
        "pos_embedding.embedding.weight": "layer.0.SelfAttention.relative_attention_bias.weight",
        "norm2.weight": "layer.1.layer_norm.weight", "ffn.gate.0.weight": "layer.1.DenseReluDense.wi_0.weight",
        "ffn.fc1.weight": "layer.1.DenseReluDense.wi_1.weight", "ffn.fc2.weight": "layer.1.DenseReluDense.wo.weight",
    }
    return f"encoder.block.{m.group(1)}.{names[m.group(2)]}" if m.group(2) in names else None


def umt5_config(state: Mapping[str, torch.Tensor], source: str) -> dict[str, Any]:
    """``UMT5Config`` keyword arguments read off a Wan ``T5Encoder`` state's shapes (umt5-xxl: 4096/64/24/10240)."""
    try:
        vocab, dim = state["token_embedding.weight"].shape
        buckets, heads = state["blocks.0.pos_embedding.embedding.weight"].shape
        dim_attn = state["blocks.0.attn.q.weight"].shape[0]
        dim_ffn = state["blocks.0.ffn.fc1.weight"].shape[0]
    except KeyError as e:
        raise OfficialCheckpointError(f"{source}: not a Wan T5Encoder state (no {e.args[0]})") from e
    layers = len({k.split(".")[1] for k in state if k.startswith("blocks.")})
    return dict(vocab_size=int(vocab), d_model=int(dim), d_kv=int(dim_attn) // int(heads), d_ff=int(dim_ffn),
                num_layers=int(layers), num_heads=int(heads), relative_attention_num_buckets=int(buckets),
                relative_attention_max_distance=128, feed_forward_proj="gated-gelu", layer_norm_epsilon=1e-6,
                dropout_rate=0.0, is_encoder_decoder=False, use_cache=False, tie_word_embeddings=False)


def convert_t5_state(
    state: Mapping[str, torch.Tensor], expected: Mapping[str, torch.Size], source: str
) -> dict[str, torch.Tensor]:
    """Wan ``T5Encoder`` state -> ``UMT5EncoderModel`` state (the embedding also fills ``encoder.embed_tokens``)."""
    unknown = [k for k in state if t5_key(k) is None]
    if unknown:
        raise OfficialCheckpointError(f"{source}: keys with no place in UMT5EncoderModel: {names(unknown)}")
    out = {t5_key(k): v for k, v in state.items()}
    if "encoder.embed_tokens.weight" in expected:
        out["encoder.embed_tokens.weight"] = out["shared.weight"]
    _check(out, expected, source, "UMT5EncoderModel")
    return out


#: The original-layout files of the release's base folder
#: (3a1b2c3/SolarWM ``src/solarwm/backends/wan22/runtime/assets.py``).
BASE_VAE = "vae/Wan2.2_VAE.pth"
BASE_T5 = "text_encoder/models_t5_umt5-xxl-enc-bf16.pth"


def is_official_base(path: str | Path) -> bool:
    """Whether ``path`` is a base folder in the original Wan layout (``vae/Wan2.2_VAE.pth``, no diffusers ``vae/``)."""
    root = Path(path)
    return (root / BASE_VAE).is_file() and not (root / "vae" / "config.json").is_file()


def load_pth(path: Path) -> dict[str, Any]:
    """A ``.pth`` state dict read with ``weights_only=True`` (memory-mapped when it is zip-format)."""
    if not path.is_file():
        raise OfficialCheckpointError(f"{path} missing: not an official base folder")
    state = load_model_pt(path)
    if not all(isinstance(k, str) for k in state):
        raise OfficialCheckpointError(f"{path}: not a state dict")
    return state


def vae_config_of(state: dict[str, Any], configs: dict[str, dict[str, Any]], source: str) -> str:
    """The ``vae_configs`` key whose base width and latent channels a Wan VAE state has (``wan2.2``: 160 and 48)."""
    try:
        width, channels = state["encoder.conv1.weight"].shape[0], state["conv1.weight"].shape[0] // 2
    except KeyError as e:
        raise OfficialCheckpointError(f"{source}: not a Wan VAE state (no {e.args[0]})") from e
    for name, config in configs.items():
        if (config["base_dim"], config["z_dim"]) == (width, channels):
            return name
    raise OfficialCheckpointError(f"{source}: a VAE of width {width} and {channels} channels fits no known config")


def convert_official_base(
    base: str | Path, out: str | Path, config_class: type, vae_configs: dict[str, dict[str, Any]],
    architecture: str | None = None, vae_config: str | None = None, transformer: bool = True,
) -> dict[str, Any]:
    """The release's base folder (original Wan layout) -> a diffusers-layout folder: ``vae/`` (AutoencoderKLWan),
    ``text_encoder/`` (UMT5EncoderModel), ``tokenizer/`` (copied) and, when the base has one and ``transformer``,
    ``transformer/``.

    ``config_class``, ``vae_configs``: the route's config class (its ``official`` config) and ``vae_configs``;
    ``vae_config``: a key of those (``wan2.2``: the released VAE; ``tiny48``: tests); default: the one whose sizes
    the ``.pth`` has.
    """
    from diffusers import AutoencoderKLWan, WanTransformer3DModel
    from safetensors.torch import load_file
    from transformers import UMT5Config, UMT5EncoderModel


    root, out = Path(base), Path(out)
    if not root.is_dir():
        raise OfficialCheckpointError(f"{root}: base folder not found")
    if out.exists():
        raise OfficialCheckpointError(f"--out {out} exists; remove it or choose another folder (nothing was written)")
    if not (root / "tokenizer").is_dir():
        raise OfficialCheckpointError(f"{root / 'tokenizer'} missing: not an official base folder")
    if vae_config is not None and vae_config not in vae_configs:
        raise OfficialCheckpointError(f"--vae_config must be one of {sorted(vae_configs)}, got {vae_config!r}")
    arch = architecture_from_json(architecture)
    shards = sorted((root / "transformer").glob("*.safetensors")) if transformer else []
    vae_state = load_pth(root / BASE_VAE)
    vae_config = vae_config or vae_config_of(vae_state, vae_configs, str(root / BASE_VAE))
    t5_state = load_pth(root / BASE_T5)
    with torch.device("meta"):
        vae = AutoencoderKLWan(**vae_configs[vae_config])
        t5 = UMT5EncoderModel(UMT5Config(**umt5_config(t5_state, str(root / BASE_T5))))
    vae.load_state_dict(convert_vae_state(vae_state, {k: v.shape for k, v in vae.state_dict().items()},
                                          str(root / BASE_VAE)), strict=True, assign=True)
    t5.load_state_dict(convert_t5_state(t5_state, {k: v.shape for k, v in t5.state_dict().items()},
                                        str(root / BASE_T5)), strict=True, assign=True)
    model = None
    if shards:
        state: dict[str, Any] = {}
        for shard in shards:
            try:
                state.update(load_file(str(shard)))
            except Exception as e:  # safetensors raises its own error on a damaged file
                reason = f"{type(e).__name__}: {e}"
                raise OfficialCheckpointError(f"{shard}: not a readable safetensors file ({reason})") from e
        state = strip_model_prefix(state, str(root / "transformer"))
        config = config_class.official(arch, "bidirectional", None)
        with torch.device("meta"):
            model = WanTransformer3DModel(**config.transformer_kwargs(48, 48))
        expected = {k: v.shape for k, v in model.state_dict().items()}
        weights, delta = convert_state(state, expected, None, str(root / "transformer"))
        if delta:
            raise OfficialCheckpointError(f"{root / 'transformer'}: a base holds no delta_embedding")
        model.load_state_dict(weights, strict=True, assign=True)
    record = {"schema": "solarwm.official-base/1", "source": str(root.resolve()), "architecture": arch,
              "vae_config": vae_config,
              "files": {p: (root / p).stat().st_size for p in (BASE_VAE, BASE_T5)}}
    with StagingFolder(out) as tmp:
        vae.save_pretrained(tmp / "vae", safe_serialization=True)
        t5.save_pretrained(tmp / "text_encoder", safe_serialization=True)
        shutil.copytree(root / "tokenizer", tmp / "tokenizer")
        if model is not None:
            model.save_pretrained(tmp / "transformer", safe_serialization=True)
        (tmp / "solarwm-base.json").write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    return {"output": str(out), "vae": vae_config, "text_encoder": True, "transformer": model is not None}


def official_base_cache(
    base: str | Path, config_class: type, vae_configs: dict[str, dict[str, Any]], transformer: bool = True
) -> Path:
    """The diffusers-layout copy of an official base, converted on first use into ``$SOLARWM_CACHE`` (default
    ``~/.cache/solarwm``) under a name of the base's path and file sizes; a rerun finds and reuses it.

    ``transformer=False`` (``convert official --base``: only the VAE, T5 and tokenizer are used) skips the base's
    ``transformer/`` and is cached apart.
    """
    root = Path(base).resolve()
    sizes = [f"{p}:{(root / p).stat().st_size}" for p in (BASE_VAE, BASE_T5) if (root / p).is_file()]
    stamp = [str(root), f"transformer={transformer}", *sizes]
    key = hashlib.sha256("\n".join(stamp).encode()).hexdigest()[:16]
    cache = Path(os.environ.get("SOLARWM_CACHE", Path.home() / ".cache" / "solarwm")) / "official-base" / key
    if not (cache / "solarwm-base.json").is_file():
        convert_official_base(root, cache, config_class, vae_configs, transformer=transformer)
    return cache
