"""What only the tiny MiniMax-H3 route has (the contract suite: tests/backbones/test_route_contract.py):
17n+5 geometry, the packed prefix, PRoPE on [96:128) vs the native processor, the data-ward time convention,
batch folding, the flow map and the published 33 B count."""

from __future__ import annotations

import pytest
import torch
from diffusers.models.transformers.transformer_minimax_h3 import MiniMaxH3AttnProcessor

from solarwm.backbones.base import AdapterError, load_adapter
from solarwm.backbones.minimax_h3 import MiniMaxH3Adapter, MiniMaxH3Config

import route_contract as contract

FRAMES = 17 + 5  # 7 latent frames = a block of 5 and a block of 2
SIZE = 16  # 16x16 video -> 8x8 latents -> 16 rows per latent frame


def adapter(**overrides) -> MiniMaxH3Adapter:
    torch.manual_seed(0)
    config = MiniMaxH3Config.tiny()
    for key, value in overrides.items():
        setattr(config, key, value)
    built = MiniMaxH3Adapter(config=config)
    contract.perturb(built)
    return built.eval()


def _noised(a: MiniMaxH3Adapter, batch: dict, seed: int = 5):
    g = torch.Generator().manual_seed(seed)
    x0 = a.encode(batch["video"])
    noise = torch.randn(x0.shape, generator=g)
    sigma = torch.rand(x0.shape[0], generator=g) * 0.8 + 0.1
    x_t, sigma_pf = a.noisy_input(x0, noise, sigma)
    return x0, noise, x_t, sigma_pf


def test_frame_rule_17n_plus_5_and_cadence():
    a = adapter()
    assert [n for n in range(1, 160) if a.valid_num_frames(n)] == [5, 22, 39, 56, 73, 90, 107, 124, 141, 158]
    assert a.latent_frames(158) == 47 and a.latent_frames(5) == 2 and a.latent_frames(22) == 7
    with pytest.raises(AdapterError, match="17"):
        a.latent_frames(21)
    # cadence (1, 4, 4, 4, 4): each latent stands for the last pixel frame of its group
    assert a.latent_to_pixel_frame(7).tolist() == [0, 4, 8, 12, 16, 17, 21]
    assert int(a.latent_to_pixel_frame(47)[-1]) == 157
    assert a.frames_per_block == 5 and a.window_blocks == 6 and a.clean_latent_frames == 0
    cache = a.new_cache(8, 8)
    assert cache.max_frames == 25 and cache.num_layers == 2


def test_codec_exact_round_trip_anchor_and_streaming():
    a = adapter()
    batch = contract.make_batch(a, num_frames=39, height=SIZE, width=SIZE)
    video = batch["video"]
    latents = a.encode(video)
    assert latents.shape[2] == 12
    torch.testing.assert_close(a.decode(latents), video, rtol=0, atol=0)
    anchor = a.encode(video[:, :, :1])  # the one-frame VisualVAE anchor
    assert anchor.shape[2] == 1
    torch.testing.assert_close(anchor, latents[:, :, :1], rtol=0, atol=0)
    for sizes in ([5, 5, 2], [3, 4, 5]):
        stream = a.stream_decoder()
        parts = [stream(block) for block in latents.split(sizes, dim=2)]
        torch.testing.assert_close(torch.cat(parts, 2), video, rtol=0, atol=0)
    cond = a.prepare_conditions(batch)
    assert cond["image_anchor"].shape == anchor.shape and torch.equal(cond["image_anchor"], anchor)


def test_prope_on_96_128_equals_native_processor_when_cameras_coincide():
    """Identity cameras everywhere: the PRoPE processor is exactly H3's own processor; real cameras change it."""
    a = adapter()
    batch = contract.make_batch(a, num_frames=FRAMES, height=SIZE, width=SIZE)
    f = a.latent_frames(FRAMES)
    cond = a.prepare_conditions(batch)
    cond["c2w"] = torch.eye(4, dtype=torch.float64).expand(1, f, 4, 4).clone()
    cond["K"] = torch.tensor([SIZE, SIZE, SIZE / 2, SIZE / 2], dtype=torch.float32).expand(1, f, 4).clone()
    _, _, x_t, sigma = _noised(a, batch)
    with torch.no_grad():
        ours = a(x_t, sigma, cond)
        moved = a(x_t, sigma, a.prepare_conditions(batch))
        processors = [blk.attn.processor for blk in a.transformer.transformer_blocks]
        for blk in a.transformer.transformer_blocks:
            blk.attn.set_processor(MiniMaxH3AttnProcessor())
        native = a(x_t, sigma, cond)
        for blk, proc in zip(a.transformer.transformer_blocks, processors):
            blk.attn.set_processor(proc)
    torch.testing.assert_close(ours, native, atol=1e-5, rtol=1e-5)
    assert (moved - native).abs().max() > 1e-3  # the walking camera does reach the video rows
    assert processors[0].head_dims == slice(96, 128)


