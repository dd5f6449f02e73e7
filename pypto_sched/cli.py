"""The ``pypto-sched`` command line.

``pypto-sched plan --lengths 3338x16 --max-num-batched-tokens 8192
--long-prefill-token-threshold 256`` plans the seed's workload and prints a summary;
``--format json`` prints the schedule in its JSON format with a ``"summary"`` key added.
Bad input exits with status 2 and one line on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from ._config import POLICIES, PlannerConfig
from ._errors import PyptoSchedError
from ._policies import plan_prefill
from ._schedule import Schedule

__all__ = ["main", "parse_lengths"]

SEED_EXAMPLE = (
    "example (the seed's workload, 16 prompts of 3,338 tokens):\n"
    "  pypto-sched plan --lengths 3338x16 --max-num-batched-tokens 8192 \\\n"
    "      --long-prefill-token-threshold 256\n"
    "  pypto-sched plan --lengths 3338x16 --max-num-batched-tokens 8192 \\\n"
    "      --long-prefill-token-threshold 256 --policy packed --max-batch-size 16"
)


class UsageError(Exception):
    """Bad command-line input; reported as one line."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def parse_lengths(text: str, *, name: str = "--lengths") -> list[int]:
    """Parse ``"100,200,3338x16"``: a comma list in which ``LxN`` stands for N prompts of L
    tokens. Whitespace and newlines separate items too; ``#`` starts a comment."""
    items: list[int] = []
    lines = (line.split("#", 1)[0] for line in text.splitlines())
    for token in " ".join(lines).replace(",", " ").split():
        value, _, count = token.partition("x")
        try:
            length = int(value)
            repeat = int(count) if count else 1
        except ValueError:
            raise UsageError(
                f"{name}: expected LENGTH or LENGTHxCOUNT, got {token!r}"
            ) from None
        if repeat < 1:
            raise UsageError(f"{name}: the count in {token!r} must be >= 1")
        if repeat > 10_000_000:
            raise UsageError(f"{name}: the count in {token!r} must be <= 10000000")
        items.extend([length] * repeat)
    if not items:
        raise UsageError(f"{name}: no lengths given")
    return items


def _read_lengths(value: str, name: str) -> list[int]:
    """``@PATH`` reads the list from a file (``-`` for stdin); anything else is the list."""
    if not value.startswith("@"):
        return parse_lengths(value, name=name)
    path = value[1:]
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text()
    except OSError as error:
        raise UsageError(f"{name}: cannot read {path!r}: {error.strerror}") from None
    return parse_lengths(text, name=name)


def _optional(value: int) -> int | None:
    """0 on the command line means "off", as in vLLM's flags."""
    return value or None


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="pypto-sched",
        description="Plan chunked prefill: split prompts into dispatches within a budget.",
        epilog=SEED_EXAMPLE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    plan = commands.add_parser(
        "plan",
        help="plan a batch and print the schedule",
        description="Plan the prefill of a batch of prompts and print a summary or the "
        "schedule as JSON.",
        epilog=SEED_EXAMPLE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_workload_options(plan)
    _add_config_options(plan)
    plan.add_argument(
        "--format",
        choices=("text", "json"),
        default="text",
        help="text: a readable summary (default); json: the schedule in its JSON format "
        'with a "summary" key',
    )
    return parser


def _add_workload_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--lengths",
        required=True,
        metavar="LIST",
        help="prompt lengths, e.g. '3338x16' (16 prompts of 3338 tokens) or '100,200,50x3'; "
        "'@FILE' reads them from a file ('@-' from stdin)",
    )
    parser.add_argument(
        "--num-computed",
        metavar="LIST",
        help="tokens already cached per prompt (prefix hits), same syntax as --lengths",
    )


def _add_config_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--max-num-batched-tokens",
        type=int,
        required=True,
        metavar="N",
        help="most tokens one dispatch may carry",
    )
    parser.add_argument(
        "--long-prefill-token-threshold",
        type=int,
        default=0,
        metavar="N",
        help="per-request chunk cap; round_robin also lowers the budget to it (0: off)",
    )
    parser.add_argument(
        "--max-batch-size", type=int, default=0, metavar="N",
        help="most rows per dispatch (0: no limit)",
    )
    parser.add_argument(
        "--page-size", type=int, default=0, metavar="N",
        help="non-final chunks end on multiples of N (0: off)",
    )
    parser.add_argument(
        "--policy", choices=POLICIES, default="round_robin",
        help="round_robin: the seed's behaviour (default); packed: co-scheduled chunks",
    )
    parser.add_argument(
        "--max-num-partial-prefills", type=int, default=0, metavar="N",
        help="packed only: most requests part-way through prefill at once (0: no limit)",
    )


def _config(args: argparse.Namespace) -> PlannerConfig:
    return PlannerConfig.from_engine_args(
        max_num_batched_tokens=args.max_num_batched_tokens,
        long_prefill_token_threshold=args.long_prefill_token_threshold,
        max_num_seqs=_optional(args.max_batch_size),
        page_size=_optional(args.page_size),
        policy=args.policy,
        max_num_partial_prefills=_optional(args.max_num_partial_prefills),
    )


def _plan(args: argparse.Namespace) -> Schedule:
    lengths = _read_lengths(args.lengths, "--lengths")
    computed = (
        None if args.num_computed is None else _read_lengths(args.num_computed, "--num-computed")
    )
    return plan_prefill(lengths, _config(args), num_computed_tokens=computed)


def format_summary(schedule: Schedule) -> str:
    """A readable summary: dispatches vs lower bound, tokens, utilisation, finishing."""
    config = schedule.config
    stats = schedule.stats
    finish = schedule.finish_dispatch
    lines = [
        f"policy {config.policy}: {stats.num_requests:,} requests, "
        f"{stats.num_tokens:,} tokens to prefill",
        f"dispatches            {stats.num_dispatches:,} (lower bound {stats.lower_bound:,}, "
        f"{stats.num_dispatches / stats.lower_bound:.2f}x)",
        f"tokens per dispatch   min {stats.min_tokens_per_dispatch:,}  "
        f"mean {stats.mean_tokens_per_dispatch:,.1f}  max {stats.max_tokens_per_dispatch:,}  "
        f"(effective budget {config.effective_budget:,})",
        f"utilisation           mean {stats.mean_utilisation:.1%}  "
        f"min {stats.min_utilisation:.1%}  of max_num_batched_tokens "
        f"{config.max_num_batched_tokens:,}",
        f"requests finish at    mean dispatch {stats.mean_finish_dispatch:,.1f}  "
        f"worst {stats.worst_finish_dispatch:,}",
    ]
    shown = min(schedule.num_requests, 16)
    lines.append("request finishes at dispatch (0-based):")
    lines.extend(f"  request {r:>4}: {int(finish[r]):,}" for r in range(shown))
    if shown < schedule.num_requests:
        lines.append(f"  ... and {schedule.num_requests - shown:,} more (see --format json)")
    return "\n".join(lines)


def _run(args: argparse.Namespace) -> str:
    schedule = _plan(args)
    if args.format == "json":
        data = schedule.to_dict()
        data["summary"] = schedule.stats.to_dict()
        return json.dumps(data)
    return format_summary(schedule)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``pypto-sched``; returns the exit status."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        output = _run(args)
    except (UsageError, PyptoSchedError) as error:
        print(f"pypto-sched: error: {error}", file=sys.stderr)
        return 2
    try:
        print(output)
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader (e.g. `head`) went away: not an error of ours, and no traceback.
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - replaces the closed stream
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
