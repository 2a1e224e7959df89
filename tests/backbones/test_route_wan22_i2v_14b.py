"""The route wan22_i2v_14b (SolarWM-wan2.2-14B on Wan2.2-I2V-A14B): the contract suite plus what only it has.

The official image condition ``y`` (checked against diffusers' own ``WanImageToVideoPipeline.prepare_latents``),
PRoPE reducing to Wan's native attention under one shared camera, no clean anchor, the rollout slicing ``y``
per block, and the published parameter count on the meta device.
"""

from __future__ import annotations

import dataclasses
import types

import pytest
import torch
from diffusers import WanImageToVideoPipeline
from diffusers.models.transformers.transformer_wan import WanAttnProcessor

from solarwm.backbones import route_class
from solarwm.backbones.base import AdapterError
from solarwm.backbones.wan22_i2v_14b import WAN21_VAE_CONFIG, Wan22I2V14BAdapter, Wan22I2V14BConfig
from solarwm.rollout.engine import Rollout, block_conditions

import route_contract as contract

FRAMES, SIZE = 4 * 5 + 1, 32  # 6 latent frames = 2 causal blocks; 4x4 latents, 2x2 tokens per frame


@pytest.fixture(scope="module")
def adapter() -> Wan22I2V14BAdapter:
    torch.manual_seed(0)
    built = Wan22I2V14BAdapter(config=Wan22I2V14BConfig.tiny())
    contract.perturb(built)
    return built.eval()


@pytest.mark.slow
def test_contract_lora(tmp_path):
    torch.manual_seed(0)
    fresh = Wan22I2V14BAdapter(config=Wan22I2V14BConfig.tiny())
    contract.perturb(fresh)
    batch = contract.make_batch(fresh, num_frames=FRAMES, height=SIZE, width=SIZE)
    lora = {"rank": 4, "alpha": 4, "target_modules": ["to_q", "to_k", "to_v", "to_out.0"], "dropout": 0.0}
    contract.check_lora(fresh, batch, tmp_path, lora)


def test_route_is_registered_and_has_the_i2v_layout(adapter):
    assert route_class("wan22_i2v_14b") is Wan22I2V14BAdapter
    assert adapter.latent_channels == 16 and adapter.spatial_compression == 8 and adapter.temporal_compression == 4
    assert (adapter.transformer.config.in_channels, adapter.transformer.config.out_channels) == (36, 16)
    assert adapter.clean_latent_frames == 0 and adapter.frames_per_block == 3 and adapter.window_blocks == 6
    assert adapter.per_frame_conditions == ("c2w", "K", "y")


@pytest.mark.slow
def test_y_is_the_official_condition_of_diffusers_i2v_pipeline(adapter):
    """Same tensor as diffusers' WanImageToVideoPipeline.prepare_latents (mask channels, then the image latent)."""
    batch = contract.make_batch(adapter, num_frames=FRAMES, height=SIZE, width=SIZE, batch=2)
    batch["video"][1] = -batch["video"][1]  # two different first frames
    y = adapter.prepare_conditions(batch)["y"]  # [B, f, 20, h, w], frame-major
    assert y.shape == (2, 6, 20, 4, 4)

    vae = adapter.codec.vae
    pipe = types.SimpleNamespace(
        vae=vae, vae_scale_factor_temporal=4, vae_scale_factor_spatial=8,
        config=types.SimpleNamespace(expand_timesteps=False),
    )
    for i in range(2):  # the pipeline takes one image per call
        _, reference = WanImageToVideoPipeline.prepare_latents(
            pipe,
            batch["video"][i : i + 1, :, 0],
            1,
            num_channels_latents=16,
            height=SIZE,
            width=SIZE,
            num_frames=FRAMES,
            dtype=torch.float32,
            device=torch.device("cpu"),
            generator=torch.Generator().manual_seed(0),
        )
        torch.testing.assert_close(y[i : i + 1].transpose(1, 2), reference, atol=1e-5, rtol=1e-5)

    # The layout spelled out: 4 mask channels (1 on latent frame 0 only), then the latent of [image, 0, 0, ...].
    assert torch.equal(y[:, 0, :4], torch.ones_like(y[:, 0, :4])) and not y[:, 1:, :4].any()
    with torch.no_grad():
        first = adapter.encode(batch["video"][:, :, :1])  # causal VAE: frame 0 is encoded alone
    torch.testing.assert_close(y[:, 0, 4:], first[:, :, 0], atol=1e-5, rtol=1e-5)
    # Later y latents are the zero frames', not the clip's: y only depends on the first frame.
    other = dict(batch, video=batch["video"].clone())
    other["video"][:, :, 1:] = 0.3
    torch.testing.assert_close(adapter.prepare_conditions(other)["y"], y)


@pytest.mark.slow
def test_the_image_condition_comes_from_first_frame_or_is_an_error(adapter):
    batch = contract.make_batch(adapter, num_frames=FRAMES, height=SIZE, width=SIZE)
    from_video = adapter.prepare_conditions(batch)["y"]
    no_video = {k: v for k, v in batch.items() if k != "video"}
    from_image = adapter.prepare_conditions(
        dict(no_video, first_frame=batch["video"][:, :, 0], image_size=(SIZE, SIZE))
    )
    torch.testing.assert_close(from_image["y"], from_video)
    with pytest.raises(AdapterError, match="needs the condition image"):
        adapter.prepare_conditions(dict(no_video, image_size=(SIZE, SIZE)))


