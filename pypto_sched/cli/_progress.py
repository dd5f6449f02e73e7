"""A progress bar on stderr fed by the driver's ``on_dispatch`` callback."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager

from ..runtime.execute import DispatchDone
from ._errors import CommandFailed
from ._render import RICH, console, has_rich

__all__ = ["OnDispatch", "bar", "generation_bar", "wanted"]

#: What :func:`~pypto_sched.execute_schedule` and :func:`~pypto_sched.generate` call after
#: each dispatch.
OnDispatch = Callable[[DispatchDone], None]
#: ``progress(label, total)``: a context whose value is the ``on_dispatch`` callback.
Progress = Callable[[str, int], AbstractContextManager[OnDispatch]]


def wanted(args: argparse.Namespace) -> bool:
    """Whether to draw progress bars: as ``--progress`` or ``--no-progress`` says; by default
    when stderr is a terminal, the output is not JSON and rich (which draws them) is
    installed. ``--progress`` without rich is an error, not a silent omission."""
    if args.progress is None:
        return (
            sys.stderr is not None and sys.stderr.isatty() and args.format != "json" and has_rich()
        )
    if args.progress and not has_rich():
        raise CommandFailed(f"--progress needs rich: {RICH} (or use --no-progress)")
    return bool(args.progress)


def bar(args: argparse.Namespace) -> Progress:
    """Progress bars as :func:`wanted` says."""
    if not wanted(args):
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


@contextmanager
def generation_bar(args: argparse.Namespace, num_requests: int) -> Iterator[OnDispatch]:
    """Requests done and tokens per second on stderr, as :func:`wanted` says."""
    if not wanted(args):
        yield lambda _done: None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    err = console(stderr=True)
    if args.progress:  # asked for by name: drawn even when stderr is not a terminal
        err = type(err)(file=sys.stderr, force_terminal=True, width=err.width, markup=False)
    columns = (TextColumn("generate"), BarColumn(), MofNCompleteColumn(), TextColumn("requests"),
               TextColumn("{task.fields[rate]}"), TimeElapsedColumn())  # fmt: skip
    with Progress(*columns, console=err, transient=True) as progress:
        task = progress.add_task("generate", total=num_requests, rate="")
        started = time.perf_counter()

        def advance(done: DispatchDone) -> None:
            seconds = time.perf_counter() - started
            rate = f"{done.num_generated_tokens / seconds:,.0f} tokens/s" if seconds > 0 else ""
            progress.update(task, completed=done.num_finished, rate=rate)

        yield advance
