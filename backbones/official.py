"""The official SolarWM Wan2.2-TI2V-5B checkpoints: their package, their key names, and ours.

Facts, each taken from the official repository ``Junchao-cs/SolarWM`` (commit 208141bc) or its fork
``3a1b2c3/SolarWM`` (bc710113), never their code:

* A stage package is a v2 checkpoint transaction: ``checkpoint-manifest.json`` (schema ``solarwm.checkpoint.v2``:
  ``step``, ``contract``, ``files`` as ``{path, size}``, ``metadata``) and ``COMPLETE.json`` (schema
  ``solarwm.checkpoint-complete.v2``: ``step`` and ``manifest_digest``, the blake2s hex digest of the manifest's
  bytes) (3a1b2c3/SolarWM ``src/solarwm/checkpoint/store.py`` ``verify_checkpoint``). Stage 2 adds
  ``release-manifest.json`` whose ``load.default_weights`` names the weight role (Junchao-cs/SolarWM
  ``src/solarwm/backends/wan22/runtime/stage2.py`` ``_published_default_weight_role``).
* ``model.pt`` holds ``generator`` (live) and ``generator_ema`` (fp32 EMA, what inference uses by default)
  (Junchao-cs/SolarWM ``.../wan22/runtime/inference.py`` ``_checkpoint_state_field``); stage 2 prefixes every key
  with ``model.``, stripped all or none (Junchao-cs/SolarWM ``.../wan22/runtime/checkpoint.py``
  ``normalize_model_state``).
* The keys are original Wan names (3a1b2c3/SolarWM ``src/solarwm/backends/wan22/modeling/causal_model.py``),
  renamed onto diffusers' ``WanTransformer3DModel`` as diffusers' own ``scripts/convert_wan_to_diffusers.py``
  does (``norm3`` -> ``norm2`` is deliberate: Wan's parameter-free ``norm2`` is diffusers' ``norm3``).
* Stage 1 adds ``delta_embedding.{0,2}``, a trained copy of the time MLP, mixed as
  ``0.75·time_embedding(t) + 0.25·delta_embedding(r)`` before the time projection (``causal_model.py``): our
  flow map (``AdapterWeights.enable_flow_map(0.25)``) is that mix at the same place.
* The published architecture is ``architectures/ti2v_5b.json`` of the fork: dim 3072, ffn 14336, freq 256,
  text 4096, in/out 48, 24 heads, 30 layers, patch (1, 2, 2).
"""

from __future__ import annotations

import json
import pickle
import re
import shutil
import uuid
from pathlib import Path
from typing import Any, Mapping

import torch

#: Wan's constructor arguments of the published TI2V-5B transformer (3a1b2c3/SolarWM
#: ``src/solarwm/backends/wan22/architectures/ti2v_5b.json``; wan22 ``wan/configs/wan_ti2v_5B.py``).
PUBLISHED_5B: dict[str, Any] = {
    "dim": 3072, "ffn_dim": 14336, "freq_dim": 256, "text_dim": 4096, "in_dim": 48, "out_dim": 48,
    "num_heads": 24, "num_layers": 30, "patch_size": [1, 2, 2], "text_len": 512, "eps": 1e-6,
    "qk_norm": True, "cross_attn_norm": True,
}

#: Normalised focal lengths of the official data pipeline: 969.6969.../1920 and 969.6969.../1080, the source K
#: ignored, principal point at the centre (Junchao-cs/SolarWM ``src/solarwm/backends/wan22/runtime/data.py``).
WAN_FIXED_FX = 969.6969696969697 / 1920.0
WAN_FIXED_FY = 969.6969696969697 / 1080.0

#: The stage-2 sampler of the release: 3-latent blocks, a window of 6 blocks (no sink), t = [1000, 937.5, 833.3,
#: 625] (``[1000, 750, 500, 250]`` warped onto the shift-5 table), fresh noise between steps, a commit pass at
#: t = 0 (Junchao-cs/SolarWM ``.../wan22/runtime/stage2.py`` ``_stage2_self_forcing_latents``; 3a1b2c3/SolarWM
#: ``.../wan22/sgf.py`` ``warp_denoising_steps``). Our ``renoise`` rollout at shift 5 and 4 steps is that grid.
STAGE2_TIMESTEPS = (1000.0, 937.5, 833.3333, 625.0)


class OfficialCheckpointError(ValueError):
    """An official package or state dict was refused; the message names the file, the keys or the check."""


def names(keys: list[str], limit: int = 5) -> str:
    """The first ``limit`` keys and the count, for one-line errors."""
    shown = ", ".join(keys[:limit])
    return f"{len(keys)} ({shown}{', ...' if len(keys) > limit else ''})"


