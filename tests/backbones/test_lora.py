"""LoRA (peft) on any route, tested on the tiny Wan2.2-TI2V-5B route (solarwm.backbones.lora, BackboneAdapter)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from solarwm.backbones.base import AdapterError, load_adapter
from solarwm.backbones.lora import LoRAConfig
from solarwm.backbones.wan22_ti2v_5b import Wan22TI2V5BAdapter, Wan22TI2V5BConfig
from solarwm.stages.bidirectional import BidirectionalModule
from solarwm.stages.checkpoints import StageCheckpointError, load_adapter_weights

import route_contract as contract

LORA = {"rank": 4, "alpha": 4, "target_modules": ["to_q", "to_k", "to_v", "to_out.0"], "dropout": 0.0}


def plain(seed: int = 0) -> Wan22TI2V5BAdapter:
    torch.manual_seed(seed)
    built = Wan22TI2V5BAdapter(config=Wan22TI2V5BConfig.tiny())
    contract.perturb(built)
    return built


def perturb_lora(adapter: Wan22TI2V5BAdapter, scale: float = 0.05) -> None:
    """LoRA B starts at zero; give it (and A) a non-zero update so LoRA bugs show in the outputs."""
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in adapter.lora_parameters():
            p.add_(scale * torch.randn(p.shape, generator=g))


def outputs(adapter, batch, seed: int = 4) -> torch.Tensor:
    adapter.eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        latents = adapter.encode(batch["video"])
        x = torch.randn(latents.shape, generator=g)
        sigma = torch.rand(latents.shape[0], latents.shape[2], generator=g) * 0.8 + 0.1
        return adapter(x, sigma, adapter.prepare_conditions(batch))


def ids(params) -> set[int]:
    return {id(p) for p in params}


def test_enable_lora_trains_only_lora_and_starts_at_the_base_model():
    a = plain()
    batch = contract.make_batch(a, num_frames=9, height=32, width=32)
    base_out = outputs(a, batch)
    a.enable_lora(LoRAConfig(**LORA))
    lora = a.lora_parameters()
    assert len(lora) == 2 * 4 * 2 * 2  # (A, B) x 4 targets x (attn1, attn2) x 2 blocks
    assert ids(p for p in a.parameters() if p.requires_grad) == ids(lora)
    assert ids(a.trainable_parameters()) == ids(lora) and len(a.trainable_parameters()) == len(lora)
    # B is zero-initialised: the LoRA model is exactly the base model.
    assert torch.equal(outputs(a, batch), base_out)
    # The flow map's r-embedding trains too.
    a.enable_flow_map(0.25)
    assert ids(a.trainable_parameters()) == ids(lora) | ids(a.delta_embedding.parameters())
    with pytest.raises(AdapterError, match="already enabled"):
        a.enable_lora(LORA)
    with pytest.raises(AdapterError, match="not_a_module"):
        plain().enable_lora({"rank": 2, "target_modules": ["not_a_module"]})
    # One string is a full-match regex over module names: here self-attention q and v only.
    b = plain()
    b.enable_lora({"rank": 2, "target_modules": r"blocks\.\d+\.attn1\.(to_q|to_v)"})
    names = [n for n, _ in b.transformer.named_parameters() if ".lora_" in n]
    assert len(names) == 2 * 2 * 2 and all(".attn1.to_q." in n or ".attn1.to_v." in n for n in names)


@pytest.mark.slow
def test_one_bidirectional_step_changes_only_lora():
    torch.manual_seed(0)
    a = Wan22TI2V5BAdapter(config=Wan22TI2V5BConfig.tiny(), lora=LoRAConfig(**LORA))
    module = BidirectionalModule(a, timestep_sampling="uniform")
    optimizer = module.configure_optimizers()["optimizer"]
    assert ids(p for group in optimizer.param_groups for p in group["params"]) == ids(a.lora_parameters())
    before = {k: v.clone() for k, v in a.state_dict().items()}
    batch = contract.make_batch(a, num_frames=9, height=32, width=32, batch=2)
    loss, _ = module.flow_loss(batch)
    loss.backward()
    optimizer.step()
    after = a.state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all(".lora_" in k for k in changed), sorted(changed)[:5]
    assert any(".lora_B." in k for k in changed)


@pytest.mark.slow
def test_export_round_trip_merge_and_state_dict(tmp_path):
    a = plain()
    a.enable_lora(LORA)
    perturb_lora(a)
    a.enable_flow_map(0.25)
    batch = contract.make_batch(a, num_frames=9, height=32, width=32)
    expected = outputs(a, batch)
    assert not torch.allclose(expected, outputs(plain(), batch), atol=1e-4)  # the LoRA does something

    export = a.save_adapter(tmp_path / "lora_export", stage="tf_anyflow")
    meta = json.loads((export / "adapter.json").read_text())
    assert meta["lora"] == {"rank": 4, "alpha": 4, "target_modules": LORA["target_modules"], "dropout": 0.0}
    assert (export / "lora" / "pytorch_lora_weights.safetensors").is_file()
    base_keys = set(load_file(str(export / "transformer" / "diffusion_pytorch_model.safetensors")))
    assert "blocks.0.attn1.to_q.weight" in base_keys and not any("lora" in k or "base_layer" in k for k in base_keys)
    loaded = load_adapter(export)
    assert loaded.lora_config == a.lora_config
    torch.testing.assert_close(outputs(loaded, batch), expected, rtol=0, atol=0)
    assert ids(loaded.trainable_parameters()) == ids(loaded.lora_parameters()) | ids(
        loaded.delta_embedding.parameters()
    )

    merged_dir = a.save_adapter(tmp_path / "merged", stage="tf_anyflow", merge_lora=True)
    assert not (merged_dir / "lora").exists() and "lora" not in json.loads((merged_dir / "adapter.json").read_text())
    assert not any("lora" in str(p.relative_to(merged_dir)) for p in merged_dir.rglob("*"))
    merged = load_adapter(merged_dir)
    assert merged.lora_config is None and not merged.lora_parameters()
    torch.testing.assert_close(outputs(merged, batch), expected, rtol=0, atol=1e-5)
    torch.testing.assert_close(outputs(a, batch), expected, rtol=0, atol=0)  # the merged export left `a` as it was

    # State dicts by key (Lightning checkpoints, `init_from`, DMD's `init_from.score`): LoRA into LoRA ...
    other = plain(seed=3)
    other.enable_lora(LORA)
    other.enable_flow_map(0.25)
    load_adapter_weights(other, export)
    reference = a.state_dict()
    assert set(other.state_dict()) == set(reference)
    assert all(torch.equal(v, reference[k]) for k, v in other.state_dict().items())
    # ... a LoRA export into a plain adapter (merged on the way) ...
    flat = plain(seed=3)
    flat.enable_flow_map(0.25)
    load_adapter_weights(flat, export)
    torch.testing.assert_close(outputs(flat, batch), expected, rtol=0, atol=1e-5)
    # ... plain weights into a LoRA adapter as its base (the LoRA stays at its zero update) ...
    fresh = plain(seed=5)
    fresh.enable_lora(LORA)
    fresh.enable_flow_map(0.25)
    load_adapter_weights(fresh, merged_dir)
    torch.testing.assert_close(outputs(fresh, batch), outputs(merged, batch), rtol=0, atol=0)
    # ... and a LoRA checkpoint into a plain adapter is refused with a hint.
    ckpt = tmp_path / "lora.ckpt"
    torch.save({"state_dict": {f"adapter.{k}": v for k, v in a.state_dict().items()}}, ckpt)
    with pytest.raises(StageCheckpointError, match="LoRA"):
        load_adapter_weights(flat, ckpt)

    # In-place merge: a plain diffusers transformer with the same outputs.
    a.merge_lora()
    assert a.lora_config is None and not a.lora_parameters()
    assert not any("lora" in k or "base_layer" in k for k in a.transformer.state_dict())
    torch.testing.assert_close(outputs(a, batch), expected, rtol=0, atol=1e-5)


@pytest.mark.slow
def test_deepcopy_dmd_roles_and_causal_cache_with_lora():
    from solarwm.stages.dmd import DMDModule

    a = plain()
    a.enable_lora(LORA)
    perturb_lora(a)
    batch = contract.make_batch(a, num_frames=4 * 5 + 1, height=32, width=32)  # 6 latent frames = 2 blocks
    contract.check_cache_exact(a, batch)
    contract.check_teacher_forcing_matches_rollout(a, batch)

    shared = {id(m): m for m in a.frozen_parts().values()}
    twin = copy.deepcopy(a, memo=dict(shared))
    assert twin.codec is a.codec and twin.lora_config == a.lora_config
    torch.testing.assert_close(outputs(twin, batch), outputs(a, batch), rtol=0, atol=0)
    assert not ids(twin.trainable_parameters()) & ids(a.parameters())
    assert ids(twin.trainable_parameters()) == ids(twin.lora_parameters())

    dmd = DMDModule(adapter=a, guidance_scale=0.0)
    student, critic = dmd.configure_optimizers()
    params = [ids(p for g in opt.param_groups for p in g["params"]) for opt in (student, critic)]
    assert params[0] == ids(dmd.generator.lora_parameters()) and params[1] == ids(dmd.fake_score.lora_parameters())
    assert not dmd.real_score.trainable_parameters()


@pytest.mark.slow
def test_recipe_with_lora_parses(tmp_path):
    from solarwm.train_cli import parse_recipe

    # An overlay composing the shipped recipe, as a user's own recipe would.
    recipe = {
        "compose": [str(Path(__file__).parents[2] / "recipes" / "tiny_bid.yaml")],
        "root": str(tmp_path),
        "model": {"init_args": {"adapter": {"init_args": {"lora": dict(LORA)}}}},
    }
    path = tmp_path / "tiny_bid_lora.yaml"
    path.write_text(yaml.safe_dump(recipe))
    config = parse_recipe(str(path))
    lora = config.model.init_args.adapter.init_args.lora
    assert LoRAConfig(**vars(lora)) == LoRAConfig(**LORA)
    recipe["model"]["init_args"]["adapter"]["init_args"]["lora"] = {
        "rank": 8,
        "target_modules": r"blocks\.\d+\.ffn\.net\.2",
    }
    path.write_text(yaml.safe_dump(recipe))
    lora = parse_recipe(str(path)).model.init_args.adapter.init_args.lora
    assert LoRAConfig(**vars(lora)) == LoRAConfig(rank=8, target_modules=r"blocks\.\d+\.ffn\.net\.2", alpha=None)


@pytest.mark.slow
def test_route_contract_lora_check(tmp_path):
    a = plain()
    batch = contract.make_batch(a, num_frames=4 * 5 + 1, height=32, width=32)
    contract.check_lora(a, batch, tmp_path, LORA)


@pytest.mark.slow
def test_fit_stage1_and_stage2_with_lora_through_the_cli(tmp_path):
    """`solarwm fit` of 2 steps of stage 1 and stage 2 with `lora:`: EMA, export and init_from see only the LoRA."""
    from solarwm.stages.checkpoints import ema_shadow, read_checkpoint
    from solarwm.train_cli import main

    from runs import tiny_recipe as _tiny_recipe

    bid = _tiny_recipe(tmp_path / "bid", lora=dict(LORA))
    assert main(["fit", "--config", str(bid)]) == 0
    shadow = ema_shadow(read_checkpoint(tmp_path / "bid" / "checkpoints" / "last.ckpt"))
    assert shadow and all(".lora_" in k for k in shadow)
    tf = _tiny_recipe(tmp_path / "tf", recipe="tiny_tf.yaml", corpus=tmp_path / "bid" / "corpus", lora=dict(LORA))
    doc = yaml.safe_load(tf.read_text())
    doc["model"]["init_args"]["init_from"] = str(tmp_path / "bid" / "adapter")
    tf.write_text(yaml.safe_dump(doc))
    assert main(["fit", "--config", str(tf)]) == 0
    stage2 = load_adapter(tmp_path / "tf" / "adapter")
    assert stage2.lora_config == LoRAConfig(**LORA) and stage2.flow_map_gate == 0.25
    assert ids(stage2.trainable_parameters()) == ids(stage2.lora_parameters()) | ids(
        stage2.delta_embedding.parameters()
    )
    # Stage 2 trained the LoRA on top of stage 1's base, which stayed bit-identical.
    stage1 = load_adapter(tmp_path / "bid" / "adapter").transformer.state_dict()
    for key, value in stage2.transformer.state_dict().items():
        if ".lora_" not in key:
            assert torch.equal(value, stage1[key]), key
