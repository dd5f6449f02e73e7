"""pypto_sched as vLLM V1's scheduler, on vLLM's own ``Scheduler`` stepped without a model.

The oracles are outside: vLLM's stock ``Scheduler`` on the same workloads, and the offline
planner ``plan_prefill`` (the steps vLLM runs under our scheduler, with no decodes, are its
dispatches). vLLM's own scheduler tests judge the rest (``make test-vllm``, .ci/vllm/). These
tests need vLLM and skip without it (the main environment has none; ``make test-vllm``
runs them in ``.venv-vllm``).
"""

from __future__ import annotations

import os
import random
import re
from typing import Any

import pytest

# vLLM finds no accelerator here: its CPU platform (set before vLLM is imported).
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
pytest.importorskip("vllm", reason="the vLLM integration needs vLLM (make test-vllm)")

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.request import RequestStatus
from vllm_driver import BLOCK_SIZE, Driver, Knobs, build, stock

import pypto_sched
from pypto_sched import InvalidConfigError, PlannerConfig, PrefillState, plan_prefill
from pypto_sched.integrations import vllm as integration
from pypto_sched.integrations.vllm import (
    SUPPORTED_VLLM_VERSIONS,
    AsyncPackedScheduler,
    AsyncRoundRobinScheduler,
    PackedScheduler,
    RoundRobinScheduler,
    check_vllm_version,
    planner_config_from_vllm,
    scheduler_class,
)

OURS = {"packed": PackedScheduler, "round_robin": RoundRobinScheduler}


# -- construction --------------------------------------------------------------------------


def test_the_installed_vllm_is_a_supported_release() -> None:
    assert check_vllm_version() in SUPPORTED_VLLM_VERSIONS


@pytest.mark.parametrize("version", ["0.31.0", "0.34.0", "0.33.1", "1.0"])
def test_other_vllm_releases_are_refused(version: str) -> None:
    with pytest.raises(InvalidConfigError, match=re.escape("'vllm' must be one of")):
        check_vllm_version(version)


def test_a_local_build_label_is_the_release() -> None:
    assert check_vllm_version("0.32.0+cpu") == "0.32.0"


def test_construction_refuses_an_unsupported_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(integration, "_vllm_version", "0.31.0")
    with pytest.raises(InvalidConfigError, match=r"0\.31\.0"):
        build(PackedScheduler, Knobs())


def test_an_unknown_policy_is_refused() -> None:
    with pytest.raises(InvalidConfigError, match=r"'policy' must be one of .*'fifo'") as caught:
        scheduler_class("fifo")  # type: ignore[arg-type]
    assert caught.value.parameter == "policy"


@pytest.mark.parametrize("name", ["asynchronous", "align_to_blocks"])
def test_a_setting_that_is_not_a_bool_is_refused_by_name(name: str) -> None:
    with pytest.raises(InvalidConfigError, match=rf"'{name}' must be a bool: 'yes'") as caught:
        scheduler_class("packed", **{name: "yes"})  # type: ignore[arg-type]
    assert caught.value.parameter == name


def test_a_partial_prefill_limit_is_refused_under_round_robin() -> None:
    with pytest.raises(InvalidConfigError, match="max_num_partial_prefills"):
        scheduler_class("round_robin", max_num_partial_prefills=2)


@pytest.mark.parametrize("policy", ["packed", "round_robin"])
def test_requests_start_in_vllms_priority_order(policy: str) -> None:
    """Under vLLM's ``policy="priority"`` the planner starts requests in vLLM's order:
    priority first, then arrival."""
    knobs = Knobs(policy="priority", max_num_batched_tokens=64, max_num_seqs=2)
    driver = Driver(build(OURS[policy], knobs))
    priorities = [3, 0, 2, 0, 1]
    for index, priority in enumerate(priorities):
        driver.add(str(index), 40, priority=priority)
    driver.run(max_steps=200)
    first = [driver.rows[request_id][0][0] for request_id in ["1", "3", "4", "2", "0"]]
    assert first == sorted(first)
    assert first[0] < first[-1]


def test_without_chunked_prefill_prompts_run_whole() -> None:
    knobs = Knobs(enable_chunked_prefill=False, max_num_batched_tokens=1 << 15)
    driver = Driver(build(PackedScheduler, knobs))
    lengths = {str(i): n for i, n in enumerate([9000, 20000, 5000, 12000])}
    for request_id, length in lengths.items():
        driver.add(request_id, length, max_tokens=2)
    driver.run(max_steps=50)
    for request_id, rows in driver.rows.items():
        assert rows[0][1:] == (0, lengths[request_id])  # the prompt whole, then decodes


