"""A progress bar on stderr fed by the driver's ``on_dispatch`` callback."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager

from ..execute import DispatchDone
from ._render import console

__all__ = ["OnDispatch", "bar"]

#: What :func:`~pypto_sched.execute_schedule` calls after each dispatch.
OnDispatch = Callable[[DispatchDone], None]
#: ``progress(label, total)``: a context whose value is the ``on_dispatch`` callback.
Progress = Callable[[str, int], AbstractContextManager[OnDispatch]]


def bar(args: argparse.Namespace) -> Progress:
    """Progress bars as ``--progress`` asks: shown by name, hidden by ``--no-progress``, and
    by default shown when stderr is a terminal and the output is text."""
    if args.progress is None:
        show = sys.stderr.isatty() and args.format == "text"
    else:
        show = bool(args.progress)
    if not show:
        return _hidden
    return lambda label, total: _shown(label, total, forced=args.progress is not None)


@contextmanager
def _hidden(_label: str, _total: int) -> Iterator[OnDispatch]:
    yield lambda _done: None


@contextmanager
def _shown(label: str, total: int, *, forced: bool) -> Iterator[OnDispatch]:
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    err = console(stderr=True)
    if forced:
        # Asked for by name: drawn even when stderr is not a terminal (a log, a test).
        err = type(err)(file=sys.stderr, force_terminal=True, width=err.width, markup=False)
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("dispatches"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=err,
        transient=True,
    ) as progress:
        task = progress.add_task(label, total=total)

        def advance(done: DispatchDone) -> None:
            progress.update(task, completed=done.index + 1, total=done.num_dispatches)

        yield advance
