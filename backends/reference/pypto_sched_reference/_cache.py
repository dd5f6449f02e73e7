"""The paged KV cache: flat slot arrays per layer, and the rules for touching them.

Slot ``s`` is position ``s % page_size`` of page ``s // page_size``. A dispatch may write only
the slots its block tables give its tokens' positions, and may read only context positions
that some dispatch has already written (or that it writes itself): both are checked before
the model runs, so a planning or allocation bug fails loudly instead of mixing requests.
"""

from __future__ import annotations

from typing import Any

import attrs
import numpy as np
import numpy.typing as npt

from pypto_sched import DispatchArrays
from pypto_sched.checkpoints import ModelConfig

from ._errors import CacheWriteError

__all__ = ["PagedKVCache"]

Array = npt.NDArray[np.floating[Any]]
I64 = npt.NDArray[np.int64]


@attrs.frozen(eq=False)
class PagedKVCache:
    """KV memory of ``num_pages`` pages of ``page_size`` slots for every layer.

    The arrays are the cache's state and change in place as dispatches run; the object's
    fields never do. Build one with :meth:`empty` (or ``backend.new_cache``).
    """

    page_size: int
    num_pages: int
    #: ``[num_layers, num_slots, num_kv_heads, head_dim]``.
    keys: Array = attrs.field(repr=False)
    values: Array = attrs.field(repr=False)
    #: Per slot: whether a dispatch has written it.
    written: npt.NDArray[np.bool_] = attrs.field(repr=False)

    @classmethod
    def empty(
        cls, config: ModelConfig, *, num_pages: int, page_size: int, dtype: np.dtype[Any]
    ) -> PagedKVCache:
        for name, value in (("num_pages", num_pages), ("page_size", page_size)):
            if type(value) is not int or value < 1:
                raise CacheWriteError.about(name, f"must be an int >= 1: {value!r}")
        shape = (
            config.num_hidden_layers,
            num_pages * page_size,
            config.num_key_value_heads,
            config.head_dim,
        )
        return cls(
            page_size=page_size,
            num_pages=num_pages,
            keys=np.zeros(shape, dtype=dtype),
            values=np.zeros(shape, dtype=dtype),
            written=np.zeros(num_pages * page_size, dtype=np.bool_),
        )

    @property
    def num_slots(self) -> int:
        return self.num_pages * self.page_size

    def context_slots(self, arrays: DispatchArrays) -> list[I64]:
        """Per row of ``arrays``: the slots of positions ``0 .. context_len - 1``, after
        checking that the dispatch keeps to its pages (raises :class:`CacheWriteError`)."""
        if arrays.page_size != self.page_size:
            raise CacheWriteError(
                f"the dispatch's page_size must match the cache's {self.page_size}: "
                f"{arrays.page_size}"
            )
        contexts = [self._row_slots(arrays, row) for row in range(arrays.num_rows)]
        self._check_writes(arrays, contexts)
        return contexts

    def _row_slots(self, arrays: DispatchArrays, row: int) -> I64:
        length = int(arrays.seq_lens[row])
        needed = -(-length // self.page_size)
        table = arrays.block_tables[row].astype(np.int64)
        pages = table[:needed]
        if pages.size < needed or ((pages < 0) | (pages >= self.num_pages)).any():
            raise CacheWriteError(
                f"row {row} (request {int(arrays.requests[row])}) needs {needed} valid pages "
                f"for context {length} in a cache of {self.num_pages}: its block table is "
                f"{table.tolist()}"
            )
        slots: I64 = (pages[:, None] * self.page_size + np.arange(self.page_size)).ravel()
        return slots[:length]

    def _check_writes(self, arrays: DispatchArrays, contexts: list[I64]) -> None:
        cu = arrays.cu_seqlens
        for row, slots in enumerate(contexts):
            start, end = int(arrays.token_starts[row]), int(arrays.token_ends[row])
            request = int(arrays.requests[row])
            given = arrays.slot_mapping[cu[row] : cu[row + 1]]
            if not np.array_equal(given, slots[start:end]):
                bad = int(np.flatnonzero(given != slots[start:end])[0])
                raise CacheWriteError(
                    f"row {row} would write position {start + bad} of request {request} to "
                    f"slot {int(given[bad])}, outside its pages (its slot is "
                    f"{int(slots[start + bad])})"
                )
            unwritten = ~self.written[slots[:start]]
            if unwritten.any():
                raise CacheWriteError(
                    f"row {row} reads position {int(np.flatnonzero(unwritten)[0])} of request "
                    f"{request}, which no dispatch has written (its prefix is not cached)"
                )

    def write(self, layer: int, slots: I64, keys: Array, values: Array) -> None:
        """Store one layer's ``keys`` and ``values`` for the tokens at ``slots``."""
        self.keys[layer, slots] = keys
        self.values[layer, slots] = values

    def mark_written(self, slots: I64) -> None:
        """Record that ``slots`` hold K/V for every layer."""
        self.written[slots] = True
