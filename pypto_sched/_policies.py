"""Every scheduling rule of the planner.

Theory of operation
===================

A *request* is one prompt of ``L`` tokens of which the first ``c`` (``0 <= c < L``) are
already in the KV cache (a prefix-cache hit); its prefill runs positions ``c .. L-1``. A
*chunk* is a contiguous run of those positions, ``start .. start+length-1``. A *dispatch* is
one device call: a list of chunks (rows) of distinct requests. A *schedule* is the list of
dispatches that runs every request's prefill exactly once. The final chunk of a request is the
only one whose logits are sampled.

Invariants every schedule satisfies (``Schedule.validate`` checks them all):

1. Tiling: in dispatch order, each request's chunks are non-empty, contiguous, start at ``c``
   and end at ``L``; exactly one of them, the last, is final.
2. A dispatch holds at least one row, at most one row per request, at most
   ``config.effective_budget`` tokens and at most ``max_num_seqs`` rows.
3. Every chunk holds at most ``config.chunk_cap`` tokens: ``min(max_num_batched_tokens,
   long_prefill_token_threshold)``.
4. With ``page_size`` set, every non-final chunk ends on a multiple of ``page_size``.
5. With ``max_num_partial_prefills`` set (``packed`` only), at most that many requests are
   started but unfinished after any dispatch.

Because ``page_size <= chunk_cap`` (checked by ``PlannerConfig``), from any position there is
a page boundary within one chunk's reach, so every policy makes progress in every dispatch.

Policy ``round_robin`` (the seed's behaviour)
---------------------------------------------
Effective budget ``E = min(max_num_batched_tokens, long_prefill_token_threshold)``.

* If the tokens still to run fit in ``E`` and the requests fit in ``max_num_seqs`` rows:
  one dispatch holding every request whole.
* Otherwise one request per dispatch, round-robin over the unfinished requests in request
  order. Each chunk is ``min(remaining, E)`` tokens; with ``page_size`` a non-final chunk's end
  is rounded down to a page boundary. Equivalently: round ``k`` holds the ``k``-th chunk of
  every request that has one, and rounds run in order.

The seed's case, 16 prompts of 3,338 tokens with threshold 256, is 224 dispatches: each
request runs 13 chunks of 256 tokens and one of 10.

Policy ``packed`` (co-scheduled chunks)
---------------------------------------
Each dispatch is filled greedily with budget ``max_num_batched_tokens`` and ``max_num_seqs``
rows. A request may run up to ``chunk_cap`` tokens; a chunk limited by the budget left, by
the cap or by a page boundary is non-final. The dispatch is filled in this order:

1. Started requests, in request order. One that cannot run a single token here (only
   possible with ``page_size``) is skipped for this dispatch; the others still run.
2. New requests, in request order, while the budget and rows last. Admission stops at the
   first new request that cannot run any token, or that would be left part-way while
   ``max_num_partial_prefills`` requests already are.

Because started requests come first, a started request waits for no newcomer, and because
new ones are admitted in order, requests start in request order. The dispatch count is then
close to ``Schedule.lower_bound`` (the seed's case with budget 8192 and 16 rows takes 14).

How the policies are computed fast
----------------------------------
``round_robin`` is computed whole in NumPy: each request's chunks follow from its own length,
and a stable sort of all chunks by their index within their request gives round-robin order.

Most rows of a ``packed`` schedule are a request running ``step = chunk_cap`` rounded down to
a page multiple, dispatch after dispatch. ``_PackedPlanner`` keeps such requests as *steady*.
A request joins right after a chunk, and while it stays steady its future is known: that
chunk, ``step`` tokens per dispatch until what is left fits in one chunk, then that last
chunk. So it records this *run* of rows once, on joining, and cuts the record short in the
rare dispatch where the budget or the row limit pushes it out. The Python work is per
dispatch and per request, not per row; NumPy expands the runs into rows and sorts them
stably by dispatch. ``tests/oracle.py`` states both policies as plain loops, and the tests
check that they agree dispatch for dispatch.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from ._config import PlannerConfig
from ._errors import InvalidInputError
from ._schedule import Schedule
from ._validate import as_count_array, read_only

__all__ = ["plan_prefill"]

IntArray = npt.NDArray[np.int64]


def plan_prefill(
    prompt_lengths: Sequence[int] | npt.NDArray[np.integer],
    config: PlannerConfig,
    *,
    num_computed_tokens: Sequence[int] | npt.NDArray[np.integer] | None = None,
) -> Schedule:
    """Plan the prefill of a batch of prompts.

    ``prompt_lengths`` holds one length ``>= 1`` per request, in request order.
    ``num_computed_tokens``, when given, holds per request the tokens already in the KV cache
    (``0 <= c < length``); that request's chunks start at ``c``. The inputs are not mutated;
    equal inputs give equal schedules.
    """
    if not isinstance(config, PlannerConfig):
        raise InvalidInputError(f"'config' must be a PlannerConfig: {type(config).__name__}")
    lengths = as_count_array("prompt_lengths", prompt_lengths, min_value=1)
    computed = _computed_tokens(num_computed_tokens, lengths)
    if config.policy == "round_robin":
        rows = _plan_round_robin(lengths, computed, config)
    else:
        rows = _plan_packed(lengths, computed, config)
    offsets, requests, starts, sizes, final = rows
    return Schedule(
        config=config,
        prompt_lengths=lengths,
        num_computed_tokens=computed,
        dispatch_offsets=read_only(offsets),
        requests=read_only(requests),
        starts=read_only(starts),
        lengths=read_only(sizes),
        is_final=read_only(final),
    )


def plan_one_shot(
    prompt_lengths: Sequence[int] | npt.NDArray[np.integer],
    *,
    num_computed_tokens: Sequence[int] | npt.NDArray[np.integer] | None = None,
) -> Schedule:
    """The unchunked schedule: every request's remaining tokens whole, in one dispatch.

    It is what chunked schedules are verified against (the same logits, by construction of
    the backend contract), and what fills a cache with prefixes.
    """
    lengths = as_count_array("prompt_lengths", prompt_lengths, min_value=1)
    computed = _computed_tokens(num_computed_tokens, lengths)
    budget = max(int((lengths - computed).sum()), 1)
    return plan_prefill(
        lengths, PlannerConfig(max_num_batched_tokens=budget), num_computed_tokens=computed
    )


def _computed_tokens(values: object, lengths: IntArray) -> IntArray:
    if values is None:
        return read_only(np.zeros_like(lengths))
    computed = as_count_array("num_computed_tokens", values, min_value=0, allow_empty=True)
    if computed.size != lengths.size:
        raise InvalidInputError(
            f"'num_computed_tokens' must have one entry per prompt ({lengths.size}): "
            f"{computed.size} entries"
        )
    full = computed >= lengths
    if full.any():
        index = int(np.flatnonzero(full)[0])
        raise InvalidInputError(
            f"'num_computed_tokens' must be < the prompt length, leaving at least one token "
            f"to prefill: item {index} is {int(computed[index])} for length "
            f"{int(lengths[index])}"
        )
    return computed


def chunk_size(start: int, length: int, limit: int, page: int) -> int:
    """The chunk rule every policy shares: the tokens a request at position ``start`` of a
    ``length``-token prompt runs when ``limit`` tokens are allowed (the chunk cap, or less
    when the budget left is smaller). All that is left when it fits (the final chunk);
    otherwise up to the last multiple of ``page`` within reach (1 without ``page_size``),
    which is 0 when no page boundary is in reach."""
    remaining = length - start
    if remaining <= limit:
        return remaining
    return max((start + limit) // page * page - start, 0)


# Each planner returns (dispatch_offsets, requests, starts, lengths, is_final), the row
# arrays as int32 like the schedule's.
Int32Array = npt.NDArray[np.int32]
Rows = tuple[IntArray, Int32Array, Int32Array, Int32Array, npt.NDArray[np.bool_]]


def _plan_round_robin(lengths: IntArray, computed: IntArray, config: PlannerConfig) -> Rows:
    budget = config.effective_budget
    remaining = lengths - computed
    n = lengths.size
    rows_fit = config.max_num_seqs is None or n <= config.max_num_seqs
    if rows_fit and int(remaining.sum()) <= budget:
        one_dispatch = np.array([0, n], dtype=np.int64)
        return (
            one_dispatch,
            np.arange(n, dtype=np.int32),
            computed.astype(np.int32),
            remaining.astype(np.int32),
            np.ones(n, dtype=np.bool_),
        )
    # Each request alone is split into chunks of at most `budget` tokens: the first runs from
    # c to the last page boundary in reach, every later non-final one is `step` tokens (the
    # budget rounded down to a page multiple), the final one is what is left once it fits.
    page = config.page_size or 1
    step = budget // page * page
    fits = remaining <= budget
    first_end = np.where(fits, lengths, (computed + budget) // page * page)
    middle = -(-np.maximum(lengths - first_end - budget, 0) // step)
    counts = np.where(fits, 1, 2 + middle)
    # One row per dispatch: chunk k of request r, in round-robin order. Round 0, the first n
    # rows, holds every request's first chunk; chunk k >= 1 starts k - 1 steps after it.
    requests, k = _round_robin_order(counts)
    starts = first_end[requests] + (k - 1) * step
    starts[:n] = computed
    is_last = k == counts[requests] - 1
    ends = np.where(is_last, lengths[requests], starts + step)
    ends[:n] = first_end
    offsets = np.arange(requests.size + 1, dtype=np.int64)
    sizes = ends - starts
    return (
        offsets,
        requests.astype(np.int32),
        starts.astype(np.int32),
        sizes.astype(np.int32),
        is_last,
    )


def _round_robin_order(counts: IntArray) -> tuple[IntArray, IntArray]:
    """Every pair (request r, chunk index k < counts[r]), ordered by k, then by r.

    Returns the requests and the chunk indices. A stable sort of the request-major pairs by
    ``k`` keeps request order within each round.
    """
    total = int(counts.sum())
    requests = np.repeat(np.arange(counts.size, dtype=np.int64), counts)
    k = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)
    order = _stable_argsort(k)
    rows_per_round = np.bincount(k)
    return requests[order], np.repeat(np.arange(rows_per_round.size), rows_per_round)


def _plan_packed(lengths: IntArray, computed: IntArray, config: PlannerConfig) -> Rows:
    plan = _PackedPlanner(lengths.tolist(), computed.tolist(), config)
    plan.run()
    return plan.rows(lengths)


class _PackedPlanner:
    """The ``packed`` policy, with runs of equal chunks kept implicit (see the header).

    The window of started, unfinished requests is ``steady + tail`` in request order:

    * a ``steady`` request runs ``step`` tokens per dispatch until the dispatch where what
      is left fits in one chunk, and then that last chunk (``due_at`` lists steady requests
      by that dispatch);
    * ``tail`` requests are served one by one; a tail request is promoted to steady once
      every request before it is steady.

    A dispatch first charges the steady requests (``step`` each, or their last chunk when
    due); if that breaks the budget or the row limit, steady requests are moved from the end
    of ``steady`` to the front of ``tail`` until it does not, which serves the tail exactly as
    a plain in-order loop would.

    Rows are recorded as *runs*: ``count`` rows of one request in consecutive dispatches
    from ``first``, running from position ``start``: ``head`` tokens, then ``step`` tokens
    each, the last row ``last`` tokens (with one row, ``head == last``). A request joins
    ``steady`` right after a chunk, and its whole future is then known: that chunk, the
    steps, the last chunk. So it writes that run on joining; in the rare case it leaves
    ``steady`` early, the run is cut short in place. Every other row is a run of one.
    """

    def __init__(self, lengths: list[int], computed: list[int], config: PlannerConfig) -> None:
        self.lengths = lengths
        self.position = list(computed)  # up to date for requests not steady
        self.n = len(lengths)
        self.budget = config.max_num_batched_tokens
        self.cap = config.chunk_cap
        self.page = config.page_size or 1
        self.step = self.cap // self.page * self.page
        self.max_rows = config.max_num_seqs or self.n
        self.max_partial = config.max_num_partial_prefills or self.n
        # Request -> where its run starts in `runs`, in request order: a dict drops any
        # request in O(1) and popitem() takes the last.
        self.steady: dict[int, int] = {}
        # Per dispatch: the steady requests due, and what their last chunks add to a step
        # each. (Plain dicts: a defaultdict's default factory would cost a call.)
        self.due_at: dict[int, list[int]] = {}
        self.extra_at: dict[int, int] = {}
        self.tail: list[int] = []
        self.num_dispatches = 0
        # Runs, flattened: first, count, request, start, head, last; first, count, ...
        self.runs: list[int] = []

    # -- the dispatch loop ------------------------------------------------------------------

    def run(self) -> None:
        """Fill dispatches in order until every request has run.

        This is the hot loop: its work is per dispatch and per request, never per steady
        row. What runs once per request is inlined, with the state in local variables;
        rarer paths (shrinking ``steady``, serving the tail) are methods.
        """
        lengths, position, runs = self.lengths, self.position, self.runs
        steady, due_at, extra_at, tail = self.steady, self.due_at, self.extra_at, self.tail
        budget, cap, page, step = self.budget, self.cap, self.page, self.step
        max_rows, max_partial, n = self.max_rows, self.max_partial, self.n
        write = runs.extend
        d = 0  # the dispatch being filled
        new = 0  # the first request not started
        while steady or tail or new < n:
            # Charge the steady requests: a step each, the last chunk for those due now.
            finishing = due_at.pop(d, [])
            demand = step * len(steady) + extra_at.pop(d, 0)
            rows = len(steady)
            if demand > budget or rows > max_rows:
                demand = self._shrink_steady(d, finishing, demand)
                rows = len(steady)
            left = budget - demand
            for r in finishing:  # their runs are written; they end here
                del steady[r]
            # The other started requests, in order.
            all_steady = True
            if tail:
                all_steady, left, rows = self._serve_tail(d, left, rows)
            # New requests, in order, while they fit.
            r = new
            while r < n and rows < max_rows and left > 0:
                start = position[r]
                remaining = lengths[r] - start
                if remaining <= cap and remaining <= left:  # the whole prefill
                    write((d, 1, r, start, remaining, remaining))
                    left -= remaining
                    rows += 1
                    r += 1
                    continue
                # Cut by the cap or the budget, then down to a page boundary: not final.
                # (chunk_size, inlined; conditional expressions, not min(): calls cost more.)
                size = (start + (cap if cap < left else left)) // page * page - start
                if size <= 0 or len(steady) + len(tail) >= max_partial:
                    break
                left -= size
                rows += 1
                if all_steady:  # _join_steady, inlined
                    over = remaining - size - cap
                    steps = -(-over // step) if over > 0 else 0
                    last = remaining - size - steps * step
                    steady[r] = len(runs)
                    write((d, steps + 2, r, start, size, last))
                    due = d + 1 + steps
                    due_at.setdefault(due, []).append(r)
                    extra_at[due] = extra_at.get(due, 0) + last - step
                else:
                    write((d, 1, r, start, size, size))
                    position[r] = start + size
                    tail.append(r)
                r += 1
            new = r
            d += 1
        self.num_dispatches = d

    def _shrink_steady(self, d: int, finishing: list[int], demand: int) -> int:
        """Move steady requests from the end to the front of the tail until the rest fit
        in dispatch ``d``; return the demand of the rest."""
        steady, runs, step = self.steady, self.runs, self.step
        while steady and (demand > self.budget or len(steady) > self.max_rows):
            r, at = steady.popitem()
            first, count, _, start, head, last = runs[at : at + 6]
            due = first + count - 1
            if due == d:
                finishing.remove(r)
                demand -= last  # its charge: its last chunk
            else:
                self.due_at[due].remove(r)
                self.extra_at[due] -= last - step
                demand -= step  # its charge: a step
            # Cut its run short: the head, then the steps up to the last dispatch.
            count = d - first
            runs[at + 1] = count
            runs[at + 5] = step if count > 1 else head
            self.position[r] = start + head + (count - 1) * step
            self.tail.insert(0, r)
        return demand

    def _serve_tail(self, d: int, left: int, rows: int) -> tuple[bool, int, int]:
        """Serve the tail in order in dispatch ``d``, promoting each request while all before
        it are steady; return whether all are, and the budget and rows left."""
        lengths, position = self.lengths, self.position
        all_steady = True
        tail: list[int] = []
        for r in self.tail:
            size = self._chunk(r, left) if rows < self.max_rows else 0
            if size > 0:
                left -= size
                rows += 1
                unfinished = position[r] + size < lengths[r]
                if unfinished and all_steady:
                    self._join_steady(r, d, size)
                    continue
                self.runs.extend((d, 1, r, position[r], size, size))
                position[r] += size
                if not unfinished:
                    continue
            tail.append(r)
            all_steady = False
        self.tail[:] = tail  # in place: run() holds the list
        return all_steady, left, rows

    # -- one request --------------------------------------------------------------------------

    def _chunk(self, r: int, left: int) -> int:
        """Tokens ``r`` runs with ``left`` budget (0: none)."""
        return chunk_size(self.position[r], self.lengths[r], min(self.cap, left), self.page)

    def _join_steady(self, r: int, d: int, size: int) -> None:
        """Run a non-final chunk of ``size`` tokens of ``r`` in dispatch ``d`` and make ``r``
        steady from the next dispatch on, recording its run from that chunk to its last."""
        start, step = self.position[r], self.step
        remaining = self.lengths[r] - start
        over = remaining - size - self.cap
        steps = -(-over // step) if over > 0 else 0
        last = remaining - size - steps * step
        self.steady[r] = len(self.runs)
        self.runs.extend((d, steps + 2, r, start, size, last))
        due = d + 1 + steps
        self.due_at.setdefault(due, []).append(r)
        self.extra_at[due] = self.extra_at.get(due, 0) + last - step

    # -- output --------------------------------------------------------------------------------

    def rows(self, lengths: IntArray) -> Rows:
        """The rows in dispatch order and, within a dispatch, in request order.

        Runs are recorded in order of their first row: by dispatch, then by request. Two
        runs that share a dispatch are then in request order too (a request that starts a
        run while another runs steady comes after it in the window), so sorting the rows
        stably by dispatch puts each dispatch's rows in request order.
        """
        runs = np.frombuffer(array("q", self.runs), dtype=np.int64).reshape(-1, 6)
        first, counts, requests, starts, heads, lasts = runs.astype(np.int32).T
        step = self.step
        ends = np.cumsum(counts, dtype=np.int32)
        begins = ends - counts
        total = int(ends[-1])
        within = np.arange(total, dtype=np.int32) - np.repeat(begins, counts)
        dispatch = np.repeat(first, counts) + within
        order = _stable_argsort(dispatch)
        # Past its head, a run advances by `step` per row. (Every term stays below 2**31.)
        row_starts = np.repeat(starts + heads, counts) + (within - 1) * step
        row_starts[begins] = starts
        sizes = np.full(total, step, dtype=np.int32)
        sizes[begins] = heads
        sizes[ends - 1] = lasts
        final = np.zeros(total, dtype=np.bool_)
        final[ends - 1] = row_starts[ends - 1] + lasts == lengths[requests]
        # A dispatch holds a row of every run begun and not yet ended by then.
        num = self.num_dispatches
        begun = np.bincount(first, minlength=num)
        ended = np.bincount(first + counts, minlength=num + 1)[:num]
        offsets = np.concatenate(([0], np.cumsum(np.cumsum(begun - ended)))).astype(np.int64)
        requests = np.repeat(requests, counts)
        return offsets, requests[order], row_starts[order], sizes[order], final[order]


def _stable_argsort(keys: npt.NDArray[np.integer]) -> IntArray:
    """The indices that sort ``keys`` (non-negative ints) stably.

    NumPy's stable sort is a radix sort for 16-bit keys and a merge sort, several times
    slower, for wider ones; so wider keys are sorted one 16-bit digit at a time, lowest
    first (a least-significant-digit radix sort).
    """
    order = np.argsort((keys & 0xFFFF).astype(np.uint16), kind="stable")
    high = int(keys.max()) >> 16 if keys.size else 0
    shift = 16
    while high:
        digit = ((keys[order] >> shift) & 0xFFFF).astype(np.uint16)
        order = order[np.argsort(digit, kind="stable")]
        high >>= 16
        shift += 16
    return order
