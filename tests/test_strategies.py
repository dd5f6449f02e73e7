"""The public strategies of ``pypto_sched.testing``: valid values only, by construction (no
discards, measured with Hypothesis' own statistics), every edge case reachable, bounded
defaults, small examples after shrinking, lazy ``InvalidArgument`` for bad arguments, and
reprs that show the public call."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, find, given, settings
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument, NoSuchExample
from hypothesis.statistics import collector

from pypto_sched import (
    POLICIES,
    PlannerConfig,
    PrefillState,
    Schedule,
    plan_prefill,
    plan_step,
)
from pypto_sched.testing import (
    planner_configs,
    prefill_states,
    prefill_states_with_configs,
    prompt_lengths,
    schedules,
)

T = TypeVar("T")

# `find` returns the first example that satisfies the condition, shrunk unless told not to.
SHRINK = settings(
    max_examples=1000, database=None, derandomize=True, suppress_health_check=list(HealthCheck)
)
NO_SHRINK = settings(SHRINK, phases=[Phase.generate])
#: The config of docs/testing.md's online-planner example.
DOCS_CONFIG = PlannerConfig(max_num_batched_tokens=64, max_num_seqs=4, policy="packed")


def smallest(strategy: st.SearchStrategy[T], condition: Callable[[T], bool]) -> T:
    return find(strategy, condition, settings=SHRINK)


def reaches(strategy: st.SearchStrategy[T], condition: Callable[[T], bool]) -> None:
    find(strategy, condition, settings=NO_SHRINK)  # raises NoSuchExample if it never does


def drain(state: PrefillState[Any], config: PlannerConfig) -> None:
    while state:
        plan = plan_step(state, config)
        assert plan.rows
        state = plan.state


def is_part_way(state: PrefillState[Any]) -> bool:
    """Whether a request has run some chunks but not all (finished ones leave the state)."""
    return any(request.is_started for request in state.values())


def generate(
    strategy: st.SearchStrategy[T], *, max_examples: int, health_checks: bool = False
) -> tuple[list[T], list[dict[str, Any]]]:
    """The values a seeded ``@given`` test sees, and the test cases Hypothesis' statistics
    record for it (each with its ``status`` and ``events``)."""
    values: list[T] = []
    statistics: list[dict[str, Any]] = []

    @settings(
        max_examples=max_examples,
        database=None,
        derandomize=True,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=[] if health_checks else list(HealthCheck),
    )
    @given(strategy)
    def record(value: T) -> None:
        values.append(value)

    # `collector` is typed for its default, None; the pytest plugin sets a callback the same way.
    with collector.with_value(statistics.append):  # type: ignore[arg-type]
        record()
    (run,) = statistics
    return values, run["generate-phase"]["test-cases"]


def discards(test_cases: list[dict[str, Any]]) -> Counter[str]:
    """Test cases thrown away (``invalid``: a filter, ``assume`` or unique list gave up) and
    draws retried inside a filter, as Hypothesis' statistics report them."""
    counts: Counter[str] = Counter()
    for case in test_cases:
        counts["invalid"] += case["status"] == "invalid"
        counts["retried"] += any("Retried draw" in event for event in case["events"])
    return counts


# -- only valid values ------------------------------------------------------------------------


@given(st.data())
def test_prompt_lengths_stay_within_their_bounds(data: st.DataObject) -> None:
    low = data.draw(st.integers(min_value=1, max_value=1000))
    high = data.draw(st.integers(min_value=low, max_value=2**31 - 1))
    length = data.draw(prompt_lengths(min_value=low, max_value=high))
    assert low <= length <= high


@given(planner_configs())
def test_planner_configs_are_valid(config: PlannerConfig) -> None:
    assert PlannerConfig.from_dict(config.to_dict()) == config


@given(
    planner_configs(
        policy=st.just("packed"), max_num_batched_tokens=st.just(64), chunk_alignment=st.just(16)
    )
)
def test_planner_configs_use_the_strategies_passed(config: PlannerConfig) -> None:
    assert (config.policy, config.max_num_batched_tokens, config.chunk_alignment) == (
        "packed",
        64,
        16,
    )


