"""Block tables: which KV-cache pages hold which request's positions."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs
import numpy as np
import numpy.typing as npt

from ._errors import CacheTooSmallError, InvalidInputError
from ._validate import (
    MAX_TOKENS,
    arrays_stay_read_only,
    as_count_array,
    check_index,
    check_int,
    read_only,
)

__all__ = ["BlockTables", "plan_pages"]


@arrays_stay_read_only
@attrs.frozen(eq=False, kw_only=True)
class BlockTables:
    """Per request, the KV-cache pages holding positions ``0, page_size, 2 * page_size, ...``.

    Position ``p`` of request ``r`` lives in slot ``table(r)[p // page_size] * page_size +
    p % page_size``. Stored flat: request ``r``'s pages are
    ``pages[offsets[r]:offsets[r + 1]]``. Build one with :func:`plan_pages` or
    :meth:`from_lists`; like :class:`~pypto_sched.Schedule`'s, the initializer trusts its
    arguments (it neither copies nor checks them), the named constructors check everything.
    """

    page_size: int
    num_pages: int
    offsets: npt.NDArray[np.int64]
    pages: npt.NDArray[np.int32]

    @property
    def num_requests(self) -> int:
        return int(self.offsets.size - 1)

    def table(self, request: int | np.integer[Any]) -> npt.NDArray[np.int32]:
        """Request ``request``'s pages, in position order (a read-only view)."""
        request = check_index("request", request, self.num_requests)
        return self.pages[self.offsets[request] : self.offsets[request + 1]]

    @property
    def capacity(self) -> npt.NDArray[np.int64]:
        """Per request: how many positions its pages hold."""
        return read_only(np.diff(self.offsets) * self.page_size)

    def padded(self, *, fill: int | np.integer[Any] = -1) -> npt.NDArray[np.int32]:
        """Every table as one ``[num_requests, max_pages]`` array, short rows padded with
        ``fill``: an int32 that is not a page of the cache (below 0 or at least
        ``num_pages``), so that padding never reads as a real page."""
        fill = check_int("fill", fill, min_value=-(2**31))
        if 0 <= fill < self.num_pages:
            raise InvalidInputError.about(
                "fill",
                f"must not be a page of the cache (below 0 or at least {self.num_pages}, "
                f"the number of pages): {fill}",
            )
        return _padded(self.pages, self.offsets, fill=fill)

    @classmethod
    def from_lists(
        cls, tables: Sequence[Sequence[int]], *, page_size: int, num_pages: int
    ) -> BlockTables:
        """Check and store explicit tables (an engine's own allocator output).

        Every page must be in ``[0, num_pages)`` and belong to one request at most.
        """
        page_size = check_int("page_size", page_size, min_value=1)
        num_pages = check_int("num_pages", num_pages, min_value=1)
        if not isinstance(tables, Sequence) or isinstance(tables, str | bytes):
            raise InvalidInputError.about(
                "tables", f"must be a sequence of page lists: {type(tables).__name__}"
            )
        arrays = [
            as_count_array(
                f"tables[{r}]", table, min_value=0, max_value=num_pages - 1, allow_empty=True
            )
            for r, table in enumerate(tables)
        ]
        counts = np.array([a.size for a in arrays], dtype=np.int64)
        offsets = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
        pages = np.concatenate(arrays) if arrays else np.zeros(0, dtype=np.int64)
        values, seen = np.unique(pages, return_counts=True)
        if (seen > 1).any():
            shared = int(values[np.argmax(seen > 1)])
            raise InvalidInputError.about(
                "tables", f"must not share pages: page {shared} is reused"
            )
        return cls(
            page_size=page_size,
            num_pages=num_pages,
            offsets=read_only(offsets),
            pages=read_only(pages.astype(np.int32)),
        )


def plan_pages(
    prompt_lengths: Sequence[int] | npt.NDArray[np.integer],
    *,
    page_size: int,
    num_pages: int,
    max_new_tokens: int = 0,
) -> BlockTables:
    """Give each request the pages for its prompt (plus ``max_new_tokens`` decode tokens).

    Pages are handed out in request order, contiguously, from page 0. Raises
    :class:`CacheTooSmallError` when the cache has fewer than the pages needed.
    """
    lengths = as_count_array("prompt_lengths", prompt_lengths, min_value=1)
    page_size = check_int("page_size", page_size, min_value=1)
    num_pages = check_int("num_pages", num_pages, min_value=1)
    max_new_tokens = check_int("max_new_tokens", max_new_tokens, min_value=0)
    tokens = lengths + max_new_tokens
    if int(tokens.max()) > MAX_TOKENS:
        raise InvalidInputError(
            f"prompt length plus 'max_new_tokens' must be <= {MAX_TOKENS}: {int(tokens.max())}"
        )
    counts = -(-tokens // page_size)
    needed = int(counts.sum())
    if needed > num_pages:
        raise CacheTooSmallError.about(
            "num_pages",
            f"must be >= {needed}, the pages {lengths.size} requests need at "
            f"page_size {page_size}: {num_pages}",
        )
    offsets = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
    return BlockTables(
        page_size=page_size,
        num_pages=num_pages,
        offsets=read_only(offsets),
        pages=read_only(np.arange(needed, dtype=np.int32)),
    )


def _padded(
    pages: npt.NDArray[np.int32], offsets: npt.NDArray[np.int64], *, fill: int
) -> npt.NDArray[np.int32]:
    counts = np.diff(offsets)
    width = int(counts.max()) if counts.size else 0
    out = np.full((counts.size, width), fill, dtype=np.int32)
    columns = np.arange(width)
    mask = columns[None, :] < counts[:, None]
    out[mask] = pages
    return read_only(out)
