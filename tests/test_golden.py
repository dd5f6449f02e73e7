"""Golden schedules: the seed's cases, worked out by hand, and the edge cases around them."""

from __future__ import annotations

import pytest
from oracle import oracle_plan
from test_planner import rows_of

from pypto_sched import POLICIES, PlannerConfig, Policy, Schedule, plan_prefill

SEED_LENGTHS = [3338] * 16


# -- the seed ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def seed_round_robin() -> Schedule:
    config = PlannerConfig(max_num_batched_tokens=8192, long_prefill_token_threshold=256)
    return plan_prefill(SEED_LENGTHS, config)


def test_seed_round_robin_takes_224_dispatches_of_one_request_each(
    seed_round_robin: Schedule,
) -> None:
    assert seed_round_robin.num_dispatches == 224 == 16 * 14
    assert seed_round_robin.rows_per_dispatch.tolist() == [1] * 224


def test_seed_round_robin_runs_13_chunks_of_256_then_one_of_10_per_request(
    seed_round_robin: Schedule,
) -> None:
    for request in range(16):
        chunks = [row for (row,) in rows_of(seed_round_robin) if row[0] == request]
        assert [length for _, _, length, _ in chunks] == [256] * 13 + [10]
        assert [start for _, start, _, _ in chunks] == [256 * k for k in range(14)]
        assert [final for _, _, _, final in chunks] == [False] * 13 + [True]


def test_seed_round_robin_visits_requests_in_turn(seed_round_robin: Schedule) -> None:
    dispatches = rows_of(seed_round_robin)
    for k, (row,) in enumerate(dispatches):
        assert row[0] == k % 16
    # The first 13 rounds are full chunks; the last round holds every request's final chunk.
    assert all(not row[3] for (row,) in dispatches[:208])
    assert [row for (row,) in dispatches[208:]] == [(r, 3328, 10, True) for r in range(16)]


def test_seed_round_robin_42nd_dispatch_is_request_9_third_chunk_ending_at_768(
    seed_round_robin: Schedule,
) -> None:
    (chunk,) = seed_round_robin.dispatch(41).rows
    assert (chunk.request, chunk.start, chunk.length, chunk.is_final) == (9, 512, 256, False)
    assert chunk.end == 768


def test_seed_without_threshold_runs_each_prompt_whole_in_its_own_dispatch() -> None:
    # 53,408 tokens do not fit 8192, so the batched prefill that failed on the device is split.
    config = PlannerConfig.from_engine_args(
        max_num_batched_tokens=8192, long_prefill_token_threshold=0
    )
    assert rows_of(plan_prefill(SEED_LENGTHS, config)) == [[(r, 0, 3338, True)] for r in range(16)]


@pytest.mark.parametrize("policy", POLICIES)
def test_seed_batch_that_fits_the_budget_is_one_dispatch_of_every_request(
    policy: Policy,
) -> None:
    config = PlannerConfig(max_num_batched_tokens=16 * 3338, policy=policy)
    assert rows_of(plan_prefill(SEED_LENGTHS, config)) == [[(r, 0, 3338, True) for r in range(16)]]


def test_seed_packed_with_budget_8192_rows_16_threshold_256_takes_14_dispatches() -> None:
    config = PlannerConfig(
        max_num_batched_tokens=8192,
        long_prefill_token_threshold=256,
        max_num_seqs=16,
        policy="packed",
    )
    schedule = plan_prefill(SEED_LENGTHS, config)
    assert schedule.num_dispatches == 14 == schedule.lower_bound
    dispatches = rows_of(schedule)
    for k in range(13):
        assert dispatches[k] == [(r, 256 * k, 256, False) for r in range(16)]
    assert dispatches[13] == [(r, 3328, 10, True) for r in range(16)]


# -- edge cases -------------------------------------------------------------------------------


@pytest.mark.parametrize("policy", POLICIES)
def test_a_one_token_prompt_is_one_final_chunk(policy: Policy) -> None:
    config = PlannerConfig(max_num_batched_tokens=1, policy=policy)
    assert rows_of(plan_prefill([1], config)) == [[(0, 0, 1, True)]]


@pytest.mark.parametrize("policy", POLICIES)
def test_a_prompt_of_exactly_the_budget_is_one_dispatch(policy: Policy) -> None:
    config = PlannerConfig(max_num_batched_tokens=512, policy=policy)
    assert rows_of(plan_prefill([512], config)) == [[(0, 0, 512, True)]]


@pytest.mark.parametrize("policy", POLICIES)
def test_a_prompt_one_token_over_the_budget_leaves_a_one_token_final_chunk(
    policy: Policy,
) -> None:
    config = PlannerConfig(max_num_batched_tokens=512, policy=policy)
    assert rows_of(plan_prefill([513], config)) == [[(0, 0, 512, False)], [(0, 512, 1, True)]]


