"""``PrefillState`` and ``plan_step``: the contract of ``pypto_sched/core/_online.py``.

The properties drive a state through random histories of arrivals, removals, steps with
random reservations and steps applied to a state that changed while they ran, keep a plain
model of every request on the side, and check each step against it: the limits, the tiling
of each prompt, the fairness bounds stated in the header of ``pypto_sched/core/_policies.py`` and
the immutability of every state along the way.
"""

from __future__ import annotations

import copy
import functools
import itertools
import pickle
import re
import tracemalloc
from collections.abc import Callable, Hashable
from typing import Any

import attrs
import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from oracle import _admitted, _bound, _page_fill, _within_rows, oracle_plan

from pypto_sched import (
    CacheTooSmallError,
    Chunk,
    DuplicateRequestError,
    InvalidInputError,
    PagePool,
    PlannerConfig,
    PrefillRequest,
    PrefillState,
    Schedule,
    StepChunk,
    StepPlan,
    UnknownRequestError,
    plan_prefill,
    plan_step,
)
from pypto_sched.core._online import _step_plan, step_chunk
from pypto_sched.testing import (
    planner_configs,
    prefill_states,
    prefill_states_with_configs,
    schedules,
)

RR = PlannerConfig(max_num_batched_tokens=256)
PACKED = PlannerConfig(max_num_batched_tokens=256, policy="packed")
PACKED_64 = PlannerConfig(max_num_batched_tokens=64, policy="packed")

# A dispatch as plain rows: (request, start, length, is_final).
Rows = list[tuple[Hashable, int, int, bool]]


def drain(state: PrefillState[Any], config: PlannerConfig) -> list[Rows]:
    """Step ``state`` until it is empty; every dispatch's rows."""
    dispatches = []
    while state:
        plan = plan_step(state, config)
        assert plan.rows, "a step with room and requests must make progress"
        dispatches.append([(r, c.start, c.length, c.is_final) for r, c in plan.rows.items()])
        state = plan.state
    return dispatches


def schedule_rows(schedule: Schedule) -> list[Rows]:
    return [
        [(c.request, c.start, c.length, c.is_final) for c in dispatch.rows]
        for dispatch in schedule.dispatches
    ]


def snapshot(state: PrefillState[Any]) -> tuple[object, ...]:
    return (tuple(state.items()), state.policy, state.num_tokens, len(state))


# -- equivalence with plan_prefill ----------------------------------------------------------


@given(schedules())
@example(
    plan_prefill(
        [3338] * 16, PlannerConfig(max_num_batched_tokens=8192, long_prefill_token_threshold=256)
    )
)
@example(
    plan_prefill(
        [3338] * 16,
        PlannerConfig(
            max_num_batched_tokens=8192,
            long_prefill_token_threshold=256,
            max_num_seqs=16,
            policy="packed",
        ),
    )
)
def test_stepping_until_empty_gives_the_schedule_of_plan_prefill(schedule: Schedule) -> None:
    state = PrefillState.from_prompt_lengths(
        schedule.prompt_lengths, num_computed_tokens=schedule.num_computed_tokens
    )
    assert drain(state, schedule.config) == schedule_rows(schedule)


def test_the_seed_case_steps_through_224_dispatches_and_packed_through_14() -> None:
    state = PrefillState.from_prompt_lengths([3338] * 16)
    seed = PlannerConfig(max_num_batched_tokens=8192, long_prefill_token_threshold=256)
    packed = attrs.evolve(seed, max_num_seqs=16, policy="packed")
    assert len(drain(state, seed)) == 224
    assert len(drain(state, packed)) == 14


# -- random histories: limits, tiling, fairness, immutability -------------------------------


@attrs.define
class Model:
    """What the test knows of one request, kept independently of the state."""

    arrival: int
    length: int
    position: int
    started: bool = False
    #: round_robin: other requests in the state when it was last queued, and the dispatches
    #: with rows it has waited since.
    queued_behind: int = 0
    waited: int = 0
    #: packed: tokens the older started requests had left when it started, and the
    #: dispatches that skipped it since.
    older_tokens: int = 0
    skipped: int = 0


