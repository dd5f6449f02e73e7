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
   ``config.effective_budget`` tokens and at most ``max_batch_size`` rows.
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

* If the tokens still to run fit in ``E`` and the requests fit in ``max_batch_size`` rows:
  one dispatch holding every request whole.
* Otherwise one request per dispatch, round-robin over the unfinished requests in request
  order. Each chunk is ``min(remaining, E)`` tokens; with ``page_size`` a non-final chunk's end
  is rounded down to a page boundary. Equivalently: round ``k`` holds the ``k``-th chunk of
  every request that has one, and rounds run in order.

The seed's case, 16 prompts of 3,338 tokens with threshold 256, is 224 dispatches: each
request runs 13 chunks of 256 tokens and one of 10.

Policy ``packed`` (co-scheduled chunks)
---------------------------------------
Each dispatch is filled greedily with budget ``max_num_batched_tokens`` and ``max_batch_size``
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

How ``packed`` is computed fast
-------------------------------
Most rows of a packed schedule are a request running ``step = chunk_cap`` rounded down to a
page multiple, dispatch after dispatch. ``_plan_packed`` keeps such requests as *steady*
(first dispatch, first position) and writes their rows in bulk when the run ends, so its
Python work is per dispatch and per request, not per row; rows whose size differs (first,
last, or cut by the budget) are written one by one. ``tests/oracle.py`` states the same policy
as a plain loop, and the tests check the two agree dispatch for dispatch.
"""

from __future__ import annotations

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
        requests=read_only(requests.astype(np.int32)),
        starts=read_only(starts.astype(np.int32)),
        lengths=read_only(sizes.astype(np.int32)),
        is_final=read_only(final),
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


# Each planner returns (dispatch_offsets, requests, starts, lengths, is_final).
Rows = tuple[IntArray, IntArray, IntArray, IntArray, npt.NDArray[np.bool_]]


def _plan_round_robin(lengths: IntArray, computed: IntArray, config: PlannerConfig) -> Rows:
    budget = config.effective_budget
    remaining = lengths - computed
    n = lengths.size
    rows_fit = config.max_batch_size is None or n <= config.max_batch_size
    if rows_fit and int(remaining.sum()) <= budget:
        requests = np.arange(n, dtype=np.int64)
        one_dispatch = np.array([0, n], dtype=np.int64)
        return one_dispatch, requests, computed.copy(), remaining, np.ones(n, dtype=np.bool_)
    requests, starts, sizes, final, round_index = _chunk_requests(lengths, computed, config)
    # Rows are request-major; a stable sort by round gives round-robin order.
    order = np.argsort(round_index, kind="stable")
    offsets = np.arange(order.size + 1, dtype=np.int64)
    return offsets, requests[order], starts[order], sizes[order], final[order]


def _chunk_requests(
    lengths: IntArray, computed: IntArray, config: PlannerConfig
) -> tuple[IntArray, IntArray, IntArray, npt.NDArray[np.bool_], IntArray]:
    """Split every request alone into chunks of at most ``effective_budget`` tokens.

    Returns rows in request-major order plus each row's index within its request. The first
    chunk runs from ``c`` to the last page boundary in reach; every later non-final chunk is
    ``step`` tokens, the budget rounded down to a page multiple; the final chunk is what is
    left once it fits in the budget.
    """
    budget = config.effective_budget
    page = config.page_size or 1
    step = budget // page * page
    remaining = lengths - computed
    first_end = np.where(remaining <= budget, lengths, (computed + budget) // page * page)
    after_first = lengths - first_end
    full_steps = np.maximum(after_first - budget, 0)
    counts = np.where(remaining <= budget, 1, 2 + -(-full_steps // step))
    total = int(counts.sum())
    requests = np.repeat(np.arange(lengths.size, dtype=np.int64), counts)
    row_start = np.cumsum(counts) - counts
    index = np.arange(total, dtype=np.int64) - np.repeat(row_start, counts)
    starts = np.where(
        index == 0, computed[requests], first_end[requests] + (index - 1) * step
    )
    ends = np.empty(total, dtype=np.int64)
    ends[:-1] = starts[1:]
    is_last = index == counts[requests] - 1
    ends[is_last] = lengths[requests[is_last]]
    return requests, starts, ends - starts, is_last, index


def _plan_packed(lengths: IntArray, computed: IntArray, config: PlannerConfig) -> Rows:
    plan = _PackedPlanner(lengths.tolist(), computed.tolist(), config)
    plan.run()
    return plan.rows()


class _PackedPlanner:
    """The ``packed`` policy, with runs of equal chunks kept implicit (see the header).

    The window of started, unfinished requests is ``steady + tail`` in request order:

    * ``steady`` requests run ``step`` tokens in every dispatch from ``joined[r]`` on, until
      the dispatch ``due[r]`` where what is left fits in one chunk; their position is stored
      as of ``joined[r]``;
    * ``tail`` requests are served one by one; a tail request is promoted to steady once
      every request before it is steady.

    A dispatch first charges the steady requests (``step`` each, or their last chunk when
    due); if that breaks the budget or the row limit, steady requests are moved from the end
    of ``steady`` to the front of ``tail`` until it does not, which serves the tail exactly as
    a plain in-order loop would.
    """

    def __init__(self, lengths: list[int], computed: list[int], config: PlannerConfig) -> None:
        self.lengths = lengths
        self.position = list(computed)
        self.n = len(lengths)
        self.budget = config.max_num_batched_tokens
        self.cap = config.chunk_cap
        self.page = config.page_size or 1
        self.step = self.cap // self.page * self.page
        self.max_rows = config.max_batch_size or self.n
        self.max_partial = config.max_num_partial_prefills or self.n
        self.steady: list[int] = []
        self.tail: list[int] = []
        self.joined = [0] * self.n
        self.due = [-1] * self.n
        self.due_at: dict[int, list[int]] = {}
        self.next_new = 0
        self.dispatch = 0
        # Rows written one by one: dispatch, request, start, length, final.
        self.one_d: list[int] = []
        self.one_r: list[int] = []
        self.one_s: list[int] = []
        self.one_n: list[int] = []
        self.one_f: list[bool] = []
        # Runs of `step`-token rows: first dispatch, count, request, first start.
        self.run_d: list[int] = []
        self.run_k: list[int] = []
        self.run_r: list[int] = []
        self.run_s: list[int] = []

    # -- the dispatch loop ------------------------------------------------------------------

    def run(self) -> None:
        while self.steady or self.tail or self.next_new < self.n:
            self._fill_dispatch()
            self.dispatch += 1

    def _fill_dispatch(self) -> None:
        finishing = self._take_due()
        steady = self.steady
        demand = self.step * (len(steady) - len(finishing))
        demand += sum(self._remaining(r) for r in finishing)
        # Keep the longest prefix of steady requests that fits; the rest join the tail.
        while steady and (demand > self.budget or len(steady) > self.max_rows):
            r = steady.pop()
            if r in finishing:
                demand -= self._remaining(r)
                finishing.discard(r)
            else:
                demand -= self.step
                self._leave_steady(r)
            self.tail.insert(0, r)
        left = self.budget - demand
        rows = len(steady)
        if finishing:
            for r in steady:
                if r in finishing:
                    self._write(r, self._remaining(r), final=True)
            self.steady = [r for r in steady if r not in finishing]
        # Started requests left over, in order; each is promoted while all before it are steady.
        all_steady = True
        tail: list[int] = []
        for r in self.tail:
            size = self._chunk(r, left) if rows < self.max_rows else 0
            if size > 0:
                left -= size
                rows += 1
                if not self._serve(r, size):
                    continue
                if all_steady:
                    self._join_steady(r)
                    continue
            tail.append(r)
            all_steady = False
        # New requests, in order, while they fit.
        partial = len(self.steady) + len(tail)
        while self.next_new < self.n and rows < self.max_rows and left > 0:
            r = self.next_new
            size = self._chunk(r, left)
            if size == 0 or (size < self._remaining(r) and partial >= self.max_partial):
                break
            self.next_new += 1
            left -= size
            rows += 1
            if self._serve(r, size):
                partial += 1
                if all_steady:
                    self._join_steady(r)
                else:
                    tail.append(r)
        self.tail = tail

    def _take_due(self) -> set[int]:
        """Steady requests whose last chunk runs in this dispatch, with positions brought
        up to date (they stay in ``steady`` for this dispatch's ordering)."""
        due_now: set[int] = set()
        for r in self.due_at.pop(self.dispatch, ()):
            if self.due[r] == self.dispatch:  # skip entries made stale by leaving steady
                self._leave_steady(r)
                due_now.add(r)
        return due_now

    # -- one request --------------------------------------------------------------------------

    def _remaining(self, r: int) -> int:
        return self.lengths[r] - self.position[r]

    def _chunk(self, r: int, left: int) -> int:
        """Tokens ``r`` runs in this dispatch with ``left`` budget (0: none)."""
        start = self.position[r]
        remaining = self.lengths[r] - start
        if remaining <= self.cap and remaining <= left:
            return remaining
        end = (start + min(self.cap, left)) // self.page * self.page
        return max(end - start, 0)

    def _serve(self, r: int, size: int) -> bool:
        """Write ``r``'s chunk of ``size`` tokens; return whether ``r`` is still unfinished."""
        unfinished = size < self.lengths[r] - self.position[r]
        self._write(r, size, final=not unfinished)
        return unfinished

    def _write(self, r: int, size: int, *, final: bool) -> None:
        self.one_d.append(self.dispatch)
        self.one_r.append(r)
        self.one_s.append(self.position[r])
        self.one_n.append(size)
        self.one_f.append(final)
        self.position[r] += size

    def _join_steady(self, r: int) -> None:
        """Make ``r`` run ``step`` tokens per dispatch from the next dispatch on."""
        start = self.dispatch + 1
        self.joined[r] = start
        over = self.lengths[r] - self.position[r] - self.cap
        due = start + max(0, -(-over // self.step))
        self.due[r] = due
        self.due_at.setdefault(due, []).append(r)
        self.steady.append(r)

    def _leave_steady(self, r: int) -> None:
        """Write ``r``'s run of steady rows so far and bring its position up to date."""
        count = self.dispatch - self.joined[r]
        if count > 0:
            self.run_d.append(self.joined[r])
            self.run_k.append(count)
            self.run_r.append(r)
            self.run_s.append(self.position[r])
            self.position[r] += count * self.step
        self.joined[r] = self.dispatch
        self.due[r] = -1

    # -- output --------------------------------------------------------------------------------

    def rows(self) -> Rows:
        counts = np.array(self.run_k, dtype=np.int64)
        run = np.repeat(np.arange(counts.size), counts)
        offset = np.arange(run.size, dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)
        dispatch = np.concatenate(
            (np.array(self.one_d, dtype=np.int64), np.array(self.run_d, dtype=np.int64)[run] + offset)
        )
        requests = np.concatenate(
            (np.array(self.one_r, dtype=np.int64), np.array(self.run_r, dtype=np.int64)[run])
        )
        starts = np.concatenate(
            (
                np.array(self.one_s, dtype=np.int64),
                np.array(self.run_s, dtype=np.int64)[run] + offset * self.step,
            )
        )
        sizes = np.concatenate(
            (np.array(self.one_n, dtype=np.int64), np.full(run.size, self.step, dtype=np.int64))
        )
        final = np.concatenate((np.array(self.one_f, dtype=np.bool_), np.zeros(run.size, np.bool_)))
        # Within a dispatch rows run in request order.
        order = np.argsort(dispatch * self.n + requests)
        per_dispatch = np.bincount(dispatch, minlength=self.dispatch)
        offsets = np.concatenate(([0], np.cumsum(per_dispatch))).astype(np.int64)
        return offsets, requests[order], starts[order], sizes[order], final[order]
