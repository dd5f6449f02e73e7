"""The ``--lengths`` syntax, and reading it from a file that may be hostile.

The grammar, as ``--help`` states it::

    LIST   = ITEM (SEP ITEM)*         blanks allowed around the whole list
    ITEM   = N | N "x" COUNT          COUNT prompts of N tokens
    N      = "0" | [1-9][0-9]*        ASCII decimal: no sign, no leading zero, no "_"
    COUNT  = [1-9][0-9]*
    SEP    = BLANK* "," BLANK* | BLANK+
    BLANK  = space, tab, newline or carriage return; "#" starts a comment to the end of
             the line

with N <= 2,147,483,647, COUNT <= 10,000,000, and at most 10,000,000 prompts in all. Every
other text is an error naming the first bad item; nothing is guessed (``1,,2``, ``+3``,
``1_000``, ``012``, ``3X2`` and non-ASCII digits are all refused). Whether 0 is a valid
value is the library's call: a prompt length of 0 is refused there, a cached prefix of 0 is
not.

Files (``@FILE``, ``@-`` for stdin, ``--lengths-file``) are read as bytes, at most
:data:`MAX_FILE_BYTES` of them, and must be UTF-8, so an endless stream (``/dev/zero``, a
FIFO) or a binary file is an error, never a hang or a traceback.
"""

from __future__ import annotations

import errno
import re
import sys
from pathlib import Path

import numpy as np
import numpy.typing as npt

from ..core._validate import utf8_error
from ._errors import UsageError

__all__ = [
    "GRAMMAR",
    "MAX_COUNT",
    "MAX_FILE_BYTES",
    "MAX_LENGTH",
    "MAX_PROMPTS",
    "parse_lengths",
    "read_lengths",
]

#: Largest N: the library's largest prompt length.
MAX_LENGTH = 2**31 - 1
#: Largest COUNT of one item.
MAX_COUNT = 10_000_000
#: Most prompts in one list.
MAX_PROMPTS = 10_000_000
#: Most bytes read from a lengths file.
MAX_FILE_BYTES = 32 * 1024 * 1024

#: The grammar in one line, for ``--help``.
GRAMMAR = (
    "ITEM[,ITEM...] where ITEM is N (one prompt of N tokens) or NxCOUNT (COUNT prompts); "
    "N and COUNT are ASCII decimal integers without sign or leading zeros, N <= 2147483647, "
    "1 <= COUNT <= 10000000, at most 10000000 prompts in all; items are separated by a "
    "comma or blanks (space, tab, newline); '#' starts a comment to the end of the line"
)

_BLANKS = " \t\r\n"
_COMMENT = re.compile(r"#[^\n]*")
_SEPARATOR = re.compile(r"[ \t\r\n]*,[ \t\r\n]*|[ \t\r\n]+")
_ITEM = re.compile(r"(0|[1-9][0-9]*)(?:x([1-9][0-9]*))?")


def parse_lengths(text: str, *, name: str = "--lengths") -> npt.NDArray[np.int64]:
    """The prompt lengths that ``text`` spells in the grammar above, in order.

    Raises :class:`UsageError` naming ``name`` and the first item that breaks the grammar
    or a bound.
    """
    body = _COMMENT.sub("", text).strip(_BLANKS)
    if not body:
        raise UsageError(f"{name}: no lengths given")
    values: list[int] = []
    counts: list[int] = []
    total = 0
    for item in _SEPARATOR.split(body):
        value, count = _item(item, name)
        total += count
        if total > MAX_PROMPTS:
            raise UsageError(f"{name}: more than {MAX_PROMPTS} prompts in all (at {item!r})")
        values.append(value)
        counts.append(count)
    return np.repeat(np.array(values, dtype=np.int64), counts)


def _item(item: str, name: str) -> tuple[int, int]:
    match = _ITEM.fullmatch(item)
    if match is None:
        shown = repr(item) if item else "an empty item"
        raise UsageError(f"{name}: expected N or NxCOUNT (e.g. 3338x16), got {shown}")
    digits, count_digits = match.group(1), match.group(2)
    # Compare digit counts first: int() of thousands of digits is slow, then refused.
    if len(digits) > len(str(MAX_LENGTH)) or int(digits) > MAX_LENGTH:
        raise UsageError(f"{name}: N must be <= {MAX_LENGTH}: {item!r}")
    if count_digits is None:
        return int(digits), 1
    if len(count_digits) > len(str(MAX_COUNT)) or int(count_digits) > MAX_COUNT:
        raise UsageError(f"{name}: COUNT must be <= {MAX_COUNT}: {item!r}")
    return int(digits), int(count_digits)


def read_lengths(value: str, *, name: str) -> npt.NDArray[np.int64]:
    """``@PATH`` reads the list from a file (``@-``: stdin); anything else is the list."""
    if not value.startswith("@"):
        return parse_lengths(value, name=name)
    if value == "@":
        raise UsageError(f"{name}: no file name after '@' (@FILE reads one, @- stdin)")
    return parse_lengths(read_text(value[1:], name=name), name=name)


def read_text(path: str, *, name: str) -> str:
    """The UTF-8 text of ``path`` (``-``: stdin), at most :data:`MAX_FILE_BYTES` bytes."""
    if not path:
        raise UsageError(f"{name}: an empty file name")
    shown = "stdin" if path == "-" else repr(path)
    try:
        data = _read_bytes(path, limit=MAX_FILE_BYTES + 1)
    except OSError as error:
        raise UsageError(f"{name}: cannot read {shown}: {error.strerror or error}") from None
    if len(data) > MAX_FILE_BYTES:
        raise UsageError(f"{name}: {shown} is larger than the limit of {MAX_FILE_BYTES:,} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise UsageError(f"{name}: {shown} is not UTF-8 text: {utf8_error(data, error)}") from None


def _read_bytes(path: str, *, limit: int) -> bytes:
    if path != "-":
        with Path(path).open("rb") as stream:
            return stream.read(limit)
    if sys.stdin is None:  # started with stdin closed
        raise OSError(errno.EBADF, "it is closed")
    binary = getattr(sys.stdin, "buffer", None)
    if binary is not None:
        data: bytes = binary.read(limit)
        return data
    # A text stdin (replaced by a caller) is read as text and judged as its UTF-8 bytes.
    return sys.stdin.read(limit).encode("utf-8", errors="surrogateescape")