def resolve_architecture(overrides: Mapping[str, Any] | None) -> dict[str, Any]:
    """The published 5B architecture with ``overrides`` (Wan's constructor names) applied and checked."""
    arch = dict(PUBLISHED_5B)
    unknown = sorted(set(overrides or {}) - set(arch))
    if unknown:
        raise OfficialCheckpointError(f"--architecture: unknown Wan field(s) {unknown}; known: {sorted(arch)}")
    arch.update(overrides or {})
    arch["patch_size"] = [int(p) for p in arch["patch_size"]]
    for name in ("dim", "ffn_dim", "freq_dim", "text_dim", "in_dim", "out_dim", "num_heads", "num_layers", "text_len"):
        if isinstance(arch[name], bool) or not isinstance(arch[name], int) or arch[name] < 1:
            raise OfficialCheckpointError(f"--architecture: {name} must be a positive integer, got {arch[name]!r}")
    if arch["dim"] % arch["num_heads"] or (arch["dim"] // arch["num_heads"]) % 2:
        raise OfficialCheckpointError(
            f"--architecture: dim {arch['dim']} must split into {arch['num_heads']} even heads"
        )
    # What the route builds (``WanRouteConfig.transformer_kwargs``): anything else could not hold these weights.
    fixed = {"in_dim": 48, "out_dim": 48, "eps": 1e-6, "qk_norm": True, "cross_attn_norm": True}
    wrong = [f"{k}={arch[k]!r} (the route needs {v!r})" for k, v in fixed.items() if arch[k] != v]
    if len(arch["patch_size"]) != 3 or arch["patch_size"][0] != 1 or arch["patch_size"][1] != arch["patch_size"][2]:
        wrong.append(f"patch_size={arch['patch_size']} (the route needs (1, p, p))")
    if wrong:
        raise OfficialCheckpointError("--architecture: " + "; ".join(wrong))
    return arch


def official_shapes(arch: Mapping[str, Any], delta: bool = False) -> dict[str, tuple[int, ...]]:
    """The original Wan key -> shape table of a package of ``arch`` (``resolve_architecture``'s output).

    15 top-level tensors and 27 per block (825 for the published 30 layers), plus the 4 stage-1
    ``delta_embedding`` tensors when ``delta`` (3a1b2c3/SolarWM ``.../wan22/modeling/model.py``; wan22 ``WanModel``).
    """
    d, f, ffn, t = arch["dim"], arch["freq_dim"], arch["ffn_dim"], arch["text_dim"]
    pt, ph, pw = arch["patch_size"]
    shapes: dict[str, tuple[int, ...]] = {
        "patch_embedding.weight": (d, arch["in_dim"], pt, ph, pw), "patch_embedding.bias": (d,),
        "text_embedding.0.weight": (d, t), "text_embedding.0.bias": (d,),
        "text_embedding.2.weight": (d, d), "text_embedding.2.bias": (d,),
        "time_embedding.0.weight": (d, f), "time_embedding.0.bias": (d,),
        "time_embedding.2.weight": (d, d), "time_embedding.2.bias": (d,),
        "time_projection.1.weight": (6 * d, d), "time_projection.1.bias": (6 * d,),
        "head.head.weight": (arch["out_dim"] * pt * ph * pw, d), "head.head.bias": (arch["out_dim"] * pt * ph * pw,),
        "head.modulation": (1, 2, d),
    }
    for i in range(arch["num_layers"]):
        b = f"blocks.{i}."
        shapes[b + "modulation"] = (1, 6, d)
        for attn in ("self_attn", "cross_attn"):
            for proj in "qkvo":
                shapes[f"{b}{attn}.{proj}.weight"], shapes[f"{b}{attn}.{proj}.bias"] = (d, d), (d,)
            shapes[f"{b}{attn}.norm_q.weight"] = shapes[f"{b}{attn}.norm_k.weight"] = (d,)
        shapes[b + "norm3.weight"] = shapes[b + "norm3.bias"] = (d,)
        shapes[b + "ffn.0.weight"], shapes[b + "ffn.0.bias"] = (ffn, d), (ffn,)
        shapes[b + "ffn.2.weight"], shapes[b + "ffn.2.bias"] = (d, ffn), (d,)
    if delta:
        shapes.update({"delta_embedding.0.weight": (d, f), "delta_embedding.0.bias": (d,),
                       "delta_embedding.2.weight": (d, d), "delta_embedding.2.bias": (d,)})
    return shapes


# Original Wan name -> diffusers WanTransformer3DModel name (diffusers scripts/convert_wan_to_diffusers.py).
_TOP = {
    "patch_embedding": "patch_embedding",
    "text_embedding.0": "condition_embedder.text_embedder.linear_1",
    "text_embedding.2": "condition_embedder.text_embedder.linear_2",
    "time_embedding.0": "condition_embedder.time_embedder.linear_1",
    "time_embedding.2": "condition_embedder.time_embedder.linear_2",
    "time_projection.1": "condition_embedder.time_proj",
    "head.head": "proj_out",
}
_BLOCK = {
    "self_attn.q": "attn1.to_q", "self_attn.k": "attn1.to_k", "self_attn.v": "attn1.to_v",
    "self_attn.o": "attn1.to_out.0", "self_attn.norm_q": "attn1.norm_q", "self_attn.norm_k": "attn1.norm_k",
    "cross_attn.q": "attn2.to_q", "cross_attn.k": "attn2.to_k", "cross_attn.v": "attn2.to_v",
    "cross_attn.o": "attn2.to_out.0", "cross_attn.norm_q": "attn2.norm_q", "cross_attn.norm_k": "attn2.norm_k",
    "norm3": "norm2",  # Wan's affine pre-cross-attention norm; Wan's norm2 (pre-FFN) has no parameters
    "ffn.0": "ffn.net.0.proj", "ffn.2": "ffn.net.2",
}
#: The stage-1 AnyFlow r-embedding: Wan ``Sequential(Linear, SiLU, Linear)`` -> diffusers ``TimestepEmbedding``.
_DELTA = {"delta_embedding.0": "linear_1", "delta_embedding.2": "linear_2"}
_BLOCK_KEY = re.compile(r"^blocks\.(\d+)\.(.+)\.(weight|bias)$")


def diffusers_key(key: str) -> tuple[str, str] | None:
    """``("transformer" | "delta", diffusers name)`` of an original Wan key, or None for a key with no place."""
    if key == "head.modulation":
        return "transformer", "scale_shift_table"
    block = re.fullmatch(r"blocks\.(\d+)\.modulation", key)
    if block:
        return "transformer", f"blocks.{block.group(1)}.scale_shift_table"
    block = _BLOCK_KEY.match(key)
    if block and block.group(2) in _BLOCK:
        return "transformer", f"blocks.{block.group(1)}.{_BLOCK[block.group(2)]}.{block.group(3)}"
    module, _, leaf = key.rpartition(".")
    if leaf in ("weight", "bias"):
        if module in _TOP:
            return "transformer", f"{_TOP[module]}.{leaf}"
        if module in _DELTA:
            return "delta", f"{_DELTA[module]}.{leaf}"
    return None


def strip_model_prefix(state: Mapping[str, torch.Tensor], source: str) -> dict[str, torch.Tensor]:
    """Drop a root ``model.`` prefix that every key has (stage 2); a mix of prefixed and bare keys is refused."""
    keys = list(state)
    prefixed = [k for k in keys if k.startswith("model.")]
    if not prefixed:
        return dict(state)
    if len(prefixed) != len(keys):
        bare = [k for k in keys if not k.startswith("model.")]
        raise OfficialCheckpointError(
            f"{source}: {len(prefixed)} keys start with 'model.' and {names(bare)} do not (all or none)"
        )
    return {k[len("model."):]: v for k, v in state.items()}


def convert_state(
    state: Mapping[str, torch.Tensor],
    expected: Mapping[str, torch.Size],
    expected_delta: Mapping[str, torch.Size] | None,
    source: str,
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Original Wan state -> ``(transformer state, delta state)`` in diffusers names, checked both ways.

    ``expected``: the diffusers transformer's parameter shapes; ``expected_delta``: the flow map's (the
    ``TimestepEmbedding`` shapes), used when the state has ``delta_embedding.*``. Every key must be consumed
    exactly once and every expected parameter filled with the same shape; the error names the keys.
    """
    unknown = [k for k in state if diffusers_key(k) is None]
    if unknown:
        raise OfficialCheckpointError(f"{source}: keys with no place in WanTransformer3DModel: {names(unknown)}")
    out: dict[str, dict[str, torch.Tensor]] = {"transformer": {}, "delta": {}}
    for key, tensor in state.items():
        part, name = diffusers_key(key)
        if not isinstance(tensor, torch.Tensor):
            raise OfficialCheckpointError(f"{source}: {key} is a {type(tensor).__name__}, not a tensor")
        if name in out[part]:
            raise OfficialCheckpointError(f"{source}: {key} maps onto {name}, which another key already filled")
        out[part][name] = tensor
    delta_expected = dict(expected_delta or {}) if out["delta"] else {}
    parts = (("transformer", expected), ("delta", delta_expected))
    # Shapes first: a package of another size fails on its first key, which says more than a list of missing ones.
    for part, want in parts:
        for name, shape in want.items():
            if name in out[part] and tuple(out[part][name].shape) != tuple(shape):
                raise OfficialCheckpointError(
                    f"{source}: {name} has shape {list(out[part][name].shape)}, the architecture needs {list(shape)} "
                    "(pass the package's architecture with --architecture)"
                )
    for part, want in parts:
        have = out[part]
        missing = [k for k in want if k not in have]
        if missing:
            raise OfficialCheckpointError(f"{source}: missing parameters ({part}, diffusers names): {names(missing)}")
        extra = [k for k in have if k not in want]
        if extra:
            raise OfficialCheckpointError(f"{source}: keys the architecture has no parameter for: {names(extra)}")
    if out["delta"] and len(out["delta"]) != 4:
        raise OfficialCheckpointError(f"{source}: delta_embedding needs exactly 4 tensors, has {len(out['delta'])}")
    return out["transformer"], out["delta"]


def official_conventions(stage: str) -> dict[str, Any]:
    """The conventions the released weights were trained and sampled with, as recorded in ``adapter.json``.

    The route settings among them are also in the adapter's config (so ``load_adapter`` applies them); the rest
    are what our route already does identically, recorded so that a reader can check.
    """
    return {
        "latent_camera": "group_first (latent i <- pixel frame 4i-3, i >= 1; frame 0 for latent 0)",
        "intrinsics": f"wan_fixed (fx = {WAN_FIXED_FX:.6f} W, fy = {WAN_FIXED_FY:.6f} H, centred; source K ignored)",
        "cameras": "c2w relative to frame 0, inverted to w2c; translation linear (no rescaling)",
        "prope": "all head dims, after RoPE, matrices in fp32",
        "sampler": (
            "3-latent blocks, window 6 blocks, no sink; t = [1000, 937.5, 833.3, 625] (shift 5, 4 steps); "
            "fresh noise between steps; commit at t = 0; image latent held at t = 0"
        ),
        "timestep_rounding": "bfloat16 (the official sampler feeds bf16-rounded t; re-noising uses the exact t)"
        if stage == "dmd" else "none",
        "anyflow": "e = 0.75 time_embedding(t) + 0.25 delta_embedding(r), before the time projection; clean rows r = t"
        if stage == "tf_anyflow" else "none",
    }


def load_model_pt(path: Path) -> dict[str, Any]:
    """``torch.load(weights_only=True, mmap=True)`` of ``model.pt``; anything it refuses is refused here, by name."""
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except pickle.UnpicklingError as e:
        reason = str(e).split("\n")[0][:200]
        raise OfficialCheckpointError(
            f"{path}: needs more than tensors and plain containers to load; refused, nothing executed ({reason})"
        ) from e
    except Exception as e:  # truncated or foreign: torch raises RuntimeError/OSError/EOFError with long text
        reason = " ".join(str(e).split())[:200]
        raise OfficialCheckpointError(f"{path}: not a readable torch checkpoint ({type(e).__name__}: {reason})") from e
    if not isinstance(checkpoint, dict):
        raise OfficialCheckpointError(f"{path}: holds a {type(checkpoint).__name__}, not a dict")
    return checkpoint


def architecture_from_json(architecture: str | None) -> dict[str, Any]:
    """``--architecture``: a JSON object (inline or a file) of Wan constructor names over the published 5B."""
    if architecture is None:
        return resolve_architecture(None)
    text = Path(architecture).read_text() if Path(architecture).is_file() else architecture
    try:
        overrides = json.loads(text)
    except ValueError as e:
        raise OfficialCheckpointError(f"--architecture: not a JSON object or a JSON file ({e})") from e
    if not isinstance(overrides, dict):
        raise OfficialCheckpointError("--architecture: must be a JSON object of Wan constructor names")
    return resolve_architecture(overrides)


class StagingFolder:
    """A temporary folder beside ``out`` renamed onto it on success; removed (with parents it made) otherwise."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.made = [p for p in [out.parent, *out.parent.parents] if not p.exists()]
        self.tmp = out.with_name(f".{out.name}.convert-{uuid.uuid4().hex[:8]}")

    def __enter__(self) -> Path:
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self.tmp.mkdir()
        return self.tmp

    def __exit__(self, kind: Any, error: Any, tb: Any) -> None:
        if kind is None:
            self.tmp.rename(self.out)
            return
        shutil.rmtree(self.tmp, ignore_errors=True)  # BaseException too: an interrupted run leaves nothing
        for folder in self.made:
            if folder.is_dir() and not any(folder.iterdir()):
                folder.rmdir()
