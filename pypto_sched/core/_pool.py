"""PagePool: a bounded KV cache's pages as an immutable value.

A pool has ``num_pages`` pages of ``page_size`` token slots. Each request owns an ordered list
of pages, its block table: position ``p`` of the request lives in slot ``pages[p //
page_size] * page_size + p % page_size``. The list grows as the request's context grows
(:meth:`PagePool.hold`) and is given back whole when the request finishes, is aborted or is
preempted (:meth:`PagePool.release`). Every operation returns a new pool; the old one stays
valid, so a planner can try a step and drop it.

Invariants (``tests/test_pool.py`` checks each): no page is owned twice; owned and free pages
together are every page exactly once; a request's block table holds exactly the pages it owns,
in the order it got them; once every request has left, every page is free.

Which page is handed out next is part of the value, so equal pools hand out equal pages: a
freed page is reused first (last freed, first reused: it is the one most likely still in a
device cache line), then pages never used, in ascending order. Every operation costs time in
the pages it touches, not in the pool's size, and past 256 owners not in their number:
owners live in a persistent map (up to 256 owners one dict, which a step copies once), and
freed pages in an immutable linked list of the tables given back, each reversed, so that a
release pushes one table and a hold takes the pages it needs from the front of one without
copying the rest. A block table is an
``array('i')`` of 32-bit pages, as kernels take them, and the number of them that are the
request's: a hold appends the pages it adds to the array in place when no other pool's table
reaches past that number (the newest table of the request), and copies it otherwise. What
is within a table's length never changes, so every pool keeps its tables; a request's table
grows in time in the pages it gets, not in those it has (a long prefill's steps do not slow
down as its context grows); and :meth:`PagePool.block_tables` hands the tables to NumPy
without a loop over their pages.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import numpy as np

from ._errors import CacheTooSmallError, InvalidConfigError, InvalidInputError
from ._pages import BlockTables
from ._persistent import Frozen, PersistentMap, WideMap
from ._policies import page_room
from ._validate import MAX_TOKENS, check_hashable, check_ids, check_int, read_only

__all__ = ["PagePool"]

RequestId = TypeVar("RequestId", bound=Hashable)

# Pages as 32-bit ints, as kernels' block tables hold them.
if TYPE_CHECKING:
    _Pages = array[int]
else:
    _Pages = array  # (not subscriptable at run time before Python 3.12)
_PAGE = "i"
assert array(_PAGE).itemsize == 4, "a C int of 32 bits"
_NO_PAGES: _Pages = array(_PAGE)

# A block table: ``(pages, length)``: the request's pages, in position order, are
# ``pages[:length]``. What is there never changes; a later pool's table of the same request
# may have appended to ``pages`` past ``length``, in place (see PagePool._grown).
_Table = tuple[_Pages, int]
_NO_TABLE: _Table = (_NO_PAGES, 0)

# Freed pages, last freed first: ``(pages, taken, rest)`` or ``None``: ``pages[taken:]``
# (never empty) are free, in the order they are handed out again, and then ``rest``.
_FreeList = tuple[_Pages, int, Any] | None


class PagePool(Frozen, Generic[RequestId]):
    """A fixed number of KV pages, each owned by at most one request.

    Build an empty pool with ``PagePool(num_pages=..., page_size=...)``; grow a request's
    pages with :meth:`hold` and give them back with :meth:`release`.
    """

    __slots__ = ("_freed", "_num_freed", "_num_pages", "_owned", "_page_size", "_unused")

    _num_pages: int
    _page_size: int
    _owned: PersistentMap[RequestId, _Table]
    _freed: _FreeList  # pages given back, last freed first
    _num_freed: int
    _unused: int  # pages _unused .. num_pages - 1 were never handed out

    def __init__(self, *, num_pages: int, page_size: int) -> None:
        self._fill(
            num_pages=check_int("num_pages", num_pages, min_value=1),
            page_size=check_int("page_size", page_size, min_value=1),
            owned=WideMap(),
            freed=None,
            num_freed=0,
            unused=0,
        )

    def _evolve(
        self,
        owned: PersistentMap[RequestId, _Table],
        freed: _FreeList,
        num_freed: int,
        unused: int,
    ) -> PagePool[RequestId]:
        return self._build(
            num_pages=self._num_pages,
            page_size=self._page_size,
            owned=owned,
            freed=freed,
            num_freed=num_freed,
            unused=unused,
        )

    # -- reading ------------------------------------------------------------------------

    @property
    def num_pages(self) -> int:
        return self._num_pages

    @property
    def page_size(self) -> int:
        return self._page_size

    @property
    def num_free(self) -> int:
        """Pages no request owns."""
        return self._num_freed + self._num_pages - self._unused

    @property
    def num_used(self) -> int:
        """Pages some request owns."""
        return self._num_pages - self.num_free

    def __len__(self) -> int:
        """How many requests own pages."""
        return len(self._owned)

    def __contains__(self, request_id: object) -> bool:
        try:
            return self._owned.get(request_id) is not None  # type: ignore[arg-type]
        except TypeError:  # unhashable: it cannot own pages
            return False

    def owners(self) -> Iterator[RequestId]:
        """The requests that own pages, in no particular order."""
        return (request_id for request_id, _ in self._owned.items())

    def pages(self, request_id: RequestId) -> tuple[int, ...]:
        """The pages ``request_id`` owns, in position order (``()`` if none)."""
        return tuple(self._pages(request_id))

    def _pages(self, request_id: RequestId) -> _Pages:
        """The pages ``request_id`` owns, in position order, in a new array."""
        pages, length = self._table(request_id)
        return pages[:length]

    def _held(self, request_id: RequestId) -> int:
        """How many pages ``request_id`` owns."""
        return self._table(request_id)[1]

    def _table(self, request_id: RequestId) -> _Table:
        """The block table of ``request_id`` as stored (:data:`_NO_TABLE` if none)."""
        try:
            table = self._owned.get(request_id)
        except TypeError:
            check_hashable(request_id)  # an unhashable id is the caller's mistake: named
            raise
        return _NO_TABLE if table is None else table

    def _table_reader(self) -> Callable[[RequestId, _Table], _Table]:
        """``get(request_id, default)``: a request's block table as stored, else ``default``.
        (A small map of owners is one dict, read directly: a step reads a table per row.)"""
        flat = self._owned._flat
        return self._owned.get if flat is None else flat.get  # type: ignore[return-value]

    def _grown(self, grows: Sequence[tuple[RequestId, _Table, int]]) -> PagePool[RequestId]:
        """The pool in which each ``(request_id, table, missing)`` of ``grows``, a request
        owning ``table`` here, has ``missing`` more pages at the end of its table: the next
        free pages, handed out in the order of ``grows`` (the same pool as a :meth:`hold` for
        each, with the owners' map updated once). Each request appears once; the pages must
        be free."""
        freed, unused, num_freed = self._freed, self._unused, self._num_freed
        owned = self._owned
        flat = owned._flat  # a small map: its dict, copied once and grown in place
        tables = {} if flat is None else flat.copy()
        for request_id, table, missing in grows:
            # Freed pages first, last freed first (a run of them usually holds them all).
            got = None
            while freed is not None and missing:
                run, taken, rest = freed
                end = taken + missing
                if end < len(run):
                    part = run[taken:end]
                    freed = (run, end, rest)
                    num_freed -= missing
                    missing = 0
                else:
                    part = run[taken:]
                    freed = rest
                    num_freed -= len(run) - taken
                    missing = end - len(run)
                # (Extended in place: a slice of an array is a copy, so got is its own;
                # concatenating anew for each run was quadratic over a fragmented list.)
                if got is None:
                    got = part
                else:
                    got += part
            if missing:  # then pages never used, in ascending order
                part = _page_range(unused, unused + missing)
                unused += missing
                if got is None:
                    got = part
                else:
                    got += part
            assert got is not None, "a grow takes at least one page"
            tables[request_id] = _appended(table, got)
        owned = owned.update(tables.items()) if flat is None else owned._make_flat(tables)
        return self._evolve(owned, freed, num_freed, unused)

    def capacity(self, request_id: RequestId) -> int:
        """How many tokens of context ``request_id``'s pages hold."""
        return self._held(request_id) * self._page_size

    def pages_for(self, num_tokens: int) -> int:
        """Pages that hold ``num_tokens`` tokens of one request."""
        return self._pages_for(check_int("num_tokens", num_tokens, min_value=0))

    def _pages_for(self, num_tokens: int) -> int:
        """:meth:`pages_for` of a checked count (the planner's, once per row)."""
        return -(-num_tokens // self._page_size)

    def missing_pages(self, request_id: RequestId, num_tokens: int) -> int:
        """Pages ``request_id`` still needs to hold ``num_tokens`` tokens of context."""
        tokens = check_int("num_tokens", num_tokens, min_value=0)
        return max(self._pages_for(tokens) - self._held(request_id), 0)

    def can_hold(self, request_id: RequestId, num_tokens: int) -> bool:
        """Whether :meth:`hold` of ``num_tokens`` would succeed."""
        return self.missing_pages(request_id, num_tokens) <= self.num_free

    def tokens_holdable(self, request_id: RequestId) -> int:
        """The most tokens of context ``request_id`` could hold with every free page."""
        return (self._held(request_id) + self.num_free) * self._page_size

    def slot(self, request_id: RequestId, position: int) -> int:
        """The cache slot of ``request_id``'s token at ``position``."""
        pages, length = self._table(request_id)
        position = check_int("position", position, min_value=0)
        if position >= length * self._page_size:
            raise InvalidInputError.about(
                "position",
                f"must be < the {length * self._page_size} slots request "
                f"{request_id!r} holds: {position}",
            )
        page, offset = divmod(position, self._page_size)
        return pages[page] * self._page_size + offset

    # -- changing -----------------------------------------------------------------------

    def hold(self, request_id: RequestId, num_tokens: int) -> PagePool[RequestId]:
        """A pool in which ``request_id`` owns enough pages for ``num_tokens`` tokens.

        It keeps the pages it has and gets the missing ones at the end of its table. Raises
        :class:`CacheTooSmallError` (and changes nothing) when too few pages are free.
        """
        check_hashable(request_id)
        tokens = check_int("num_tokens", num_tokens, min_value=0, max_value=MAX_TOKENS)
        have = self._held(request_id)
        missing = self._pages_for(tokens) - have
        if missing <= 0:
            return self
        if missing > self.num_free:
            raise CacheTooSmallError(
                f"request {request_id!r} needs {missing} more pages to hold {tokens} tokens "
                f"(it has {have}): {self.num_free} of {self._num_pages} are free"
            )
        holds = StepHolds(self)
        holds.hold(request_id, tokens)
        return holds.pool()

    def release(self, request_id: RequestId) -> PagePool[RequestId]:
        """A pool in which ``request_id`` owns nothing (its pages are free again).

        A request that owns nothing is not an error: finishing, aborting and preempting all
        release, and a server need not track which of them already did.
        """
        try:
            table = self._owned.get(request_id)
        except TypeError:  # unhashable: it owns nothing
            return self
        if table is None:
            return self
        pages, length = table  # (an owner holds at least one page)
        freed = (pages[length - 1 :: -1], 0, self._freed)  # its last page is reused first
        return self._evolve(
            self._owned.delete(request_id), freed, self._num_freed + length, self._unused
        )

    # -- for kernels --------------------------------------------------------------------

    def block_tables(self, request_ids: Iterable[RequestId]) -> BlockTables:
        """The block tables of ``request_ids`` (any iterable of ids: a list, a dict's keys,
        an array), row ``i`` for the ``i``-th id.

        Rows are as :class:`~pypto_sched.BlockTables` stores them; turn a step's rows into
        kernel arrays with :func:`~pypto_sched.dispatch_arrays`. Every id must own pages (a
        row with none has nothing to attend to: the id is a mistake) and appear once (two
        rows sharing pages would write the same slots); a str is refused rather than read as
        a sequence of one-character ids.
        """
        ids = list(check_ids(request_ids))
        first: dict[RequestId, int] = {}
        for i, request_id in enumerate(ids):
            if self._held(request_id) == 0:
                raise InvalidInputError.about(
                    "request_ids",
                    f"must name requests that own pages: item {i} is "
                    f"{request_id!r}, which owns none",
                )
            if first.setdefault(request_id, i) != i:
                raise InvalidInputError.about(
                    "request_ids",
                    f"must name each request once (two rows would share its "
                    f"pages): items {first[request_id]} and {i} are {request_id!r}",
                )
        return self._block_tables(ids)

    def _block_tables(self, request_ids: Sequence[RequestId]) -> BlockTables:
        """:meth:`block_tables` unchecked: a request without pages gets an empty table (a
        step's arrays then name it as a row its table does not cover)."""
        tables = [self._pages(request_id) for request_id in request_ids]
        counts = np.fromiter((len(t) for t in tables), dtype=np.int64, count=len(tables))
        offsets = np.zeros(len(tables) + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        joined = array(_PAGE)
        for table in tables:
            joined += table
        pages = np.frombuffer(joined, dtype=np.int32).copy()
        return BlockTables(
            page_size=self._page_size,
            num_pages=self._num_pages,
            offsets=read_only(offsets),
            pages=read_only(pages),
        )

    # -- value behaviour ----------------------------------------------------------------

    def _freed_pages(self) -> list[int]:
        """Pages given back, in the order they will be handed out again."""
        pages: list[int] = []
        link = self._freed
        while link is not None:
            run, taken, link = link
            pages.extend(run[taken:])
        return pages

    def _free_pages(self) -> list[int]:
        """Free pages in the order they will be handed out."""
        return [*self._freed_pages(), *range(self._unused, self._num_pages)]

    def _tables(self) -> dict[RequestId, tuple[int, ...]]:
        return {
            request_id: tuple(pages[:length]) for request_id, (pages, length) in self._owned.items()
        }

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PagePool):
            return NotImplemented
        return (
            (self._num_pages, self._page_size) == (other._num_pages, other._page_size)
            and self._tables() == other._tables()
            and self._free_pages() == other._free_pages()
        )

    __hash__ = None  # type: ignore[assignment]  # equal by content, which is not cheap to hash

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return _restore_pool, (
            self._num_pages,
            self._page_size,
            list(self._tables().items()),
            self._freed_pages(),
            self._unused,
        )

    def __repr__(self) -> str:
        return (
            f"PagePool(num_pages={self._num_pages}, page_size={self._page_size}, "
            f"num_free={self.num_free}, owners={len(self)})"
        )


def check_holds_alone(
    pool: PagePool[Any],
    request_id: object,
    num_tokens: int,
    *,
    name: str,
    what: str,
    error: type[InvalidInputError | InvalidConfigError],
) -> None:
    """Raise ``error`` naming ``name`` if ``pool`` has too few pages in all for
    ``request_id``'s ``num_tokens`` tokens of KV (``what`` says what they are): such a
    request could never run to its end, even alone. The one statement of that rule."""
    needed = pool._pages_for(num_tokens)
    if needed > pool.num_pages:
        raise error.about(
            name,
            f"must hold every request alone: request {request_id!r} needs {num_tokens} tokens "
            f"of KV ({what}), {needed} pages of {pool.page_size}: {pool.num_pages}",
        )


class StepHolds(Generic[RequestId]):
    """The page holds of a step being planned on ``pool``, applied at once by :meth:`pool`.

    :meth:`room` reads a request's table and the pages still free, :meth:`hold` notes the
    pages its chunk needs (each request at most once a step), and :meth:`pool` makes every
    noted hold at once (:meth:`PagePool._grown`)."""

    __slots__ = ("base", "free", "get", "grows", "page_size")

    def __init__(self, pool: PagePool[RequestId]) -> None:
        self.base = pool
        self.get = pool._table_reader()
        self.page_size = pool._page_size
        self.free = pool.num_free  # kept up to date
        self.grows: list[tuple[RequestId, _Table, int]] = []

    def room(self, request_id: RequestId, position: int) -> int:
        """Tokens ``request_id``, at ``position``, may run with its pages and the free ones
        (:func:`~pypto_sched.core._policies.page_room`)."""
        return page_room(position, self.get(request_id, _NO_TABLE)[1], self.free, self.page_size)

    def can_hold(self, request_id: RequestId, num_tokens: int) -> bool:
        """Whether ``request_id``'s pages and the free ones hold ``num_tokens`` tokens of
        context (:meth:`PagePool.can_hold`, with the holds noted so far)."""
        return self.room(request_id, 0) >= num_tokens

    def hold(self, request_id: RequestId, num_tokens: int) -> None:
        """Note that ``request_id`` holds ``num_tokens`` tokens of context (within its
        :meth:`room`: the pages are free)."""
        table = self.get(request_id, _NO_TABLE)
        missing = self.base._pages_for(num_tokens) - table[1]
        if missing > 0:
            self.grows.append((request_id, table, missing))
            self.free -= missing

    def pool(self) -> PagePool[RequestId]:
        """The pool with every hold made."""
        return self.base._grown(self.grows) if self.grows else self.base


def _appended(table: _Table, got: _Pages) -> _Table:
    """``table`` with the pages ``got`` (an array of its own) at its end.

    The core's one change in place, kept here: when ``table`` is the newest table over its
    array (nothing past its length), ``got`` is appended to that array, so that a table grows
    in time in the pages it gets, not in those it has. It pays: with a copy instead, a step
    holding pages for started requests cost 5.2 times as much at 1,048,576 tokens in as at
    4,096; appended, the same (docs/benchmarks.md, ``bench_online.py``'s context sweep). No
    other table sees the change, for none reads past its own length. Otherwise (another pool
    grew this table first, or a view of the array is held) the table is copied. Two threads
    growing one table at once: at most one keeps the array, the other finds it longer than
    it made it and copies (an append and a length read are each one atomic step under the
    GIL).
    """
    pages, length = table
    if not length:
        return got, len(got)
    if len(pages) == length:
        try:
            pages += got
        except BufferError:  # a view of it is held: it cannot move
            pass
        else:
            if len(pages) == length + len(got):  # (nobody appended meanwhile)
                return pages, len(pages)
    return pages[:length] + got, length + len(got)


def _page_range(start: int, stop: int) -> _Pages:
    """Pages ``start .. stop - 1``, in order. (Built through NumPy past a few pages: from a
    ``range`` it costs a Python step per page.)"""
    if stop - start <= 8:
        return array(_PAGE, range(start, stop))
    return array(_PAGE, np.arange(start, stop, dtype=np.int32).tobytes())


def _restore_pool(
    num_pages: int,
    page_size: int,
    tables: list[tuple[Any, tuple[int, ...]]],
    freed: list[int],
    unused: int,
) -> PagePool[Any]:
    pool: PagePool[Any] = PagePool(num_pages=num_pages, page_size=page_size)
    owned: PersistentMap[Any, _Table] = WideMap()
    for request_id, pages in tables:
        owned = owned.set(request_id, (array(_PAGE, pages), len(pages)))
    link: _FreeList = (array(_PAGE, freed), 0, None) if freed else None
    return pool._evolve(owned, link, len(freed), unused)
