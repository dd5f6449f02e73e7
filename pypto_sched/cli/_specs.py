"""``--backend-option KEY=VALUE``: options for a backend's factory.

A value is read as JSON when it is JSON (numbers, ``true``, ``null``, strings in quotes,
lists), through the project's one strict JSON reader, and kept as the string it is
otherwise, so ``dtype=float32`` and ``checkpoint=/models/qwen3`` need no quotes.
"""

from __future__ import annotations

from collections.abc import Sequence

from .._errors import InvalidInputError
from .._json import load_json
from ._errors import UsageError

__all__ = ["backend_options"]

#: Longest value read as JSON; a longer one stays a string.
_MAX_JSON_VALUE = 1 << 16


def backend_options(items: Sequence[str]) -> dict[str, object]:
    """``["seed=3", "dtype=float32"]`` -> ``{"seed": 3, "dtype": "float32"}``."""
    options: dict[str, object] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip().isidentifier():
            raise UsageError(f"--backend-option: expected KEY=VALUE, got {item!r}")
        options[key.strip()] = _value(value)
    return options


def _value(text: str) -> object:
    try:
        return load_json(
            text, what="--backend-option value", max_bytes=_MAX_JSON_VALUE, max_depth=16
        )
    except InvalidInputError:
        return text