@given(planner_configs(max_num_partial_prefills=st.none() | st.integers(1, 4)))
def test_planner_configs_default_policy_is_packed_when_a_partial_limit_is_drawn(
    config: PlannerConfig,
) -> None:
    assert config.max_num_partial_prefills is None or config.policy == "packed"


def test_planner_configs_default_policy_still_reaches_round_robin_beside_a_partial_limit() -> None:
    strategy = planner_configs(max_num_partial_prefills=st.none() | st.integers(1, 4))
    reaches(strategy, lambda config: config.policy == "round_robin")


@given(planner_configs(chunk_alignment=st.integers(min_value=1, max_value=4096)))
def test_planner_configs_default_budget_and_threshold_follow_the_page_drawn(
    config: PlannerConfig,
) -> None:
    assert config.chunk_alignment is not None
    assert config.chunk_alignment <= config.max_num_batched_tokens < config.chunk_alignment + 512
    assert config.chunk_alignment <= config.chunk_cap


@given(st.data())
def test_schedules_are_valid_and_are_what_plan_prefill_gives(data: st.DataObject) -> None:
    low = data.draw(st.integers(min_value=1, max_value=4))
    high = data.draw(st.integers(min_value=low, max_value=6))
    schedule = data.draw(schedules(min_size=low, max_size=high))
    schedule.validate()
    assert low <= schedule.num_requests <= high
    replanned = plan_prefill(
        schedule.prompt_lengths,
        schedule.config,
        num_computed_tokens=schedule.num_computed_tokens,
    )
    assert replanned == schedule


@given(
    schedules(
        configs=st.just(PlannerConfig(max_num_batched_tokens=8)),
        prompt_lengths=prompt_lengths(max_value=20),
        allow_prefix_hits=False,
    )
)
def test_schedules_use_the_configs_and_lengths_passed(schedule: Schedule) -> None:
    assert schedule.config == PlannerConfig(max_num_batched_tokens=8)
    assert schedule.prompt_lengths.max() <= 20
    assert not schedule.num_computed_tokens.any()


@given(planner_configs(), st.data())
def test_prefill_states_are_consistent_and_can_be_drained(
    config: PlannerConfig, data: st.DataObject
) -> None:
    low = data.draw(st.integers(min_value=0, max_value=4))
    high = data.draw(st.integers(min_value=low, max_value=8))
    state = data.draw(prefill_states(configs=st.just(config), min_size=low, max_size=high))
    assert low <= len(state) <= high
    assert state.policy in (None, config.policy)
    assert state.num_tokens == sum(r.num_remaining_tokens for r in state.values())
    assert all(0 <= r.num_computed_tokens < r.prompt_length for r in state.values())
    drain(state, config)


@given(prefill_states_with_configs())
def test_prefill_states_with_configs_give_the_config_that_steps_the_state(
    drawn: tuple[PrefillState[Any], PlannerConfig],
) -> None:
    state, config = drawn
    assert state.policy in (None, config.policy)
    drain(state, config)


@given(prefill_states_with_configs())
def test_draining_a_drawn_state_runs_each_request_s_remaining_positions_once(
    drawn: tuple[PrefillState[Any], PlannerConfig],
) -> None:
    state, config = drawn
    # A plain-loop oracle: where each request stands, and where its next chunk must start.
    position = {rid: r.num_computed_tokens for rid, r in state.items()}
    length = {rid: r.prompt_length for rid, r in state.items()}
    while state:
        plan = plan_step(state, config)
        for rid, chunk in plan.rows.items():
            assert chunk.start == position[rid]
            position[rid] = chunk.end
            assert chunk.is_final == (chunk.end == length[rid])
        state = plan.state
    assert position == length


