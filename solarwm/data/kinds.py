"""Kinds of the flat per-clip values: what an annotation stage declares for each key it writes and
what a policy gate may read (``solarwm.data.policy.spec.COLUMNS`` is built from the declarations)."""

from __future__ import annotations

from typing import Any

NUMBER = "number"  # int or float (a gate also needs it finite); bool is not a number
BOOL = "bool"
TEXT = "text"
STR_LIST = "str_list"  # list of strings
KINDS = (NUMBER, BOOL, TEXT, STR_LIST)


def value_matches(kind: str, value: Any) -> bool:
    """Whether a stage's output ``value`` is of ``kind`` (finiteness is the gates' business, not the kind's)."""
    if kind == NUMBER:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == BOOL:
        return isinstance(value, bool)
    if kind == TEXT:
        return isinstance(value, str)
    if kind == STR_LIST:
        return isinstance(value, list) and all(isinstance(v, str) for v in value)
    raise ValueError(f"unknown kind {kind!r}; known: {KINDS}")
