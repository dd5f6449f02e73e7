"""``pypto-sched backends``: the installed backends, whether each runs here, and the options
each factory takes; all of it from :func:`pypto_sched.backends.backend_statuses`."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from ..runtime.backends import BackendStatus, backend_statuses
from . import _render
from ._errors import EXIT_OK
from ._options import Example, Parser, add_command, add_format_option

if TYPE_CHECKING:
    from rich.console import RenderableType

__all__ = ["EXAMPLES", "add_parser", "handle"]

EXAMPLES: list[Example] = [
    ("what is installed, whether it can run here, and its options", "backends"),
]


def add_parser(commands: argparse._SubParsersAction[Parser]) -> None:
    parser = add_command(
        commands,
        "backends",
        summary="list the installed backends and their options",
        description="List the backends installed under the 'pypto_sched.backends' entry "
        "point, whether each can run on this machine (and why not), and the options its "
        "factory takes (give them to 'run' as --backend-option KEY=VALUE).",
        examples=EXAMPLES,
    )
    add_format_option(parser, "text: tables; json: a list of objects")
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    statuses = backend_statuses()
    if args.format == "json":
        _render.print_json([status.to_dict() for status in statuses])
        return EXIT_OK
    if not statuses:
        _render.emit("no backends installed; try: pip install -e backends/reference")
        return EXIT_OK
    table = _render.table("name", "version", "entry point", "runs here")
    for status in statuses:
        table.add_row(status.name, status.distribution or "?", status.entry_point, _runs(status))
    _render.emit(table, *(item for status in statuses for item in _options(status)))
    return EXIT_OK


def _runs(status: BackendStatus) -> str:
    answer = "yes" if status.available else "no"
    return f"{answer}: {status.reason}" if status.reason else answer


def _options(status: BackendStatus) -> list[RenderableType]:
    if not status.options:
        return []
    table = _render.table("option", "meaning")
    for option, meaning in status.options.items():
        table.add_row(option, meaning)
    return ["", f"{status.name} options (--backend-option KEY=VALUE):", table]