@given(prefill_states_with_configs(configs=st.just(DOCS_CONFIG), max_size=3))
def test_prefill_states_with_configs_use_the_configs_and_sizes_passed(
    drawn: tuple[PrefillState[Any], PlannerConfig],
) -> None:
    state, config = drawn
    assert config == DOCS_CONFIG
    assert len(state) <= 3


@given(prefill_states(request_ids=st.text(), allow_prefix_hits=False, min_size=1))
def test_prefill_states_use_the_ids_passed(state: PrefillState[Any]) -> None:
    assert len(state) >= 1
    assert all(isinstance(request_id, str) for request_id in state)
    assert not any(r.num_computed_tokens and not r.is_started for r in state.values())


# -- valid by construction: Hypothesis' statistics show no discards --------------------------------


@pytest.mark.parametrize(
    "strategy",
    [
        prompt_lengths(),
        prompt_lengths(min_value=10**9),
        planner_configs(),
        planner_configs(chunk_alignment=st.integers(min_value=1, max_value=64)),
        schedules(),
        schedules(prompt_lengths=prompt_lengths()),
        prefill_states(),
        prefill_states(configs=st.just(DOCS_CONFIG), max_size=6),
        prefill_states_with_configs(min_size=3),
    ],
    ids=repr,
)
def test_strategies_discard_nothing(strategy: st.SearchStrategy[Any]) -> None:
    values, test_cases = generate(strategy, max_examples=80)
    assert len(values) == 80
    assert discards(test_cases) == Counter(invalid=0, retried=0)


def test_the_discard_count_sees_a_filter() -> None:
    # The measurement above can fail: a strategy that filters shows up in it.
    _, test_cases = generate(st.integers().filter(lambda n: n % 5 == 0), max_examples=80)
    counts = discards(test_cases)
    assert counts["invalid"] + counts["retried"] > 0


# -- part-way states ------------------------------------------------------------------------------


PACKED_SMALL_CAP = PlannerConfig(
    max_num_batched_tokens=512, long_prefill_token_threshold=8, policy="packed"
)
PACKED_VLLM = PlannerConfig(
    max_num_batched_tokens=8192, long_prefill_token_threshold=512, policy="packed"
)
PACKED_HUGE_BUDGET = PlannerConfig(
    max_num_batched_tokens=2**31 - 1, long_prefill_token_threshold=100, policy="packed"
)


@pytest.mark.parametrize(
    "strategy",
    [
        prefill_states(),
        prefill_states(configs=st.just(DOCS_CONFIG), max_size=6),
        prefill_states(configs=st.just(PlannerConfig(max_num_batched_tokens=1)), max_size=1),
        prefill_states(
            configs=st.just(PlannerConfig(max_num_batched_tokens=96, chunk_alignment=32))
        ),
        # Under packed a request alone runs the whole budget, more than four chunks here.
        prefill_states(configs=st.just(PACKED_SMALL_CAP)),
        prefill_states(configs=st.just(PACKED_SMALL_CAP), max_size=1),
        prefill_states(configs=st.just(PACKED_VLLM), max_size=1),
        # A budget that runs any prompt whole, but a threshold: part-way when not alone.
        prefill_states(configs=st.just(PACKED_HUGE_BUDGET)),
    ],
    ids=repr,
)
def test_at_least_a_quarter_of_prefill_states_are_part_way(
    strategy: st.SearchStrategy[PrefillState[Any]],
) -> None:
    states, _ = generate(strategy, max_examples=300)
    assert sum(map(is_part_way, states)) >= len(states) / 4


@pytest.mark.parametrize(
    "config",
    [
        PlannerConfig(max_num_batched_tokens=8),
        PlannerConfig(
            max_num_batched_tokens=8,
            long_prefill_token_threshold=2,
            policy="packed",
            max_num_partial_prefills=2,
        ),
    ],
    ids=repr,
)
def test_prefill_states_reach_several_part_way_requests(config: PlannerConfig) -> None:
    # round_robin's steady state has many requests part-way; the partial limit needs at
    # least its count of them to bind.
    states, _ = generate(prefill_states(configs=st.just(config)), max_examples=300)
    part_way = [sum(request.is_started for request in s.values()) for s in states]
    assert sum(count >= 2 for count in part_way) >= len(states) / 20, part_way


