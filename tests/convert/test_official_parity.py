"""Converted official packages compute what the official Wan code computes (tiny configs, random weights, fp32)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch

from solarwm.backbones.base import load_adapter, read_adapter_json
from solarwm.cli import main
from solarwm.convert import convert_official, sha256_file

from official_packages import TINY_ARCH

F, H, W = 3, 8, 12  # latent frames and size: 3 x 4 x 6 = 72 tokens


def _inputs(seed: int = 1) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
    """Latents ``[1, 48, F, H, W]``, text ``[1, text_len, text_dim]`` (padding zeroed) and one camera for all frames.

    With one camera for every frame PRoPE's matrices cancel (Pᵢ Pⱼ⁻¹ = I), so our PRoPE attention must equal the
    official model's plain attention: what is compared is the key mapping and the block math.
    """
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(1, 48, F, H, W, generator=g)
    text = torch.randn(1, TINY_ARCH["text_len"], TINY_ARCH["text_dim"], generator=g)
    text[:, 5:] = 0.0  # positions past the prompt are zeros, as the official text path feeds them
    pose = torch.eye(4, dtype=torch.float64)
    pose[:3, 3] = torch.tensor([0.3, -0.2, 1.5], dtype=torch.float64)
    cond = {"text_embeds": text, "text_mask": None, "c2w": pose.expand(1, F, 4, 4).clone(),
            "K": torch.tensor([20.0, 21.0, 12.0, 8.0]).expand(1, F, 4).clone(), "image_size": (2 * W, 2 * H),
            "num_frames": 4 * (F - 1) + 1}
    return x, text, cond


def _official(model: torch.nn.Module, x: torch.Tensor, t_per_frame: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
    """``WanModel.forward`` with per-token timesteps ``[1, seq_len]`` (each frame's t on its tokens)."""
    tokens = (H // 2) * (W // 2)
    with torch.no_grad():
        return model([x[0]], t_per_frame.repeat_interleave(tokens, dim=1), [text[0]], F * tokens)[0][None]


def test_stage0p5_ema_and_live_match_wan_model(tiny_packages, tmp_path) -> None:
    """Both roles convert; each equals the official WanModel it came from within 1e-4 (measured ~5e-6)."""
    x, text, cond = _inputs()
    t = torch.tensor([[0.0, 937.5, 625.0]])  # the image latent at t = 0, per-frame timesteps
    for role, model in (("ema", tiny_packages["ema_model"]), ("live", tiny_packages["live_model"])):
        out = tmp_path / role
        convert_official(tiny_packages["stage0p5"], out, weights=role, architecture=tiny_packages["architecture"])
        adapter = load_adapter(out).eval()
        with torch.no_grad():
            ours = adapter(x, t / 1000.0, cond)
        ref = _official(model, x, t, text)
        err = (ours - ref).abs().max().item()
        assert err < 1e-4, f"{role}: max |ours - WanModel| = {err:.2e}"
        assert ref.abs().max().item() > 0.5  # a real signal, not two zeros
        meta = read_adapter_json(out)
        assert meta["stage"] == "bidirectional" and meta["source"]["role"] == role
        assert meta["source"]["field"] == {"ema": "generator_ema", "live": "generator"}[role]


def test_stage2_package_through_the_cli_feeds_bf16_timesteps(tiny_packages, tmp_path, capsys) -> None:
    """The ``model.`` prefix is stripped, the release manifest's role is used, sha256 and step are recorded, and
    the converted student sees bf16-rounded timesteps as the official stage-2 sampler feeds them."""
    out = tmp_path / "sgf"
    assert main(["convert", "official", str(tiny_packages["stage2"]), "--out", str(out),
                 "--architecture", tiny_packages["architecture"]]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    meta = read_adapter_json(out)
    assert summary["stage"] == meta["stage"] == "dmd"
    assert meta["source"]["role"] == "ema" and meta["source"]["step"] == 1200
    assert meta["source"]["model_pt_sha256"] == sha256_file(tiny_packages["stage2"] / "model.pt")
    config = meta["config"]
    assert (config["latent_camera"], config["intrinsics"], config["timestep_rounding"]) == (
        "group_first", "wan_fixed", "bfloat16")
    assert "flow_map_gate" not in meta and not (out / "flow_map.safetensors").exists()
    assert sorted(p.name for p in out.iterdir()) == ["adapter.json", "camera.safetensors", "transformer"]
    assert all(p.suffix != ".bin" for p in (out / "transformer").iterdir())  # safetensors only
    x, text, cond = _inputs(2)
    t = torch.tensor([[0.0, 937.5, 833.3333]])
    adapter = load_adapter(out).eval()
    with torch.no_grad():
        ours = adapter(x, t / 1000.0, cond)
    rounded = t.to(torch.bfloat16).float()  # 0, 936, 832
    assert rounded[0, 1].item() == 936.0
    err = (ours - _official(tiny_packages["ema_model"], x, rounded, text)).abs().max().item()
    assert err < 1e-4, f"max |ours - WanModel(bf16 t)| = {err:.2e}"
    exact = (ours - _official(tiny_packages["ema_model"], x, t, text)).abs().max().item()
    assert exact > 10 * err  # the rounding is visible: the setting is what makes the two agree


def _official_anyflow(model: torch.nn.Module, delta: torch.nn.Module, module: Any, x: torch.Tensor,
                      t: torch.Tensor, r: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
    """The official AnyFlow forward from WanModel's parts: ``e = 0.75·time_embedding(sin t) + 0.25·delta(sin r)``
    before ``time_projection``, feeding every block and the head (3a1b2c3/SolarWM
    ``src/solarwm/backends/wan22/modeling/causal_model.py``)."""
    tokens = (H // 2) * (W // 2)
    seq = F * tokens
    t_tok, r_tok = t.repeat_interleave(tokens, dim=1).flatten(), r.repeat_interleave(tokens, dim=1).flatten()
    with torch.no_grad():
        h = model.patch_embedding(x)
        grid = torch.tensor([h.shape[2:]], dtype=torch.long)
        h = h.flatten(2).transpose(1, 2)
        sin_t = module.sinusoidal_embedding_1d(model.freq_dim, t_tok).unflatten(0, (1, seq)).float()
        sin_r = module.sinusoidal_embedding_1d(model.freq_dim, r_tok).unflatten(0, (1, seq)).float()
        e = 0.75 * model.time_embedding(sin_t) + 0.25 * delta(sin_r)
        e0 = model.time_projection(e).unflatten(2, (6, model.dim))
        context = model.text_embedding(text)
        for block in model.blocks:
            h = block(h, e=e0, seq_lens=torch.tensor([seq]), grid_sizes=grid, freqs=model.freqs,
                      context=context, context_lens=None)
        h = model.head(h, e)
        return model.unpatchify(h, grid)[0][None]


def test_stage1_flow_map_equals_official_anyflow_mixing(tiny_packages, tmp_path) -> None:
    """The stage-1 delta lands in our flow map (gate 0.25): u(x, t, r) equals the official mixing from parts."""
    out = tmp_path / "tf"
    convert_official(tiny_packages["stage1"], out, architecture=tiny_packages["architecture"])
    meta = read_adapter_json(out)
    assert meta["stage"] == "tf_anyflow" and meta["flow_map_gate"] == 0.25
    adapter = load_adapter(out).eval()
    model = tiny_packages["ema_model"]
    delta = torch.nn.Sequential(torch.nn.Linear(model.freq_dim, model.dim), torch.nn.SiLU(),
                                torch.nn.Linear(model.dim, model.dim))
    delta.load_state_dict({k[len("delta_embedding."):]: v for k, v in tiny_packages["delta"].items()})
    x, text, cond = _inputs(3)
    t = torch.tensor([[0.0, 937.5, 833.3333]])
    r = torch.tensor([[0.0, 833.3333, 625.0]])  # clean rows r = t
    with torch.no_grad():
        ours = adapter(x, t / 1000.0, cond, r_per_frame=r / 1000.0)
    ref = _official_anyflow(model, delta, tiny_packages["module"], x, t, r, text)
    err = (ours - ref).abs().max().item()
    assert err < 1e-4, f"max |ours - official AnyFlow| = {err:.2e}"
    # r != t matters: without the delta's input the output differs (the comparison is not vacuous).
    with torch.no_grad():
        same = adapter(x, t / 1000.0, cond, r_per_frame=t / 1000.0)
    assert (same - ref).abs().max().item() > 10 * err


def test_stage2_block_equals_the_official_sampler_on_wan_model(tiny_packages, tmp_path) -> None:
    """One causal block of our ``renoise`` rollout on the converted student equals the official stage-2 sampler
    written with WanModel (Junchao-cs/SolarWM ``src/solarwm/backends/wan22/runtime/stage2.py``): t = [1000, 937.5,
    833.3, 625] fed as bf16, x0 = x - σ(bf16 t)·v, fresh noise to the exact next t, the image latent at t = 0."""
    from solarwm.rollout.engine import Rollout, few_step_sigmas

    out = tmp_path / "sgf"
    convert_official(tiny_packages["stage2"], out, architecture=tiny_packages["architecture"])
    adapter = load_adapter(out).eval()
    sigmas = few_step_sigmas(4, adapter.shift)
    assert torch.allclose(sigmas * 1000, torch.tensor([1000.0, 937.5, 833.3333, 625.0, 0.0]))
    _, text, cond = _inputs(4)
    anchor = torch.randn(1, 48, 1, H, W, generator=torch.Generator().manual_seed(5))
    block = Rollout(adapter, 4, "renoise").block(cond, anchor, slice(0, F), adapter.new_cache(H, W),
                                                 torch.Generator().manual_seed(6))
    model, g = tiny_packages["ema_model"], torch.Generator().manual_seed(6)
    x = torch.randn(1, 48, F, H, W, generator=g)
    x[:, :, :1] = anchor
    for k in range(4):
        t = (sigmas[k] * 1000).to(torch.bfloat16).float()
        v = _official(model, x, torch.tensor([[0.0] + [t.item()] * (F - 1)]), text)
        x0 = x - (t / 1000) * v
        x0[:, :, :1] = anchor
        if k < 3:
            x = (1 - sigmas[k + 1]) * x0 + sigmas[k + 1] * torch.randn(x.shape, generator=g)
            x[:, :, :1] = anchor
    err = (block.x0 - x0).abs().max().item()
    assert err < 1e-4, f"max |our block - official sampler| = {err:.2e}"
    assert adapter.sampler_sigma(torch.tensor(0.9375)).item() == pytest.approx(0.936, abs=1e-7)


def test_the_published_5b_layout_fills_the_published_model_on_meta(wan_model_module) -> None:
    """825 official keys (829 with the stage-1 delta) map one to one onto the published 5B WanTransformer3DModel
    (checked on the meta device: no weights allocated); the table agrees with the official WanModel's own keys."""
    from diffusers import WanTransformer3DModel

    from solarwm.backbones.official import PUBLISHED_5B, convert_state, official_shapes, resolve_architecture
    from solarwm.convert import route_config

    arch = resolve_architecture(None)
    shapes = official_shapes(arch, delta=True)
    assert len(official_shapes(arch)) == 825 and len(shapes) == 829
    with torch.device("meta"):
        ours = WanTransformer3DModel(**route_config(arch, "tf_anyflow", None).transformer_kwargs(48, 48))
        official = wan_model_module.WanModel(
            model_type="ti2v", patch_size=tuple(PUBLISHED_5B["patch_size"]), text_len=512, in_dim=48, dim=3072,
            ffn_dim=14336, freq_dim=256, text_dim=4096, out_dim=48, num_heads=24, num_layers=30)
    assert {k: tuple(v.shape) for k, v in official.state_dict().items()} == official_shapes(arch)
    state = {k: torch.empty(v, device="meta") for k, v in shapes.items()}
    expected = {k: v.shape for k, v in ours.state_dict().items()}
    delta_expected = {k: v.shape for k, v in ours.condition_embedder.time_embedder.state_dict().items()}
    transformer, delta = convert_state(state, expected, delta_expected, "published")
    assert len(transformer) == len(expected) == 825 and len(delta) == 4
    assert sum(v.numel() for v in transformer.values()) == sum(p.numel() for p in ours.parameters())