@attrs.define
class History:
    config: PlannerConfig
    #: Whether steps may reserve room (the packed skip count is bounded only without).
    reserve: bool
    state: PrefillState[int] = attrs.field(factory=PrefillState)
    model: dict[int, Model] = attrs.field(factory=dict)
    arrivals: int = 0
    snapshots: list[tuple[PrefillState[int], tuple[object, ...]]] = attrs.field(factory=list)

    def remember(self) -> None:
        self.check_state()  # after every action, an add or a removal as well as a step
        self.snapshots.append((self.state, snapshot(self.state)))

    def add(self, length: int, cached: int) -> None:
        request_id = self.arrivals
        self.state = self.state.add(request_id, length, num_computed_tokens=cached)
        self.model[request_id] = Model(
            arrival=self.arrivals, length=length, position=cached, queued_behind=len(self.model)
        )
        self.arrivals += 1

    def remove(self, request_id: int) -> None:
        self.state = self.state.remove(request_id)
        del self.model[request_id]

    def arrive_and_abort(self, lengths: list[int], abort: int | None) -> None:
        for length in lengths:
            self.add(length, 0)
        if abort is not None:
            self.state = self.state.discard(abort)
            self.model.pop(abort, None)

    def step(
        self,
        reserved_tokens: int,
        reserved_rows: int,
        meanwhile: Callable[[], None] | None = None,
    ) -> StepPlan[int]:
        """Plan a step; with ``meanwhile``, make those changes while the dispatch runs and
        then apply the plan to the newer state."""
        config = self.config
        before = self.state
        plan = plan_step(
            before, config, reserved_tokens=reserved_tokens, reserved_rows=reserved_rows
        )
        # Decode tokens count against the whole budget; prefill stays within the effective
        # one; a reservation above the dispatch leaves no room.
        room_tokens = max(
            min(config.effective_budget, config.max_num_batched_tokens - reserved_tokens), 0
        )
        room_rows = (
            None if config.max_num_seqs is None else max(config.max_num_seqs - reserved_rows, 0)
        )
        # packed's work-conserving tail: a request alone, beside no decodes, may run the
        # whole budget. (Reserved rows count only where rows are limited.)
        rows_reserved = reserved_rows if config.max_num_seqs is not None else 0
        alone = len(before) == 1 and reserved_tokens == rows_reserved == 0
        cap = config.max_num_batched_tokens if alone and config.policy == "packed" else None
        self.check_rows(plan, room_tokens, room_rows, cap or config.chunk_cap)
        # A dispatch kept to the bound may hold older requests back (the fairness bounds are
        # for the greedy fill); it must then lower the bound by one.
        kept = config.policy == "packed" and self.kept_to_the_bound(
            before, plan, reserved_tokens, room_rows
        )
        if config.policy == "packed" and not kept:
            self.check_packed_skips(plan, room_tokens, room_rows)
        if meanwhile is None:
            self.state = plan.state
        else:
            meanwhile()
            self.state = self.state.apply(plan)
        for request_id, chunk in plan.rows.items():
            model = self.model.get(request_id)
            if model is None:  # removed while the dispatch ran
                continue
            model.position = chunk.end
            if chunk.is_final:
                del self.model[request_id]
        if plan.rows:
            self.count_waits(plan, kept)
        self.check_state()
        return plan

    def kept_to_the_bound(
        self,
        before: PrefillState[int],
        plan: StepPlan[int],
        reserved_tokens: int,
        room_rows: int | None,
    ) -> bool:
        """Whether ``plan`` is not the greedy fill (the oracle's, from ``before``); if so,
        check that it lowers the docs' bound by one."""
        config = self.config
        order = list(before)
        if reserved_tokens or len(order) < 2:
            return False
        size = max(order) + 1
        position, lengths = [0] * size, [0] * size
        for r in order:
            position[r] = before[r].num_computed_tokens
            lengths[r] = before[r].prompt_length
        num_started = sum(before[r].is_started for r in order)
        budget, cap = config.max_num_batched_tokens, config.chunk_cap
        sizes = _page_fill(
            order,
            position,
            lengths,
            [0] * len(order),
            num_started,
            cap,
            budget,
            config.chunk_alignment or 1,
        )
        assert sizes is not None
        left = [lengths[r] - position[r] for r in order]
        sizes = _within_rows(sizes, num_started, len(order) if room_rows is None else room_rows)
        sizes = _admitted(sizes, left, num_started, config.max_num_partial_prefills or len(order))
        greedy = {r: n for r, n in zip(order, sizes, strict=True) if n}
        if greedy == {r: chunk.length for r, chunk in plan.rows.items()}:
            return False
        ran = [plan.rows[r].length if r in plan.rows else 0 for r in order]
        after = [a - b for a, b in zip(left, ran, strict=True)]
        rows = config.max_num_seqs
        assert _bound(after, budget, cap, rows) <= _bound(left, budget, cap, rows) - 1
        return True

    def check_rows(
        self, plan: StepPlan[int], room_tokens: int, room_rows: int | None, cap: int
    ) -> None:
        config = self.config
        assert plan.num_tokens <= room_tokens
        assert room_rows is None or plan.num_rows <= room_rows
        arrivals = [self.model[r].arrival for r in plan.rows]
        assert arrivals == sorted(arrivals), "rows run in arrival order"
        for request_id, chunk in plan.rows.items():
            model = self.model[request_id]
            assert chunk.start == model.position, "chunks tile the prompt"
            assert 1 <= chunk.length <= cap
            assert chunk.is_final == (chunk.end == model.length)
            if config.chunk_alignment is not None and not chunk.is_final:
                assert chunk.end % config.chunk_alignment == 0
        if not plan.rows:
            assert plan.state is self.state

    def check_packed_skips(
        self, plan: StepPlan[int], room_tokens: int, room_rows: int | None
    ) -> None:
        """A started request yields only to older started requests, which fill every free
        row or take more than ``room - page`` tokens."""
        page = self.config.chunk_alignment or 1
        started = sorted((m.arrival, r) for r, m in self.model.items() if m.started)
        for index, (_, request_id) in enumerate(started):
            if request_id in plan.rows:
                continue
            older = [r for _, r in started[:index] if r in plan.rows]
            older_tokens = sum(plan.rows[r].length for r in older)
            assert (
                room_rows == 0
                or (room_rows is not None and len(older) == room_rows)
                or older_tokens > room_tokens - page
            ), f"request {request_id} skipped without older started requests filling the step"

    def count_waits(self, plan: StepPlan[int], kept: bool = False) -> None:
        if self.config.policy == "round_robin":
            for request_id, model in self.model.items():
                if request_id in plan.rows:
                    model.queued_behind, model.waited = len(self.model) - 1, 0
                else:
                    model.waited += 1
                    assert model.waited <= model.queued_behind, (
                        f"request {request_id} waited {model.waited} dispatches behind "
                        f"{model.queued_behind} requests"
                    )
            return
        for request_id, model in self.model.items():
            if request_id not in plan.rows:
                model.skipped += model.started and not kept
                if model.started and not self.reserve:
                    bound = packed_skip_bound(self.config, model.older_tokens)
                    if self.config.chunk_alignment is None:
                        bound = 0  # the stronger claim: never skipped
                    assert model.skipped <= bound, (
                        f"request {request_id} skipped {model.skipped} times; older started "
                        f"requests had {model.older_tokens} tokens left"
                    )
            elif not model.started:
                model.started = True
                model.older_tokens = sum(
                    m.length - m.position
                    for m in self.model.values()
                    if m.started and m.arrival < model.arrival
                )

    def check_state(self) -> None:
        state = self.state
        assert len(state) == len(self.model)
        assert state.num_tokens == sum(m.length - m.position for m in self.model.values())
        for request_id, model in self.model.items():
            assert state[request_id].num_computed_tokens == model.position
        if self.config.max_num_partial_prefills is not None:
            started = sum(request.is_started for request in state.values())
            assert started <= self.config.max_num_partial_prefills
        # Every record of the map has one live entry in the queue: a step reads the head
        # without a lookup when the queue is no longer than the map (_next_waiting).
        requests, queue = state._requests, state._queue
        live = [record.id for record in queue if requests.get(record.id) is record]
        assert sorted(live) == sorted(key for key, _ in requests.items())


def run_history(data: st.DataObject, config: PlannerConfig, *, reserve: bool) -> History:
    history = History(config, reserve)
    longest = 4 * config.chunk_cap
    for _ in range(data.draw(st.integers(min_value=0, max_value=40), label="actions")):
        action = data.draw(
            st.sampled_from(["add", "add", "remove", "step", "step", "step", "overlap"])
        )
        if action == "add":
            length = data.draw(st.integers(min_value=1, max_value=longest))
            history.add(length, data.draw(st.integers(min_value=0, max_value=length - 1)))
        elif action == "remove" and history.model:
            history.remove(data.draw(st.sampled_from(sorted(history.model))))
        elif action == "step":
            tokens = rows = 0
            if reserve:
                # Up to one past the budget and the rows: reservations above them clamp.
                budget = config.max_num_batched_tokens
                tokens = data.draw(st.integers(min_value=0, max_value=budget + 1))
                rows = data.draw(st.integers(min_value=0, max_value=(config.max_num_seqs or 2) + 1))
            history.step(tokens, rows)
        elif action == "overlap":  # arrivals and an abort while a dispatch runs
            lengths = data.draw(st.lists(st.integers(min_value=1, max_value=longest), max_size=2))
            abort = data.draw(st.none() | st.sampled_from(sorted(history.model) or [-1]))
            history.step(0, 0, functools.partial(history.arrive_and_abort, lengths, abort))
        history.remember()
    return history


