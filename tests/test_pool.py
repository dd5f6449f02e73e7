"""PagePool: a bounded KV page pool as an immutable value, checked against a plain model."""

from __future__ import annotations

import copy
import pickle
from collections.abc import Mapping

import attrs
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from pypto_sched import (
    POLICIES,
    CacheTooSmallError,
    InvalidInputError,
    PagePool,
    PlannerConfig,
    Policy,
    PrefillState,
    StepChunk,
    plan_step,
)
from pypto_sched.testing import planner_configs

requests = st.integers(min_value=0, max_value=7)


class PoolMachine(RuleBasedStateMachine):
    """Random holds and releases; after each, the pool agrees with a dict of lists, and
    hands out exactly the pages a list of free pages says: freed pages first, last freed
    first, then never-used ones in ascending order."""

    def __init__(self) -> None:
        super().__init__()
        self.pool: PagePool[int] = PagePool(num_pages=12, page_size=4)
        self.model: dict[int, list[int]] = {}
        self.free = list(range(12))  # in the order they are handed out

    @rule(request=requests, tokens=st.integers(min_value=0, max_value=60))
    def hold(self, request: int, tokens: int) -> None:
        before = self.pool
        tables_before, free_before = before._tables(), before._free_pages()
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
            assert got[have:] == self.free[:missing]
            self.free = self.free[missing:]
            self.model[request] = got
        assert before.num_free == free  # the old pool is unchanged
        assert before._tables() == tables_before
        assert before._free_pages() == free_before

    @rule(request=requests)
    def release(self, request: int) -> None:
        self.pool = self.pool.release(request)
        self.free = self.model.pop(request, [])[::-1] + self.free

    @precondition(lambda self: bool(self.model))
    @rule(data=st.data())
    def a_freed_page_is_reused_first(self, data: st.DataObject) -> None:
        request = data.draw(st.sampled_from(sorted(self.model)))
        last = self.model[request][-1]
        pool = self.pool.release(request)
        assert pool.hold(99, 1).pages(99) == (last,)

    @invariant()
    def free_pages_are_handed_out_in_the_stated_order(self) -> None:
        assert self.pool._free_pages() == self.free
        assert self.pool.num_free == len(self.free)

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


