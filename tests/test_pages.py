"""Block tables: ``plan_pages`` and ``BlockTables.from_lists``."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pypto_sched import BlockTables, CacheTooSmallError, InvalidInputError, plan_pages

lengths_lists = st.lists(st.integers(1, 5000), min_size=1, max_size=20)
page_sizes = st.integers(1, 300)
new_tokens = st.integers(0, 2000)


def pages_needed(lengths: list[int], page: int, new: int) -> int:
    return sum(-(-(length + new) // page) for length in lengths)


@given(lengths_lists, page_sizes, new_tokens, st.integers(0, 50))
def test_plan_pages_hands_out_contiguous_unshared_pages_in_request_order(
    lengths: list[int], page: int, new: int, slack: int
) -> None:
    num_pages = pages_needed(lengths, page, new) + slack
    blocks = plan_pages(lengths, page_size=page, num_pages=num_pages, max_new_tokens=new)
    tables = [blocks.table(r).tolist() for r in range(len(lengths))]
    flat = [p for table in tables for p in table]
    assert flat == list(range(len(flat)))
    assert len(flat) == len(set(flat))
    assert all(0 <= p < num_pages for p in flat)
    assert blocks.num_requests == len(lengths)
    assert blocks.num_pages == num_pages
    assert blocks.page_size == page


@given(lengths_lists, page_sizes, new_tokens)
def test_plan_pages_capacity_covers_each_prompt_and_its_new_tokens_with_less_than_a_page_spare(
    lengths: list[int], page: int, new: int
) -> None:
    blocks = plan_pages(
        lengths, page_size=page, num_pages=pages_needed(lengths, page, new), max_new_tokens=new
    )
    for length, capacity in zip(lengths, blocks.capacity.tolist(), strict=True):
        assert length + new <= capacity < length + new + page


@given(lengths_lists, page_sizes, new_tokens)
def test_plan_pages_raises_cache_too_small_one_page_short_of_the_need(
    lengths: list[int], page: int, new: int
) -> None:
    needed = pages_needed(lengths, page, new)
    plan_pages(lengths, page_size=page, num_pages=needed, max_new_tokens=new)
    if needed > 1:
        with pytest.raises(CacheTooSmallError, match=f"'num_pages' must be >= {needed}"):
            plan_pages(lengths, page_size=page, num_pages=needed - 1, max_new_tokens=new)


def test_cache_too_small_is_an_invalid_input_and_a_value_error() -> None:
    with pytest.raises(InvalidInputError) as info:
        plan_pages([100], page_size=16, num_pages=6)
    assert isinstance(info.value, CacheTooSmallError)
    assert isinstance(info.value, ValueError)
    assert "7" in str(info.value)


def test_table_rejects_requests_out_of_range() -> None:
    blocks = plan_pages([3, 5], page_size=4, num_pages=3)
    assert blocks.table(1).tolist() == [1, 2]
    for request in (2, -1):
        with pytest.raises(IndexError, match=rf"^'request' must be in \[0, 2\): {request}$"):
            blocks.table(request)
    assert blocks.table(np.int64(1)).tolist() == [1, 2]
    with pytest.raises(InvalidInputError, match=r"^'request' must be an int, not a bool: True$"):
        blocks.table(True)
    for bad in (1.0, "1", None):
        with pytest.raises(InvalidInputError, match=r"^'request' must be an int: "):
            blocks.table(bad)  # type: ignore[arg-type]


def test_padded_pads_short_tables_with_the_fill_value() -> None:
    blocks = BlockTables.from_lists([[4, 1, 0], [3], []], page_size=2, num_pages=5)
    assert blocks.padded().tolist() == [[4, 1, 0], [3, -1, -1], [-1, -1, -1]]
    assert blocks.padded(fill=9).tolist() == [[4, 1, 0], [3, 9, 9], [9, 9, 9]]
    assert blocks.padded(fill=5).tolist() == [[4, 1, 0], [3, 5, 5], [5, 5, 5]]
    assert blocks.padded(fill=np.int32(-(2**31))).min() == -(2**31)
    # A fill that reads as a real page, or is not an int32, is refused.
    for fill in (0, 4, np.int64(1)):
        message = rf"\(below 0 or at least 5, the number of pages\): {fill}$"
        with pytest.raises(
            InvalidInputError, match="^'fill' must not be a page of the cache " + message
        ):
            blocks.padded(fill=fill)
    for bad, message in [(True, "an int"), (1.5, "an int"), (2**31, "<= 2147483647"),
                         (-(2**31) - 1, ">= -2147483648")]:  # fmt: skip
        with pytest.raises(InvalidInputError, match=f"^'fill' must be {message}"):
            blocks.padded(fill=bad)  # type: ignore[arg-type]
    assert blocks.padded().dtype == np.int32
    assert blocks.capacity.tolist() == [6, 2, 0]


def test_block_table_arrays_are_read_only() -> None:
    blocks = plan_pages([3, 5], page_size=4, num_pages=3)
    for array in (blocks.offsets, blocks.pages, blocks.capacity, blocks.padded(), blocks.table(0)):
        assert not array.flags.writeable


@given(st.lists(st.lists(st.integers(0, 200), max_size=6, unique=True), max_size=6))
def test_from_lists_keeps_each_table_in_position_order(tables: list[list[int]]) -> None:
    # Make the tables disjoint by construction: request r keeps the pages no earlier one took.
    seen: set[int] = set()
    disjoint = []
    for table in tables:
        disjoint.append([p for p in table if p not in seen])
        seen.update(table)
    blocks = BlockTables.from_lists(disjoint, page_size=8, num_pages=201)
    assert [blocks.table(r).tolist() for r in range(len(disjoint))] == disjoint


def test_from_lists_rejects_a_page_shared_by_two_requests() -> None:
    with pytest.raises(InvalidInputError, match="page 3 is reused"):
        BlockTables.from_lists([[0, 3], [1, 3]], page_size=4, num_pages=4)


def test_from_lists_rejects_a_page_listed_twice_for_one_request() -> None:
    with pytest.raises(InvalidInputError, match="page 2 is reused"):
        BlockTables.from_lists([[2, 2]], page_size=4, num_pages=4)


@pytest.mark.parametrize("page", [4, 100, -1, 2**31, 2**64])
def test_from_lists_rejects_pages_outside_the_cache(page: int) -> None:
    with pytest.raises(InvalidInputError, match=r"'tables\[1\]'"):
        BlockTables.from_lists([[0], [1, page]], page_size=4, num_pages=4)


@pytest.mark.parametrize("tables", ["0123", {0: [1]}, None, 3, [[0], "1"], [[0.0]], [[True]]])
def test_from_lists_rejects_what_is_not_a_list_of_page_lists(tables: object) -> None:
    with pytest.raises(InvalidInputError, match="'tables"):
        BlockTables.from_lists(tables, page_size=4, num_pages=4)  # type: ignore[arg-type]


def test_page_ids_beyond_16_bits_are_kept() -> None:
    tables = plan_pages([1] * 40_000, page_size=1, num_pages=40_000)
    assert tables.pages.dtype == np.int32
    assert np.array_equal(tables.pages, np.arange(40_000))


def test_a_context_of_exactly_max_tokens_is_planned() -> None:
    tables = plan_pages([2**31 - 1], page_size=2**20, num_pages=2**11)
    assert tables.table(0).tolist() == list(range(2**11))


# -- from a mutation review ---------------------------------------------------------------------


@pytest.mark.parametrize("tables", ["", "01", b"", b"\x00\x01"])
def test_from_lists_refuses_text_and_bytes_as_the_tables(tables: object) -> None:
    # Both are sequences: "" would be no tables, b"\x00\x01" a sequence of ints.
    with pytest.raises(
        InvalidInputError,
        match=rf"^'tables' must be a sequence of page lists: {type(tables).__name__}$",
    ):
        BlockTables.from_lists(tables, page_size=4, num_pages=8)  # type: ignore[arg-type]


def test_a_shared_page_is_named_by_the_lowest_page_reused() -> None:
    # Page 1 is in two tables, page 2 in three.
    with pytest.raises(
        InvalidInputError, match=r"^'tables' must not share pages: page 1 is reused$"
    ):
        BlockTables.from_lists([[1, 2], [1, 2], [2]], page_size=4, num_pages=8)


@pytest.mark.parametrize(
    "tables",
    [
        BlockTables.from_lists([[3, 1], [], [0]], page_size=4, num_pages=8),
        plan_pages([5, 1, 9], page_size=4, num_pages=16, max_new_tokens=2),
    ],
    ids=["from_lists", "plan_pages"],
)
def test_block_tables_hold_int32_pages_and_int64_offsets_however_built(tables: BlockTables) -> None:
    assert tables.pages.dtype == np.int32
    assert tables.offsets.dtype == np.int64
    assert tables.capacity.dtype == np.int64
    assert tables.table(0).dtype == np.int32
    assert tables.padded().dtype == np.int32


def test_a_cache_too_small_counts_the_requests_and_the_pages_they_need() -> None:
    # 3 requests of 5 tokens need 2 pages of 4 each.
    with pytest.raises(
        CacheTooSmallError,
        match=r"^'num_pages' must be >= 6, the pages 3 requests need at page_size 4: 5$",
    ):
        plan_pages([5, 5, 5], page_size=4, num_pages=5)
