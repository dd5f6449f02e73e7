"""The schedule invariants as executable checks (see the header of ``_policies.py``).

Used on every loaded schedule and by the tests; all checks are vectorised, so checking a
schedule of millions of rows takes a fraction of a second. The checker reads a schedule
through :class:`ScheduleArrays`, the arrays and figures it needs, so it does not import
``_schedule.py`` (which imports it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import numpy as np
import numpy.typing as npt

from ._config import PlannerConfig
from ._errors import InvalidScheduleError
from ._policies import request_cap

__all__ = ["ScheduleArrays", "check_schedule"]


class ScheduleArrays(Protocol):
    """What the checker reads of a schedule (a :class:`~pypto_sched.Schedule` has it all)."""

    @property
    def config(self) -> PlannerConfig: ...
    @property
    def prompt_lengths(self) -> npt.NDArray[np.int64]: ...
    @property
    def num_computed_tokens(self) -> npt.NDArray[np.int64]: ...
    @property
    def dispatch_offsets(self) -> npt.NDArray[np.int64]: ...
    @property
    def requests(self) -> npt.NDArray[np.int32]: ...
    @property
    def starts(self) -> npt.NDArray[np.int32]: ...
    @property
    def lengths(self) -> npt.NDArray[np.int32]: ...
    @property
    def is_final(self) -> npt.NDArray[np.bool_]: ...
    @property
    def num_dispatches(self) -> int: ...
    @property
    def row_dispatch(self) -> npt.NDArray[np.int64]: ...
    @property
    def tokens_per_dispatch(self) -> npt.NDArray[np.int64]: ...
    @property
    def rows_per_dispatch(self) -> npt.NDArray[np.int64]: ...
    @property
    def finish_dispatch(self) -> npt.NDArray[np.int64]: ...


def _fail_rule(
    rule: str, where: npt.NDArray[np.bool_], at: str, found: Callable[[int], object]
) -> None:
    """Raise for the first ``at`` (row, request, dispatch ...) that breaks ``rule``, naming
    what was found there."""
    first = int(np.flatnonzero(where)[0])
    raise InvalidScheduleError(f"{rule}: first at {at} {first}, which has {found(first)}")


def check_schedule(schedule: ScheduleArrays) -> None:
    """Raise :class:`InvalidScheduleError` naming the first invariant ``schedule`` breaks."""
    _check_shapes(schedule)
    _check_rows(schedule)
    _check_request_order(schedule)
    _check_request_caps(schedule)
    _check_dispatch_limits(schedule)


def _check_shapes(s: ScheduleArrays) -> None:
    n = s.prompt_lengths.size
    if n == 0:
        raise InvalidScheduleError("a schedule must hold at least one request")
    if s.num_computed_tokens.shape != s.prompt_lengths.shape:
        raise InvalidScheduleError.about(
            "num_computed_tokens",
            f"must have one entry per request ({n}): {s.num_computed_tokens.size}",
        )
    lengths, computed = s.prompt_lengths, s.num_computed_tokens
    if (lengths < 1).any():
        _fail_rule(
            "prompt lengths must be >= 1", lengths < 1, "request", lambda r: f"length {lengths[r]}"
        )
    bad = (computed < 0) | (computed >= lengths)
    if bad.any():
        _fail_rule(
            "num_computed_tokens must be in [0, prompt length)",
            bad,
            "request",
            lambda r: f"{computed[r]} for length {lengths[r]}",
        )
    rows = s.requests.size
    if not (s.starts.size == s.lengths.size == s.is_final.size == rows):
        raise InvalidScheduleError(
            f"row arrays must all have the same length: requests {rows}, starts "
            f"{s.starts.size}, lengths {s.lengths.size}, is_final {s.is_final.size}"
        )
    offsets = s.dispatch_offsets
    if offsets.size < 2 or offsets[0] != 0 or offsets[-1] != rows:
        raise InvalidScheduleError(
            f"dispatch offsets must run from 0 to the number of rows ({rows}) and name at "
            f"least one dispatch: {offsets.size} offsets"
            + (f" from {offsets[0]} to {offsets[-1]}" if offsets.size else "")
        )
    counts = np.diff(offsets)
    if (counts <= 0).any():
        _fail_rule(
            "every dispatch must hold at least one row",
            counts <= 0,
            "dispatch",
            lambda d: f"{counts[d]} rows",
        )


def _check_rows(s: ScheduleArrays) -> None:
    n = s.prompt_lengths.size
    requests, lengths = s.requests, s.lengths
    bad = (requests < 0) | (requests >= n)
    if bad.any():
        _fail_rule(
            f"row requests must be in [0, {n})", bad, "row", lambda i: f"request {requests[i]}"
        )
    if (lengths < 1).any():
        _fail_rule(
            "every chunk must hold at least one token",
            lengths < 1,
            "row",
            lambda i: f"length {lengths[i]}",
        )
    ends = s.starts.astype(np.int64) + lengths
    prompt = s.prompt_lengths[requests]
    beyond = ends > prompt
    if beyond.any():
        _fail_rule(
            "a chunk must end within its prompt",
            beyond,
            "row",
            lambda i: f"end {ends[i]} for prompt length {prompt[i]}",
        )
    page = s.config.chunk_alignment
    if page is not None:
        unaligned = ~s.is_final & (ends % page != 0)
        if unaligned.any():
            _fail_rule(
                f"a non-final chunk must end on a multiple of chunk_alignment {page}",
                unaligned,
                "row",
                lambda i: f"end {ends[i]}",
            )


def _check_request_order(s: ScheduleArrays) -> None:
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
        _fail_rule(
            "every request must have at least one chunk", counts == 0, "request", lambda r: "none"
        )
    first = np.concatenate(([0], np.cumsum(counts)[:-1]))
    last = first + counts - 1
    computed = s.num_computed_tokens
    if (starts[first] != computed).any():
        _fail_rule(
            "a request's first chunk must start at its computed-token count",
            starts[first] != computed,
            "request",
            lambda r: f"a first chunk at {starts[first[r]]} for {computed[r]} computed tokens",
        )
    lengths = s.prompt_lengths
    if (ends[last] != lengths).any():
        _fail_rule(
            "a request's last chunk must end at its prompt length",
            ends[last] != lengths,
            "request",
            lambda r: f"a last chunk ending at {ends[last[r]]} for length {lengths[r]}",
        )
    is_last = np.zeros(requests.size, dtype=np.bool_)
    is_last[last] = True
    gaps = ~is_last[:-1] & (ends[:-1] != starts[1:])
    if gaps.any():
        _fail_rule(
            "a request's chunks must be contiguous and in dispatch order",
            gaps,
            "sorted row",
            lambda i: (
                f"request {requests[i]}: a chunk ending at {ends[i]}, the next "
                f"starting at {starts[i + 1]}"
            ),
        )
    if (final != is_last).any():
        wrong = np.zeros(n, dtype=np.bool_)
        wrong[requests[final != is_last]] = True
        finals = np.bincount(requests[final], minlength=n)
        _fail_rule(
            "exactly one chunk per request, its last, must be final",
            wrong,
            "request",
            lambda r: f"{finals[r]} final chunk(s)" + (", not its last" if finals[r] == 1 else ""),
        )
    # Two rows of one request in one dispatch would break contiguity within the dispatch.
    dispatch = s.row_dispatch[order]
    same = ~is_last[:-1] & (dispatch[:-1] == dispatch[1:])
    if same.any():
        _fail_rule(
            "a request may appear at most once per dispatch",
            same,
            "sorted row",
            lambda i: f"request {requests[i]} twice in dispatch {dispatch[i]}",
        )
    # A dispatch's rows are in request order, as its arrays and final logits are.
    rows, in_dispatch = s.requests, s.row_dispatch
    behind = (in_dispatch[1:] == in_dispatch[:-1]) & (rows[1:] < rows[:-1])
    if behind.any():
        _fail_rule(
            "a dispatch's rows must be in request order",
            behind,
            "row",
            lambda i: f"request {rows[i]}, then request {rows[i + 1]} in dispatch {in_dispatch[i]}",
        )


def _check_request_caps(s: ScheduleArrays) -> None:
    """Every chunk within its request cap: ``config.chunk_cap``, or under ``packed``'s
    work-conserving tail the whole budget for a request left alone (``request_cap``). A
    request is unfinished in a dispatch if it has a row there or later. (Checked once the
    rows tile every request, so that each has exactly one final chunk.)"""
    config, lengths = s.config, s.lengths
    cap, lone = config.chunk_cap, request_cap(config, 1, 0, 0)
    caps = np.full(lengths.size, cap, dtype=np.int64)
    if lone != cap:
        finished = np.bincount(s.finish_dispatch, minlength=s.num_dispatches)
        unfinished = s.prompt_lengths.size - (np.cumsum(finished) - finished)
        caps[unfinished[s.row_dispatch] == 1] = lone
    over = lengths > caps
    if over.any():
        _fail_rule(
            f"a chunk must hold at most the chunk cap ({cap}) tokens"
            + (f", or {lone} for a request left alone" if lone != cap else ""),
            over,
            "row",
            lambda i: f"length {lengths[i]}",
        )


def _check_dispatch_limits(s: ScheduleArrays) -> None:
    config = s.config
    budget = config.effective_budget
    tokens = s.tokens_per_dispatch
    if (tokens > budget).any():
        _fail_rule(
            f"a dispatch must carry at most {budget} tokens",
            tokens > budget,
            "dispatch",
            lambda d: f"{tokens[d]} tokens",
        )
    rows, counts = config.max_num_seqs, s.rows_per_dispatch
    if rows is not None and (counts > rows).any():
        _fail_rule(
            f"a dispatch must carry at most {rows} rows",
            counts > rows,
            "dispatch",
            lambda d: f"{counts[d]} rows",
        )
    limit = config.max_num_partial_prefills
    if limit is not None:
        partial = _partial_counts(s)
        if (partial > limit).any():
            _fail_rule(
                f"at most {limit} requests may be part-way through prefill after a dispatch",
                partial > limit,
                "dispatch",
                lambda d: f"{partial[d]} part-way",
            )


def _partial_counts(s: ScheduleArrays) -> npt.NDArray[np.int64]:
    """Per dispatch: requests started but not finished once the dispatch has run."""
    n = s.prompt_lengths.size
    start = np.full(n, s.num_dispatches, dtype=np.int64)
    np.minimum.at(start, s.requests, s.row_dispatch)
    delta = np.zeros(s.num_dispatches + 1, dtype=np.int64)
    np.add.at(delta, start, 1)
    np.add.at(delta, s.finish_dispatch, -1)
    return np.cumsum(delta)[:-1]