@given(planner_configs(), st.data())
def test_every_step_keeps_the_limits_tiles_prompts_and_bounds_waits(
    config: PlannerConfig, data: st.DataObject
) -> None:
    history = run_history(data, config, reserve=True)
    while history.state:  # drain without reservations: everything finishes
        assert history.step(0, 0).rows
    assert not history.model


@given(planner_configs(), st.data())
def test_no_state_along_a_history_ever_changes(config: PlannerConfig, data: st.DataObject) -> None:
    history = run_history(data, config, reserve=True)
    for state, seen in history.snapshots:
        assert snapshot(state) == seen


@given(planner_configs(), st.data())
def test_without_reservations_waits_stay_within_the_stated_bounds(
    config: PlannerConfig, data: st.DataObject
) -> None:
    history = run_history(data, config, reserve=False)
    while history.state:
        history.step(0, 0)


def packed_skip_bound(config: PlannerConfig, older_tokens: int) -> int:
    """``T // min(M, R - p + 1)``: the packed bound of the rules' header, with no
    reservations (``R`` is the budget, ``M`` the row limit, ``p`` the page size or 1)."""
    per_skip = config.max_num_batched_tokens - (config.chunk_alignment or 1) + 1
    if config.max_num_seqs is not None:
        per_skip = min(per_skip, config.max_num_seqs)
    return older_tokens // per_skip


# -- fairness, by example -------------------------------------------------------------------


def test_a_stream_of_arrivals_does_not_starve_a_started_request() -> None:
    # One 60-token request arrives before every step, as many as a step can serve.
    def turns_of_the_long_request(config: PlannerConfig) -> list[int]:
        state: PrefillState[str] = PrefillState().add("long", 1000)
        turns = []
        for step in range(1, 1000):
            state = state.add(f"short-{step}", 60)
            plan = plan_step(state, config)
            state = plan.state
            if "long" in plan.rows:
                turns.append(step)
            if "long" in plan.finished:
                return turns
        raise AssertionError("the long request starved")

    # packed: started first, it runs 64 tokens in every step.
    assert turns_of_the_long_request(PACKED_64) == list(range(1, 17))
    # round_robin: it waits only for the requests queued before it. The queue grows by one
    # each time it runs (arrivals match the service rate), so its waits grow 1, 2, 3, ...
    turns = turns_of_the_long_request(PlannerConfig(max_num_batched_tokens=64))
    assert [later - turn for turn, later in itertools.pairwise(turns)] == list(range(2, 17))


def test_packed_skips_a_started_request_only_while_older_ones_fill_the_room() -> None:
    # A's prefix hit gives it a short first chunk, leaving B room to start; from then on A
    # runs a whole 16-token chunk per step and B waits, 5 times, within 84 // (16 - 8 + 1).
    # (Two dispatches: a bound above them keeps the greedy fill, see the next test.)
    config = PlannerConfig(max_num_batched_tokens=16, chunk_alignment=8, policy="packed")
    state = PrefillState().add("A", 100, num_computed_tokens=4)
    state = state.add("B", 100, num_computed_tokens=5).add("C", 1000)
    runs = []
    while "A" in state:
        plan = plan_step(state, config, reserved_tokens=0)
        runs.append("".join(plan.rows))
        state = plan.state
    assert runs == ["AB", "A", "A", "A", "A", "A", "AB"]
    assert packed_skip_bound(config, older_tokens=100 - 16) == 9


def test_with_pages_the_greedy_fill_stands_though_it_misses_the_bound() -> None:
    # A and B could take 12 dispatches, the bound: B running 16 tokens in each of the last 6
    # while A's last 4 wait. With pages the bound does not count page ends, and correcting by
    # it took more dispatches than the greedy fill on rare batches, so the greedy fill stands.
    config = PlannerConfig(max_num_batched_tokens=16, chunk_alignment=8, policy="packed")
    state = PrefillState().add("A", 100, num_computed_tokens=4)
    state = state.add("B", 100, num_computed_tokens=5)
    runs = []
    while state:
        plan = plan_step(state, config)
        runs.append([(r, c.start, c.length, c.is_final) for r, c in plan.rows.items()])
        state = plan.state
    greedy = oracle_plan([100, 100], config, [4, 5], greedy=True)
    assert runs == [[("AB"[r], *row) for r, *row in dispatch] for dispatch in greedy]
    schedule = plan_prefill([100, 100], config, num_computed_tokens=[4, 5])
    assert (schedule.num_dispatches, schedule.lower_bound) == (13, 12)


def test_keeping_to_the_bound_can_skip_a_started_request_for_arrivals() -> None:
    # docs/serving.md, Fairness: the started 27-token prompt "c" can finish alone at the end
    # with the whole budget, so when "d" and "e" arrive the dispatch kept to the bound runs
    # them and not "c"; without the arrivals (the greedy fill keeps to the bound) "c" runs.
    config = PlannerConfig(
        max_num_batched_tokens=5, long_prefill_token_threshold=2, policy="packed"
    )
    started = plan_step(PrefillState().add("a", 2).add("b", 4).add("c", 27), config).state
    assert started["c"] == PrefillRequest(prompt_length=27, num_computed_tokens=1, is_started=True)
    assert list(plan_step(started, config).rows) == ["b", "c"]
    arrived = started.add("d", 4).add("e", 8)
    plan = plan_step(arrived, config)
    assert list(plan.rows) == ["b", "d", "e"]

    def bound(state: PrefillState[str]) -> int:
        left = [state[r].num_remaining_tokens for r in state]
        return _bound(left, config.max_num_batched_tokens, config.chunk_cap, None)

    assert bound(plan.state) == bound(arrived) - 1


def test_packed_serves_started_requests_first_then_admits_in_arrival_order() -> None:
    config = PlannerConfig(max_num_batched_tokens=100, policy="packed")
    state = PrefillState.from_prompt_lengths([150, 30, 30])
    plan = plan_step(state, config)
    assert plan.rows == {0: StepChunk(start=0, length=100, is_final=False)}
    plan = plan_step(plan.state.add(3, 5), config)
    assert list(plan.rows) == [0, 1, 2]  # started 0 first, then the oldest waiting
    assert plan.rows[0] == StepChunk(start=100, length=50, is_final=True)
    assert plan.rows[2] == StepChunk(start=0, length=20, is_final=False)
    assert list(plan.state) == [2, 3]  # started 2 is planned before waiting 3


