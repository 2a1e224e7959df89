"""Loading a model for inference, and what it starts from: the one home of ``solarwm predict``, ``solarwm play``,
the Gymnasium environment and the benchmarks.

Weights come from an adapter export folder (``adapter.json`` + ``transformer/``: what ``AdapterExport``,
``solarwm convert`` and ``recipes/weights/`` hold) or from a recipe plus a Lightning checkpoint of it (its EMA
average when present). A first frame comes from an image file or a canonical clip folder. The solver of a
causal model follows from its weights (``default_solver``).

    from solarwm.loading import load_causal, load_first_frame, default_solver
    adapter = load_causal("recipes/weights/tiny_causal")
    frame = load_first_frame("frame.png", width=32, height=32)   # uint8 [H, W, 3]
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from lightning.pytorch import LightningModule

#: The shipped defaults: a tiny stage-3 export, a first frame rendered by the synthetic renderer and its caption.
DEFAULT_ADAPTER = "recipes/weights/tiny_causal"
DEFAULT_FIRST_FRAME = str(Path(__file__).parent / "play" / "default_first_frame.png")
DEFAULT_CAPTION = (
    "A rendered outdoor scene with mottled cream ground. Five crates and four pillars stand around, coloured purple, "
    "orange, green and red, with striped and checkerboard textures. Under a pale hazy sky, bright sunlight casting "
    "hard shadows, thick haze in the distance."
)
#: Stages whose exports are block-causal generators.
CAUSAL_STAGES = ("tf_anyflow", "dmd")
#: Stage arguments that name the previous stage's weights (not read when a checkpoint replaces every weight).
INIT_KEYS = ("init_from",)
#: The largest first frame read (pixels): a PNG header may declare any size, and decoding it allocates all of it.
MAX_FIRST_FRAME_PIXELS = 4096 * 4096


class LoadError(ValueError):
    """Weights or a first frame that cannot be loaded as asked (the message says which and why)."""


@dataclass
class Loaded:
    """What ``load_generator`` returns: the model, whether it is causal, and whether EMA weights were used.

    ``model`` is the route adapter for a causal model, else the stage module (its ``generate`` makes a clip).
    """

    model: Any
    causal: bool
    ema_used: bool


def shipped_adapter() -> str:
    """The shipped causal export: relative to the working directory, else to this checkout's root."""
    repo = Path(__file__).resolve().parents[1] / DEFAULT_ADAPTER
    return DEFAULT_ADAPTER if Path(DEFAULT_ADAPTER).is_dir() or not repo.is_dir() else str(repo)


def read_first_frame(path: str | Path) -> np.ndarray:
    """uint8 ``[H, W, 3]`` from an image file or the first frame of a canonical clip folder.

    16-bit images are scaled to 8 bits (not clipped); 32-bit integer or float images are refused by name.
    """
    path = Path(path)
    if path.is_dir():
        from solarwm.data.video import read_video

        if not (path / "video.mp4").is_file():
            raise FileNotFoundError(f"{path}: not a clip folder (no video.mp4)")
        return read_video(path / "video.mp4")[0]
    if not path.is_file():
        raise FileNotFoundError(f"{path}: first frame not found (an image file or a clip folder)")
    from PIL import Image, UnidentifiedImageError

    try:
        image = Image.open(path)  # lazy: the header only, so the size is checked before any pixel is decoded
    except UnidentifiedImageError:
        raise LoadError(f"{path}: not an image file Pillow can read") from None
    with image:
        width, height = image.size
        if width * height > MAX_FIRST_FRAME_PIXELS or min(width, height) < 1:
            raise LoadError(f"{path}: a {width}x{height} image; a first frame holds at most "
                            f"{MAX_FIRST_FRAME_PIXELS} pixels")
        try:
            if image.mode.startswith("I;16"):
                # 16-bit grey: Pillow's convert("RGB") would clip every value above 255 to white.
                grey = np.asarray(image, dtype=np.uint16).astype(np.float64) / 257.0
                return np.repeat(np.rint(grey).astype(np.uint8)[..., None], 3, axis=2)
            if image.mode in ("I", "F"):
                raise LoadError(f"{path}: a {'32-bit integer' if image.mode == 'I' else 'floating-point'} image; "
                                "save the first frame as 8- or 16-bit RGB or grey")
            return np.asarray(image.convert("RGB"))
        except OSError as e:  # a truncated or corrupt file past its header
            raise LoadError(f"{path}: cannot decode the image ({e})") from None


