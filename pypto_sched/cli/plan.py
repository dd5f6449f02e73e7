"""``pypto-sched plan``: plan one batch; a summary, or the schedule as JSON."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

import numpy as np

from ..core._schedule import Schedule
from . import _render
from ._errors import EXIT_OK
from ._inputs import plan
from ._options import (
    SEED,
    Example,
    Parser,
    add_command,
    add_config_options,
    add_format_option,
    add_workload_options,
)
from ._replicas import add_replica_options, check_replicas, partition_summary, partition_table

if TYPE_CHECKING:
    from rich.console import RenderableType
    from rich.table import Table

__all__ = ["EXAMPLES", "add_parser", "handle"]

EXAMPLES: list[Example] = [
    ("the seed's workload, 16 prompts of 3,338 tokens: 224 dispatches", f"plan {SEED}"),
    (
        "the same, several requests per dispatch: 14 dispatches",
        f"plan {SEED} \\\n      --policy packed --max-num-seqs 16",
    ),
    ("the schedule itself, as JSON", f"plan {SEED} --format json"),
    (
        "how a long-tailed batch splits over 4 replicas, by tokens",
        "plan --workload lognormal --num-requests 64 \\\n"
        "      --max-num-batched-tokens 8192 --replicas 4",
    ),
]


def add_parser(commands: argparse._SubParsersAction[Parser]) -> None:
    parser = add_command(
        commands,
        "plan",
        summary="plan a batch and print a summary or the schedule",
        description="Plan the prefill of a batch of prompts and print a summary, or the "
        "schedule as JSON.",
        examples=EXAMPLES,
    )
    add_workload_options(parser)
    add_config_options(parser)
    add_replica_options(parser, runs=False)
    add_format_option(
        parser,
        'text: a readable summary; json: the schedule in its JSON format with a "summary" key '
        '(and a "partition" key with --replicas)',
    )
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    schedule, _ = plan(args)
    num_replicas = check_replicas(args)
    partition = (
        None
        if num_replicas is None
        else partition_summary(
            schedule.prompt_lengths, schedule.num_computed_tokens, num_replicas, schedule.config
        )
    )
    if args.format == "json":
        data = schedule.to_dict()
        data["summary"] = schedule.stats.to_dict()
        if partition is not None:
            data["partition"] = partition
        _render.print_json(data)
        return EXIT_OK
    stats = schedule.stats
    heading = (
        f"policy {schedule.config.policy}: {_render.counted(stats.num_requests, 'request')}, "
        f"{_render.counted(stats.num_tokens, 'token')} to prefill"
    )
    _render.emit(heading, _summary_grid(schedule), "", *_finish_table(schedule))
    if partition is not None:
        _render.emit("", *partition_table(partition))
    return EXIT_OK


def _summary_grid(schedule: Schedule) -> Table:
    """Dispatches vs lower bound, tokens per dispatch, utilization, finishing."""
    config, stats = schedule.config, schedule.stats
    table = _render.grid()
    table.add_row(
        "dispatches",
        f"{stats.num_dispatches:,} (lower bound {stats.lower_bound:,}, "
        f"{stats.num_dispatches / stats.lower_bound:.2f}x)",
    )
    table.add_row(
        "tokens per dispatch",
        f"min {stats.min_tokens_per_dispatch:,}, mean {stats.mean_tokens_per_dispatch:,.1f}, "
        f"max {stats.max_tokens_per_dispatch:,} (effective budget {config.effective_budget:,})",
    )
    table.add_row(
        "utilization",
        f"mean {_render.percent(stats.mean_utilization)}, "
        f"min {_render.percent(stats.min_utilization)} "
        f"of max_num_batched_tokens {config.max_num_batched_tokens:,}",
    )
    table.add_row(
        "requests finish at",
        f"dispatch {stats.mean_finish_dispatch:,.1f} on average, "
        f"{stats.worst_finish_dispatch:,} at worst (0-based)",
    )
    return table


def _finish_table(schedule: Schedule, *, limit: int = 16) -> list[RenderableType]:
    """When each request finishes (the first ``limit`` requests), and a note if cut."""
    shown = min(schedule.num_requests, limit)
    table = _render.table("request", "tokens", "chunks", "finishes at dispatch")
    chunks = np.bincount(schedule.requests, minlength=schedule.num_requests)
    todo = schedule.prompt_lengths - schedule.num_computed_tokens
    for r in range(shown):
        table.add_row(
            f"{r:,}",
            f"{int(todo[r]):,}",
            f"{int(chunks[r]):,}",
            f"{int(schedule.finish_dispatch[r]):,}",
        )
    if shown < schedule.num_requests:
        return [table, f"... and {schedule.num_requests - shown:,} more (see --format json)"]
    return [table]
