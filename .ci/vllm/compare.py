"""Compare vLLM's scheduler tests run stock and with pypto_sched's scheduler.

    python compare.py STOCK.xml packed=PACKED.xml round_robin=ROUND_ROBIN.xml

Each file is a JUnit report of the same test files (pytest ``--junitxml``). The run passes
when no test that passes stock fails with pypto_sched's scheduler, except the tests of
:data:`EXCEPTIONS`: tests that assert vLLM's own packing decisions, or a vLLM feature that
pypto_sched refuses at construction. ``docs/vllm.md`` names each of them with the same
reason (``tests/test_integration_vllm.py`` checks that the two lists agree). An exception
that passes after all is reported, so the list stays short.

Exits 0 when the run passes, 1 otherwise; prints each side's counts and every difference.
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

#: Why a test may fail under a policy while it passes stock: test id -> (policies, reason).
#: The reasons are quoted in docs/vllm.md, "Where vLLM's tests and pypto_sched differ".
ONE_REQUEST_A_STEP = (
    "round_robin runs one request's prefill per step once a step cannot hold every "
    "request whole (the seed's rule); the test expects several requests to start or run "
    "prefill in one step"
)
THRESHOLD_AS_BUDGET = (
    "round_robin makes the threshold the step's prefill budget and keeps it for a lone "
    "request (the seed's rule); the test expects vLLM's threshold rules"
)
PREFIX_HITS_AFTER_PLANNING = (
    "the planner sizes a step before vLLM's prefix cache is asked (vLLM asks it only about "
    "the requests the plan starts), so prefix hits leave part of the step's budget unused "
    "instead of starting more requests; the test expects every request with a hit to start "
    "in one step"
)
BOTH = ("packed", "round_robin")
RR = ("round_robin",)
EXCEPTIONS: dict[str, tuple[tuple[str, ...], str]] = {
    "test_async_scheduler::test_prefix_caching_for_multi_turn": (BOTH, PREFIX_HITS_AFTER_PLANNING),
    "test_priority_preemption_bug::test_priority_scheduler_preempt_skipped_request": (
        RR,
        ONE_REQUEST_A_STEP,
    ),
    "test_scheduler::test_fcfs_mixed_blocked_types_remote_load_drains_first": (
        RR,
        ONE_REQUEST_A_STEP,
    ),
    "test_scheduler::test_priority_scheduling_with_limited_slots": (RR, ONE_REQUEST_A_STEP),
    "test_scheduler::test_schedule_concurrent_partial_requests[False]": (RR, ONE_REQUEST_A_STEP),
    "test_scheduler::test_schedule_concurrent_partial_requests[True]": (RR, ONE_REQUEST_A_STEP),
    "test_scheduler::test_schedule_order[True]": (RR, ONE_REQUEST_A_STEP),
    "test_scheduler::test_scheduler_stats_waiting_queues": (RR, ONE_REQUEST_A_STEP),
    "test_scheduler::test_spec_decode_padding_skipped_with_prefill_in_batch": (
        RR,
        ONE_REQUEST_A_STEP,
    ),
    "test_scheduler::test_long_prefill_threshold_applies_with_other_requests": (
        RR,
        THRESHOLD_AS_BUDGET,
    ),
    "test_scheduler::test_long_prefill_threshold_floored_by_fair_share": (
        RR,
        THRESHOLD_AS_BUDGET,
    ),
    "test_scheduler::test_long_prefill_threshold_ignored_when_alone": (RR, THRESHOLD_AS_BUDGET),
}


def outcomes(path: Path) -> dict[str, str]:
    """Each test's outcome in a JUnit report: passed, failed, error or skipped."""
    results: dict[str, str] = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        test_id = f"{case.get('classname')}::{case.get('name')}"
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = {"failure": "failed"}.get(child.tag, child.tag)
        results[test_id] = outcome
    return results


def short(test_id: str) -> str:
    """``tests.v1.core.test_scheduler::test_x[param]`` as ``test_scheduler::test_x[param]``."""
    module, _, name = test_id.partition("::")
    return f"{module.rsplit('.', 1)[-1]}::{name}"


def compare(stock: dict[str, str], policy: str, ours: dict[str, str]) -> list[str]:
    """The regressions of ``ours`` against ``stock`` (printing the differences)."""
    regressions: list[str] = []
    for test_id, outcome in sorted(stock.items()):
        name = short(test_id)
        mine = ours.get(test_id, "missing")
        allowed = EXCEPTIONS.get(name)
        excused = allowed is not None and policy in allowed[0]
        if outcome == "passed" and mine != "passed":
            if excused:
                print(f"  {policy}: {name}: {mine} (named exception)")
            else:
                print(f"  {policy}: {name}: {mine} -- REGRESSION (passes stock)")
                regressions.append(name)
        elif excused and mine == "passed":
            print(f"  {policy}: {name}: passes (its named exception is not needed)")
        elif outcome != "passed" and mine == "passed":
            print(f"  {policy}: {name}: passes ({outcome} stock)")
    return regressions


def main(argv: list[str]) -> int:
    stock = outcomes(Path(argv[0]))
    print(f"stock: {dict(Counter(stock.values()))}")
    regressions: list[str] = []
    for spec in argv[1:]:
        policy, _, path = spec.partition("=")
        ours = outcomes(Path(path))
        print(f"{policy}: {dict(Counter(ours.values()))}")
        regressions += compare(stock, policy, ours)
    if not stock or len(argv) < 2:
        print("no results to compare")
        return 1
    if regressions:
        print(f"{len(regressions)} tests pass stock and fail with pypto_sched's scheduler")
        return 1
    print("pypto_sched's scheduler fails no test that stock vLLM passes, but the named ones")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