def test_round_robin_arrivals_queue_behind_the_requests_already_there() -> None:
    config = PlannerConfig(max_num_batched_tokens=10)
    plan = plan_step(PrefillState.from_prompt_lengths([25, 25]), config)
    order = [list(plan.rows)]  # 0 ran and went behind 1
    state = plan.state.add(2, 5)  # 2 queues behind 0
    for _ in range(3):
        plan = plan_step(state, config)
        order.append(list(plan.rows))
        state = plan.state
    assert order == [[0], [1], [0], [2]]


# -- the whole-batch rule online --------------------------------------------------------------


def test_round_robin_runs_everything_at_once_only_when_a_run_begins() -> None:
    config = PlannerConfig(max_num_batched_tokens=256)
    state = PrefillState.from_prompt_lengths([100, 100, 100])  # 300 tokens: must split
    assert state.policy is None
    plan = plan_step(state, config)
    assert list(plan.rows) == [0]
    assert plan.state.policy == "round_robin"
    # 200 tokens left would fit, but the run keeps going one request per dispatch.
    plan = plan_step(plan.state, config)
    assert list(plan.rows) == [1]
    plan = plan_step(plan.state, config)
    assert list(plan.rows) == [2]
    assert not plan.state
    assert plan.state.policy is None
    plan = plan_step(plan.state.add(3, 100).add(4, 100), config)
    assert list(plan.rows) == [3, 4]
    assert not plan.state


def test_round_robin_whole_batch_counts_the_reserved_room() -> None:
    config = PlannerConfig(max_num_batched_tokens=256, max_num_seqs=4)
    state = PrefillState.from_prompt_lengths([100, 100])
    assert list(plan_step(state, config, reserved_tokens=56).rows) == [0, 1]
    assert list(plan_step(state, config, reserved_tokens=57).rows) == [0]
    assert list(plan_step(state, config, reserved_rows=3).rows) == [0]


# -- reservations -----------------------------------------------------------------------------


@pytest.mark.parametrize("config", [RR, PACKED])
def test_a_step_with_no_room_is_empty_and_keeps_the_state(config: PlannerConfig) -> None:
    state = PrefillState.from_prompt_lengths([10, 20])
    plan = plan_step(state, config, reserved_tokens=config.effective_budget)
    assert plan.rows == {}
    assert plan.num_rows == 0
    assert plan.num_tokens == 0
    assert plan.state is state
    rows_config = attrs.evolve(config, max_num_seqs=2)
    assert plan_step(state, rows_config, reserved_rows=2).state is state


def test_an_empty_state_plans_an_empty_step() -> None:
    state: PrefillState[int] = PrefillState()
    plan = plan_step(state, PACKED)
    assert plan.rows == {}
    assert plan.state is state
    assert plan.finished == ()


def test_round_robin_head_keeps_its_turn_when_no_page_fits_the_room() -> None:
    config = PlannerConfig(max_num_batched_tokens=64, chunk_alignment=16)
    state = plan_step(PrefillState.from_prompt_lengths([100, 3]), config).state
    assert list(state) == [1, 0]  # 0 ran first and went behind 1
    state = plan_step(state, config).state  # 1 finishes
    plan = plan_step(state.add(2, 3), config, reserved_tokens=60)  # 4 tokens: no page of 0
    assert plan.rows == {}
    assert list(plan_step(state.add(2, 3), config).rows) == [0]


def test_reserved_rows_are_ignored_without_a_row_limit() -> None:
    plan = plan_step(PrefillState.from_prompt_lengths([4, 4]), PACKED, reserved_rows=1000)
    assert plan.num_rows == 2
    # Nor do they turn off the work-conserving tail (or keeping to the bound).
    config = PlannerConfig(
        max_num_batched_tokens=2, long_prefill_token_threshold=1, policy="packed"
    )
    alone = PrefillState().add("a", 3)
    assert plan_step(alone, config, reserved_rows=1).rows == plan_step(alone, config).rows
    assert plan_step(alone, config).rows["a"].length == 2


@pytest.mark.parametrize("config", [RR, PACKED])
def test_reservations_above_the_dispatch_clamp_to_no_room(config: PlannerConfig) -> None:
    state = PrefillState.from_prompt_lengths([10, 20])
    assert plan_step(state, config, reserved_tokens=10**6).state is state
    rows_config = attrs.evolve(config, max_num_seqs=2)
    assert plan_step(state, rows_config, reserved_rows=3).state is state
    assert plan_step(state, rows_config, reserved_rows=1).num_rows == 1


def test_round_robin_decode_tokens_count_against_the_whole_budget_not_the_threshold() -> None:
    config = PlannerConfig(max_num_batched_tokens=1024, long_prefill_token_threshold=256)
    state = PrefillState.from_prompt_lengths([1000])
    # 700 decodes fit the 1024-token dispatch; prefill keeps its 256-token threshold ...
    assert plan_step(state, config, reserved_tokens=700).rows[0].length == 256
    # ... until the decodes leave less than that.
    assert plan_step(state, config, reserved_tokens=900).rows[0].length == 124
    assert plan_step(state, config, reserved_tokens=1024).rows == {}


def peak_bytes_of_one_step(
    state: PrefillState[Any], config: PlannerConfig, *, reserved_tokens: int = 0
) -> int:
    tracemalloc.start()
    try:
        plan_step(state, config, reserved_tokens=reserved_tokens)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize(
    ("config", "reserved_tokens"),
    [
        # packed: "long" is part-way and the partial limit keeps the next request waiting.
        (
            PlannerConfig(
                max_num_batched_tokens=512,
                long_prefill_token_threshold=256,
                max_num_partial_prefills=1,
                policy="packed",
            ),
            0,
        ),
        # round_robin: "long" is at the head and no page of it fits the room left.
        (PlannerConfig(max_num_batched_tokens=512, chunk_alignment=64), 500),
    ],
    ids=["packed-admission-blocked", "round-robin-head-keeps-its-turn"],
)
def test_a_step_that_takes_no_one_from_the_queue_never_walks_it(
    config: PlannerConfig, reserved_tokens: int
) -> None:
    # Memory, not time, so that a busy machine cannot make it flaky: a walk over the
    # waiting requests would allocate for each of them.
    peaks = []
    for waiting in (10, 10_000):
        state: PrefillState[Any] = PrefillState().add("long", 10**6)
        if config.policy == "packed":
            state = plan_step(state, config).state  # "long" starts
        for request_id in range(waiting):
            state = state.add(request_id, 4096)
        peaks.append(peak_bytes_of_one_step(state, config, reserved_tokens=reserved_tokens))
    assert peaks[1] < peaks[0] + 4096, peaks


