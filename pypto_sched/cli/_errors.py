"""Exit statuses and the two errors commands raise; :func:`~pypto_sched.cli.main` turns
every failure into one line on stderr and one of these statuses."""

from __future__ import annotations

import argparse
import contextlib
import inspect
from collections.abc import Iterator, Mapping
from typing import ClassVar

from ..core._errors import (
    BackendNotFoundError,
    InvalidConfigError,
    InvalidInputError,
    PyptoSchedError,
)
from ..core._validate import check_int
from ..runtime.backends import installed_entry_point, load_factory

__all__ = [
    "EXIT_FAILED",
    "EXIT_OK",
    "EXIT_TERMINATED",
    "EXIT_USAGE",
    "CommandFailed",
    "Terminated",
    "UsageError",
    "building_backend",
    "check_counts",
    "flags_named",
    "missing_options",
]

#: The command did its work.
EXIT_OK = 0
#: The work itself failed: a verification mismatch, a backend error, a missing extra.
EXIT_FAILED = 1
#: Bad input, or input this machine cannot hold; also an interrupt.
EXIT_USAGE = 2


class UsageError(Exception):
    """Bad command-line input; exit status 2, reported as one line. ``parameter`` is the
    library's parameter it is about, when :func:`flags_named` made it from the library's
    error (``None`` otherwise)."""

    def __init__(self, *args: object, parameter: str | None = None) -> None:
        super().__init__(*args)
        self.parameter = parameter


#: Stopped by SIGTERM (128 + 15, as a shell reports a process the signal ended).
EXIT_TERMINATED = 143


class CommandFailed(Exception):
    """The command could not do its work; exit status 1, reported as one line."""


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the command was (as Ctrl-C raises ``KeyboardInterrupt``), so that
    a run a supervisor stops ends as an interrupted one does: what finished is kept and said,
    and the status is :data:`EXIT_TERMINATED`."""

    #: Whether SIGTERM arrived while the command ran: a library the run was in (Ray's
    #: ``get``, say) may pass the interrupt up as a plain ``KeyboardInterrupt``.
    received: ClassVar[bool] = False

    @staticmethod
    def caused(error: BaseException) -> bool:
        """Whether ``error`` (an interrupt) is SIGTERM's."""
        return isinstance(error, Terminated) or (
            isinstance(error, KeyboardInterrupt) and Terminated.received
        )


@contextlib.contextmanager
def flags_named(**flags: str) -> Iterator[None]:
    """Report the library's errors about a parameter as errors of the flag that gave it.

    The library words them ``'num_pages' must be >= 1: 0`` and says which parameter and rule
    they are about (``error.parameter``, ``error.rule``); with
    ``num_pages="--num-kv-pages"`` that reads ``--num-kv-pages: must be >= 1: 0``, the form
    of the command line's own checks. Other errors, and those about one item of a parameter,
    pass through unchanged.
    """
    try:
        yield
    except (InvalidInputError, InvalidConfigError, BackendNotFoundError) as error:
        flag = flags.get(error.parameter) if error.parameter is not None else None
        if flag is None or error.rule is None:
            raise
        raise UsageError(f"{flag}: {error.rule}", parameter=error.parameter) from None


def check_counts(args: argparse.Namespace, flags: Mapping[str, str]) -> None:
    """Check, before anything slow runs, the counts given by ``flags`` (library parameter ->
    flag): each an int in ``[1, 2**31 - 1]`` when given, an error naming the flag if not."""
    with flags_named(**flags):
        for name, flag in flags.items():
            value = getattr(args, flag.removeprefix("--").replace("-", "_"))
            if value is not None:
                check_int(name, value, min_value=1)


@contextlib.contextmanager
def building_backend(name: str, options: Mapping[str, object]) -> Iterator[None]:
    """Report a failure to build backend ``name`` from ``options`` (here, or in the Ray
    actors of ``--replicas``) as one line, the same way wherever it was built.

    An option or value the backend refuses (a ``ValueError`` of the library's, a
    ``TypeError`` or ``ValueError`` of the factory's) is a usage error of
    ``--backend-option``; any other exception of the factory's is a failure of the command
    naming the backend. The library's other errors (an unknown backend, Ray's own) and the
    command's pass through.
    """
    try:
        yield
    except (UsageError, CommandFailed, BackendNotFoundError):
        raise
    except PyptoSchedError as error:
        if isinstance(error, ValueError):  # an option or a value the backend refuses
            raise UsageError(f"--backend-option: backend {name!r}: {error}") from None
        raise
    except (TypeError, ValueError) as error:
        # An option the factory does not take or needs, or a value it refuses.
        needed = missing_options(name, options)
        if isinstance(error, TypeError) and needed is not None:
            raise UsageError(f"--backend-option: backend {name!r} needs {needed}") from None
        raise UsageError(f"--backend-option: backend {name!r}: {error}") from None
    except Exception as error:
        raise CommandFailed(
            f"backend {name!r} could not be created: {type(error).__name__}: {error}"
        ) from None


def missing_options(name: str, options: Mapping[str, object]) -> str | None:
    """What to add when backend ``name``'s factory requires keywords ``options`` leaves out
    (``--backend-option checkpoint=VALUE``), or ``None`` (nothing missing, or a factory
    whose signature cannot be read). For when the factory refused the options."""
    try:
        parameters = inspect.signature(
            load_factory(installed_entry_point(name))
        ).parameters.values()
    except (TypeError, ValueError):
        return None
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    missing = [
        p.name for p in parameters
        if p.kind in named and p.default is p.empty and p.name not in options
    ]  # fmt: skip
    return " ".join(f"--backend-option {key}=VALUE" for key in missing) or None