def test_time_convention_oracle_native_velocity_gives_contract_target(monkeypatch):
    """A transformer returning H3's exact native velocity x0 - eps (from its own inputs, t = 1 clean) makes the
    adapter return exactly the contract target eps - x0 (sigma = noise level)."""
    a = adapter()
    batch = contract.make_batch(a, num_frames=FRAMES, height=SIZE, width=SIZE, batch=2)
    x0, noise, x_t, sigma = _noised(a, batch)
    cond = a.prepare_conditions(batch)
    tpf = 16
    seen = {}

    def oracle(hidden_states, timestep, timestep_indices, video_indices, token_tags, **kwargs):
        rows_t = timestep[timestep_indices[video_indices]].view(1, -1, 1)
        eps = torch.cat([torch.zeros(2, tpf, hidden_states.shape[-1]), a._patchify(noise)], 1).reshape(
            1, -1, hidden_states.shape[-1]
        )
        seen.update(t=timestep.clone(), tags=token_tags.clone(), idx=timestep_indices.clone())
        # x_t = t x0 + (1 - t) eps  =>  x0 - eps = (x_t - eps) / t
        return ((hidden_states - eps) / rows_t,)

    monkeypatch.setattr(a.transformer, "forward", oracle)
    out = a(x_t, sigma, cond)
    torch.testing.assert_close(out, a.target(x0, noise), atol=1e-5, rtol=1e-5)
    # native timestep table per document: text 1, anchor 0.999, audio 1, frames 1 - sigma
    table = seen["t"].view(2, -1)
    torch.testing.assert_close(table[:, :3], torch.tensor([[1.0, 0.999, 1.0]] * 2))
    torch.testing.assert_close(table[:, 3:], 1.0 - sigma)
    # teacher forcing: the clean copy sits at native t = 1
    monkeypatch.setattr(
        a.transformer, "forward", lambda timestep, **kw: seen.update(tf=timestep.clone()) or (kw["hidden_states"],)
    )
    a.forward_teacher_forcing(x0, x_t, sigma, cond)
    tf = seen["tf"].view(2, -1)
    f = x0.shape[2]
    assert torch.equal(tf[:, 3 : 3 + f], torch.ones(2, f))
    torch.testing.assert_close(tf[:, 3 + f :], 1.0 - sigma)


