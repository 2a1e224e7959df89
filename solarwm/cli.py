"""The ``solarwm`` entry point.

``solarwm fit|validate|test|predict --config recipes/<name>.yaml`` runs a training stage
through LightningCLI; ``solarwm data <verb>`` runs the data engine and ``solarwm camera <verb>``
the camera tools. Each group verb is a plain typed function (jsonargparse builds its options
from the signature and docstring), imported only when called so that ``solarwm data synth``
does not import the model stack. ``solarwm play`` (a world model in the browser) is such a verb
without a group.

An expected error (a bad path, a bad value, corrupt input: `OSError`, `ValueError` and any
error class the project defines) ends the command with one line on stderr,
``solarwm <verb>: error: <message>``, and exit status 2; ``--debug`` anywhere in the command
line lets it propagate with its traceback. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import sys
import types
from typing import Callable, Sequence

from solarwm.util.errors import concise_message, error_line, print_error  # noqa: F401  (re-exported: the one-line form)

DATA_VERBS: dict[str, tuple[str, str]] = {
    "synth": ("solarwm.data.sources.synthetic:synth_command", "render procedural worlds as canonical clips"),
    "ingest": (
        "solarwm.data.sources.ingest:ingest_command",
        "turn a source dataset (native layout) into canonical clips",
    ),
    "inspect": ("solarwm.data.inspect:inspect_command", "validate clips or an index and print a JSON summary"),
    "annotate": ("solarwm.data.annotate.runner:annotate_command", "compute camera, visual, motion and caption metrics"),
    "derive": ("solarwm.data.derive:derive_command", "derive Clean Plate owners from parent clips (lineage kept)"),
    "select": ("solarwm.data.policy.cli:select_command", "sort clips into xhigh/high/rejected by a versioned policy"),
    "pack": ("solarwm.data.release:pack_command", "write the raw-wds release (WebDataset shards + index)"),
    "recipe": ("solarwm.data.recipe:recipe_command", "build train/test recipe indices from a release"),
    "latents": (
        "solarwm.datamodules.latents:latents_command",
        "encode a recipe's windows once: the latent-cache model view",
    ),
    "report": ("solarwm.data.report:report_command", "figures and an HTML page of a corpus or release"),
}
CAMERA_VERBS: dict[str, tuple[str, str]] = {
    "trajectory": ("solarwm.camera.cli:trajectory_command", "write a long procedural camera trajectory (.json/.npz)"),
}
CONVERT_VERBS: dict[str, tuple[str, str]] = {
    "official": ("solarwm.convert:official_command", "an official SolarWM Wan2.2-5B stage package -> adapter export"),
    "official-base": (
        "solarwm.convert:official_base_command",
        "the official base (original Wan layout) -> diffusers layout",
    ),
}
GROUPS: dict[str, dict[str, tuple[str, str]]] = {"data": DATA_VERBS, "camera": CAMERA_VERBS, "convert": CONVERT_VERBS}
TRAIN_VERBS = ("fit", "validate", "test", "predict")
#: Top-level verbs that are plain typed functions (like the group verbs, without a group).
PLAIN_VERBS: dict[str, tuple[str, str]] = {
    "play": ("solarwm.play.cli:play_command", "serve a causal world model in the browser (keyboard camera control)"),
}


def _load(target: str) -> Callable:
    module, name = target.split(":")
    return getattr(importlib.import_module(module), name)


def _usage() -> str:
    lines = [
        "usage: solarwm {fit,validate,test,predict} --config recipes/<name>.yaml [...]",
        "       solarwm data <verb> [--help]",
        "       solarwm camera <verb> [--help]",
        "       solarwm convert official PACKAGE --out DIR [--weights ema|live] [--architecture JSON] [--base DIR]",
        "       solarwm convert official-base BASE --out DIR",
        "       solarwm play [--adapter DIR] [--first_frame IMG] [--caption TEXT] [--port 7860] [--help]",
        "       --debug anywhere: show the traceback of an error instead of one line",
    ]
    for group, verbs in GROUPS.items():
        lines += ["", f"{group} verbs:"] + [f"  {verb:<10} {help_}" for verb, (_, help_) in verbs.items()]
    return "\n".join(lines)


def _list_parameters(fn: Callable) -> set[str]:
    """Names of ``fn``'s parameters typed as a list (``list[str]``, ``list[str] | None``, ...)."""
    import typing

    hints = typing.get_type_hints(fn)
    names = set()
    for name, hint in hints.items():
        options = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
        if any(typing.get_origin(o) in (list, typing.List) or o is list for o in options):
            names.add(name)
    return names


