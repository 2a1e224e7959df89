"""`solarwm fit | validate | test | predict --config recipes/<name>.yaml`.

``fit``/``validate``/``test`` are `LightningCLI` subcommands: the recipe YAML names every
object as ``class_path`` + ``init_args`` and jsonargparse checks the whole file against
the constructors' signatures (unknown key, wrong type) before anything is built.

``predict`` (this stage: a bidirectional clip) is a plain typed function: one first
frame (an image file or a clip folder), a caption and a camera trajectory become an
mp4, with the weights from a Lightning checkpoint (``--checkpoint``, the model built
from ``--config``) or an exported adapter folder (``--adapter``)::

    solarwm predict --config recipes/tiny_bid.yaml --checkpoint runs/tiny_bid/checkpoints/last.ckpt \\
        --first_frame frame.png --caption "a street" --trajectory traj.json --output out.mp4
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml
from lightning.pytorch import LightningDataModule, LightningModule
from lightning.pytorch.cli import LightningCLI

VERBS = ("fit", "validate", "test", "predict")


class SolarCLI(LightningCLI):
    """LightningCLI with the recipe conventions: subclass mode for model and data, strict YAML."""

    def __init__(self, args: list[str] | None = None, run: bool = True) -> None:
        super().__init__(
            model_class=LightningModule,
            datamodule_class=LightningDataModule,
            subclass_mode_model=True,
            subclass_mode_data=True,
            args=args,
            run=run,
            # A re-run into the same log folder rewrites its config.yaml instead of refusing.
            save_config_kwargs={"overwrite": True},
            # No environment variables may change a recipe behind the YAML's back.
            parser_kwargs={"default_env": False},
            auto_configure_optimizers=False,
        )

    def _parse_ckpt_path(self) -> None:
        """A recipe given with ``--config`` decides the model; checkpoint hyperparameters only fill in without one.

        Lightning (2.6) parses the checkpoint's saved hyperparameters over the whole config, so
        ``solarwm test --config R --ckpt_path C --model.init_args.sample_steps 4`` silently tested with
        the steps saved in C (Lightning-AI/pytorch-lightning#21455 is the open upstream fix).
        """
        if self.config.get("subcommand") and self.config[self.config.subcommand].get("config"):
            return
        super()._parse_ckpt_path()


class _ParseOnlyCLI(SolarCLI):
    """The same parser and checks as `SolarCLI`, stopping before anything is instantiated."""

    def instantiate_classes(self) -> None:
        """Skip building trainer, model and data."""


def parse_recipe(config: str) -> Any:
    """Parse and check a recipe as ``solarwm fit --config`` does, building nothing (a Namespace)."""
    return _ParseOnlyCLI(args=["--config", config], run=False).config


def _first_frame(path: Path) -> np.ndarray:
    """uint8 ``[H, W, 3]`` from an image file or the first frame of a canonical clip folder."""
    if path.is_dir():
        from solarwm.data.video import read_video

        if not (path / "video.mp4").is_file():
            raise FileNotFoundError(f"{path}: not a clip folder (no video.mp4)")
        return read_video(path / "video.mp4")[0]
    if not path.is_file():
        raise FileNotFoundError(f"{path}: first frame not found (an image file or a clip folder)")
    from PIL import Image

    with Image.open(path) as image:
        return np.asarray(image.convert("RGB"))


def _recipe(config: str | None) -> dict[str, Any]:
    """The parsed recipe YAML (empty without one)."""
    if config is None:
        return {}
    path = Path(config)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: recipe not found")
    return yaml.safe_load(path.read_text()) or {}


def _stage_from_recipe(recipe: dict[str, Any], config: str, adapter: Any = None) -> LightningModule:
    """Build the recipe's ``model`` with jsonargparse (checked like fit); ``adapter`` replaces its adapter."""
    from jsonargparse import ArgumentParser, Namespace

    if "model" not in recipe:
        raise ValueError(f"{config}: recipe has no `model` section")
    section = recipe["model"]
    parser = ArgumentParser(exit_on_error=False, default_env=False)
    if adapter is None:
        parser.add_subclass_arguments(LightningModule, "model", required=True)
        cfg = parser.parse_object({"model": section})
        return parser.instantiate_classes(cfg).model
    module_name, _, class_name = section["class_path"].rpartition(".")
    stage_cls = getattr(importlib.import_module(module_name), class_name)
    init_args = {k: v for k, v in (section.get("init_args") or {}).items() if k != "adapter"}
    parser.add_class_arguments(stage_cls, "model", skip={"adapter"}, instantiate=False)
    cfg = parser.instantiate_classes(parser.parse_object({"model": init_args}))
    kwargs = cfg.model.as_dict() if isinstance(cfg.model, Namespace) else dict(cfg.model)
    return stage_cls(adapter=adapter, **kwargs)


def _load_checkpoint(module: LightningModule, checkpoint: Path, use_ema: bool) -> bool:
    """Load a Lightning checkpoint (its EMA average if asked and present) into the recipe's ``module``.

    A checkpoint tagged with another stage or route is refused with a message naming both.
    """
    from solarwm.stages.checkpoints import StageCheckpointError, checkpoint_stage, module_state, read_checkpoint

    state = read_checkpoint(checkpoint)
    tag = checkpoint_stage(state)
    stage = getattr(module, "stage_name", None)
    route = getattr(getattr(module, "adapter", None), "route", None)
    if tag.get("stage") and stage and tag["stage"] != stage:
        raise StageCheckpointError(f"{checkpoint} is a {tag['stage']!r} checkpoint; the recipe builds stage {stage!r}")
    if tag.get("route") and route and tag["route"] != route:
        raise StageCheckpointError(f"{checkpoint} holds route {tag['route']!r}; the recipe builds route {route!r}")
    weights, ema_used = module_state(state, use_ema)
    result = module.load_state_dict(weights, strict=False)
    if result.missing_keys or result.unexpected_keys:
        raise StageCheckpointError(
            f"{checkpoint} does not match the recipe's model {type(module).__name__} "
            f"({type(getattr(module, 'adapter', module)).__name__}): "
            f"{len(result.missing_keys)} missing keys (e.g. {result.missing_keys[:3]}), "
            f"{len(result.unexpected_keys)} unexpected keys (e.g. {result.unexpected_keys[:3]})"
        )
    return ema_used


CAUSAL_STAGES = ("tf_anyflow", "dmd")
#: Stage arguments that name the previous stage's weights (not needed when a checkpoint is loaded).
INIT_KEYS = ("init_from",)


def _build_generator(
    recipe: dict[str, Any], config: str | None, checkpoint: str | None, adapter: str | None, use_ema: bool
) -> tuple[Any, bool, bool]:
    """``(module or adapter, causal, ema_used)`` from ``--checkpoint`` + ``--config`` or ``--adapter``."""
    from solarwm.backbones.base import load_adapter, read_adapter_json

    if adapter is not None:
        meta = read_adapter_json(adapter)
        loaded = load_adapter(adapter)
        if meta.get("stage") in CAUSAL_STAGES:
            return loaded, True, False
        if config is not None:
            return _stage_from_recipe(recipe, config, adapter=loaded), False, False
        from solarwm.stages.bidirectional import BidirectionalModule

        return BidirectionalModule(adapter=loaded), False, False
    init_args = dict((recipe.get("model") or {}).get("init_args") or {})
    if any(key in init_args for key in INIT_KEYS):
        # The checkpoint replaces every weight, so the recipe's own initialisation paths are not read.
        init_args.update({key: None for key in INIT_KEYS if key in init_args})
        recipe = dict(recipe, model=dict(recipe["model"], init_args=init_args))
    module = _stage_from_recipe(recipe, config)
    ema_used = _load_checkpoint(module, Path(checkpoint), use_ema)
    if getattr(module, "causal", False):
        return module.adapter, True, ema_used
    return module, False, ema_used


def predict(
    first_frame: str,
    trajectory: str,
    output: str,
    caption: str = "",
    config: str | None = None,
    checkpoint: str | None = None,
    adapter: str | None = None,
    num_frames: int | None = None,
    width: int | None = None,
    height: int | None = None,
    num_steps: int | None = None,
    seed: int = 0,
    use_ema: bool = True,
    progress: bool = True,
) -> int:
    """Generate video from a first frame, a caption and a camera trajectory into an mp4.

    A bidirectional (stage-1) model generates one clip; a causal (stage-2/3) model rolls out block by
    block on its sliding-window KV cache, for any length the trajectory covers, decoding and writing
    the mp4 as it goes (flat memory).

    Args:
        first_frame: an image file, or a canonical clip folder whose first frame is used.
        trajectory: a camera trajectory file (.json or .npz; `solarwm camera trajectory` writes long ones).
        output: the mp4 to write (only written when generation succeeds).
        caption: the text prompt.
        config: the recipe YAML (its `model` builds the stage; its `data` gives the clip geometry).
        checkpoint: a Lightning checkpoint of that recipe (needs --config).
        adapter: an exported adapter folder (`AdapterExport` / `save_adapter`), instead of --checkpoint.
        num_frames: frames to generate (default: the trajectory's length for a causal model, else the
            recipe's data.num_frames, else the trajectory's length); must follow the route's frame rule.
        width: output width (default: the recipe's data.width, else the trajectory's).
        height: output height (default: the recipe's data.height, else the trajectory's).
        num_steps: sampler steps (default: 4 per block for a causal model, 20 for a bidirectional one).
        seed: noise seed (the same seed gives the same video).
        use_ema: use the checkpoint's EMA average when it has one.
        progress: show a progress bar with generated frames per second.
    """
    from solarwm.camera.trajectory import load_trajectory
    from solarwm.datamodules.clips import fit_intrinsics, resize_crop

    if (checkpoint is None) == (adapter is None):
        raise ValueError("predict: give exactly one of --checkpoint (with --config) or --adapter")
    if checkpoint is not None and config is None:
        raise ValueError("predict: --checkpoint needs the --config recipe it was trained with")
    recipe = _recipe(config)
    data_args = (recipe.get("data") or {}).get("init_args") or {}
    traj = load_trajectory(trajectory)
    image = _first_frame(Path(first_frame))
    generator_model, causal, ema_used = _build_generator(recipe, config, checkpoint, adapter, use_ema)
    route = generator_model if causal else getattr(generator_model, "adapter", None)
    num_frames = num_frames or (len(traj) if causal else data_args.get("num_frames") or len(traj))
    width = width or data_args.get("width") or traj.width
    height = height or data_args.get("height") or traj.height
    if route is not None and not route.valid_num_frames(num_frames):
        raise ValueError(
            f"predict: --num_frames {num_frames} is not a valid length for route {route.route} "
            f"(needs {route.temporal_compression}*n + 1)"
        )
    if len(traj) < num_frames:
        raise ValueError(f"{trajectory}: trajectory has {len(traj)} frames, --num_frames is {num_frames} (no padding)")

    frame = torch.from_numpy(image).permute(2, 0, 1)[None]  # [1,3,H,W]
    frame, _ = resize_crop(frame, np.zeros((1, 4)), width, height)
    first = (frame / 127.5 - 1.0).clamp(-1, 1)
    c2w = torch.as_tensor(traj.c2w[:num_frames], dtype=torch.float64)[None]
    K = torch.as_tensor(fit_intrinsics(traj.K[:num_frames], traj.width, traj.height, width, height), dtype=torch.float32)[None]
    generator = torch.Generator().manual_seed(seed)
    out = Path(output)
    out.parent.mkdir(parents=True, exist_ok=True)
    if causal:
        from solarwm.rollout.engine import write_rollout

        solver = "flowmap" if route.delta_embedding is not None else "renoise"
        stats = write_rollout(route.eval(), first, c2w, K, caption, out, traj.fps, num_steps or 4, solver,
                              seed, progress=progress)
    else:
        from solarwm.data.video import to_uint8_frames, write_video

        generator_model.eval()
        with torch.no_grad():
            video = generator_model.generate(
                first_frame=first, caption=[caption], c2w=c2w.float(), K=K,
                num_steps=num_steps or 20, generator=generator,
            )
        frames = to_uint8_frames(video[0])
        write_video(out, frames, traj.fps)
        stats = {"num_frames": int(frames.shape[0])}
    print(json.dumps({
        "output": str(out), "width": width, "height": height, "fps": traj.fps, "causal": causal,
        "weights": checkpoint or adapter, "ema": ema_used, **stats,
    }))
    return 0


def predict_parser() -> "ArgumentParser":
    """The ``solarwm predict`` parser: `predict`'s typed signature, ``--config`` being the recipe."""
    from jsonargparse import ArgumentParser

    # Not jsonargparse.auto_cli: it reserves --config for its own config file, and here
    # --config is the training recipe the checkpoint belongs to.
    parser = ArgumentParser(prog="solarwm predict", description=predict.__doc__.splitlines()[0], default_env=False)
    parser.add_function_arguments(predict, as_positional=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point for ``solarwm fit|validate|test|predict ...`` (``argv`` without the program name)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "predict":
        return predict(**predict_parser().parse_args(argv[1:]).as_dict())
    SolarCLI(args=argv)
    return 0
