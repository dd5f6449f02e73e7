"""pypto_sched as vLLM V1's scheduler against vLLM's own, side by side in one run.

    .venv-vllm/bin/python benchmarks/bench_vllm_scheduler.py [--quick] [--no-check]

Needs vLLM (``make test-vllm`` builds ``.venv-vllm``); no model runs: the schedulers are
stepped with fake model outputs (``tests/vllm_driver.py``). Two tables:

1. **Cost of ``schedule()``** with 10, 100, 1,000 and 10,000 requests in flight: prompts of
   64 to 2,048 tokens, 4 generated tokens each (a new request for every one that finishes:
   about two admissions a step, the planner's dearest case), then 128 each (mostly decodes);
   ``max_num_batched_tokens`` 2,048, threshold 512, ``max_num_seqs`` 256. The three
   schedulers (stock, ``packed``, ``round_robin``) are fed the same arrivals and stepped in
   turn, the one going first changing every step, so that all see the same load on the
   machine; the median of each side's ``schedule()`` wall time (``update_from_output()`` is
   not timed), and the ratio to stock. Target: at most 1.3x stock under ``packed`` at
   every size and output length (``round_robin`` is reported; see docs/vllm.md).
2. **Steps and time to first token** (in engine steps) on three workloads, stock against
   each policy: all engine steps to finish, and the mean and the largest step at which a
   request got its first token. Target: ``packed`` takes no more steps than stock.

Exits 1 if a target is missed (``--no-check``: report only). The ratios matter, not the
absolute times; the load average is printed with them.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from vllm_driver import Driver, Knobs, build, stock

from pypto_sched.integrations.vllm import PackedScheduler, RoundRobinScheduler

SIDES: dict[str, type[Any]] = {
    "stock": stock(),
    "packed": PackedScheduler,
    "round_robin": RoundRobinScheduler,
}
COST_KNOBS = Knobs(
    max_num_batched_tokens=2048,
    long_prefill_token_threshold=512,
    max_num_seqs=256,
    num_blocks=40_000,
)
TARGET_RATIO = 1.3
#: Tokens each request generates: 4 turns the requests over every few steps (about two
#: admissions a step, the planner's dearest case); 128 is nearer serving, mostly decodes.
OUTPUT_TOKENS = (4, 128)


class Cost(NamedTuple):
    in_flight: int
    median_us: dict[str, float]

    def ratio(self, side: str) -> float:
        return self.median_us[side] / self.median_us["stock"]


def measure_cost(in_flight: int, steps: int, seed: int, max_tokens: int) -> Cost:
    drivers = {side: Driver(build(cls, COST_KNOBS)) for side, cls in SIDES.items()}
    # Each side draws its own arrivals from the same seed: the n-th request a side gets is
    # the same on every side, whenever it comes.
    rngs = {side: random.Random(seed) for side in SIDES}
    arrivals = dict.fromkeys(SIDES, 0)

    def arrive(side: str) -> None:
        n = arrivals[side] = arrivals[side] + 1
        length = rngs[side].randint(64, 2048)
        drivers[side].add(str(n), length, max_tokens=max_tokens, fill=n)

    for _ in range(in_flight):
        for side in SIDES:
            arrive(side)
    samples: dict[str, list[int]] = {side: [] for side in SIDES}
    done = dict.fromkeys(SIDES, 0)
    order = list(SIDES)
    warmup = 20
    for step in range(warmup + steps):
        order = order[1:] + order[:1]  # a different side goes first every step
        for side in order:
            driver = drivers[side]
            before = len(driver.finished)
            driver.step()
            if step >= warmup:
                samples[side].append(driver.last_schedule_ns)
            done[side] = len(driver.finished) - before
        # Each side keeps `in_flight` requests: a new one for every one that finished (the
        # sides finish at different rates; the arrivals are topped up per side).
        for side in SIDES:
            for _ in range(done[side]):
                arrive(side)
    return Cost(in_flight, {side: statistics.median(s) / 1000 for side, s in samples.items()})


class Workload(NamedTuple):
    name: str
    knobs: Knobs
    #: (arrival step, prompt length, tokens to generate)
    requests: list[tuple[int, int, int]]


def workloads(quick: bool) -> list[Workload]:
    rng = random.Random(7)
    count = 40 if quick else 120
    mixed = [
        (rng.randint(0, count // 2), rng.choice([40, 300, 1500, 4000]), 16) for _ in range(count)
    ]
    return [
        Workload(
            "seed: 16 x 3,338, threshold 256",
            Knobs(max_num_batched_tokens=8192, long_prefill_token_threshold=256, num_blocks=8192),
            [(0, 3338, 8)] * 16,
        ),
        Workload(
            "long tail at once, threshold 512",
            Knobs(max_num_batched_tokens=2048, long_prefill_token_threshold=512, num_blocks=8192),
            [(0, int(64 * 1.6**k) % 6000 + 20, 8) for k in range(24)],
        ),
        Workload(
            "arrivals, small KV cache (preempts)",
            Knobs(
                max_num_batched_tokens=1024,
                long_prefill_token_threshold=256,
                max_num_seqs=32,
                num_blocks=1200,
            ),
            mixed,
        ),
    ]


class Run(NamedTuple):
    steps: int
    mean_ttft: float
    max_ttft: int


def run_workload(workload: Workload, cls: type[Any]) -> Run:
    driver = Driver(build(cls, workload.knobs))
    pending = sorted(
        (
            (arrival, index, length, max_tokens)
            for index, (arrival, length, max_tokens) in enumerate(workload.requests)
        ),
    )
    arrived: dict[str, int] = {}
    step = 0
    while pending or driver.scheduler.has_requests():
        while pending and pending[0][0] <= step:
            _, index, length, max_tokens = pending.pop(0)
            driver.add(str(index), length, max_tokens=max_tokens, fill=index)
            arrived[str(index)] = step
        driver.step()
        step += 1
        if step > 100_000:
            raise SystemExit(f"{workload.name}: {cls.__name__} is stuck")
    ttft = [driver.first_token[r] - arrived[r] + 1 for r in arrived]
    steps = sum(1 for scheduled in driver.steps if scheduled)
    return Run(steps, statistics.mean(ttft), max(ttft))


def format_table(rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for n, row in enumerate(rows):
        cells = [row[0].ljust(widths[0])] + [
            c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True)
        ]
        lines.append("  ".join(cells))
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps and requests")
    parser.add_argument("--no-check", action="store_true", help="report only")
    args = parser.parse_args(argv)
    misses: list[str] = []

    steps = 40 if args.quick else 300
    head = ["tokens out", "in flight", "stock us", "packed us", "ratio", "round_robin us", "ratio"]
    rows = [head]
    for max_tokens in OUTPUT_TOKENS:
        for in_flight in (10, 100, 1000, 10_000):
            cost = measure_cost(in_flight, steps, seed=in_flight, max_tokens=max_tokens)
            us = cost.median_us
            rows.append(
                [
                    str(max_tokens),
                    f"{in_flight:,}",
                    f"{us['stock']:.0f}",
                    f"{us['packed']:.0f}",
                    f"{cost.ratio('packed'):.2f}x",
                    f"{us['round_robin']:.0f}",
                    f"{cost.ratio('round_robin'):.2f}x",
                ]
            )
            if cost.ratio("packed") > TARGET_RATIO:
                misses.append(
                    f"packed at {in_flight:,} in flight, {max_tokens} tokens out: "
                    f"{cost.ratio('packed'):.2f}x stock"
                )
    print(f"schedule() median per step (load average {os.getloadavg()[0]:.1f})")
    print(format_table(rows))
    print()

    rows = [["workload", "side", "steps", "mean TTFT", "max TTFT"]]
    for workload in workloads(args.quick):
        runs = {side: run_workload(workload, cls) for side, cls in SIDES.items()}
        for side, run in runs.items():
            rows.append(
                [
                    workload.name if side == "stock" else "",
                    side,
                    str(run.steps),
                    f"{run.mean_ttft:.1f}",
                    str(run.max_ttft),
                ]
            )
        if runs["packed"].steps > runs["stock"].steps:
            misses.append(
                f"{workload.name}: packed {runs['packed'].steps} steps, stock {runs['stock'].steps}"
            )
    print("Engine steps and time to first token (in steps, from arrival)")
    print(format_table(rows))
    for miss in misses:
        print(f"MISSED: {miss}")
    return 1 if misses and not args.no_check else 0


if __name__ == "__main__":
    sys.exit(main())
