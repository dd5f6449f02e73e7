"""A generation's cost per dispatch from 10,000 to 1,000,000 requests, and a million end to end.

    python benchmarks/bench_scale.py             # step cost at 10**4, 10**5, 10**6 (minutes)
    python benchmarks/bench_scale.py --quick     # 10**4 and 10**5 only
    python benchmarks/bench_scale.py --end-to-end  # also 10**6 one-token prompts, packed

What is measured is ``pypto_sched.generate`` itself -- the planner and the driver -- on a
backend that computes nothing (it returns token 0 for every final row), so that the figures
are the library's and not a model's. The prompts are one token each, ``max_new_tokens`` 4,
pages of 16 tokens, the default pool (sized from a step's rows, not from the batch).

*Step cost* (``max_num_batched_tokens`` 64, so that even 10**4 requests take over 350
dispatches): for each policy and each number of requests, the median wall time between
consecutive dispatches over dispatches 50 to 350 (the run is then stopped), and its ratio to
the smallest size's, measured side by side in one run. A step's cost must not grow with the
requests waiting: the ratio stays near 1 (``_targets.MAX_GROWTH``; only reported, a loaded
machine moves medians). Setup (checking the prompts, building the first planner state) is
reported apart: it is linear in the batch, once.

*End to end* (``--end-to-end``): 10**6 one-token prompts generated to the end under
``packed`` (``max_num_batched_tokens`` 8,192) in a fresh process; its wall time and its
peak resident memory above the interpreter's with NumPy loaded (the planner's and the
driver's memory: prompts, tokens, results, states), against the issue's 254 s and 1.5 GiB.

On a shared machine a median moves with the load: every size is measured ``--rounds``
times (2 by default), the sizes interleaved, and the lowest median is kept.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import statistics
import subprocess
import sys
import time
from typing import Any, ClassVar

import numpy as np
from _targets import MAX_GROWTH

from pypto_sched import DispatchDone, DispatchInput, DispatchOutput, PlannerConfig, generate

NEW_TOKENS = 4
STEP_BUDGET = 64  # the step-cost sweep's
BUDGET = 8192  # the end-to-end run's
FIRST, LAST = 50, 350  # the dispatches timed


class NullBackend:
    """A backend that computes nothing: greedy token 0 for every final row."""

    name: ClassVar[str] = "null"
    tolerance = 0.0
    vocab_size = 64
    hidden_size = 8

    def new_cache(self, *, num_pages: int, page_size: int) -> Any:
        return object()

    def embed(self, token_ids: Any) -> Any:
        return np.zeros((len(token_ids), self.hidden_size))

    def run_dispatch(self, batch: DispatchInput, cache: Any) -> DispatchOutput:
        rows = batch.num_final_rows
        if batch.return_greedy:
            return DispatchOutput(greedy_token_ids=np.zeros(rows, dtype=np.int64))
        if batch.return_logits:
            return DispatchOutput(logits=np.zeros((rows, self.vocab_size)))
        return DispatchOutput()


class _Enough(Exception):
    """Raised from ``on_dispatch`` once the dispatches to time have run."""


def step_cost(num_requests: int, policy: str) -> tuple[float, float]:
    """Seconds of setup and the median seconds per dispatch (dispatches FIRST to LAST)."""
    config = PlannerConfig(max_num_batched_tokens=STEP_BUDGET, policy=policy)  # type: ignore[arg-type]
    prompts = np.ones((num_requests, 1), dtype=np.int64)
    stamps: list[float] = []

    def on_dispatch(done: DispatchDone) -> None:
        stamps.append(time.perf_counter())
        if done.index >= LAST:
            raise _Enough

    start = time.perf_counter()
    with contextlib.suppress(_Enough):
        generate(
            NullBackend(),
            prompts,
            config=config,
            max_new_tokens=NEW_TOKENS,
            on_dispatch=on_dispatch,
        )
    gaps = np.diff(stamps[FIRST:])
    return stamps[0] - start, float(statistics.median(gaps)) if gaps.size else float("nan")


def end_to_end(num_requests: int) -> None:
    """Run in a fresh process: generate ``num_requests`` one-token prompts under packed and
    print seconds and peak memory (MiB) above the baseline."""
    baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    config = PlannerConfig(max_num_batched_tokens=BUDGET, policy="packed")
    start = time.perf_counter()
    result = generate(
        NullBackend(),
        np.ones((num_requests, 1), dtype=np.int64),
        config=config,
        max_new_tokens=NEW_TOKENS,
    )
    seconds = time.perf_counter() - start
    usage = resource.getrusage(resource.RUSAGE_SELF)
    assert result.stats.num_generated_tokens == num_requests * NEW_TOKENS
    cpu = usage.ru_utime + usage.ru_stime
    print(f"{seconds:.1f} {(usage.ru_maxrss - baseline) / 1024:.0f} {result.stats.num_dispatches} "
          f"{cpu:.1f}")  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="10**4 and 10**5 only")
    parser.add_argument("--end-to-end", action="store_true", help="also 10**6 under packed")
    parser.add_argument("--rounds", type=int, default=2, help="measurements of each size")
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # the end-to-end child
    args = parser.parse_args()
    if args.one:
        end_to_end(args.one)
        return 0
    sizes = [10**4, 10**5] if args.quick else [10**4, 10**5, 10**6]
    print(f"load average {os.getloadavg()[0]:.1f}; {NEW_TOKENS} new tokens, budget {STEP_BUDGET}")
    print(f"{'policy':12} {'requests':>10} {'setup s':>8} {'ms/dispatch':>12} {'ratio':>6}")
    for policy in ("round_robin", "packed"):
        best: dict[int, tuple[float, float]] = {}
        for _ in range(args.rounds):
            for n in sizes:
                setup, cost = step_cost(n, policy)
                best[n] = min(best.get(n, (setup, cost)), (setup, cost), key=lambda c: c[1])
        first = best[sizes[0]][1]
        for n in sizes:
            setup, cost = best[n]
            print(f"{policy:12} {n:>10,} {setup:>8.1f} {cost * 1e3:>12.3f} {cost / first:>6.2f}")
    print(f"(a step's cost does not grow: the ratio stays within {MAX_GROWTH}x)")
    if args.end_to_end:
        n = 10**6
        out = subprocess.run(
            [sys.executable, __file__, "--one", str(n)], capture_output=True, text=True, check=True
        ).stdout.split()
        seconds, mib, dispatches, cpu = float(out[0]), float(out[1]), int(out[2]), float(out[3])
        print(
            f"end to end, packed, {n:,} one-token prompts: {seconds:.0f} s ({cpu:.0f} s of CPU), "
            f"{dispatches:,} dispatches, peak memory {mib:,.0f} MiB above the interpreter's (the "
            "issue: 254 s, 1.5 GiB)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
