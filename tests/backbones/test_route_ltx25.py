"""The route ``ltx25`` (video-only LTX-2.5): the shared contract suite, the video path against diffusers' full
audio-visual class (loaded from an AV checkpoint, PRoPE with one shared camera = the native processor), the
published parameter count on the meta device, the codec, the text connector and the flow map."""

from __future__ import annotations

import dataclasses
import math
import shutil

import pytest
import torch

from solarwm.backbones.base import AdapterError, load_adapter, route_class
from solarwm.backbones.ltx25 import (
    TINY_LTX_VAE_CONFIG,
    LTX25Adapter,
    LTX25Config,
    LTXVAECodec,
    ltx_rope_freqs,
)
from solarwm.rollout.engine import Rollout

import route_contract as contract


def adapter(**changes) -> LTX25Adapter:
    torch.manual_seed(0)
    built = LTX25Adapter(config=dataclasses.replace(LTX25Config.tiny(), **changes))
    contract.perturb(built)
    return built


def test_geometry_8n_plus_1_and_causal_layout():
    """LTX's own numbers (the generic checks: tests/backbones/test_route_contract.py)."""
    a = adapter()
    assert route_class("ltx25") is LTX25Adapter
    assert (a.temporal_compression, a.frames_per_block, a.window_blocks, a.clean_latent_frames) == (8, 2, 6, 1)
    batch = contract.make_batch(a, num_frames=8 * 5 + 1, height=32, width=32)  # 6 latent frames = 3 blocks
    latents = contract.check_geometry(a, batch)
    assert latents.shape == (1, 384, 6, 8, 8)
    assert a.latent_to_pixel_frame(6).tolist() == [0, 8, 16, 24, 32, 40]
    assert a.valid_num_frames(121) and not a.valid_num_frames(81 + 4)
    with pytest.raises(AdapterError, match="8\\*n \\+ 1"):
        a.latent_frames(20)


@pytest.mark.slow
def test_contract_lora(tmp_path):
    a = adapter()
    batch = contract.make_batch(a, num_frames=8 * 3 + 1, height=32, width=32)  # 4 latents = 2 blocks
    lora = {"rank": 4, "alpha": 4, "target_modules": ["to_q", "to_k", "to_v", "to_out.0"], "dropout": 0.0}
    contract.check_lora(a, batch, tmp_path, lora)


@pytest.mark.slow
def test_flow_map_teacher_forcing_matches_rollout_and_export(tmp_path):
    """With the AnyFlow r-embedding (r != t) teacher forcing still equals the cached rollout; r = t is a no-op."""
    a = adapter()
    batch = contract.make_batch(a, num_frames=8 * 3 + 1, height=32, width=32)  # 4 latents = 2 blocks
    a.eval()
    with torch.no_grad():
        clean = a.encode(batch["video"])
        cond = a.prepare_conditions(batch)
        g = torch.Generator().manual_seed(5)
        noisy = torch.randn(clean.shape, generator=g)
        sigma = torch.rand(1, 4, generator=g) * 0.8 + 0.1
        before = a(noisy, sigma, cond)
        a.enable_flow_map(0.25)
        torch.testing.assert_close(a(noisy, sigma, cond, r_per_frame=sigma), before)
        r = sigma * 0.5
        tf = a.forward_teacher_forcing(clean, noisy, sigma, cond, r_per_frame=r)
        cache, outs = a.new_cache(*clean.shape[-2:]), []
        for sl in a.block_slices(4):
            block = {k: (v[:, sl] if k in ("c2w", "K") else v) for k, v in cond.items()}
            outs.append(a(noisy[:, :, sl], sigma[:, sl], block, kv_cache=cache, r_per_frame=r[:, sl]))
            a(clean[:, :, sl], torch.zeros_like(sigma[:, sl]), block, kv_cache=cache, commit=True)
        torch.testing.assert_close(tf, torch.cat(outs, 2), atol=1e-4, rtol=1e-4)
        with torch.no_grad():
            a.delta_embedding.linear_1.weight.add_(0.1)
        expected = a(noisy, sigma, cond, r_per_frame=r)
        loaded = load_adapter(a.save_adapter(tmp_path / "export", stage="tf_anyflow")).eval()
        torch.testing.assert_close(loaded(noisy, sigma, loaded.prepare_conditions(batch), r_per_frame=r), expected)


