"""``data derive --transform clean-plate``: lineage, geometry sliced from parent, nothing copied, accounting, resume.

The lineage tests use a plain Lanczos resize as the transform. ``test_tiny_ltx23_pipeline_end_to_end``
runs the real path: diffusers' ``LTX2InContextPipeline`` with the same component classes as LTX-2.3
(random weights, tiny configs), saved with ``save_pretrained`` and loaded by ``CleanPlate.from_local``
with an IC-LoRA safetensors file in the LTX-2 trainer's key layout.
"""

from __future__ import annotations

import json
import subprocess

import numpy as np
import pytest

from solarwm.camera.intrinsics import resize_intrinsics
from solarwm.data.accounting import account
from solarwm.data.annotate.runner import annotate_command
from solarwm.data.contract import (
    Clip,
    clip_id,
    iter_clip_dirs,
    read_clip,
    read_meta,
    write_clip,
)
from solarwm.data.derive import (
    CLEAN_OF,
    derive_corpus,
    model_frames,
    resize_frames,
    slice_plan,
)

from commands import solarwm_argv


def parent(corpus, owner, name, n, units="metric", size=(64, 36)):
    rng = np.random.default_rng(len(name))
    w, h = size
    c2w = np.stack([np.eye(4)] * n)
    c2w[:, 0, 3] = np.linspace(0, 1, n)
    K = np.tile([50.0, 50.0, w / 2, h / 2], (n, 1))
    K[:, 0] += np.arange(n)  # per-frame K, so a wrong slice would show
    K[:, 1] = K[:, 0]
    meta = {"fps": 16.0, "pose_units": units}
    clip = Clip(
        clip_id(owner, name, 0, n),
        rng.integers(0, 255, (n, h, w, 3), dtype=np.uint8),
        c2w,
        K,
        "a parent caption",
        meta,
        metrics={"metrics.vmaf": 3.0, "camera.fov_x_min": 40.0},
        provenance={"owner": owner, "original_id": name, "frame_interval": [0, n]},
        selection={"tier": "high", "reasons": []},
    )
    return write_clip(clip, corpus)


def upscale(frames, caption):
    return resize_frames(frames, 128, 72)


def derived_dirs(out):
    """Folders of ``out`` holding a derived clip (failed records have only meta.json)."""
    return [d for d in iter_clip_dirs(out) if (d / "video.mp4").is_file()]


def test_slice_plan_and_model_frames():
    assert slice_plan(960) == (0, 160) and slice_plan(160) == (0, 160)
    assert slice_plan(100) == (9, 90) and slice_plan(81) == (0, 81) and slice_plan(80) is None
    # The reference (§11): the model runs 121 frames at 24 fps for 81 at 16 fps, 241 for 160.
    assert model_frames(81) == 121 and model_frames(160) == 241


@pytest.mark.slow
def test_lineage_accounting_and_resume(tmp_path, capsys):
    src, out = tmp_path / "src", tmp_path / "out"
    good = parent(src, "sekai_walking", "walk", 96)
    parent(src, "spatialvid", "rel", 96, units="relative")
    parent(src, "synthetic", "world", 96)
    parent(src, "miradata", "short", 40)
    summary = derive_corpus(src, out, upscale)
    assert summary["line"] == "parents 4 = derived 1 + already derived 0 + failed 2 + not a Clean Plate source 1"
    reasons = sorted(r["reason"] for r in summary["failed_parents"])
    assert reasons == ["metric_scale_unrecoverable", "parent_too_short"]
    # Eligible parents = derived + failed, and the corpus accounting sees the same: the failures are
    # failed clip records in OUT with their reason; the synthetic parent is in the ledger only.
    assert summary["eligible"] == 3 == summary["derived"] + summary["failed"]
    acc = account(out).total()
    assert (acc["ingested"], acc["failed"], acc["pending"]) == (3, 2, 1)
    errors = sorted(f["error"].split(":")[0] for f in account(out).failures)
    assert errors == ["metric_scale_unrecoverable", "parent_too_short"]
    assert {f["stage"] for f in account(out).failures} == {"derive"}
    short = read_meta(out / clip_id("miradata_clean", clip_id("miradata", "short", 0, 40), 0, 0))
    assert short["provenance"]["lineage"]["parent_clip_id"] == clip_id("miradata", "short", 0, 40)

    [derived_dir] = derived_dirs(out)
    p, d = read_clip(good), read_clip(derived_dir)
    start, end = slice_plan(96)
    assert d.owner == CLEAN_OF["sekai_walking"] == "sekai_walking_clean"
    lineage = d.provenance["lineage"]
    assert lineage["parent_clip_id"] == p.clip_id and lineage["parent_interval"] == [start, end]
    assert (lineage["source_width"], lineage["source_height"], lineage["source_tier"]) == (64, 36, "high")
    assert d.clip_id == clip_id("sekai_walking_clean", p.clip_id, start, end)
    assert np.array_equal(d.c2w, p.c2w[start:end])
    assert np.allclose(d.K, resize_intrinsics(p.K[start:end], 2.0, 2.0))
    assert {"name": "resize_intrinsics", "version": "1", "scale": [2.0, 2.0]} in d.provenance["conversions"]
    assert (d.meta["width"], d.meta["height"], d.meta["num_frames"], d.meta["fps"]) == (128, 72, 81, 16.0)
    # Nothing is copied: no metric, no caption, no selection — the clip is annotated afresh.
    assert d.metrics == {} and d.caption == "" and d.selection is None
    assert annotate_command(str(out), stages=["camera", "saturation"]) == 0
    capsys.readouterr()
    annotated = read_clip(derived_dir, load_video=False)
    assert annotated.metrics["camera.pose_units"] == "metric" and "metrics.saturation" in annotated.metrics
    assert annotated.metrics["camera.fov_x_min"] != 40.0

    again = derive_corpus(src, out, upscale)
    assert again["line"] == "parents 4 = derived 0 + already derived 1 + failed 2 + not a Clean Plate source 1"
    assert len(iter_clip_dirs(out)) == 3 and len(derived_dirs(out)) == 1
    ledger = [json.loads(x) for x in (out / "derive_ledger.jsonl").read_text().splitlines()]
    assert len(ledger) == 8 and {r["status"] for r in ledger} == {"derived", "cached", "failed", "skipped"}


