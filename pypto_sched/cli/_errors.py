"""Exit statuses and the two errors commands raise; :func:`~pypto_sched.cli.main` turns
every failure into one line on stderr and one of these statuses."""

from __future__ import annotations

__all__ = ["EXIT_FAILED", "EXIT_OK", "EXIT_USAGE", "CommandFailed", "UsageError"]

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
