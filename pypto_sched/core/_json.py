"""The one reader of untrusted JSON: schedules, configs, checkpoint configs and headers.

``json.loads`` alone lets its own exceptions escape (``RecursionError`` on deep nesting,
``ValueError`` on integers of more than 4,300 digits, ``UnicodeDecodeError``), accepts
``NaN`` and ``Infinity``, keeps the last of duplicate keys and reads input of any size.
:func:`load_json` turns every one of those into the caller's error type, with a message that
names the document and the problem.
"""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np

from ._errors import InvalidInputError

__all__ = ["DEFAULT_MAX_BYTES", "DEFAULT_MAX_DEPTH", "load_json"]

#: Largest document read by default: 256 MiB (a million-request schedule is about 40 MB).
DEFAULT_MAX_BYTES = 256 * 1024 * 1024
#: Deepest nesting of arrays and objects read by default.
DEFAULT_MAX_DEPTH = 64


class _Rejected(Exception):
    """Raised inside the parser's hooks; turned into the caller's error."""


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise _Rejected(f"duplicate key {key!r}")
        result[key] = value
    return result


def _no_constant(name: str) -> Any:
    raise _Rejected(f"{name} is not JSON")


#: A JSON string literal, escapes included.
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
#: Per byte: +1 for an opening bracket or brace, -1 for a closing one, else 0.
_NESTING = np.zeros(256, dtype=np.int8)
_NESTING[[ord("["), ord("{")]] = 1
_NESTING[[ord("]"), ord("}")]] = -1


def _depth(text: str) -> int:
    """Deepest nesting of ``[``/``{`` outside strings (no recursion, and no Python loop
    over the characters: a 30 MB schedule is read in a fraction of a second)."""
    outside = _STRING.sub("", text)
    unterminated = outside.find('"')  # the rest is inside a string that never ends
    if unterminated >= 0:
        outside = outside[:unterminated]
    steps = _NESTING[np.frombuffer(outside.encode("utf-8", "surrogatepass"), dtype=np.uint8)]
    moves = steps[steps != 0]  # the brackets alone: a running sum as long as they are
    return int(np.cumsum(moves, dtype=np.int64).max(initial=0))


def load_json(
    data: str | bytes | bytearray,
    *,
    what: str,
    error: type[Exception] = InvalidInputError,
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_depth: int = DEFAULT_MAX_DEPTH,
) -> Any:
    """Parse ``data`` as strict JSON, raising ``error`` with a message naming ``what``.

    Strict means: UTF-8 (bytes) without decoding errors, at most ``max_bytes`` long, nesting
    at most ``max_depth`` deep, no duplicate keys in an object, no ``NaN``/``Infinity``, and
    no integer too long for Python to read.
    """
    if not isinstance(data, str | bytes | bytearray):
        raise error(f"{what} must be JSON text (str or bytes): {type(data).__name__}")
    if len(data) > max_bytes:
        raise error(f"{what} is {len(data):,} bytes, more than the limit of {max_bytes:,}")
    if isinstance(data, bytes | bytearray):
        try:
            text = bytes(data).decode("utf-8")
        except UnicodeDecodeError as decode_error:
            raise error(f"{what} is not UTF-8: {decode_error}") from None
    else:
        text = data
    if _depth(text) > max_depth:
        raise error(f"{what} nests arrays and objects more than {max_depth} deep")
    try:
        return json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
    except _Rejected as rejected:
        raise error(f"{what} is not valid JSON: {rejected}") from None
    except json.JSONDecodeError as decode_error:
        raise error(f"{what} is not valid JSON: {decode_error}") from None
    except (ValueError, RecursionError) as other:  # e.g. an integer of 5,000 digits
        raise error(f"{what} is not valid JSON: {other}") from None
