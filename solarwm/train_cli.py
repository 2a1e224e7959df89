"""`solarwm fit | validate | test | predict --config recipes/<name>.yaml`.

``fit``/``validate``/``test`` are `LightningCLI` subcommands: the recipe YAML names every
object as ``class_path`` + ``init_args`` and jsonargparse checks the whole file against
the constructors' signatures (unknown key, wrong type) before anything is built.

``predict`` (this stage: a bidirectional clip) is a plain typed function: one first
frame (an image file or a clip folder), a caption and a camera trajectory become an
mp4, with the weights from a Lightning checkpoint (``--checkpoint``, the model built
from ``--config``) or an exported adapter folder (``--adapter``)::

    solarwm predict --config recipes/tiny_bid.yaml --checkpoint runs/tiny/stage1/last.ckpt \\
        --first_frame frame.png --caption "a street" --trajectory traj.json --output out.mp4
"""

from __future__ import annotations

import contextlib
import importlib
import json
import re
import shutil
import sys
import warnings
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch
import yaml
from lightning.pytorch import LightningDataModule, LightningModule
from lightning.pytorch.cli import LightningCLI

VERBS = ("fit", "validate", "test", "predict")
#: ``${key}`` / ``${dotted.key}`` in a string value of a recipe: the value of that config key (OmegaConf's syntax).
INTERPOLATION = re.compile(r"\$\{([A-Za-z_][\w.]*)\}")


class RecipeError(ValueError):
    """A recipe that composes a missing file, composes itself, or interpolates a key it does not set."""


def _compose_list(path: Path) -> list[Path]:
    """The files ``path`` is laid over (its top-level ``compose``, relative to its folder); empty if none."""
    try:
        doc = yaml.safe_load(path.read_text())
    except yaml.YAMLError:
        return []  # jsonargparse reports the syntax error with its own message
    parts = doc.get("compose") if isinstance(doc, dict) else None
    if parts is None:
        return []
    if isinstance(parts, str):
        parts = [parts]
    if not isinstance(parts, list) or not all(isinstance(p, str) for p in parts):
        raise RecipeError(f"{path}: `compose` must be a list of recipe files, got {parts!r}")
    return [path.parent / part for part in parts]


def _expand(path: Path, chain: tuple[Path, ...] = ()) -> list[str]:
    """``path``'s parts, depth first, then ``path`` itself (the order of the ``--config`` files they become)."""
    resolved = path.resolve()
    if resolved in chain:
        raise RecipeError(f"{path}: composes itself ({' -> '.join(str(p) for p in (*chain, resolved))})")
    configs: list[str] = []
    for part in _compose_list(path):
        if not part.is_file():
            raise RecipeError(f"{path}: compose names {part}, which does not exist")
        configs += _expand(part, (*chain, resolved))
    return configs + [str(path)]


def expand_configs(args: list[str]) -> list[str]:
    """Each ``--config R`` whose recipe R has a ``compose`` list becomes ``--config`` of every part, then of R.

    So ``--config recipes/ltx25_bid.yaml`` parses exactly as ``--config recipes/stages/bidirectional.yaml
    --config recipes/routes/ltx25.yaml --config recipes/ltx25_bid.yaml``: jsonargparse's own merge of
    several config files, later files (and then the command line) overriding earlier ones.
    """
    out: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        name, eq, value = arg.partition("=")
        if name in ("--config", "-c") and (eq or i + 1 < len(args)):
            value = value if eq else args[i + 1]
            i += 1 if eq else 2
            path = Path(value)
            if path.is_file() and path.suffix in (".yaml", ".yml"):
                for config in _expand(path):
                    out += [name, config]
            else:
                out += [name, value]  # a YAML string or a missing file: jsonargparse's own message
            continue
        out.append(arg)
        i += 1
    return out


def _interpolate(value: Any, lookup) -> Any:
    """``value`` with every ``${key}`` in its strings replaced by ``lookup(key)`` (lists, dicts, namespaces)."""
    from jsonargparse import Namespace

    if isinstance(value, str):
        return INTERPOLATION.sub(lambda m: str(lookup(m.group(1))), value)
    if isinstance(value, list):
        return [_interpolate(v, lookup) for v in value]
    if isinstance(value, dict):
        return {k: _interpolate(v, lookup) for k, v in value.items()}
    if isinstance(value, Namespace):
        for key, item in vars(value).items():
            setattr(value, key, _interpolate(item, lookup))
    return value


