"""The official base's VAE (``wan.modules.vae2_2``) and T5 encoder (``wan.modules.t5``), converted onto diffusers'
``AutoencoderKLWan`` and transformers' ``UMT5EncoderModel``, compute what the originals compute (tiny, random)."""

from __future__ import annotations

import pytest
import torch
from diffusers import AutoencoderKLWan
from transformers import UMT5Config, UMT5EncoderModel

from solarwm.backbones.official import OfficialCheckpointError
from solarwm.backbones.official_base import convert_t5_state, convert_vae_state, umt5_config
from solarwm.backbones.wan22_ti2v_5b import TINY_WAN_VAE_CONFIG

from official_packages import wan_module


def _moved(module: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Every weight moved off its init, so a wrong mapping cannot hide behind ones and zeros."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return module.eval()


def tiny_wan_vae() -> torch.nn.Module:
    """Wan's own ``WanVAE_`` (the Wan2.2 residual VAE) at the tiny route's size."""
    cfg = TINY_WAN_VAE_CONFIG
    vae = wan_module("vae2_2").WanVAE_(
        dim=cfg["base_dim"], dec_dim=cfg["decoder_base_dim"], z_dim=cfg["z_dim"], dim_mult=cfg["dim_mult"],
        num_res_blocks=cfg["num_res_blocks"], temperal_downsample=cfg["temperal_downsample"],
    )
    return _moved(vae, 0)


def test_vae_encodes_and_decodes_as_the_original() -> None:
    """The deterministic mean and the decode agree exactly on a CPU (measured max |diff| = 0.0 at fp32)."""
    wan = tiny_wan_vae()
    ours = AutoencoderKLWan(**TINY_WAN_VAE_CONFIG).eval()
    expected = {k: v.shape for k, v in ours.state_dict().items()}
    ours.load_state_dict(convert_vae_state(wan.state_dict(), expected, "Wan2.2_VAE.pth"), strict=True)
    x = torch.rand(1, 3, 5, 32, 32, generator=torch.Generator().manual_seed(1)) * 2 - 1
    mean = torch.linspace(-0.3, 0.3, 16)
    std = torch.linspace(0.5, 1.5, 16)
    with torch.no_grad():
        # The official normalisation: (mu - mean) / std, i.e. Wan's scale = [mean, 1 / std].
        mu = wan.encode(x, [mean, 1.0 / std])
        ours_mu = (ours.encode(x).latent_dist.mean - mean.view(1, -1, 1, 1, 1)) / std.view(1, -1, 1, 1, 1)
        assert mu.shape == (1, 16, 2, 2, 2)
        assert (mu - ours_mu).abs().max().item() < 1e-5
        video = wan.decode(mu, [mean, 1.0 / std]).clamp(-1, 1)  # Wan2_2_VAE.decode clamps to [-1, 1]
        ours_video = ours.decode(ours_mu * std.view(1, -1, 1, 1, 1) + mean.view(1, -1, 1, 1, 1)).sample
        assert video.shape == ours_video.shape == (1, 3, 5, 32, 32)
        assert (video - ours_video).abs().max().item() < 1e-5
        assert ((video.abs() < 0.99).float().mean() > 0.5)  # mostly inside the clamp: a real comparison


def test_vae_state_with_a_foreign_key_is_refused_by_name() -> None:
    state = dict(tiny_wan_vae().state_dict())
    state["encoder.extra.weight"] = torch.zeros(1)
    expected = {k: v.shape for k, v in AutoencoderKLWan(**TINY_WAN_VAE_CONFIG).state_dict().items()}
    with pytest.raises(OfficialCheckpointError, match=r"no place in AutoencoderKLWan: 1 \(encoder.extra.weight\)"):
        convert_vae_state(state, expected, "vae")


def test_t5_encoder_embeds_as_the_original() -> None:
    """Wan's ``T5Encoder`` (umt5 layout: per-layer position buckets) == ``UMT5EncoderModel`` on the prompt's tokens
    (measured max |diff| ~1e-6 at fp32; positions past the prompt are zeroed downstream by both pipelines)."""
    wan = _moved(wan_module("t5").T5Encoder(vocab=100, dim=32, dim_attn=32, dim_ffn=48, num_heads=4, num_layers=2,
                                            num_buckets=32, shared_pos=False, dropout=0.0), 2)
    config = UMT5Config(**umt5_config(wan.state_dict(), "t5"))
    ours = UMT5EncoderModel(config).eval()
    expected = {k: v.shape for k, v in ours.state_dict().items()}
    ours.load_state_dict(convert_t5_state(wan.state_dict(), expected, "t5.pth"), strict=True)
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 100, (2, 12), generator=g)
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[1, 7:] = 0
    with torch.no_grad():
        ref = wan(ids, mask)
        out = ours(input_ids=ids, attention_mask=mask).last_hidden_state
    valid = mask.bool()
    err = (ref - out)[valid].abs().max().item()
    assert err < 1e-5, f"max |UMT5 - Wan T5| = {err:.2e}"
    assert ref[valid].abs().max().item() > 0.5
