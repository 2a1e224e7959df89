"""``solarwm convert official``: an official SolarWM Wan2.2-TI2V-5B stage package -> our adapter export.

The package is checked as the official loaders check it (``solarwm.backbones.official``: manifest, COMPLETE,
sizes, the manifest's blake2s), ``model.pt`` is read with ``torch.load(weights_only=True, mmap=True)`` (a
pickle that needs more than tensors and plain containers is refused, never executed), the weights of the
chosen role are renamed onto diffusers' ``WanTransformer3DModel`` and written as an export that
``load_adapter``, ``solarwm predict``, ``solarwm play`` and ``init_from`` read (layout:
``solarwm.backbones.export``): ``adapter.json`` (with ``source`` and ``conventions``), ``transformer/``
(safetensors), ``camera.safetensors`` (empty: fused PRoPE has no weights), ``flow_map.safetensors`` (stage 1)
and ``vae/`` (with ``--base``). The export is written into a temporary folder renamed into place: a refused
or interrupted conversion leaves no ``--out``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from solarwm.backbones import official_base
from solarwm.backbones.official import (  # noqa: F401  (resolve_architecture: the converter's names)
    OfficialCheckpointError,
    StagingFolder,
    architecture_from_json,
    convert_state,
    load_model_pt,
    official_conventions,
    resolve_architecture,
    strip_model_prefix,
)
from solarwm.backbones.official_base import BASE_T5, BASE_VAE, is_official_base  # noqa: F401

MANIFEST = "checkpoint-manifest.json"
COMPLETE = "COMPLETE.json"
RELEASE_MANIFEST = "release-manifest.json"
#: Weight role -> ``model.pt`` field (Junchao-cs/SolarWM ``src/solarwm/backends/wan22/runtime/inference.py``
#: ``_checkpoint_state_field``).
ROLE_FIELDS = {"ema": "generator_ema", "live": "generator"}
#: Official stage (the manifest contract's ``stage``) -> the stage our export records.
STAGES = {"stage0p5": "bidirectional", "stage1": "tf_anyflow", "stage2": "dmd"}


@dataclass
class Package:
    """A verified official package: its folder, step, contract, manifest metadata and default weight role."""

    path: Path
    step: int
    contract: dict[str, Any]
    metadata: dict[str, Any]
    default_role: str


def _read_json(path: Path) -> tuple[Any, bytes]:
    """``(object, raw bytes)`` of a JSON file; an unreadable or invalid one is refused by name."""
    try:
        raw = path.read_bytes()
        return json.loads(raw), raw
    except (OSError, ValueError) as e:
        raise OfficialCheckpointError(f"{path}: not a readable JSON file ({e})") from e


def verify_package(path: str | Path) -> Package:
    """Check a v2 checkpoint transaction as 3a1b2c3/SolarWM ``src/solarwm/checkpoint/store.py`` does.

    ``COMPLETE.json`` must exist (schema ``solarwm.checkpoint-complete.v2``) with the manifest's step and, where
    it records one, the manifest's blake2s; every file the manifest lists must exist with its recorded size, and
    ``model.pt`` must be one of them. ``release-manifest.json`` (stage 2), when present, gives the default role.
    """
    root = Path(path)
    if not root.is_dir():
        raise OfficialCheckpointError(f"{root}: package folder not found")
    if not (root / COMPLETE).is_file():
        raise OfficialCheckpointError(f"{root}: no {COMPLETE}: not a complete checkpoint transaction (refused)")
    if not (root / MANIFEST).is_file():
        raise OfficialCheckpointError(f"{root}: no {MANIFEST}: not a checkpoint transaction")
    complete, _ = _read_json(root / COMPLETE)
    manifest, manifest_bytes = _read_json(root / MANIFEST)
    if not isinstance(complete, dict) or complete.get("schema") != "solarwm.checkpoint-complete.v2":
        raise OfficialCheckpointError(f"{root / COMPLETE}: schema is not 'solarwm.checkpoint-complete.v2'")
    if not isinstance(manifest, dict) or manifest.get("schema") != "solarwm.checkpoint.v2":
        raise OfficialCheckpointError(f"{root / MANIFEST}: schema is not 'solarwm.checkpoint.v2'")
    digest = complete.get("manifest_digest")
    if digest is not None and digest != hashlib.blake2s(manifest_bytes).hexdigest():
        raise OfficialCheckpointError(f"{root / MANIFEST}: blake2s differs from the manifest_digest of {COMPLETE}")
    if "step" in complete and complete.get("step") != manifest.get("step"):
        raise OfficialCheckpointError(
            f"{root}: step {complete.get('step')} of {COMPLETE} != {manifest.get('step')} of {MANIFEST}"
        )
    files = manifest.get("files")
    if not isinstance(files, list) or not files:
        raise OfficialCheckpointError(f"{root / MANIFEST}: 'files' must be a non-empty list of {{path, size}}")
    for record in files:
        if not (isinstance(record, dict) and isinstance(record.get("path"), str) and type(record.get("size")) is int):
            raise OfficialCheckpointError(f"{root / MANIFEST}: bad file record {record!r}")
        relative = Path(record["path"])
        if relative.is_absolute() or ".." in relative.parts:
            raise OfficialCheckpointError(f"{root / MANIFEST}: unsafe path {record['path']!r}")
        target = root / relative
        if not target.is_file() or target.is_symlink():
            raise OfficialCheckpointError(f"{root}: {record['path']} listed in the manifest is missing")
        if target.stat().st_size != record["size"]:
            raise OfficialCheckpointError(
                f"{target}: size {target.stat().st_size} differs from the manifest's {record['size']} (truncated?)"
            )
    if "model.pt" not in {r["path"] for r in files}:
        raise OfficialCheckpointError(f"{root / MANIFEST}: does not list model.pt")
    step = manifest.get("step")
    if isinstance(step, bool) or not isinstance(step, int):
        raise OfficialCheckpointError(f"{root / MANIFEST}: step must be an integer, got {step!r}")
    contract = manifest.get("contract") if isinstance(manifest.get("contract"), dict) else {}
    metadata = manifest.get("metadata") if isinstance(manifest.get("metadata"), dict) else {}
    return Package(root, step, contract, metadata, _default_role(root))


def _default_role(root: Path) -> str:
    """``load.default_weights`` of ``release-manifest.json`` (``solarwm.public-weight-manifest.v1``), else ema."""
    path = root / RELEASE_MANIFEST
    if not path.is_file():
        return "ema"  # the role the official Stage-0.5/1 inference configs select (checkpoint.weights: ema)
    release, _ = _read_json(path)
    load = release.get("load") if isinstance(release, dict) else None
    if release.get("schema") != "solarwm.public-weight-manifest.v1" or not isinstance(load, dict):
        raise OfficialCheckpointError(f"{path}: not a 'solarwm.public-weight-manifest.v1' with a 'load' object")
    role = load.get("default_weights")
    if role not in ROLE_FIELDS:
        raise OfficialCheckpointError(f"{path}: load.default_weights {role!r} is not one of {sorted(ROLE_FIELDS)}")
    return role


def sha256_file(path: Path, chunk: int = 1 << 24) -> str:
    """Hex sha256 of a file, read in 16 MiB chunks."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def _export_stage(package: Package, checkpoint: dict[str, Any], has_delta: bool, prefixed: bool) -> str:
    """Our stage name: from the contract's ``stage`` when it names one, else from the state (delta, prefix)."""
    official = str(package.contract.get("stage", ""))
    if official in STAGES:
        stage = STAGES[official]
        if (stage == "tf_anyflow") != has_delta:
            raise OfficialCheckpointError(
                f"{package.path}: contract stage {official!r} but the weights "
                f"{'have' if has_delta else 'lack'} delta_embedding"
            )
        return stage
    if has_delta:
        return "tf_anyflow"
    return "dmd" if prefixed or "stage2" in str(checkpoint.get("checkpoint_format", "")) else "bidirectional"


