"""The online planner against the oracle on every tiny input.

Random draws rarely hit coincidences of small numbers (a count equal to an id, a chunk equal
to a page); these tests try them all: every config of ``tiny_configs`` against every batch of
up to 3 prompts of up to 5 tokens, stepped with ``plan_step`` until the state drains, with no
page pool and with one that holds everything.
"""

from __future__ import annotations

import itertools

from optimum import optimum
from oracle import oracle_plan
from test_planner import tiny_configs

from pypto_sched import PagePool, PlannerConfig, PrefillState, plan_step

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


def test_stepping_matches_the_oracle_on_every_tiny_input() -> None:
    for config in tiny_configs():
        for lengths in BATCHES:
            assert drain(lengths, config, pool=None) == oracle_plan(lengths, config), (
                lengths,
                config,
            )


def test_stepping_with_a_pool_that_holds_everything_matches_the_oracle() -> None:
    for config in tiny_configs():
        page = config.page_size or 2
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
