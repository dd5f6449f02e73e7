"""The public strategies of ``pypto_sched.testing``: valid values only, every edge case
reachable, small examples after shrinking, ``InvalidArgument`` for impossible requests."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, Phase, find, given, settings
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from pypto_sched import (
    POLICIES,
    PlannerConfig,
    PrefillState,
    Schedule,
    plan_prefill,
    plan_step,
)
from pypto_sched.testing import planner_configs, prefill_states, prompt_lengths, schedules

T = TypeVar("T")

# `find` returns the first example that satisfies the condition, shrunk unless told not to.
SHRINK = settings(
    max_examples=1000, database=None, derandomize=True, suppress_health_check=list(HealthCheck)
)
NO_SHRINK = settings(SHRINK, phases=[Phase.generate])


def smallest(strategy: st.SearchStrategy[T], condition: Callable[[T], bool]) -> T:
    return find(strategy, condition, settings=SHRINK)


def reaches(strategy: st.SearchStrategy[T], condition: Callable[[T], bool]) -> None:
    find(strategy, condition, settings=NO_SHRINK)  # raises NoSuchExample if it never does


def drain(state: PrefillState[Any], config: PlannerConfig) -> None:
    while state:
        plan = plan_step(state, config)
        assert plan.rows
        state = plan.state


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
        policy=st.just("packed"), max_num_batched_tokens=st.just(64), page_size=st.just(16)
    )
)
def test_planner_configs_use_the_strategies_passed(config: PlannerConfig) -> None:
    assert (config.policy, config.max_num_batched_tokens, config.page_size) == ("packed", 64, 16)


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


@given(prefill_states(request_ids=st.text(), allow_prefix_hits=False, min_size=1))
def test_prefill_states_use_the_ids_passed_and_start_waiting(state: PrefillState[Any]) -> None:
    assert all(isinstance(request_id, str) for request_id in state)
    assert state.policy is None
    assert not any(r.num_computed_tokens or r.is_started for r in state.values())


# -- impossible requests ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: prompt_lengths(min_value=0), "min_value=0 must be >= 1"),
        (lambda: prompt_lengths(min_value=3, max_value=2), "min_value=3 must be <= max_value=2"),
        (lambda: prompt_lengths(max_value=2**31), "must be <= 2147483647"),
        (lambda: prompt_lengths(min_value=1.5), "min_value=1.5 must be an int"),  # type: ignore[arg-type]
        (lambda: prompt_lengths(min_value=True), "min_value=True must be an int"),
        (lambda: planner_configs(policy="packed"), "wrap a constant in st.just"),  # type: ignore[arg-type]
        (lambda: planner_configs(page_size=16), "page_size=16 must be a strategy"),  # type: ignore[arg-type]
        (lambda: schedules(min_size=0), "min_size=0 must be >= 1"),
        (lambda: schedules(min_size=3, max_size=2), "min_size=3 must be <= max_size=2"),
        (lambda: schedules(configs=PlannerConfig(max_num_batched_tokens=8)), "configs="),  # type: ignore[arg-type]
        (lambda: schedules(allow_prefix_hits=1), "allow_prefix_hits=1 must be a bool"),  # type: ignore[arg-type]
        (lambda: prefill_states(min_size=-1), "min_size=-1 must be >= 0"),
        (lambda: prefill_states(max_size=-1), "max_size=-1 must be >= 0"),
        (lambda: prefill_states(request_ids=1), "request_ids=1 must be a strategy"),  # type: ignore[arg-type]
    ],
)
def test_bad_arguments_raise_invalid_argument_at_once(
    make: Callable[[], object], message: str
) -> None:
    with pytest.raises(InvalidArgument, match=message.replace("(", r"\(")):
        make()


def test_strategies_passed_that_yield_an_invalid_config_raise_when_drawn() -> None:
    configs = planner_configs(max_num_batched_tokens=st.just(8), page_size=st.just(16))
    with pytest.raises(InvalidArgument, match="'page_size' must be <= the largest chunk"):
        reaches(configs, lambda _: True)


# -- edge cases are reachable -------------------------------------------------------------------


@pytest.mark.parametrize(
    "condition",
    [
        lambda c: c.max_num_batched_tokens == 1,
        lambda c: c.page_size is not None and c.page_size == c.chunk_cap > 1,
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
        lambda s: any(r.is_started for r in s.values()),
        lambda s: s.policy == "round_robin" and len(s) > 1,
        lambda s: s.policy == "packed" and any(not r.is_started for r in s.values()),
        lambda s: any(r.num_computed_tokens and not r.is_started for r in s.values()),
    ],
)
def test_prefill_states_reach_every_edge(condition: Callable[[PrefillState[Any]], bool]) -> None:
    reaches(prefill_states(configs=planner_configs()), condition)


# -- shrinking to small examples ------------------------------------------------------------------


def test_prompt_lengths_shrink_to_the_smallest_length_that_fails() -> None:
    assert smallest(prompt_lengths(min_value=5), lambda n: n > 100) == 101


def test_planner_configs_shrink_to_the_simplest_config() -> None:
    config = smallest(planner_configs(), lambda c: c.page_size is not None)
    assert config == PlannerConfig(max_num_batched_tokens=1, page_size=1)


def test_schedules_shrink_to_a_few_tokens_under_a_tiny_budget() -> None:
    schedule = smallest(schedules(), lambda s: s.num_dispatches >= 3)
    assert schedule.num_requests <= 3
    assert schedule.num_tokens <= 6
    assert schedule.config.max_num_batched_tokens <= 2
    assert schedule.config.page_size is None
    assert schedule.config.max_num_seqs is None


def test_prefill_states_shrink_to_one_short_started_request() -> None:
    config = PlannerConfig(max_num_batched_tokens=4, policy="packed")
    state = smallest(
        prefill_states(configs=st.just(config)), lambda s: any(r.is_started for r in s.values())
    )
    assert len(state) == 1
    (request,) = state.values()
    assert request.prompt_length <= 3
    assert request.is_started


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