def load_first_frame(path: str | Path, width: int | None = None, height: int | None = None) -> np.ndarray:
    """uint8 ``[H, W, 3]``: ``read_first_frame`` resized and centre-cropped like ``solarwm predict`` (default: its
    own size) and rounded, so a recording replays exactly."""
    from solarwm.datamodules.clips import resize_crop

    image = read_first_frame(path)
    height, width = height or image.shape[0], width or image.shape[1]
    if (height, width) == image.shape[:2]:
        return np.ascontiguousarray(image)
    frame, _ = resize_crop(torch.from_numpy(image.copy()).permute(2, 0, 1)[None], np.zeros((1, 4)), width, height)
    return frame[0].round().clamp(0, 255).to(torch.uint8).permute(1, 2, 0).numpy()


def recipe_dict(config: str | None) -> dict[str, Any]:
    """The recipe as fit resolves it (composed, interpolated), as plain dicts; empty without one."""
    from solarwm.lightning_cli import parse_recipe

    if config is None:
        return {}
    path = Path(config)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: recipe not found")
    recipe = parse_recipe(str(path)).as_dict()
    recipe.pop("config", None)
    return recipe


def stage_from_recipe(recipe: dict[str, Any], config: str, adapter: Any = None) -> LightningModule:
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


def load_checkpoint(module: LightningModule, checkpoint: str | Path, use_ema: bool) -> bool:
    """Load a Lightning checkpoint (its EMA average if asked and present) into ``module``; whether EMA was used.

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


def load_generator(
    adapter: str | None = None, config: str | None = None, checkpoint: str | None = None, use_ema: bool = True
) -> Loaded:
    """The generator of an adapter export (``adapter``) or of a recipe + Lightning checkpoint of it.

    With ``adapter`` and ``config`` together, a bidirectional export is wrapped in the recipe's stage module.
    """
    from solarwm.backbones.base import load_adapter, read_adapter_json

    if (checkpoint is None) == (adapter is None):
        raise LoadError("give exactly one of --checkpoint (with --config) or --adapter")
    if checkpoint is not None and config is None:
        raise LoadError("--checkpoint needs the --config recipe it was trained with")
    recipe = recipe_dict(config)
    if adapter is not None:
        meta = read_adapter_json(adapter)
        loaded = load_adapter(adapter)
        if meta.get("stage") in CAUSAL_STAGES:
            return Loaded(loaded, True, False)
        if config is not None:
            return Loaded(stage_from_recipe(recipe, config, adapter=loaded), False, False)
        from solarwm.stages.bidirectional import BidirectionalModule

        return Loaded(BidirectionalModule(adapter=loaded), False, False)
    init_args = dict((recipe.get("model") or {}).get("init_args") or {})
    if any(key in init_args for key in INIT_KEYS):
        init_args.update({key: None for key in INIT_KEYS if key in init_args})
        recipe = dict(recipe, model=dict(recipe["model"], init_args=init_args))
    module = stage_from_recipe(recipe, config)
    ema_used = load_checkpoint(module, checkpoint, use_ema)
    if getattr(module, "causal", False):
        return Loaded(module.adapter, True, ema_used)
    return Loaded(module, False, ema_used)


def load_causal(adapter: str | None = None, config: str | None = None, checkpoint: str | None = None) -> Any:
    """The causal route adapter (eval mode) of an export folder or a recipe + checkpoint; default the shipped one."""
    if checkpoint is not None and adapter is not None:
        raise LoadError("give --adapter or --config with --checkpoint, not both")
    if checkpoint is None and adapter is None:
        adapter = shipped_adapter()
    if adapter is not None and not (Path(adapter) / "adapter.json").is_file():
        shipped = " - the shipped tiny model is not in this checkout" if str(adapter).endswith(DEFAULT_ADAPTER) else ""
        raise FileNotFoundError(f"{adapter}: not an adapter export folder (no adapter.json){shipped}")
    loaded = load_generator(adapter, config, checkpoint, use_ema=True)
    if not loaded.causal:
        raise LoadError(f"{adapter or checkpoint}: a world needs a causal model (a tf_anyflow or dmd export), "
                        "this one is bidirectional")
    return loaded.model.eval()


def default_solver(adapter: Any) -> str:
    """The rollout solver a causal adapter's weights call for: ``flowmap`` with a flow map (stage 2), else
    ``renoise`` (the DMD student's rule)."""
    return "flowmap" if getattr(adapter, "delta_embedding", None) is not None else "renoise"