# -- bounded defaults ------------------------------------------------------------------------------


@given(prompt_lengths(), prompt_lengths(min_value=10**6))
def test_prompt_lengths_default_to_4096_values_from_min_value(short: int, long: int) -> None:
    assert 1 <= short <= 4096
    assert 10**6 <= long < 10**6 + 4096


def test_prompt_lengths_default_bound_stops_at_the_largest_length() -> None:
    reaches(prompt_lengths(min_value=2**31 - 1), lambda n: n == 2**31 - 1)


def test_default_schedules_stay_small() -> None:
    drawn, _ = generate(schedules(), max_examples=100)
    # budgets up to 512 and thresholds up to 1024 give chunk caps up to 512, prompts of up to
    # four chunks, 10 requests
    assert max(schedule.num_tokens for schedule in drawn) <= 10 * 4 * 512
    assert max(schedule.num_dispatches for schedule in drawn) <= 10 * (2 * 4 + 1)


@pytest.mark.parametrize("min_value", [1, 10**6, 2**31 - 4096])
def test_schedules_of_the_lengths_passed_have_a_bounded_number_of_dispatches(
    min_value: int,
) -> None:
    # Health checks on (too_slow included): a high min_value must not fail them.
    strategy = schedules(prompt_lengths=prompt_lengths(min_value=min_value))
    drawn, _ = generate(strategy, max_examples=30, health_checks=True)
    for schedule in drawn:
        assert schedule.num_tokens <= 10 * (min_value + 4095)
        assert schedule.num_dispatches <= 2 * 128 + 2 * schedule.num_requests


@pytest.mark.parametrize("min_value", [1, 10**6])
def test_prefill_states_of_the_lengths_passed_drain_in_a_bounded_number_of_steps(
    min_value: int,
) -> None:
    strategy = prefill_states_with_configs(prompt_lengths=prompt_lengths(min_value=min_value))
    drawn, _ = generate(strategy, max_examples=30, health_checks=True)
    for state, config in drawn:
        assert all(min_value <= r.prompt_length < min_value + 4096 for r in state.values())
        num_requests, steps = len(state), 0
        while state:
            state = plan_step(state, config).state
            steps += 1
        assert steps <= 2 * 128 + 2 * num_requests


