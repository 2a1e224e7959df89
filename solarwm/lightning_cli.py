"""The recipe parser: ``SolarCLI`` (LightningCLI with recipe composition and ``${key}`` interpolation) and
``parse_recipe``, which checks a recipe exactly as ``solarwm fit`` does without building anything.

Every recipe is a stack of YAML files: a recipe's top-level ``compose`` list names the files it is laid over,
expanded here into ``--config`` files that jsonargparse merges in order; ``${root}``-style strings are then
resolved against the parsed config.
"""

from __future__ import annotations

import re
import shutil
import sys
import warnings
from pathlib import Path
from typing import Any

import yaml
from lightning.pytorch import LightningDataModule, LightningModule
from lightning.pytorch.cli import LightningCLI

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
            if Path(ckpt_path).is_dir() and (Path(ckpt_path) / ".metadata").is_file():
                return  # a sharded checkpoint (state_dict_type: sharded): the strategy reads its per-rank files
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