@pytest.mark.parametrize("when", ["built", "later"])
def test_the_planner_answers_vllms_hook_unless_a_drafter_needs_vllms_rule_after_it(
    monkeypatch: pytest.MonkeyPatch, when: str
) -> None:
    knobs = Knobs(max_num_batched_tokens=64)
    plain = Driver(build(PackedScheduler, knobs))
    plain.add("a", 64, max_tokens=1)
    plain.step()
    assert plain.steps[-1] == {"a": 64}
    assert "a" in plain.finished
    scheduler = plain.scheduler
    assert scheduler._reserve_prefill_lookahead == scheduler._planner.chunk  # a call a request
    # A multi-module MTP drafter reads 3 prompt tokens ahead: no chunk may end within 3
    # tokens of the prompt's end, vLLM's rule, applied after the planner's. vLLM sets it when
    # it builds the scheduler; its own tests also set it afterwards.
    if when == "built":
        config_class = type(scheduler.vllm_config)
        monkeypatch.setattr(config_class, "num_prefill_lookahead_tokens", property(lambda _: 3))
        driver = Driver(build(PackedScheduler, knobs))
    else:
        driver = plain
        driver.scheduler.num_prefill_lookahead = 3
    assert driver.scheduler.num_prefill_lookahead == 3
    driver.add("b", 66, max_tokens=1)
    driver.step()
    assert driver.steps[-1] == {"b": 63}  # the planner's 64, less 1: 3 tokens are left


def test_a_subclass_that_overrides_vllms_hook_is_asked() -> None:
    asked: list[str] = []

    class Counting(PackedScheduler):
        def _reserve_prefill_lookahead(
            self, request: Any, num_computed_tokens: int, num_new_tokens: int
        ) -> int:
            asked.append(request.request_id)
            return super()._reserve_prefill_lookahead(request, num_computed_tokens, num_new_tokens)

    driver = Driver(build(Counting, Knobs(max_num_batched_tokens=64)))
    driver.add("a", 66, max_tokens=1)
    driver.step()
    assert asked == ["a"]
    assert driver.steps[-1] == {"a": 64}


def test_a_config_the_planner_refuses_is_refused_with_vllms_names() -> None:
    # Blocks of 16 tokens cannot be whole in chunks of at most 8.
    aligned = scheduler_class("packed", align_to_blocks=True)
    with pytest.raises(InvalidConfigError, match=r"vLLM's scheduler config .*'chunk_alignment'"):
        build(aligned, Knobs(long_prefill_token_threshold=8))


def test_vllms_knobs_map_onto_the_planner_config() -> None:
    scheduler = build(
        scheduler_class("packed", align_to_blocks=True, max_num_partial_prefills=3),
        Knobs(max_num_batched_tokens=512, long_prefill_token_threshold=64, max_num_seqs=7),
    )
    assert scheduler.planner_config == PlannerConfig(
        max_num_batched_tokens=512,
        long_prefill_token_threshold=64,
        max_num_seqs=7,
        chunk_alignment=BLOCK_SIZE,
        policy="packed",
        max_num_partial_prefills=3,
    )
    # vLLM's own threshold is off inside the scheduler; the engine's config is untouched.
    assert scheduler.scheduler_config.long_prefill_token_threshold == 0
    assert scheduler.vllm_config.scheduler_config.long_prefill_token_threshold == 64


def test_a_threshold_of_0_is_off() -> None:
    config = planner_config_from_vllm(
        build(stock(), Knobs()).vllm_config, block_size=BLOCK_SIZE, policy="round_robin"
    )
    assert config.long_prefill_token_threshold is None
    assert config.chunk_alignment is None


def test_the_async_classes_are_vllms_async_schedulers() -> None:
    for cls in (AsyncPackedScheduler, AsyncRoundRobinScheduler):
        assert issubclass(cls, AsyncScheduler)
    assert issubclass(scheduler_class("packed", asynchronous=True), AsyncScheduler)
    assert not issubclass(PackedScheduler, AsyncScheduler)


# -- the planner decides ---------------------------------------------------------------------