# -- bad arguments: InvalidArgument when drawn, naming the argument and the value ----------------


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: prompt_lengths(min_value=0), "min_value=0 must be >= 1"),
        (lambda: prompt_lengths(min_value=3, max_value=2), "min_value=3 must be <= max_value=2"),
        (lambda: prompt_lengths(max_value=2**31), "max_value=2147483648 must be <= 2147483647"),
        (lambda: prompt_lengths(min_value=1.5), "min_value=1.5 must be an int"),  # type: ignore[arg-type]
        (lambda: prompt_lengths(min_value=True), "min_value=True must be an int"),
        (lambda: planner_configs(policy="packed"), "policy='packed' must be a strategy"),  # type: ignore[arg-type]
        (lambda: planner_configs(chunk_alignment=16), "chunk_alignment=16 must be a strategy"),  # type: ignore[arg-type]
        (
            lambda: planner_configs(policy=st.just("fifo")),  # type: ignore[arg-type]
            "policy drew 'fifo' (str), but a policy must be one of 'round_robin', 'packed'",
        ),
        (
            lambda: planner_configs(max_num_batched_tokens=st.just("x")),  # type: ignore[arg-type]
            "max_num_batched_tokens drew 'x' (str), but it must be an int in [1, 2147483647]",
        ),
        (
            lambda: planner_configs(max_num_batched_tokens=st.just(None)),  # type: ignore[arg-type]
            "max_num_batched_tokens drew None (NoneType), but it must be an int",
        ),
        (
            lambda: planner_configs(long_prefill_token_threshold=st.just(0)),
            "long_prefill_token_threshold drew 0 (int), but it must be None or an int",
        ),
        (
            lambda: planner_configs(max_num_seqs=st.just(2.0)),  # type: ignore[arg-type]
            "max_num_seqs drew 2.0 (float), but it must be None or an int",
        ),
        (
            lambda: planner_configs(chunk_alignment=st.just(True)),
            "chunk_alignment drew True (bool), but it must be None or an int",
        ),
        (
            lambda: planner_configs(policy=st.just("packed"), max_num_partial_prefills=st.just(-1)),
            "max_num_partial_prefills drew -1 (int), but it must be None or an int",
        ),
        (
            lambda: planner_configs(
                policy=st.just("round_robin"), max_num_partial_prefills=st.just(2)
            ),
            "planner_configs() drew a combination PlannerConfig rejects (policy='round_robin', "
            "max_num_batched_tokens=1, long_prefill_token_threshold=None, max_num_seqs=None, "
            "chunk_alignment=None, max_num_partial_prefills=2): 'max_num_partial_prefills' "
            "applies "
            "only to policy 'packed'",
        ),
        (
            lambda: planner_configs(max_num_batched_tokens=st.just(8), chunk_alignment=st.just(16)),
            "planner_configs() drew a combination PlannerConfig rejects "
            "(policy='round_robin', max_num_batched_tokens=8, long_prefill_token_threshold=None"
            ", max_num_seqs=None, chunk_alignment=16, max_num_partial_prefills=None): "
            "'chunk_alignment' must be <= the largest chunk",
        ),
        (lambda: schedules(min_size=0), "min_size=0 must be >= 1"),
        (lambda: schedules(min_size=10**6), "min_size=1000000 must be <= 1000: Hypothesis"),
        (lambda: prefill_states(min_size=1001), "min_size=1001 must be <= 1000: Hypothesis"),
        (
            lambda: prefill_states_with_configs(min_size=1001, max_size=2000),
            "min_size=1001 must be <= 1000: Hypothesis",
        ),
        (lambda: schedules(min_size=3, max_size=2), "min_size=3 must be <= max_size=2"),
        (lambda: schedules(max_size="3"), "max_size='3' must be an int"),  # type: ignore[arg-type]
        (
            lambda: schedules(configs=PlannerConfig(max_num_batched_tokens=8)),  # type: ignore[arg-type]
            "configs=PlannerConfig(max_num_batched_tokens=8, long_prefill_token_threshold=None, "
            "max_num_seqs=None, chunk_alignment=None, policy='round_robin', "
            "max_num_partial_prefills=None) must be a strategy or None; wrap a constant in "
            "st.just()",
        ),
        (
            lambda: schedules(configs=st.just(5)),  # type: ignore[arg-type]
            "configs drew 5 (int), but a config must be a PlannerConfig",
        ),
        (
            lambda: schedules(prompt_lengths=st.just(0)),
            "prompt_lengths drew 0 (int), but a prompt length must be an int in [1, 2147483647]",
        ),
        (
            lambda: schedules(prompt_lengths=st.just(2**31)),
            "prompt_lengths drew 2147483648 (int), but a prompt length must be an int",
        ),
        (
            lambda: schedules(prompt_lengths=st.just(8.0)),  # type: ignore[arg-type]
            "prompt_lengths drew 8.0 (float), but a prompt length must be an int",
        ),
        (
            lambda: schedules(allow_prefix_hits=1),  # type: ignore[arg-type]
            "allow_prefix_hits=1 must be a bool",
        ),
        (lambda: prefill_states(min_size=-1), "min_size=-1 must be >= 0"),
        (lambda: prefill_states(max_size=-1), "max_size=-1 must be >= 0"),
        (lambda: prefill_states(request_ids=1), "request_ids=1 must be a strategy"),  # type: ignore[arg-type]
        (
            lambda: prefill_states(request_ids=st.lists(st.integers()), min_size=1),  # type: ignore[arg-type]
            "request_ids drew [] (list), but request ids must be hashable",
        ),
        (
            lambda: prefill_states(configs=st.just("packed"), min_size=1),  # type: ignore[arg-type]
            "configs drew 'packed' (str), but a config must be a PlannerConfig",
        ),
        (
            lambda: prefill_states(prompt_lengths=st.just(-5), min_size=1),
            "prompt_lengths drew -5 (int), but a prompt length must be an int",
        ),
        (
            lambda: prefill_states_with_configs(allow_prefix_hits=None),  # type: ignore[arg-type]
            "allow_prefix_hits=None must be a bool",
        ),
        (
            lambda: prefill_states_with_configs(prompt_lengths=st.just("7"), min_size=2),  # type: ignore[arg-type]
            "prompt_lengths drew '7' (str), but a prompt length must be an int",
        ),
    ],
)
def test_bad_arguments_raise_invalid_argument_when_drawn(
    make: Callable[[], st.SearchStrategy[Any]], message: str
) -> None:
    strategy = make()  # lazily, as Hypothesis' own strategies: calling never raises
    with pytest.raises(InvalidArgument) as raised:
        reaches(strategy, lambda _: True)
    assert message in str(raised.value)


