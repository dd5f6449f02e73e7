"""``pypto-sched run``: execute a schedule on an installed backend, with progress and a
summary, and optionally verify it against a one-shot prefill.

Everything but the options and the output is the library's: :func:`load_backend`,
:func:`execute_schedule` (whose ``on_dispatch`` drives the progress bar) and
:func:`verify_against_one_shot` (the one verification rule).
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from ..core._validate import check_positions
from ..runtime._verify import Verification, verify_against_one_shot
from ..runtime.backends import max_positions
from ..runtime.execute import execute_schedule
from . import _progress, _render, _replicas
from ._errors import (
    EXIT_FAILED,
    EXIT_OK,
    UsageError,
    check_counts,
)
from ._inputs import lengths_flag, plan
from ._options import (
    Example,
    Once,
    Parser,
    add_command,
    add_config_options,
    add_format_option,
    add_workload_options,
)
from ._specs import backend_options, load_backend_from_args

if TYPE_CHECKING:
    from rich.console import RenderableType

    from ..core._schedule import Schedule

__all__ = ["EXAMPLES", "MAX_RUN_TOKENS", "add_parser", "handle"]

EXAMPLES: list[Example] = [
    (
        "the seed's shape, a quarter as long, on the NumPy reference backend",
        "run --backend reference --lengths 834x16 \\\n"
        "      --max-num-batched-tokens 8192 --long-prefill-token-threshold 256 --verify",
    ),
    (
        "a one-layer model (options go to the backend's factory), packed, as JSON",
        "run --backend reference --backend-option num_hidden_layers=1 \\\n"
        "      --lengths 300x4 --max-num-batched-tokens 512 --policy packed --verify \\\n"
        "      --format json",
    ),
    (
        "the same batch split by tokens over 2 Ray actors (a local Ray instance)",
        "run --backend reference --lengths 300x4 \\\n"
        "      --max-num-batched-tokens 512 --policy packed --replicas 2",
    ),
]

#: Most prompt tokens ``run`` draws random token ids for (100 million int64 ids: 0.8 GB).
#: The command line's own limit, on the prompts it makes up; the library runs the prompts
#: its caller has, and owns no such limit.
MAX_RUN_TOKENS = 100_000_000


def add_parser(commands: argparse._SubParsersAction[Parser]) -> None:
    parser = add_command(
        commands,
        "run",
        summary="execute a schedule on an installed backend",
        description="Plan a workload, run it dispatch by dispatch on an installed backend "
        "with random prompts (token ids drawn with --seed, at most 100,000,000 tokens), and "
        "summarise: time, tokens per second, each request's greedy next token. --verify runs "
        "the same prompts as one dispatch (one-shot prefill) on the same backend and checks "
        "the final logits within the backend's tolerance and the greedy ids up to near-ties; "
        "a mismatch exits with status 1.",
        examples=EXAMPLES,
    )
    parser.add_argument(
        "--backend",
        action=Once,
        required=True,
        metavar="NAME",
        help="an installed backend (see 'pypto-sched backends')",
    )
    parser.add_argument(
        "--backend-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="passed to the backend's factory ('pypto-sched backends' lists them); VALUE is "
        "read as JSON when it parses (numbers, true, null), else as a string (repeat for more)",
    )
    add_workload_options(parser)
    add_config_options(parser)
    parser.add_argument(
        "--kv-page-size",
        action=Once,
        type=int,
        metavar="N",
        help="KV cache page size (default: --chunk-alignment if set, else 16)",
    )
    parser.add_argument(
        "--verify",
        action="store_true",
        help="compare with one-shot prefill (on one device: not with --replicas)",
    )
    _replicas.add_replica_options(parser, runs=True)
    parser.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="show a progress bar on stderr (default: when stderr is a terminal)",
    )
    add_format_option(parser, "text: a summary; json: the summary as an object")
    # --seed draws the token ids, also of a lengths list (see _inputs.workload).
    parser.set_defaults(handler=handle, seeds_token_ids=True)


def handle(args: argparse.Namespace) -> int:
    schedule, source = plan(args)
    if int(schedule.num_computed_tokens.sum()):
        raise UsageError("--num-computed: run starts from an empty KV cache; leave it out")
    if schedule.num_tokens > MAX_RUN_TOKENS:
        raise UsageError(
            f"{lengths_flag(args)}: run draws token ids for at most {MAX_RUN_TOKENS:,} tokens: "
            f"{schedule.num_tokens:,}"
        )
    seed = 0 if args.seed is None else args.seed
    if seed < 0:
        raise UsageError(f"--seed: must be >= 0: {seed}")
    check_counts(args, {"page_size": "--kv-page-size"})
    num_replicas = _replicas.check_replicas(args)
    if num_replicas is not None:
        if args.verify:
            raise UsageError("--verify runs on one device: leave out --replicas")
        return _run_on_replicas(args, schedule, source, seed, num_replicas)
    backend = load_backend_from_args(args)
    _check_positions(args, schedule, max_positions(backend))
    prompts = _random_token_ids(schedule, backend.vocab_size, seed)
    progress = _progress.bar(args)
    with progress("prefill", schedule.num_dispatches) as on_dispatch:
        started = time.perf_counter()
        result = execute_schedule(
            schedule,
            backend,
            prompts,
            return_greedy=True,
            page_size=args.kv_page_size,
            on_dispatch=on_dispatch,
        )
        seconds = time.perf_counter() - started
    summary: dict[str, Any] = {
        "backend": backend.name,
        "source": source,
        "config": schedule.config.to_dict(),
        "num_requests": schedule.num_requests,
        "num_tokens": schedule.num_tokens,
        "num_dispatches": schedule.num_dispatches,
        "seconds": seconds,
        # None rather than Infinity, which is not JSON.
        "tokens_per_second": schedule.num_tokens / seconds if seconds > 0 else None,
        "greedy_token_ids": _ints(result.greedy_token_ids),
        "verify": None,
    }
    verification = None
    if args.verify:
        with progress("one-shot", 1) as on_dispatch:
            started = time.perf_counter()
            verification = verify_against_one_shot(
                schedule, backend, prompts, chunked=result, on_dispatch=on_dispatch
            )
            summary["verify"] = _verify_summary(verification, time.perf_counter() - started)
    if args.format == "json":
        _render.print_json(summary)
    else:
        _render.emit(*_summary_table(summary, verification))
    if verification is not None and not verification.passed:
        return EXIT_FAILED
    return EXIT_OK


def _run_on_replicas(
    args: argparse.Namespace, schedule: Schedule, source: str, seed: int, num_replicas: int
) -> int:
    """Prefill the same prompts on ``num_replicas`` Ray actors, the batch split by tokens."""
    options = backend_options(args.backend_option)
    progress = _replicas.progress_bar(args)
    with _replicas.replicas(args, args.backend, options, num_replicas) as pool:
        _check_positions(args, schedule, pool.max_position_embeddings)
        prompts = _random_token_ids(schedule, pool.vocab_size, seed)
        with progress("prefill") as on_progress:
            result = pool.prefill(
                prompts,
                config=schedule.config,
                page_size=args.kv_page_size,
                on_progress=on_progress,
            )
    seconds = result.wall_seconds
    summary: dict[str, Any] = {
        "backend": args.backend,
        "source": source,
        "config": schedule.config.to_dict(),
        "num_requests": schedule.num_requests,
        "num_tokens": schedule.num_tokens,
        "num_dispatches": sum(result.num_dispatches),
        "seconds": seconds,
        "tokens_per_second": schedule.num_tokens / seconds if seconds > 0 else None,
        "greedy_token_ids": _ints(result.greedy_token_ids),
        "verify": None,
        "replicas": {
            "num_replicas": num_replicas,
            "tokens": [int(load) for load in result.partition.loads],
            "num_dispatches": list(result.num_dispatches),
            "imbalance": result.partition.imbalance,
            "num_restarts": result.num_restarts,
        },
    }
    if args.format == "json":
        _render.print_json(summary)
        return EXIT_OK
    _render.emit(*_summary_table(summary, None))
    return EXIT_OK


def _check_positions(args: argparse.Namespace, schedule: Schedule, longest: int | None) -> None:
    """``execute_schedule``'s check of the model's positions, before token ids are drawn,
    naming the request and the option that gave its length."""
    if longest is None:
        return
    over = np.flatnonzero(schedule.prompt_lengths > longest)
    if over.size:
        r = int(over[0])
        where = f"{lengths_flag(args)}: request {r}"
        check_positions(where, int(schedule.prompt_lengths[r]), longest)


def _random_token_ids(
    schedule: Schedule, vocab_size: int, seed: int
) -> list[npt.NDArray[np.int64]]:
    """Random prompts of the schedule's lengths, the same for the same seed."""
    rng = np.random.default_rng(seed)
    return [
        rng.integers(0, vocab_size, size=int(length), dtype=np.int64)
        for length in schedule.prompt_lengths
    ]


