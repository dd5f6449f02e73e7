"""Properties of ``plan_prefill``: the invariants of ``_policies.py``, checked row by row.

Every property re-derives its invariant from the schedule's rows in plain Python rather than
trusting ``Schedule.validate``; ``validate`` is checked separately, as is agreement with the
plain-loop planner in ``tests/oracle.py``.
"""

from __future__ import annotations

import ast
import copy
import inspect
import itertools

import attrs
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from oracle import Row, oracle_plan

from pypto_sched import (
    POLICIES,
    InvalidInputError,
    PlannerConfig,
    Policy,
    PrefillState,
    Schedule,
    plan_one_shot,
    plan_prefill,
    plan_step,
)
from pypto_sched.core._offline import _stable_argsort, _steady_run, fewest_chunks
from pypto_sched.core._policies import (
    admits,
    check_num_computed_tokens,
    chunk_limit,
    chunk_size,
    chunk_sizes,
    fits_one_dispatch,
    full_step,
    leaves_tokens_to_prefill,
    prefill_room,
)

ANY_POLICY: st.SearchStrategy[Policy] = st.sampled_from(POLICIES)


@attrs.frozen
class Case:
    """One planner input: prompt lengths, computed tokens (``None``: all zero) and a config."""

    lengths: list[int]
    computed: list[int] | None
    config: PlannerConfig

    @property
    def start_positions(self) -> list[int]:
        return list(self.computed) if self.computed is not None else [0] * len(self.lengths)

    def plan(self, config: PlannerConfig | None = None) -> Schedule:
        return plan_prefill(self.lengths, config or self.config, num_computed_tokens=self.computed)


@st.composite
def cases(
    draw: st.DrawFn,
    *,
    policies: st.SearchStrategy[Policy] = ANY_POLICY,
    max_requests: int = 8,
    max_length: int = 300,
    max_budget: int = 400,
    page_sizes: bool = True,
    partial_limits: bool = True,
) -> Case:
    """Valid planner inputs, every knob drawn (valid by construction, no filtering)."""
    policy = draw(policies)
    lengths = draw(st.lists(st.integers(1, max_length), min_size=1, max_size=max_requests))
    n = len(lengths)
    computed = draw(
        st.none() | st.tuples(*(st.integers(0, length - 1) for length in lengths)).map(list)
    )
    # Small budgets are where chunking and page rounding bite; draw them often.
    budget = draw(st.integers(1, 12) | st.integers(1, max_budget))
    threshold = draw(st.none() | st.integers(1, max_budget + 50))
    cap = min(budget, threshold or budget)
    page = draw(st.none() | st.integers(1, cap)) if page_sizes else None
    rows = draw(st.none() | st.integers(1, n + 1))
    partial = draw(st.none() | st.integers(1, n)) if policy == "packed" and partial_limits else None
    config = PlannerConfig(
        max_num_batched_tokens=budget,
        long_prefill_token_threshold=threshold,
        max_num_seqs=rows,
        chunk_alignment=page,
        policy=policy,
        max_num_partial_prefills=partial,
    )
    return Case(lengths=lengths, computed=computed, config=config)


def rows_of(schedule: Schedule) -> list[list[Row]]:
    """The schedule in the oracle's format: per dispatch, (request, start, length, is_final)."""
    rows = list(
        zip(
            schedule.requests.tolist(),
            schedule.starts.tolist(),
            schedule.lengths.tolist(),
            schedule.is_final.tolist(),
            strict=True,
        )
    )
    return [rows[lo:hi] for lo, hi in itertools.pairwise(schedule.dispatch_offsets.tolist())]


def partial_counts(dispatches: list[list[Row]], num_requests: int) -> list[int]:
    """Per dispatch: requests started but unfinished once it has run."""
    started: set[int] = set()
    finished: set[int] = set()
    counts = []
    for dispatch in dispatches:
        for request, _, _, final in dispatch:
            started.add(request)
            if final:
                finished.add(request)
        counts.append(len(started - finished))
    assert len(finished) == num_requests
    return counts


# -- the invariants --------------------------------------------------------------------------


@given(cases())
def test_each_request_runs_contiguous_nonempty_chunks_from_computed_count_to_length(
    case: Case,
) -> None:
    position = case.start_positions
    for dispatch in rows_of(case.plan()):
        for request, start, length, _ in dispatch:
            assert length >= 1
            assert start == position[request], "chunk does not continue where the last ended"
            position[request] += length
    assert position == case.lengths


@given(cases())
def test_every_dispatch_is_within_the_token_budget_and_row_limit(case: Case) -> None:
    config = case.config
    for dispatch in rows_of(case.plan()):
        assert sum(length for _, _, length, _ in dispatch) <= config.effective_budget
        if config.max_num_seqs is not None:
            assert len(dispatch) <= config.max_num_seqs


