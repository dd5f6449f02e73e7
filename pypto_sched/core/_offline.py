"""The fast offline engines: the rules of ``_policies.py`` applied to a whole batch at once,
and the handover from them to the online planner.

:func:`plan_rows` plans a batch's rows under either policy; :func:`rows_kept_to_the_bound`
keeps ``packed``'s rows to the bound by handing the rest of a schedule to
:func:`~pypto_sched.plan_step` from the first dispatch that might break it (``_policies.py``,
*Keeping to the bound*). Every choice they make is a rule function of ``_policies.py``.

How the offline policies are computed fast
------------------------------------------
``round_robin`` is computed whole in NumPy: each request's chunks follow from its own length
by the chunk rule (its first chunk by :func:`chunk_sizes`, then :func:`full_step`-sized
chunks, then what is left). Round ``k`` holds chunk ``k`` of every request with more than
``k`` chunks, in request order; the requests in a round change only after a round that is
some request's last, so the rounds in between form a block (the same requests, a step
further on each round) written by one broadcast. No sort: the work is the rows plus, per
block, the requests still running, and the Python work is one iteration per distinct number
of chunks (at most ``sqrt(2 * rows)``).

Most rows of a ``packed`` schedule are a request running ``step = full_step(chunk_cap,
page)`` tokens, dispatch after dispatch. ``_PackedPlanner`` keeps such requests as *steady*.
A request joins right after a chunk, and while it stays steady its future is known: that
chunk, ``step`` tokens per dispatch until what is left fits in one chunk, then that last
chunk (``_steady_run``, the chunk rule applied with the cap every dispatch). So it records
this *run* of rows once, on joining, and cuts the record short in the rare dispatch where the
budget or the row limit pushes it out. New requests are admitted in *batches*: while a whole
cap and a row are left, :func:`chunk_limit` allows a new request the cap, so its chunk is
its first chunk with the cap allowed, computed for every request at once by
:func:`chunk_sizes`; when :func:`admits` takes a part-way chunk even with every request
part-way (no partial limit), each such request is admitted, and prefix sums of those first
chunks give by bisection how many fit. The Python work is per dispatch and per request, not
per row; NumPy expands the runs into rows and sorts them stably by dispatch (a radix sort).
Every other chunk is sized by :func:`chunk_size` and admitted by :func:`admits`. Once one
request is left, its steady run is cut short and the rest of its prefill is planned under
the work-conserving tail's :func:`request_cap`.

``tests/oracle.py`` states both policies as plain loops, sharing no code with this module,
and the tests check that they agree dispatch for dispatch, with workloads aimed at each fast
path's boundaries. ``benchmarks/bench_planner.py`` times both against the oracle and against
the floor of copying the schedule's arrays once.
"""

from __future__ import annotations

from bisect import bisect_right
from typing import Any, overload

import numpy as np
import numpy.typing as npt

from ._config import PlannerConfig
from ._errors import InvalidInputError
from ._online import PrefillState, RequestRecord, plan_step, restore_prefill_state
from ._policies import (
    IntArray,
    admits,
    bound_rule_applies,
    chunk_limit,
    chunk_size,
    chunk_sizes,
    fits_one_dispatch,
    full_step,
    request_cap,
    surely_keeps_to_the_bound,
)
from ._schedule import lower_bound

__all__ = ["plan_rows", "rows_kept_to_the_bound"]


# Each planner returns (dispatch_offsets, requests, starts, lengths, is_final), the row
# arrays as int32 like the schedule's.
Int32Array = npt.NDArray[np.int32]
Rows = tuple[IntArray, Int32Array, Int32Array, Int32Array, npt.NDArray[np.bool_]]


#: The most chunks the offline planner plans in one schedule: 2**28 rows are 4 to 6 GB of
#: arrays (14 to 22 bytes a row), beyond what a batch needs and what many machines hold. A
#: larger schedule is refused before any of it is built, rather than failing for memory
#: part-way (or being killed by the operating system).
MAX_CHUNKS = 2**28