def _check_base(base: str | None) -> Path | None:
    """``--base``: a diffusers-layout folder with ``vae/``, ``text_encoder/`` and ``tokenizer/`` (or None); the
    release's base in its original layout is converted once into the cache (``official_base_cache``)."""
    if base is None:
        return None
    root = official_base_cache(base, transformer=False) if is_official_base(base) else Path(base)
    missing = [p for p in ("vae/config.json", "text_encoder/config.json", "tokenizer") if not (root / p).exists()]
    if missing:
        raise OfficialCheckpointError(
            f"--base {root}: missing {missing}; give a diffusers-layout base "
            "(`solarwm convert official-base` writes one)"
        )
    return root


def convert_official(
    package: str | Path,
    out: str | Path,
    weights: Literal["ema", "live"] | None = None,
    architecture: str | None = None,
    base: str | None = None,
) -> dict[str, Any]:
    """Convert an official stage package into an adapter export at ``out``; returns the summary it prints."""
    import torch
    from diffusers import WanTransformer3DModel
    from safetensors.torch import save_file

    from solarwm.backbones.export import ADAPTER_SCHEMA

    out = Path(out)
    if out.exists():
        raise OfficialCheckpointError(f"--out {out} exists; remove it or choose another folder (nothing was written)")
    if weights is not None and weights not in ROLE_FIELDS:
        raise OfficialCheckpointError(f"--weights must be one of {sorted(ROLE_FIELDS)}, got {weights!r}")
    arch = architecture_from_json(architecture)
    base_root = _check_base(base)
    pkg = verify_package(package)
    family = pkg.contract.get("family") or "wan22_ti2v_5b"
    if family != "wan22_ti2v_5b":  # an H3 package (minimax_h3) has another token packing: not this converter
        raise OfficialCheckpointError(f"{pkg.path}: contract family {family!r}; only 'wan22_ti2v_5b' packages convert")
    transform = pkg.contract.get("camera_translation_transform") or "linear"
    if transform != "linear":  # the Wan route's PRoPE takes translations as they are
        raise OfficialCheckpointError(
            f"{pkg.path}: camera_translation_transform {transform!r}; the Wan route needs 'linear'"
        )
    role = weights or pkg.default_role
    model_pt = pkg.path / "model.pt"
    checkpoint = load_model_pt(model_pt)
    field = ROLE_FIELDS[role]
    state = checkpoint.get(field)
    if not isinstance(state, dict) or not state:
        have = sorted(k for k in checkpoint if isinstance(k, str))
        raise OfficialCheckpointError(f"{model_pt}: no '{field}' state for role {role!r} (has {have})")
    prefixed = any(isinstance(k, str) and k.startswith("model.") for k in state)
    state = strip_model_prefix(state, f"{model_pt}[{field}]")
    has_delta = any(k.startswith("delta_embedding.") for k in state)
    stage = _export_stage(pkg, checkpoint, has_delta, prefixed)
    config = route_config(arch, stage, base_root)
    with torch.device("meta"):
        model = WanTransformer3DModel(**config.transformer_kwargs(48, 48))
    expected = {k: v.shape for k, v in model.state_dict().items()}
    expected_delta = {k: v.shape for k, v in model.condition_embedder.time_embedder.state_dict().items()}
    transformer_state, delta_state = convert_state(state, expected, expected_delta, f"{model_pt}[{field}]")
    # fp32 in the export whatever the stored dtype (the EMA is fp32 already; the route computes in fp32 on a CPU).
    transformer_state = {k: v.float().contiguous() for k, v in transformer_state.items()}
    model.load_state_dict(transformer_state, strict=True, assign=True)
    sha = sha256_file(model_pt)
    meta: dict[str, Any] = {
        "schema": ADAPTER_SCHEMA, "route": "wan22_ti2v_5b",
        "config": json.loads(json.dumps(dataclasses.asdict(config))), "stage": stage,
        "source": {
            "format": "solarwm official Wan2.2-TI2V-5B checkpoint transaction (solarwm.checkpoint.v2)",
            "package": str(pkg.path.resolve()), "step": pkg.step, "role": role, "field": field,
            "model_pt_sha256": sha, "contract": pkg.contract, "architecture": arch,
            "base": str(base_root.resolve()) if base_root is not None else None,
        },
        "conventions": official_conventions(stage),
    }
    if delta_state:
        meta["flow_map_gate"] = 0.25  # a non-persistent buffer in the official model, not in the state
    with StagingFolder(out) as tmp:
        model.save_pretrained(tmp / "transformer", safe_serialization=True)
        save_file({}, str(tmp / "camera.safetensors"))
        if delta_state:
            save_file({k: v.float().contiguous() for k, v in delta_state.items()}, str(tmp / "flow_map.safetensors"))
        if base_root is not None:
            shutil.copytree(base_root / "vae", tmp / "vae")
        (tmp / "adapter.json").write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    del model, transformer_state, checkpoint
    return {"output": str(out), "stage": stage, "step": pkg.step, "role": role, "model_pt_sha256": sha,
            "parameters": sum(v.numel() for v in expected.values()), "flow_map": bool(delta_state),
            "base": meta["source"]["base"]}