def _normalise_args(fn: Callable, args: list[str]) -> list[str]:
    """Accept ``--kebab-case`` options, required parameters as ``--name value``, and plain list values.

    jsonargparse names options after the Python parameters (``--bad_fraction``), makes parameters
    without a default positional, and wants lists as ``'[a, b]'``; the documented commands use
    ``--bad-fraction``, ``--corpus DIR``, ``--stages vmaf cuts`` (or ``--stages vmaf,cuts``) and bare
    boolean flags (``--list``).
    """
    args = [
        a.split("=", 1)[0].replace("-", "_").replace("__", "--", 1) + a[len(a.split("=", 1)[0]) :]
        if a.startswith("--")
        else a
        for a in args
    ]
    required = [p.name for p in inspect.signature(fn).parameters.values() if p.default is p.empty]
    lists = _list_parameters(fn)
    import typing

    flags = {n for n, h in typing.get_type_hints(fn).items() if h is bool}
    given: dict[str, str] = {}
    rest: list[str] = []
    i = 0
    while i < len(args):
        name, eq, value = args[i].partition("=")
        key = name[2:].replace("-", "_") if name.startswith("--") else None
        if key in lists:
            values = [value] if eq else []
            i += 1
            while not eq and i < len(args) and not args[i].startswith("--"):
                values.append(args[i])
                i += 1
            items = [v.strip() for chunk in values for v in chunk.strip("[]").split(",") if v.strip()]
            rest.append(f"--{key}={json.dumps(items)}")
        elif key in flags and not eq and (i + 1 == len(args) or args[i + 1].lower() not in ("true", "false")):
            rest.append(f"--{key}=true")  # a bare boolean flag (`--list`) means true
            i += 1
        elif key in required and (eq or i + 1 < len(args)):
            given[key] = value if eq else args[i + 1]
            i += 1 if eq else 2
        else:
            rest.append(args[i])
            i += 1
    return [given[n] for n in required if n in given] + rest


def group_main(group: str, argv: Sequence[str]) -> int:
    """Dispatch ``solarwm <group> <verb> ...`` to the verb's function via jsonargparse."""
    from jsonargparse import CLI

    verbs = GROUPS[group]
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0
    verb, rest = argv[0], list(argv[1:])
    if verb not in verbs:
        print(f"solarwm {group}: unknown verb {verb!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    if (group, verb) == ("data", "inspect") and rest and not rest[0].startswith("-"):
        rest = ["--path", rest[0]] + rest[1:]  # `inspect PATH` reads naturally as a positional
    fn = _load(verbs[verb][0])
    # exit_on_error=False: a parse error raises (one line from `main`) instead of printing the usage.
    result = CLI(fn, args=_normalise_args(fn, rest), prog=f"solarwm {group} {verb}", exit_on_error=False)
    return int(result or 0)


def is_expected_error(exc: BaseException) -> bool:
    """Whether ``exc`` is the user's problem (reported in one line) rather than a bug (traceback).

    Expected: `OSError` (missing or unreadable files), `ValueError` (bad values, corrupt input;
    most project errors derive from it), `argparse.ArgumentError` (a bad option, raised by the
    jsonargparse parsers built with ``exit_on_error=False``) and every error class defined in the ``solarwm``
    packages, found by module name so that checking never imports torch for the ones in
    the backbones, kernels and stages packages (e.g. `AdapterError`, a `RuntimeError`).
    """
    if isinstance(exc, (OSError, ValueError, argparse.ArgumentError)):
        return True
    return any(cls.__module__.split(".")[0] == "solarwm" for cls in type(exc).__mro__)


def _dispatch(argv: list[str]) -> int:
    if argv[0] in GROUPS:
        return group_main(argv[0], argv[1:])
    if argv[0] == "predict":
        from solarwm.util.signals import terminate_unwinds

        with terminate_unwinds():  # SIGTERM cleans up the partial output like Ctrl-C does
            return int(_load("solarwm.train_cli:main")(argv) or 0)
    if argv[0] in TRAIN_VERBS:
        return int(_load("solarwm.train_cli:main")(argv) or 0)
    if argv[0] in PLAIN_VERBS:
        from jsonargparse import CLI

        fn = _load(PLAIN_VERBS[argv[0]][0])
        # exit_on_error=False: a bad option is one line from `main`, as for the group verbs.
        return int(
            CLI(fn, args=_normalise_args(fn, list(argv[1:])), prog=f"solarwm {argv[0]}", exit_on_error=False) or 0
        )
    print(f"solarwm: unknown command {argv[0]!r}\n\n{_usage()}", file=sys.stderr)
    return 2


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point: dispatch, and report an expected error in one line (exit 2) unless ``--debug``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    argv = [a for a in argv if a != "--debug"]
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0
    command = " ".join(argv[:2]) if argv[0] in GROUPS and len(argv) > 1 else argv[0]
    try:
        return _dispatch(argv)
    except Exception as e:
        if debug or not is_expected_error(e):
            raise
        return print_error(command, e)


if __name__ == "__main__":
    sys.exit(main())