def test_first_latent_is_noisy_and_supervised(adapter):
    x0 = torch.randn(1, 16, 6, 4, 4)
    noise = torch.randn_like(x0)
    x_t, sigma_pf = adapter.noisy_input(x0, noise, torch.tensor([0.7]))
    assert torch.all(sigma_pf == 0.7)
    torch.testing.assert_close(x_t[:, :, 0], 0.3 * x0[:, :, 0] + 0.7 * noise[:, :, 0])
    assert torch.all(adapter.loss_mask(x0) == 1)


@pytest.mark.slow
def test_prope_reduces_to_native_wan_attention_when_all_cameras_coincide(adapter):
    """One shared camera: PRoPE is the identity, so the adapter = diffusers' I2V call on cat([x_t, y]),
    with per-token timesteps or with the I2V pipeline's one timestep per sample."""
    batch = contract.make_batch(adapter, num_frames=FRAMES, height=SIZE, width=SIZE)
    batch["c2w"] = batch["c2w"][:, :1].expand(-1, FRAMES, 4, 4).clone()
    cond = adapter.prepare_conditions(batch)
    g = torch.Generator().manual_seed(5)
    x_t = torch.randn(1, 16, 6, 4, 4, generator=g)
    sigma_pf = torch.full((1, 6), 0.6)
    with torch.no_grad():
        ours = adapter(x_t, sigma_pf, cond)
        saved = [blk.attn1.processor for blk in adapter.transformer.blocks]
        for blk in adapter.transformer.blocks:
            blk.attn1.set_processor(WanAttnProcessor())
        try:
            hidden = torch.cat([x_t, cond["y"].transpose(1, 2)], 1)  # the pipeline's latent_model_input
            tpf = adapter.tokens_per_frame(4, 4)
            per_token = adapter.transformer(
                hidden_states=hidden,
                timestep=(sigma_pf * 1000).repeat_interleave(tpf, 1),
                encoder_hidden_states=cond["text_embeds"],
                return_dict=False,
            )[0]
            scalar = adapter.transformer(
                hidden_states=hidden,
                timestep=torch.tensor([600.0]),
                encoder_hidden_states=cond["text_embeds"],
                return_dict=False,
            )[0]
        finally:
            for blk, proc in zip(adapter.transformer.blocks, saved):
                blk.attn1.set_processor(proc)
    assert adapter.config.prediction == "velocity"  # native output
    torch.testing.assert_close(ours, per_token, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(ours, scalar, atol=1e-4, rtol=1e-4)


@pytest.mark.slow
def test_rollout_builds_y_from_the_first_frame_and_slices_it_per_block(adapter):
    batch = contract.make_batch(adapter, num_frames=FRAMES, height=SIZE, width=SIZE)
    rollout = Rollout(adapter, num_steps=2)
    first = batch["video"][:, :, 0]
    cond = rollout.conditions(first, batch["c2w"], batch["K"], ["a street"])
    torch.testing.assert_close(cond["y"], adapter.prepare_conditions(batch)["y"])
    block = block_conditions(adapter, cond, slice(3, 6))
    assert block["y"].shape[1] == block["c2w"].shape[1] == block["K"].shape[1] == 3
    torch.testing.assert_close(block["y"], cond["y"][:, 3:6])

    def run(image: torch.Tensor) -> torch.Tensor:
        c = rollout.conditions(image, batch["c2w"], batch["K"], ["a street"])
        blocks = list(rollout.latent_blocks(c, torch.Generator().manual_seed(0)))
        assert [b.frames for b in blocks] == [slice(0, 3), slice(3, 6)]
        return torch.cat([b.x0 for b in blocks], 2)

    out = run(first)
    assert out.shape == (1, 16, 6, 4, 4) and torch.isfinite(out).all()
    assert not torch.allclose(out, run(-first))  # the image condition steers the rollout


def test_published_config_counts_14_29_b_on_the_meta_device():
    config = dataclasses.replace(Wan22I2V14BConfig.published(), text_encoder="none")  # UMT5 needs its weights
    published = Wan22I2V14BAdapter(config=config, device="meta")
    cfg = published.transformer.config
    assert (cfg.num_layers, cfg.num_attention_heads, cfg.attention_head_dim, cfg.ffn_dim) == (40, 40, 128, 13824)
    assert (cfg.in_channels, cfg.out_channels, cfg.text_dim, cfg.freq_dim) == (36, 16, 4096, 256)
    assert cfg.image_dim is None and tuple(cfg.patch_size) == (1, 2, 2)
    assert published.codec.vae.config.z_dim == 16 and published.spatial_compression == 8
    assert published.codec.vae.config.latents_mean == WAN21_VAE_CONFIG["latents_mean"]
    assert published.shift == 5.0
    assert contract.parameter_count(published) == 14_288_901_184  # 14.29 B
