"""How often ``packed`` meets ``Schedule.lower_bound``, and how often the bound can be met at all.

    python benchmarks/bench_bound.py            # 600 small instances per class, every workload
    python benchmarks/bench_bound.py --quick    # 100 small instances per class, fewer workloads

Two measurements, both of dispatch counts (no timing):

1. *Small instances*, where the true optimum is found by exhaustive search
   (``tests/optimum.py``, sharing no code with the library): 1 to 4 prompts of 1 to 12
   tokens, budgets of 1 to 10, in four classes of config -- no limits but the budget and the
   threshold; with ``chunk_alignment``; with ``max_num_seqs``; with everything. Per class: how often
   the bound is achievable (equals the optimum), how often ``packed`` meets it then, how often
   ``packed`` is optimal, its worst ratio to the optimum, and how often it is optimal among
   the schedules that start the requests in arrival order, as it does (the search with
   ``in_order``): where it is not, a chunk other than its greedy one would have saved a
   dispatch.
2. *Realistic workloads* (the CLI's synthetic workloads, 16 to 1,024 prompts of up to 8,192
   tokens, budget 8,192, thresholds 256 to off, with and without pages and row limits): how
   often ``packed`` meets the bound and its mean and worst ratio to it, with the prompts in
   arrival order and given longest first. ``packed`` admits in the order it is given, so a
   long prompt behind shorter ones starts late and finishes last; given longest first (an
   offline batch whose time to first token does not matter), the long ones start at once.

The script checks on every small instance that ``lower_bound <= optimum <= dispatches`` of
both policies and exits 1 if not.
"""

from __future__ import annotations

import argparse
import importlib
import itertools
import random
import statistics
import sys
from pathlib import Path
from typing import NamedTuple, Protocol, cast

import numpy as np

from pypto_sched import PlannerConfig, plan_prefill
from pypto_sched.core._workloads import WORKLOADS, synthetic_lengths

TESTS_DIR = Path(__file__).resolve().parent.parent / "tests"


class Optimum(Protocol):
    def __call__(
        self, lengths: list[int], config: PlannerConfig, *, in_order: bool = False
    ) -> int: ...


def load_optimum() -> Optimum:
    """``optimum`` from ``tests/optimum.py`` (the tests directory is not a package)."""
    if str(TESTS_DIR) not in sys.path:
        sys.path.insert(0, str(TESTS_DIR))
    return cast(Optimum, importlib.import_module("optimum").optimum)


class Tally(NamedTuple):
    instances: int
    achievable: int  # bound == optimum
    packed_at_bound: int  # ... and packed == bound
    packed_optimal: int
    worst_over_optimum: float
    packed_in_order_optimal: int


def small_config(rng: random.Random, *, pages: bool, rows: bool) -> PlannerConfig:
    budget = rng.randint(1, 10)
    threshold = rng.choice([None, *range(1, budget + 1)])
    cap = min(budget, threshold or budget)
    return PlannerConfig(
        max_num_batched_tokens=budget,
        long_prefill_token_threshold=threshold,
        chunk_alignment=rng.randint(1, cap) if pages else None,
        max_num_seqs=rng.randint(1, 3) if rows else None,
        policy="packed",
    )


def small_instances(optimum: Optimum, count: int, *, pages: bool, rows: bool) -> Tally:
    rng = random.Random(f"{pages}-{rows}")
    achievable = at_bound = optimal = in_order_optimal = 0
    worst = 1.0
    for _ in range(count):
        lengths = [rng.randint(1, 12) for _ in range(rng.randint(1, 4))]
        config = small_config(rng, pages=pages, rows=rows)
        best = optimum(lengths, config)
        packed = plan_prefill(lengths, config)
        seed = plan_prefill(lengths, PlannerConfig(**{**config.to_dict(), "policy": "round_robin"}))
        if not packed.lower_bound <= best <= min(packed.num_dispatches, seed.num_dispatches):
            sys.exit(f"the bound or the search is wrong for {lengths} under {config}")
        achievable += packed.lower_bound == best
        at_bound += packed.lower_bound == best == packed.num_dispatches
        optimal += packed.num_dispatches == best
        in_order_optimal += packed.num_dispatches == optimum(lengths, config, in_order=True)
        worst = max(worst, packed.num_dispatches / best)
    return Tally(count, achievable, at_bound, optimal, worst, in_order_optimal)


def realistic(quick: bool, *, longest_first: bool) -> list[tuple[str, float, float, float]]:
    """Per config class: share of workloads where packed meets the bound, mean and worst
    ratio to it; with ``longest_first``, the prompts given longest first."""
    sizes = (16, 256) if quick else (16, 64, 256, 1024)
    thresholds = (256, 2048, None) if quick else (256, 512, 2048, None)
    classes = {
        "budget and threshold": (None, None),
        "chunk_alignment 16": (16, None),
        "max_num_seqs 16": (None, 16),
        "both": (16, 16),
    }
    rows = []
    for name, (page, max_rows) in classes.items():
        ratios = []
        for workload, n, threshold, seed in itertools.product(
            WORKLOADS, sizes, thresholds, range(2 if quick else 3)
        ):
            lengths = synthetic_lengths(workload, num_requests=n, seed=seed, max_length=8192)
            if longest_first:
                lengths = np.sort(lengths)[::-1]
            config = PlannerConfig(
                max_num_batched_tokens=8192,
                long_prefill_token_threshold=threshold,
                chunk_alignment=page,
                max_num_seqs=max_rows,
                policy="packed",
            )
            schedule = plan_prefill(lengths, config)
            ratios.append(schedule.num_dispatches / schedule.lower_bound)
        met = sum(r == 1.0 for r in ratios) / len(ratios)
        rows.append((name, met, statistics.fmean(ratios), max(ratios)))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer instances and workloads")
    args = parser.parse_args()
    optimum = load_optimum()
    count = 100 if args.quick else 600
    print(f"small instances ({count} per class; optimum by exhaustive search)")
    print(
        f"{'class':<22}{'bound achievable':>18}{'packed meets it':>17}{'packed optimal':>16}"
        f"{'worst x optimum':>17}{'optimal in order':>18}"
    )
    for name, pages, rows in (
        ("budget and threshold", False, False),
        ("chunk_alignment", True, False),
        ("max_num_seqs", False, True),
        ("both", True, True),
    ):
        t = small_instances(optimum, count, pages=pages, rows=rows)
        met = t.packed_at_bound / t.achievable if t.achievable else 1.0
        print(
            f"{name:<22}{t.achievable / t.instances:>18.1%}{met:>17.1%}"
            f"{t.packed_optimal / t.instances:>16.1%}{t.worst_over_optimum:>17.2f}"
            f"{t.packed_in_order_optimal / t.instances:>18.1%}"
        )
    for longest_first in (False, True):
        print()
        order = "longest first" if longest_first else "in arrival order"
        print(f"realistic workloads, {order} (budget 8,192; every workload, size, threshold, seed)")
        print(f"{'class':<22}{'packed at bound':>17}{'mean x bound':>14}{'worst x bound':>15}")
        for name, met, mean, worst in realistic(args.quick, longest_first=longest_first):
            print(f"{name:<22}{met:>17.1%}{mean:>14.3f}{worst:>15.3f}")


if __name__ == "__main__":
    main()
