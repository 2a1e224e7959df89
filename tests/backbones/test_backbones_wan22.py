"""The wan22_ti2v_5b adapter: TI2V objective, fused-PRoPE camera injection, causal hook, export."""

import dataclasses
import json
import math
import shutil

import pytest
import torch
from diffusers.models.transformers.transformer_wan import WanAttnProcessor

from solarwm.backbones import load_adapter
from solarwm.backbones.base import AdapterError
from solarwm.backbones.wan22_ti2v_5b import Wan22TI2V5BAdapter, Wan22TI2V5BConfig
from solarwm.camera.se3 import look_at
from solarwm.kernels.masks import frame_causal_mask

B, F, H, W = 2, 9, 32, 32  # -> latents [2, 48, 3, 16, 16], 64 tokens per latent frame


def orbit(num_frames: int, radius: float = 3.0, turn: float = 0.6, phase: float = 0.0) -> torch.Tensor:
    """OpenCV c2w ``[F, 4, 4]`` circling the origin at height 1."""
    poses = []
    for i in range(num_frames):
        a = phase + turn * i / max(num_frames - 1, 1)
        poses.append(torch.from_numpy(look_at((radius * math.cos(a), radius * math.sin(a), 1.0), (0.0, 0.0, 0.5))))
    return torch.stack(poses).float()


