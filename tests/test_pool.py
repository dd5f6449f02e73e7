"""PagePool: a bounded KV page pool as an immutable value, checked against a plain model."""

from __future__ import annotations

import copy
import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from pypto_sched import (
    CacheTooSmallError,
    InvalidInputError,
    PagePool,
    PlannerConfig,
    Policy,
    PrefillState,
    StepChunk,
    plan_step,
)

requests = st.integers(min_value=0, max_value=7)


class PoolMachine(RuleBasedStateMachine):
    """Random holds and releases; after each, the pool agrees with a dict of lists."""

    def __init__(self) -> None:
        super().__init__()
        self.pool: PagePool[int] = PagePool(num_pages=12, page_size=4)
        self.model: dict[int, list[int]] = {}

    @rule(request=requests, tokens=st.integers(min_value=0, max_value=60))
    def hold(self, request: int, tokens: int) -> None:
        before = self.pool
        have = len(self.model.get(request, []))
        missing = max(-(-tokens // 4) - have, 0)
        free = 12 - sum(len(pages) for pages in self.model.values())
        if missing > free:
            with pytest.raises(CacheTooSmallError, match=f"request {request} needs {missing}"):
                self.pool.hold(request, tokens)
            assert self.pool == before
            return
        self.pool = self.pool.hold(request, tokens)
        if missing:
            got = list(self.pool.pages(request))
            assert got[:have] == self.model.get(request, [])  # kept, new ones at the end
            self.model[request] = got
        assert before.num_free == free  # the old pool is unchanged

    @rule(request=requests)
    def release(self, request: int) -> None:
        self.pool = self.pool.release(request)
        self.model.pop(request, None)

    @precondition(lambda self: bool(self.model))
    @rule(data=st.data())
    def a_freed_page_is_reused_first(self, data: st.DataObject) -> None:
        request = data.draw(st.sampled_from(sorted(self.model)))
        last = self.model[request][-1]
        pool = self.pool.release(request)
        assert pool.hold(99, 1).pages(99) == (last,)

    @invariant()
    def no_page_is_owned_twice_and_none_is_lost(self) -> None:
        owned = [page for request in self.pool.owners() for page in self.pool.pages(request)]
        assert len(owned) == len(set(owned)) == self.pool.num_used
        assert sorted(owned + self.pool._free_pages()) == list(range(12))

    @invariant()
    def block_tables_agree_with_ownership(self) -> None:
        assert {r: list(self.pool.pages(r)) for r in self.pool.owners()} == self.model
        ids = sorted(self.model)
        tables = self.pool.block_tables(ids)
        for row, request in enumerate(ids):
            assert tables.table(row).tolist() == self.model[request]

    def teardown(self) -> None:
        pool = self.pool
        for request in list(pool.owners()):
            pool = pool.release(request)
        assert pool.num_free == 12  # nothing leaks once everyone left
        assert len(pool) == 0


TestPoolMachine = PoolMachine.TestCase
TestPoolMachine.settings = settings(max_examples=80, stateful_step_count=30, deadline=None)


def test_slots_follow_the_block_table() -> None:
    pool = PagePool[str](num_pages=8, page_size=4).hold("a", 3).hold("b", 5)
    pool = pool.release("a").hold("c", 9).hold("b", 9)
    assert pool.pages("c") == (0, 3, 4)  # the freed page first, then never-used ones
    assert pool.pages("b") == (1, 2, 5)
    assert [pool.slot("b", p) for p in (0, 3, 4, 7, 8)] == [4, 7, 8, 11, 20]
    with pytest.raises(InvalidInputError, match="'position' must be < the 12 slots"):
        pool.slot("b", 12)


def test_release_of_a_request_without_pages_is_a_no_op() -> None:
    pool: PagePool[object] = PagePool(num_pages=2, page_size=2)
    assert pool.release("nobody") is pool
    assert pool.release([1]) is pool  # unhashable: owns nothing
    assert [1] not in pool


def test_pools_compare_pickle_and_copy_by_content() -> None:
    pool = PagePool[str](num_pages=6, page_size=2).hold("a", 5).hold("b", 1)
    pool = pool.release("a").hold("c", 2)
    for copied in (pickle.loads(pickle.dumps(pool)), copy.deepcopy(pool)):
        assert copied == pool
        assert copied.hold("d", 12 - 4).pages("d") == pool.hold("d", 8).pages("d")
    assert pool != PagePool(num_pages=6, page_size=2)


def test_a_pool_is_immutable() -> None:
    pool: PagePool[int] = PagePool(num_pages=1, page_size=1)
    with pytest.raises(AttributeError, match="immutable"):
        pool._num_pages = 2


@given(st.integers(min_value=1, max_value=50), st.integers(min_value=1, max_value=9))
def test_capacity_questions_agree_with_hold(num_pages: int, page_size: int) -> None:
    pool = PagePool[int](num_pages=num_pages, page_size=page_size).hold(0, 1)
    most = pool.tokens_holdable(0)
    assert most == num_pages * page_size
    assert pool.can_hold(0, most)
    assert not pool.can_hold(0, most + 1)
    assert pool.hold(0, most).num_free == 0
    assert pool.missing_pages(0, most) == num_pages - 1


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: PagePool(num_pages=0, page_size=4), "'num_pages' must be >= 1: 0"),
        (lambda: PagePool(num_pages=4, page_size=True), "'page_size' must be an int"),
        (lambda: PagePool[int](num_pages=4, page_size=4).hold(0, -1), "'num_tokens' must be >= 0"),
        (
            lambda: PagePool[object](num_pages=4, page_size=4).hold([0], 1),
            "'request_id' must be hashable",
        ),
    ],
)
def test_bad_input_names_the_argument(call: object, match: str) -> None:
    with pytest.raises(InvalidInputError, match=match):
        call()  # type: ignore[operator]


