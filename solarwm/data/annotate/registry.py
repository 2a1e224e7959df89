"""The annotation-stage registry: what a stage is, the options it takes, and the configuration they make.

A stage declares, once, in its own module: its name, the flat keys it writes with their kinds
(``solarwm.data.kinds``), its options (``Option``: name, type, default, help) and its hooks, and
calls ``register_stage``. Everything else reads the registry: the policy's column vocabulary
(``solarwm.data.policy.spec.COLUMNS``), the options of ``solarwm data annotate``
(``with_stage_options``), the configuration handed to the stages (``AnnotateConfig``) and the
default stage choice. The built-in stages live in ``solarwm.data.annotate.stages``, which imports
every module of its package; import that package, not this module, to see them registered.
"""

from __future__ import annotations

import inspect
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, NamedTuple

import numpy as np

from solarwm.data.contract import ClipError
from solarwm.data.kinds import KINDS
from solarwm.data.video import VideoError, read_video


class AnnotateConfigError(ValueError):
    """The annotation configuration cannot work here (missing checkpoint, unimportable model code, no endpoint)."""


class StageSkipped(Exception):
    """The stage is not configured on this run; the message is the recorded reason."""


class Option(NamedTuple):
    """One option of a stage: ``--name`` on ``solarwm data annotate`` and ``config.name`` inside the stage.

    ``type`` is the annotation jsonargparse validates the command-line value against (``str | None``,
    ``int``); the value must be plain, picklable data, since the configuration travels to workers.
    """

    name: str
    type: Any
    default: Any
    help: str


# The general parameters of the command (``device`` is also ``AnnotateConfig.device``); no stage option may take them.
RESERVED_NAMES = frozenset({"corpus", "stages", "workers", "executor", "ray_address", "device", "config", "debug",
                            "options"})


@dataclass(frozen=True, init=False)
class AnnotateConfig:
    """Every registered option's value (and ``device``); frozen and picklable, so workers and Ray tasks get a copy.

    ``AnnotateConfig(device="cpu", **options)`` takes any registered option by name (the others keep
    their defaults) and refuses an unknown one; a stage reads its option as ``config.<name>``.
    Secrets are never options: a stage that needs one takes the *name* of the environment variable
    holding it (``vlm_api_key_env``), so the configuration, its repr and the records stay clean.
    """

    device: str
    options: tuple[tuple[str, Any], ...]  # (name, value) of every registered stage option, by name

    def __init__(self, device: str = "cpu", **options: Any) -> None:
        known = stage_options()
        unknown = sorted(set(options) - set(known))
        if unknown:
            raise AnnotateConfigError(f"unknown annotation option(s) {unknown}; registered: {sorted(known)}")
        values = {name: options.get(name, option.default) for name, option in known.items()}
        object.__setattr__(self, "device", device)
        object.__setattr__(self, "options", tuple(sorted(values.items())))

    def __getattr__(self, name: str) -> Any:
        # Only called for names that are not fields; while unpickling, `options` is not set yet.
        options = self.__dict__.get("options")
        if options is not None and not name.startswith("__"):
            for key, value in options:
                if key == name:
                    return value
        raise AttributeError(f"{type(self).__name__} has no option {name!r}")

    def check(self, stages: list[str]) -> None:
        """Fail now, with a clear message, on an unknown stage or anything that would make a requested one unusable."""
        unknown = [s for s in stages if s not in STAGES]
        if unknown:
            raise AnnotateConfigError(f"unknown stage(s) {unknown}; known: {list(STAGES)}")
        for name in stages:
            STAGES[name].check(self)


@dataclass
class ClipContext:
    """One clip folder being annotated; decodes the video at most once, for the stages that need frames."""

    folder: Path
    meta: dict[str, Any]
    _frames: np.ndarray | None = field(default=None, repr=False)

    @property
    def video(self) -> Path:
        """Path of the clip's ``video.mp4``."""
        return self.folder / "video.mp4"

    def frames(self) -> np.ndarray:
        """Decoded uint8 RGB ``[N, H, W, 3]``; raises ``ClipError`` if undecodable or not ``meta.num_frames`` long."""
        if self._frames is None:
            try:
                frames = read_video(self.video)
            except VideoError as e:
                raise ClipError(self.folder.name, "video", str(e)) from None
            expected = self.meta["meta"].get("num_frames")
            if len(frames) != expected:
                raise ClipError(
                    self.folder.name, "meta_num_frames", f"meta.json says {expected} frames, video has {len(frames)}"
                )
            self._frames = frames
        return self._frames


def _no_check(config: AnnotateConfig) -> None:
    """The default ``Stage.check``: nothing to verify."""


def _always(config: AnnotateConfig) -> bool:
    """The default ``Stage.enabled_by_default``: the stage needs nothing configured."""
    return True


