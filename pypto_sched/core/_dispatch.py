"""The arrays a kernel consumes for one dispatch, derived from its rows and their pages.

Everything here is a pure function of one :class:`Dispatch` and the :class:`BlockTables`, or
of a step's rows and the :class:`PagePool` holding their pages; backends call
:func:`~pypto_sched.dispatch_arrays` (``_arrays.py``, which takes either) instead of
re-deriving positions and slots themselves.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import attrs
import numpy as np
import numpy.typing as npt

from ._errors import CacheTooSmallError, InvalidInputError
from ._pages import BlockTables
from ._schedule import Dispatch
from ._validate import arrays_stay_read_only, check_index, read_only

if TYPE_CHECKING:
    from ._pool import PagePool

__all__ = ["DispatchArrays"]

I32 = npt.NDArray[np.int32]
I64 = npt.NDArray[np.int64]


@arrays_stay_read_only
@attrs.frozen(eq=False, kw_only=True)
class DispatchArrays:
    """One dispatch in the layout attention kernels expect (rows in dispatch order).

    Row-level arrays have one entry per row; token-level arrays are flat, rows concatenated:
    row ``i`` owns flat tokens ``cu_seqlens[i]:cu_seqlens[i + 1]`` (:meth:`row_tokens`).
    Every array is read-only (copy one with ``np.array(x)`` to change it). Positions are
    positions in the request's prompt, counted from 0 at its first token, cached prefix
    included; they are not indices into the flat token arrays.
    """

    #: Index of the dispatch in its schedule.
    index: int
    #: ``[rows]``: the request (its index in the schedule).
    requests: I32
    #: ``[rows]``: the chunk runs prompt positions ``token_starts[i]:token_ends[i]``
    #: (positions in the prompt, not indices into the flat token arrays).
    token_starts: I32
    #: ``[rows]``: one past the chunk's last prompt position; equals ``seq_lens``.
    token_ends: I32
    #: ``[tokens]``: each token's absolute position in its prompt.
    positions: I32
    #: ``[rows + 1]``: cumulative query (chunk) lengths, starting at 0, per row plus one.
    cu_seqlens: I32
    #: ``[rows]``: context length once the chunk has run: cached prefix and earlier chunks
    #: plus this chunk (``token_ends``).
    seq_lens: I32
    #: ``[tokens]``: KV slot to write, ``table[p // page_size] * page_size + p % page_size``.
    slot_mapping: I64
    #: ``[rows, pages]``: each row's pages covering its context (``seq_lens``), padded with
    #: -1; the width is this dispatch's longest, so it changes between dispatches.
    block_tables: I32
    #: KV page size the slots and tables refer to.
    page_size: int
    #: ``[rows]``: whether the chunk is its request's final one.
    is_final: npt.NDArray[np.bool_]
    #: ``[final rows]``: flat indices of each final row's last token: the only logits to
    #: compute, in row order.
    logits_indices: I64

    @functools.cached_property
    def padded_positions(self) -> I32:
        """``[rows, longest chunk]``: the positions per row, padded with -1. Made when first
        read (it holds rows times the longest chunk: a long chunk beside many decode rows
        made it the largest array of a step, and no backend here reads it)."""
        starts = self.token_starts.astype(np.int64)
        lengths = np.diff(self.cu_seqlens).astype(np.int64)
        column = np.arange(int(lengths.max()) if lengths.size else 0)
        padded = np.where(column[None, :] < lengths[:, None], starts[:, None] + column, -1)
        return read_only(padded.astype(np.int32))

    @property
    def num_rows(self) -> int:
        return int(self.requests.size)

    @property
    def num_tokens(self) -> int:
        return int(self.positions.size)

    @property
    def query_lens(self) -> I32:
        """Per row: tokens in the chunk."""
        return read_only(np.diff(self.cu_seqlens).astype(np.int32))

    @property
    def final_requests(self) -> I32:
        """The requests whose final chunk is in this dispatch, in row order."""
        return read_only(self.requests[self.is_final])

    def row_tokens(self, row: int | np.integer[Any]) -> slice:
        """Row ``row``'s flat tokens, ``cu_seqlens[row]:cu_seqlens[row + 1]``: the slice of
        every token-level array (``positions``, ``slot_mapping``, ``DispatchInput.token_ids``
        and ``input_embeddings``) that belongs to it."""
        row = self._row(row)
        return slice(int(self.cu_seqlens[row]), int(self.cu_seqlens[row + 1]))

    def context_slots(self, row: int | np.integer[Any]) -> I64:
        """KV slots of row ``row``'s whole context -- positions ``0 .. seq_lens[row] - 1``:
        its cached prefix, its earlier chunks and this chunk -- in position order, read from
        its block table (``table[p // page_size] * page_size + p % page_size``).

        A backend without fused paged-attention kernels gathers a row's keys and values with
        ``cache[arrays.context_slots(row)]``; the last ``query_lens[row]`` of them are the
        slots this dispatch writes (``slot_mapping[row_tokens(row)]``).
        """
        row = self._row(row)
        positions = np.arange(int(self.seq_lens[row]), dtype=np.int64)
        pages = self.block_tables[row][positions // self.page_size].astype(np.int64)
        return read_only(pages * self.page_size + positions % self.page_size)

    def last_tokens(self) -> DispatchArrays:
        """The final rows cut down to their last tokens: one-token rows at their contexts'
        ends (the shape of decode rows), in row order, over the same pages -- the arrays of
        a dispatch of those tokens alone. A backend whose last layer needs only the tokens
        whose logits are sampled attends them through these (their keys and values are
        written by the whole dispatch)."""
        final, keep = self.is_final, self.logits_indices
        count = int(keep.size)
        seq_lens = self.seq_lens[final]
        width = int(-(-seq_lens.max() // self.page_size)) if count else 0
        return DispatchArrays(
            index=self.index,
            requests=read_only(self.requests[final]),
            token_starts=read_only(seq_lens - 1),
            token_ends=read_only(seq_lens),
            positions=read_only(self.positions[keep]),
            cu_seqlens=read_only(np.arange(count + 1, dtype=np.int32)),
            seq_lens=read_only(seq_lens),
            slot_mapping=read_only(self.slot_mapping[keep]),
            block_tables=read_only(self.block_tables[final, :width]),
            page_size=self.page_size,
            is_final=read_only(np.ones(count, dtype=np.bool_)),
            logits_indices=read_only(np.arange(count, dtype=np.int64)),
        )

    def _row(self, row: object) -> int:
        try:
            return check_index("row", row, self.num_rows)
        except IndexError as error:  # a row out of range is bad input here, as documented
            raise InvalidInputError(str(error), parameter="row") from None


def dispatch_arrays_with_ids(
    dispatch: Dispatch, block_tables: BlockTables, *, request_ids: Sequence[object] | None = None
) -> DispatchArrays:
    """The kernel arrays of ``dispatch`` given every request's block table; messages name
    request ``r`` as ``request_ids[r]`` (its repr) when given: a server's step names its rows
    by the server's ids, not by index."""
    if not isinstance(dispatch, Dispatch):
        raise InvalidInputError.about("dispatch", f"must be a Dispatch: {type(dispatch).__name__}")
    if not isinstance(block_tables, BlockTables):
        raise InvalidInputError.about(
            "block_tables", f"must be BlockTables: {type(block_tables).__name__}"
        )
    requests = dispatch.requests.astype(np.int64)
    if requests.size and int(requests.max()) >= block_tables.num_requests:
        raise InvalidInputError.about(
            "block_tables",
            f"must cover request {int(requests.max())}: it has {block_tables.num_requests} tables",
        )
    starts = dispatch.starts.astype(np.int64)
    sizes = dispatch.lengths.astype(np.int64)
    ends = starts + sizes
    page = block_tables.page_size
    pages_needed = -(-ends // page)
    pages_held = np.diff(block_tables.offsets)[requests]
    short = pages_needed > pages_held
    if short.any():
        row = int(np.flatnonzero(short)[0])
        request = int(requests[row])
        name = request if request_ids is None else repr(request_ids[request])
        raise CacheTooSmallError.about(
            "block_tables",
            f"must cover every row's context: request {name} "
            f"needs {int(pages_needed[row])} pages for context {int(ends[row])} at page_size "
            f"{page}, its table has {int(pages_held[row])}",
        )
    cu = np.concatenate(([0], np.cumsum(sizes)))
    total = int(cu[-1])
    token_row = np.repeat(np.arange(requests.size), sizes)
    positions = starts[token_row] + np.arange(total) - cu[token_row]
    table_base = block_tables.offsets[:-1][requests]
    page_ids = block_tables.pages[table_base[token_row] + positions // page].astype(np.int64)
    slots = page_ids * page + positions % page
    table_width = int(pages_needed.max()) if pages_needed.size else 0
    tables = np.full((requests.size, table_width), -1, dtype=np.int32)
    # Each row's pages, placed by flat indices: temporaries as large as the pages placed,
    # not rows times the widest table.
    row_of_page = np.repeat(np.arange(requests.size), pages_needed)
    table_starts = np.cumsum(pages_needed) - pages_needed
    column = np.arange(row_of_page.size) - table_starts[row_of_page]
    tables[row_of_page, column] = block_tables.pages[table_base[row_of_page] + column]
    final = dispatch.is_final.copy()
    return DispatchArrays(
        index=dispatch.index,
        requests=read_only(requests.astype(np.int32)),
        token_starts=read_only(starts.astype(np.int32)),
        token_ends=read_only(ends.astype(np.int32)),
        positions=read_only(positions.astype(np.int32)),
        cu_seqlens=read_only(cu.astype(np.int32)),
        seq_lens=read_only(ends.astype(np.int32)),
        slot_mapping=read_only(slots),
        block_tables=read_only(tables),
        page_size=page,
        is_final=read_only(final),
        logits_indices=read_only((cu[1:] - 1)[final].astype(np.int64)),
    )


class Row(Protocol):
    """What :func:`rows_arrays` reads of a row: a :class:`~pypto_sched.StepChunk`'s fields
    (named so, as ``_online.py``, which builds them, is above this module)."""

    @property
    def start(self) -> int: ...
    @property
    def length(self) -> int: ...
    @property
    def is_final(self) -> bool: ...


def rows_arrays(rows: Mapping[Any, Row], pool: PagePool[Any], *, index: int) -> DispatchArrays:
    """The kernel arrays of a step's ``rows`` (checked) whose pages ``pool`` holds: row ``i``
    is the ``i``-th item of ``rows``, its ``requests`` entry ``i``; messages name requests by
    their ids."""
    ids = list(rows)
    chunks = list(rows.values())
    dispatch = Dispatch(
        index=index,
        requests=read_only(np.arange(len(ids), dtype=np.int32)),
        starts=read_only(np.array([c.start for c in chunks], dtype=np.int32)),
        lengths=read_only(np.array([c.length for c in chunks], dtype=np.int32)),
        is_final=read_only(np.array([c.is_final for c in chunks], dtype=np.bool_)),
    )
    return dispatch_arrays_with_ids(dispatch, pool._block_tables(ids), request_ids=ids)