def test_batch_fold_keeps_samples_independent():
    """Two samples at different sigmas in one call equal two single-sample calls (attention never crosses them)."""
    a = adapter()
    batch = contract.make_batch(a, num_frames=FRAMES, height=SIZE, width=SIZE, batch=2)
    batch["caption"] = ["a street", "a forest at night"]
    _, _, x_t, sigma = _noised(a, batch)
    cond = a.prepare_conditions(batch)
    with torch.no_grad():
        both = a(x_t, sigma, cond)
        for i in range(2):
            one = {k: (v[i : i + 1] if isinstance(v, torch.Tensor) else v) for k, v in cond.items()}
            torch.testing.assert_close(a(x_t[i : i + 1], sigma[i : i + 1], one), both[i : i + 1], atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_rollout_past_the_window_keeps_the_prefix_and_bounded_cache():
    """7 blocks > window: the cache holds 5 blocks, positions stay window-local, and the prefix (caption) is
    still seen by the last block."""
    a = adapter()
    frames = 17 * 7 + 5  # 37 latents = 7 blocks of 5 + 2
    batch = contract.make_batch(a, num_frames=frames, height=SIZE, width=SIZE)
    latents = torch.randn(
        1, a.latent_channels, a.latent_frames(frames), 8, 8, generator=torch.Generator().manual_seed(0)
    )
    outs = {}
    for caption in ("a street", "a forest"):
        batch["caption"] = [caption]
        cond = a.prepare_conditions(batch)
        cache = a.new_cache(8, 8)
        with torch.no_grad():
            for sl in a.block_slices(latents.shape[2]):
                block = {k: (v[:, sl] if k in ("c2w", "K") else v) for k, v in cond.items()}
                out = a(latents[:, :, sl], torch.full((1, sl.stop - sl.start), 0.5), block, kv_cache=cache)
                a(latents[:, :, sl], torch.zeros(1, sl.stop - sl.start), block, kv_cache=cache, commit=True)
                assert cache.frames <= 25
        outs[caption] = out
    assert cache.committed_frames == latents.shape[2] and cache.frames == 25
    assert (outs["a street"] - outs["a forest"]).abs().max() > 1e-4


def test_flow_map_starts_at_the_stage1_model_and_exports(tmp_path):
    a = adapter()
    batch = contract.make_batch(a, num_frames=FRAMES, height=SIZE, width=SIZE)
    x0, _, x_t, sigma = _noised(a, batch)
    cond = a.prepare_conditions(batch)
    with torch.no_grad():
        before = a(x_t, sigma, cond)
        with pytest.raises(AdapterError, match="flow map"):
            a(x_t, sigma, cond, r_per_frame=sigma)
        a.enable_flow_map(0.25)
        torch.testing.assert_close(a(x_t, sigma, cond, r_per_frame=sigma), before)
        torch.testing.assert_close(a(x_t, sigma, cond), before)
        with torch.no_grad():
            for p in a.delta_embedding.parameters():
                p.add_(0.05 * torch.randn_like(p))
        moved = a(x_t, sigma, cond, r_per_frame=sigma * 0.5)
        assert (moved - before).abs().max() > 1e-4
        tf = a.forward_teacher_forcing(x0, x_t, sigma, cond, r_per_frame=sigma * 0.5)
        loaded = load_adapter(a.save_adapter(tmp_path / "fm", stage="tf_anyflow")).eval()
        torch.testing.assert_close(loaded(x_t, sigma, cond, r_per_frame=sigma * 0.5), moved)
        torch.testing.assert_close(loaded.forward_teacher_forcing(x0, x_t, sigma, cond, r_per_frame=sigma * 0.5), tf)


def test_missing_anchor_and_bad_camera_split_are_refused():
    a = adapter()
    batch = contract.make_batch(a, num_frames=FRAMES, height=SIZE, width=SIZE)
    cond = a.prepare_conditions(batch)
    del cond["image_anchor"]
    _, _, x_t, sigma = _noised(a, batch)
    with pytest.raises(AdapterError, match="image_anchor"):
        a(x_t, sigma, cond)
    config = MiniMaxH3Config.tiny()
    config.camera_head_dims = (64, 128)  # overlaps the MM-RoPE dims [0:96)
    with pytest.raises(AdapterError, match="camera_head_dims"):
        MiniMaxH3Adapter(config=config)


def test_published_count_on_meta():
    """The H3 Omni Transformer: 33,122,992,896 parameters (published: 33 B)."""
    a = MiniMaxH3Adapter(preset="published", device="meta")
    assert contract.parameter_count(a) == 33_122_992_896
    assert a.latent_channels == 24 and a.spatial_compression == 16 and a.shift == 12.0
    assert a.config.audio_rows == 264 and a.config.text_dim == 5120 and a.config.camera_head_dims == (96, 128)
    assert a.trainable_parameters() and all(not p.requires_grad for p in a.codec.parameters())


@pytest.mark.slow
def test_visualvae_codec_geometry_anchor_and_export(tmp_path):
    """The real AutoencoderKLMiniMaxH3 class (tiny config): 17n+5 -> 5n+2 at 16x, anchor = latent 0, vae/ exported."""
    torch.manual_seed(0)
    config = MiniMaxH3Config.tiny()
    config.codec, config.vae_config = "h3_vae", "tiny"
    a = MiniMaxH3Adapter(config=config)
    contract.perturb(a)
    assert a.spatial_compression == 16 and a.latent_channels == 8
    batch = contract.make_batch(a, num_frames=FRAMES, height=32, width=32)
    latents = contract.check_geometry(a, batch)
    with torch.no_grad():
        torch.testing.assert_close(a.encode(batch["video"][:, :, :1]), latents[:, :, :1])
        assert a.decode(latents[:, :, :2]).shape[2] == 5  # the shortest clip, 5 frames
    with pytest.raises(NotImplementedError, match="streaming"):
        a.stream_decoder()
    contract.check_export_round_trip(a, batch, tmp_path / "export")
    assert (tmp_path / "export" / "vae" / "config.json").is_file()


@pytest.mark.slow
def test_lora_on_blocks_qkvo_ffn_and_first_frame_anchor(tmp_path):
    """The shared LoRA check with H3's targets (q/k/v/o + SwiGLU FFN); samplers' ``first_frame`` gives the anchor."""
    from solarwm.backbones.minimax_h3 import H3_LORA_TARGETS

    a = adapter()
    batch = contract.make_batch(a, num_frames=FRAMES, height=SIZE, width=SIZE)
    cond = a.prepare_conditions(
        {k: v for k, v in batch.items() if k != "video"}
        | {"first_frame": batch["video"][:, :, 0], "image_size": (SIZE, SIZE)}
    )
    torch.testing.assert_close(cond["image_anchor"], a.encode(batch["video"][:, :, :1]), rtol=0, atol=0)
    contract.check_lora(a, batch, tmp_path, {"rank": 4, "alpha": 8, "target_modules": list(H3_LORA_TARGETS)})
    names = [n for n, _ in a.transformer.named_modules() if n.endswith("lora_A")]
    assert any(n.startswith("transformer_blocks.1.ff.net.2") for n in names)
    assert any(n.startswith("transformer_blocks.0.attn.to_out.0") for n in names)


@pytest.mark.slow
def test_h3_recipes_match_the_route():
    """Three published H3 recipes: this route, 158 frames (-> 47 latents) at 768x1344, LoRA 384 on H3_LORA_TARGETS."""
    from pathlib import Path

    from solarwm.backbones.lora import LoRAConfig
    from solarwm.backbones.minimax_h3 import H3_LORA_TARGETS
    from solarwm.train_cli import parse_recipe

    recipes = Path(__file__).resolve().parents[2] / "recipes"
    for stage in ("bid", "tf", "dmd"):
        cfg = parse_recipe(str(recipes / f"minimax_h3_{stage}.yaml"))
        adapter_cfg = cfg.model.init_args.adapter
        assert adapter_cfg.class_path == "solarwm.backbones.minimax_h3.MiniMaxH3Adapter"
        init = adapter_cfg.init_args
        assert init.preset == "published" and init.pretrained_path is None
        assert LoRAConfig(**vars(init.lora)) == LoRAConfig(rank=384, alpha=384, target_modules=list(H3_LORA_TARGETS))
        data = cfg.data.init_args
        assert (data.num_frames, data.height, data.width) == (158, 768, 1344)
    a = adapter()
    assert a.latent_frames(158) == 47 and 768 % 16 == 0 and 1344 % 16 == 0


@pytest.mark.slow
def test_teacher_forcing_flex_block_mask_matches_dense():
    """The CUDA path (FlexAttention BlockMask over [prefix | clean | noisy]) equals the dense mask (CPU forward)."""
    a = adapter()
    batch = contract.make_batch(a, num_frames=FRAMES, height=SIZE, width=SIZE)
    x0, _, x_t, sigma = _noised(a, batch)
    cond = a.prepare_conditions(batch)
    with torch.no_grad():
        dense = a.forward_teacher_forcing(x0, x_t, sigma, cond)
        a.flex_masks = True
        flex = a.forward_teacher_forcing(x0, x_t, sigma, cond)
    torch.testing.assert_close(flex, dense, atol=1e-5, rtol=1e-5)


def test_audio_silence_latent_from_file_travels_with_the_export(tmp_path):
    from safetensors.torch import save_file

    silence = torch.randn(4, 8, generator=torch.Generator().manual_seed(3))
    save_file({"silence": silence}, str(tmp_path / "silence.safetensors"))
    a = adapter(audio_silence_path=str(tmp_path / "silence.safetensors"))
    assert torch.equal(a.silence, silence)
    batch = contract.make_batch(a, num_frames=5, height=SIZE, width=SIZE)
    export = tmp_path / "export"
    contract.check_export_round_trip(a, batch, export)
    (tmp_path / "silence.safetensors").unlink()  # the export carries its own copy
    assert torch.equal(load_adapter(export).silence, silence)
    save_file({"silence": torch.zeros(3, 8)}, str(tmp_path / "bad.safetensors"))
    with pytest.raises(AdapterError, match="silence"):
        adapter(audio_silence_path=str(tmp_path / "bad.safetensors"))