@pytest.mark.slow
def test_cli_without_weights_exits_2_with_one_line(tmp_path):
    cmd = [*solarwm_argv(), "data", "derive", "--corpus", str(tmp_path), "--out", str(tmp_path / "o")]
    r = subprocess.run(cmd, capture_output=True, text=True, env={"PATH": "", "HOME": str(tmp_path)})
    assert r.returncode == 2 and "clean_plate_unavailable" in r.stderr
    r = subprocess.run(cmd + ["--weights", str(tmp_path)], capture_output=True, text=True)
    assert r.returncode == 2 and "model_index.json" in r.stderr


# ------------------------------------------------------------------ the real pipeline, tiny and random

MODEL_SIZE, OUTPUT_SIZE = (96, 64), (128, 72)  # W, H; the decoder's reflect padding needs >= 2 latents a side
LORA = "ltx-2.3-22b-ic-lora-clean-plate.safetensors"


def tiny_ltx23_folder(root):
    """A diffusers LTX-2.3 folder of random tiny components (the pipeline's own classes) and an IC-LoRA file.

    Transformer and video VAE reuse the LTX-2.5 route's tiny configs (LTX-2.3+ flags: gated attention,
    prompt modulation, per-modality text projections in the connector); Gemma 3 and its tokenizer are
    built offline from a character vocabulary.
    """
    import torch
    from diffusers import (
        AutoencoderKLLTX2Audio,
        AutoencoderKLLTX2Video,
        FlowMatchEulerDiscreteScheduler,
        LTX2InContextPipeline,
        LTX2VideoTransformer3DModel,
    )
    from diffusers.pipelines.ltx2 import LTX2TextConnectors
    from diffusers.pipelines.ltx2.vocoder import LTX2Vocoder
    from safetensors.torch import save_file
    from transformers import (
        Gemma3Config,
        Gemma3ForConditionalGeneration,
        Gemma3TextConfig,
        GemmaTokenizer,
        SiglipVisionConfig,
    )

    from solarwm.backbones.ltx25 import TINY_LTX_VAE_CONFIG, LTX25Config

    specials = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "\u2581"]
    tokenizer = GemmaTokenizer(
        vocab={t: i for i, t in enumerate(specials + list("abcdefghijklmnopqrstuvwxyz"))}, merges=[]
    )
    text = Gemma3TextConfig(
        vocab_size=36,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        max_position_embeddings=1024,
    )
    vision = SiglipVisionConfig(
        hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=28, patch_size=14
    )
    torch.manual_seed(0)
    text_encoder = Gemma3ForConditionalGeneration(
        Gemma3Config(
            text_config=text,
            vision_config=vision,
            mm_tokens_per_image=4,
            boi_token_index=32,
            eoi_token_index=33,
            image_token_index=34,
        )
    )
    route = LTX25Config.tiny()
    audio = dict(
        audio_in_channels=4,
        audio_out_channels=4,
        audio_num_attention_heads=2,
        audio_attention_head_dim=8,
        audio_cross_attention_dim=16,
        audio_gated_attn=True,
        audio_cross_attn_mod=True,
        audio_ff_bias=False,
    )
    transformer = LTX2VideoTransformer3DModel(
        **route.transformer_kwargs(TINY_LTX_VAE_CONFIG["latent_channels"]), **audio
    )
    connectors = LTX2TextConnectors(
        caption_channels=text.hidden_size,
        text_proj_in_factor=text.num_hidden_layers + 1,
        **route.connector_kwargs(),
        audio_connector_num_attention_heads=2,
        audio_connector_attention_head_dim=8,
        audio_connector_num_layers=1,
        audio_connector_num_learnable_registers=8,
        audio_gated_attn=True,
        per_modality_projections=True,
        video_hidden_dim=route.cross_attention_dim,
        audio_hidden_dim=16,
        connector_rope_base_seq_len=32,
    )
    audio_vae = AutoencoderKLLTX2Audio(
        base_channels=4, ch_mult=(1,), num_res_blocks=1, resolution=32, latent_channels=2, mel_bins=8
    )
    vocoder = LTX2Vocoder(
        in_channels=16,
        hidden_channels=32,
        upsample_kernel_sizes=[4, 4],
        upsample_factors=[2, 2],
        resnet_kernel_sizes=[3],
        resnet_dilations=[[1, 3, 5]],
        output_sampling_rate=16000,
    )
    # LTX-2.3's scheduler config (dynamic exponential shift).
    scheduler = FlowMatchEulerDiscreteScheduler(
        use_dynamic_shifting=True, base_shift=0.95, max_shift=2.05, shift_terminal=0.1, time_shift_type="exponential"
    )
    pipe = LTX2InContextPipeline(
        scheduler=scheduler,
        vae=AutoencoderKLLTX2Video(**TINY_LTX_VAE_CONFIG),
        audio_vae=audio_vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        connectors=connectors,
        transformer=transformer,
        vocoder=vocoder,
    )
    pipe.save_pretrained(root, safe_serialization=True)
    # The IC-LoRA as the LTX-2 trainer writes it: diffusion_model.<module>.lora_A/B.weight, rank 4 on
    # the video self-attention, the reference downscale factor in the safetensors metadata.
    g = torch.Generator().manual_seed(1)
    lora = {}
    for name, module in transformer.named_modules():
        if ".attn1." in name and name.rsplit(".", 1)[-1] in ("to_q", "to_k", "to_v", "0"):
            lora[f"diffusion_model.{name}.lora_A.weight"] = 0.1 * torch.randn(4, module.in_features, generator=g)
            lora[f"diffusion_model.{name}.lora_B.weight"] = 0.1 * torch.randn(module.out_features, 4, generator=g)
    save_file(lora, root / LORA, metadata={"reference_downscale_factor": "1"})
    return root, lora