@given(cases())
def test_a_request_appears_at_most_once_per_dispatch(case: Case) -> None:
    for dispatch in rows_of(case.plan()):
        requests = [request for request, _, _, _ in dispatch]
        assert len(requests) == len(set(requests))


@given(cases())
def test_every_chunk_is_within_the_chunk_cap_but_a_packed_request_left_alone(case: Case) -> None:
    # The work-conserving tail: under packed, a request whose dispatch and every later one
    # hold no other request may run up to the whole budget.
    config = case.config
    dispatches = rows_of(case.plan())
    seen_from: list[set[int]] = []  # per dispatch, from the last: the requests from it on
    seen: set[int] = set()
    for dispatch in reversed(dispatches):
        seen = seen | {request for request, _, _, _ in dispatch}
        seen_from.append(seen)
    seen_from.reverse()
    for dispatch, requests_from_here in zip(dispatches, seen_from, strict=True):
        for request, _, length, _ in dispatch:
            if length > config.chunk_cap:
                assert config.policy == "packed"
                assert requests_from_here == {request}
                assert length <= config.max_num_batched_tokens


@given(cases())
def test_every_non_final_chunk_ends_on_a_page_boundary(case: Case) -> None:
    page = case.config.chunk_alignment
    for dispatch in rows_of(case.plan()):
        for _, start, length, final in dispatch:
            if page is not None and not final:
                assert (start + length) % page == 0


@given(cases())
def test_each_request_has_exactly_one_final_chunk_and_it_is_the_last(case: Case) -> None:
    finals: dict[int, list[bool]] = {r: [] for r in range(len(case.lengths))}
    for dispatch in rows_of(case.plan()):
        for request, _, _, final in dispatch:
            finals[request].append(final)
    for flags in finals.values():
        assert flags[-1] is True
        assert not any(flags[:-1])


@given(cases())
def test_every_dispatch_makes_progress(case: Case) -> None:
    schedule = case.plan()
    dispatches = rows_of(schedule)
    assert dispatches
    for dispatch in dispatches:
        assert dispatch
        assert sum(length for _, _, length, _ in dispatch) >= 1
    assert schedule.num_dispatches == len(dispatches)


@given(cases(policies=st.just("packed")), st.integers(1, 8))
def test_at_most_max_num_partial_prefills_requests_are_part_way_after_any_dispatch(
    case: Case, limit: int
) -> None:
    config = attrs.evolve(case.config, max_num_partial_prefills=limit)
    counts = partial_counts(rows_of(case.plan(config)), len(case.lengths))
    assert max(counts) <= limit


@given(cases())
def test_the_lower_bound_is_never_beaten(case: Case) -> None:
    schedule = case.plan()
    assert 1 <= schedule.lower_bound <= schedule.num_dispatches


@given(cases())
def test_no_schedule_holds_fewer_chunks_than_the_chunk_limit_counts(case: Case) -> None:
    # The count that MAX_CHUNKS is checked against, before planning, is a lower bound.
    schedule = case.plan()
    remaining = schedule.prompt_lengths - schedule.num_computed_tokens
    assert fewest_chunks(remaining, schedule.config) <= schedule.num_chunks


@given(cases())
def test_every_planned_schedule_validates(case: Case) -> None:
    case.plan().validate()


# -- purity ----------------------------------------------------------------------------------


@given(cases(), st.sampled_from(["list", "tuple", "int64", "int32", "uint16"]))
def test_planning_is_deterministic_and_leaves_inputs_unchanged(case: Case, kind: str) -> None:
    def as_input(values: list[int]) -> list[int] | tuple[int, ...] | np.ndarray:
        if kind == "list":
            return list(values)
        if kind == "tuple":
            return tuple(values)
        return np.array(values, dtype=kind)

    lengths = as_input(case.lengths)
    computed = None if case.computed is None else as_input(case.computed)
    before = copy.deepcopy((lengths, computed))
    first = plan_prefill(lengths, case.config, num_computed_tokens=computed)
    second = plan_prefill(lengths, case.config, num_computed_tokens=computed)
    assert first == second
    assert hash(first) == hash(second)
    assert first is not second
    for given_value, kept in zip((lengths, computed), before, strict=True):
        if isinstance(given_value, np.ndarray):
            assert isinstance(kept, np.ndarray)
            assert given_value.flags.writeable
            assert given_value.dtype == kept.dtype
            np.testing.assert_array_equal(given_value, kept)
        else:
            assert given_value == kept


