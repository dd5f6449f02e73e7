"""``--backend KEY`` and ``--backend-option KEY=VALUE``: the backend and its factory's options.

A value is read as JSON when it is JSON (numbers, ``true``, ``null``, strings in quotes,
lists), through the project's one strict JSON reader, and kept as the string it is
otherwise, so ``dtype=float32`` and ``checkpoint=/models/qwen3`` need no quotes.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from ..core._errors import InvalidInputError
from ..core._json import load_json
from ..runtime.backends import (  # one backend's factory, not all of them
    Backend,
    load_backend,
)
from ._errors import UsageError, building_backend, flags_named

__all__ = ["backend_options", "load_backend_from_args"]

#: Longest value read as JSON; a longer one stays a string.
_MAX_JSON_VALUE = 1 << 16


def backend_options(items: Sequence[str]) -> dict[str, object]:
    """``["seed=3", "dtype=float32"]`` -> ``{"seed": 3, "dtype": "float32"}``."""
    options: dict[str, object] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip().isidentifier():
            raise UsageError(f"--backend-option: expected KEY=VALUE, got {item!r}")
        if key.strip() in options:  # the first would be ignored
            raise UsageError(f"--backend-option: {key.strip()!r} given twice; give it once")
        options[key.strip()] = _value(value)
    return options


def load_backend_from_args(args: argparse.Namespace) -> Backend:
    """The backend ``--backend`` and ``--backend-option`` name, its failures as usage errors
    naming the option at fault (:func:`~pypto_sched.cli._errors.building_backend`)."""
    options = backend_options(args.backend_option)
    with flags_named(name="--backend"), building_backend(args.backend, options):
        return load_backend(args.backend, **options)


def _value(text: str) -> object:
    try:
        return load_json(
            text, what="--backend-option value", max_bytes=_MAX_JSON_VALUE, max_depth=16
        )
    except InvalidInputError:
        return text
