"""``Schedule.lower_bound`` against the true optimum, found by exhaustive search.

The search (``tests/optimum.py``) shares no code with the library. On prompts small enough
to search, the bound must never exceed the optimum, and every plan must take at least it.
Where the bound is reached, and how often ``packed`` reaches it, is measured by
``benchmarks/bench_bound.py``.
"""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st
from optimum import optimum
from oracle import oracle_plan

from pypto_sched import POLICIES, PlannerConfig, Policy, plan_prefill


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
        page_size=draw(st.none() | st.integers(1, cap)) if limits else None,
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
    # Every request may then run any amount up to its cap in any dispatch, so a schedule
    # that spreads the longest requests evenly reaches the bound: it is exact there, and
    # the slack of a plan over it is the policy's, not the bound's.
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