@pytest.mark.parametrize("strategy", [schedules, prefill_states, prefill_states_with_configs])
def test_the_largest_min_size_draws_with_the_health_checks_the_docs_name_suppressed(
    strategy: Callable[..., st.SearchStrategy[Any]],
) -> None:
    sizes: list[int] = []

    @settings(
        database=None,
        max_examples=2,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.large_base_example],
    )
    @given(strategy(min_size=1000))
    def draw(value: Any) -> None:
        value = value[0] if isinstance(value, tuple) else value
        sizes.append(value.num_requests if isinstance(value, Schedule) else len(value))

    draw()
    assert sizes
    assert min(sizes) >= 1000


# -- edge cases are reachable -------------------------------------------------------------------


@pytest.mark.parametrize(
    "condition",
    [
        lambda c: c.max_num_batched_tokens == 1,
        lambda c: c.chunk_alignment is not None and c.chunk_alignment == c.chunk_cap > 1,
        lambda c: (
            c.long_prefill_token_threshold is not None
            and c.long_prefill_token_threshold < c.max_num_batched_tokens
        ),
        lambda c: c.max_num_seqs == 1,
        lambda c: c.max_num_partial_prefills == 1,
        *(lambda c, p=policy: c.policy == p for policy in POLICIES),
    ],
)
def test_planner_configs_reach_every_edge(condition: Callable[[PlannerConfig], bool]) -> None:
    reaches(planner_configs(), condition)


@pytest.mark.parametrize(
    "condition",
    [
        # round_robin's whole-batch dispatch
        lambda s: s.config.policy == "round_robin" and s.num_dispatches == 1 < s.num_requests,
        # a dispatch full to max_num_seqs with more to come
        lambda s: (
            s.config.max_num_seqs is not None
            and s.num_dispatches > 1
            and int(s.rows_per_dispatch.max()) == s.config.max_num_seqs
        ),
        # a one-token final chunk after a non-final one
        lambda s: bool(((s.lengths == 1) & s.is_final & (s.starts > 0)).any()),
        # a prefix-cache hit
        lambda s: bool(s.num_computed_tokens.any()),
        # a dispatch exactly at the budget, under packed
        lambda s: (
            s.config.policy == "packed"
            and int(s.tokens_per_dispatch.max()) == s.config.max_num_batched_tokens > 1
        ),
    ],
)
def test_schedules_reach_every_edge(condition: Callable[[Schedule], bool]) -> None:
    reaches(schedules(), condition)


@pytest.mark.parametrize(
    "condition",
    [
        lambda s: len(s) == 0,
        lambda s: len(s) > 0 and not is_part_way(s),
        lambda s: s.policy == "round_robin" and len(s) > 1,
        lambda s: (
            s.policy == "packed" and is_part_way(s) and not all(r.is_started for r in s.values())
        ),
        lambda s: sum(r.is_started for r in s.values()) >= 2,
        lambda s: any(r.num_computed_tokens and not r.is_started for r in s.values()),
    ],
)
def test_prefill_states_reach_every_edge(condition: Callable[[PrefillState[Any]], bool]) -> None:
    reaches(prefill_states(), condition)