def _ints(values: npt.NDArray[Any] | None) -> list[int] | None:
    return None if values is None else [int(v) for v in values]


def _verify_summary(verification: Verification, seconds: float) -> dict[str, Any]:
    worst = verification.max_abs_logit_diff
    agrees = verification.greedy_agrees
    return {
        "passed": verification.passed,
        "max_abs_logit_diff": None if worst is None or math.isnan(worst) else worst,
        "tolerance": verification.tolerance,
        "relative_tolerance": verification.relative_tolerance,
        "greedy_agree": None if agrees is None else int(agrees.sum()),
        "requests_agreeing": verification.requests_agreeing,
        "problem": verification.first_problem(),
        "one_shot_seconds": seconds,
    }


def _summary_table(
    summary: Mapping[str, Any], verification: Verification | None
) -> list[RenderableType]:
    heading = (
        f"{_render.counted(summary['num_requests'], 'request')}, "
        f"{_render.counted(summary['num_tokens'], 'token')} on backend "
        f"{summary['backend']!r} ({summary['config']['policy']})"
    )
    table = _render.grid()
    table.add_row("dispatches", f"{summary['num_dispatches']:,}")
    rate = summary["tokens_per_second"]
    shown_rate = "too fast to measure" if rate is None else f"{rate:,.0f} tokens/s"
    table.add_row("time", f"{summary['seconds']:.2f} s ({shown_rate})")
    greedy = summary["greedy_token_ids"] or []
    more = f" ... ({len(greedy):,} in all)" if len(greedy) > 8 else ""
    table.add_row("greedy next tokens", " ".join(str(t) for t in greedy[:8]) + more)
    if summary.get("replicas") is not None:
        table.add_row("replicas", _replicas.describe(summary["replicas"]))
    if verification is not None:
        seconds = summary["verify"]["one_shot_seconds"]
        table.add_row("verify", f"{verification.describe()}; one-shot run {seconds:.2f} s")
    return [heading, table]