def test_a_round_robin_step_stuck_for_pages_asks_the_owners_not_the_queue() -> None:
    # No page is free: no one can run. Memory, as above: a walk over the waiting requests
    # would allocate for each of them.
    config = PlannerConfig(max_num_batched_tokens=512, chunk_alignment=64)
    peaks = []
    for waiting in (10, 10_000):
        # "x" and "y" hold every page between them, all in use, and each needs more (each
        # fits the pool alone); the head, 0, holds none.
        state: PrefillState[Any] = PrefillState()
        for request_id in range(waiting):
            state = state.add(request_id, 4096)
        state = state.add("x", 4096, num_computed_tokens=2048)
        state = state.add("y", 4096, num_computed_tokens=2048)
        pool = PagePool[Any](num_pages=64, page_size=64).hold("x", 2048).hold("y", 2048)
        tracemalloc.start()
        try:
            plan = plan_step(state, config, pool=pool)
            peaks.append(tracemalloc.get_traced_memory()[1])
        finally:
            tracemalloc.stop()
        assert plan.rows == {}
    assert peaks[1] < peaks[0] + 4096, peaks


def test_the_fast_builders_of_rows_and_plans_build_what_the_constructors_build() -> None:
    # _online builds StepChunk and StepPlan through their slots, skipping attrs' __init__
    # and its checks (which the planner's values pass): right only while they set every
    # field, to what the constructors would.
    assert [f.name for f in attrs.fields(StepChunk)] == ["start", "length", "is_final"]
    assert [f.name for f in attrs.fields(StepPlan)] == ["rows", "state", "pool"]
    chunk = step_chunk(3, 4, True)
    assert chunk == StepChunk(start=3, length=4, is_final=True)
    assert hash(chunk) == hash(StepChunk(start=3, length=4, is_final=True))
    state = PrefillState().add(1, 5)
    plan = _step_plan({}, state, None)
    assert plan == StepPlan(rows={}, state=state, pool=None)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        chunk.start = 0  # type: ignore[misc]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"start": -1, "length": 2, "is_final": True}, "'start' must be >= 0: -1"),
        ({"start": 0, "length": 0, "is_final": True}, "'length' must be >= 1: 0"),
        ({"start": 0, "length": -3, "is_final": False}, "'length' must be >= 1: -3"),
        ({"start": True, "length": 2, "is_final": True}, "'start' must be an int: True"),
        ({"start": 0, "length": 2**40, "is_final": True}, "'length' must be <= "),
        (
            {"start": 2**31 - 1, "length": 2**31 - 1, "is_final": True},
            "'start' + 'length' must be <= 2147483647: 4294967294",
        ),
        ({"start": 2**31 - 2, "length": 2, "is_final": True}, "'start' + 'length' must be <= "),
        ({"start": 0, "length": 2, "is_final": 1}, "'is_final' must be a bool"),
        ({"start": 0, "length": 2, "is_final": None}, "'is_final' must be a bool"),
    ],
)
def test_a_step_chunk_is_checked_as_a_schedule_chunk_is(
    fields: dict[str, Any], message: str
) -> None:
    with pytest.raises(InvalidInputError, match=re.escape(message)):
        StepChunk(**fields)
    with pytest.raises(InvalidInputError, match=re.escape(message)):
        Chunk(request=0, **fields)
    chunk = StepChunk(start=np.int64(3), length=np.int32(4), is_final=np.bool_(True))
    assert chunk == StepChunk(start=3, length=4, is_final=True)
    assert type(chunk.start) is int
    assert type(chunk.is_final) is bool


def test_a_plan_built_by_hand_is_checked_and_its_rows_stay_read_only() -> None:
    state = PrefillState().add("a", 10)
    with pytest.raises(InvalidInputError, match="'rows' must map each request id to a StepChunk"):
        StepPlan(rows={"a": (0, 1, False)}, state=state)
    with pytest.raises(InvalidInputError, match="'rows' must be a mapping"):
        StepPlan(rows=[("a", StepChunk(start=0, length=1, is_final=False))], state=state)
    with pytest.raises(InvalidInputError, match="'state' must be a PrefillState: NoneType"):
        StepPlan(rows={}, state=None)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="'pool' must be a PagePool or None: int"):
        StepPlan(rows={}, state=state, pool=3)  # type: ignore[arg-type]
    rows = {"a": StepChunk(start=0, length=4, is_final=False)}
    plan = StepPlan(rows=rows, state=state)
    rows.clear()  # the plan holds its own copy
    assert plan.num_rows == 1
    with pytest.raises(TypeError, match="read-only"):
        plan.rows["b"] = StepChunk(start=0, length=1, is_final=True)  # type: ignore[index]
    # Applied, such a plan runs like a planned one.
    assert state.apply(plan)["a"] == PrefillRequest(
        prompt_length=10, num_computed_tokens=4, is_started=True
    )


def test_a_prefill_request_is_checked_when_built() -> None:
    with pytest.raises(InvalidInputError, match="'prompt_length' must be >= 1: 0"):
        PrefillRequest(prompt_length=0, num_computed_tokens=0, is_started=False)
    with pytest.raises(InvalidInputError, match="'num_computed_tokens' must be >= 0: -3"):
        PrefillRequest(prompt_length=10, num_computed_tokens=-3, is_started=True)
    with pytest.raises(InvalidInputError, match=r"must be below 'prompt_length' \(10\)"):
        PrefillRequest(prompt_length=10, num_computed_tokens=10, is_started=True)
    with pytest.raises(InvalidInputError, match="'is_started' must be a bool"):
        PrefillRequest(prompt_length=10, num_computed_tokens=0, is_started=0)


# -- errors, and states never half-changed ----------------------------------------------------


def test_adding_an_id_twice_raises_and_leaves_the_state_as_it_was() -> None:
    state = PrefillState().add("a", 10)
    seen = snapshot(state)
    with pytest.raises(DuplicateRequestError, match="'a'"):
        state.add("a", 5)
    assert snapshot(state) == seen


def test_removing_an_unknown_id_raises_a_key_error_naming_it() -> None:
    state = PrefillState().add("a", 10)
    with pytest.raises(UnknownRequestError) as raised:
        state.remove("b")
    assert isinstance(raised.value, KeyError)
    assert isinstance(raised.value, InvalidInputError)
    assert str(raised.value).startswith("'request_id' must be a request in the state")
    assert "'b'" in str(raised.value)
    assert state.get("b") is None
    assert "b" not in state
    with pytest.raises(UnknownRequestError):
        _ = state["b"]