def test_prefill_states_reuse_an_id_after_its_request_has_left() -> None:
    # With ids 0..max_size-1 and more arrivals than ids, an id must have come back.
    reaches(
        prefill_states(max_size=2),
        lambda s: len(s) == 2 and any(r.is_started for r in s.values()) and 1 in s,
    )


# -- reprs -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("strategy", "text"),
    [
        (prompt_lengths(), "prompt_lengths()"),
        (prompt_lengths(max_value=10), "prompt_lengths(max_value=10)"),
        (planner_configs(chunk_alignment=st.just(16)), "planner_configs(chunk_alignment=just(16))"),
        (
            schedules(prompt_lengths=prompt_lengths(max_value=10), max_size=3),
            "schedules(prompt_lengths=prompt_lengths(max_value=10), max_size=3)",
        ),
        (prefill_states(min_size=1), "prefill_states(min_size=1)"),
        (
            prefill_states_with_configs(request_ids=st.text()),
            "prefill_states_with_configs(request_ids=text())",
        ),
    ],
)
def test_reprs_show_the_public_call(strategy: st.SearchStrategy[Any], text: str) -> None:
    assert repr(strategy) == text


# -- shrinking to small examples ------------------------------------------------------------------


def test_prompt_lengths_shrink_to_the_smallest_length_that_fails() -> None:
    assert smallest(prompt_lengths(min_value=5), lambda n: n > 100) == 101


def test_planner_configs_shrink_to_the_simplest_config() -> None:
    config = smallest(planner_configs(), lambda c: c.chunk_alignment is not None)
    assert config == PlannerConfig(max_num_batched_tokens=1, chunk_alignment=1)


def test_schedules_shrink_to_a_few_tokens_under_a_tiny_budget() -> None:
    schedule = smallest(schedules(), lambda s: s.num_dispatches >= 3)
    assert schedule.num_requests <= 3
    assert schedule.num_tokens <= 6
    assert schedule.config.max_num_batched_tokens <= 2
    assert schedule.config.chunk_alignment is None
    assert schedule.config.max_num_seqs is None


def test_prefill_states_shrink_to_one_short_started_request() -> None:
    config = PlannerConfig(max_num_batched_tokens=4, policy="packed")
    state = smallest(prefill_states(configs=st.just(config)), is_part_way)
    assert len(state) == 1
    (request,) = state.values()
    assert request.prompt_length <= config.chunk_cap + 1
    assert request.is_started


def test_prefill_states_ids_shrink_to_the_first_ints() -> None:
    state = smallest(prefill_states(), lambda state: len(state) >= 3)
    assert list(state) == [0, 1, 2]


# -- the optional extra -------------------------------------------------------------------------


def test_pypto_sched_imports_without_hypothesis_and_the_strategies_say_what_to_install() -> None:
    script = """
import sys
sys.modules["hypothesis"] = None  # makes `import hypothesis` fail
import pypto_sched
import pypto_sched.testing
try:
    from pypto_sched.testing import schedules
except ImportError as error:
    print(error)
"""
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    )
    assert "pip install 'pypto-sched[testing]'" in result.stdout


@given(prompt_lengths(min_value=np.int64(3), max_value=10.0))  # type: ignore[arg-type]
def test_prompt_lengths_take_bounds_as_st_integers_does(length: int) -> None:
    assert type(length) is int
    assert 3 <= length <= 10


# -- from a mutation review: every documented extreme can still be drawn, and nothing beyond it --

SEEDED = settings(
    max_examples=200, database=None, derandomize=True, deadline=None,
    suppress_health_check=list(HealthCheck),
)  # fmt: skip