def resolve_interpolations(cfg: Any) -> Any:
    """Replace ``${key}`` in the parsed config's strings by that key's value, in place (``cfg`` returned).

    Recipes write their paths as ``${root}/...`` and ``${trainer.default_root_dir}/...`` so that one key moves
    every output; references may chain (``default_root_dir: ${root}/stage1``), resolved until none is left.
    """

    def lookup(key: str) -> Any:
        value = cfg.get(key) if key in cfg else None
        if value is None or not isinstance(value, (str, int, float)):
            raise RecipeError(f"recipe: ${{{key}}} names no set config key (give it, e.g. --{key} DIR)")
        return value

    for _ in range(8):
        before = repr(cfg)
        _interpolate(cfg, lookup)
        if repr(cfg) == before:
            return cfg
    raise RecipeError("recipe: interpolations do not resolve (a ${key} refers to itself)")


class SolarCLI(LightningCLI):
    """LightningCLI with the recipe conventions: subclass mode for model and data, strict YAML."""

    def __init__(self, args: list[str] | None = None, run: bool = True) -> None:
        with warnings.catch_warnings():
            # `solarwm` passes its own argv on purpose; the warning would break the one-line error form.
            warnings.filterwarnings("ignore", message="LightningCLI's args parameter is intended")
            self._init(args, run)

    def _init(self, args: list[str] | None, run: bool) -> None:
        super().__init__(
            model_class=LightningModule,
            datamodule_class=LightningDataModule,
            subclass_mode_model=True,
            subclass_mode_data=True,
            args=args,
            run=run,
            # A re-run into the same log folder rewrites its config.yaml instead of refusing.
            save_config_kwargs={"overwrite": True},
            # No environment variables may change a recipe behind the YAML's back; a parse error
            # raises (one line from `solarwm.cli.main`) instead of printing the whole usage.
            parser_kwargs={"default_env": False, "exit_on_error": False},
            auto_configure_optimizers=False,
        )

    def add_arguments_to_parser(self, parser: Any) -> None:
        """The recipe keys ``root`` (where a run chain writes) and ``compose`` (files a recipe is laid over)."""
        parser.add_argument("--root", type=str | None, default=None,
                            help="Folder every output of the recipe derives from (its paths are ${root}/...).")
        parser.add_argument("--compose", type=list[str] | None, default=None,
                            help="In a recipe file: the recipe files it is laid over, in order (read before parsing).")

    def parse_arguments(self, parser: Any, args: Any) -> None:
        """Expand composed recipes into their ``--config`` files, parse, then resolve ``${key}`` interpolations."""
        if not isinstance(args, dict):
            args = expand_configs(list(sys.argv[1:] if args is None else args))
        super().parse_arguments(parser, args)
        section = self.config[self.config.subcommand] if self.config.get("subcommand") else self.config
        section.compose = None  # the parts are read; a saved config.yaml must not compose them again
        resolve_interpolations(section)

    def _parse_ckpt_path(self) -> None:
        """A recipe given with ``--config`` decides the model; checkpoint hyperparameters only fill in without one.

        Lightning (2.6) parses the checkpoint's saved hyperparameters over the whole config, so
        ``solarwm test --config R --ckpt_path C --model.init_args.sample_steps 4`` silently tested with
        the steps saved in C (Lightning-AI/pytorch-lightning#21455 is the open upstream fix).
        """
        self._check_ckpt_path()
        if self.config.get("subcommand") and self.config[self.config.subcommand].get("config"):
            return
        super()._parse_ckpt_path()


    def _check_ckpt_path(self) -> None:
        """Refuse a missing or unreadable ``--ckpt_path`` before anything (a log folder) is made."""
        subcommand = self.config.get("subcommand")
        ckpt_path = self.config[subcommand].get("ckpt_path") if subcommand else None
        if isinstance(ckpt_path, str) and ckpt_path not in SPECIAL_CKPT_PATHS and not (
            ckpt_path.startswith("registry") or "://" in ckpt_path
        ):
            from solarwm.stages.checkpoints import read_checkpoint

            read_checkpoint(ckpt_path, mmap=True)

    def _prepare_subcommand_kwargs(self, subcommand: str) -> dict[str, Any]:
        """The trainer method's arguments, with ``weights_only=True`` for a resume unless the user asked otherwise."""
        kwargs = super()._prepare_subcommand_kwargs(subcommand)
        if "weights_only" in self._subcommand_method_arguments[subcommand] and kwargs.get("weights_only") is None:
            kwargs["weights_only"] = True  # checkpoints hold tensors and plain containers only
        return kwargs

    def _run_subcommand(self, subcommand: str) -> None:
        """Run it; a run that fails before its first step leaves no new log folder behind."""
        logger = self.trainer.logger
        log_dir = Path(logger.log_dir) if logger is not None and getattr(logger, "log_dir", None) else None
        fresh = log_dir is not None and not log_dir.exists()
        try:
            super()._run_subcommand(subcommand)
        except Exception:
            if fresh and self.trainer.global_step == 0 and log_dir.is_dir():
                shutil.rmtree(log_dir, ignore_errors=True)
            raise


