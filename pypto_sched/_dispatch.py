"""The arrays a kernel consumes for one dispatch, derived from the schedule and block tables.

Everything here is a pure function of one :class:`Dispatch` and the :class:`BlockTables`;
backends call :func:`dispatch_arrays` instead of re-deriving positions and slots themselves.
"""

from __future__ import annotations

import attrs
import numpy as np
import numpy.typing as npt

from ._errors import CacheTooSmallError, InvalidInputError
from ._pages import BlockTables
from ._schedule import Dispatch
from ._validate import read_only

__all__ = ["DispatchArrays", "dispatch_arrays"]

I32 = npt.NDArray[np.int32]
I64 = npt.NDArray[np.int64]


@attrs.frozen(eq=False)
class DispatchArrays:
    """One dispatch in the layout attention kernels expect (rows in dispatch order).

    Token-level arrays are flat, rows concatenated: row ``i`` owns flat tokens
    ``cu_seqlens[i]:cu_seqlens[i + 1]``.
    """

    #: Index of the dispatch in its schedule.
    index: int
    #: Per row: the request.
    requests: I32
    #: Per row: the chunk runs prompt tokens ``token_starts[i]:token_ends[i]``.
    token_starts: I32
    token_ends: I32
    #: Per token: its absolute position in its prompt.
    positions: I32
    #: ``[rows, longest chunk]``: the same positions per row, padded with -1.
    padded_positions: I32
    #: ``rows + 1`` cumulative query lengths, starting at 0.
    cu_seqlens: I32
    #: Per row: context length once the chunk has run (cached tokens plus the chunk).
    seq_lens: I32
    #: Per token: KV slot, ``table[p // page_size] * page_size + p % page_size``.
    slot_mapping: I64
    #: ``[rows, pages]``: each row's pages covering its context, padded with -1.
    block_tables: I32
    #: KV page size the slots and tables refer to.
    page_size: int
    #: Per row: whether the chunk is its request's final one.
    is_final: npt.NDArray[np.bool_]
    #: Flat indices of the last token of each final row: the only logits to compute.
    logits_indices: I64

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


def dispatch_arrays(dispatch: Dispatch, block_tables: BlockTables) -> DispatchArrays:
    """Derive the kernel arrays of ``dispatch`` given every request's block table."""
    if not isinstance(dispatch, Dispatch):
        raise InvalidInputError(f"'dispatch' must be a Dispatch: {type(dispatch).__name__}")
    if not isinstance(block_tables, BlockTables):
        raise InvalidInputError(
            f"'block_tables' must be BlockTables: {type(block_tables).__name__}"
        )
    requests = dispatch.requests.astype(np.int64)
    if requests.size and int(requests.max()) >= block_tables.num_requests:
        raise InvalidInputError(
            f"'block_tables' must cover request {int(requests.max())}: it has "
            f"{block_tables.num_requests} tables"
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
        raise CacheTooSmallError(
            f"'block_tables' must cover every row's context: request {int(requests[row])} "
            f"needs {int(pages_needed[row])} pages for context {int(ends[row])} at page_size "
            f"{page}, its table has {int(pages_held[row])}"
        )
    cu = np.concatenate(([0], np.cumsum(sizes)))
    total = int(cu[-1])
    token_row = np.repeat(np.arange(requests.size), sizes)
    positions = starts[token_row] + np.arange(total) - cu[token_row]
    table_base = block_tables.offsets[:-1][requests]
    page_ids = block_tables.pages[table_base[token_row] + positions // page].astype(np.int64)
    slots = page_ids * page + positions % page
    width = int(sizes.max()) if sizes.size else 0
    column = np.arange(width)
    padded = np.where(column[None, :] < sizes[:, None], starts[:, None] + column, -1)
    table_width = int(pages_needed.max()) if pages_needed.size else 0
    table_column = np.arange(table_width)
    in_table = table_column[None, :] < pages_needed[:, None]
    tables = np.full((requests.size, table_width), -1, dtype=np.int32)
    tables[in_table] = block_tables.pages[(table_base[:, None] + table_column)[in_table]]
    final = dispatch.is_final.copy()
    return DispatchArrays(
        index=dispatch.index,
        requests=read_only(requests.astype(np.int32)),
        token_starts=read_only(starts.astype(np.int32)),
        token_ends=read_only(ends.astype(np.int32)),
        positions=read_only(positions.astype(np.int32)),
        padded_positions=read_only(padded.astype(np.int32)),
        cu_seqlens=read_only(cu.astype(np.int32)),
        seq_lens=read_only(ends.astype(np.int32)),
        slot_mapping=read_only(slots),
        block_tables=read_only(tables),
        page_size=page,
        is_final=read_only(final),
        logits_indices=read_only((cu[1:] - 1)[final].astype(np.int64)),
    )