def test_the_schedule_does_not_alias_an_input_array() -> None:
    lengths = np.array([5, 7], dtype=np.int64)
    computed = np.array([1, 2], dtype=np.int64)
    schedule = plan_prefill(
        lengths, PlannerConfig(max_num_batched_tokens=4), num_computed_tokens=computed
    )
    lengths[:] = 99
    computed[:] = 0
    assert schedule.prompt_lengths.tolist() == [5, 7]
    assert schedule.num_computed_tokens.tolist() == [1, 2]


@given(cases())
def test_schedule_arrays_are_read_only(case: Case) -> None:
    schedule = case.plan()
    for name in (
        "prompt_lengths",
        "num_computed_tokens",
        "dispatch_offsets",
        "requests",
        "starts",
        "lengths",
        "is_final",
    ):
        array = getattr(schedule, name)
        assert not array.flags.writeable, name
        with pytest.raises(ValueError, match="read-only"):
            array[...] = 0


# -- metamorphic relations -------------------------------------------------------------------


@given(cases(policies=st.just("round_robin")), st.integers(1, 500))
def test_round_robin_larger_max_num_batched_tokens_never_adds_dispatches(
    case: Case, extra: int
) -> None:
    config = case.config
    larger = attrs.evolve(config, max_num_batched_tokens=config.max_num_batched_tokens + extra)
    assert case.plan(larger).num_dispatches <= case.plan().num_dispatches


@given(cases(policies=st.just("packed"), page_sizes=False), st.integers(1, 500))
def test_packed_larger_max_num_batched_tokens_never_adds_dispatches_without_pages(
    case: Case, extra: int
) -> None:
    # Without page_size only: with pages a larger budget can add dispatches, see below.
    config = case.config
    larger = attrs.evolve(config, max_num_batched_tokens=config.max_num_batched_tokens + extra)
    assert case.plan(larger).num_dispatches <= case.plan().num_dispatches


def test_packed_with_pages_a_larger_budget_can_add_dispatches() -> None:
    # The documented exception to budget monotonicity (docs/semantics.md): with budget 13 the
    # 6 tokens left after request 0's final chunk are a full page for request 1, which then
    # holds back requests 2 and 3; with budget 12 only 5 are left, request 1 skips that
    # dispatch and request 2 finishes in it.
    lengths = [13, 22, 2, 20]
    config = PlannerConfig(
        max_num_batched_tokens=12,
        long_prefill_token_threshold=8,
        chunk_alignment=6,
        policy="packed",
    )
    larger = attrs.evolve(config, max_num_batched_tokens=13)
    assert plan_prefill(lengths, config).num_dispatches == 5
    assert plan_prefill(lengths, larger).num_dispatches == 6


@st.composite
def packed_with_long_threshold(draw: st.DrawFn) -> tuple[Case, PlannerConfig]:
    """A packed case without a threshold, and the same config with a threshold at least the
    longest prompt."""
    case = draw(cases(policies=st.just("packed")))
    base = attrs.evolve(case.config, long_prefill_token_threshold=None)
    floor = max(max(case.lengths), base.chunk_alignment or 1)
    threshold = draw(st.integers(floor, floor + 1000))
    with_threshold = attrs.evolve(base, long_prefill_token_threshold=threshold)
    return attrs.evolve(case, config=base), with_threshold


@given(packed_with_long_threshold())
def test_packed_threshold_at_least_the_longest_prompt_changes_nothing(
    pair: tuple[Case, PlannerConfig],
) -> None:
    case, with_threshold = pair
    assert rows_of(case.plan(with_threshold)) == rows_of(case.plan())


@st.composite
def cases_that_fit_one_dispatch(draw: st.DrawFn) -> Case:
    """A case whose budget holds every request whole, with rows enough for all of them."""
    case = draw(cases())
    remaining = [
        length - start for length, start in zip(case.lengths, case.start_positions, strict=True)
    ]
    total = sum(remaining)
    budget = draw(st.integers(total, total + 100))
    # round_robin's budget is lowered to the threshold; packed caps each request by it.
    floor = total if case.config.policy == "round_robin" else max(remaining)
    threshold = draw(st.none() | st.integers(floor, budget + 100))
    rows = draw(st.none() | st.integers(len(case.lengths), len(case.lengths) + 3))
    page = draw(st.none() | st.integers(1, min(budget, threshold or budget)))
    config = attrs.evolve(
        case.config,
        max_num_batched_tokens=budget,
        long_prefill_token_threshold=threshold,
        max_num_seqs=rows,
        chunk_alignment=page,
    )
    return attrs.evolve(case, config=config)


@given(cases_that_fit_one_dispatch())
def test_a_budget_holding_the_whole_batch_gives_one_dispatch_of_every_request(
    case: Case,
) -> None:
    whole = [
        (r, start, length - start, True)
        for r, (length, start) in enumerate(zip(case.lengths, case.start_positions, strict=True))
    ]
    assert rows_of(case.plan()) == [whole]


