"""The backbone adapter contract: what every stage may ask of a route (paper §4, §6).

A *route* (``wan22_ti2v_5b``, ``wan22_i2v_14b``, ``ltx25``, ``minimax_h3``) wraps the diffusers
transformer and codec of one backbone and exposes, in the route's *native* terms:

* latent geometry: ``temporal_compression``, ``spatial_compression``, ``latent_channels``,
  ``patch_size``, ``valid_num_frames(F)``, ``latent_frames(F)``, ``latent_to_pixel_frame(f)``;
* ``encode(video) -> latents`` / ``decode(latents) -> video`` (video ``[B, 3, F, H, W]`` in [-1, 1]);
* ``prepare_conditions(batch) -> cond``: text features, per-latent-frame cameras, route extras;
* the native objective: ``sample_sigmas``, ``noisy_input``, ``target``, ``loss_mask``, ``timestep_scale``;
* ``forward(x_t, sigma_per_frame, cond, attn_mask=None) -> prediction`` in the native target space;
* causal mode (paper §4.2–4.3): ``frames_per_block`` latent frames per block, a window of
  ``window_blocks`` blocks (the query block plus ``window_blocks - 1`` history blocks, no sink);
  ``forward_teacher_forcing(x_clean, x_noisy, ...)`` on the layout ``[clean | noisy]``, and
  ``forward(..., kv_cache=KVCache, commit=...)`` for block-by-block rollout (``new_cache``);
* the AnyFlow flow map (eq. 2): ``enable_flow_map(gate)`` adds a copy of the time embedding that
  embeds the target time ``r`` (``r_per_frame``) and is mixed in with a fixed gate;
* LoRA (``solarwm.backbones.lora``): ``enable_lora(LoRAConfig)`` wraps ``config.target_modules`` of
  the transformer in peft LoRA layers and freezes its base weights; every route takes
  ``lora: LoRAConfig | None = None`` in ``__init__`` and passes it on: ``BackboneAdapter.__init__`` calls
  ``self.enable_lora(lora)`` last, so a route never calls it itself;
  ``merge_lora()`` folds it into the base weights;
* export: ``save_adapter(dir, stage=None, merge_lora=False)`` / ``BackboneAdapter.load_adapter(dir)``.

Stages (``solarwm.stages``) speak only this contract and never import a route module.

The batch a stage receives from a datamodule is a dict with
``video`` float32 ``[B, 3, F, H, W]`` in [-1, 1]; ``c2w`` float32 ``[B, F, 4, 4]`` (OpenCV, metric);
``K`` float32 ``[B, F, 4]`` (fx, fy, cx, cy) in pixels of ``video``; ``caption`` list[str];
``sample_id`` list[str]; optional ``text_embeds`` ``[B, L, D]`` + ``text_mask`` bool ``[B, L]``;
optional ``latents`` ``[B, C, f, h, w]`` (cached latents: ``encode`` is skipped); optional
``sample_index`` int64 ``[B]`` (the samples' logical indices in the training stream, which key their
per-sample noise so that a step is the same on any number of ranks; absent: the global RNG keys them).

The export folder ``save_adapter(dir)`` writes, and the route registry: ``solarwm.backbones.export``.
"""

from __future__ import annotations

import abc
import contextlib
import dataclasses
from pathlib import Path
from typing import Any, Callable, ClassVar, Literal

import torch

from solarwm.backbones.export import (  # noqa: F401  (re-exported: the contract's names)
    ADAPTER_SCHEMA,
    ROUTES,
    AdapterError,
    load_adapter,
    read_adapter_json,
    read_export,
    register_route,
    route_class,
    transformer_block_class,
    write_export,
)
from solarwm.backbones.lora import LoRAConfig
from solarwm.backbones.text import zero_padding
from solarwm.backbones.weights import AdapterWeights
from solarwm.camera.se3 import relative_pose, se3_inverse
from solarwm.kernels.kv_cache import CacheWindow, KVCache
from solarwm.kernels.masks import causal_mask
from solarwm.objectives.flow_matching import flow_interpolate, flow_velocity, masked_mse, shift_sigmas

#: Standard deviation of the latents the ``x0_skip`` preconditioning assumes (pixels in [-1, 1] through the
#: lossless patchify codec: about 0.5).
X0_SKIP_SIGMA_DATA = 0.5


