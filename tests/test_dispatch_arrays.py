"""``dispatch_arrays``: every kernel array, recomputed token by token in plain Python."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping
from typing import Any

import attrs
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_planner import Case, cases

from pypto_sched import (
    BlockTables,
    CacheTooSmallError,
    Dispatch,
    DispatchArrays,
    GenerationState,
    GenerationStep,
    InvalidInputError,
    PagePool,
    PlannerConfig,
    PrefillState,
    StepChunk,
    StepPlan,
    dispatch_arrays,
    plan_generation_step,
    plan_pages,
    plan_prefill,
    plan_step,
)


@st.composite
def planned_with_tables(draw: st.DrawFn) -> tuple[Case, BlockTables]:
    """A planner case and block tables covering every prompt: scattered pages from a shuffled
    cache (so slots cannot be right by accident), or ``plan_pages``' contiguous ones."""
    case = draw(cases(max_requests=5, max_length=120))
    page = draw(st.integers(1, 40))
    counts = [-(-length // page) + draw(st.integers(0, 2)) for length in case.lengths]
    if draw(st.booleans()):
        num_pages = sum(counts) + draw(st.integers(0, 5))
        order = draw(st.permutations(range(num_pages)))
        tables, used = [], 0
        for count in counts:
            tables.append(list(order[used : used + count]))
            used += count
        blocks = BlockTables.from_lists(tables, page_size=page, num_pages=num_pages)
    else:
        blocks = plan_pages(case.lengths, page_size=page, num_pages=sum(counts))
    return case, blocks


def check_against_tokens(
    arrays: DispatchArrays, rows: list[tuple[int, int, int, bool]], blocks: BlockTables
) -> None:
    """Compare ``arrays`` with what ``rows`` (request, start, length, is_final) imply."""
    page = blocks.page_size
    positions = [p for _, start, length, _ in rows for p in range(start, start + length)]
    width = max(length for _, _, length, _ in rows)
    cu = [0]
    for _, _, length, _ in rows:
        cu.append(cu[-1] + length)
    slots = []
    for request, start, length, _ in rows:
        table = blocks.table(request).tolist()
        slots += [table[p // page] * page + p % page for p in range(start, start + length)]
    pages_needed = [-(-(start + length) // page) for _, start, length, _ in rows]
    table_width = max(pages_needed)

    assert arrays.requests.tolist() == [r for r, _, _, _ in rows]
    assert arrays.token_starts.tolist() == [s for _, s, _, _ in rows]
    assert arrays.token_ends.tolist() == [s + n for _, s, n, _ in rows]
    assert arrays.positions.tolist() == positions
    assert arrays.padded_positions.tolist() == [
        list(range(s, s + n)) + [-1] * (width - n) for _, s, n, _ in rows
    ]
    assert arrays.cu_seqlens.tolist() == cu
    assert arrays.query_lens.tolist() == [n for _, _, n, _ in rows]
    assert arrays.seq_lens.tolist() == [s + n for _, s, n, _ in rows]
    assert arrays.slot_mapping.tolist() == slots
    assert arrays.block_tables.tolist() == [
        blocks.table(r).tolist()[:needed] + [-1] * (table_width - needed)
        for (r, _, _, _), needed in zip(rows, pages_needed, strict=True)
    ]
    assert arrays.is_final.tolist() == [f for _, _, _, f in rows]
    assert arrays.logits_indices.tolist() == [
        cu[i + 1] - 1 for i, (_, _, _, f) in enumerate(rows) if f
    ]
    assert arrays.final_requests.tolist() == [r for r, _, _, f in rows if f]
    assert arrays.page_size == page
    assert arrays.num_rows == len(rows)
    assert arrays.num_tokens == len(positions)
    for i, (request, start, length, _) in enumerate(rows):
        # The per-row helpers, against the same plain loop.
        table = blocks.table(request).tolist()
        assert arrays.row_tokens(i) == slice(cu[i], cu[i + 1])
        assert arrays.context_slots(i).tolist() == [
            table[p // page] * page + p % page for p in range(start + length)
        ]
        assert arrays.context_slots(i)[start:].tolist() == slots[cu[i] : cu[i + 1]]


@given(planned_with_tables())
def test_every_array_matches_the_per_token_definition(
    planned: tuple[Case, BlockTables],
) -> None:
    case, blocks = planned
    schedule = case.plan()
    for dispatch in schedule.dispatches:
        rows = [(c.request, c.start, c.length, c.is_final) for c in dispatch.rows]
        arrays = dispatch_arrays(dispatch, blocks)
        assert arrays.index == dispatch.index
        check_against_tokens(arrays, rows, blocks)


@given(planned_with_tables())
def test_last_tokens_are_the_arrays_of_the_final_rows_last_tokens_alone(
    planned: tuple[Case, BlockTables],
) -> None:
    case, blocks = planned
    for dispatch in case.plan().dispatches:
        arrays = dispatch_arrays(dispatch, blocks)
        rows = [(c.request, c.start + c.length - 1, 1, True) for c in dispatch.rows if c.is_final]
        if not rows:
            assert arrays.last_tokens().num_rows == 0
            continue
        last = arrays.last_tokens()
        assert last.index == dispatch.index
        check_against_tokens(last, rows, blocks)
        np.testing.assert_array_equal(last.positions, arrays.positions[arrays.logits_indices])


KERNEL_DTYPES = {
    "requests": np.int32,
    "token_starts": np.int32,
    "token_ends": np.int32,
    "positions": np.int32,
    "padded_positions": np.int32,
    "cu_seqlens": np.int32,
    "seq_lens": np.int32,
    "slot_mapping": np.int64,
    "block_tables": np.int32,
    "is_final": np.bool_,
    "logits_indices": np.int64,
    "query_lens": np.int32,
    "final_requests": np.int32,
}


@given(planned_with_tables())
def test_arrays_have_kernel_dtypes_and_are_read_only(planned: tuple[Case, BlockTables]) -> None:
    case, blocks = planned
    arrays = dispatch_arrays(case.plan().dispatch(0), blocks)
    for view in (arrays, arrays.last_tokens()):  # every array, derived ones too
        for name, dtype in KERNEL_DTYPES.items():
            array = getattr(view, name)
            assert array.dtype == dtype, name
            assert not array.flags.writeable, name
    assert arrays.padded_positions.ndim == arrays.block_tables.ndim == 2


@given(planned_with_tables())
def test_slots_of_one_dispatch_are_distinct_and_never_shared_across_requests(
    planned: tuple[Case, BlockTables],
) -> None:
    case, blocks = planned
    owner: dict[int, int] = {}
    for dispatch in case.plan().dispatches:
        arrays = dispatch_arrays(dispatch, blocks)
        slots = arrays.slot_mapping.tolist()
        assert len(slots) == len(set(slots))
        token_requests = np.repeat(arrays.requests, arrays.query_lens).tolist()
        for slot, request in zip(slots, token_requests, strict=True):
            assert owner.setdefault(slot, request) == request


def test_the_seed_second_dispatch_of_request_9() -> None:
    config = PlannerConfig(max_num_batched_tokens=8192, long_prefill_token_threshold=256)
    schedule = plan_prefill([3338] * 16, config)
    blocks = plan_pages([3338] * 16, page_size=128, num_pages=16 * 27)
    arrays = dispatch_arrays(schedule.dispatch(41), blocks)
    assert arrays.positions.tolist() == list(range(512, 768))
    assert arrays.cu_seqlens.tolist() == [0, 256]
    assert arrays.seq_lens.tolist() == [768]
    # Request 9 owns pages 9 * 27 .. 9 * 27 + 26; positions 512..767 are its pages 4 and 5.
    assert arrays.slot_mapping.tolist() == list(range((9 * 27 + 4) * 128, (9 * 27 + 6) * 128))
    assert arrays.block_tables.tolist() == [list(range(9 * 27, 9 * 27 + 6))]
    assert arrays.logits_indices.tolist() == []
    last = dispatch_arrays(schedule.dispatch(223), blocks)
    assert last.final_requests.tolist() == [15]
    assert last.logits_indices.tolist() == [9]


def test_packed_dispatch_has_one_logit_per_final_row_at_its_last_token() -> None:
    config = PlannerConfig(  # (a partial limit: the greedy fill, test_golden's first example)
        max_num_batched_tokens=10,
        long_prefill_token_threshold=6,
        max_num_partial_prefills=2,
        policy="packed",
    )
    schedule = plan_prefill([8, 3, 9], config)
    blocks = plan_pages([8, 3, 9], page_size=4, num_pages=8)
    arrays = dispatch_arrays(schedule.dispatch(0), blocks)
    # Rows: request 0 tokens 0..5, request 1 tokens 0..2 (final), request 2 token 0.
    assert arrays.cu_seqlens.tolist() == [0, 6, 9, 10]
    assert arrays.logits_indices.tolist() == [8]
    assert arrays.padded_positions.tolist() == [
        [0, 1, 2, 3, 4, 5],
        [0, 1, 2, -1, -1, -1],
        [0, -1, -1, -1, -1, -1],
    ]
    assert arrays.block_tables.tolist() == [[0, 1], [2, -1], [3, -1]]


def test_a_table_covering_only_the_context_so_far_is_enough() -> None:
    schedule = plan_prefill([10], PlannerConfig(max_num_batched_tokens=4))
    blocks = BlockTables.from_lists([[7]], page_size=4, num_pages=8)
    arrays = dispatch_arrays(schedule.dispatch(0), blocks)
    assert arrays.slot_mapping.tolist() == [28, 29, 30, 31]


def test_a_table_too_short_for_the_context_raises_cache_too_small() -> None:
    schedule = plan_prefill([10], PlannerConfig(max_num_batched_tokens=4))
    blocks = BlockTables.from_lists([[7]], page_size=4, num_pages=8)
    with pytest.raises(
        CacheTooSmallError, match=r"^'block_tables' must cover .*: request 0 needs 2 pages"
    ):
        dispatch_arrays(schedule.dispatch(1), blocks)


def test_tables_for_fewer_requests_than_the_dispatch_names_are_rejected() -> None:
    schedule = plan_prefill([4, 4], PlannerConfig(max_num_batched_tokens=4))
    blocks = plan_pages([4], page_size=4, num_pages=1)
    dispatch_arrays(schedule.dispatch(0), blocks)
    with pytest.raises(InvalidInputError, match="'block_tables' must cover request 1"):
        dispatch_arrays(schedule.dispatch(1), blocks)


# -- the per-row helpers and the statements of docs/writing-a-backend.md --------------------


def _two_dispatches() -> tuple[list[DispatchArrays], BlockTables]:
    schedule = plan_prefill(
        [3, 20],
        PlannerConfig(max_num_batched_tokens=8, policy="packed"),
        num_computed_tokens=[0, 4],
    )
    blocks = BlockTables.from_lists([[5], [4, 0, 2, 6, 1]], page_size=4, num_pages=7)
    return [dispatch_arrays(d, blocks) for d in schedule.dispatches], blocks


def test_token_starts_are_prompt_positions_not_flat_indices() -> None:
    (first, second, *_), _ = _two_dispatches()
    # Request 1 has a cached prefix of 4: its first chunk starts at prompt position 4,
    # while its flat tokens start after request 0's 3 tokens.
    assert first.requests.tolist() == [0, 1]
    assert first.token_starts.tolist() == [0, 4]
    assert first.row_tokens(1) == slice(3, 8)
    assert first.positions[first.row_tokens(1)].tolist() == [4, 5, 6, 7, 8]
    assert second.token_starts.tolist() == [9]
    assert second.row_tokens(0) == slice(0, 8)


def test_cu_seqlens_has_one_entry_per_row_plus_one() -> None:
    dispatches, _ = _two_dispatches()
    for arrays in dispatches:
        assert arrays.cu_seqlens.shape == (arrays.num_rows + 1,)
        assert arrays.cu_seqlens[0] == 0
        assert arrays.cu_seqlens[-1] == arrays.num_tokens


def test_seq_lens_are_the_cached_prefix_plus_earlier_chunks_plus_this_chunk() -> None:
    (first, second, *_), _ = _two_dispatches()
    assert first.seq_lens.tolist() == [3, 4 + 5]
    assert second.seq_lens.tolist() == [4 + 5 + 8]
    assert (second.seq_lens == second.token_ends).all()


def test_block_tables_are_padded_with_minus_one_and_change_width() -> None:
    (first, second, third), _ = _two_dispatches()
    assert first.block_tables.tolist() == [[5, -1, -1], [4, 0, 2]]
    assert second.block_tables.tolist() == [[4, 0, 2, 6, 1]]
    assert third.block_tables.shape[1] == 5
    assert first.block_tables.shape[1] != second.block_tables.shape[1]


def test_context_slots_follow_the_block_table_across_scattered_pages() -> None:
    (first, *_), _ = _two_dispatches()
    assert first.context_slots(0).tolist() == [20, 21, 22]
    assert first.context_slots(1).tolist() == [16, 17, 18, 19, 0, 1, 2, 3, 8]
    assert not first.context_slots(1).flags.writeable


@pytest.mark.parametrize(("row", "message"), [(2, r"\[0, 2\): 2"), (-1, ": -1"), (True, "int")])
def test_a_row_outside_the_dispatch_is_rejected(row: int, message: str) -> None:
    (first, *_), _ = _two_dispatches()
    with pytest.raises(InvalidInputError, match=f"'row' must be .*{message}"):
        first.context_slots(row)
    with pytest.raises(InvalidInputError, match="'row' must be"):
        first.row_tokens(row)


def test_torch_warns_on_a_zero_copy_view_of_a_read_only_array_and_not_on_a_copy() -> None:
    # What docs/writing-a-backend.md says about handing the arrays to torch. Torch warns once
    # per process, so the check runs in a fresh one.
    pytest.importorskip("torch")
    code = """
import warnings
import numpy as np
import torch
from pypto_sched import PlannerConfig, dispatch_arrays, plan_pages, plan_prefill

schedule = plan_prefill([5, 3], PlannerConfig(max_num_batched_tokens=8))
arrays = dispatch_arrays(schedule.dispatch(0), plan_pages([5, 3], page_size=4, num_pages=3))
positions = arrays.positions
with warnings.catch_warnings():
    warnings.simplefilter("error")
    copied = torch.tensor(positions)
    torch.from_numpy(np.array(positions))
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    view = torch.from_numpy(positions)
assert [str(w.message)[:37] for w in caught] == ["The given NumPy array is not writable"]
assert view.data_ptr() == positions.ctypes.data  # zero-copy: the same memory
assert copied.data_ptr() != positions.ctypes.data
assert copied.tolist() == view.tolist() == positions.tolist()
"""
    subprocess.run([sys.executable, "-c", code], check=True)


# -- from a mutation review: last_tokens' table width, and messages that name the right row --


def test_last_tokens_block_tables_are_as_wide_as_the_final_rows_need() -> None:
    # Dispatch 0 runs 6 tokens of request 0 (2 pages, not final), request 1 whole (final, 1
    # page) and a token of request 2: alone, the final row needs a table 1 page wide.
    config = PlannerConfig(
        max_num_batched_tokens=10,
        long_prefill_token_threshold=6,
        max_num_partial_prefills=2,
        policy="packed",
    )
    schedule = plan_prefill([8, 3, 9], config)
    arrays = dispatch_arrays(schedule.dispatch(0), plan_pages([8, 3, 9], page_size=4, num_pages=8))
    assert arrays.block_tables.shape == (3, 2)
    assert arrays.last_tokens().block_tables.tolist() == [[2]]


def test_a_missing_table_names_the_highest_request_of_the_dispatch() -> None:
    dispatch = plan_prefill([4, 4], PlannerConfig(max_num_batched_tokens=8)).dispatch(0)
    tables = plan_pages([4], page_size=4, num_pages=1)
    with pytest.raises(
        InvalidInputError, match=r"^'block_tables' must cover request 1: it has 1 tables$"
    ):
        dispatch_arrays(dispatch, tables)


def test_tables_short_of_pages_name_the_first_short_row() -> None:
    dispatch = plan_prefill([4, 8], PlannerConfig(max_num_batched_tokens=12)).dispatch(0)
    tables = BlockTables.from_lists([[0], [1]], page_size=2, num_pages=8)  # both short
    with pytest.raises(
        CacheTooSmallError,
        match=r"^'block_tables' must cover every row's context: request 0 needs 2 pages for "
        r"context 4 at page_size 2, its table has 1$",
    ):
        dispatch_arrays(dispatch, tables)


# -- a step's rows: the same builder ------------------------------------------------------------


@st.composite
def planned_steps(draw: st.DrawFn) -> list[StepPlan[int] | GenerationStep[int]]:
    """Every step of a generation over a small pool (decode rows, prefill chunks,
    preemptions), or of an online prefill with a pool: each step with its pool."""
    lengths = draw(st.lists(st.integers(1, 40), min_size=1, max_size=5))
    page = draw(st.integers(1, 8))
    budget = draw(st.integers(1, 48))
    config = PlannerConfig(max_num_batched_tokens=budget, policy=draw(st.sampled_from(POLICIES)))
    steps: list[StepPlan[int] | GenerationStep[int]] = []
    if draw(st.booleans()):
        news = draw(st.lists(st.integers(1, 6), min_size=len(lengths), max_size=len(lengths)))
        largest = max(-(-(n + m - 1) // page) for n, m in zip(lengths, news, strict=True))
        state = GenerationState.from_prompt_lengths(
            lengths,
            max_new_tokens=news,
            num_pages=draw(st.integers(largest, largest * len(lengths))),
            page_size=page,
        )
        while state:
            step = plan_generation_step(state, config)
            steps.append(step)
            state = step.state
        return steps
    prefill = PrefillState[int]()
    for request, length in enumerate(lengths):
        prefill = prefill.add(request, length)
    pool = PagePool[int](num_pages=sum(-(-n // page) for n in lengths), page_size=page)
    while prefill:
        plan = plan_step(prefill, config, pool=pool)
        steps.append(plan)
        assert plan.pool is not None
        prefill = plan.state
        pool = plan.pool
        for request in plan.finished:
            pool = pool.release(request)
    return steps


POLICIES = ("packed", "round_robin")


def same_arrays(a: DispatchArrays, b: DispatchArrays) -> bool:
    return all(
        np.array_equal(getattr(a, field.name), getattr(b, field.name))
        for field in attrs.fields(DispatchArrays)
    )


def as_dispatch(rows: Mapping[int, StepChunk], index: int) -> Dispatch:
    """What ``step_arrays`` built before ``dispatch_arrays`` took a step's rows: row ``i``
    of request ``i`` (its table the ``i``-th of ``pool.block_tables(list(rows))``)."""
    chunks = list(rows.values())
    return Dispatch(
        index=index,
        requests=np.arange(len(chunks), dtype=np.int32),
        starts=np.array([c.start for c in chunks], dtype=np.int32),
        lengths=np.array([c.length for c in chunks], dtype=np.int32),
        is_final=np.array([c.is_final for c in chunks], dtype=np.bool_),
    )


@given(planned_steps(), st.integers(0, 5))
def test_a_steps_arrays_are_its_rows_as_a_dispatch_over_the_pools_tables(
    steps: list[StepPlan[int] | GenerationStep[int]], index: int
) -> None:
    for step in steps:
        pool = step.pool
        assert pool is not None
        tables = pool.block_tables(list(step.rows))
        expected = dispatch_arrays(as_dispatch(step.rows, index), tables)
        rows = [(i, c.start, c.length, c.is_final) for i, c in enumerate(step.rows.values())]
        check_against_tokens(expected, rows, tables)
        for arrays in (
            dispatch_arrays(step.rows, pool, index=index),
            dispatch_arrays(step, index=index),
            dispatch_arrays(step, pool, index=index),
            step.arrays(index=index),
        ):
            assert arrays.index == index
            assert same_arrays(arrays, expected)


def test_a_step_plan_without_a_pool_has_no_arrays() -> None:
    plan = plan_step(PrefillState[str]().add("a", 5), PlannerConfig(max_num_batched_tokens=8))
    message = r"^'pool' must be given "
    with pytest.raises(InvalidInputError, match=message):
        plan.arrays()
    with pytest.raises(InvalidInputError, match=message):
        dispatch_arrays(plan)
    pool = PagePool[str](num_pages=2, page_size=4).hold("a", 5)
    assert same_arrays(dispatch_arrays(plan, pool), dispatch_arrays(plan.rows, pool))


def test_a_dispatch_takes_no_index_of_its_own() -> None:
    schedule = plan_prefill([4], PlannerConfig(max_num_batched_tokens=4))
    tables = plan_pages([4], page_size=4, num_pages=1)
    with pytest.raises(InvalidInputError, match=r"^'index' must not be given with a Dispatch"):
        dispatch_arrays(schedule.dispatch(0), tables, index=3)  # type: ignore[call-overload]


@pytest.mark.parametrize("first", [None, 3, [StepChunk(start=0, length=1, is_final=True)]])
def test_what_is_neither_a_dispatch_nor_a_steps_rows_is_named(first: Any) -> None:
    with pytest.raises(InvalidInputError, match=r"^'dispatch' must be a Dispatch \(with Bl"):
        dispatch_arrays(first, None)