#: ``--ckpt_path`` values Lightning resolves itself (not files).
SPECIAL_CKPT_PATHS = ("last", "best", "hpc")


class TrainerConfigError(ValueError):
    """Lightning refused the trainer configuration (e.g. ``--trainer.max_steps -5``); the message says why."""


class _ParseOnlyCLI(SolarCLI):
    """The same parser and checks as `SolarCLI`, stopping before anything is instantiated."""

    def instantiate_classes(self) -> None:
        """Skip building trainer, model and data."""


def parse_recipe(config: str, *args: str) -> Any:
    """Parse and check a recipe as ``solarwm fit --config config *args`` does, building nothing (a Namespace)."""
    return _ParseOnlyCLI(args=["--config", str(config), *args], run=False).config


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
    """The recipe as fit resolves it (composed, interpolated), as plain dicts; empty without one."""
    if config is None:
        return {}
    path = Path(config)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: recipe not found")
    recipe = parse_recipe(str(path)).as_dict()
    recipe.pop("config", None)
    return recipe


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

    for name, value in (("num_frames", num_frames), ("width", width), ("height", height), ("num_steps", num_steps)):
        if value is not None and value < 1:  # refused here: 0 would otherwise mean "the default" below
            raise ValueError(f"predict: --{name} must be >= 1, got {value}")
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


@contextlib.contextmanager
def _output_folder(out: Path) -> Iterator[None]:
    """A failed or refused run removes the folders above ``out`` that it made (when they are still empty)."""
    made = [p for p in [out.parent, *out.parent.parents] if not p.exists()]  # deepest first
    try:
        yield
    except BaseException:
        for folder in made:
            if folder.is_dir() and not any(folder.iterdir()):
                folder.rmdir()
        raise


def predict_parser() -> "ArgumentParser":
    """The ``solarwm predict`` parser: `predict`'s typed signature, ``--config`` being the recipe."""
    from jsonargparse import ArgumentParser

    # Not jsonargparse.auto_cli: it reserves --config for its own config file, and here
    # --config is the training recipe the checkpoint belongs to.
    parser = ArgumentParser(prog="solarwm predict", description=predict.__doc__.splitlines()[0], default_env=False,
                            exit_on_error=False)
    parser.add_function_arguments(predict, as_positional=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point for ``solarwm fit|validate|test|predict ...`` (``argv`` without the program name)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "predict":
        kwargs = predict_parser().parse_args(argv[1:]).as_dict()
        with _output_folder(Path(kwargs["output"])):
            return predict(**kwargs)
    from lightning.fabric.utilities.exceptions import MisconfigurationException

    try:
        SolarCLI(args=argv)
    except MisconfigurationException as e:  # Lightning's bad-configuration error, made one of ours
        raise TrainerConfigError(str(e)) from e
    return 0