def _gemma_features(connectors, hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """What a cache of Gemma features holds: ``LTX2TextConnectors``' projected video features (its forward up
    to ``video_text_proj_in``, per_modality_projections branch)."""
    from diffusers.pipelines.ltx2.connectors import per_token_rms_norm

    cfg = connectors.config
    normed = per_token_rms_norm(hidden.unflatten(2, (cfg.caption_channels, -1))).flatten(2, 3)
    normed = torch.where(mask.bool().unsqueeze(-1), normed, torch.zeros_like(normed))
    return connectors.video_text_proj_in(normed * math.sqrt(cfg.video_hidden_dim / cfg.caption_channels))


def test_video_path_equals_the_audio_visual_class_and_prope_equals_native_with_one_camera(tmp_path):
    """A full AV LTX-2 checkpoint (transformer + both connectors) loads video-only; with one camera for all frames
    the route's output equals diffusers' LTX2VideoTransformer3DModel video output (isolate_modalities, native
    processors), and its text features equal LTX2TextConnectors' video output."""
    from diffusers import LTX2VideoTransformer3DModel
    from diffusers.pipelines.ltx2 import LTX2TextConnectors

    cfg = dataclasses.replace(LTX25Config.tiny(), prediction="velocity", num_layers=2)
    torch.manual_seed(0)
    av = LTX2VideoTransformer3DModel(
        **cfg.transformer_kwargs(384), audio_in_channels=8, audio_out_channels=8, audio_num_attention_heads=2,
        audio_attention_head_dim=8, audio_cross_attention_dim=16, audio_gated_attn=True, audio_cross_attn_mod=True,
    ).eval()
    connectors = LTX2TextConnectors(
        caption_channels=16, text_proj_in_factor=3, video_connector_num_attention_heads=4,
        video_connector_attention_head_dim=32, video_connector_num_layers=1, video_connector_num_learnable_registers=8,
        video_gated_attn=True, audio_connector_num_attention_heads=2, audio_connector_attention_head_dim=8,
        audio_connector_num_layers=1, audio_connector_num_learnable_registers=8, audio_gated_attn=True,
        rope_type="split", per_modality_projections=True, video_hidden_dim=128, audio_hidden_dim=16, proj_bias=True,
    ).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in list(av.parameters()) + list(connectors.parameters()):
            p.add_(0.02 * torch.randn(p.shape, generator=g))
    av.save_pretrained(tmp_path / "ckpt" / "transformer")
    connectors.save_pretrained(tmp_path / "ckpt" / "connectors")

    route = LTX25Adapter(cfg, pretrained_path=str(tmp_path / "ckpt")).eval()
    assert not any("audio" in n or "a2v" in n or "v2a" in n for n, _ in route.named_parameters())

    b, f, h, w = 2, 3, 4, 4
    batch = contract.make_batch(route, num_frames=8 * (f - 1) + 1, height=16, width=16, batch=b)
    batch["c2w"] = batch["c2w"][:, :1].expand_as(batch["c2w"]).clone()  # one shared camera
    hidden = torch.randn(b, 16, 16 * 3, generator=g)
    mask = torch.tensor([[True] * 16, [True] * 5 + [False] * 11])
    with torch.no_grad():
        batch["text_embeds"], batch["text_mask"] = _gemma_features(connectors, hidden, mask), mask
        video_text, _, text_mask = connectors(hidden, mask.long())
        cond = route.prepare_conditions(batch)
        torch.testing.assert_close(cond["text_embeds"], video_text, atol=1e-5, rtol=1e-5)
        assert cond["text_mask"].all() and text_mask.bool().all()  # registers replace padding

        x = torch.randn(b, 384, f, h, w, generator=g)
        sigma = torch.tensor([0.7, 0.3])
        ours = route(x, sigma[:, None].expand(b, f), cond)
        coords = av.rope.prepare_video_coords(b, f, h, w, x.device, fps=cfg.fps)
        native = av(
            hidden_states=x.permute(0, 2, 3, 4, 1).flatten(1, 3), audio_hidden_states=torch.randn(b, 5, 8, generator=g),
            encoder_hidden_states=video_text, audio_encoder_hidden_states=torch.randn(b, 16, 16, generator=g),
            timestep=(1000 * sigma)[:, None].expand(b, f * h * w), audio_timestep=1000 * sigma, sigma=1000 * sigma,
            encoder_attention_mask=text_mask, num_frames=f, height=h, width=w, fps=cfg.fps, audio_num_frames=5,
            video_coords=coords, isolate_modalities=True, return_dict=False,
        )[0]
    torch.testing.assert_close(ours, native.view(b, f, h, w, -1).permute(0, 4, 1, 2, 3), atol=1e-4, rtol=1e-4)

    # A moving camera changes the output (the camera is really injected).
    moving = contract.make_batch(route, num_frames=8 * (f - 1) + 1, height=16, width=16, batch=b)
    with torch.no_grad():
        moving_c2w = route.latent_cameras(moving["c2w"], moving["K"])[0]
        moved = route(x, sigma[:, None].expand(b, f), dict(cond, c2w=moving_c2w))
    assert (moved - ours).abs().max() > 1e-3


def _tiny_gemma_folder(root, connectors) -> None:
    """A local folder as the LTX-2.5 diffusers one has it: text_encoder/ (a tiny Gemma 3), tokenizer/, connectors/."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig, PreTrainedTokenizerFast

    words = ["<pad>", "<eos>", "<unk>", "<bos>", "a", "street", "walk", "through", "town", "the"]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>",
                            bos_token="<bos>").save_pretrained(root / "tokenizer")
    cfg = Gemma3TextConfig(vocab_size=16, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                           num_attention_heads=2, num_key_value_heads=1, head_dim=8, max_position_embeddings=64)
    torch.manual_seed(0)
    Gemma3ForCausalLM(cfg).save_pretrained(root / "text_encoder")
    connectors.save_pretrained(root / "connectors")


def test_gemma_features_equal_the_pipelines_prompt_encoding(tmp_path):
    """text_encoder='gemma': LTX2Pipeline's Gemma prompt encoding (left padding, all hidden states) + the
    connectors' video projection, computed online, equal what a feature cache holds; exports keep the path."""
    from diffusers.pipelines.ltx2 import LTX2TextConnectors
    from transformers import AutoTokenizer, Gemma3ForCausalLM

    connectors = LTX2TextConnectors(
        caption_channels=16, text_proj_in_factor=3, video_connector_num_attention_heads=4,
        video_connector_attention_head_dim=32, video_connector_num_layers=1, video_connector_num_learnable_registers=8,
        video_gated_attn=True, audio_connector_num_attention_heads=2, audio_connector_attention_head_dim=8,
        audio_connector_num_layers=1, audio_connector_num_learnable_registers=8, rope_type="split",
        per_modality_projections=True, video_hidden_dim=128, audio_hidden_dim=16, proj_bias=True,
    ).eval()
    _tiny_gemma_folder(tmp_path / "ltx", connectors)
    cfg = dataclasses.replace(LTX25Config.tiny(), text_encoder="gemma", text_encoder_path=str(tmp_path / "ltx"),
                              text_max_length=8)
    a = LTX25Adapter(cfg).eval()
    captions = ["a street", "walk through the town"]
    tokenizer = AutoTokenizer.from_pretrained(str(tmp_path / "ltx" / "tokenizer"))
    tokenizer.padding_side = "left"
    tok = tokenizer(captions, padding="max_length", max_length=8, truncation=True, return_tensors="pt")
    gemma = Gemma3ForCausalLM.from_pretrained(str(tmp_path / "ltx" / "text_encoder")).eval()
    with torch.no_grad():
        hidden = torch.stack(gemma(**tok, output_hidden_states=True).hidden_states, -1).flatten(2, 3)
        expected = _gemma_features(connectors, hidden, tok.attention_mask)
        features, mask = a.text_encoder(captions)
        torch.testing.assert_close(features, expected, atol=1e-5, rtol=1e-5)
        assert mask.tolist() == tok.attention_mask.bool().tolist()
        batch = contract.make_batch(a, num_frames=9, height=32, width=32, batch=2)
        batch["caption"] = captions
        from_captions = a.prepare_conditions(batch)["text_embeds"]
        cached = a.prepare_conditions(dict(batch, text_embeds=expected, text_mask=tok.attention_mask.bool()))
        torch.testing.assert_close(from_captions, cached["text_embeds"], atol=1e-5, rtol=1e-5)
    loaded = load_adapter(a.save_adapter(tmp_path / "export"))
    assert loaded.config.text_encoder_path == str((tmp_path / "ltx").resolve())
    assert not (tmp_path / "export" / "text_encoder").exists()


def test_published_count_on_the_meta_device():
    """Table 4: 14.74B video path = 13.1B video core + 1.61B frozen Gemma video connector."""
    a = LTX25Adapter(preset="published", device="meta")
    core = contract.parameter_count(a)
    connector = sum(p.numel() for p in a.connector.parameters())
    assert core == 13_123_337_344 and connector == 1_612_546_304
    assert round((core + connector) / 1e9, 2) == 14.74
    assert round(core / 1e9, 1) == 13.1 and round(connector / 1e9, 2) == 1.61
    assert {p.device.type for p in a.transformer.parameters()} == {"meta"}
    assert a.trainable_parameters() and all(not p.requires_grad for p in a.connector.parameters())
    assert (a.latent_channels, a.spatial_compression, a.temporal_compression) == (128, 32, 8)
    assert a.timestep_scale == 1000.0 and a.shift == pytest.approx(math.exp(2.05), abs=1e-3)


def test_tiny_ltx_vae_geometry_and_stream_decoder():
    """The real AutoencoderKLLTX2Video class: 8n + 1 frames -> n + 1 latents at 1/32 size, and back."""
    torch.manual_seed(0)
    codec = LTXVAECodec(__import__("diffusers").AutoencoderKLLTX2Video(**TINY_LTX_VAE_CONFIG)).eval()
    video = torch.rand(1, 3, 17, 64, 64) * 2 - 1
    with torch.no_grad():
        latents = codec.encode(video)
        assert latents.shape == (1, 16, 3, 2, 2)
        assert codec.decode(latents).shape == video.shape
        decode = codec.stream_decoder()
        blocks = [decode(latents[:, :, :2]), decode(latents[:, :, 2:])]
    assert [blk.shape[2] for blk in blocks] == [9, 8]


@pytest.mark.slow
def test_rope_positions_are_window_local_and_the_first_frame_clamp_follows_the_clip():
    """RoPE read at positions [p..] equals a clip's tables at those frames; after eviction the window shifts by one."""
    a = adapter()
    rope = a.transformer.rope
    cos, sin = ltx_rope_freqs(rope, torch.tensor([0, 1, 2, 3]), 2, 2, 24.0, 1, "cpu")
    full = rope(rope.prepare_video_coords(1, 4, 2, 2, "cpu", fps=24.0))
    torch.testing.assert_close((cos, sin), full)
    part = ltx_rope_freqs(rope, torch.tensor([2, 3]), 2, 2, 24.0, 1, "cpu")
    torch.testing.assert_close(part[0], full[0][:, :, 8:])

    # A rollout longer than the window stays finite and its cache bounded.
    rollout = Rollout(a.eval(), num_steps=1)
    frames = 8 * 15 + 1  # 16 latents = 8 blocks, window 6 blocks
    batch = contract.make_batch(a, num_frames=frames, height=32, width=32)
    cond = rollout.conditions(batch["video"][:, :, 0], batch["c2w"], batch["K"], ["a street"])
    cache = a.new_cache(8, 8)
    blocks = list(rollout.latent_blocks(cond, torch.Generator().manual_seed(0), cache=cache))
    assert len(blocks) == 8 and all(torch.isfinite(blk.x0).all() for blk in blocks)
    assert cache.frames == 10 and cache.committed_frames == 16
    # The window is read at positions 0.. while it holds the clip's first latent, 1.. once that is evicted.
    block = {k: (v[:, :2] if k in ("c2w", "K") else v) for k, v in cond.items()}
    x = torch.zeros(1, a.latent_channels, 2, 8, 8)
    assert a.cached_attention_context(x, block, a.cache_window(block, cache, 2), cache, False)[1].tolist() == [11, 12]
    fresh = a.new_cache(8, 8)
    assert a.cached_attention_context(x, block, a.cache_window(block, fresh, 2), fresh, False)[1].tolist() == [0, 1]


def test_errors_name_the_check(tmp_path):
    with pytest.raises(AdapterError, match="connector's width"):
        LTX25Adapter(dataclasses.replace(LTX25Config.tiny(), cross_attention_dim=64))
    with pytest.raises(AdapterError, match="pretrained_path .*nowhere does not exist"):
        LTX25Adapter(pretrained_path=str(tmp_path / "nowhere"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(AdapterError, match="transformer missing"):
        LTX25Adapter(pretrained_path=str(tmp_path / "empty"))
    a = adapter()
    out = a.save_adapter(tmp_path / "export")
    with pytest.raises(AdapterError, match="num_layers: checkpoint 2 != config 3"):
        LTX25Adapter(dataclasses.replace(LTX25Config.tiny(), num_layers=3), pretrained_path=str(out))
    with pytest.raises(AdapterError, match="codec: .*export has 'patchify', the config 'ltx_vae'"):
        LTX25Adapter(dataclasses.replace(LTX25Config.tiny(), codec="ltx_vae"), pretrained_path=str(out))
    diffusers_layout = tmp_path / "diffusers"  # no adapter.json: the missing part is what gets named
    shutil.copytree(out, diffusers_layout, ignore=shutil.ignore_patterns("adapter.json"))
    with pytest.raises(AdapterError, match="vae missing"):
        LTX25Adapter(dataclasses.replace(LTX25Config.tiny(), codec="ltx_vae"), pretrained_path=str(diffusers_layout))
    batch = contract.make_batch(a, num_frames=9, height=32, width=32)
    with pytest.raises(AdapterError, match="text features have dim 8, the connector expects 128"):
        a.prepare_conditions(dict(batch, text_embeds=torch.randn(1, 4, 8)))
    none = LTX25Adapter(dataclasses.replace(LTX25Config.tiny(), text_encoder="none"))
    with pytest.raises(AdapterError, match="cached Gemma features"):
        none.prepare_conditions(batch)
