"""The parser's building blocks: the parser class, a command's sub-parser with its examples,
and the option groups several commands share (workload, planner configuration, format)."""

from __future__ import annotations

import argparse
import sys
import textwrap
from collections.abc import Sequence
from typing import Any, NoReturn

from ..core._config import POLICIES
from ..core._workloads import WORKLOADS
from ._errors import UsageError
from ._lengths import GRAMMAR

__all__ = [
    "CONFIG_FLAGS",
    "HELP_WIDTH",
    "SEED",
    "WORKLOAD_FLAGS",
    "Example",
    "Once",
    "Parser",
    "Retired",
    "add_command",
    "add_config_options",
    "add_format_option",
    "add_workload_options",
    "epilog",
    "warn_retired",
]

#: Help text is filled to fit an 80-column terminal, as argparse fills its own.
HELP_WIDTH = 78
#: The seed's workload and limits, as the examples spell them.
SEED = (
    "--lengths 3338x16 --max-num-batched-tokens 8192 \\\n      --long-prefill-token-threshold 256"
)

#: One example of a command: what it shows, and the command line after ``pypto-sched``.
Example = tuple[str, str]


class Parser(argparse.ArgumentParser):
    """An argument parser whose errors are :class:`UsageError` (one line, exit 2)."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


#: A flag given twice keeps the last value, as argparse's own ``"store"`` does (and as a
#: wrapper script that appends a flag to a user's command line expects). The name is kept
#: for the commands that still spell it.
Once = "store"


class Retired(argparse.Action):
    """A flag's retired name (``new``: the flag that replaced it): it still works, stored in
    its own ``dest`` for the command to read as the new flag's, with one line on stderr
    (stdout is the command's output). Left out of ``--help``."""

    def __init__(self, option_strings: Sequence[str], dest: str, *, new: str, **kwargs: Any):
        super().__init__(option_strings, dest, help=argparse.SUPPRESS, **kwargs)
        self.new = new

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        warn_retired(option_string or self.option_strings[0], self.new)
        setattr(namespace, self.dest, values)


def warn_retired(old: str, new: str) -> None:
    """The one line on stderr for a retired name that still works."""
    if sys.stderr is not None:  # not started with stderr closed
        print(f"pypto-sched: warning: {old} is deprecated: use {new}", file=sys.stderr)


def epilog(examples: Sequence[Example]) -> str:
    lines = ["examples:"]
    for what, example in examples:
        lines.append(f"  # {what}")
        lines.append(f"  pypto-sched {example}")
    return "\n".join(lines)


def add_command(
    commands: argparse._SubParsersAction[Parser],
    name: str,
    *,
    summary: str,
    description: str,
    examples: Sequence[Example],
) -> Parser:
    """A sub-parser for ``name`` with its description and examples."""
    return commands.add_parser(
        name,
        help=summary,
        description=textwrap.fill(description, width=HELP_WIDTH),
        epilog=epilog(examples),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def add_format_option(parser: argparse.ArgumentParser, help: str) -> None:
    parser.add_argument(
        "--format", action=Once, choices=("text", "json"), default="text", help=help
    )


def add_workload_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "workload (one of --lengths, --lengths-file, --workload)",
        description=textwrap.fill(
            f"LIST syntax: {GRAMMAR}. A flag given twice keeps its last value; an option "
            "the workload does not use is refused: --num-requests, --min-length and "
            "--max-length apply only to --workload uniform, lognormal and bimodal "
            "(--num-requests to seed too), --seed only to those and to run's token ids.",
            width=HELP_WIDTH - 2,
            break_on_hyphens=False,
        ),
    )
    source = group.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--lengths",
        action=Once,
        metavar="LIST",
        help="prompt lengths, e.g. '3338x16' (16 prompts of 3338 tokens) or '100,200,50x3'; "
        "'@FILE' reads them from a file ('@-' from stdin)",
    )
    source.add_argument(
        "--lengths-file",
        action=Once,
        metavar="PATH",
        help="read the prompt lengths from a file, in the LIST syntax (same as --lengths @PATH)",
    )
    source.add_argument(
        "--workload",
        action=Once,
        choices=WORKLOADS,
        metavar="NAME",
        help="a named synthetic workload: seed (prompts of 3338 tokens), uniform, lognormal "
        "(long-tailed), bimodal (4 in 5 short, 1 in 5 long)",
    )
    group.add_argument(
        "--num-requests",
        action=Once,
        type=int,
        metavar="N",
        help="--workload: prompts (default 16)",
    )
    group.add_argument(
        "--min-length",
        action=Once,
        type=int,
        metavar="N",
        help="--workload: shortest prompt (default 16)",
    )
    group.add_argument(
        "--max-length",
        action=Once,
        type=int,
        metavar="N",
        help="--workload: longest prompt (default 4096)",
    )
    group.add_argument(
        "--seed",
        action=Once,
        type=int,
        metavar="N",
        help="random seed of --workload (and of run's token ids); default 0",
    )
    group.add_argument(
        "--num-computed",
        action=Once,
        metavar="LIST",
        help="tokens already cached per prompt (prefix hits), in the LIST syntax or '@FILE'",
    )