@pytest.mark.parametrize("config", [RR, PACKED])
def test_a_finished_request_has_left_the_state(config: PlannerConfig) -> None:
    plan = plan_step(PrefillState().add("a", 10), config)
    assert plan.finished == ("a",)
    with pytest.raises(UnknownRequestError):
        plan.state.remove("a")
    assert plan.state.add("a", 4)["a"] == PrefillRequest(
        prompt_length=4, num_computed_tokens=0, is_started=False
    )


@pytest.mark.parametrize(
    ("reserved", "message"),
    [
        ({"reserved_tokens": -1}, "'reserved_tokens' must be >= 0: -1"),
        ({"reserved_tokens": True}, "'reserved_tokens' must be an int"),
        ({"reserved_tokens": 1.0}, "'reserved_tokens' must be an int"),
        ({"reserved_rows": -2}, "'reserved_rows' must be >= 0: -2"),
        # Every count the planner takes is at most 2**31 - 1 (docs/api.md).
        ({"reserved_tokens": 2**40}, "'reserved_tokens' must be <= 2147483647: 1099511627776"),
        ({"reserved_rows": 2**31}, "'reserved_rows' must be <= 2147483647: 2147483648"),
    ],
)
def test_bad_reservations_raise_naming_the_argument(reserved: dict[str, Any], message: str) -> None:
    config = PlannerConfig(max_num_batched_tokens=256, max_num_seqs=4)
    with pytest.raises(InvalidInputError, match=re.escape(message)):
        plan_step(PrefillState().add(1, 10), config, **reserved)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ((1, 0), "'prompt_length' must be >= 1: 0"),
        ((1, 10, 10), "'num_computed_tokens' must be < the prompt length.*10 for length 10"),
        ((1, 10, -1), "'num_computed_tokens' must be >= 0: -1"),
        ((1, "10"), "'prompt_length' must be an int"),
        (([1], 10), "'request_id' must be hashable"),
    ],
)
def test_bad_additions_raise_naming_the_argument(arguments: tuple[Any, ...], message: str) -> None:
    request_id, length, *cached = arguments
    with pytest.raises(InvalidInputError, match=message):
        PrefillState().add(request_id, length, num_computed_tokens=cached[0] if cached else 0)


@pytest.mark.parametrize("at_front", ["no", 2.5, 1, None])
def test_at_front_is_a_bool(at_front: Any) -> None:
    with pytest.raises(InvalidInputError, match=r"^'at_front' must be a bool: "):
        PrefillState().add(1, 10, at_front=at_front)
    assert list(PrefillState().add(1, 3).add(2, 3, at_front=np.True_)) == [2, 1]  # type: ignore[arg-type]


def test_bad_arguments_to_plan_step_and_from_prompt_lengths_raise() -> None:
    with pytest.raises(InvalidInputError, match="'state' must be a PrefillState: dict"):
        plan_step({}, RR)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="'config' must be a PlannerConfig: dict"):
        plan_step(PrefillState(), {})  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="one entry per prompt \\(2\\): 1 entries"):
        PrefillState.from_prompt_lengths([3, 4], num_computed_tokens=[0])
    with pytest.raises(InvalidInputError, match="'num_computed_tokens' must be < the prompt len"):
        PrefillState.from_prompt_lengths([3], num_computed_tokens=[3])
    assert not PrefillState.from_prompt_lengths([])


def test_a_run_keeps_its_policy_until_the_state_drains() -> None:
    state = plan_step(PrefillState.from_prompt_lengths([300, 10]), PACKED).state
    assert state.policy == "packed"
    with pytest.raises(InvalidInputError, match=r"'config\.policy' must be 'packed'"):
        plan_step(state, RR)
    state = plan_step(state, PACKED).state
    assert not state
    assert state.policy is None
    assert plan_step(state.add(0, 10), RR).finished == (0,)


# -- the mapping, immutability and copies -------------------------------------------------------


def test_a_state_is_a_read_only_mapping_in_planning_order() -> None:
    state = PrefillState().add("x", 10, num_computed_tokens=4).add("y", 7)
    assert len(state) == 2
    assert list(state) == ["x", "y"]
    assert "x" in state
    assert state["x"] == PrefillRequest(prompt_length=10, num_computed_tokens=4, is_started=False)
    assert state["x"].num_remaining_tokens == 6
    assert state.num_tokens == 13
    assert [] not in state  # an unhashable key is simply absent
    with pytest.raises(AttributeError, match="immutable"):
        state._policy = "packed"
    with pytest.raises(TypeError):
        hash(state)
    assert repr(state) == "PrefillState(requests=2, tokens=13, policy=None)"


def test_branches_from_one_state_do_not_see_each_other() -> None:
    base = plan_step(PrefillState.from_prompt_lengths([300, 100]), PACKED).state
    left = base.add(2, 5)
    right = base.remove(0).add(3, 6)
    assert list(left) == [0, 1, 2]
    assert list(right) == [1, 3]
    assert list(plan_step(left, PACKED).rows) == [0, 1, 2]
    assert list(plan_step(right, PACKED).rows) == [1, 3]
    assert list(base) == [0, 1]


def test_states_compare_by_content_order_and_run() -> None:
    a = PrefillState().add(1, 5).add(2, 5)
    assert a == PrefillState().add(1, 5).add(2, 5)
    assert a != PrefillState().add(2, 5).add(1, 5)
    assert a != a.remove(2).add(2, 6)
    assert a.remove(1).add(1, 5) == PrefillState().add(2, 5).add(1, 5)


@given(prefill_states(configs=planner_configs()))
def test_a_state_survives_pickling(state: PrefillState[Any]) -> None:
    copy = pickle.loads(pickle.dumps(state))
    assert copy == state
    assert list(copy.items()) == list(state.items())


def test_plan_rows_are_read_only() -> None:
    plan = plan_step(PrefillState().add(1, 5), PACKED)
    rows: Any = plan.rows
    chunk = StepChunk(start=0, length=1, is_final=True)
    for change in (
        lambda: rows.__setitem__(2, chunk),
        lambda: rows.__delitem__(1),
        lambda: rows.pop(1),
        lambda: rows.popitem(),
        lambda: rows.setdefault(2, chunk),
        lambda: rows.update({2: chunk}),
        lambda: rows.__ior__({2: chunk}),
        rows.clear,
    ):
        with pytest.raises(TypeError, match="read-only"):
            change()
    assert list(plan.rows) == [1]
    assert plan.rows[1].end == 5
    assert plan.num_tokens == 5


@given(prefill_states_with_configs(min_size=1))
def test_a_plan_pickles_and_deep_copies_to_an_equal_plan(
    drawn: tuple[PrefillState[Any], PlannerConfig],
) -> None:
    state, config = drawn
    plan = plan_step(state, config)
    for copied in (pickle.loads(pickle.dumps(plan)), copy.deepcopy(plan)):
        assert copied == plan
        assert list(copied.rows.items()) == list(plan.rows.items())
        assert list(copied.state.items()) == list(plan.state.items())