@given(
    st.lists(st.integers(min_value=1, max_value=40), min_size=1, max_size=8),
    st.sampled_from(["round_robin", "packed"]),
    st.integers(min_value=4, max_value=64),
)
def test_plan_step_with_an_ample_pool_plans_the_same_rows(
    lengths: list[int], policy: Policy, budget: int
) -> None:
    config = PlannerConfig(
        max_num_batched_tokens=budget, long_prefill_token_threshold=16, policy=policy
    )
    state = PrefillState.from_prompt_lengths(lengths)
    pool = PagePool[int](num_pages=sum(lengths), page_size=1)
    while state:
        plain = plan_step(state, config)
        pooled = plan_step(state, config, pool=pool)
        assert dict(pooled.rows) == dict(plain.rows)
        assert pooled.pool is not None
        pool = pooled.pool
        for request, chunk in pooled.rows.items():
            assert pool.capacity(request) >= chunk.start + chunk.length
        state = plain.state


@given(
    st.lists(st.integers(min_value=1, max_value=30), min_size=1, max_size=6),
    st.sampled_from(["round_robin", "packed"]),
    st.integers(min_value=1, max_value=12),
)
def test_plan_step_never_plans_a_chunk_beyond_the_free_pages(
    lengths: list[int], policy: Policy, num_pages: int
) -> None:
    config = PlannerConfig(max_num_batched_tokens=32, page_size=4, policy=policy)
    state = PrefillState.from_prompt_lengths(lengths)
    pool = PagePool[int](num_pages=num_pages, page_size=4)
    plan = plan_step(state, config, pool=pool)
    assert plan.pool is not None
    assert plan.pool.num_used == sum(-(-(c.start + c.length) // 4) for c in plan.rows.values())
    for request, chunk in plan.rows.items():
        assert plan.pool.capacity(request) >= chunk.start + chunk.length


def test_round_robin_lets_a_request_behind_a_head_waiting_for_pages_run() -> None:
    config = PlannerConfig(max_num_batched_tokens=4)
    state = PrefillState.from_prompt_lengths([8, 8, 8])
    pool = PagePool[int](num_pages=5, page_size=2).hold(1, 8)  # 1 has its pages; 1 is free
    plan = plan_step(state, config, pool=pool)
    assert dict(plan.rows) == {0: StepChunk(start=0, length=2, is_final=False)}
    plan = plan_step(plan.state, config, pool=plan.pool)
    assert dict(plan.rows) == {1: StepChunk(start=0, length=4, is_final=False)}
    # 2's turn, but no page is free: 0 cannot grow either; 1 runs in its own pages.
    plan = plan_step(plan.state, config, pool=plan.pool)
    assert dict(plan.rows) == {1: StepChunk(start=4, length=4, is_final=True)}
    assert next(iter(plan.state)) == 2  # and 2 keeps its turn


def test_a_request_added_at_the_front_is_served_next() -> None:
    config = PlannerConfig(max_num_batched_tokens=4, policy="packed")
    state = PrefillState.from_prompt_lengths([4, 4]).add(9, 4, at_front=True)
    assert list(plan_step(state, config).rows) == [9]
    turns = PrefillState.from_prompt_lengths([4, 4]).add(9, 4, at_front=True)
    assert list(plan_step(turns, PlannerConfig(max_num_batched_tokens=4)).rows) == [9]