#: The planner configuration's fields and the flags that give them, for every command that
#: takes them (errors name the flag: :func:`~pypto_sched.cli._errors.flags_named`).
CONFIG_FLAGS = {
    "max_num_batched_tokens": "--max-num-batched-tokens",
    "long_prefill_token_threshold": "--long-prefill-token-threshold",
    "max_num_seqs": "--max-num-seqs",
    "chunk_alignment": "--chunk-alignment",
    "policy": "--policy",
    "max_num_partial_prefills": "--max-num-partial-prefills",
}
#: The synthetic workload's parameters and their flags.
WORKLOAD_FLAGS = {
    "num_requests": "--num-requests",
    "min_length": "--min-length",
    "max_length": "--max-length",
    "seed": "--seed",
}


def add_config_options(
    parser: argparse.ArgumentParser,
    *,
    budget: int | None = None,
    policy: str = "round_robin",
    policy_help: str = "round_robin: the seed's behaviour (default); packed: co-scheduled chunks",
) -> None:
    """The planner's flags; ``budget`` is ``--max-num-batched-tokens``' default (``None``:
    required) and ``policy`` ``--policy``'s."""
    group = parser.add_argument_group(
        "planner configuration",
        description=textwrap.fill(
            "As in vLLM's flags, a threshold of 0 is off; the other limits are off unless given.",
            width=HELP_WIDTH - 2,
        ),
    )
    group.add_argument(
        "--max-num-batched-tokens",
        action=Once,
        type=int,
        required=budget is None,
        default=budget,
        metavar="N",
        help="most tokens one dispatch may carry "
        + ("(required)" if budget is None else f"(default {budget})"),
    )
    group.add_argument(
        "--long-prefill-token-threshold",
        action=Once,
        type=int,
        default=0,
        metavar="N",
        help="per-request chunk cap; round_robin also lowers the budget to it (0: off)",
    )
    group.add_argument(
        "--max-num-seqs",
        action=Once,
        type=int,
        metavar="N",
        help="most rows per dispatch (default: no limit)",
    )
    group.add_argument(
        "--chunk-alignment",
        action=Once,
        type=int,
        metavar="N",
        help="non-final chunks end on multiples of N (the KV page size: no page is split)",
    )
    group.add_argument("--page-size", action=Retired, new="--chunk-alignment", type=int)
    group.add_argument(
        "--policy",
        action=Once,
        choices=POLICIES,
        default=policy,
        help=policy_help,
    )
    group.add_argument(
        "--max-num-partial-prefills",
        action=Once,
        type=int,
        metavar="N",
        help="packed only: most requests part-way through prefill at once (default: no limit)",
    )
