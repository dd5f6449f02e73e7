"""The online planner against the oracle on every tiny input.

Random draws rarely hit coincidences of small numbers (a count equal to an id, a chunk equal
to a page); these tests try them all: every config of ``tiny_configs`` against every batch of
up to 3 prompts of up to 5 tokens, stepped with ``plan_step`` until the state drains, with no
page pool and with one that holds everything.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from optimum import optimum
from oracle import oracle_plan
from test_planner import rows_of, tiny_configs

from pypto_sched import PagePool, PlannerConfig, PrefillState, plan_prefill, plan_step

# (The two tests below that walk every tiny input take about 45 s together.)
exhaustive = pytest.mark.exhaustive

BATCHES = [list(lengths) for n in (1, 2, 3) for lengths in itertools.product(range(1, 6), repeat=n)]


def drain(
    lengths: list[int], config: PlannerConfig, *, pool: PagePool[int] | None
) -> list[list[tuple[int, int, int, bool]]]:
    """The rows of every step until the state drains, in the oracle's format."""
    state = PrefillState.from_prompt_lengths(lengths)
    dispatches = []
    while state:
        plan = plan_step(state, config, pool=pool)
        assert plan.rows, "a step without reservations always runs a row"
        dispatches.append([(r, c.start, c.length, c.is_final) for r, c in plan.rows.items()])
        state, pool = plan.state, plan.pool
    return dispatches


@exhaustive
def test_stepping_matches_the_oracle_on_every_tiny_input() -> None:
    for config in tiny_configs():
        for lengths in BATCHES:
            assert drain(lengths, config, pool=None) == oracle_plan(lengths, config), (
                lengths,
                config,
            )


@exhaustive
def test_stepping_with_a_pool_that_holds_everything_matches_the_oracle() -> None:
    for config in tiny_configs():
        page = config.chunk_alignment or 2
        for lengths in BATCHES:
            pool: PagePool[int] = PagePool(
                num_pages=sum(-(-n // page) for n in lengths), page_size=page
            )
            assert drain(lengths, config, pool=pool) == oracle_plan(lengths, config), (
                lengths,
                config,
            )


def test_without_limits_packed_takes_the_in_order_optimum_on_every_tiny_input() -> None:
    # Every batch of up to 3 prompts of up to 5 tokens, every budget up to 6 and threshold.
    for budget in range(1, 7):
        for threshold in (None, *range(1, budget)):
            config = PlannerConfig(
                max_num_batched_tokens=budget,
                long_prefill_token_threshold=threshold,
                policy="packed",
            )
            for lengths in BATCHES:
                taken = len(drain(lengths, config, pool=None))
                greedy = len(oracle_plan(lengths, config, greedy=True))
                assert taken <= greedy, (lengths, config)
                best = optimum(lengths, config, in_order=True)
                assert taken == best, (lengths, config, taken, best)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(1, 3), min_size=3, max_size=14),
    st.lists(st.integers(4, 30), min_size=1, max_size=3),
    st.integers(1, 5),
    st.data(),
)
def test_keeping_to_the_bound_past_the_first_budget_of_waiting_requests_matches_the_oracle(
    short: list[int], long: list[int], budget: int, data: st.DataObject
) -> None:
    # More waiting requests than the budget has tokens, long ones among or behind them: the
    # planner reads only the first budget + 1 waiting ones and the queue's two longest; the
    # oracle reads them all.
    lengths = data.draw(st.permutations(short + long)) if data.draw(st.booleans()) else short + long
    config = PlannerConfig(
        max_num_batched_tokens=budget,
        long_prefill_token_threshold=data.draw(st.none() | st.integers(1, budget)),
        policy="packed",
    )
    want = oracle_plan(lengths, config)
    assert drain(lengths, config, pool=None) == want
    assert rows_of(plan_prefill(lengths, config)) == want


def test_removing_a_waiting_request_plans_as_if_it_had_never_come() -> None:
    # A removed request must not count among the queue's longest (the first two cases kept
    # the removed request's tokens in the bound when the queue kept dead entries' ranks).
    cases = [([5, 19, 10], 6, 4), ([2, 9, 22, 22, 19, 23, 25], 5, 2), ([1, 9, 2, 30, 3, 8], 4, 2)]
    for lengths, budget, threshold in cases:
        config = PlannerConfig(
            max_num_batched_tokens=budget, long_prefill_token_threshold=threshold, policy="packed"
        )
        for gone in range(len(lengths)):
            state = PrefillState.from_prompt_lengths(lengths).remove(gone)
            fresh: PrefillState[int] = PrefillState()
            for r, n in enumerate(lengths):
                if r != gone:
                    fresh = fresh.add(r, n)
            while fresh:
                plan, again = plan_step(state, config), plan_step(fresh, config)
                assert plan.rows == again.rows, (lengths, gone)
                state, fresh = plan.state, again.state
            assert not state
