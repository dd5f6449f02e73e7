"""Output: rich text on a console (the ``cli`` extra), or JSON that needs nothing more.

Piped output is plain text without trailing spaces, at a fixed width, so that what a test or
a script reads does not depend on the terminal that ran it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, TextIO

from ._errors import CommandFailed, UsageError

if TYPE_CHECKING:
    from rich.console import Console, RenderableType
    from rich.table import Table

    from ..core._config import PlannerConfig
    from ..integrations.hf_verify import TransformersVerification
    from ..runtime._generate import GenerationResult

__all__ = [
    "RICH",
    "console",
    "counted",
    "emit",
    "generation_summary",
    "grid",
    "has_rich",
    "percent",
    "print_json",
    "show",
    "stream_of",
    "table",
]

_PIPED_WIDTH = 200
_UNBOUNDED = 1 << 20
_TEXT_COLUMNS = frozenset(
    {"policy", "name", "version", "entry point", "runs here", "option", "meaning"}
)


#: What to install for text tables and progress bars.
RICH = "pip install 'pypto-sched[cli]'"


def has_rich() -> bool:
    """Whether rich, which draws tables and progress bars, can be imported."""
    return importlib.util.find_spec("rich") is not None


def console(*, stderr: bool = False) -> Console:
    """A rich console on stdout (or stderr); a clear error when rich is missing."""
    try:
        from rich.console import Console
    except ImportError:
        raise CommandFailed(f"text output needs rich: {RICH} (or use --format json)") from None
    stream = stream_of(stderr=stderr)
    # Piped output is never wrapped to a terminal's width: tables keep their natural width.
    width = None if stream.isatty() or "COLUMNS" in os.environ else _PIPED_WIDTH
    return Console(file=stream, width=width, markup=False, highlight=False, emoji=False)


def emit(*items: RenderableType, stderr: bool = False) -> None:
    """Print ``items`` on stdout (or stderr); when piped, as plain text without trailing
    spaces."""
    out = console(stderr=stderr)
    if out.is_terminal:
        for item in items:
            _print(out, item, soft_wrap=False)
        return
    with out.capture() as capture:
        for item in items:
            _print(out, item, soft_wrap=isinstance(item, str))
    lines = capture.get().splitlines()
    stream = stream_of(stderr=stderr)
    stream.write("".join(line.rstrip() + "\n" for line in lines))


def _print(out: Console, item: RenderableType, *, soft_wrap: bool) -> None:
    """Print ``item``; a table never narrower than its natural width.

    Rich fits a table to the console by cutting its cells to ``…``, which drops figures: the
    console widens for the table instead, and a terminal narrower than it wraps the lines.
    """
    width = out.width
    if not isinstance(item, str):
        natural = out.measure(item, options=out.options.update_width(_UNBOUNDED)).maximum
        out.width = max(width, natural)
    try:
        out.print(item, soft_wrap=soft_wrap)
    finally:
        out.width = width


def stream_of(*, stderr: bool = False) -> TextIO:
    """``sys.stdout`` (or ``sys.stderr``); a clear error when the process started with it
    closed (Python then sets it to ``None``)."""
    stream = sys.stderr if stderr else sys.stdout
    if stream is None:
        raise UsageError(f"{'stderr' if stderr else 'stdout'} is closed: nowhere to write")
    return stream


def print_json(data: object) -> None:
    print(json.dumps(data), file=stream_of())


def table(*columns: str) -> Table:
    """A table with a rule under its head; text columns left, numbers right."""
    from rich import box
    from rich.table import Table

    result = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    for column in columns:
        result.add_column(column, justify="left" if column in _TEXT_COLUMNS else "right")
    return result


def grid() -> Table:
    """Two columns, label and value, without borders."""
    from rich.table import Table

    result = Table.grid(padding=(0, 3))
    result.add_column()
    result.add_column()
    return result


def counted(number: int, noun: str) -> str:
    """``number`` with commas and ``noun``, plural unless it is 1: ``1 request``,
    ``1,024 requests``."""
    return f"{number:,} {noun}{'' if number == 1 else 's'}"


def percent(value: float) -> str:
    return f"{value:.1%}"


def show(value: object) -> str:
    """A setting as the tables show it: ``off`` for ``None``, integers with commas."""
    if value is None:
        return "off"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def generation_summary(
    backend_name: str,
    config: PlannerConfig,
    result: GenerationResult,
    verification: TransformersVerification | None,
    extra: Sequence[tuple[str, str]] = (),
) -> list[str]:
    """``generate``'s summary on stderr, as plain lines that need no rich: dispatches,
    preemptions, first tokens, time and throughput (as ``run`` words them), and the
    ``extra`` rows, in a label column and a value column."""
    stats = result.stats
    preempted = sum(1 for s in result.sequences if s.num_preemptions)
    heading = (
        f"{counted(len(result.sequences), 'request')}, "
        f"{counted(stats.num_prompt_tokens, 'prompt token')} on backend {backend_name!r} "
        f"({config.policy})"
    )
    rows = [
        ("generated", f"{stats.num_generated_tokens:,} tokens"),
        ("dispatches", f"{stats.num_dispatches:,} ({stats.num_mixed_dispatches:,} mixed "
                       "prefill and decode)"),
        ("preemptions",
         f"{stats.num_preemptions:,} ({counted(preempted, 'request')})"),
        ("time to first token", f"dispatch {stats.mean_time_to_first_token:,.1f} on average, "
                                f"{stats.max_time_to_first_token:,} at worst"),
        ("time", f"{stats.wall_seconds:.2f} s ({stats.tokens_per_second:,.0f} tokens/s, "
                 f"planning {stats.planning_seconds / max(stats.wall_seconds, 1e-9):.1%})"),
        *extra,
    ]  # fmt: skip
    if verification is not None:
        rows.append(("verify", verification.describe()))
    width = max(len(label) for label, _ in rows) + 3  # as grid() pads its label column
    return [heading, *(f"{label:<{width}}{value}" for label, value in rows)]
