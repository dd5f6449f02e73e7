"""The schedule invariants as executable checks (see the header of ``_policies.py``).

Used on every loaded schedule and by the tests; all checks are vectorised, so checking a
schedule of millions of rows takes a fraction of a second.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from ._errors import InvalidScheduleError

if TYPE_CHECKING:
    from ._schedule import Schedule

__all__ = ["check_schedule"]


def _fail(rule: str, where: npt.NDArray[np.bool_], detail: str = "") -> None:
    first = int(np.flatnonzero(where)[0])
    raise InvalidScheduleError(f"{rule}: first at {detail}{first}")


def check_schedule(schedule: Schedule) -> None:
    """Raise :class:`InvalidScheduleError` naming the first invariant ``schedule`` breaks."""
    _check_shapes(schedule)
    _check_rows(schedule)
    _check_request_order(schedule)
    _check_dispatch_limits(schedule)


def _check_shapes(s: Schedule) -> None:
    n = s.prompt_lengths.size
    if n == 0:
        raise InvalidScheduleError("a schedule must hold at least one request")
    if s.num_computed_tokens.shape != s.prompt_lengths.shape:
        raise InvalidScheduleError(
            f"'num_computed_tokens' must have one entry per request ({n}): "
            f"{s.num_computed_tokens.size}"
        )
    if (s.prompt_lengths < 1).any():
        _fail("prompt lengths must be >= 1", s.prompt_lengths < 1, "request ")
    bad = (s.num_computed_tokens < 0) | (s.num_computed_tokens >= s.prompt_lengths)
    if bad.any():
        _fail("num_computed_tokens must be in [0, prompt length)", bad, "request ")
    rows = s.requests.size
    if not (s.starts.size == s.lengths.size == s.is_final.size == rows):
        raise InvalidScheduleError("row arrays must all have the same length")
    offsets = s.dispatch_offsets
    if offsets.size < 2 or offsets[0] != 0 or offsets[-1] != rows:
        raise InvalidScheduleError(
            f"dispatch offsets must run from 0 to the number of rows ({rows}) and name at "
            "least one dispatch"
        )
    empty = np.diff(offsets) <= 0
    if empty.any():
        _fail("every dispatch must hold at least one row", empty, "dispatch ")


def _check_rows(s: Schedule) -> None:
    n = s.prompt_lengths.size
    bad = (s.requests < 0) | (s.requests >= n)
    if bad.any():
        _fail(f"row requests must be in [0, {n})", bad, "row ")
    if (s.lengths < 1).any():
        _fail("every chunk must hold at least one token", s.lengths < 1, "row ")
    ends = s.starts.astype(np.int64) + s.lengths
    beyond = ends > s.prompt_lengths[s.requests]
    if beyond.any():
        _fail("a chunk must end within its prompt", beyond, "row ")
    cap = s.config.chunk_cap
    if (s.lengths > cap).any():
        _fail(f"a chunk must hold at most the chunk cap ({cap}) tokens", s.lengths > cap, "row ")
    page = s.config.page_size
    if page is not None:
        unaligned = ~s.is_final & (ends % page != 0)
        if unaligned.any():
            _fail(
                f"a non-final chunk must end on a multiple of page_size {page}", unaligned, "row "
            )


def _check_request_order(s: Schedule) -> None:
    """Each request's chunks, in dispatch order, tile [computed, length) and only the last is
    final."""
    order = np.argsort(s.requests, kind="stable")
    requests = s.requests[order]
    starts = s.starts[order].astype(np.int64)
    ends = starts + s.lengths[order]
    final = s.is_final[order]
    n = s.prompt_lengths.size
    counts = np.bincount(requests, minlength=n)
    if (counts == 0).any():
        _fail("every request must have at least one chunk", counts == 0, "request ")
    first = np.concatenate(([0], np.cumsum(counts)[:-1]))
    last = first + counts - 1
    if (starts[first] != s.num_computed_tokens).any():
        _fail(
            "a request's first chunk must start at its computed-token count",
            starts[first] != s.num_computed_tokens,
            "request ",
        )
    if (ends[last] != s.prompt_lengths).any():
        _fail(
            "a request's last chunk must end at its prompt length",
            ends[last] != s.prompt_lengths,
            "request ",
        )
    is_last = np.zeros(requests.size, dtype=np.bool_)
    is_last[last] = True
    gaps = ~is_last[:-1] & (ends[:-1] != starts[1:])
    if gaps.any():
        _fail("a request's chunks must be contiguous and in dispatch order", gaps, "sorted row ")
    if (final != is_last).any():
        wrong = np.zeros(n, dtype=np.bool_)
        wrong[requests[final != is_last]] = True
        _fail("exactly one chunk per request, its last, must be final", wrong, "request ")
    # Two rows of one request in one dispatch would break contiguity within the dispatch.
    dispatch = s.row_dispatch[order]
    same = ~is_last[:-1] & (dispatch[:-1] == dispatch[1:])
    if same.any():
        _fail("a request may appear at most once per dispatch", same, "sorted row ")


def _check_dispatch_limits(s: Schedule) -> None:
    config = s.config
    budget = config.effective_budget
    over = s.tokens_per_dispatch > budget
    if over.any():
        _fail(f"a dispatch must carry at most {budget} tokens", over, "dispatch ")
    rows = config.max_num_seqs
    if rows is not None and (s.rows_per_dispatch > rows).any():
        _fail(f"a dispatch must carry at most {rows} rows", s.rows_per_dispatch > rows, "dispatch ")
    limit = config.max_num_partial_prefills
    if limit is not None:
        partial = _partial_counts(s)
        if (partial > limit).any():
            _fail(
                f"at most {limit} requests may be part-way through prefill after a dispatch",
                partial > limit,
                "dispatch ",
            )


def _partial_counts(s: Schedule) -> npt.NDArray[np.int64]:
    """Per dispatch: requests started but not finished once the dispatch has run."""
    n = s.prompt_lengths.size
    start = np.full(n, s.num_dispatches, dtype=np.int64)
    np.minimum.at(start, s.requests, s.row_dispatch)
    delta = np.zeros(s.num_dispatches + 1, dtype=np.int64)
    np.add.at(delta, start, 1)
    np.add.at(delta, s.finish_dispatch, -1)
    return np.cumsum(delta)[:-1]
