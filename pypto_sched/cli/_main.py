"""The entry point: parse, run the command, and keep the promise that every failure that is
not a bug of ours is one line on stderr and an exit status, never a traceback."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence

from ..core._errors import PyptoSchedError
from ._errors import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_TERMINATED,
    EXIT_USAGE,
    CommandFailed,
    Terminated,
    UsageError,
)
from ._parser import build_parser
from ._progress import wanted
from ._render import console

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``pypto-sched``; returns the exit status."""
    try:
        args = build_parser().parse_args(argv)
        # Fail now, with the fix, rather than after the work is done.
        if args.format == "text":
            console()
        if hasattr(args, "progress"):
            wanted(args)  # --progress without rich
        handler: Callable[[argparse.Namespace], int] = args.handler
        try:
            with _sigterm_raises():
                status = handler(args)
        except SystemExit as error:  # a plugin's (a backend's factory, say): never a success
            raise CommandFailed(
                f"the run was stopped by SystemExit({error.code!r}), raised by a backend or "
                "another plugin; nothing it did is reported"
            ) from None
        if sys.stdout is not None:
            sys.stdout.flush()  # a full disk or a closed pipe is reported here, not at exit
        return status
    except UsageError as error:
        return _fail(error, EXIT_USAGE)
    except PyptoSchedError as error:
        # The library's input errors (lengths, configs, schedules, unknown backends) are
        # ValueErrors; the others (a backend failing mid-run) are failures of the work.
        return _fail(error, EXIT_USAGE if isinstance(error, ValueError) else EXIT_FAILED)
    except CommandFailed as error:
        return _fail(error, EXIT_FAILED)
    except BrokenPipeError:
        # The reader (e.g. `head`) went away: not an error of ours, and no traceback.
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - replaces the closed stream
        return EXIT_OK
    except MemoryError:
        return _fail("out of memory: the workload is too large for this machine", EXIT_USAGE)
    except KeyboardInterrupt as error:
        if Terminated.caused(error):
            return _fail(error if str(error) else "terminated by SIGTERM", EXIT_TERMINATED)
        return _fail("interrupted", EXIT_USAGE)
    except OSError as error:
        if error.filename is not None:
            raise  # a file we did not mean to touch: a bug of ours, with its traceback
        return _fail(f"cannot write the output: {error.strerror or error}", EXIT_USAGE)


@contextlib.contextmanager
def _sigterm_raises() -> Iterator[None]:
    """While the command runs, SIGTERM raises :class:`Terminated` (restored after; only the
    main thread may handle a signal, so elsewhere SIGTERM keeps its own action)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def terminated(_signum: int, _frame: object) -> None:
        Terminated.received = True
        raise Terminated

    Terminated.received = False
    previous = signal.signal(signal.SIGTERM, terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _fail(error: object, status: int) -> int:
    message = " ".join(str(error).split())  # one line, whatever the error held
    print(f"pypto-sched: error: {message}", file=sys.stderr)
    return status