def official_command(
    package: str,
    out: str | None = None,
    weights: str | None = None,  # checked by convert_official, whose error names the option
    architecture: str | None = None,
    base: str | None = None,
) -> int:
    """Convert an official SolarWM Wan2.2-TI2V-5B stage package into an adapter export.

    Args:
        package: the package folder (checkpoint-manifest.json, COMPLETE.json, model.pt[, release-manifest.json]).
        out: the export folder to write (must not exist; written atomically).
        weights: the weight role, ema (generator_ema) or live (generator); default: the release manifest's, else ema.
        architecture: a JSON object or file of Wan constructor names (dim, ffn_dim, num_heads, ...) over the
            published 5B; default: the published 5B.
        base: a diffusers-layout base folder (vae/, text_encoder/, tokenizer/) to ship the VAE and name the
            UMT5 encoder; default: none (the export gets the patchify codec and hashing text).
    """
    if out is None:
        raise OfficialCheckpointError("--out DIR is required")
    print(json.dumps(convert_official(package, out, weights, architecture, base)))
    return 0



def route_config(arch: dict[str, Any], stage: str, base: Path | None) -> Any:
    """Our ``Wan22TI2V5BConfig`` for a Wan architecture, with the official conventions as its settings."""
    from solarwm.backbones.wan22_ti2v_5b import Wan22TI2V5BConfig

    return Wan22TI2V5BConfig.official(arch, stage, base)