# -- applying a plan to a newer state, and aborts ---------------------------------------------


@given(prefill_states_with_configs(), st.integers(min_value=0, max_value=3))
def test_applying_a_plan_to_its_own_state_gives_the_plan_state(
    drawn: tuple[PrefillState[Any], PlannerConfig], reserved_rows: int
) -> None:
    state, config = drawn
    plan = plan_step(state, config, reserved_rows=reserved_rows)
    applied = state.apply(plan)
    assert applied == plan.state
    assert applied.policy == plan.state.policy
    assert applied.num_tokens == plan.state.num_tokens


@given(prefill_states_with_configs(configs=planner_configs(policy=st.just("packed"))))
def test_packed_arrivals_while_a_dispatch_runs_are_kept_as_if_added_after_it(
    drawn: tuple[PrefillState[Any], PlannerConfig],
) -> None:
    state, config = drawn
    plan = plan_step(state, config)
    newer = state.add("late", 7, num_computed_tokens=2)
    assert newer.apply(plan) == plan.state.add("late", 7, num_computed_tokens=2)


def test_round_robin_requeues_a_chunk_behind_the_arrivals_of_its_dispatch() -> None:
    config = PlannerConfig(max_num_batched_tokens=64)
    state = PrefillState.from_prompt_lengths([100, 100])
    plan = plan_step(state, config)  # request 0 runs 64 tokens
    applied = state.add(2, 5).apply(plan)
    assert list(applied) == [1, 2, 0]
    assert applied[0].num_computed_tokens == 64
    assert applied.num_tokens == 141
    assert applied.policy == "round_robin"


def test_a_request_removed_while_its_chunk_ran_stays_removed() -> None:
    config = PlannerConfig(
        max_num_batched_tokens=256, long_prefill_token_threshold=128, policy="packed"
    )
    state = PrefillState.from_prompt_lengths([300, 100, 300])
    plan = plan_step(state, config)
    assert [chunk.length for chunk in plan.rows.values()] == [128, 84, 44]  # to the bound
    applied = state.remove(0).apply(plan)
    assert list(applied) == [1, 2]
    assert applied.num_tokens == 272
    assert applied == plan.state.remove(0)


def test_a_whole_batch_plan_ends_the_run_and_arrivals_start_the_next() -> None:
    state = PrefillState.from_prompt_lengths([10, 20])
    plan = plan_step(state, RR)
    applied = state.add(5, 1000).apply(plan)
    assert list(applied) == [5]
    assert applied.policy is None


def test_applying_a_plan_twice_or_to_another_run_raises() -> None:
    state = PrefillState.from_prompt_lengths([300, 100])
    plan = plan_step(state, PACKED)
    with pytest.raises(
        InvalidInputError,
        match=r"'plan' must run request 0 as it is here, at position 256 of 300 tokens: its "
        r"chunk runs 0:256 \(applied twice",
    ):
        plan.state.apply(plan)
    round_robin = plan_step(PrefillState.from_prompt_lengths([300, 100]), RR)
    with pytest.raises(InvalidInputError, match="'plan' must be planned with 'packed'"):
        plan.state.apply(round_robin)
    with pytest.raises(InvalidInputError, match="'plan' must be a StepPlan: dict"):
        state.apply({})  # type: ignore[arg-type]
    assert state.apply(plan_step(state, PACKED, reserved_tokens=256)) is state


def test_applying_a_plan_twice_raises_even_where_its_id_came_back() -> None:
    # A request that finished in the plan, then a new one under its id: applying the plan
    # again would finish the newcomer.
    plan = plan_step(PrefillState().add("a", 2), PACKED)
    again = plan.state.add("a", 7)
    with pytest.raises(InvalidInputError, match=r"at position 0 of 7 tokens: its chunk runs "
                       r"0:2, final \(applied twice"):  # fmt: skip
        again.apply(plan)
    longer = plan_step(PrefillState().add("a", 300), PACKED)  # a non-final chunk of 256
    with pytest.raises(InvalidInputError, match=r"of 100 tokens: its chunk runs 0:256 "):
        longer.state.remove("a").add("a", 100).apply(longer)


def test_discard_removes_a_request_if_present_and_is_a_no_op_otherwise() -> None:
    state = PrefillState.from_prompt_lengths([10, 20])
    assert state.discard(0) == state.remove(0)
    assert state.discard(7) is state
    assert state.discard([]) is state  # type: ignore[arg-type]
    finished = plan_step(state, RR).state
    assert finished.discard(0) is finished


@given(prefill_states_with_configs(), st.integers(min_value=0, max_value=3), st.data())
def test_discarding_many_at_once_is_discarding_them_one_by_one(
    state_config: tuple[PrefillState[Any], PlannerConfig], steps: int, data: st.DataObject
) -> None:
    state, config = state_config
    for _ in range(steps):  # some requests started, part-way, finished
        state = plan_step(state, config).state
    ids = list(state)
    # Any share of the state, the few removed one by one and the many by a rebuild, with
    # ids that are not here (finished, never added, unhashable) ignored.
    gone = data.draw(st.lists(st.sampled_from(ids), unique=True) if ids else st.just([]))
    strays = data.draw(st.lists(st.sampled_from([-1, "x", 10**6, (1, [2])]), max_size=3))
    one_by_one = functools.reduce(PrefillState.discard, gone, state)
    at_once = state.discard_all(data.draw(st.permutations(gone + strays)))
    assert at_once == one_by_one
    assert (at_once.num_tokens, at_once.policy) == (one_by_one.num_tokens, one_by_one.policy)
    assert drain(at_once, config) == drain(one_by_one, config)


def test_discard_all_ignores_what_is_not_here_and_refuses_what_is_not_ids() -> None:
    state = PrefillState().add("ab", 10).add("a", 20).add("b", 30)
    assert state.discard_all([]) is state
    assert state.discard_all(iter(["zz", [1]])) is state  # unknown, unhashable
    assert list(state.discard_all(["a", "b", "a"])) == ["ab"]
    assert list(state.discard_all(iter(["ab", "a", "b"]))) == []
    for bad in ("ab", b"ab", 5, None):
        with pytest.raises(
            InvalidInputError,
            match=r"'request_ids' must be an iterable of request ids \(\[id\] for one\): "
            rf"{re.escape(repr(bad))} \({type(bad).__name__}\)",
        ):
            state.discard_all(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("kept", [10, 3001])  # one pass over the state; a deletion each
def test_dropping_many_from_a_long_queue_never_rebuilds_its_summary_for_each(kept: int) -> None:
    # Longest first, behind a live head: each removal on its own drops the longest left and
    # rebuilds the queue's summary of its two longest (O(n) each: quadratic in all).
    from pypto_sched.core import _online

    state = PrefillState.from_prompt_lengths(list(range(1, 4001)))
    calls: list[int] = []
    real = _online._queue_of

    def counted(*args: Any) -> Any:
        calls.append(1)
        return real(*args)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_online, "_queue_of", counted)
        rest = state.discard_all(range(3999, kept - 1, -1))
    assert len(calls) <= 1
    assert list(rest) == list(range(kept))
    assert rest.num_tokens == sum(range(1, kept + 1))
    fresh = PrefillState.from_prompt_lengths(list(range(1, kept + 1)))
    assert drain(rest, PACKED) == drain(fresh, PACKED)