@given(
    st.lists(
        st.tuples(
            st.integers(min_value=0, max_value=3),  # which pool: 0 the newest, 1 the one before
            st.integers(min_value=0, max_value=3),  # request
            st.integers(min_value=-1, max_value=24),  # tokens to hold; -1: release
        ),
        max_size=40,
    )
)
@settings(max_examples=100, deadline=None)
def test_pools_branched_from_any_earlier_pool_never_see_each_others_holds(
    actions: list[tuple[int, int, int]],
) -> None:
    # A table grows in place when its pool holds the newest version of it: holds made on
    # older pools, after newer ones grew the same table, must neither see those pages nor
    # change them. Every pool is checked against its own plain model at the end.
    versions: list[tuple[PagePool[int], dict[int, list[int]], list[int]]] = [
        (PagePool(num_pages=16, page_size=2), {}, list(range(16)))
    ]
    for which, request, tokens in actions:
        pool, model, free = versions[-1 - min(which, len(versions) - 1)]
        model = {r: list(pages) for r, pages in model.items()}
        if tokens < 0:
            pool = pool.release(request)
            free = model.pop(request, [])[::-1] + free
        else:
            have = model.get(request, [])
            missing = max(-(-tokens // 2) - len(have), 0)
            if missing > len(free):
                continue
            pool = pool.hold(request, tokens)
            if missing:
                model[request] = have + free[:missing]
                free = free[missing:]
        versions.append((pool, model, free))
    for pool, model, free in versions:
        assert {r: list(pool.pages(r)) for r in pool.owners()} == model
        assert pool._free_pages() == free
        for request, pages in model.items():
            assert [pool.slot(request, 2 * i) // 2 for i in range(len(pages))] == pages
        ids = sorted(model)
        assert [pool.block_tables(ids).table(row).tolist() for row in range(len(ids))] == [
            model[r] for r in ids
        ]


def test_a_table_whose_array_cannot_move_is_copied_when_it_grows() -> None:
    # A hold appends to the newest table's array in place; while a view of that array is
    # held the array cannot be resized, and the hold copies the table instead.
    pool = PagePool[str](num_pages=8, page_size=1).hold("a", 2)
    pages, _ = pool._table("a")
    with memoryview(pages):
        grown = pool.hold("a", 5)
    assert grown.pages("a") == (0, 1, 2, 3, 4)
    assert pool.pages("a") == (0, 1)
    assert grown.hold("a", 6).pages("a") == (0, 1, 2, 3, 4, 5)


def test_block_tables_refuses_a_str_and_an_id_that_owns_no_pages() -> None:
    pool = PagePool[str](num_pages=8, page_size=4).hold("a", 5).hold("b", 1)
    assert pool.block_tables(["b", "a"]).table(1).tolist() == [0, 1]
    # Any iterable of ids but a str: a dict's keys, an array of ids.
    assert pool.block_tables({"b": 0, "a": 1}.keys()).table(1).tolist() == [0, 1]
    numbered = PagePool[int](num_pages=8, page_size=4).hold(0, 5).hold(1, 1)
    assert numbered.block_tables(np.array([1, 0])).table(1).tolist() == [0, 1]
    with pytest.raises(InvalidInputError, match=r"^'request_ids' must be an iterable of request "
                       r"ids \(\[id\] for one\): 'ab' \(str\)$"):  # fmt: skip
        pool.block_tables("ab")
    for unknown in ["zz", "c"]:
        with pytest.raises(InvalidInputError, match=f"^'request_ids' must name requests that "
                           f"own pages: item 1 is '{unknown}', which owns none$"):  # fmt: skip
            pool.hold("c", 0).block_tables(["a", unknown])
    with pytest.raises(InvalidInputError, match=r"^'request_ids' must name each request once "
                       r"\(two rows would share its pages\): items 0 and 2 are 'a'$"):  # fmt: skip
        pool.block_tables(["a", "b", "a"])


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
    config = PlannerConfig(max_num_batched_tokens=32, chunk_alignment=4, policy=policy)
    state = PrefillState.from_prompt_lengths(lengths)
    pool = PagePool[int](num_pages=num_pages, page_size=4)
    plan = plan_step(state, config, pool=pool)
    assert plan.pool is not None
    assert plan.pool.num_used == sum(-(-(c.start + c.length) // 4) for c in plan.rows.values())
    for request, chunk in plan.rows.items():
        assert plan.pool.capacity(request) >= chunk.start + chunk.length


def holds_one_after_another(
    pool: PagePool[int], rows: Mapping[int, StepChunk]
) -> tuple[dict[int, list[int]], list[int]]:
    """The tables and the free pages (in the order they are handed out) once each row, in
    order, has got the free pages it lacks from the front of the free list: the module
    docstring's rule, kept in plain lists."""
    tables = {request: list(pool.pages(request)) for request in pool.owners()}
    free = pool._free_pages()
    for request, chunk in rows.items():
        have = tables.get(request, [])
        missing = max(-(-chunk.end // pool.page_size) - len(have), 0)
        if missing:
            tables[request] = have + free[:missing]
            free = free[missing:]
    return tables, free


@given(st.data(), st.sampled_from(["round_robin", "packed"]), st.sampled_from([None, 4]))
@settings(max_examples=60, deadline=None)
def test_a_steps_holds_made_at_once_take_the_free_pages_in_row_order(
    data: st.DataObject, policy: Policy, page_size: int | None
) -> None:
    # plan_step takes every row's pages in one pass. Other requests hold and release first,
    # and finished requests release as the run goes, so the pages come from runs of freed
    # pages of many lengths as well as never-used ones.
    pool: PagePool[int] = PagePool(num_pages=48, page_size=4)
    for request in data.draw(st.lists(st.integers(100, 104), max_size=12), label="others"):
        if request in pool:
            pool = pool.release(request)
        else:
            pool = pool.hold(request, data.draw(st.integers(1, 16), label="tokens"))
    config = PlannerConfig(
        max_num_batched_tokens=data.draw(st.integers(4, 64), label="budget"),
        long_prefill_token_threshold=data.draw(st.sampled_from([None, 8, 16]), label="cap"),
        max_num_seqs=data.draw(st.sampled_from([None, 2, 5]), label="rows"),
        chunk_alignment=page_size,
        policy=policy,
    )
    lengths = data.draw(st.lists(st.integers(1, 40), min_size=1, max_size=8), label="lengths")
    state = PrefillState.from_prompt_lengths(lengths)
    while state:
        plan = plan_step(state, config, pool=pool)
        if not plan.rows:  # every page is held: a server would preempt
            break
        assert plan.pool is not None
        tables, free = holds_one_after_another(pool, plan.rows)
        assert {r: list(plan.pool.pages(r)) for r in plan.pool.owners()} == tables
        assert plan.pool._free_pages() == free
        assert plan.pool.num_free == len(free)
        pool = plan.pool
        for request in plan.finished:
            pool = pool.release(request)
        state = plan.state


def test_a_pool_with_more_owners_than_one_dict_holds_takes_the_same_pages() -> None:
    # Past 256 owners the owners' map is a trie: a step reads and grows tables through it.
    state = PrefillState.from_prompt_lengths([20] * 300)
    pool: PagePool[int] = PagePool(num_pages=2000, page_size=4)
    for request in range(300):
        pool = pool.hold(request, 4)
    for policy in POLICIES:
        config = PlannerConfig(
            max_num_batched_tokens=64, long_prefill_token_threshold=8, policy=policy
        )
        plan = plan_step(state, config, pool=pool)
        assert plan.rows
        assert plan.pool is not None
        tables, free = holds_one_after_another(pool, plan.rows)
        assert {r: list(plan.pool.pages(r)) for r in plan.pool.owners()} == tables
        assert plan.pool._free_pages() == free


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


# -- plan_step with a bounded pool, over long histories, against a plain model -------------------


@attrs.define
class Plain:
    """A request as the model keeps it."""

    id: int
    length: int
    position: int
    started: bool = False


def plain_chunk(position: int, length: int, limit: int, page: int) -> int:
    """All that is left if it fits, else up to the last page boundary in reach (docs)."""
    if length - position <= limit:
        return length - position
    return max((position + limit) // page * page - position, 0)


class SteppingMachine(RuleBasedStateMachine):
    """Arrivals, aborts, steps with random reservations and preemptions when every page is
    held, over a pool of a few pages; every step's rows are checked against the rules as
    docs/semantics.md and docs/serving.md state them, kept in plain lists and counts."""

    def __init__(self) -> None:
        super().__init__()
        self.config = PlannerConfig(max_num_batched_tokens=1)
        self.state: PrefillState[int] = PrefillState()
        self.pool: PagePool[int] = PagePool(num_pages=1, page_size=1)
        self.requests: list[Plain] = []  # in planning order (round_robin: queue order)
        self.held: dict[int, int] = {}  # pages held, by request
        self.splitting = False  # round_robin: a run that had to split is in progress
        self.arrivals = 0

    @initialize(
        config=planner_configs(max_num_batched_tokens=st.integers(min_value=1, max_value=48)),
        page_size=st.integers(min_value=1, max_value=6),
        num_pages=st.integers(min_value=1, max_value=24),
    )
    def setup(self, config: PlannerConfig, page_size: int, num_pages: int) -> None:
        self.config = config
        self.page_size = page_size
        self.pool = PagePool(num_pages=num_pages, page_size=page_size)
        self.free = num_pages
        # A request alone must fit the pool, or the model would preempt forever.
        self.longest = num_pages * page_size

    @rule(data=st.data())
    def arrive(self, data: st.DataObject) -> None:
        length = data.draw(st.integers(min_value=1, max_value=min(self.longest, 80)))
        cached = data.draw(st.integers(min_value=0, max_value=length - 1))
        self.state = self.state.add(self.arrivals, length, num_computed_tokens=cached)
        self.requests.append(Plain(self.arrivals, length, cached))
        self.arrivals += 1

    @precondition(lambda self: bool(self.requests))
    @rule(data=st.data())
    def abort(self, data: st.DataObject) -> None:
        victim = data.draw(st.sampled_from([r.id for r in self.requests]))
        self.state = self.state.remove(victim)
        self.release(victim)
        self.requests = [r for r in self.requests if r.id != victim]
        self.splitting = self.splitting and bool(self.requests)

    @precondition(lambda self: bool(self.requests))
    @rule(data=st.data())
    def hold_ahead(self, data: st.DataObject) -> None:
        """A request gets pages beyond its position, as a caller may give them (pages
        held but not yet used let it run when no page is free)."""
        plain = data.draw(st.sampled_from(self.requests))
        tokens = plain.position + data.draw(st.integers(min_value=1, max_value=8))
        if self.pool.can_hold(plain.id, tokens):
            self.pool = self.pool.hold(plain.id, tokens)
            need = self.pool.pages_for(tokens) - self.held.get(plain.id, 0)
            if need > 0:
                self.held[plain.id] = self.held.get(plain.id, 0) + need
                self.free -= need

    @rule(
        reserved_tokens=st.integers(min_value=0, max_value=50),
        reserved_rows=st.integers(min_value=0, max_value=3),
    )
    def step(self, reserved_tokens: int, reserved_rows: int) -> None:
        plan = plan_step(
            self.state,
            self.config,
            reserved_tokens=reserved_tokens,
            reserved_rows=reserved_rows,
            pool=self.pool,
        )
        expected = self.model_step(reserved_tokens, reserved_rows)
        assert [(r, c.start, c.length, c.is_final) for r, c in plan.rows.items()] == expected
        assert plan.pool is not None
        self.state, self.pool = plan.state, plan.pool
        for request_id, chunk in plan.rows.items():
            assert self.pool.capacity(request_id) >= chunk.end
            if chunk.is_final:
                self.release(request_id)
        if not plan.rows and self.requests and reserved_tokens == reserved_rows == 0:
            self.preempt_youngest_holder()

    def release(self, request_id: int) -> None:
        self.pool = self.pool.release(request_id)
        self.free += self.held.pop(request_id, 0)

    def preempt_youngest_holder(self) -> None:
        victim = max(self.held)  # a step without room for anyone: some request holds pages
        plain = next(r for r in self.requests if r.id == victim)
        self.release(victim)
        at_front = self.config.policy == "packed"
        self.state = self.state.remove(victim).add(victim, plain.length, at_front=at_front)
        self.requests.remove(plain)
        fresh = Plain(victim, plain.length, 0)
        if at_front:  # ahead of every waiting request, behind the started ones
            index = next((i for i, r in enumerate(self.requests) if not r.started), None)
            self.requests.insert(len(self.requests) if index is None else index, fresh)
        else:
            self.requests.append(fresh)
            self.splitting = self.splitting and len(self.requests) > 1

    # -- the model -------------------------------------------------------------------------

    def page_room(self, request: Plain) -> int:
        return max(
            (self.held.get(request.id, 0) + self.free) * self.page_size - request.position, 0
        )

    def run(self, request: Plain, size: int) -> tuple[int, int, int, bool]:
        row = (request.id, request.position, size, request.position + size == request.length)
        request.position += size
        request.started = True
        need = -(-request.position // self.page_size) - self.held.get(request.id, 0)
        if need > 0:
            self.held[request.id] = self.held.get(request.id, 0) + need
            self.free -= need
        return row

    def model_step(
        self, reserved_tokens: int, reserved_rows: int
    ) -> list[tuple[int, int, int, bool]]:
        config = self.config
        budget = config.max_num_batched_tokens
        packed = config.policy == "packed"
        threshold = config.long_prefill_token_threshold or budget
        cap = min(budget, threshold)
        tokens = max(min(budget if packed else cap, budget - reserved_tokens), 0)
        rows = None if config.max_num_seqs is None else max(config.max_num_seqs - reserved_rows, 0)
        page = config.chunk_alignment or 1
        if not self.requests or tokens == 0 or rows == 0:
            return []
        rows_left = len(self.requests) if rows is None else rows
        if packed:
            # (Reserved rows count only where rows are limited.)
            rows_reserved = reserved_rows if config.max_num_seqs is not None else 0
            alone = len(self.requests) == 1 and reserved_tokens == rows_reserved == 0
            return self.model_packed(budget if alone else cap, tokens, rows_left, page)
        return self.model_round_robin(cap, tokens, rows, page)

    def model_packed(
        self, cap: int, left: int, rows_left: int, page: int
    ) -> list[tuple[int, int, int, bool]]:
        out = []
        max_partial = self.config.max_num_partial_prefills
        for request in [r for r in self.requests if r.started]:
            limit = min(cap, left, self.page_room(request)) if rows_left else 0
            size = plain_chunk(request.position, request.length, limit, page)
            if size:
                out.append(self.run(request, size))
                left, rows_left = left - size, rows_left - 1
        partial = sum(r.started and r.position < r.length for r in self.requests)
        for request in [r for r in self.requests if not r.started]:
            if not (left and rows_left):
                break
            size = plain_chunk(
                request.position, request.length, min(cap, left, self.page_room(request)), page
            )
            whole = size == request.length - request.position
            if size == 0 or (not whole and max_partial is not None and partial >= max_partial):
                break
            out.append(self.run(request, size))
            left, rows_left = left - size, rows_left - 1
            partial += not whole
        self.requests = [r for r in self.requests if r.position < r.length]
        return out

    def model_round_robin(
        self, cap: int, tokens: int, rows: int | None, page: int
    ) -> list[tuple[int, int, int, bool]]:
        requests = self.requests
        total = sum(r.length - r.position for r in requests)
        missing = sum(
            max(-(-r.length // self.page_size) - self.held.get(r.id, 0), 0) for r in requests
        )
        if (
            not self.splitting
            and total <= tokens
            and (rows is None or len(requests) <= rows)
            and missing <= self.free
        ):
            out = [self.run(r, r.length - r.position) for r in list(requests)]
            self.requests = []
            return out
        for request in requests:
            size = plain_chunk(
                request.position, request.length, min(cap, tokens, self.page_room(request)), page
            )
            if size:
                break
        else:
            return []  # the head keeps its turn
        requests.remove(request)
        row = self.run(request, size)
        if request.position < request.length:
            requests.append(request)
        self.splitting = bool(requests)
        return [row]

    @invariant()
    def the_pool_agrees_with_the_counts(self) -> None:
        assert self.pool.num_free == self.free
        assert {r: len(self.pool.pages(r)) for r in self.pool.owners()} == self.held
        assert [(r, self.state[r].num_computed_tokens) for r in self.state] == [
            (r.id, r.position) for r in self.requests
        ]


TestSteppingMachine = SteppingMachine.TestCase
TestSteppingMachine.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)


@settings(max_examples=150, deadline=None)
@given(
    lengths=st.lists(st.integers(min_value=1, max_value=40), min_size=1, max_size=6),
    num_pages=st.integers(min_value=1, max_value=12),
    page_size=st.integers(min_value=1, max_value=4),
    budget=st.integers(min_value=1, max_value=16),
    policy=st.sampled_from(POLICIES),
)
def test_a_request_the_whole_pool_cannot_hold_is_refused_not_left_stuck(
    lengths: list[int], num_pages: int, page_size: int, budget: int, policy: Policy
) -> None:
    # A step that plans no row raises when a request that can take pages needs more than
    # the pool; otherwise the run is stuck only as documented: requests that fit the pool
    # alone hold its pages, and the caller must release one.
    config = PlannerConfig(max_num_batched_tokens=budget, policy=policy)
    state = PrefillState.from_prompt_lengths(lengths)
    pool = PagePool[int](num_pages=num_pages, page_size=page_size)
    too_long = {r for r, length in enumerate(lengths) if -(-length // page_size) > num_pages}
    refused = None
    for _ in range(sum(lengths) + 1):  # a step with rows runs a token at least
        if not state:
            break
        try:
            plan = plan_step(state, config, pool=pool)
        except CacheTooSmallError as error:
            refused = str(error)
            break
        if not plan.rows:
            assert not too_long & set(pool.owners()), "a request longer than the pool is stuck"
            return
        assert plan.pool is not None
        state, pool = plan.state, plan.pool
        for request in plan.finished:
            pool = pool.release(request)
    if refused is not None:
        assert any(f"request {r} needs" in refused for r in too_long), refused
        return
    assert not state
    assert not too_long, "a request longer than the pool finished"


@pytest.mark.parametrize("policy", POLICIES)
def test_a_waiting_request_longer_than_the_pool_is_refused_while_others_hold_every_page(
    policy: Policy,
) -> None:
    """The head of the queue has no pages and cannot get any (the server's decode request
    holds them all); it is longer than the whole pool, so waiting for pages cannot help:
    the step raises now rather than plan nothing until the pages come back."""
    pool = PagePool[str](num_pages=4, page_size=4).hold("decoding", 16)
    state = PrefillState[str]().add("long", 17).add("short", 3)
    config = PlannerConfig(max_num_batched_tokens=8, policy=policy)
    with pytest.raises(CacheTooSmallError, match="request 'long' needs"):
        plan_step(state, config, pool=pool)
    # A head that fits the pool waits for the pages instead.
    fits = PrefillState[str]().add("fits", 16)
    assert not plan_step(fits, config, pool=pool).rows
