"""``Schedule.lower_bound`` against the true optimum, found by exhaustive search.

The search (``tests/optimum.py``) shares no code with the library. On prompts small enough
to search, the bound must never exceed the optimum, and every plan must take at least it.
Where the bound is reached, and how often ``packed`` reaches it, is measured by
``benchmarks/bench_bound.py``.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from optimum import optimum
from oracle import oracle_plan
from test_planner import rows_of

from pypto_sched import POLICIES, PlannerConfig, Policy, PrefillState, plan_prefill, plan_step
from pypto_sched.core._policies import surely_keeps_to_the_bound
from pypto_sched.core._schedule import lower_bound


def packed(budget: int, threshold: int, **limits: int) -> PlannerConfig:
    return PlannerConfig(
        max_num_batched_tokens=budget,
        long_prefill_token_threshold=threshold,
        policy="packed",
        **limits,
    )


@st.composite
def small_cases(
    draw: st.DrawFn, *, limits: bool = True, policies: tuple[Policy, ...] = POLICIES
) -> tuple[list[int], PlannerConfig]:
    """A few short prompts and a small config: small enough to search exhaustively."""
    lengths = draw(st.lists(st.integers(1, 10), min_size=1, max_size=3))
    budget = draw(st.integers(1, 8))
    threshold = draw(st.none() | st.integers(1, budget))
    cap = min(budget, threshold or budget)
    policy = draw(st.sampled_from(policies))
    config = PlannerConfig(
        max_num_batched_tokens=budget,
        long_prefill_token_threshold=threshold,
        chunk_alignment=draw(st.none() | st.integers(1, cap)) if limits else None,
        max_num_seqs=draw(st.none() | st.integers(1, 3)) if limits else None,
        policy=policy,
        max_num_partial_prefills=(
            draw(st.none() | st.integers(1, 2)) if limits and policy == "packed" else None
        ),
    )
    return lengths, config


@settings(max_examples=150, deadline=None)
@given(small_cases())
@example(  # the work-conserving tail: alone, the longest runs 9 a dispatch
    ([4, 11, 12], PlannerConfig(max_num_batched_tokens=9, long_prefill_token_threshold=4))
)
def test_the_lower_bound_never_exceeds_the_optimum_and_no_plan_beats_the_optimum(
    case: tuple[list[int], PlannerConfig],
) -> None:
    lengths, config = case
    best = optimum(lengths, config)
    schedule = plan_prefill(lengths, config)
    assert schedule.lower_bound <= best <= schedule.num_dispatches
    if config.policy == "packed":  # it starts the requests in arrival order
        assert best <= optimum(lengths, config, in_order=True) <= schedule.num_dispatches


@settings(max_examples=100, deadline=None)
@given(small_cases(limits=False, policies=("packed",)))
def test_without_pages_or_row_limits_the_packed_bound_is_reached_by_some_schedule(
    case: tuple[list[int], PlannerConfig],
) -> None:
    # Every request may then run any amount up to its cap in any dispatch, so on up to 3
    # prompts a schedule that spreads the longest requests evenly reaches the bound: the
    # slack of a plan over it is the policy's, not the bound's. (Not from 5 prompts on:
    # [1, 2, 2, 2, 5], budget 6, threshold 2 has bound 2 and optimum 3.)
    lengths, config = case
    assert optimum(lengths, config) == plan_prefill(lengths, config).lower_bound


@settings(max_examples=150, deadline=None)
@given(small_cases(limits=False, policies=("packed",)))
@example(([8, 10], PlannerConfig(max_num_batched_tokens=9, long_prefill_token_threshold=6)))
def test_without_limits_packed_takes_the_fewest_dispatches_of_any_in_order_schedule(
    case: tuple[list[int], PlannerConfig],
) -> None:
    # Keeping to the bound: where an in-order schedule reaches the bound, packed does; and
    # where none does, packed still takes the fewest of those schedules.
    lengths, config = case
    config = PlannerConfig(
        max_num_batched_tokens=config.max_num_batched_tokens,
        long_prefill_token_threshold=config.long_prefill_token_threshold,
        policy="packed",
    )
    assert plan_prefill(lengths, config).num_dispatches == optimum(lengths, config, in_order=True)


@settings(max_examples=300, deadline=None)
@given(small_cases(policies=("packed",)))
def test_packed_never_takes_more_dispatches_than_the_greedy_fill(
    case: tuple[list[int], PlannerConfig],
) -> None:
    # The greedy fill is vLLM V1's schedule; keeping to the bound only ever saves dispatches.
    lengths, config = case
    assert plan_prefill(lengths, config).num_dispatches <= len(
        oracle_plan(lengths, config, greedy=True)
    )


@pytest.mark.parametrize(
    ("lengths", "computed", "config"),
    [
        # Found by an adversarial search: with a limit the bound does not count (rows against
        # requests, pages, the partial limit), correcting by the bound took one more dispatch
        # than the greedy fill. Where a limit can bind, the greedy fill stands.
        ([35, 35, 51, 26], None, packed(6, 2, max_num_seqs=3)),
        ([8, 40, 74], None, packed(11, 5, chunk_alignment=2)),
        ([10, 25, 78, 2, 55], [0, 9, 0, 0, 0], packed(9, 4, max_num_partial_prefills=2)),
        ([51, 50, 57, 78, 69], [0, 5, 9, 0, 17], packed(12, 4, chunk_alignment=4)),
        ([11, 4], None, packed(5, 3, max_num_seqs=1, chunk_alignment=3)),
    ],
)
def test_packed_takes_no_more_dispatches_than_the_greedy_fill_where_limits_bind(
    lengths: list[int], computed: list[int] | None, config: PlannerConfig
) -> None:
    schedule = plan_prefill(lengths, config, num_computed_tokens=computed)
    assert schedule.num_dispatches <= len(oracle_plan(lengths, config, computed, greedy=True))
    assert rows_of(schedule) == oracle_plan(lengths, config, computed)


@settings(max_examples=300, deadline=None)
@given(
    small_cases(policies=("packed",)),
    st.lists(st.integers(0, 9), min_size=3, max_size=3),
)
@example(  # a row of 3 holds less than a request alone runs: the bound can drop below d
    ([9, 4], packed(5, 3, max_num_seqs=1)), [1, 0, 0]
)
def test_the_quick_test_is_sure_only_of_greedy_dispatches_that_keep_to_the_bound(
    case: tuple[list[int], PlannerConfig], cached: list[int]
) -> None:
    # surely_keeps_to_the_bound spares a dispatch the bound check: it must never be sure of
    # a greedy dispatch that leaves more than the bound less one.
    lengths, config = case
    computed = [min(c, n - 1) for c, n in zip(cached, lengths, strict=False)]
    (first, *_) = oracle_plan(lengths, config, computed, greedy=True)
    left = [n - c for n, c in zip(lengths, computed, strict=True)]
    after = list(left)
    for request, _, size, _ in first:
        after[request] -= size
    sure = surely_keeps_to_the_bound(
        sum(size for *_, size, _ in first), sum(left), max(left), len(left), config
    )
    before = lower_bound(np.array(left), config)
    if sure and any(after):
        assert lower_bound(np.array([n for n in after if n]), config) <= before - 1


@given(
    st.integers(min_value=1, max_value=60),
    st.integers(min_value=1, max_value=12),
    st.sampled_from(POLICIES),
)
def test_when_rows_bind_the_bound_counts_them_rounded_up(
    num_requests: int, max_num_seqs: int, policy: Policy
) -> None:
    """One-token prompts and a budget that holds them all: only the row limit binds, and the
    fewest dispatches are ``ceil(num_requests / max_num_seqs)``, which both policies take
    (round_robin with rows to spare runs the whole batch at once)."""
    config = PlannerConfig(max_num_batched_tokens=100, max_num_seqs=max_num_seqs, policy=policy)
    schedule = plan_prefill([1] * num_requests, config)
    assert schedule.lower_bound == -(-num_requests // max_num_seqs)
    if policy == "packed":
        assert schedule.num_dispatches == schedule.lower_bound


def _stepped(lengths: list[int], config: PlannerConfig) -> list[list[tuple[int, int, int, bool]]]:
    """The dispatches of stepping ``PrefillState`` until it drains."""
    state = PrefillState.from_prompt_lengths(lengths)
    dispatches = []
    while state:
        plan = plan_step(state, config)
        dispatches.append([(r, c.start, c.length, c.is_final) for r, c in plan.rows.items()])
        state = plan.state
    return dispatches


@pytest.mark.parametrize(
    ("lengths", "config", "expected"),
    [
        # A tie between two ways to keep to the bound takes the one that runs more of the
        # longest request now (the larger k).
        ([1, 2, 6, 1], PlannerConfig(max_num_batched_tokens=5, long_prefill_token_threshold=3,
                                     policy="packed"),
         [[(0, 0, 1, True), (1, 0, 1, False), (2, 0, 3, False)],
          [(1, 1, 1, True), (2, 3, 3, True), (3, 0, 1, True)]]),
        # The greedy fill takes 6; the bound, 5, is reached by looking at the longest request
        # left when each greedy dispatch finishes some (the most, not the least, of them).
        ([3, 3, 6, 3], PlannerConfig(max_num_batched_tokens=3, long_prefill_token_threshold=1,
                                     policy="packed"),
         [[(0, 0, 1, False), (1, 0, 1, False), (2, 0, 1, False)],
          [(0, 1, 1, False), (1, 1, 1, False), (3, 0, 1, False)],
          [(0, 2, 1, True), (2, 1, 1, False), (3, 1, 1, False)],
          [(1, 2, 1, True), (2, 2, 1, False), (3, 2, 1, True)],
          [(2, 3, 3, True)]]),
    ],
)  # fmt: skip
def test_packed_keeps_to_the_bound_as_the_semantics_say_offline_and_stepped(
    lengths: list[int], config: PlannerConfig, expected: list[list[tuple[int, int, int, bool]]]
) -> None:
    schedule = plan_prefill(lengths, config)
    assert rows_of(schedule) == expected
    assert schedule.num_dispatches == schedule.lower_bound
    assert _stepped(lengths, config) == expected


@pytest.mark.timeout(120)
def test_a_finished_request_is_never_planned_again() -> None:
    """Found by a mutant that put finished requests back with 0 tokens left: packed then
    looped forever here."""
    config = PlannerConfig(max_num_batched_tokens=25, long_prefill_token_threshold=4,
                           chunk_alignment=1, max_num_seqs=2, policy="packed")  # fmt: skip
    lengths = [19, 16, 4, 5, 15]
    schedule = plan_prefill(lengths, config)
    assert rows_of(schedule) == oracle_plan(lengths, config)
