"""The one-line form of an expected error, shared by the CLI and the data engine's verbs."""

from __future__ import annotations

import re
import sys


def concise_message(exc: BaseException) -> str:
    """One line for ``exc``; jsonargparse's "does not validate against any of the Union subtypes" wrapper
    (a constructor's own error inside LightningCLI's model/data union) is reduced to the constructor's message."""
    message = " ".join(str(exc).split()) or type(exc).__name__
    inner = re.search(r"Errors: - (.*?) - Expected a <class 'NoneType'>", message)
    return inner.group(1) if inner else message


def error_line(command: str, error: BaseException | str) -> str:
    """One-line form of expected errors: ``solarwm <command>: error: <message>`` (``command`` e.g. ``data select``)."""
    message = concise_message(error) if isinstance(error, BaseException) else " ".join(error.split())
    return f"solarwm {command}: error: {message}"


def print_error(command: str, error: BaseException | str) -> int:
    """Print `error_line` on stderr and return the exit status 2, for verbs that report an error themselves."""
    print(error_line(command, error), file=sys.stderr)
    return 2
