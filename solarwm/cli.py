"""The ``solarwm`` entry point.

``solarwm fit|validate|test|predict --config recipes/<name>.yaml`` runs a training stage
through LightningCLI; ``solarwm data <verb>`` runs the data engine. Each data verb is a plain
typed function (jsonargparse builds its options from the signature and docstring), imported
only when called so that ``solarwm data synth`` does not import the model stack.
"""

from __future__ import annotations

import importlib
import inspect
import sys
from typing import Callable, Sequence

DATA_VERBS: dict[str, tuple[str, str]] = {
    "synth": ("solarwm.data.sources.synthetic:synth_command", "render procedural worlds as canonical clips"),
    "inspect": ("solarwm.data.inspect:inspect_command", "validate clips or an index and print a JSON summary"),
    "annotate": ("solarwm.data.annotate.runner:annotate_command", "compute camera, visual, motion and caption metrics"),
    "select": ("solarwm.data.policy.cli:select_command", "sort clips into xhigh/high/rejected by a versioned policy"),
    "pack": ("solarwm.data.release:pack_command", "write the raw-wds release (WebDataset shards + index)"),
    "recipe": ("solarwm.data.recipe:recipe_command", "build train/test recipe indices from a release"),
    "report": ("solarwm.data.report:report_command", "figures and an HTML page of a corpus or release"),
}
TRAIN_VERBS = ("fit", "validate", "test", "predict")


def _load(target: str) -> Callable:
    module, name = target.split(":")
    return getattr(importlib.import_module(module), name)


def _usage() -> str:
    lines = ["usage: solarwm {fit,validate,test,predict} --config recipes/<name>.yaml [...]",
             "       solarwm data <verb> [--help]", "", "data verbs:"]
    lines += [f"  {verb:<9} {help_}" for verb, (_, help_) in DATA_VERBS.items()]
    return "\n".join(lines)


def _normalise_args(fn: Callable, args: list[str]) -> list[str]:
    """Accept ``--kebab-case`` options, and required parameters as ``--name value`` too.

    jsonargparse names options after the Python parameters (``--bad_fraction``) and makes
    parameters without a default positional; the documented commands use ``--bad-fraction``
    and ``--corpus DIR``.
    """
    args = [a.split("=", 1)[0].replace("-", "_").replace("__", "--", 1) + a[len(a.split("=", 1)[0]):]
            if a.startswith("--") else a for a in args]
    required = [p.name for p in inspect.signature(fn).parameters.values() if p.default is p.empty]
    given: dict[str, str] = {}
    rest: list[str] = []
    i = 0
    while i < len(args):
        name, eq, value = args[i].partition("=")
        key = name[2:].replace("-", "_") if name.startswith("--") else None
        if key in required and (eq or i + 1 < len(args)):
            given[key] = value if eq else args[i + 1]
            i += 1 if eq else 2
        else:
            rest.append(args[i])
            i += 1
    return [given[n] for n in required if n in given] + rest


def data_main(argv: Sequence[str]) -> int:
    """Dispatch ``solarwm data <verb> ...`` to the verb's function via jsonargparse."""
    from jsonargparse import CLI

    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0
    verb, rest = argv[0], list(argv[1:])
    if verb not in DATA_VERBS:
        print(f"solarwm data: unknown verb {verb!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    if verb == "inspect" and rest and not rest[0].startswith("-"):
        rest = ["--path", rest[0]] + rest[1:]  # `inspect PATH` reads naturally as a positional
    fn = _load(DATA_VERBS[verb][0])
    result = CLI(fn, args=_normalise_args(fn, rest), prog=f"solarwm data {verb}")
    return int(result or 0)


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0
    if argv[0] == "data":
        return data_main(argv[1:])
    if argv[0] in TRAIN_VERBS:
        return int(_load("solarwm.train_cli:main")(argv) or 0)
    print(f"solarwm: unknown command {argv[0]!r}\n\n{_usage()}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