@pytest.mark.parametrize("policy", ["packed", "round_robin"])
@pytest.mark.parametrize(
    ("lengths", "knobs"),
    [
        ([300, 50, 700, 20, 129, 400], Knobs(long_prefill_token_threshold=64)),
        ([3338] * 4, Knobs(max_num_batched_tokens=1024, long_prefill_token_threshold=256)),
        ([5, 9, 17, 33, 65, 129, 257], Knobs(max_num_batched_tokens=96, max_num_seqs=3)),
    ],
)
def test_the_steps_vllm_runs_are_the_planners_dispatches(
    policy: str, lengths: list[int], knobs: Knobs
) -> None:
    """With every request at once and no decodes (one token each), vLLM runs exactly the
    dispatches of ``plan_prefill`` with the same knobs."""
    driver = Driver(build(OURS[policy], knobs))
    for index, length in enumerate(lengths):
        driver.add(str(index), length)
    driver.run()
    config = driver.scheduler.planner_config
    schedule = plan_prefill(lengths, config)
    expected = [
        {str(int(r)): int(n) for r, n in zip(d.requests, d.lengths, strict=True)}
        for d in schedule.dispatches
    ]
    # (vLLM takes one more, empty, step to report the last finished requests.)
    assert [step for step in driver.steps if step] == expected


WORKLOADS = {
    "long prompts": [1200, 900, 2000, 1500, 700, 2600],
    "mixed": [40, 1800, 90, 60, 2500, 30, 700, 20],
}


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_packed_takes_no_more_steps_than_vllm(name: str) -> None:
    lengths = WORKLOADS[name]
    knobs = Knobs(max_num_batched_tokens=512, long_prefill_token_threshold=128)
    steps = {}
    for label, cls in (("stock", stock()), ("packed", PackedScheduler)):
        driver = Driver(build(cls, knobs))
        for index, length in enumerate(lengths):
            driver.add(str(index), length, max_tokens=4)
        steps[label] = driver.run()
    assert steps["packed"] <= steps["stock"]


def test_packed_takes_no_more_steps_than_vllm_with_arrivals_and_preemption() -> None:
    """Requests arriving over 60 steps into a KV cache small enough that vLLM refuses
    admissions and preempts: ``packed`` takes no more steps than vLLM. (A refused admission
    used to make the next step plan the started requests only, under ``packed`` too, where
    they had run anyway: a step lost when the next step had the blocks.)"""
    rng = random.Random(7)
    arrivals = [(rng.randint(0, 60), rng.choice([40, 300, 1500, 4000])) for _ in range(120)]
    knobs = Knobs(
        max_num_batched_tokens=1024,
        long_prefill_token_threshold=256,
        max_num_seqs=32,
        num_blocks=1200,
    )
    steps = {}
    for label, cls in (("stock", stock()), ("packed", PackedScheduler)):
        driver = Driver(build(cls, knobs))
        for step in range(61):
            for index, (arrival, length) in enumerate(arrivals):
                if arrival == step:
                    driver.add(str(index), length, max_tokens=16, fill=index)
            driver.step()
        driver.run()
        assert driver.finished == {str(index) for index in range(len(arrivals))}
        steps[label] = sum(1 for scheduled in driver.steps if scheduled)
    assert steps["packed"] <= steps["stock"]


# -- lifecycle -------------------------------------------------------------------------------


def check_in_step(driver: Driver) -> None:
    """The planner's state holds exactly the requests vLLM has with prefill left, where vLLM
    has them, and every step keeps to the dispatch's limits."""
    scheduler = driver.scheduler
    state = scheduler.prefill_state
    config = scheduler.planner_config
    for request_id in state:
        request = scheduler.requests[request_id]
        assert state[request_id].prompt_length == request.num_tokens
        assert state[request_id].num_computed_tokens == request.num_computed_tokens
    for request_id, request in scheduler.requests.items():
        if request.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED):
            assert request_id in state
    step = driver.steps[-1] if driver.steps else {}
    assert sum(step.values()) <= config.max_num_batched_tokens
    assert len(step) <= (config.max_num_seqs or len(step))


@st.composite
def runs(draw: st.DrawFn) -> dict[str, Any]:
    policy = draw(st.sampled_from(["packed", "round_robin"]))
    align = draw(st.booleans())
    threshold = draw(st.sampled_from([0, 32, 48, 100]))
    if align and threshold and threshold < BLOCK_SIZE:
        threshold = BLOCK_SIZE
    return {
        "policy": policy,
        "align": align,
        "knobs": Knobs(
            max_num_batched_tokens=draw(st.sampled_from([64, 128, 200])),
            long_prefill_token_threshold=threshold,
            max_num_seqs=draw(st.integers(2, 6)),
            num_blocks=draw(st.integers(24, 80)),
        ),
        # (arrival step, prompt length, tokens to generate, abort at step or None)
        "requests": draw(
            st.lists(
                st.tuples(
                    st.integers(0, 6),
                    st.integers(1, 300),
                    st.integers(1, 6),
                    st.none() | st.integers(0, 12),
                ),
                min_size=1,
                max_size=10,
            )
        ),
    }


