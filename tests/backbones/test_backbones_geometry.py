"""Latent geometry, codecs, text encoders and the published-size config of the wan22_ti2v_5b route."""

import dataclasses
import subprocess
import sys

import pytest
import torch

from solarwm.backbones.base import AdapterError, route_class
from solarwm.backbones.codecs import CodecError, PatchifyCodec, WanVAECodec
from solarwm.backbones.text import HashingTextEncoder, TextEncoderError, UMT5TextEncoder
from solarwm.backbones.wan22_ti2v_5b import (
    TINY_WAN_VAE_CONFIG,
    WAN22_VAE_CONFIG,
    Wan22TI2V5BAdapter,
    Wan22TI2V5BConfig,
)


@pytest.fixture(scope="module")
def adapter():
    torch.manual_seed(0)
    return Wan22TI2V5BAdapter(Wan22TI2V5BConfig.tiny())


def test_route_registry_resolves_the_class():
    assert route_class("wan22_ti2v_5b") is Wan22TI2V5BAdapter
    with pytest.raises(AdapterError, match="unknown backbone route 'nope'"):
        route_class("nope")


def test_latent_geometry_follows_wan_4n_plus_1(adapter):
    assert (adapter.temporal_compression, adapter.spatial_compression, adapter.patch_size) == (4, 2, 2)
    assert [adapter.valid_num_frames(n) for n in (1, 4, 5, 8, 9, 17, 81)] == [
        True,
        False,
        True,
        False,
        True,
        True,
        True,
    ]
    assert [adapter.latent_frames(n) for n in (1, 5, 17, 81)] == [1, 2, 5, 21]
    assert adapter.latent_to_pixel_frame(5).tolist() == [0, 4, 8, 12, 16]
    assert adapter.latent_to_pixel_frame(5).dtype == torch.long
    with pytest.raises(AdapterError, match="16 frames is not a valid clip length"):
        adapter.latent_frames(16)


def test_patchify_codec_is_an_exact_inverse_and_matches_the_geometry(adapter):
    codec = PatchifyCodec(spatial=2, temporal=4)
    video = torch.rand(2, 3, 17, 64, 64) * 2 - 1
    latents = codec.encode(video)
    assert latents.shape == (2, 48, 5, 32, 32) == (2, adapter.latent_channels, adapter.latent_frames(17), 32, 32)
    assert torch.equal(codec.decode(latents), video)
    # Latent frame i stands for pixel frame 4i: its last temporal slot is that frame.
    slots = latents.reshape(2, 3, 4, 2, 2, 5, 32, 32) / codec.scale
    for i, frame in enumerate(adapter.latent_to_pixel_frame(5).tolist()):
        assert torch.equal(slots[:, :, 3, 0, 0, i], video[:, :, frame, ::2, ::2])
    assert PatchifyCodec(spatial=4, temporal=4).encode(video).shape == (2, 192, 5, 16, 16)
    # The first frame alone encodes to exactly the first latent of the clip (causal rule).
    assert torch.equal(codec.encode(video[:, :, :1]), latents[:, :, :1])
    with pytest.raises(CodecError, match="16 frames is not 4\\*n \\+ 1"):
        codec.encode(video[:, :, :16])


def test_tiny_wan_vae_encode_decode_shapes():
    from diffusers import AutoencoderKLWan

    torch.manual_seed(0)
    codec = WanVAECodec(AutoencoderKLWan(**TINY_WAN_VAE_CONFIG)).eval()
    assert (codec.temporal_compression, codec.spatial_compression) == (4, 16)
    with torch.no_grad():
        latents = codec.encode(torch.rand(1, 3, 5, 32, 32) * 2 - 1)
        assert latents.shape == (1, 16, 2, 2, 2)
        video = codec.decode(latents)
    assert video.shape == (1, 3, 5, 32, 32) and video.abs().max() <= 1.0


def test_wan22_vae_config_has_the_real_48_channel_normalisation():
    assert WAN22_VAE_CONFIG["z_dim"] == 48 and WAN22_VAE_CONFIG["is_residual"] is True
    assert len(WAN22_VAE_CONFIG["latents_mean"]) == len(WAN22_VAE_CONFIG["latents_std"]) == 48
    assert min(WAN22_VAE_CONFIG["latents_std"]) > 0