@pytest.mark.slow
def test_tiny_ltx23_pipeline_end_to_end(tmp_path, capsys):
    """``CleanPlate.from_local`` → ``derive_corpus`` → ``data derive`` rerun, with the real diffusers pipeline."""
    import torch

    from solarwm.cli import main
    from solarwm.data.derive import CleanPlate

    weights, lora = tiny_ltx23_folder(tmp_path / "ltx23")
    src, out = tmp_path / "src", tmp_path / "out"
    good = parent(src, "spatialvid", "street", 81)
    parent(src, "miradata", "rel", 81, units="relative")
    parent(src, "synthetic", "world", 81)

    model = CleanPlate.from_local(weights, device="cpu", model_size=MODEL_SIZE, output_size=OUTPUT_SIZE)
    # The IC-LoRA is loaded (converted from the trainer's keys) and active at scale 1.
    assert model.pipeline.get_active_adapters() == ["clean_plate"] and model.lora_name == LORA
    q = model.pipeline.transformer.transformer_blocks[0].attn1.to_q
    assert torch.equal(
        q.lora_A["clean_plate"].weight, lora["diffusion_model.transformer_blocks.0.attn1.to_q.lora_A.weight"]
    )
    summary = derive_corpus(src, out, model)
    assert summary["line"] == "parents 3 = derived 1 + already derived 0 + failed 1 + not a Clean Plate source 1"
    acc = account(out).total()
    assert (acc["ingested"], acc["failed"], acc["pending"]) == (2, 1, 1) == (summary["eligible"], 1, 1)

    [derived_dir] = derived_dirs(out)
    p, d = read_clip(good), read_clip(derived_dir)
    w, h = OUTPUT_SIZE
    assert d.frames.shape == (81, h, w, 3) and d.frames.dtype == np.uint8 and d.frames.std() > 0
    assert (d.meta["width"], d.meta["height"], d.meta["num_frames"], d.meta["fps"]) == (w, h, 81, 16.0)
    assert d.owner == "spatialvid_clean" and d.clip_id == clip_id("spatialvid_clean", p.clip_id, 0, 81)
    assert d.provenance["lineage"]["parent_clip_id"] == p.clip_id and d.provenance["lineage"]["parent_interval"] == [
        0,
        81,
    ]
    assert np.array_equal(d.c2w, p.c2w) and np.allclose(d.K, resize_intrinsics(p.K, w / 64, h / 36))
    assert d.metrics == {} and d.caption == "" and d.selection is None
    versions = d.provenance["versions"]
    assert versions["model_frames"] == 121 and versions["steps"] == 8 and versions["model_size"] == list(MODEL_SIZE)
    assert versions["lora"] == LORA and versions["reference_downscale_factor"] == 1

    # The CLI's own path (from_local at the published sizes, then the corpus): everything is done already.
    capsys.readouterr()
    assert main(["data", "derive", "--corpus", str(src), "--out", str(out), "--weights", str(weights)]) == 0
    assert (
        "parents 3 = derived 0 + already derived 1 + failed 1 + not a Clean Plate source 1" in capsys.readouterr().err
    )
    assert len(iter_clip_dirs(out)) == 2