def drive(cls: type[Any], run: dict[str, Any]) -> tuple[Driver, list[tuple[Any, ...]]]:
    """Step a scheduler of ``cls`` through ``run`` (arrivals and aborts) until it drains
    (3,000 steps at most), checking every step; with what each step scheduled, preempted
    and finished."""
    driver = Driver(build(cls, run["knobs"]))
    requests = run["requests"]
    outcomes: list[tuple[Any, ...]] = []
    step = 0
    while step < 3000:
        for index, (arrival, length, max_tokens, _) in enumerate(requests):
            if arrival == step:
                driver.add(str(index), length, max_tokens=max_tokens, fill=index)
        for index, (_, _, _, abort) in enumerate(requests):
            request_id = str(index)
            if abort == step and request_id in driver.scheduler.requests:
                driver.abort(request_id)
                assert request_id not in driver.scheduler.prefill_state
        if step > 6 and not driver.scheduler.has_requests():
            break
        output = driver.step()
        check_in_step(driver)
        outcomes.append(
            (driver.steps[-1], sorted(output.preempted_req_ids or ()), sorted(driver.finished))
        )
        step += 1
    return driver, outcomes


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(run=runs())
def test_every_request_finishes_and_the_state_follows_vllm(run: dict[str, Any]) -> None:
    """Arrivals over time, decodes, a KV cache small enough to preempt and aborts (mid-
    prefill too): no request is lost or stuck, the planner's state is vLLM's after every
    step, every step keeps to the limits, and aligned chunks end on KV blocks."""
    driver, _ = drive(scheduler_class(run["policy"], align_to_blocks=run["align"]), run)
    assert not driver.scheduler.has_requests(), "a request is stuck"
    assert not driver.scheduler.prefill_state
    lengths = {str(index): length for index, (_, length, _, _) in enumerate(run["requests"])}
    assert driver.finished == set(lengths)
    if run["align"]:
        for request_id, rows in driver.rows.items():
            for _, start, tokens in rows:
                end = start + tokens
                if end < lengths[request_id]:  # a non-final prefill chunk
                    assert end % BLOCK_SIZE == 0, (request_id, rows)


def asked_about_every_request(cls: type[Any]) -> type[Any]:
    """``cls`` with vLLM's hook overridden by a plain call of its own: vLLM asks it about
    every request it schedules, and nothing is parked."""

    class Asked(cls):  # type: ignore[misc]
        def _reserve_prefill_lookahead(
            self, request: Any, num_computed_tokens: int, num_new_tokens: int
        ) -> int:
            return int(
                super()._reserve_prefill_lookahead(request, num_computed_tokens, num_new_tokens)
            )

    return Asked


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(run=runs(), asynchronous=st.booleans())
def test_parking_the_passed_over_requests_changes_no_step(
    run: dict[str, Any], asynchronous: bool
) -> None:
    """vLLM passes over a parked request as it would on the hook's 0: every step schedules,
    preempts and finishes the same as when vLLM asks a subclass's hook about every request
    (which turns parking off)."""
    cls = scheduler_class(run["policy"], align_to_blocks=run["align"], asynchronous=asynchronous)
    parked: list[int] = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(integration._Planner, "park_passed_over", noting_parked(parked))
        driver, outcomes = drive(cls, run)
        num_parked = sum(parked)
        event(f"requests parked: {'some' if num_parked else 'none'}")
        asked, asked_outcomes = drive(asked_about_every_request(cls), run)
    assert sum(parked) == num_parked  # none under a subclass's hook
    assert outcomes == asked_outcomes
    assert asked.finished == driver.finished


def noting_parked(
    counts: list[int], parked_in: dict[int, set[str]] | None = None, driver: Driver | None = None
) -> Any:
    """``_Planner.park_passed_over``, noting how many requests each call parks in
    ``counts`` (and which in ``parked_in``, by ``driver``'s step)."""
    park = integration._Planner.park_passed_over

    def noting(planner: Any, running: list[Any], parked: list[tuple[Any, int]]) -> None:
        park(planner, running, parked)
        counts.append(len(parked))
        if parked_in is not None and driver is not None:
            parked_in[len(driver.steps)] = {request.request_id for request, _ in parked}

    return noting


