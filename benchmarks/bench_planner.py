"""Time ``plan_prefill`` against the simple oracle of ``tests/oracle.py`` and against the
memory floor, side by side.

    python benchmarks/bench_planner.py            # every case
    python benchmarks/bench_planner.py --quick    # skip the 100,000-prompt case

For every case and policy the script times, in the same run, alternating them and keeping the
best of a few repeats of each: the fast planner, the oracle, and the *floor* -- copying the
planned schedule's row arrays and dispatch offsets once, the bytes the planner has to write,
which no planner can beat. It checks that planner and oracle plan the same dispatches, and
prints the planner's time over the floor, the oracle's time over the planner's, and the
schedule's memory per chunk row (the bytes of all its arrays over its rows). Times are CPU time
of this process. Timings on a shared machine are noisy, so it reports ratios (with the load
average) and asserts no absolute time. A missed target (the table says which) makes it exit 1;
``--no-check`` only reports.

The targets, on the 100,000-prompt case: the planner takes at most 10x the floor under both
policies and is at least 50x faster than the oracle under ``round_robin`` and 20x under
``packed``; on the 8,000-prompt case, at least 10x and 5x faster than the oracle. On both,
a schedule takes at most 22 bytes per chunk row.
"""

from __future__ import annotations

import argparse
import importlib
import itertools
import os
import sys
import time
import timeit
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NamedTuple, cast

import numpy as np

from pypto_sched import POLICIES, PlannerConfig, Policy, Schedule, plan_prefill

# The oracle's rows: per dispatch, a list of (request, start, length, is_final).
OraclePlan = Callable[[list[int], PlannerConfig], list[list[tuple[int, int, int, bool]]]]

TESTS_DIR = Path(__file__).resolve().parent.parent / "tests"
BUDGET = 8192
THRESHOLD = 256
SEED_BATCH_SIZE = 16


class Targets(NamedTuple):
    #: Per policy: the least oracle time over planner time.
    min_speedup: dict[Policy, float]
    #: The most bytes of schedule per chunk row.
    max_bytes_per_row: float = 22.0
    #: The most planner time over floor time (``None``: no target).
    max_over_floor: float | None = None


#: The targets of the large cases. (A batch of a few requests is not held to a size per row:
#: its per-request arrays weigh more than its rows.)
MEDIUM = Targets(min_speedup={"round_robin": 10.0, "packed": 5.0})
LARGE = Targets(min_speedup={"round_robin": 50.0, "packed": 20.0}, max_over_floor=10.0)


class Case(NamedTuple):
    name: str
    lengths: list[int]
    #: The speed targets (``None`` for the small case: they are stated for the large ones).
    targets: Targets | None
    #: ``max_num_seqs`` for ``packed`` (``None``: no limit).
    packed_batch_size: int | None = None


class Result(NamedTuple):
    case: str
    policy: Policy
    dispatches: int
    chunks: int
    planner_seconds: float
    oracle_seconds: float
    floor_seconds: float
    bytes_per_row: float
    min_speedup: float | None
    max_over_floor: float | None
    max_bytes_per_row: float | None

    @property
    def speedup(self) -> float:
        return self.oracle_seconds / self.planner_seconds

    @property
    def over_floor(self) -> float:
        return self.planner_seconds / self.floor_seconds


def load_oracle() -> OraclePlan:
    """``oracle_plan`` from ``tests/oracle.py`` (the tests directory is not a package)."""
    if str(TESTS_DIR) not in sys.path:
        sys.path.insert(0, str(TESTS_DIR))
    return cast(OraclePlan, importlib.import_module("oracle").oracle_plan)


def make_cases(*, quick: bool) -> list[Case]:
    rng = np.random.default_rng(0)
    cases = [
        Case("seed 16 x 3338", [3338] * 16, None, packed_batch_size=SEED_BATCH_SIZE),
        Case("8,000 uniform", rng.integers(1, BUDGET + 1, 8_000).tolist(), MEDIUM),
    ]
    if not quick:
        cases.append(Case("100,000 uniform", rng.integers(1, BUDGET + 1, 100_000).tolist(), LARGE))
    return cases


def make_config(case: Case, policy: Policy) -> PlannerConfig:
    return PlannerConfig(
        max_num_batched_tokens=BUDGET,
        long_prefill_token_threshold=THRESHOLD,
        max_num_seqs=case.packed_batch_size if policy == "packed" else None,
        policy=policy,
    )


def best_times(runs: Sequence[Callable[[], object]], repeats: int) -> list[float]:
    """Best seconds per call of each of ``runs``, timed in turn ``repeats`` times.

    Time is this process's CPU time, so that other work on the machine counts less;
    alternating the runs exposes them to the same noise, and a fast run is looped until a
    timing lasts about 0.2 s, so that tiny cases are timed reliably too.
    """
    timers = [timeit.Timer(run, timer=time.process_time) for run in runs]
    numbers: list[int] = []
    best: list[float] = []
    for timer in timers:
        number, elapsed = timer.autorange()
        numbers.append(number)
        best.append(elapsed / number)
    for _ in range(repeats - 1):
        for index, timer in enumerate(timers):
            elapsed = timer.timeit(numbers[index])
            best[index] = min(best[index], elapsed / numbers[index])
    return best


def copy_rows(schedule: Schedule) -> list[np.ndarray]:
    """The floor: a fresh copy of every array the planner writes (the offsets and the rows)."""
    arrays = (
        schedule.dispatch_offsets,
        schedule.requests,
        schedule.starts,
        schedule.lengths,
        schedule.is_final,
    )
    return [array.copy() for array in arrays]