@dataclass(frozen=True)
class Stage:
    """A named, versioned per-clip computation; ``version(config)`` changes whenever its output would.

    ``keys`` maps every key the stage may write to its kind (``solarwm.data.kinds``); the runner
    fails a stage that writes an undeclared key or a value of the wrong kind. ``run(ctx, config)``
    returns the keys it computed (never a placeholder: a value it could not compute is left out),
    raises ``StageSkipped`` when it is not configured here, or raises any error, which the runner
    records as the stage's failure. ``options`` become ``--<name>`` on the command line and
    ``config.<name>`` in ``run``; ``check(config)`` raises ``AnnotateConfigError`` before any clip
    is touched when the stage is requested but cannot work; ``enabled_by_default(config)`` says
    whether the stage runs when no ``--stages`` are given (e.g. only with its weights configured).
    """

    name: str
    run: Callable[[ClipContext, AnnotateConfig], dict[str, Any]]
    version: Callable[[AnnotateConfig], str]
    keys: dict[str, str] = field(default_factory=dict)
    options: tuple[Option, ...] = ()
    check: Callable[[AnnotateConfig], None] = _no_check
    enabled_by_default: Callable[[AnnotateConfig], bool] = _always


STAGES: dict[str, Stage] = {}  # by name, in registration order (the order stages run in); use register_stage
_generation = 0  # bumped on every change, so readers (the policy's columns, the command) can stay current
_DESCRIBED: list[Callable[..., Any]] = []


def generation() -> int:
    """A number that changes whenever a stage is registered or unregistered."""
    return _generation


def _changed() -> None:
    global _generation
    _generation += 1
    for fn in _DESCRIBED:
        _describe(fn)


def register_stage(stage: Stage) -> Stage:
    """Add ``stage`` to ``STAGES``; a name, option or key another stage already has (or a bad kind) is an error.

    A key may be declared by two stages only with the same kind. Returns the stage.
    """
    if not stage.name or not stage.name.isidentifier():
        raise AnnotateConfigError(f"stage name {stage.name!r} must be a Python identifier")
    if stage.name in STAGES:
        raise AnnotateConfigError(f"a stage named {stage.name!r} is already registered")
    bad = {k: kind for k, kind in stage.keys.items() if kind not in KINDS}
    if bad:
        raise AnnotateConfigError(f"stage {stage.name!r} declares unknown kind(s) {bad}; known: {KINDS}")
    declared = {k: (s.name, kind) for s in STAGES.values() for k, kind in s.keys.items()}
    clash = [
        f"{k} ({kind}; {declared[k][0]!r} says {declared[k][1]})"
        for k, kind in stage.keys.items()
        if k in declared and declared[k][1] != kind
    ]
    if clash:
        raise AnnotateConfigError(f"stage {stage.name!r} redeclares key(s) with another kind: {', '.join(clash)}")
    taken = dict.fromkeys(RESERVED_NAMES, "the command")
    taken |= {o.name: f"stage {s.name!r}" for s in STAGES.values() for o in s.options}
    for option in stage.options:
        if not option.name.isidentifier():
            raise AnnotateConfigError(f"stage {stage.name!r}: option name {option.name!r} must be a Python identifier")
        if option.name in taken:
            raise AnnotateConfigError(
                f"stage {stage.name!r}: option {option.name!r} is already taken by {taken[option.name]}"
            )
        if not option.help:
            raise AnnotateConfigError(f"stage {stage.name!r}: option {option.name!r} needs a help line")
        taken[option.name] = f"stage {stage.name!r}"
    STAGES[stage.name] = stage
    _changed()
    return stage


def unregister_stage(name: str) -> Stage:
    """Remove the stage ``name`` from the registry (tests registering a stage of their own); returns it."""
    if name not in STAGES:
        raise AnnotateConfigError(f"no stage named {name!r} is registered")
    stage = STAGES.pop(name)
    _changed()
    return stage


def stage_options() -> dict[str, Option]:
    """Every registered stage's options by name, in registration order."""
    return {o.name: o for s in STAGES.values() for o in s.options}


def default_stages(config: AnnotateConfig) -> list[str]:
    """The stages a run without ``--stages`` runs: every one enabled by ``config``, in registration order."""
    return [name for name, stage in STAGES.items() if stage.enabled_by_default(config)]


def with_stage_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Give ``fn`` (which ends in ``**options``) one typed, documented keyword per registered stage option.

    jsonargparse builds a command's options from ``inspect.signature``, the type hints and the
    docstring's ``Args:`` section (which must end the docstring); this sets ``__signature__``,
    ``__annotations__`` and ``__doc__`` from the registry, and again whenever it changes.
    ``{stages}`` in the docstring becomes the registered stage names.
    """
    fn.__solarwm_template__ = (inspect.signature(fn), typing.get_type_hints(fn), inspect.cleandoc(fn.__doc__ or ""))
    _DESCRIBED.append(fn)
    _describe(fn)
    return fn


def _describe(fn: Callable[..., Any]) -> None:
    signature, hints, doc = fn.__solarwm_template__
    own = [p for p in signature.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    options = list(stage_options().values())
    params = own + [
        inspect.Parameter(o.name, inspect.Parameter.KEYWORD_ONLY, default=o.default, annotation=o.type) for o in options
    ]
    fn.__signature__ = signature.replace(parameters=params)
    fn.__annotations__ = {
        **{p.name: hints[p.name] for p in own if p.name in hints},
        **{o.name: o.type for o in options},
        **({"return": hints["return"]} if "return" in hints else {}),
    }
    fn.__doc__ = doc.replace("{stages}", ", ".join(STAGES)) + "".join(f"\n    {o.name}: {o.help}" for o in options)