@pytest.mark.parametrize("num_blocks", [4096, 30])
def test_round_robins_waiting_turns_are_parked_and_given_back(
    monkeypatch: pytest.MonkeyPatch, num_blocks: int
) -> None:
    """Under ``round_robin`` the started requests waiting for their turn are parked in the
    steps they wait, none that runs, and each has its own ``next_decode_eligible_step``
    back after the step; with a KV cache small enough to preempt, vLLM preempts parked
    requests too."""
    knobs = Knobs(max_num_batched_tokens=64, long_prefill_token_threshold=32, num_blocks=num_blocks)
    driver = Driver(build(RoundRobinScheduler, knobs))
    parked_in: dict[int, set[str]] = {}  # step -> the requests parked in it
    monkeypatch.setattr(
        integration._Planner, "park_passed_over", noting_parked([], parked_in, driver)
    )
    requests = driver.scheduler.requests
    own: dict[str, int] = {}
    for index in range(6):
        driver.add(str(index), 100, max_tokens=8)
        own[str(index)] = requests[str(index)].next_decode_eligible_step = -index  # (<= any step)
    preempted_parked: set[str] = set()
    while driver.scheduler.has_requests():
        output = driver.step()
        for request_id, request in requests.items():
            assert request.next_decode_eligible_step == own[request_id]
        preempted_parked |= set(output.preempted_req_ids or ()) & parked_in.get(
            len(driver.steps) - 1, set()
        )
        assert len(driver.steps) < 300
    assert driver.finished == set(own)
    assert max(map(len, parked_in.values())) >= 4
    for step, ids in parked_in.items():
        assert not ids & set(driver.steps[step])
        started = {request_id for request_id, rows in driver.rows.items() if rows[0][0] < step}
        assert ids <= started
    assert bool(preempted_parked) == (num_blocks < 100)


@pytest.mark.parametrize("cls", [PackedScheduler, RoundRobinScheduler, AsyncPackedScheduler])
def test_a_request_aborted_mid_prefill_leaves_and_the_rest_finish(cls: type[Any]) -> None:
    driver = Driver(build(cls, Knobs(max_num_batched_tokens=64, long_prefill_token_threshold=32)))
    for index, length in enumerate([200, 150, 90]):
        driver.add(str(index), length, max_tokens=3)
    driver.step()
    assert driver.scheduler.requests["0"].num_computed_tokens > 0  # part-way
    driver.abort("0")
    assert "0" not in driver.scheduler.prefill_state
    driver.run(max_steps=200)
    assert driver.finished == {"0", "1", "2"}


def test_preempted_requests_come_back_first_and_finish() -> None:
    knobs = Knobs(max_num_batched_tokens=128, long_prefill_token_threshold=64, num_blocks=20)
    driver = Driver(build(PackedScheduler, knobs))
    for index, length in enumerate([120, 110, 100]):
        driver.add(str(index), length, max_tokens=40)
    preempted = 0
    while driver.scheduler.has_requests():
        output = driver.step()
        check_in_step(driver)
        preempted += len(output.preempted_req_ids or ())
        assert len(driver.steps) < 500
    assert preempted > 0
    assert driver.finished == {"0", "1", "2"}


# -- cost ------------------------------------------------------------------------------------


@pytest.mark.parametrize("policy", ["packed", "round_robin"])
def test_a_step_that_ran_as_planned_takes_the_plans_state(
    policy: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Applying a plan to the state it was made from gives ``plan.state``: a step in which
    every planned row ran as planned, and nothing joined or left meanwhile, takes it without
    applying the plan again (the planner's state lives across steps, never rebuilt).
    (Steps where vLLM runs other chunks apply what ran: the lifecycle tests above.)"""
    planned: list[int] = []
    applied: list[int] = []
    apply = PrefillState.apply

    def counting_plan_step(*args: Any, **kwargs: Any) -> Any:
        plan = pypto_sched.plan_step(*args, **kwargs)
        planned.append(len(plan.rows))
        return plan

    def counting_apply(self: Any, plan: Any) -> Any:
        applied.append(len(plan.rows))
        return apply(self, plan)

    monkeypatch.setattr(integration, "plan_step", counting_plan_step)
    monkeypatch.setattr(PrefillState, "apply", counting_apply)
    knobs = Knobs(max_num_batched_tokens=256, long_prefill_token_threshold=64)
    driver = Driver(build(OURS[policy], knobs))
    lengths = [300, 50, 700, 20, 129, 400, 90, 1000]
    for index, length in enumerate(lengths):
        driver.add(str(index), length, max_tokens=4)
    while driver.scheduler.has_requests():
        driver.step()
        check_in_step(driver)
        assert len(driver.steps) < 500
    assert driver.finished == {str(index) for index in range(len(lengths))}
    assert sum(map(bool, planned)) > 5
    assert applied == []