def bytes_per_row(schedule: Schedule) -> float:
    arrays = (
        schedule.prompt_lengths,
        schedule.num_computed_tokens,
        schedule.dispatch_offsets,
        schedule.requests,
        schedule.starts,
        schedule.lengths,
        schedule.is_final,
    )
    return sum(array.nbytes for array in arrays) / schedule.num_chunks


def check_same_plan(
    schedule: Schedule, dispatches: list[list[tuple[int, int, int, bool]]], name: str
) -> None:
    """Fail loudly if the planner and the oracle disagree: the timings would mean nothing."""
    sizes = np.fromiter((len(rows) for rows in dispatches), dtype=np.int64, count=len(dispatches))
    offsets = np.concatenate(([0], np.cumsum(sizes)))
    flat = itertools.chain.from_iterable(itertools.chain.from_iterable(dispatches))
    rows = np.fromiter(flat, dtype=np.int64, count=4 * int(offsets[-1])).reshape(-1, 4)
    planned = np.stack(
        (schedule.requests, schedule.starts, schedule.lengths, schedule.is_final), axis=1
    )
    if not (np.array_equal(offsets, schedule.dispatch_offsets) and np.array_equal(rows, planned)):
        raise SystemExit(f"{name}: plan_prefill and the oracle plan different dispatches")


def measure(case: Case, policy: Policy, oracle: OraclePlan, repeats: int) -> Result:
    config = make_config(case, policy)
    lengths = case.lengths
    schedule = plan_prefill(lengths, config)
    check_same_plan(schedule, oracle(lengths, config), f"{case.name}, {policy}")
    planner_seconds, oracle_seconds, floor_seconds = best_times(
        (
            lambda: plan_prefill(lengths, config),
            lambda: oracle(lengths, config),
            lambda: copy_rows(schedule),
        ),
        repeats,
    )
    targets = case.targets
    return Result(
        case=case.name,
        policy=policy,
        dispatches=schedule.num_dispatches,
        chunks=schedule.num_chunks,
        planner_seconds=planner_seconds,
        oracle_seconds=oracle_seconds,
        floor_seconds=floor_seconds,
        bytes_per_row=bytes_per_row(schedule),
        min_speedup=None if targets is None else targets.min_speedup[policy],
        max_over_floor=None if targets is None else targets.max_over_floor,
        max_bytes_per_row=None if targets is None else targets.max_bytes_per_row,
    )


def verdict(result: Result) -> str:
    misses = []
    if result.min_speedup is not None and result.speedup < result.min_speedup:
        misses.append(f"x oracle < {result.min_speedup:g}")
    if result.max_over_floor is not None and result.over_floor > result.max_over_floor:
        misses.append(f"x floor > {result.max_over_floor:g}")
    if result.max_bytes_per_row is not None and result.bytes_per_row > result.max_bytes_per_row:
        misses.append(f"> {result.max_bytes_per_row:g} B/row")
    return "MISSED: " + ", ".join(misses) if misses else "ok"


def format_table(results: Sequence[Result]) -> str:
    header = (
        "case",
        "policy",
        "dispatches",
        "chunks",
        "planner ms",
        "floor ms",
        "x floor",
        "target",
        "oracle ms",
        "x oracle",
        "target",
        "B/row",
        "",
    )
    rows = [header]
    for result in results:
        speed_target = "-" if result.min_speedup is None else f">= {result.min_speedup:g}"
        floor_target = "-" if result.max_over_floor is None else f"<= {result.max_over_floor:g}"
        rows.append(
            (
                result.case,
                result.policy,
                f"{result.dispatches:,}",
                f"{result.chunks:,}",
                f"{result.planner_seconds * 1e3:.2f}",
                f"{result.floor_seconds * 1e3:.2f}",
                f"{result.over_floor:.1f}",
                floor_target,
                f"{result.oracle_seconds * 1e3:.2f}",
                f"{result.speedup:.1f}",
                speed_target,
                f"{result.bytes_per_row:.1f}",
                verdict(result),
            )
        )
    widths = [max(len(row[column]) for row in rows) for column in range(len(header))]
    # Text columns align left, numbers right.
    lines = [
        "  ".join(
            cell.ljust(width) if column < 2 or column == len(header) - 1 else cell.rjust(width)
            for column, (cell, width) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in rows
    ]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument(
        "--quick", action="store_true", help="skip the 100,000-prompt case (a smoke test)"
    )
    parser.add_argument(
        "--repeats", type=int, default=3, help="timings of each planner; the best counts"
    )
    parser.add_argument("--no-check", action="store_true", help="report without the targets")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats must be >= 1: {args.repeats}")
    oracle = load_oracle()
    results = [
        measure(case, policy, oracle, args.repeats)
        for case in make_cases(quick=args.quick)
        for policy in POLICIES
    ]
    print(
        f"max_num_batched_tokens {BUDGET}, long_prefill_token_threshold {THRESHOLD} "
        f"(and max_num_seqs {SEED_BATCH_SIZE} for the seed case under packed); "
        f"CPU ms per plan, best of {args.repeats}\n"
    )
    print(format_table(results))
    load = ", ".join(f"{value:.2f}" for value in os.getloadavg())
    print(f"\nload average (1, 5, 15 min): {load} on {os.cpu_count()} CPUs")
    missed = [result for result in results if verdict(result) != "ok"]
    if missed and not args.no_check:
        return 1
    print("targets met" if not missed else "targets not checked (--no-check)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