def make_batch(seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    c2w = torch.stack([orbit(F), orbit(F, radius=2.0, turn=-0.8, phase=1.0)])
    K = torch.tensor([28.0, 28.0, 16.0, 16.0]).expand(B, F, 4).clone()
    return {
        "video": torch.rand(B, 3, F, H, W, generator=g) * 2 - 1,
        "c2w": c2w, "K": K, "caption": ["a red cube", "a blue sphere"], "sample_id": ["s0", "s1"],
    }


@pytest.fixture(scope="module")
def adapter():
    torch.manual_seed(0)
    return Wan22TI2V5BAdapter(Wan22TI2V5BConfig.tiny()).eval()


def noisy(adapter, batch, sigma=0.7, seed=1):
    x0 = adapter.encode(batch["video"])
    noise = torch.randn(x0.shape, generator=torch.Generator().manual_seed(seed))
    return x0, noise, *adapter.noisy_input(x0, noise, torch.full((x0.shape[0],), sigma))


def test_anchor_is_clean_and_excluded_from_the_loss(adapter):
    batch = make_batch()
    x0, noise, x_t, sigma_pf = noisy(adapter, batch)
    torch.testing.assert_close(sigma_pf, torch.tensor([[0.0, 0.7, 0.7]] * 2))
    assert torch.equal(x_t[:, :, 0], x0[:, :, 0])
    torch.testing.assert_close(x_t[:, :, 1:], 0.3 * x0[:, :, 1:] + 0.7 * noise[:, :, 1:])
    mask = adapter.loss_mask(x0)
    assert mask.shape == (2, 1, 3, 1, 1) and mask.flatten().tolist() == [0, 1, 1] * 2
    # Target sign: flow velocity noise - x0; a wrong anchor prediction costs nothing.
    target = adapter.target(x0, noise)
    assert torch.equal(target, noise - x0)
    pred = target.clone()
    pred[:, :, 0] += 100.0
    assert adapter.loss(pred, target, mask).item() == 0.0
    pred[:, :, 1] += 1.0
    assert adapter.loss(pred, target, mask).item() == pytest.approx(0.5)


def test_sample_sigmas_applies_the_shift(adapter):
    u = torch.tensor([0.0, 0.25, 0.5, 1.0])
    s = adapter.shift
    torch.testing.assert_close(adapter.sample_sigmas(4, u=u), s * u / (1 + (s - 1) * u))
    sig = adapter.sample_sigmas(1000, generator=torch.Generator().manual_seed(0))
    assert sig.min() >= 0 and sig.max() <= 1 and sig.mean() > 0.5  # shift > 1 favours high noise


def test_anchor_tokens_get_timestep_zero(adapter):
    batch = make_batch()
    cond = adapter.prepare_conditions(batch)
    _, _, x_t, sigma_pf = noisy(adapter, batch, sigma=0.4)
    seen = []
    hook = adapter.transformer.condition_embedder.timesteps_proj.register_forward_hook(
        lambda m, args, out: seen.append(args[0].detach().clone())
    )
    try:
        adapter(x_t, sigma_pf, cond)
    finally:
        hook.remove()
    timestep = seen[0].view(B, -1)  # flattened per-token timesteps, frame-major
    tpf = adapter.tokens_per_frame(16, 16)
    assert timestep.shape == (B, 3 * tpf) and tpf == 64
    assert torch.all(timestep[:, :tpf] == 0)
    torch.testing.assert_close(timestep[:, tpf:], torch.full((B, 2 * tpf), 400.0))


def test_conditions_pick_the_camera_of_each_latent_frame(adapter):
    batch = make_batch()
    batch["K"][:, 4, 0] = 40.0  # per-frame intrinsics reach the condition
    cond = adapter.prepare_conditions(batch)
    assert cond["c2w"].shape == (B, 3, 4, 4) and cond["K"].shape == (B, 3, 4)
    assert cond["c2w"].dtype == torch.float64  # kept exact until re-expressed relative to the window
    torch.testing.assert_close(cond["c2w"][:, 1], batch["c2w"][:, 4].double())
    assert cond["K"][:, 1, 0].tolist() == [40.0, 40.0] and cond["image_size"] == (W, H)
    assert cond["text_embeds"].shape == (B, 16, 32)


@pytest.mark.slow
def test_camera_changes_the_prediction_but_a_global_rigid_motion_does_not(adapter):
    batch = make_batch()
    _, _, x_t, sigma_pf = noisy(adapter, batch)
    with torch.no_grad():
        base = adapter(x_t, sigma_pf, adapter.prepare_conditions(batch))
        other = dict(batch, c2w=torch.stack([orbit(F, radius=5.0, turn=1.5), orbit(F, turn=0.1, phase=2.0)]))
        moved = adapter(x_t, sigma_pf, adapter.prepare_conditions(other))
        other_k = dict(batch, K=batch["K"] * torch.tensor([2.0, 2.0, 1.0, 1.0]))
        zoomed = adapter(x_t, sigma_pf, adapter.prepare_conditions(other_k))
        a = 0.9
        T = torch.tensor(
            [[math.cos(a), -math.sin(a), 0, 4.0], [math.sin(a), math.cos(a), 0, -2.0], [0, 0, 1, 0.5], [0, 0, 0, 1]]
        )
        rigid = adapter(x_t, sigma_pf, adapter.prepare_conditions(dict(batch, c2w=T @ batch["c2w"])))
    assert (moved - base).abs().max() > 1e-2
    assert (zoomed - base).abs().max() > 1e-2
    torch.testing.assert_close(rigid, base, atol=1e-4, rtol=1e-4)


def test_processor_reduces_to_wan_attention_when_all_cameras_coincide(adapter):
    batch = make_batch()
    batch["c2w"] = batch["c2w"][:, :1].expand(B, F, 4, 4).clone()  # one static camera
    _, _, x_t, sigma_pf = noisy(adapter, batch)
    cond = adapter.prepare_conditions(batch)
    with torch.no_grad():
        ours = adapter(x_t, sigma_pf, cond)
        saved = [blk.attn1.processor for blk in adapter.transformer.blocks]
        for blk in adapter.transformer.blocks:
            blk.attn1.set_processor(WanAttnProcessor())
        try:
            tpf = adapter.tokens_per_frame(16, 16)
            native = adapter.transformer(
                hidden_states=x_t,
                timestep=(sigma_pf * 1000).repeat_interleave(tpf, 1),
                encoder_hidden_states=cond["text_embeds"],
                return_dict=False,
            )[0]
        finally:
            for blk, proc in zip(adapter.transformer.blocks, saved):
                blk.attn1.set_processor(proc)
    assert adapter.config.prediction == "x0"  # the tiny route's network predicts x0; the adapter returns velocity
    native = (x_t - native) / sigma_pf.clamp_min(0.05)[:, None, :, None, None]
    torch.testing.assert_close(ours, native, atol=1e-4, rtol=1e-4)


def test_x0_prediction_returns_the_native_velocity(adapter, monkeypatch):
    """A network that outputs the exact clean latent yields exactly the flow target eps - x0."""
    batch = make_batch()
    x0, noise, x_t, sigma_pf = noisy(adapter, batch, sigma=0.6)
    cond = adapter.prepare_conditions(batch)
    monkeypatch.setattr(adapter.transformer, "forward", lambda **kwargs: (x0,))
    v = adapter(x_t, sigma_pf, cond)
    torch.testing.assert_close(v[:, :, 1:], (noise - x0)[:, :, 1:], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("sigma", [0.02, 0.3, 0.6, 1.0])
def test_x0_skip_prediction_returns_the_native_velocity(adapter, monkeypatch, sigma):
    """``x0_skip``: a network whose output makes c_skip·x_t + c_out·out the clean latent yields eps - x0 at every σ."""
    from solarwm.backbones.base import X0_SKIP_SIGMA_DATA as sd

    batch = make_batch()
    x0, noise, x_t, sigma_pf = noisy(adapter, batch, sigma=sigma)
    cond = adapter.prepare_conditions(batch)
    d = (1 - sigma) ** 2 * sd**2 + sigma**2
    c_skip, c_out = (1 - sigma) * sd**2 / d, sigma * sd / d**0.5
    out = (x0 - c_skip * x_t) / c_out
    monkeypatch.setattr(adapter.config, "prediction", "x0_skip")
    monkeypatch.setattr(adapter.transformer, "forward", lambda **kwargs: (out,))
    v = adapter(x_t, sigma_pf, cond)
    torch.testing.assert_close(v[:, :, 1:], (noise - x0)[:, :, 1:], atol=1e-4, rtol=1e-4)
    assert torch.isfinite(v[:, :, :1]).all()  # the anchor (σ = 0): no division by σ


def test_bare_transformer_call_without_cameras_is_an_error(adapter):
    x = torch.zeros(1, 48, 1, 16, 16)
    with pytest.raises(AdapterError, match="camera condition missing"):
        adapter.transformer(hidden_states=x, timestep=torch.zeros(1), encoder_hidden_states=torch.zeros(1, 4, 32))


def test_dense_causal_mask_hides_later_frames(adapter):
    batch = make_batch()
    _, _, x_t, sigma_pf = noisy(adapter, batch)
    cond = adapter.prepare_conditions(batch)
    mask = frame_causal_mask(3, adapter.tokens_per_frame(16, 16))
    perturbed = x_t.clone()
    perturbed[:, :, 2] += 1.0
    with torch.no_grad():
        a = adapter(x_t, sigma_pf, cond, attn_mask=mask)
        b = adapter(perturbed, sigma_pf, cond, attn_mask=mask)
        full = adapter(perturbed, sigma_pf, cond)
    torch.testing.assert_close(a[:, :, :2], b[:, :, :2])
    assert (full[:, :, :2] - a[:, :, :2]).abs().max() > 1e-3
    with pytest.raises(AdapterError, match="no attn_mask"):
        adapter(x_t, sigma_pf, cond, attn_mask=mask, kv_cache=adapter.new_cache(16, 16))


@pytest.mark.slow
def test_save_and_load_adapter_give_identical_outputs(adapter, tmp_path):
    with torch.no_grad():
        for p in adapter.transformer.parameters():  # make the weights differ from a fresh init
            p.add_(0.01 * torch.randn_like(p))
    batch = make_batch()
    _, _, x_t, sigma_pf = noisy(adapter, batch)
    out = adapter.save_adapter(tmp_path / "export")
    assert {p.name for p in out.iterdir()} == {"adapter.json", "camera.safetensors", "transformer"}
    assert json.loads((out / "adapter.json").read_text())["route"] == "wan22_ti2v_5b"
    adapter.save_adapter(out)  # overwriting an existing export is atomic and leaves no temp folders
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export"]
    for loaded in (Wan22TI2V5BAdapter.load_adapter(out), load_adapter(out)):
        loaded.eval()
        assert isinstance(loaded, Wan22TI2V5BAdapter) and loaded.config == adapter.config
        with torch.no_grad():
            assert torch.equal(
                loaded(x_t, sigma_pf, loaded.prepare_conditions(batch)),
                adapter(x_t, sigma_pf, adapter.prepare_conditions(batch)),
            )


def test_export_with_a_wan_vae_codec_carries_the_vae(tmp_path):
    torch.manual_seed(0)
    cfg = dataclasses.replace(Wan22TI2V5BConfig.tiny(), codec="wan_vae", vae_config="tiny")
    adapter = Wan22TI2V5BAdapter(cfg)
    assert adapter.latent_channels == 16 and adapter.spatial_compression == 16
    assert not any(p.requires_grad for p in adapter.codec.parameters())
    assert {n.split(".")[0] for n, p in adapter.named_parameters() if p.requires_grad} == {"transformer"}
    loaded = load_adapter(adapter.save_adapter(tmp_path / "vae_export"))
    for (name, a), (_, b) in zip(adapter.codec.vae.state_dict().items(), loaded.codec.vae.state_dict().items()):
        assert torch.equal(a, b), name


def test_missing_or_mismatched_checkpoints_are_clear_errors(adapter, tmp_path):
    with pytest.raises(AdapterError, match="pretrained_path .*nowhere does not exist"):
        Wan22TI2V5BAdapter(pretrained_path=str(tmp_path / "nowhere"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(AdapterError, match="transformer missing"):
        Wan22TI2V5BAdapter(pretrained_path=str(tmp_path / "empty"))
    with pytest.raises(AdapterError, match="adapter.json missing"):
        load_adapter(tmp_path / "empty")
    out = adapter.save_adapter(tmp_path / "export")
    with pytest.raises(AdapterError, match="num_layers: checkpoint 2 != config 3"):
        Wan22TI2V5BAdapter(dataclasses.replace(Wan22TI2V5BConfig.tiny(), num_layers=3), pretrained_path=str(out))
    cfg = dataclasses.replace(Wan22TI2V5BConfig.tiny(), codec="wan_vae")
    with pytest.raises(AdapterError, match="codec: .*export has 'patchify', the config 'wan_vae'"):
        Wan22TI2V5BAdapter(cfg, pretrained_path=str(out))  # an export says what it was trained with
    diffusers_layout = tmp_path / "diffusers"  # a checkpoint folder says nothing: the missing part is named
    shutil.copytree(out / "transformer", diffusers_layout / "transformer")
    with pytest.raises(AdapterError, match="vae missing"):
        Wan22TI2V5BAdapter(cfg, pretrained_path=str(diffusers_layout))
    meta = json.loads((out / "adapter.json").read_text())
    (out / "adapter.json").write_text(json.dumps(dict(meta, route="ltx25")))
    with pytest.raises(AdapterError, match="route 'ltx25', not 'wan22_ti2v_5b'"):
        Wan22TI2V5BAdapter.load_adapter(out)


def test_precomputed_text_embeds_are_used_and_checked(adapter):
    batch = make_batch()
    embeds = torch.randn(B, 5, 32)
    mask = torch.tensor([[True] * 5, [True, True, False, False, False]])
    cond = adapter.prepare_conditions(dict(batch, text_embeds=embeds, text_mask=mask))
    assert torch.equal(cond["text_embeds"][0], embeds[0]) and cond["text_embeds"][1, 2:].abs().sum() == 0
    with pytest.raises(AdapterError, match="text features have dim 8, transformer expects 32"):
        adapter.prepare_conditions(dict(batch, text_embeds=torch.randn(B, 5, 8)))


@pytest.mark.slow
def test_camera_on_a_head_dim_split_keeps_relative_pose_semantics():
    torch.manual_seed(0)
    split = Wan22TI2V5BAdapter(dataclasses.replace(Wan22TI2V5BConfig.tiny(), camera_head_dims=(16, 32))).eval()
    assert split.transformer.blocks[0].attn1.processor.head_dims == slice(16, 32)
    batch = make_batch()
    _, _, x_t, sigma_pf = noisy(split, batch)
    T = torch.eye(4)
    T[:3, 3] = torch.tensor([1.0, -2.0, 0.5])
    with torch.no_grad():
        base = split(x_t, sigma_pf, split.prepare_conditions(batch))
        shifted = split(x_t, sigma_pf, split.prepare_conditions(dict(batch, c2w=T @ batch["c2w"])))
        reversed_ = split(x_t, sigma_pf, split.prepare_conditions(dict(batch, c2w=batch["c2w"].flip(1))))
    torch.testing.assert_close(shifted, base, atol=1e-4, rtol=1e-4)
    assert (reversed_ - base).abs().max() > 1e-3


def test_pretrained_export_must_share_the_weight_config(tmp_path):
    """An export used as pretrained_path loads its weights, and refuses a config that reads them differently."""
    skip = dataclasses.replace(Wan22TI2V5BConfig.tiny(), prediction="x0_skip")
    trained = Wan22TI2V5BAdapter(config=skip)
    trained.save_adapter(tmp_path / "base", stage="bidirectional")
    again = Wan22TI2V5BAdapter(config=skip, pretrained_path=str(tmp_path / "base"))
    for (name, a), (_, b) in zip(trained.transformer.state_dict().items(), again.transformer.state_dict().items()):
        assert torch.equal(a, b), name
    with pytest.raises(AdapterError, match=r"prediction: .*base has 'x0_skip', the config 'x0'"):
        Wan22TI2V5BAdapter(preset="tiny", pretrained_path=str(tmp_path / "base"))
    # The same check guards a later stage's init_from (same shapes, so a strict load alone would pass).
    from solarwm.stages.checkpoints import load_adapter_weights

    with pytest.raises(AdapterError, match="prediction"):
        load_adapter_weights(Wan22TI2V5BAdapter(preset="tiny"), tmp_path / "base")