# -- agreement with the oracle ---------------------------------------------------------------


@given(cases())
@example(
    Case(
        lengths=[3338] * 16,
        computed=None,
        config=PlannerConfig(max_num_batched_tokens=8192, long_prefill_token_threshold=256),
    )
)
@example(
    Case(
        lengths=[3338] * 16,
        computed=None,
        config=PlannerConfig(
            max_num_batched_tokens=8192,
            long_prefill_token_threshold=256,
            max_num_seqs=16,
            policy="packed",
        ),
    )
)
def test_plan_prefill_matches_the_oracle_dispatch_for_dispatch(case: Case) -> None:
    expected = oracle_plan(case.lengths, case.config, case.computed)
    assert rows_of(case.plan()) == expected


@settings(max_examples=300)
@given(cases(max_requests=4, max_length=12, max_budget=10))
@example(  # a due entry's extra tokens equal to a request id: the request must go, not them
    Case(
        lengths=[9, 12],
        computed=None,
        config=PlannerConfig(
            max_num_batched_tokens=10,
            long_prefill_token_threshold=8,
            chunk_alignment=5,
            policy="packed",
        ),
    )
)
def test_plan_prefill_matches_the_oracle_on_tiny_inputs(case: Case) -> None:
    # Small numbers make coincidences (a count equal to an id, a chunk equal to a page) common.
    assert rows_of(case.plan()) == oracle_plan(case.lengths, case.config, case.computed)


@settings(max_examples=25)
@given(
    cases(max_requests=40, max_length=4000, max_budget=3000),
)
def test_plan_prefill_matches_the_oracle_on_larger_batches(case: Case) -> None:
    # Long runs of equal chunks exercise the packed planner's bulk ("steady") path.
    expected = oracle_plan(case.lengths, case.config, case.computed)
    assert rows_of(case.plan()) == expected


@st.composite
def steady_packed_cases(draw: st.DrawFn) -> Case:
    """Many requests, a page-aligned threshold and a budget of several chunks: the packed
    planner's steady runs start, stop and restart as requests finish and rows free up."""
    page = draw(st.none() | st.sampled_from([1, 2, 4, 16]))
    threshold = (page or 1) * draw(st.integers(1, 40))
    budget = threshold * draw(st.integers(1, 6)) + draw(st.integers(0, threshold))
    n = draw(st.integers(1, 30))
    lengths = draw(st.lists(st.integers(1, 12 * threshold), min_size=n, max_size=n))
    computed = draw(st.none() | st.tuples(*(st.integers(0, x - 1) for x in lengths)).map(list))
    config = PlannerConfig(
        max_num_batched_tokens=budget,
        long_prefill_token_threshold=threshold,
        max_num_seqs=draw(st.none() | st.integers(1, n + 1)),
        chunk_alignment=page,
        policy="packed",
        max_num_partial_prefills=draw(st.none() | st.integers(1, n)),
    )
    return Case(lengths=lengths, computed=computed, config=config)


@settings(max_examples=40)
@given(steady_packed_cases())
def test_packed_matches_the_oracle_when_many_requests_run_in_step(case: Case) -> None:
    expected = oracle_plan(case.lengths, case.config, case.computed)
    assert rows_of(case.plan()) == expected


# -- packed against the lower bound ----------------------------------------------------------


@st.composite
def realistic_packed_workloads(draw: st.DrawFn) -> tuple[list[int], PlannerConfig]:
    """Equal or uniformly random lengths; budget k * threshold with k >= 2; page_size (if
    any) dividing the threshold; no prefix hits; rows enough for every request."""
    threshold = draw(st.sampled_from([16, 32, 64, 128, 256]))
    budget = threshold * draw(st.integers(2, 16))
    page = draw(st.none() | st.sampled_from([1, 8, 16]))
    n = draw(st.integers(1, 96))
    longest = draw(st.integers(1, 4096))
    if draw(st.booleans()):
        lengths = [longest] * n
    else:
        lengths = draw(st.lists(st.integers(1, longest), min_size=n, max_size=n))
    config = PlannerConfig(
        max_num_batched_tokens=budget,
        long_prefill_token_threshold=threshold,
        max_num_seqs=draw(st.none() | st.integers(n, 2 * n)),
        chunk_alignment=page,
        policy="packed",
    )
    return lengths, config