@pytest.mark.parametrize("how", ["discard", "discard_all", "a step"])
def test_a_request_the_pool_never_holds_is_named_behind_dead_queue_entries(how: str) -> None:
    # Entries at the head of the queue died (their requests removed, or run whole by a step
    # whose budget ended there); the live request behind them needs more than the whole
    # pool. A step that plans no row names it, as it does for a state built without them.
    config = PlannerConfig(max_num_batched_tokens=4, chunk_alignment=4, policy="packed")
    full = PagePool[Any](num_pages=4, page_size=4).hold("decode", 16)  # 16 tokens in all
    # ("B" and "C" are the queue's two longest: removing "x" or "y" leaves its entry dead.)
    state: PrefillState[Any] = PrefillState().add("x", 4).add("y", 2)
    state = state.add("B", 40).add("C", 30)
    for i in range(20):
        state = state.add(i, 1)
    if how == "discard":
        state = state.discard("x").discard("y")
    elif how == "discard_all":
        state = state.discard_all(["y", "x"])  # a few of the state's requests
    else:  # "x" runs whole and fills the budget; "y" was removed
        free = PagePool[Any](num_pages=4, page_size=4)
        state = plan_step(state.remove("y"), config, pool=free).state
    assert list(state) == ["B", "C", *range(20)]
    with pytest.raises(CacheTooSmallError, match=r"request 'B' needs 40 tokens"):
        plan_step(state, config, pool=full)


def test_applying_a_plan_drops_the_queue_entries_of_the_requests_it_admitted() -> None:
    # A server applies every plan to its newer state: were the admitted requests' entries
    # left at the head of the queue, every later step would walk all of them again.
    state = PrefillState.from_prompt_lengths([4] * 100)
    applied: PrefillState[Any] = state
    for step in range(20):
        plan = plan_step(applied, PACKED_64)
        applied = applied.add(f"arrived in step {step}", 4).apply(plan)
    assert len(list(applied._queue)) == len(applied)  # no dead entry left in it


def test_applying_a_plan_keeps_its_run_when_the_requests_it_left_were_removed() -> None:
    config = PlannerConfig(max_num_batched_tokens=8)
    # The plan left "x" part-way; "x" is removed while it runs. The state never drained, so
    # the round_robin run goes on: b and c run one a dispatch, not as a whole batch.
    state = PrefillState().add("a", 12).add("x", 12)
    for _ in range(2):
        state = plan_step(state, config).state
    plan = plan_step(state, config)
    assert plan.rows == {"a": StepChunk(start=8, length=4, is_final=True)}
    applied = state.discard("x").add("b", 3).add("c", 3).apply(plan)
    assert applied.policy == "round_robin"
    assert list(plan_step(applied, config).rows) == ["b"]
    drained = plan.state.discard("x").add("b", 3).add("c", 3)
    assert drained.policy is None
    assert list(plan_step(drained, config).rows) == ["b", "c"]
    # With no arrival meanwhile, the applied state is empty: no run, however it emptied.
    emptied = state.discard("x").apply(plan)
    assert not emptied
    assert emptied.policy is None


def test_a_page_pool_that_cannot_hold_every_request_whole_leaves_the_greedy_fill() -> None:
    # Without a pool, or with one that holds every request whole, the first step keeps to
    # the bound (6 + 1 + 3, not greedy's 6 + 3 + 1); a pool that cannot is a limit the bound
    # does not count (its free pages can bind), and the greedy fill stands.
    config = PlannerConfig(
        max_num_batched_tokens=10, long_prefill_token_threshold=6, policy="packed"
    )
    state = PrefillState.from_prompt_lengths([8, 3, 9])

    def sizes(pool: PagePool[int] | None) -> list[int]:
        return [chunk.length for chunk in plan_step(state, config, pool=pool).rows.values()]

    assert sizes(None) == sizes(PagePool(num_pages=6, page_size=4)) == [6, 1, 3]
    assert sizes(PagePool(num_pages=5, page_size=4)) == [6, 3, 1]  # 6 pages whole


@given(
    lengths=st.lists(st.sampled_from([7, 7, 7, 3, 12]), min_size=1, max_size=30),
    removed=st.lists(st.integers(0, 29), max_size=30),
)
def test_removing_waiting_requests_keeps_the_plan_of_a_state_built_without_them(
    lengths: list[int], removed: list[int]
) -> None:
    """Whichever waiting requests are removed, the longest among them or not, the state
    plans as one built without them: the queue's summary of its two longest stays right."""
    state = PrefillState.from_prompt_lengths(lengths)
    gone = [r for r in dict.fromkeys(removed) if r < len(lengths)]
    for request_id in gone:
        state = state.remove(request_id)
    fresh: PrefillState[int] = PrefillState()
    for request_id, length in enumerate(lengths):
        if request_id not in gone:
            fresh = fresh.add(request_id, length)
    config = PlannerConfig(max_num_batched_tokens=16, long_prefill_token_threshold=5,
                           policy="packed")  # fmt: skip
    assert state == fresh
    assert drain(state, config) == drain(fresh, config)


def test_removing_the_oldest_of_equal_lengths_does_not_rebuild_the_queue(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Of equal lengths the oldest waiting requests are the two longest the queue keeps for
    the bound; aborting them oldest first pops them off its front instead of rebuilding the
    queue of every waiting request at each abort (O(n): 0.8 s at 200,000 requests)."""
    from pypto_sched.core import _online

    state = PrefillState.from_prompt_lengths([512] * 1000)
    rebuilt: list[int] = []
    real = _online._queue_of
    monkeypatch.setattr(
        _online,
        "_queue_of",
        lambda *args: rebuilt.append(1) or real(*args),  # type: ignore[func-returns-value]
    )
    for request_id in range(100):
        state = state.remove(request_id)
    assert rebuilt == []
    assert list(state) == list(range(100, 1000))
    state = state.remove(500)  # not one of the two longest: nothing to rebuild either
    state = state.remove(101)  # the second longest, behind a live head: rebuilt
    assert rebuilt == [1]