def test_round_robin_budget_1_runs_one_token_per_dispatch_in_turn() -> None:
    schedule = plan_prefill([3, 2], PlannerConfig(max_num_batched_tokens=1))
    assert rows_of(schedule) == [
        [(0, 0, 1, False)],
        [(1, 0, 1, False)],
        [(0, 1, 1, False)],
        [(1, 1, 1, True)],
        [(0, 2, 1, True)],
    ]


def test_packed_budget_1_finishes_the_started_request_before_the_next() -> None:
    schedule = plan_prefill([3, 2], PlannerConfig(max_num_batched_tokens=1, policy="packed"))
    assert rows_of(schedule) == [
        [(0, 0, 1, False)],
        [(0, 1, 1, False)],
        [(0, 2, 1, True)],
        [(1, 0, 1, False)],
        [(1, 1, 1, True)],
    ]


@pytest.mark.parametrize("policy", POLICIES)
def test_page_size_1_is_the_same_as_no_page_size(policy: Policy) -> None:
    lengths, computed = [37, 5, 129, 64], [3, 0, 100, 63]
    plain = PlannerConfig(max_num_batched_tokens=20, long_prefill_token_threshold=9, policy=policy)
    paged = PlannerConfig(
        max_num_batched_tokens=20, long_prefill_token_threshold=9, chunk_alignment=1, policy=policy
    )
    assert rows_of(plan_prefill(lengths, paged, num_computed_tokens=computed)) == rows_of(
        plan_prefill(lengths, plain, num_computed_tokens=computed)
    )


@pytest.mark.parametrize("policy", POLICIES)
def test_a_full_prefix_hit_but_one_token_runs_that_token_alone(policy: Policy) -> None:
    config = PlannerConfig(
        max_num_batched_tokens=8192, long_prefill_token_threshold=256, policy=policy
    )
    schedule = plan_prefill(SEED_LENGTHS, config, num_computed_tokens=[3337] * 16)
    assert rows_of(schedule) == [[(r, 3337, 1, True) for r in range(16)]]


def test_round_robin_page_rounding_from_an_unaligned_prefix_hit() -> None:
    config = PlannerConfig(max_num_batched_tokens=32, chunk_alignment=16)
    schedule = plan_prefill([100], config, num_computed_tokens=[5])
    # The first chunk reaches back to the page boundary 32; later ones are 32 tokens.
    assert rows_of(schedule) == [
        [(0, 5, 27, False)],
        [(0, 32, 32, False)],
        [(0, 64, 32, False)],
        [(0, 96, 4, True)],
    ]


def test_packed_started_requests_go_first_and_newcomers_fill_the_rest() -> None:
    # (With a partial limit packed fills greedily; see the next test for the same prompts
    # without one.)
    config = PlannerConfig(
        max_num_batched_tokens=10,
        long_prefill_token_threshold=6,
        max_num_partial_prefills=2,
        policy="packed",
    )
    schedule = plan_prefill([8, 3, 9], config)
    assert rows_of(schedule) == [
        [(0, 0, 6, False), (1, 0, 3, True), (2, 0, 1, False)],
        [(0, 6, 2, True), (2, 1, 6, False)],
        [(2, 7, 2, True)],
    ]
    assert schedule.lower_bound == 2


def test_packed_keeps_to_the_bound_where_the_greedy_fill_would_not() -> None:
    # Greedy, request 2 would start with 1 token and need 6 + 2 more: 3 dispatches. Its
    # deadline minimum makes it start with 3, and the bound, 2, is met.
    config = PlannerConfig(
        max_num_batched_tokens=10, long_prefill_token_threshold=6, policy="packed"
    )
    schedule = plan_prefill([8, 3, 9], config)
    assert rows_of(schedule) == [
        [(0, 0, 6, False), (1, 0, 1, False), (2, 0, 3, False)],
        [(0, 6, 2, True), (1, 1, 2, True), (2, 3, 6, True)],
    ]
    assert schedule.num_dispatches == schedule.lower_bound == 2


def test_packed_partial_limit_holds_a_newcomer_back_until_a_slot_frees() -> None:
    config = PlannerConfig(
        max_num_batched_tokens=8,
        long_prefill_token_threshold=4,
        policy="packed",
        max_num_partial_prefills=1,
    )
    assert rows_of(plan_prefill([8, 8], config)) == [
        [(0, 0, 4, False)],
        [(0, 4, 4, True), (1, 0, 4, False)],
        [(1, 4, 4, True)],
    ]


@pytest.mark.parametrize("policy", POLICIES)
def test_a_request_of_more_than_65536_chunks_matches_the_oracle(policy: Policy) -> None:
    # Past 2**16 rounds round_robin can no longer sort rounds with 16-bit keys.
    lengths, computed = [70_003, 4, 65_537], [1, 0, 0]
    config = PlannerConfig(max_num_batched_tokens=1, policy=policy)
    schedule = plan_prefill(lengths, config, num_computed_tokens=computed)
    assert rows_of(schedule) == oracle_plan(lengths, config, computed)
    assert schedule.num_chunks == 70_002 + 4 + 65_537