@given(realistic_packed_workloads())
def test_packed_is_within_one_cap_bound_of_the_token_bound(
    workload: tuple[list[int], PlannerConfig],
) -> None:
    """D <= floor(T / (B - P + 1)) + ceil(L_max / C).

    T tokens, budget B, threshold C (a multiple of chunk_alignment P), longest prompt L_max. While
    a dispatch ends with at least P tokens of budget left, every request has been admitted and
    each ran min(C, remaining); from then on every dispatch does, so there are at most
    ceil(L_max / C) such dispatches, and every other dispatch carries more than B - P tokens.
    With P = 1 this is at most tokens bound + cap bound <= 2 * lower_bound.
    """
    lengths, config = workload
    schedule = plan_prefill(lengths, config)
    budget, cap, page = config.max_num_batched_tokens, config.chunk_cap, config.chunk_alignment or 1
    bound = sum(lengths) // (budget - page + 1) + -(-max(lengths) // cap)
    assert schedule.lower_bound <= schedule.num_dispatches <= bound


@given(realistic_packed_workloads())
def test_packed_meets_the_lower_bound_when_every_request_fits_one_dispatch_at_the_cap(
    workload: tuple[list[int], PlannerConfig],
) -> None:
    lengths, config = workload
    lengths = lengths[: config.max_num_batched_tokens // config.chunk_cap]
    schedule = plan_prefill(lengths, config)
    assert schedule.num_dispatches == schedule.lower_bound


def test_packed_work_conserving_tail_runs_a_request_left_alone_with_the_whole_budget() -> None:
    # 16 equal prompts where 15 chunks fill the budget. The 16th starts only as the first 15
    # finish; left alone, it runs the whole budget per dispatch (without the tail it ran 113
    # dispatches of 64 tokens, 227 in all) and the schedule meets the bound.
    config = PlannerConfig(
        max_num_batched_tokens=15 * 64, long_prefill_token_threshold=64, policy="packed"
    )
    schedule = plan_prefill([7261] * 16, config)
    assert schedule.lower_bound == schedule.num_dispatches == 122
    solo = [d for d in schedule.dispatches if d.num_rows == 1]
    assert {int(d.requests[0]) for d in solo} == {15}
    # One 64-token chunk beside the others, then seven whole budgets and the rest.
    assert [int(d.lengths[0]) for d in solo] == [15 * 64] * 7 + [7261 - 64 - 7 * 15 * 64]
    # round_robin keeps the seed's cap to the end.
    seed = plan_prefill([7261] * 16, attrs.evolve(config, policy="round_robin"))
    assert seed.lengths.max() == 64


# -- the rule functions ------------------------------------------------------------------------
# Each scheduling decision is one function of ``_policies.py``; these state each rule from
# its definition in the header, and check that both planners make the decision through it.


@st.composite
def chunk_inputs(draw: st.DrawFn) -> tuple[int, int, int, int]:
    """(start, length, limit, page) with ``0 <= start < length`` and ``page <= limit``."""
    length = draw(st.integers(1, 2000))
    start = draw(st.integers(0, length - 1))
    limit = draw(st.integers(1, 600))
    page = draw(st.integers(1, limit))
    return start, length, limit, page


@given(chunk_inputs())
def test_chunk_size_runs_all_that_is_left_if_it_fits_else_up_to_a_page_boundary(
    inputs: tuple[int, int, int, int],
) -> None:
    start, length, limit, page = inputs
    size = chunk_size(start, length, limit, page)
    if length - start <= limit:
        assert size == length - start
    else:
        assert 0 <= size <= limit
        assert size == 0 or (start + size) % page == 0
        # The last boundary in reach: one more page would pass the limit.
        assert (start + size) // page * page + page > start + limit


@given(st.lists(chunk_inputs(), min_size=1, max_size=20), st.data())
def test_chunk_sizes_is_chunk_size_for_each_request(
    inputs: list[tuple[int, int, int, int]], data: st.DataObject
) -> None:
    limit = min(limit for _, _, limit, _ in inputs)
    page = data.draw(st.integers(1, limit))
    starts = np.array([start for start, _, _, _ in inputs], dtype=np.int64)
    lengths = np.array([length for _, length, _, _ in inputs], dtype=np.int64)
    expected = [chunk_size(s, n, limit, page) for s, n in zip(starts, lengths, strict=True)]
    assert chunk_sizes(starts, lengths, limit, page).tolist() == expected


@given(chunk_inputs(), st.integers(1, 10))
def test_full_step_is_the_chunk_from_any_page_boundary_with_more_than_the_limit_left(
    inputs: tuple[int, int, int, int], pages: int
) -> None:
    _, _, limit, page = inputs
    start = pages * page
    assert full_step(limit, page) == chunk_size(start, start + limit + 1, limit, page)
    assert full_step(limit, page) == limit // page * page


@pytest.mark.parametrize(
    ("cap", "tokens_left", "rows_left", "expected"),
    [(256, 1000, 3, 256), (256, 100, 3, 100), (256, 1000, 0, 0), (256, 0, 5, 0)],
)
def test_chunk_limit_is_the_cap_within_the_budget_left_while_a_row_is_free(
    cap: int, tokens_left: int, rows_left: int, expected: int
) -> None:
    assert chunk_limit(cap, tokens_left, rows_left) == expected


@pytest.mark.parametrize(
    ("size", "remaining", "num_partial", "max_partial", "expected"),
    [
        (0, 10, 0, None, False),  # no token runs
        (10, 10, 5, 1, True),  # a whole prefill needs no partial place
        (4, 10, 0, 1, True),
        (4, 10, 1, 1, False),  # part-way, and the partial places are taken
        (4, 10, 99, None, True),
    ],
)
def test_admits_needs_a_token_and_a_partial_place_for_a_chunk_that_leaves_it_part_way(
    size: int, remaining: int, num_partial: int, max_partial: int | None, expected: bool
) -> None:
    assert admits(size, remaining, num_partial, max_partial) is expected


@pytest.mark.parametrize(
    ("tokens", "requests", "budget", "max_rows", "expected"),
    [(256, 16, 256, None, True), (257, 1, 256, None, False), (10, 5, 256, 4, False)],
)
def test_fits_one_dispatch_needs_the_tokens_in_the_budget_and_the_requests_in_the_rows(
    tokens: int, requests: int, budget: int, max_rows: int | None, expected: bool
) -> None:
    assert fits_one_dispatch(tokens, requests, budget, max_rows) is expected


def test_no_planner_rounds_to_a_page_but_the_chunk_rule() -> None:
    """The page rounding ``x // page * page`` appears only in ``chunk_size`` and its array
    form: the planners call them rather than restate the rule."""
    from pypto_sched.core import _offline, _online, _policies

    for module in (_policies, _offline, _online):
        tree = ast.parse(inspect.getsource(module))
        for function in ast.walk(tree):
            if not isinstance(function, ast.FunctionDef):
                continue
            for node in ast.walk(function):
                rounds = (
                    isinstance(node, ast.BinOp)
                    and isinstance(node.op, ast.Mult)
                    and isinstance(node.left, ast.BinOp)
                    and isinstance(node.left.op, ast.FloorDiv)
                )
                assert not rounds or function.name in {"chunk_size", "chunk_sizes"}, (
                    f"{module.__name__}.{function.name} rounds to a page itself"
                )


def test_both_planners_admit_through_the_one_admission_rule(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Replace ``admits`` by a stricter rule (no request may start part-way while another
    is): offline and online plans change, and still agree."""
    from pypto_sched.core import _offline, _online

    def one_partial_at_most(size: int, remaining: int, num_partial: int, _: int | None) -> bool:
        return size > 0 and (size == remaining or num_partial == 0)

    config = PlannerConfig(max_num_batched_tokens=64, long_prefill_token_threshold=32)
    config = attrs.evolve(config, policy="packed")
    lengths = [100, 20, 100, 100]
    before = rows_of(plan_prefill(lengths, config))
    monkeypatch.setattr(_offline, "admits", one_partial_at_most)
    monkeypatch.setattr(_online, "admits", one_partial_at_most)
    offline = rows_of(plan_prefill(lengths, config))
    assert offline != before
    assert offline == oracle_plan(lengths, attrs.evolve(config, max_num_partial_prefills=1))
    state = PrefillState.from_prompt_lengths(lengths)
    online: list[list[Row]] = []
    while state:
        plan = plan_step(state, config)
        online.append([(r, c.start, c.length, c.is_final) for r, c in plan.rows.items()])
        state = plan.state
    assert online == offline


@given(st.lists(st.tuples(st.integers(1, 100), st.integers(0, 120)), min_size=1, max_size=20))
def test_the_prefix_cache_rule_is_the_same_for_one_request_and_a_batch(
    requests: list[tuple[int, int]],
) -> None:
    lengths = np.array([length for length, _ in requests], dtype=np.int64)
    computed = np.array([cached for _, cached in requests], dtype=np.int64)
    each = [leaves_tokens_to_prefill(c, n) for n, c in requests]
    assert leaves_tokens_to_prefill(computed, lengths).tolist() == each
    assert each == [c < n for n, c in requests]
    if all(each):
        assert check_num_computed_tokens(computed, lengths).tolist() == computed.tolist()
    else:
        with pytest.raises(InvalidInputError, match=f"item {each.index(False)} is "):
            check_num_computed_tokens(computed, lengths)


@pytest.mark.parametrize(
    ("config", "reserved_tokens", "reserved_rows", "expected"),
    [
        # round_robin: decodes count against the whole budget, prefill keeps the threshold.
        (
            PlannerConfig(max_num_batched_tokens=1024, long_prefill_token_threshold=256),
            700,
            0,
            (256, None),
        ),
        (
            PlannerConfig(max_num_batched_tokens=1024, long_prefill_token_threshold=256),
            900,
            5,
            (124, None),
        ),
        # packed: the budget less the decodes; reservations above the dispatch leave nothing.
        (
            PlannerConfig(max_num_batched_tokens=256, max_num_seqs=4, policy="packed"),
            56,
            1,
            (200, 3),
        ),
        (
            PlannerConfig(max_num_batched_tokens=256, max_num_seqs=4, policy="packed"),
            999,
            9,
            (0, 0),
        ),
    ],
)
def test_prefill_room_is_the_dispatch_less_the_decodes_within_the_effective_budget(
    config: PlannerConfig,
    reserved_tokens: int,
    reserved_rows: int,
    expected: tuple[int, int | None],
) -> None:
    assert prefill_room(config, reserved_tokens, reserved_rows) == expected


# -- the fast paths of the offline planners ----------------------------------------------------
# Each is derived from the rule functions; these check the derivation and drive each path
# against the oracle on the workloads that exercise its boundaries.


@given(chunk_inputs(), st.integers(0, 10))
@example((0, 1, 10, 3), 0)  # a short last chunk under a step shorter than the cap
@example((0, 10, 10, 3), 2)  # all left fits the cap, not a step
@example((0, 19, 10, 3), 1)  # one step, then more than a step
def test_a_steady_run_is_the_chunk_rule_applied_with_the_cap_every_dispatch(
    inputs: tuple[int, int, int, int], pages: int
) -> None:
    _, after, cap, page = inputs
    start = pages * page  # a page boundary
    steps, last = _steady_run(after, cap, full_step(cap, page))
    chunks = []
    position, length = start, start + after
    while position < length:
        chunks.append(chunk_size(position, length, cap, page))
        position += chunks[-1]
    assert chunks == [full_step(cap, page)] * steps + [last]
    many_steps, many_lasts = _steady_run(np.array([after, after]), cap, full_step(cap, page))
    assert many_steps.tolist() == [steps] * 2
    assert many_lasts.tolist() == [last] * 2


@given(st.integers(1, 600), st.integers(0, 2000), st.integers(0, 50))
def test_chunk_limit_is_the_cap_exactly_while_a_cap_and_a_row_are_left(
    cap: int, tokens_left: int, rows_left: int
) -> None:
    # What packed's batch admission relies on to size a batch by prefix sums.
    is_cap = chunk_limit(cap, tokens_left, rows_left) == cap
    assert is_cap == (tokens_left >= cap and rows_left >= 1)


@given(st.integers(1, 50), st.none() | st.integers(1, 60), st.data())
def test_admitting_a_part_way_chunk_with_every_request_part_way_admits_any_chunk(
    n: int, max_partial: int | None, data: st.DataObject
) -> None:
    # packed admits a batch without asking `admits` per request when this holds.
    if not admits(1, 2, n, max_partial):
        return
    size = data.draw(st.integers(1, 1000))
    remaining = data.draw(st.integers(size, 2000))
    assert admits(size, remaining, data.draw(st.integers(0, n)), max_partial)


@st.composite
def batch_admission_cases(draw: st.DrawFn) -> Case:
    """Many short prompts around the cap (shorter, equal, a page or a token longer), a budget
    of a few caps and a remainder, and every other knob drawn: ``packed`` admits whole runs
    of new requests at once and the batches end on the budget, the rows, a partial limit,
    a page or the lone tail."""
    page = draw(st.none() | st.sampled_from([1, 2, 4, 8]))
    cap = (page or 1) * draw(st.integers(1, 12))
    threshold = draw(st.none() | st.just(cap))
    budget = cap * draw(st.integers(1, 6)) + draw(st.integers(0, cap))
    if threshold is None:
        cap = budget
        page = None if page is None or page > budget else page
    n = draw(st.integers(1, 60))
    around = st.sampled_from([1, cap // 2 + 1, cap - 1, cap, cap + 1, cap + (page or 1)])
    length = st.integers(1, 2 * cap + 3) | around.filter(lambda x: x >= 1) | st.integers(1, 8 * cap)
    lengths = draw(st.lists(length, min_size=n, max_size=n))
    computed = draw(st.none() | st.tuples(*(st.integers(0, x - 1) for x in lengths)).map(list))
    config = PlannerConfig(
        max_num_batched_tokens=budget,
        long_prefill_token_threshold=threshold,
        max_num_seqs=draw(st.none() | st.integers(1, n + 1)),
        chunk_alignment=page,
        policy="packed",
        max_num_partial_prefills=draw(st.none() | st.integers(1, n + 1)),
    )
    return Case(lengths=lengths, computed=computed, config=config)


@settings(max_examples=60)
@given(batch_admission_cases())
def test_packed_batch_admission_matches_the_oracle(case: Case) -> None:
    expected = oracle_plan(case.lengths, case.config, case.computed)
    assert rows_of(case.plan()) == expected


@st.composite
def round_robin_block_cases(draw: st.DrawFn) -> Case:
    """Requests with many distinct numbers of chunks, some far apart (blocks of many rounds
    between two requests' last rounds), with pages and prefix hits."""
    page = draw(st.none() | st.sampled_from([1, 3, 8]))
    budget = (page or 1) * draw(st.integers(1, 5)) + draw(st.integers(0, 2))
    n = draw(st.integers(2, 40))
    lengths = draw(
        st.lists(st.integers(1, 3 * budget) | st.integers(1, 40 * budget), min_size=n, max_size=n)
    )
    computed = draw(st.none() | st.tuples(*(st.integers(0, x - 1) for x in lengths)).map(list))
    config = PlannerConfig(
        max_num_batched_tokens=budget + draw(st.integers(0, 3)),
        long_prefill_token_threshold=budget,
        max_num_seqs=draw(st.none() | st.integers(1, n + 1)),
        chunk_alignment=page,
    )
    return Case(lengths=lengths, computed=computed, config=config)


@settings(max_examples=60)
@given(round_robin_block_cases())
def test_round_robin_blocks_match_the_oracle(case: Case) -> None:
    expected = oracle_plan(case.lengths, case.config, case.computed)
    assert rows_of(case.plan()) == expected


@pytest.mark.parametrize("policy", POLICIES)
def test_a_few_thousand_uniform_prompts_match_the_oracle(policy: Policy) -> None:
    # Every path at once at a scale where batches, blocks and cut runs are common.
    rng = np.random.default_rng(14)
    lengths = rng.integers(1, 1024, 3000).tolist()
    computed = [int(rng.integers(0, length)) if length % 7 == 0 else 0 for length in lengths]
    for config in (
        PlannerConfig(max_num_batched_tokens=1000, long_prefill_token_threshold=64, policy=policy),
        PlannerConfig(
            max_num_batched_tokens=1024,
            long_prefill_token_threshold=96,
            max_num_seqs=12,
            chunk_alignment=16,
            policy=policy,
        ),
    ):
        schedule = plan_prefill(lengths, config, num_computed_tokens=computed)
        assert rows_of(schedule) == oracle_plan(lengths, config, computed)


@given(st.lists(st.integers(0, 200_000), max_size=300), st.integers(0, 3))
def test_the_radix_argsort_is_a_stable_sort(values: list[int], spread: int) -> None:
    keys = np.array(values, dtype=np.int64) * (1 + spread * 997)
    bound = int(keys.max()) + 1 if keys.size else 1
    expected = np.argsort(keys, kind="stable")
    assert _stable_argsort(keys, bound).tolist() == expected.tolist()


def tiny_configs() -> list[PlannerConfig]:
    """Every config with a budget of at most 6 tokens and at most 2 rows (or none)."""
    configs = []
    for budget in range(1, 7):
        for threshold in (None, *range(1, budget + 1)):
            cap = min(budget, threshold or budget)
            for page, rows, policy in itertools.product(
                (None, *range(1, cap + 1)), (None, 1, 2), POLICIES
            ):
                for partial in (None, 1) if policy == "packed" else (None,):
                    configs.append(
                        PlannerConfig(
                            max_num_batched_tokens=budget,
                            long_prefill_token_threshold=threshold,
                            chunk_alignment=page,
                            max_num_seqs=rows,
                            policy=policy,
                            max_num_partial_prefills=partial,
                        )
                    )
    return configs


@pytest.mark.exhaustive
def test_plan_prefill_matches_the_oracle_on_every_tiny_input() -> None:
    # Exhaustive where random draws miss coincidences of small numbers: every config above
    # against every batch of up to 3 prompts of up to 6 tokens.
    batches = [
        list(lengths) for n in (1, 2, 3) for lengths in itertools.product(range(1, 7), repeat=n)
    ]
    for config in tiny_configs():
        for lengths in batches:
            schedule = plan_prefill(lengths, config)
            assert rows_of(schedule) == oracle_plan(lengths, config), (lengths, config)


def test_a_one_shot_plan_that_no_dispatch_can_hold_says_so() -> None:
    assert plan_one_shot([2**30, 2**30 - 1]).num_dispatches == 1
    with pytest.raises(
        InvalidInputError, match=r"'prompt_lengths' must .* one-shot .* 2,147,483,648"
    ):
        plan_one_shot([2**30, 2**30])
    chunked = plan_prefill([2**30, 2**30], PlannerConfig(max_num_batched_tokens=2**20))
    assert chunked.lower_bound == chunked.num_dispatches == 2**11