def test_published_config_is_5_00b_parameters_on_the_meta_device():
    config = dataclasses.replace(Wan22TI2V5BConfig.published(), text_encoder="none")
    adapter = Wan22TI2V5BAdapter(config, device="meta")
    tcfg = adapter.transformer.config
    assert (tcfg.num_layers, tcfg.num_attention_heads, tcfg.attention_head_dim) == (30, 24, 128)
    assert (tcfg.ffn_dim, tcfg.in_channels, tcfg.out_channels, tcfg.text_dim) == (14336, 48, 48, 4096)
    assert tuple(tcfg.patch_size) == (1, 2, 2)
    assert adapter.latent_channels == 48 and adapter.spatial_compression == 16 and adapter.shift == 5.0
    params = sum(p.numel() for p in adapter.transformer.parameters())
    assert round(params / 1e9, 2) == 5.00
    assert all(p.device.type == "meta" for p in adapter.transformer.parameters())


@pytest.mark.slow
def test_hashing_text_encoder_is_deterministic_across_processes():
    enc = HashingTextEncoder(dim=8, max_length=6)
    embeds, mask = enc(["A red cube on grass", "a red cube on grass!", "blue sphere"])
    assert embeds.shape == (3, 6, 8) and mask.sum(1).tolist() == [5, 5, 2]
    assert torch.equal(embeds[0], embeds[1])  # case and punctuation do not matter
    assert not torch.equal(embeds[0], embeds[2])
    assert embeds[2, 2:].abs().sum() == 0  # padding is zero, as Wan feeds it
    code = (
        "from solarwm.backbones.text import HashingTextEncoder;"
        "e,_=HashingTextEncoder(dim=8,max_length=6)(['A red cube on grass']);print(repr(e.flatten().tolist()))"
    )
    other = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env={"PYTHONHASHSEED": "123"}
    )
    assert eval(other.stdout) == embeds[0].flatten().tolist()


def test_umt5_text_encoder_missing_path_is_a_clear_error(tmp_path):
    with pytest.raises(TextEncoderError, match="UMT5 text encoder folder not found"):
        UMT5TextEncoder(tmp_path / "nope")
    with pytest.raises(TextEncoderError, match="config.json missing"):
        UMT5TextEncoder(tmp_path)
    with pytest.raises(AdapterError, match="text_encoder='umt5' needs text_encoder_path"):
        Wan22TI2V5BAdapter(dataclasses.replace(Wan22TI2V5BConfig.tiny(), text_encoder="umt5"))


def test_umt5_text_encoder_loads_a_local_folder_end_to_end(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, UMT5Config, UMT5EncoderModel

    # A diffusers-style folder with a tiny random UMT5 and a word-level tokenizer (nothing downloaded).
    tok = Tokenizer(
        models.WordLevel({"<pad>": 0, "</s>": 1, "<unk>": 2, "a": 3, "red": 4, "cube": 5}, unk_token="<unk>")
    )
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="</s>", unk_token="<unk>"
    ).save_pretrained(tmp_path / "tokenizer")
    UMT5EncoderModel(UMT5Config(vocab_size=8, d_model=16, d_kv=4, d_ff=32, num_layers=1, num_heads=2)).save_pretrained(
        tmp_path / "text_encoder"
    )
    cfg = dataclasses.replace(
        Wan22TI2V5BConfig.tiny(), text_encoder="umt5", text_encoder_path=str(tmp_path), text_dim=16, text_max_length=6
    )
    adapter = Wan22TI2V5BAdapter(cfg)
    embeds, mask = adapter.text_features({"caption": ["a red cube", "cube"]})
    assert embeds.shape == (2, 6, 16) and mask.sum(1).tolist() == [3, 1]
    assert embeds[1, 1:].abs().sum() == 0 and embeds[1, 0].abs().sum() > 0
    assert not any(p.requires_grad for p in adapter.text_encoder.parameters())
