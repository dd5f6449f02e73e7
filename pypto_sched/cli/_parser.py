"""The ``pypto-sched`` parser: the program's help, and one sub-parser per command module."""

from __future__ import annotations

import argparse
import importlib.metadata
import textwrap

from . import backends, compare, generate, plan, plot, run
from ._options import HELP_WIDTH, Example, Parser, epilog

__all__ = ["COMMANDS", "build_parser"]

#: The command modules, in the order ``--help`` lists them.
COMMANDS = (plan, compare, plot, run, generate, backends)


def build_parser() -> argparse.ArgumentParser:
    first_examples: list[Example] = [module.EXAMPLES[0] for module in COMMANDS]
    parser = Parser(
        prog="pypto-sched",
        description=textwrap.fill(
            "Plan chunked prefill: split prompts into dispatches within a token budget, "
            "compare settings, draw schedules, run them on a backend and generate tokens.",
            width=HELP_WIDTH,
        ),
        epilog="Run 'pypto-sched COMMAND --help' for each command's options and examples.\n"
        "exit status: 0 success, 1 the work failed (e.g. --verify mismatch), 2 bad input\n\n"
        + epilog(first_examples),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"pypto-sched {_version()}")
    commands = parser.add_subparsers(
        dest="command", required=True, parser_class=Parser, metavar="COMMAND"
    )
    for module in COMMANDS:
        module.add_parser(commands)
    return parser


def _version() -> str:
    try:
        return importlib.metadata.version("pypto-sched")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree, not installed
        return "(not installed)"