def x0_skip_velocity(out: torch.Tensor, x_t: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
    """Velocity ``(x_t - x̂0)/σ`` for ``x̂0 = c_skip·x_t + c_out·out`` (EDM preconditioning on ``x_t = (1-σ)x0 + σε``).

    ``c_skip = (1-σ)σ_d²/D`` and ``c_out = σσ_d/√D`` with ``D = (1-σ)²σ_d² + σ²`` (Karras et al. 2022, eq. 7,
    for this interpolation): at σ → 0 the estimate is ``x_t`` itself, so a small network no longer has to learn
    the identity (an x0-only head leaves token-sized errors in the last sampling steps: mosaic frames), and at
    σ = 1 it is ``σ_d·out``. Written without dividing by σ, so it is exact at σ = 0 (anchor frames).
    ``sigma`` broadcasts to ``x_t``.
    """
    sd2 = X0_SKIP_SIGMA_DATA**2
    keep = 1.0 - sigma
    d = keep**2 * sd2 + sigma**2
    return (sigma - keep * sd2) / d * x_t - (X0_SKIP_SIGMA_DATA / d.sqrt()) * out


class BackboneAdapter(AdapterWeights, torch.nn.Module, abc.ABC):
    """Abstract adapter around one route's diffusers transformer + codec (see module docstring).

    Subclasses set the class attributes below, build ``self.transformer`` (a diffusers ``ModelMixin``)
    in ``__init__`` and implement the abstract methods. Frozen parts (codec/VAE, text encoder) must have
    ``requires_grad=False``; ``trainable_parameters()`` then yields exactly what a stage optimises.
    Every route takes ``lora: LoRAConfig | None = None`` and passes it to this class's ``__init__``, which ends with
    ``self.enable_lora(lora)``.
    """

    #: Route name as in ``ROUTES`` and in ``adapter.json``.
    route: ClassVar[str] = ""
    #: ``"module:Class"`` of the transformer's repeated block: the FSDP wrap and activation-checkpointing
    #: unit (`solarwm.strategies.RouteFSDPStrategy`).
    transformer_block: ClassVar[str] = ""
    #: Dataclass type of the route config; must be JSON-serialisable through ``dataclasses.asdict``.
    config_class: ClassVar[type]

    #: Pixel frames per latent frame (after the first, which stands alone: F = t*n + 1 -> n + 1).
    temporal_compression: int
    #: Pixels per latent pixel along H and W.
    spatial_compression: int
    #: Channels C of the latents ``[B, C, f, h, w]``.
    latent_channels: int
    #: Latent pixels per token side (Wan: 2, i.e. one token per 2x2 latent pixels of one latent frame).
    patch_size: int
    #: sigma -> model timestep (Wan: 1000 * sigma).
    timestep_scale: float = 1000.0
    #: Flow timestep shift applied by ``sample_sigmas`` and the sampler.
    shift: float = 1.0
    #: Leading latent frames that are clean conditions: never noised (sigma 0), never supervised (TI2V: 1).
    clean_latent_frames: int = 0
    #: Latent frames per causal block (Wan2.2-5B: 3, MiniMax-H3: 5).
    frames_per_block: int = 3
    #: Blocks a causal query attends to: its own plus ``window_blocks - 1`` history blocks (no sink).
    window_blocks: int = 6
    #: The clip's first latent frames every causal block also attends to (the attention sink; ``set_sink``).
    sink_frames: int = 0
    #: Whether the route's cached attention reads a sink apart from the window (``CacheWindow.positions``).
    supports_sink: ClassVar[bool] = False
    #: Noise level of the history a rollout commits (the block's x0 re-noised to it; stage 2's context noise).
    commit_sigma: float = 0.0
    #: AnyFlow gate of the r-embedding when the flow map is enabled (``enable_flow_map``), else None.
    flow_map_gate: float | None = None
    #: Attributes holding the frozen parts, in ``frozen_parts`` order (an attribute that is None is skipped).
    frozen_part_names: ClassVar[tuple[str, ...]] = ("codec", "text_encoder")
    #: ``cond`` entries indexed ``[B, f, ...]`` by latent frame (checked per call, sliced per causal block).
    per_frame_conditions: ClassVar[tuple[str, ...]] = ("c2w", "K")
    #: The route's attention takes only dense masks (``forward`` refuses a FlexAttention ``BlockMask``).
    dense_masks_only: ClassVar[bool] = False
    #: What ``text_features`` says when a batch has no ``text_embeds`` and there is no text encoder.
    missing_text_message: ClassVar[str] = "batch has no 'text_embeds' and the adapter has text_encoder='none'"

    transformer: torch.nn.Module
    config: Any

    def __init__(
        self,
        config: Any = None,
        preset: Literal["tiny", "published"] = "tiny",
        pretrained_path: str | None = None,
        device: str | None = None,
        lora: LoRAConfig | None = None,
    ) -> None:
        """The preamble every route shares: preset -> config, weight checks, build, freeze, processors, LoRA.

        ``config`` (default: ``preset``'s ``config_class.tiny()`` / ``.published()``, copied); ``pretrained_path``:
        a local checkpoint or export folder; ``device`` builds the codec and model under ``torch.device(device)``
        (``"meta"``: no weights allocated, for parameter counting); ``lora``: ``enable_lora`` last. A route
        supplies ``check_config``, ``_build_codec``, ``_build_model``, ``_build_text_encoder``, ``_build_extras``
        and ``install_processors``; it keeps its own typed ``__init__`` signature (YAML ``init_args``) and calls
        this one.
        """
        super().__init__()
        self.delta_embedding: torch.nn.Module | None = None  # the AnyFlow r-embedding (enable_flow_map)
        self._flow_map_r: torch.Tensor | None = None  # per-token r of the current call (set by forward)
        self.lora_config: LoRAConfig | None = None  # the transformer's LoRA (enable_lora), None = full weights
        if config is None:
            config = self.config_class.tiny() if preset == "tiny" else self.config_class.published()
        self.require_weights(preset, pretrained_path, device)  # before a published-size model is built at random
        self.config = config = dataclasses.replace(config)
        self.check_config(config)
        self.shift = config.shift
        root = Path(pretrained_path) if pretrained_path is not None else None
        if root is not None and not root.is_dir():
            raise AdapterError(f"{self.route}: pretrained_path {root} does not exist")
        self.check_pretrained_export(root)
        meta = device == "meta"
        with torch.device(device) if device is not None else contextlib.nullcontext():
            self.codec = self._build_codec(root)
            self.temporal_compression = self.codec.temporal_compression
            self.spatial_compression = self.codec.spatial_compression
            self.latent_channels = self.codec.latent_channels
            self._build_model(root, meta)
        self.text_encoder = self._build_text_encoder(root, meta)
        self._build_extras(root, device)
        # Only the transformer trains; the codec, text encoder (and any other frozen part) never do.
        for part in self.frozen_parts().values():
            part.requires_grad_(False).eval()
        self.install_processors()
        self.enable_lora(lora)

    # ------------------------------------------------------------------ building (route hooks)
    def check_config(self, config: Any) -> None:
        """Refuse a config the route cannot build, before anything is built (route hook; default: patch size)."""
        patch = getattr(config, "patch_size", None)
        if isinstance(patch, tuple):
            if patch[0] != 1 or patch[1] != patch[2]:
                raise AdapterError(f"{self.route}: patch_size must be (1, p, p), got {patch}")
            self.patch_size = patch[1]

    @abc.abstractmethod
    def _build_codec(self, root: Path | None) -> torch.nn.Module:
        """The codec (``temporal_compression``, ``spatial_compression``, ``latent_channels``, encode/decode)."""

    @abc.abstractmethod
    def _build_model(self, root: Path | None, meta: bool) -> None:
        """Set ``self.transformer`` (and any other part built under the device, e.g. LTX's connector)."""

    @abc.abstractmethod
    def _build_text_encoder(self, root: Path | None, meta: bool) -> torch.nn.Module | None:
        """The frozen text encoder, or None (batches then carry ``text_embeds``)."""

    def _build_extras(self, root: Path | None, device: str | None) -> None:
        """Anything built after the text encoder (route hook; default: nothing)."""

    @abc.abstractmethod
    def install_processors(self) -> None:
        """Put the route's camera attention processors (and any hooks they need) on the transformer."""

    # ------------------------------------------------------------------ latent geometry
    def valid_num_frames(self, num_frames: int) -> bool:
        """True when ``num_frames`` = temporal_compression * n + 1 for some n >= 0 (Wan: 4n + 1)."""
        return num_frames >= 1 and (num_frames - 1) % self.temporal_compression == 0

    def latent_frames(self, num_frames: int) -> int:
        """Number of latent frames f for ``num_frames`` pixel frames (raises on an invalid count)."""
        if not self.valid_num_frames(num_frames):
            raise AdapterError(
                f"{self.route}: {num_frames} frames is not a valid clip length "
                f"(needs {self.temporal_compression}*n + 1)"
            )
        return (num_frames - 1) // self.temporal_compression + 1

    def latent_to_pixel_frame(self, num_latent_frames: int) -> torch.Tensor:
        """LongTensor ``[f]``: the pixel frame each latent frame stands for (latent i <- frame t*i)."""
        return torch.arange(num_latent_frames, dtype=torch.long) * self.temporal_compression

    def latent_camera_frames(self, num_latent_frames: int) -> torch.Tensor:
        """LongTensor ``[f]``: the pixel frame whose camera latent frame i carries (default: latent_to_pixel_frame)."""
        return self.latent_to_pixel_frame(num_latent_frames)

    def tokens_per_frame(self, latent_height: int, latent_width: int) -> int:
        """Tokens one latent frame becomes after patchify (tokens are frame-major)."""
        if latent_height % self.patch_size or latent_width % self.patch_size:
            raise AdapterError(
                f"{self.route}: latent size {latent_height}x{latent_width} not divisible by patch {self.patch_size}"
            )
        return (latent_height // self.patch_size) * (latent_width // self.patch_size)

    # ------------------------------------------------------------------ codec
    def encode(self, video: torch.Tensor) -> torch.Tensor:
        """``video [B, 3, F, H, W]`` in [-1, 1] -> normalised latents ``[B, C, f, h, w]`` (``self.codec``)."""
        return self.codec.encode(video)

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Latents ``[B, C, f, h, w]`` -> ``video [B, 3, F, H, W]`` in [-1, 1] (``self.codec``, clamped)."""
        return self.codec.decode(latents).clamp(-1.0, 1.0)

    def stream_decoder(self) -> Callable[[torch.Tensor], torch.Tensor]:
        """A decoder of consecutive latent blocks ``[B, C, n, h, w]`` of one clip -> their video frames.

        Concatenated, its outputs equal ``decode`` of the whole clip; memory does not grow with the
        number of blocks (causal codecs keep one continuous cache). Default: the codec's own
        ``stream_decoder()``, clamped to [-1, 1]; routes whose codec cannot stream override it. The returned
        callable's ``state`` attribute (a dict, mutated in place) is the stream's whole state: copying it
        forks the stream (``solarwm.rollout.session.RolloutSession.state_dict``); None when it cannot fork.
        """
        if getattr(getattr(self, "codec", None), "stream_decoder", None) is None:
            raise NotImplementedError(f"{self.route}: streaming decode is not implemented")
        decode_block = self.codec.stream_decoder()

        def clamped(latents: torch.Tensor) -> torch.Tensor:
            return decode_block(latents).clamp(-1.0, 1.0)

        clamped.state = getattr(decode_block, "state", None)  # the stream's state, for a forked rollout
        return clamped

    # ------------------------------------------------------------------ conditions
    def _image_size(self, batch: dict[str, Any]) -> tuple[int, int]:
        """The frame size ``(W, H)`` in pixels: from ``video``, ``image_size`` or the ``latents``' size."""
        if "video" in batch:
            return int(batch["video"].shape[-1]), int(batch["video"].shape[-2])
        if "image_size" in batch:
            width, height = batch["image_size"]
            return int(width), int(height)
        if "latents" in batch:
            h, w = batch["latents"].shape[-2:]
            return int(w) * self.spatial_compression, int(h) * self.spatial_compression
        raise AdapterError(f"{self.route}: batch needs 'video', 'image_size' or 'latents' to know the frame size")

    def text_features(self, batch: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(text_embeds [B, L, text_dim], mask [B, L] or None)``: precomputed if present, else encoded."""
        if "text_embeds" in batch:
            embeds, mask = batch["text_embeds"], batch.get("text_mask")
            if mask is not None:
                embeds = zero_padding(embeds, mask.to(embeds.device))
        elif self.text_encoder is not None:
            embeds, mask = self.text_encoder(list(batch["caption"]))
        else:
            raise AdapterError(f"{self.route}: {self.missing_text_message}")
        if embeds.shape[-1] != self.config.text_dim:
            raise AdapterError(
                f"{self.route}: text features have dim {embeds.shape[-1]}, transformer expects {self.config.text_dim}"
            )
        return embeds, mask

    @abc.abstractmethod
    def prepare_conditions(self, batch: dict[str, Any]) -> dict[str, Any]:
        """Build ``cond`` from a batch: text features, ``viewmats`` w2c ``[B, f, 4, 4]``, ``K`` ``[B, f, 4]``,
        ``image_size`` (W, H) and route extras. See the module docstring for the batch keys."""

    def frame_condition_stream(self, first_frame: torch.Tensor) -> Callable[[int], dict[str, torch.Tensor]]:
        """Per-latent-frame route extras (beyond the cameras) of an open-ended rollout, block after block.

        Calls give the entries of ``per_frame_conditions`` other than ``c2w``/``K`` for the next ``n`` latent
        frames (``[B, n, ...]``), so a rollout needs no horizon up front; ``first_frame [B, 3, H, W]`` in
        [-1, 1]. The callable's ``state`` dict is its whole state (a forked rollout copies it). Default: no
        extras. Concatenated, the outputs equal ``prepare_conditions``' entries for the whole clip.
        """

        def none(n: int) -> dict[str, torch.Tensor]:
            return {}

        none.state = {}
        return none

    # ------------------------------------------------------------------ native objective
    def sample_sigmas(
        self, batch_size: int, generator: torch.Generator | None = None, u: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Noise levels ``[B]``: the route's shift applied to ``u`` (uniform in (0, 1) if not given)."""
        if u is None:
            u = torch.rand(batch_size, generator=generator, device=generator.device if generator else None)
        if u.shape != (batch_size,):
            raise ValueError(f"u must have shape ({batch_size},), got {tuple(u.shape)}")
        return shift_sigmas(u, self.shift)

    def noisy_input(
        self, x0: torch.Tensor, noise: torch.Tensor, sigma: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(x_t [B, C, f, h, w], sigma_per_frame [B, f])`` for per-sample ``sigma [B]``.

        Default: every latent frame gets the sample's sigma. Routes with a clean anchor override
        ``clean_latent_frames`` (TI2V: 1) so those frames stay ``x0`` with sigma 0.
        """
        b, _, f = x0.shape[:3]
        sigma_pf = sigma.to(x0.device, torch.float32).view(b, 1).expand(b, f).clone()
        sigma_pf[:, : self.clean_latent_frames] = 0.0
        x_t = flow_interpolate(x0, noise, sigma_pf.to(x0.dtype).view(b, 1, f, 1, 1))
        return x_t, sigma_pf

    def target(self, x0: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """The native regression target; flow routes: ``noise - x0`` (velocity d x_sigma / d sigma)."""
        return flow_velocity(x0, noise)

    def loss_mask(self, x0: torch.Tensor) -> torch.Tensor:
        """``[B, 1, f, 1, 1]`` float: 1 on supervised latent frames, 0 on clean anchor frames."""
        b, _, f = x0.shape[:3]
        mask = torch.ones(b, 1, f, 1, 1, device=x0.device, dtype=x0.dtype)
        mask[:, :, : self.clean_latent_frames] = 0.0
        return mask

    def loss(
        self,
        prediction: torch.Tensor,
        target: torch.Tensor,
        mask: torch.Tensor,
        weight: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Masked MSE of eq. (1) over supervised latent elements, optionally weighted per sample ``[B]``."""
        return masked_mse(prediction, target, mask, weight)

    def latent_cameras(self, c2w: torch.Tensor, K: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Cameras of the latent frames: c2w ``[B, f, 4, 4]`` float64 and K ``[B, f, 4]`` from per-pixel-frame ones.

        ``c2w [B, F, 4, 4]``, ``K [B, F, 4]``; F may be any valid clip length (an hour-long track too).
        """
        if c2w.dim() != 4 or c2w.shape[-2:] != (4, 4) or K.shape != c2w.shape[:2] + (4,):
            raise AdapterError(
                f"{self.route}: c2w must be [B, F, 4, 4] and K [B, F, 4]; got {tuple(c2w.shape)}, {tuple(K.shape)}"
            )
        idx = self.latent_camera_frames(self.latent_frames(c2w.shape[1])).to(c2w.device)
        return c2w[:, idx].to(torch.float64), K[:, idx].float()

    # ------------------------------------------------------------------ model call
    def forward(
        self,
        x_t: torch.Tensor,
        sigma_per_frame: torch.Tensor,
        cond: dict[str, Any],
        attn_mask: torch.Tensor | None = None,
        kv_cache: KVCache | None = None,
        commit: bool = False,
        r_per_frame: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Prediction ``[B, C, f, h, w]`` in the native target space for ``x_t`` at ``sigma_per_frame [B, f]``.

        Without a cache: all ``f`` frames at temporal positions ``0..f-1`` under ``attn_mask`` (a dense bool
        token mask, True = may attend, ``[N, N]`` or ``[B, 1, N, N]``; None = bidirectional).
        With ``kv_cache``: ``x_t`` is one block that attends to the cached window and itself at window-local
        positions; ``commit=True`` appends its K/V and cameras to the cache (the clean block at sigma 0).
        ``r_per_frame [B, f]``: the flow map's target noise level (needs ``enable_flow_map``; None = sigma).
        The route supplies the attention contexts and ``run_transformer``; the control flow is this one.
        """
        self._check_input(x_t, sigma_per_frame, cond)
        self._check_cache_call(attn_mask, kv_cache, commit)
        self._check_flow_map(r_per_frame)
        if kv_cache is None:
            context = self.attention_context(x_t, cond, attn_mask)
        else:
            window = self.cache_window(cond, kv_cache, x_t.shape[2])
            context = self.cached_attention_context(x_t, cond, window, kv_cache, commit)
        out = self._cached_call(
            lambda: self.run_transformer(x_t, sigma_per_frame, r_per_frame, cond, context), cond, kv_cache, commit
        )
        return self.native_output(out, x_t, sigma_per_frame)

    def forward_teacher_forcing(
        self,
        x_clean: torch.Tensor,
        x_noisy: torch.Tensor,
        sigma_per_frame: torch.Tensor,
        cond: dict[str, Any],
        r_per_frame: torch.Tensor | None = None,
        sigma_clean: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Teacher-forced causal prediction ``[B, C, f, h, w]`` for the noisy copy.

        One call over the layout ``[clean | noisy]`` (clean at sigma 0 and r = t = 0; both copies share
        temporal positions, cameras and per-frame conditions) under the teacher-forcing mask: noisy block i
        sees clean blocks ``[i - window_blocks + 1, i)`` and itself.
        ``sigma_clean [B, f]``: the history copy's own noise levels when it is noised (context noise; r = t
        there too); None = sigma 0.
        """
        self._check_teacher_forcing(x_clean, x_noisy, sigma_per_frame, cond)
        self._check_flow_map(r_per_frame)
        f = x_noisy.shape[2]
        context = self.teacher_forcing_context(x_noisy, cond)
        history = torch.zeros_like(sigma_per_frame) if sigma_clean is None else sigma_clean.to(sigma_per_frame)
        if history.shape != sigma_per_frame.shape:
            raise AdapterError(
                f"{self.route}: sigma_clean {tuple(history.shape)} must match sigma {tuple(sigma_per_frame.shape)}"
            )
        sigma_full = torch.cat([history, sigma_per_frame], 1)
        r_full = None if r_per_frame is None else torch.cat([history, r_per_frame], 1)  # AnyFlow: r_clean = t_clean
        out = self.run_transformer(torch.cat([x_clean, x_noisy], 2), sigma_full, r_full, cond, context, copies=2)
        return self.native_output(out[:, :, f:], x_noisy, sigma_per_frame)

    # ------------------------------------------------------------------ model call (route hooks)
    @abc.abstractmethod
    def attention_context(self, x_t: torch.Tensor, cond: dict[str, Any], attn_mask: torch.Tensor | None) -> Any:
        """The route's attention context of an uncached call: all frames at positions ``0..f-1`` under ``attn_mask``."""

    @abc.abstractmethod
    def cached_attention_context(
        self, x_t: torch.Tensor, cond: dict[str, Any], window: CacheWindow, cache: KVCache, commit: bool
    ) -> Any:
        """The route's attention context of one block over its cached ``window`` (``cache_window``)."""

    @abc.abstractmethod
    def teacher_forcing_context(self, x_noisy: torch.Tensor, cond: dict[str, Any]) -> Any:
        """The route's attention context of the ``[clean | noisy]`` layout with the teacher-forcing mask."""

    @abc.abstractmethod
    def run_transformer(
        self,
        x: torch.Tensor,
        sigma_per_frame: torch.Tensor,
        r_per_frame: torch.Tensor | None,
        cond: dict[str, Any],
        context: Any,
        copies: int = 1,
    ) -> torch.Tensor:
        """The route's model call on ``x [B, C, F, h, w]`` at ``sigma_per_frame [B, F]``, output ``[B, C, F, h, w]``.

        ``copies``: ``x`` holds the per-frame conditions' frames that many times over (teacher forcing: 2).
        """

    def sampler_sigma(self, sigma: torch.Tensor) -> torch.Tensor:
        """The σ a few-step sampler turns the model's velocity at ``sigma`` into x0 with (default: ``sigma`` itself)."""
        return sigma

    def native_output(self, out: torch.Tensor, x_t: torch.Tensor, sigma_per_frame: torch.Tensor) -> torch.Tensor:
        """The transformer output as the contract's flow target (x0-output configs return the velocity)."""
        if self.config.prediction == "x0":
            # Clamped like JiT so the division stays bounded near σ = 0 (anchor frames are masked out).
            sigma = sigma_per_frame.to(x_t.dtype).clamp_min(0.05)[:, None, :, None, None]
            out = (x_t - out) / sigma
        elif self.config.prediction == "x0_skip":
            out = x0_skip_velocity(out, x_t, sigma_per_frame.to(x_t.dtype)[:, None, :, None, None])
        return out

    # ------------------------------------------------------------------ model call (shared parts)
    def cache_window(self, cond: dict[str, Any], cache: KVCache, frames: int) -> CacheWindow:
        """The block's window: the cache's committed cameras followed by the block's own ``frames``."""
        device = cond["c2w"].device
        c2w = cond["c2w"] if cache.c2w is None else torch.cat([cache.c2w.to(device), cond["c2w"]], 1)
        K = cond["K"] if cache.K is None else torch.cat([cache.K.to(device), cond["K"]], 1)
        sink = cache.held_sink if cache.evicted else 0
        return CacheWindow(c2w, K, frames, cache.evicted and cache.held_sink == 0, sink)

    def teacher_forcing_mask(self, x_noisy: torch.Tensor) -> torch.Tensor:
        """Dense token mask of ``[clean | noisy]`` for ``x_noisy [B, C, f, h, w]`` (``kernels.masks``)."""
        _, _, f, h, w = x_noisy.shape
        return causal_mask(
            "teacher_forcing",
            f,
            self.tokens_per_frame(h, w),
            self.frames_per_block,
            device=x_noisy.device,
            max_prior_blocks=self.window_blocks - 1,
            sink_frames=self.sink_frames,
        )

    def set_sink(self, frames: int) -> None:
        """Keep the clip's first ``frames`` latent frames (at most one block; 0 = none) in every causal window."""
        if not 0 <= frames <= self.frames_per_block:
            raise AdapterError(f"{self.route}: sink_frames must be in [0, {self.frames_per_block}], got {frames}")
        if frames and not self.supports_sink:
            raise AdapterError(f"{self.route}: this route's cached attention has no attention sink (sink_frames)")
        self.sink_frames = frames

    def _check_input(self, x_t: torch.Tensor, sigma_per_frame: torch.Tensor, cond: dict[str, Any]) -> None:
        """Check ``x_t [B, C, f, h, w]``, ``sigma_per_frame [B, f]`` and that every per-frame condition covers them."""
        if x_t.dim() != 5 or x_t.shape[1] != self.latent_channels:
            raise AdapterError(
                f"{self.route}: x_t must be [B, {self.latent_channels}, f, h, w], got {tuple(x_t.shape)}"
            )
        b, _, f = x_t.shape[:3]
        if sigma_per_frame.shape != (b, f):
            raise AdapterError(f"{self.route}: sigma_per_frame must be [{b}, {f}], got {tuple(sigma_per_frame.shape)}")
        for name in self.per_frame_conditions:
            if name not in cond:
                raise AdapterError(f"{self.route}: cond has no {name!r} (build cond with prepare_conditions)")
            if tuple(cond[name].shape[:2]) != (b, f):
                raise AdapterError(
                    f"{self.route}: cond[{name!r}] covers {tuple(cond[name].shape[:2])} (batch, latent frames), "
                    f"latents are ({b}, {f})"
                )

    def _check_cache_call(self, attn_mask: torch.Tensor | None, kv_cache: KVCache | None, commit: bool) -> None:
        """``commit=True`` needs a ``kv_cache``; a cached forward takes no ``attn_mask`` (the block sees its window)."""
        if self.dense_masks_only and attn_mask is not None and not isinstance(attn_mask, torch.Tensor):
            raise AdapterError(
                f"{self.route}: attn_mask must be a dense bool tensor (FlexAttention masks are not supported)"
            )
        if kv_cache is None and commit:
            raise AdapterError(f"{self.route}: commit=True needs a kv_cache")
        if kv_cache is not None and attn_mask is not None:
            raise AdapterError(f"{self.route}: a cached forward takes no attn_mask (the block sees its window)")

    def _check_flow_map(self, r_per_frame: torch.Tensor | None) -> None:
        """An ``r_per_frame`` needs the flow map (``enable_flow_map``)."""
        if r_per_frame is not None and self.delta_embedding is None:
            raise AdapterError(f"{self.route}: r_per_frame given but the flow map is not enabled (enable_flow_map)")

    def _check_teacher_forcing(
        self, x_clean: torch.Tensor, x_noisy: torch.Tensor, sigma_per_frame: torch.Tensor, cond: dict[str, Any]
    ) -> None:
        """``_check_input`` of the noisy copy; the clean copy must have the same shape."""
        self._check_input(x_noisy, sigma_per_frame, cond)
        if x_clean.shape != x_noisy.shape:
            raise AdapterError(f"{self.route}: clean {tuple(x_clean.shape)} and noisy {tuple(x_noisy.shape)} differ")

    def _cached_call(
        self, run: Callable[[], torch.Tensor], cond: dict[str, Any], kv_cache: KVCache | None, commit: bool
    ) -> torch.Tensor:
        """``run()``; on an error the cache drops what it staged, else ``commit=True`` commits the block's cameras."""
        try:
            out = run()
        except BaseException:
            if kv_cache is not None:
                kv_cache.discard_staged()
            raise
        if commit:
            kv_cache.commit(cond["c2w"], cond["K"])
        return out

    def new_cache(self, latent_height: int, latent_width: int) -> KVCache:
        """An empty sliding-window cache: ``window_blocks - 1`` blocks of history for every layer."""
        return KVCache(
            num_layers=self.num_layers,
            max_frames=(self.window_blocks - 1) * self.frames_per_block,
            tokens_per_frame=self.tokens_per_frame(latent_height, latent_width),
            sink_frames=self.sink_frames,
        )

    @property
    def num_layers(self) -> int:
        """Transformer blocks with a KV-cache slot."""
        return len(self.transformer.blocks)

    def block_slices(self, num_latent_frames: int) -> list[slice]:
        """The causal blocks of ``num_latent_frames`` latent frames (the last may be shorter)."""
        fpb = self.frames_per_block
        return [slice(s, min(s + fpb, num_latent_frames)) for s in range(0, num_latent_frames, fpb)]

    @staticmethod
    def window_viewmats(c2w: torch.Tensor, reference: int) -> torch.Tensor:
        """w2c ``[B, f, 4, 4]`` float32 of c2w ``[B, f, 4, 4]`` re-expressed relative to frame ``reference``.

        PRoPE only sees relative transforms, so this changes nothing in exact arithmetic; done in float64
        it keeps float32 precision for a camera kilometres away from the world origin.
        """
        c2w = c2w.to(torch.float64)
        return se3_inverse(relative_pose(c2w[:, reference : reference + 1], c2w)).float()

    # ------------------------------------------------------------------ parameters
    def frozen_parts(self) -> dict[str, torch.nn.Module]:
        """The frozen modules by attribute name (codec, text encoder): what DMD's three roles share."""
        parts = {}
        for name in self.frozen_part_names:
            part = getattr(self, name, None)
            if part is not None:
                parts[name] = part
        return parts

    def train(self, mode: bool = True) -> "BackboneAdapter":
        """Switch the transformer's mode; frozen parts stay in eval mode."""
        super().train(mode)
        for part in self.frozen_parts().values():
            part.eval()
        return self
