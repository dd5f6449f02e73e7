"""Time one ``plan_step`` against a simple pure-Python step, for 10 to 10,000 requests in flight.

    python benchmarks/bench_online.py            # 2,000 steps per case
    python benchmarks/bench_online.py --quick    # 200 steps per case (a smoke test)

Each case keeps ``N`` requests in flight: prompts of 64 to 4,096 tokens, and a new request
arrives for every one that finishes. ``plan_step`` and the simple step run in lockstep on
the same arrivals; the script checks that they plan the same rows at every step, and times
every call. The simple step keeps every request in one tuple and rebuilds it each step, as
the obvious immutable implementation would, so its cost grows with ``N``.

It prints the median microseconds per step of each (medians resist a busy machine better
than means) and their ratio. The target: at 1,000 requests in flight a step costs at most a
few tens of microseconds, and the cost does not grow linearly with ``N``.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Sequence
from typing import NamedTuple

from pypto_sched import POLICIES, PlannerConfig, Policy, PrefillState, plan_step

IN_FLIGHT = (10, 100, 1_000, 10_000)
SHORTEST, LONGEST = 64, 4_096
TARGET_IN_FLIGHT = 1_000


def make_config(policy: Policy) -> PlannerConfig:
    return PlannerConfig(
        max_num_batched_tokens=2_048,
        long_prefill_token_threshold=512,
        max_num_seqs=64 if policy == "packed" else None,
        page_size=16,
        policy=policy,
    )


# -- the simple step ------------------------------------------------------------------------

# Rows as plain tuples: request -> (start, length, is_final).
Rows = dict[int, tuple[int, int, bool]]


class SimpleRequest(NamedTuple):
    id: int
    prompt_length: int
    position: int
    started: bool


class SimpleState(NamedTuple):
    """Every request in planning order (arrival order; queue order for round_robin)."""

    requests: tuple[SimpleRequest, ...] = ()
    splitting: bool = False  # round_robin: a run that had to split is in progress

    def add(self, request_id: int, length: int) -> SimpleState:
        return self._replace(requests=(*self.requests, SimpleRequest(request_id, length, 0, False)))


def simple_chunk(request: SimpleRequest, limit: int, page: int) -> int:
    remaining = request.prompt_length - request.position
    if remaining <= limit:
        return remaining
    return max((request.position + limit) // page * page - request.position, 0)


def simple_step(state: SimpleState, config: PlannerConfig) -> tuple[Rows, SimpleState]:
    if config.policy == "round_robin":
        return simple_round_robin(state, config)
    return simple_packed(state, config)


def simple_round_robin(state: SimpleState, config: PlannerConfig) -> tuple[Rows, SimpleState]:
    requests = state.requests
    if not requests:
        return {}, state
    budget = config.effective_budget
    if not state.splitting and sum(r.prompt_length - r.position for r in requests) <= budget:
        rows = {r.id: (r.position, r.prompt_length - r.position, True) for r in requests}
        return rows, SimpleState()
    head, rest = requests[0], requests[1:]
    size = simple_chunk(head, budget, config.page_size or 1)
    end = head.position + size
    rows = {head.id: (head.position, size, end == head.prompt_length)}
    if end < head.prompt_length:
        rest = (*rest, head._replace(position=end, started=True))
    return rows, SimpleState(rest, splitting=bool(rest))


def simple_packed(state: SimpleState, config: PlannerConfig) -> tuple[Rows, SimpleState]:
    requests = state.requests
    cap, page = config.chunk_cap, config.page_size or 1
    left = config.max_num_batched_tokens
    rows_left = config.max_num_seqs or len(requests)
    max_partial = config.max_num_partial_prefills or len(requests)
    rows: Rows = {}
    after: dict[int, SimpleRequest | None] = {}  # changed requests; None: finished
    partial = 0
    for request in requests:  # started requests first, in arrival order
        if not request.started:
            continue
        size = simple_chunk(request, min(cap, left), page) if rows_left else 0
        if size:
            end = request.position + size
            rows[request.id] = (request.position, size, end == request.prompt_length)
            left, rows_left = left - size, rows_left - 1
            if end == request.prompt_length:
                after[request.id] = None
                continue
            after[request.id] = request._replace(position=end)
        partial += 1
    for request in requests:  # then new requests, in arrival order
        if request.started:
            continue
        if not (left and rows_left):
            break
        size = simple_chunk(request, min(cap, left), page)
        final = request.position + size == request.prompt_length
        if size == 0 or (not final and partial >= max_partial):
            break
        rows[request.id] = (request.position, size, final)
        left, rows_left = left - size, rows_left - 1
        after[request.id] = (
            None if final else request._replace(position=request.position + size, started=True)
        )
        partial += not final
    kept = []
    for request in requests:
        if request.id not in after:
            kept.append(request)
        elif (changed := after[request.id]) is not None:
            kept.append(changed)
    return rows, SimpleState(tuple(kept))


# -- measuring ------------------------------------------------------------------------------


class Result(NamedTuple):
    policy: Policy
    in_flight: int
    rows_per_step: float
    planner_us: float
    simple_us: float

    @property
    def ratio(self) -> float:
        return self.simple_us / self.planner_us


def measure(policy: Policy, in_flight: int, steps: int) -> Result:
    config = make_config(policy)
    rng = random.Random(in_flight)
    state: PrefillState[int] = PrefillState()
    simple = SimpleState()
    for request_id in range(in_flight):
        length = rng.randint(SHORTEST, LONGEST)
        state, simple = state.add(request_id, length), simple.add(request_id, length)
    next_id = in_flight
    planner_ns: list[int] = []
    simple_ns: list[int] = []
    rows = 0
    for _ in range(steps):
        start = time.perf_counter_ns()
        plan = plan_step(state, config)
        middle = time.perf_counter_ns()
        simple_rows, simple = simple_step(simple, config)
        planner_ns.append(middle - start)
        simple_ns.append(time.perf_counter_ns() - middle)
        planned = {r: (c.start, c.length, c.is_final) for r, c in plan.rows.items()}
        if list(planned.items()) != list(simple_rows.items()):
            raise SystemExit(f"{policy}, {in_flight} in flight: the two steps differ")
        rows += len(planned)
        state = plan.state
        for _ in plan.finished:  # keep the number in flight
            length = rng.randint(SHORTEST, LONGEST)
            state, simple = state.add(next_id, length), simple.add(next_id, length)
            next_id += 1
    return Result(
        policy=policy,
        in_flight=in_flight,
        rows_per_step=rows / steps,
        planner_us=statistics.median(planner_ns) / 1e3,
        simple_us=statistics.median(simple_ns) / 1e3,
    )


def format_table(results: Sequence[Result]) -> str:
    header = ("policy", "in flight", "rows/step", "plan_step us", "simple us", "simple/plan_step")
    table = [header]
    for result in results:
        table.append(
            (
                result.policy,
                f"{result.in_flight:,}",
                f"{result.rows_per_step:.1f}",
                f"{result.planner_us:.1f}",
                f"{result.simple_us:.1f}",
                f"{result.ratio:.1f}x",
            )
        )
    widths = [max(len(row[column]) for row in table) for column in range(len(header))]
    lines = [
        "  ".join(
            cell.ljust(width) if column == 0 else cell.rjust(width)
            for column, (cell, width) in enumerate(zip(row, widths, strict=True))
        )
        for row in table
    ]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="200 steps per case, not 2,000")
    args = parser.parse_args(argv)
    steps = 200 if args.quick else 2_000
    results = [measure(policy, n, steps) for policy in POLICIES for n in IN_FLIGHT]
    print(format_table(results))
    for policy in POLICIES:
        at_target = next(
            r for r in results if r.policy == policy and r.in_flight == TARGET_IN_FLIGHT
        )
        print(
            f"{policy}: {at_target.planner_us:.1f} us per step at {TARGET_IN_FLIGHT:,} in flight "
            "(target: a few tens of us, not growing linearly with the requests in flight)"
        )


if __name__ == "__main__":
    main()