def fewest_chunks(remaining: IntArray, config: PlannerConfig) -> int:
    """The fewest chunks any schedule of requests with ``remaining`` tokens each can hold
    under ``config``: no chunk is above ``chunk_cap``, but those of the one request left
    alone at the end (the last unfinished), which may run the :func:`request_cap` of a
    request alone; that one is taken to be whichever saves the most chunks."""
    cap, lone = config.chunk_cap, request_cap(config, 1, 0, 0)
    shared = -(-remaining // cap)
    if lone == cap or remaining.size == 0:
        return int(shared.sum())
    return int(shared.sum() - (shared - -(-remaining // lone)).max())


def plan_rows(lengths: IntArray, computed: IntArray, config: PlannerConfig) -> Rows:
    """The rows of the schedule of prompts of ``lengths`` with ``computed`` tokens cached
    (both checked) under ``config``'s policy: ``(dispatch_offsets, requests, starts, lengths,
    is_final)``, in dispatch order and, within a dispatch, in request order.

    Raises :class:`InvalidInputError` when the schedule would hold more than
    :data:`MAX_CHUNKS` chunks."""
    chunks = fewest_chunks(lengths - computed, config)
    if chunks > MAX_CHUNKS:
        raise InvalidInputError(
            f"the schedule of these prompts would hold at least {chunks:,} chunks, more than "
            f"the planner's limit of {MAX_CHUNKS:,} (2**28, 4 to 6 GB of arrays): plan them "
            f"in smaller batches, or with a larger 'max_num_batched_tokens' or "
            f"'long_prefill_token_threshold'"
        )
    if config.policy == "round_robin":
        return _round_robin_rows(lengths, computed, config)
    return _packed_rows(lengths, computed, config)


def _round_robin_rows(lengths: IntArray, computed: IntArray, config: PlannerConfig) -> Rows:
    budget = config.effective_budget
    remaining = lengths - computed
    n = lengths.size
    if fits_one_dispatch(int(remaining.sum()), n, budget, config.max_num_seqs):
        one_dispatch = np.array([0, n], dtype=np.int64)
        return (
            one_dispatch,
            np.arange(n, dtype=np.int32),
            computed.astype(np.int32),
            remaining.astype(np.int32),
            np.ones(n, dtype=np.bool_),
        )
    # Alone in its dispatches, a request runs the chunk rule with `budget` allowed every time:
    # its first chunk from c, then `step`-token chunks from page boundaries while more than
    # the budget is left, then what is left once it fits.
    page = config.chunk_alignment or 1
    step = full_step(budget, page)
    first_end = computed + chunk_sizes(computed, lengths, budget, page)
    middle = -(-np.maximum(lengths - first_end - budget, 0) // step)
    counts = np.where(first_end == lengths, 1, 2 + middle)
    total = int(counts.sum())
    # One row per dispatch, in round-robin order: round k holds chunk k of every request with
    # more than k chunks, in request order. Round 0, the first n rows, holds the first chunks.
    requests = np.empty(total, dtype=np.int32)
    starts = np.empty(total, dtype=np.int32)
    sizes = np.full(total, step, dtype=np.int32)
    final = np.zeros(total, dtype=np.bool_)
    requests[:n] = np.arange(n, dtype=np.int32)
    starts[:n] = computed
    sizes[:n] = first_end - computed
    final[:n] = counts == 1
    # From round 1 on, chunk k of a request starts k - 1 steps after its first chunk ends, and
    # its last chunk is what is left then. The requests still running change only after a
    # round that is some request's last, so the rounds up to that one form a block: the same
    # requests in every round, each a step further on than in the round before.
    ids = np.flatnonzero(counts > 1).astype(np.int32)
    behind = (first_end[ids] - step).astype(np.int32)  # a step before chunk 1
    last = (lengths - first_end - (counts - 2) * step).astype(np.int32)
    # The running requests grouped by their number of chunks (stably: in request order).
    ending = ids[_stable_argsort(counts[ids], int(counts.max()) + 1)]
    last_rounds, group_sizes = np.unique(counts[ids], return_counts=True)
    row, k, group_end = n, 1, 0
    for last_round, group_size in zip(last_rounds.tolist(), group_sizes.tolist(), strict=True):
        rounds = last_round - k
        block = slice(row, row + rounds * ids.size)
        requests[block].reshape(rounds, -1)[:] = ids
        advance = np.arange(k, last_round, dtype=np.int32) * np.int32(step)
        np.add(behind, advance[:, None], out=starts[block].reshape(rounds, -1))
        # The block's last round is the last of the requests with `last_round` chunks.
        row += (rounds - 1) * ids.size
        group = ending[group_end : group_end + group_size]
        group_end += group_size
        where = np.searchsorted(ids, group)
        sizes[row + where] = last[group]
        final[row + where] = True
        row += ids.size
        goes_on = np.ones(ids.size, dtype=np.bool_)
        goes_on[where] = False
        ids, behind = ids[goes_on], behind[goes_on]
        k = last_round
    return np.arange(total + 1, dtype=np.int64), requests, starts, sizes, final


def _packed_rows(lengths: IntArray, computed: IntArray, config: PlannerConfig) -> Rows:
    plan = _PackedPlanner(lengths, computed, config)
    plan.run()
    return plan.rows(lengths)


@overload
def _steady_run(after: int, cap: int, step: int) -> tuple[int, int]: ...
@overload
def _steady_run(after: IntArray, cap: int, step: int) -> tuple[IntArray, IntArray]: ...
def _steady_run(after: Any, cap: int, step: int) -> Any:
    """The chunks of a request at a page boundary with ``after`` tokens left that is allowed
    ``cap`` tokens in every dispatch, by the chunk rule (:func:`chunk_size`): ``step`` tokens
    (:func:`full_step`) while more than ``cap`` are left, then all that is left. Returns the
    number of steps and the last chunk; elementwise on arrays."""
    steps = -(-(after - cap) // step)
    steps = steps * (steps > 0)
    return steps, after - steps * step


# The `due_at` entry of a dispatch in which no steady request is due (never mutated).
_NOTHING_DUE = [0]


class _PackedPlanner:
    """The ``packed`` policy, with runs of equal chunks kept implicit (see the header).

    The window of started, unfinished requests is ``steady + tail`` in request order:

    * a ``steady`` request runs ``step`` tokens per dispatch until the dispatch where what
      is left fits in one chunk, and then that last chunk (``due_at`` lists steady requests
      by that dispatch, after what their last chunks add to a step each);
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

    New requests are admitted in *batches*: while a whole ``cap`` and a row are left, what
    :func:`chunk_limit` allows a new request is ``cap``, so its chunk is its first chunk with
    ``cap`` allowed, known in advance (``first``, by :func:`chunk_sizes`); when :func:`admits`
    takes any such chunk whatever the number of partial requests (no partial limit), every
    request is admitted while a cap is left, and prefix sums of ``first`` give, by bisection,
    how many are.
    """

    def __init__(self, lengths: IntArray, computed: IntArray, config: PlannerConfig) -> None:
        self.config = config
        self.lengths: list[int] = lengths.tolist()
        self.position: list[int] = computed.tolist()  # up to date for requests not steady
        self.n = n = lengths.size
        self.budget = config.max_num_batched_tokens
        self.cap = cap = config.chunk_cap
        self.page = page = config.chunk_alignment or 1
        self.step = step = full_step(cap, page)
        self.max_rows = config.max_num_seqs or n  # n rows: no limit, as an int
        self.max_partial = config.max_num_partial_prefills
        # Per new request: its first chunk with a whole cap allowed, its steady run after that
        # chunk if it leaves it part-way, and the first chunks' prefix sums (`first_ends[r]`
        # is the sum of those of the requests before r).
        first = chunk_sizes(computed, lengths, cap, page)
        steps, last = _steady_run(lengths - computed - first, cap, step)
        self.first: list[int] = first.tolist()
        self.first_steps: list[int] = steps.tolist()
        self.first_last: list[int] = last.tolist()
        self.first_ends: list[int] = np.concatenate(([0], np.cumsum(first))).tolist()
        # Whether a part-way chunk is admitted with every request part-way: then the rules
        # admit every request that gets a token (see the class docstring).
        self.admits_all = admits(1, 2, n, self.max_partial)
        # Request -> where its run starts in `runs`, in request order: a dict drops any
        # request in O(1) and popitem() takes the last.
        self.steady: dict[int, int] = {}
        # Per dispatch: what the last chunks of the steady requests due then add to a step
        # each, then those requests. (One plain dict: a defaultdict's default factory would
        # cost a call.)
        self.due_at: dict[int, list[int]] = {}
        self.tail: list[int] = []
        self.num_dispatches = 0
        # Runs, flattened: first, count, request, start, head, last; first, count, ...
        # (A list: extending an array("q") by a tuple costs more than converting at the end.)
        self.runs: list[int] = []

    # -- the dispatch loop ------------------------------------------------------------------

    def run(self) -> None:
        """Fill dispatches in order until every request has run.

        This is the hot loop: its work is per dispatch and per request, never per steady
        row. The state it touches on every dispatch is held in local variables; starting a
        request and the rarer paths (shrinking ``steady``, serving the tail) are methods.
        """
        lengths, position = self.lengths, self.position
        steady, due_at, tail = self.steady, self.due_at, self.tail
        budget, cap, page, step = self.budget, self.cap, self.page, self.step
        max_rows, max_partial, n = self.max_rows, self.max_partial, self.n
        first, first_ends, admits_all = self.first, self.first_ends, self.admits_all
        start_new = self._start_new
        d = 0  # the dispatch being filled
        new = 0  # the first request not started
        while steady or tail or new < n:
            # The work-conserving tail. (Checked in two steps: it takes every request but one
            # started, so the first is cheap and almost always false.)
            if new >= n - 1 and len(steady) + len(tail) + n - new == 1:
                d = self._serve_alone(d, new)
                break
            # Charge the steady requests: a step each, the last chunk for those due now.
            due = due_at.pop(d, _NOTHING_DUE)
            demand = step * len(steady) + due[0]
            rows = len(steady)
            if demand > budget or rows > max_rows:
                demand = self._shrink_steady(d, due, demand)
                rows = len(steady)
            left = budget - demand
            for r in due[1:]:  # their runs are written; they end here
                del steady[r]
            # The other started requests, in order.
            all_steady = True
            if tail:
                all_steady, left, rows = self._serve_tail(d, left, rows)
            # New requests, in order, while they are admitted. (`left > 0` only saves the
            # rules a call when the budget is spent: with no token left none is admitted.)
            # `partial` counts for `admits` only without `admits_all`, so batches, which need
            # it, leave it as it is.
            r = new
            partial = len(steady) + len(tail)
            while r < n and left > 0:
                limit = chunk_limit(cap, left, max_rows - rows)
                if limit == cap and admits_all:
                    # A batch: request q runs first[q] while a cap and a row are left.
                    stop = r + 1
                    if left - first[r] >= cap:  # more than one
                        stop = bisect_right(first_ends, first_ends[r] + left - cap, stop)
                        stop = min(stop, n, r + max_rows - rows)
                    left -= first_ends[stop] - first_ends[r]
                    rows += stop - r
                    for q in range(r, stop):
                        start_new(q, d, first[q], all_steady)
                    r = stop
                    continue
                start, length = position[r], lengths[r]
                remaining = length - start
                size = chunk_size(start, length, limit, page)
                if not admits(size, remaining, partial, max_partial):
                    break
                left -= size
                rows += 1
                if size < remaining:
                    partial += 1
                start_new(r, d, size, all_steady)
                r += 1
            new = r
            d += 1
        self.num_dispatches = d

    def _start_new(self, r: int, d: int, size: int, all_steady: bool) -> None:
        """Run the first chunk of new request ``r``, ``size`` tokens, in dispatch ``d``: its
        whole prefill, or a part-way chunk after which it joins ``steady`` when
        ``all_steady`` (every request before it is), else the tail."""
        start = self.position[r]
        remaining = self.lengths[r] - start
        if size == remaining:
            self.runs.extend((d, 1, r, start, size, size))
        elif all_steady:
            # (Its steady run after its first chunk with a whole cap is known in advance.)
            steps, last = (
                (self.first_steps[r], self.first_last[r])
                if size == self.first[r]
                else _steady_run(remaining - size, self.cap, self.step)
            )
            self._join_steady(r, d, start, size, steps, last)
        else:
            self.runs.extend((d, 1, r, start, size, size))
            self.position[r] = start + size
            self.tail.append(r)

    def _shrink_steady(self, d: int, due_now: list[int], demand: int) -> int:
        """Move steady requests from the end to the front of the tail until the rest fit
        in dispatch ``d``, whose ``due_at`` entry was ``due_now``; return the demand of the
        rest."""
        steady, step = self.steady, self.step
        while steady and (demand > self.budget or len(steady) > self.max_rows):
            r, at = steady.popitem()
            due, last = self._cut_run(r, at, d)
            # (An entry is [extra, request, ...]: remove the request, never the extra.)
            if due == d:
                del due_now[due_now.index(r, 1)]
                demand -= last  # its charge: its last chunk
            else:
                entry = self.due_at[due]
                del entry[entry.index(r, 1)]
                entry[0] -= last - step
                demand -= step  # its charge: a step
            self.tail.insert(0, r)
        return demand

    def _cut_run(self, r: int, at: int, d: int) -> tuple[int, int]:
        """End the run of ``r`` (recorded at ``runs[at]``) before dispatch ``d``: its head,
        then its steps up to dispatch ``d - 1``. Bring its position up to date and return the
        dispatch the run was due to end in and the last chunk it had then."""
        runs, step = self.runs, self.step
        first, count, _, start, head, last = runs[at : at + 6]
        cut = d - first
        runs[at + 1] = cut
        runs[at + 5] = step if cut > 1 else head
        self.position[r] = start + head + (cut - 1) * step
        return first + count - 1, last

    def _serve_alone(self, d: int, new: int) -> int:
        """Run the only unfinished request to its end from dispatch ``d``, one chunk per
        dispatch, under :func:`request_cap` for a request alone (it stays alone: offline,
        nothing arrives). ``new`` is the first request not started. Return the number of
        dispatches planned then."""
        if self.steady:
            r, at = self.steady.popitem()
            self._cut_run(r, at, d)
        elif self.tail:
            r = self.tail.pop()
        else:
            r = new
        limit = chunk_limit(request_cap(self.config, 1, 0, 0), self.budget, self.max_rows)
        position, length = self.position[r], self.lengths[r]
        while position < length:
            size = chunk_size(position, length, limit, self.page)
            self.runs.extend((d, 1, r, position, size, size))
            position += size
            d += 1
        return d

    def _serve_tail(self, d: int, left: int, rows: int) -> tuple[bool, int, int]:
        """Serve the tail in order in dispatch ``d``, promoting each request while all before
        it are steady; return whether all are, and the budget and rows left."""
        lengths, position = self.lengths, self.position
        all_steady = True
        tail: list[int] = []
        for r in self.tail:
            limit = chunk_limit(self.cap, left, self.max_rows - rows)
            size = chunk_size(position[r], lengths[r], limit, self.page)
            if size > 0:
                left -= size
                rows += 1
                after = lengths[r] - position[r] - size
                if after and all_steady:
                    steps, last = _steady_run(after, self.cap, self.step)
                    self._join_steady(r, d, position[r], size, steps, last)
                    continue
                self.runs.extend((d, 1, r, position[r], size, size))
                position[r] += size
                if not after:
                    continue
            tail.append(r)
            all_steady = False
        self.tail[:] = tail  # in place: run() holds the list
        return all_steady, left, rows

    # -- one request --------------------------------------------------------------------------

    def _join_steady(self, r: int, d: int, start: int, size: int, steps: int, last: int) -> None:
        """Run a non-final chunk of ``size`` tokens of ``r`` from ``start`` in dispatch ``d``
        and make ``r`` steady from the next dispatch on, recording its run from that chunk to
        its last: ``steps`` steps, then ``last`` tokens (its :func:`_steady_run`)."""
        runs = self.runs
        self.steady[r] = len(runs)
        runs.extend((d, steps + 2, r, start, size, last))
        entry = self.due_at.get(d + 1 + steps)
        if entry is None:
            self.due_at[d + 1 + steps] = [last - self.step, r]
        else:
            entry[0] += last - self.step
            entry.append(r)

    # -- output --------------------------------------------------------------------------------

    def rows(self, lengths: IntArray) -> Rows:
        """The rows in dispatch order and, within a dispatch, in request order.

        Runs are recorded in order of their first row: by dispatch, then by request. Two
        runs that share a dispatch are then in request order too (a request that starts a
        run while another runs steady comes after it in the window), so sorting the rows
        stably by dispatch puts each dispatch's rows in request order.
        """
        # (Every value stays below 2**31: positions, dispatches and row counts are int32.)
        runs = np.fromiter(self.runs, dtype=np.int32, count=len(self.runs)).reshape(-1, 6)
        first, counts, requests, starts, heads, lasts = runs.T
        step = self.step
        ends = np.cumsum(counts, dtype=np.int32)
        begins = ends - counts
        total = int(ends[-1])
        within = np.arange(total, dtype=np.int32) - np.repeat(begins, counts)
        # Runs of one row each are already in order (say, every prompt runs whole).
        order = (
            slice(None)
            if total == counts.size
            else _stable_argsort(np.repeat(first, counts) + within, self.num_dispatches)
        )
        # Past its head, a run advances by `step` per row.
        row_starts = np.repeat(starts + heads, counts) + (within - 1) * np.int32(step)
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


def _stable_argsort(keys: npt.NDArray[np.integer[Any]], bound: int) -> IntArray:
    """The indices that sort ``keys`` (ints in ``0 .. bound - 1``) stably.

    NumPy's stable sort is a radix sort for 16-bit keys and a merge sort, several times
    slower, for wider ones; so wider keys are sorted one 16-bit digit at a time, lowest
    first (a least-significant-digit radix sort).
    """
    if bound <= 1 << 16:
        return np.argsort(keys.astype(np.uint16), kind="stable")
    order = np.argsort((keys & 0xFFFF).astype(np.uint16), kind="stable")
    high, shift = (bound - 1) >> 16, 16
    while high:
        digit = ((keys[order] >> shift) & 0xFFFF).astype(np.uint16)
        order = order[np.argsort(digit, kind="stable")]
        high >>= 16
        shift += 16
    return order


def rows_kept_to_the_bound(
    lengths: IntArray, computed: IntArray, config: PlannerConfig, greedy: Rows
) -> Rows:
    """``packed``'s rows kept to the bound (``_policies.py``, *Keeping to the bound*), from
    its ``greedy`` rows: they stand up to the first dispatch to which the rule applies
    (:func:`bound_rule_applies`) and that does not surely keep to the bound
    (:func:`surely_keeps_to_the_bound`), and the rest is planned step by step, as
    :func:`plan_step` plans it, from the state before that dispatch."""
    offsets, requests, starts, sizes, final = greedy
    remaining = lengths - computed
    num = offsets.size - 1
    if num <= lower_bound(remaining, config):
        return greedy
    # Before each dispatch: the requests unfinished, the tokens left, and the most any
    # unfinished request had.
    finish_at = np.searchsorted(offsets, np.flatnonzero(final), side="right") - 1  # ascending
    finished = np.bincount(finish_at, minlength=num)
    count = lengths.size - np.concatenate(([0], np.cumsum(finished)[:-1]))
    applies = bound_rule_applies(config, count)
    if not applies.any():
        return greedy
    tokens = np.add.reduceat(sizes.astype(np.int64), offsets[:-1])
    left = int(remaining.sum()) - np.concatenate(([0], np.cumsum(tokens)[:-1]))
    finishing = np.zeros(num, dtype=np.int64)
    groups = np.flatnonzero(np.diff(finish_at, prepend=-1))
    finishing[finish_at[groups]] = np.maximum.reduceat(remaining[requests[final]], groups)
    longest = np.maximum.accumulate(finishing[::-1])[::-1]
    sure = ~applies | surely_keeps_to_the_bound(tokens, left, longest, count, config)
    if sure.all():
        return greedy
    first = int(np.argmin(sure))
    done = int(offsets[first])
    ran = np.bincount(requests[:done], weights=sizes[:done], minlength=lengths.size)
    position = computed + ran.astype(np.int64)  # float sums of ints below 2**53: exact
    started: list[RequestRecord] = []
    queued: list[RequestRecord] = []
    for r in np.flatnonzero(position < lengths).tolist():
        at = int(position[r])
        record = RequestRecord(r, int(lengths[r]), at, at > computed[r])
        (started if record.started else queued).append(record)
    state: PrefillState[int] = restore_prefill_state(
        tuple(started), tuple(queued), int(left[first]), "packed"
    )
    rows: list[tuple[int, int, int, bool]] = []
    ends = list(offsets[: first + 1].tolist())
    while len(state):
        plan = plan_step(state, config)
        rows.extend((r, c.start, c.length, c.is_final) for r, c in plan.rows.items())
        ends.append(done + len(rows))
        state = plan.state
    tail = np.array(rows, dtype=np.int64).reshape(-1, 4)
    return (
        np.array(ends, dtype=np.int64),
        np.concatenate((requests[:done], tail[:, 0].astype(np.int32))),
        np.concatenate((starts[:done], tail[:, 1].astype(np.int32))),
        np.concatenate((sizes[:done], tail[:, 2].astype(np.int32))),
        np.concatenate((final[:done], tail[:, 3].astype(np.bool_))),
    )