def convert_official_base(
    base: str | Path, out: str | Path, architecture: str | None = None, vae_config: str | None = None,
    transformer: bool = True,
) -> dict[str, Any]:
    """The release's base folder (original Wan layout) -> a diffusers-layout folder for the 5B route
    (``backbones.official_base.convert_official_base``)."""
    from solarwm.backbones.wan22_ti2v_5b import VAE_CONFIGS, Wan22TI2V5BConfig

    return official_base.convert_official_base(base, out, Wan22TI2V5BConfig, VAE_CONFIGS, architecture, vae_config,
                                               transformer)


def official_base_cache(base: str | Path, transformer: bool = True) -> Path:
    """The 5B route's diffusers-layout copy of an official base, made once (``backbones.official_base``)."""
    from solarwm.backbones.wan22_ti2v_5b import VAE_CONFIGS, Wan22TI2V5BConfig

    return official_base.official_base_cache(base, Wan22TI2V5BConfig, VAE_CONFIGS, transformer)


def official_base_command(
    base: str, out: str | None = None, architecture: str | None = None, vae_config: str | None = None
) -> int:
    """Convert the release's base folder (original Wan layout) into a diffusers-layout folder.

    Args:
        base: the base folder (vae/Wan2.2_VAE.pth, text_encoder/models_t5_umt5-xxl-enc-bf16.pth, tokenizer/,
            transformer/*.safetensors).
        out: the folder to write (must not exist; written atomically); usable as pretrained_path and as --base.
        architecture: a JSON object or file of Wan constructor names for transformer/ (default: the published 5B).
        vae_config: the VAE's size, wan2.2 (the release) or tiny48 (tests); default: read off the .pth.
    """
    if out is None:
        raise OfficialCheckpointError("--out DIR is required")
    print(json.dumps(convert_official_base(base, out, architecture, vae_config)))
    return 0