def never(strategy: st.SearchStrategy[T], condition: Callable[[T], bool]) -> None:
    with pytest.raises(NoSuchExample):
        find(strategy, condition, settings=NO_SHRINK)


@pytest.mark.parametrize(
    ("strategy", "condition"),
    [
        pytest.param(prompt_lengths(), lambda n: n == 4096, id="a 4096-token prompt"),
        pytest.param(schedules(), lambda s: s.num_requests == 10, id="10 requests"),
        pytest.param(
            schedules(), lambda s: bool((s.prompt_lengths == 1).any()), id="a one-token prompt"
        ),
        pytest.param(
            schedules(),
            lambda s: bool((s.prompt_lengths == 4 * s.config.chunk_cap).any()),
            id="a prompt of four whole chunks",
        ),
        pytest.param(
            schedules(),
            lambda s: bool(
                ((s.num_computed_tokens == s.prompt_lengths - 1) & (s.prompt_lengths > 1)).any()
            ),
            id="a prefix hit of all but the last token",
        ),
        pytest.param(
            prefill_states(),
            lambda s: any(
                not r.is_started
                and r.prompt_length > 1
                and r.num_computed_tokens == r.prompt_length - 1
                for r in s.values()
            ),
            id="a waiting request cached but for its last token",
        ),
        pytest.param(
            planner_configs(),
            lambda c: c.long_prefill_token_threshold == 2 * c.max_num_batched_tokens > 2,
            id="a threshold of twice the budget",
        ),
        pytest.param(
            planner_configs(), lambda c: c.long_prefill_token_threshold == 1, id="a threshold of 1"
        ),
        pytest.param(planner_configs(), lambda c: c.max_num_seqs == 16, id="16 rows"),
        pytest.param(
            planner_configs(), lambda c: c.max_num_partial_prefills == 8, id="8 partial prefills"
        ),
        pytest.param(
            # Alone under a budget of 8 without prefix hits, a request runs 8 tokens a step:
            # only a drawn token reservation leaves it part-way elsewhere.
            prefill_states(
                configs=st.just(PlannerConfig(max_num_batched_tokens=8)),
                max_size=1,
                allow_prefix_hits=False,
            ),
            lambda s: any(r.is_started and r.num_computed_tokens % 8 for r in s.values()),
            id="a step shortened by a reservation",
        ),
    ],
)
def test_the_documented_extremes_are_drawn(strategy: Any, condition: Any) -> None:
    reaches(strategy, condition)


def test_nothing_is_drawn_beyond_the_documented_limits() -> None:
    never(planner_configs(), lambda c: (c.max_num_seqs or 0) > 16)
    never(planner_configs(), lambda c: (c.max_num_partial_prefills or 0) > 8)
    never(prompt_lengths(min_value=2**31 - 100), lambda n: n > 2**31 - 1)


@SEEDED
@given(schedules(allow_prefix_hits=False))
def test_no_prefix_hits_when_refused_with_the_default_lengths(schedule: Schedule) -> None:
    assert not schedule.num_computed_tokens.any()


@SEEDED
@given(schedules(prompt_lengths=st.integers(min_value=1, max_value=10**6)))
def test_the_default_chunk_cap_holds_the_tokens_in_128_chunks(schedule: Schedule) -> None:
    assert schedule.config.chunk_cap * 128 >= int(schedule.prompt_lengths.sum())


@SEEDED
@given(schedules(configs=st.just(PlannerConfig(max_num_batched_tokens=2**31 - 1)), max_size=2))
def test_default_lengths_stay_valid_under_the_largest_chunk_cap(schedule: Schedule) -> None:
    assert schedule.prompt_lengths.max() <= 2**31 - 1


@pytest.mark.parametrize("budget", [2**31 - 1, np.int64(8)], ids=repr)
def test_a_budget_may_be_any_count_a_numpy_int_too(budget: Any) -> None:
    config = find(
        planner_configs(max_num_batched_tokens=st.just(budget)), lambda c: True, settings=NO_SHRINK
    )
    assert config.max_num_batched_tokens == budget
