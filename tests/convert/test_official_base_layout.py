"""The release's base folder in its original layout: ``solarwm convert official-base`` and ``pretrained_path``."""

from __future__ import annotations

import json
from pathlib import Path

import torch

import solarwm.convert as convert
from solarwm.backbones import official_base
from solarwm.backbones.base import load_adapter, read_adapter_json
from solarwm.backbones.wan22_ti2v_5b import Wan22TI2V5BAdapter, Wan22TI2V5BConfig
from solarwm.cli import main

from official_packages import TINY_ARCH


def test_official_base_converts_to_a_diffusers_layout(tiny_official_base, tmp_path, capsys) -> None:
    """vae/, text_encoder/ (bf16 .pth kept bf16), tokenizer/, transformer/: each part equals its original."""
    out = tmp_path / "base-diffusers"
    assert main(["convert", "official-base", str(tiny_official_base["root"]), "--out", str(out),
                 "--architecture", tiny_official_base["architecture"], "--vae_config", "tiny48"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["transformer"] is True
    from diffusers import AutoencoderKLWan, WanTransformer3DModel
    from transformers import UMT5EncoderModel

    vae = AutoencoderKLWan.from_pretrained(out / "vae", use_safetensors=True).eval()
    x = torch.rand(1, 3, 5, 32, 32, generator=torch.Generator().manual_seed(0)) * 2 - 1
    with torch.no_grad():
        assert torch.allclose(vae.encode(x).latent_dist.mean, tiny_official_base["vae"].encode(x, [0, 1]), atol=1e-5)
    t5 = UMT5EncoderModel.from_pretrained(out / "text_encoder", use_safetensors=True).eval()
    ids = torch.tensor([[3, 4, 5, 1]])
    with torch.no_grad():
        ref = tiny_official_base["t5"].to(torch.bfloat16)(ids, torch.ones_like(ids)).float()
        ours = t5.to(torch.bfloat16)(input_ids=ids, attention_mask=torch.ones_like(ids)).last_hidden_state.float()
    assert (ref - ours).abs().max().item() < 0.05 * ref.abs().max().item()  # bf16 end to end: rounding only
    transformer = WanTransformer3DModel.from_pretrained(out / "transformer", use_safetensors=True)
    assert torch.equal(transformer.state_dict()["blocks.1.norm2.weight"],
                       tiny_official_base["model"].state_dict()["blocks.1.norm3.weight"])
    assert (out / "tokenizer" / "tokenizer.json").is_file()
    assert not list(tmp_path.glob(".base-diffusers.*"))


def test_pretrained_path_takes_the_original_layout_once(tiny_official_base, tmp_path, monkeypatch) -> None:
    """The route reads an original-layout base through a cache made on first use and reused on the next build."""
    monkeypatch.setenv("SOLARWM_CACHE", str(tmp_path / "cache"))
    calls = []
    real = official_base.convert_official_base
    monkeypatch.setattr(official_base, "convert_official_base", lambda *a, **k: calls.append(a) or real(*a, **k))
    config = Wan22TI2V5BConfig(
        num_layers=2, num_attention_heads=2, attention_head_dim=32, ffn_dim=96, text_dim=24, freq_dim=32,
        codec="wan_vae", vae_config="tiny48", text_encoder="umt5", text_max_length=8, shift=5.0,
        prediction="velocity", latent_camera="group_first", intrinsics="wan_fixed",
    )
    # The cache converts transformer/ at the published size; this base is tiny, so the tiny architecture stands in.
    monkeypatch.setattr(official_base, "architecture_from_json", lambda a: convert.resolve_architecture(TINY_ARCH))
    first = Wan22TI2V5BAdapter(config=config, pretrained_path=str(tiny_official_base["root"]))
    second = Wan22TI2V5BAdapter(config=config, pretrained_path=str(tiny_official_base["root"]))
    assert len(calls) == 1
    assert Path(first.config.text_encoder_path).parent.name == "official-base"
    embeds, mask = second.text_encoder(["a room with red walls"])
    assert embeds.shape == (1, 8, 24) and mask.sum().item() == 5  # 4 words and </s>
    ref = tiny_official_base["model"].state_dict()["blocks.0.self_attn.q.weight"]
    assert torch.equal(second.transformer.state_dict()["blocks.0.attn1.to_q.weight"], ref)


def test_convert_official_with_base_ships_the_vae(tiny_official_base, tiny_packages, tmp_path) -> None:
    """``--base`` (a diffusers-layout base) puts vae/ in the export and names the UMT5 encoder: a loadable model."""
    base = tmp_path / "base"
    convert.convert_official_base(tiny_official_base["root"], base, tiny_official_base["architecture"], "tiny48")
    out = tmp_path / "export"
    convert.convert_official(tiny_packages["stage2"], out, architecture=tiny_packages["architecture"], base=str(base))
    meta = read_adapter_json(out)
    assert meta["config"]["codec"] == "wan_vae" and meta["config"]["text_encoder"] == "umt5"
    assert meta["source"]["base"] == str(base.resolve()) and (out / "vae" / "config.json").is_file()
    adapter = load_adapter(out)
    assert adapter.latent_channels == 48
    video = torch.rand(1, 3, 5, 32, 32) * 2 - 1
    assert adapter.encode(video).shape == (1, 48, 2, 2, 2)


def test_convert_official_takes_the_original_base_as_it_is(tiny_official_base, tiny_packages, tmp_path,
                                                          monkeypatch, capsys) -> None:
    """``--base`` may be the release's base folder itself: its VAE, T5 and tokenizer are converted once into the
    cache (the VAE's size read off the .pth, the base's transformer skipped), then shipped and named as above."""
    monkeypatch.setenv("SOLARWM_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "export"
    assert main(["convert", "official", str(tiny_packages["stage2"]), "--out", str(out), "--architecture",
                 tiny_packages["architecture"], "--base", str(tiny_official_base["root"])]) == 0
    meta = read_adapter_json(out)
    cache = Path(meta["source"]["base"])
    assert cache.parent == tmp_path / "cache" / "official-base" and not (cache / "transformer").exists()
    assert json.loads((cache / "solarwm-base.json").read_text())["vae_config"] == "tiny48"
    adapter = load_adapter(out)
    assert adapter.encode(torch.rand(1, 3, 5, 32, 32) * 2 - 1).shape == (1, 48, 2, 2, 2)
    embeds, _ = adapter.text_encoder(["a red room"])
    assert embeds.shape == (1, 8, 24)
