"""Exit statuses and the two errors commands raise; :func:`~pypto_sched.cli.main` turns
every failure into one line on stderr and one of these statuses."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from .._errors import InvalidConfigError, InvalidInputError

__all__ = ["EXIT_FAILED", "EXIT_OK", "EXIT_USAGE", "CommandFailed", "UsageError", "flags_named"]

#: The command did its work.
EXIT_OK = 0
#: The work itself failed: a verification mismatch, a backend error, a missing extra.
EXIT_FAILED = 1
#: Bad input, or input this machine cannot hold; also an interrupt.
EXIT_USAGE = 2


class UsageError(Exception):
    """Bad command-line input; exit status 2, reported as one line."""


class CommandFailed(Exception):
    """The command could not do its work; exit status 1, reported as one line."""


@contextlib.contextmanager
def flags_named(**flags: str) -> Iterator[None]:
    """Report the library's errors about a parameter as errors of the flag that gave it.

    The library words them ``'num_pages' must be >= 1: 0``; with ``num_pages="--num-kv-pages"``
    that reads ``--num-kv-pages: must be >= 1: 0``, the form of the command line's own
    checks. Other errors pass through unchanged.
    """
    try:
        yield
    except (InvalidInputError, InvalidConfigError) as error:
        message = str(error)
        for name, flag in flags.items():
            parameter = f"{name!r} "
            if message.startswith(parameter):
                raise UsageError(f"{flag}: {message.removeprefix(parameter)}") from None
        raise
