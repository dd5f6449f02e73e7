"""Every scheduling rule of the planner, offline and online.

Theory of operation
===================

A *request* is one prompt of ``L`` tokens of which the first ``c`` (``0 <= c < L``) are
already in the KV cache (a prefix-cache hit); its prefill runs positions ``c .. L-1``. A
*chunk* is a contiguous run of those positions, ``start .. start+length-1``. A *dispatch* is
one device call: a list of chunks (rows) of distinct requests. A *schedule* is the list of
dispatches that runs every request's prefill exactly once. The final chunk of a request is the
only one whose logits are sampled.

The planner is used two ways. Offline, :func:`plan_prefill` plans a whole batch at once and
returns a :class:`~pypto_sched.Schedule`. Online, a server keeps a
:class:`~pypto_sched.PrefillState` and asks :func:`~pypto_sched.plan_step` for one dispatch at
a time, adding and removing requests between steps (``_online.py``). Both make every choice
through the rule functions of this module, so the same inputs give the same dispatches.

Invariants every schedule satisfies (``Schedule.validate`` checks them all):

1. Tiling: in dispatch order, each request's chunks are non-empty, contiguous, start at ``c``
   and end at ``L``; exactly one of them, the last, is final.
2. A dispatch holds at least one row, at most one row per request, at most
   ``config.effective_budget`` tokens and at most ``max_num_seqs`` rows.
3. Every chunk holds at most its request cap (:func:`request_cap`): ``config.chunk_cap``,
   ``min(max_num_batched_tokens, long_prefill_token_threshold)``, except that under ``packed``
   a request left alone -- the only one unfinished, in a dispatch without decodes -- may run
   the whole ``max_num_batched_tokens`` (the work-conserving tail).
4. With ``page_size`` set, every non-final chunk ends on a multiple of ``page_size``.
5. With ``max_num_partial_prefills`` set (``packed`` only), at most that many requests are
   started but unfinished after any dispatch.

Because ``page_size <= chunk_cap`` (checked by ``PlannerConfig``), from any position there is
a page boundary within one chunk's reach, so every policy makes progress in every dispatch.

The rules, one function each
----------------------------
* :func:`leaves_tokens_to_prefill`: a prefix-cache hit leaves at least one token to prefill
  (``0 <= c < L``); :func:`check_num_computed_tokens` applies it to a batch.
* :func:`chunk_size`: the tokens a request runs from ``start`` when ``limit`` are allowed: all
  that is left if it fits (the final chunk), else up to the last page boundary in reach.
  :func:`chunk_sizes` is the same rule over arrays; :func:`full_step` is what it gives from a
  page boundary when more than ``limit`` is left.
* :func:`request_cap`: the most one request may run in a dispatch: the chunk cap, or the whole
  budget in ``packed``'s work-conserving tail.
* :func:`chunk_limit`: what one request may run in a dispatch being filled: its request cap,
  the tokens left, and nothing once the rows are used up.
* :func:`page_room`: with a KV page pool, what a request's pages plus the free pages hold;
  it bounds a chunk like the budget left (admission by free pages).
* :func:`admits`: whether ``packed`` takes the next waiting request.
* :func:`preemption_victim`: which request gives its KV pages back when one cannot get a page.
* :func:`fits_one_dispatch`: ``round_robin``'s whole-batch rule.
* :func:`prefill_room`: the tokens and rows a step leaves for prefill after the caller's decode
  reservations.
* :func:`dispatch_bound`: the lower bound of the dispatches left.
* :func:`fewest_chunks`: the fewest chunks any schedule of a batch holds; the offline planner
  refuses a batch whose schedule would hold more than ``MAX_CHUNKS`` (before building any).
* :func:`bound_rule_applies`, :func:`surely_keeps_to_the_bound`, :func:`deadline_minimums`,
  :func:`fill_sizes`: ``packed`` keeping to the bound (below).

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
new ones are admitted in order, requests start in request order.

*The work-conserving tail.* The threshold exists so that a long prompt does not starve the
others of the budget. When one request is left -- nothing else started, nothing waiting, and
no decode in the dispatch -- there is nobody to starve, so its cap is the whole
``max_num_batched_tokens`` instead of ``chunk_cap`` (:func:`request_cap`; vLLM V1 drops its
threshold the same way). Without it, a long request that starts last runs alone in
``chunk_cap``-sized dispatches while the budget sits idle. ``Schedule.lower_bound`` accounts
for it: the longest request runs at most ``chunk_cap`` tokens a dispatch only while the second
longest is unfinished. The dispatch count is then close to the bound, and equal to it in most
workloads without ``page_size`` (the seed's case with budget 8192 and 16 rows takes 14).

*Keeping to the bound.* A dispatch planned with the whole budget and rows (and a page pool,
if any, that holds every request whole), where no limit can bind on the work left
(:func:`bound_rule_applies`: no ``page_size`` above 1, and no more requests than
``max_num_seqs`` or ``max_num_partial_prefills``), is the greedy fill only if what it leaves
has a bound at most one below the bound before it; otherwise every request first runs its
:func:`deadline_minimums` and the rest of the budget goes first come, first served
(:func:`fill_sizes`), if that keeps to the bound. A plan whose greedy fill meets the bound
is therefore exactly the greedy (vLLM's) plan; the others take fewer dispatches, and on
every batch of up to 4 small prompts the fewest of any schedule that starts requests in
order. (Where a limit can bind, the bound does not count it, and correcting by it took more
dispatches than the greedy fill on rare batches: there the greedy fill stands.) Offline, the
greedy rows stand up to the first dispatch to which the rule applies and that fails
:func:`surely_keeps_to_the_bound`, and the rest is stepped by ``plan_step``
(``_plan._rows_kept_to_the_bound``), so both make the same choices. ``docs/semantics.md`` has the
details.

Online: one step at a time
--------------------------
A server keeps a ``PrefillState``: the requests whose prefill is not finished, keyed by the
server's own hashable ids, each with its prompt length and the tokens computed so far
(prefix-cache hits plus the chunks already run). Before every device call it asks
``plan_step`` for the next dispatch; the answer holds the rows to run, keyed by request id,
and the state after them. States are immutable: ``add``, ``remove``, ``discard``,
``discard_all`` and ``plan_step`` return new states and leave the old one valid, so a
dispatch that fails can simply be planned again from the state before it, and
``state.apply(plan)`` applies a plan to a state that has gained or lost requests while the
dispatch ran.

A step's *room* is what the dispatch leaves for prefill once the caller has reserved room
for the decode tokens it runs in the same dispatch (decode first, as in Sarathi-Serve's
stall-free batching). Decode tokens count against ``max_num_batched_tokens`` under both
policies: ``round_robin``'s threshold bounds prefill, so it lowers the prefill room, not the
decodes a dispatch may carry. So the room is ``min(config.effective_budget,
max_num_batched_tokens - reserved_tokens)`` tokens and ``max_num_seqs - reserved_rows`` rows,
each clamped at 0: a reservation larger than the dispatch leaves no room (the planner does not
police the caller's decode batch). Without ``max_num_seqs`` rows are not limited, and
``reserved_rows`` takes nothing from prefill. A step with no room is an empty dispatch, not an
error. Chunk sizes, the chunk cap, page alignment and ``max_num_partial_prefills`` follow the
offline rules exactly; only the room differs.

``packed`` keeps the *started* requests (part-way through their prefill) in arrival order and
the *waiting* ones in a FIFO queue. A step serves the started requests first, in arrival
order, skipping one that cannot run a token in the room left; then it admits waiting requests
in arrival order, stopping at the first that cannot run a token or that would be left
part-way while ``max_num_partial_prefills`` requests already are. The work-conserving tail
applies to a step whose state holds one request and whose caller reserves nothing.

``round_robin`` keeps every request in one FIFO queue of turns. A step runs one chunk of the
request at the head of the queue, ``min(remaining, room)`` tokens (page-aligned if not final);
if it is unfinished it goes back to the tail. New requests join at the tail. If the head
cannot run a token in the room left (only possible with ``page_size`` and reservations), the
step is empty and the head keeps its turn. The whole-batch rule -- "if everything fits,
one dispatch of all" -- applies when a *run* begins: when no step has had to split since
the state was last empty (``state.policy is None``) and every request in the state fits the
room, in tokens and rows, the step runs them all, whole. Once a step has split, the state
round-robins one request per dispatch until it drains, even if what is left would fit: that
is what ``plan_prefill`` does with a batch.

With a KV page pool (``plan_step(pool=...)``, as the generation planner steps), every chunk is
also bounded by :func:`page_room`, what the request's pages plus the free pages hold, as the
budget left bounds it: ``packed`` admits only while pages last, ``round_robin`` runs the whole
batch at once only if the pool holds all of it, and when the head cannot get a page the first
request behind it that can run takes the dispatch while the head keeps its turn.

A plan applies to a newer state too (``state.apply(plan)``): the requests that arrived while
the dispatch ran are kept, and a request removed meanwhile stays removed. A request whose chunk
ran rejoins ``round_robin``'s queue behind those arrivals, as if queued when the dispatch ended.

Equivalence: with no arrivals, removals or reservations, stepping a state until it is empty
gives exactly the dispatches of ``plan_prefill`` for the same prompts, under both policies.

A run's policy is fixed: stepping a state that is part-way through a run with a config of the
other policy raises ``InvalidInputError``. The run ends, and any policy may start the next,
when the state drains.

Fairness
--------
Counted in dispatches that carry rows (an empty step moves no request ahead of another):

* ``round_robin``: a request waits at most ``k`` dispatches before its next chunk, where ``k``
  is the number of other requests in the state when it was queued (when it arrived or ran its
  last chunk). Requests that arrive later queue behind it and cannot delay it.
* ``packed``: a started request ``r`` yields only to started requests older than it. In a
  dispatch that skips it, those older requests fill every free row, or take more than
  ``R - p`` of the ``R`` tokens of room (``p`` is ``page_size``, or 1 without pages); newer
  requests and arrivals never displace it. With the same config and room in every dispatch:

  - without ``page_size``, ``r`` runs in every dispatch until it finishes. (In the dispatch
    where ``r`` last ran, every older request ran a whole ``min(remaining, chunk_cap)``
    chunk and left room for ``r``; from then on each of them runs at most that.)
  - with ``page_size``, ``r`` is skipped at most ``T // min(M, R - p + 1)`` times, ``T``
    being the tokens the older started requests had left when ``r`` started and ``M`` the
    rows of room. (A prefix hit can give an older request a short first chunk, and room left
    over may be less than a page.)

  Waiting requests are admitted strictly in arrival order.

  These bounds are for the greedy fill (every dispatch, with pages). A dispatch kept to
  the bound (below) gives every request its deadline minimum first, so there an older
  started request may run less than the greedy fill would give it, or nothing, while a
  younger one runs what it must: with budget 5 and threshold 2, a started 27-token prompt
  behind a 4-token one is skipped when prompts of 4 and 8 tokens arrive, since it can
  finish alone at the end. Arrival order of admission still holds.

Generation: decode rows, a bounded page pool, preemption
--------------------------------------------------------
``plan_generation_step`` (``_generation.py``, whose header has the details) plans a dispatch
of a generation with these rules: decode rows first, oldest request first (one final token
each, within the budget and the rows); then the prefill chunks of ``plan_step`` in the room
left, with admission by free pages (:func:`page_room`). A request that needs a page when none
is free takes one from the :func:`preemption_victim`: the youngest page holder younger than
it, else itself. The victim gives all its pages back and recomputes its prompt and generated
tokens later; in a step that preempts, no prefill runs beside the decodes. A step in which
nothing can run preempts the youngest holder.

Fairness of preemption (a request's *age* is its rank, ``_generation.py``: the requests
preempted once first, then the others, each by arrival; that makes every request preempted
at most once): a request is never preempted for a younger one, and the oldest
request holding pages is never preempted (if it held the only pages it could not be
short of one, since a request alone always fits the pool). So it runs to completion, the
next oldest then never yields, and no request waits forever. A request is preempted only
when an older request takes a page, so at most as many times as the requests older than it
take new pages.

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
from collections.abc import Hashable, Iterable, Sequence
from typing import Any, overload

import numpy as np
import numpy.typing as npt

from ._config import PlannerConfig
from ._errors import InvalidInputError
from ._validate import as_count_array, read_only

__all__ = ["plan_rows", "request_cap"]

IntArray = npt.NDArray[np.int64]


# -- the rules ------------------------------------------------------------------------------
# Each takes plain ints (or, where named, arrays of them), so that every planner -- offline,
# online and any to come -- calls the same function for the same decision.


@overload
def leaves_tokens_to_prefill(num_computed_tokens: int, prompt_length: int) -> bool: ...
@overload
def leaves_tokens_to_prefill(
    num_computed_tokens: IntArray, prompt_length: IntArray
) -> npt.NDArray[np.bool_]: ...
def leaves_tokens_to_prefill(num_computed_tokens: Any, prompt_length: Any) -> Any:
    """The prefix-cache rule: a request whose first ``c`` tokens are already in the KV cache
    (a count, ``c >= 0``) has at least one of its ``L`` to prefill: ``c < L``. Elementwise
    on arrays."""
    return num_computed_tokens < prompt_length


def computed_tokens_error(computed: int, length: int, *, where: str = "") -> InvalidInputError:
    """The error for ``computed`` tokens of a ``length``-token prompt that break
    :func:`leaves_tokens_to_prefill` (``where`` says which request)."""
    return InvalidInputError(
        "'num_computed_tokens' must be < the prompt length, leaving at least one token to "
        f"prefill: {where}{computed} for length {length}"
    )


def check_num_computed_tokens(values: object, lengths: IntArray) -> IntArray:
    """``num_computed_tokens`` for prompts of ``lengths``: ``None`` (no hits) or one count
    per prompt, each within :func:`leaves_tokens_to_prefill`.

    Returns them as a read-only int64 array; raises :class:`InvalidInputError` naming the
    rule and the first value that breaks it.
    """
    if values is None:
        return read_only(np.zeros_like(lengths))
    computed = as_count_array("num_computed_tokens", values, min_value=0, allow_empty=True)
    if computed.size != lengths.size:
        raise InvalidInputError(
            f"'num_computed_tokens' must have one entry per prompt ({lengths.size}): "
            f"{computed.size} entries"
        )
    full = ~leaves_tokens_to_prefill(computed, lengths)
    if full.any():
        index = int(np.flatnonzero(full)[0])
        raise computed_tokens_error(
            int(computed[index]), int(lengths[index]), where=f"item {index} is "
        )
    return computed


def chunk_size(start: int, length: int, limit: int, page: int) -> int:
    """The chunk rule every policy shares: the tokens a request at position ``start`` of a
    ``length``-token prompt runs when ``limit`` tokens are allowed (see :func:`chunk_limit`).
    All that is left when it fits (the final chunk); otherwise up to the last multiple of
    ``page`` within reach (1 without ``page_size``), which is 0 when no page boundary is in
    reach."""
    remaining = length - start
    if remaining <= limit:
        return remaining
    cut = (start + limit) // page * page - start
    return cut if cut > 0 else 0


def chunk_sizes(starts: IntArray, lengths: IntArray, limit: int, page: int) -> IntArray:
    """:func:`chunk_size` for many requests at once (same ``limit`` and ``page``)."""
    remaining = lengths - starts
    cut = np.maximum((starts + limit) // page * page - starts, 0)
    return np.where(remaining <= limit, remaining, cut)


def full_step(limit: int, page: int) -> int:
    """The chunk a request runs from a page boundary when more than ``limit`` tokens are
    left and ``limit`` are allowed: :func:`chunk_size` of that case, ``limit`` rounded down to
    a page multiple. A request that keeps getting ``limit`` runs chunks of this size until its
    last."""
    return chunk_size(0, limit + 1, limit, page)


def request_cap(
    config: PlannerConfig, num_unfinished: int, reserved_tokens: int, reserved_rows: int
) -> int:
    """The most tokens one request may run in a dispatch: ``config.chunk_cap``, except in
    ``packed``'s *work-conserving tail*: when ``num_unfinished``, the requests whose prefill
    is not finished as the dispatch is planned, is 1 and the caller reserves no tokens and no
    rows for decodes, nothing else can run beside that request, so it may use the whole
    ``max_num_batched_tokens`` (vLLM V1 drops the threshold the same way).

    ``round_robin`` keeps the seed's cap in every dispatch.
    """
    if (
        num_unfinished == 1
        and config.policy == "packed"
        and reserved_tokens == 0
        and reserved_rows == 0
    ):
        return config.max_num_batched_tokens
    return config.chunk_cap


def chunk_limit(cap: int, tokens_left: int, rows_left: int) -> int:
    """The most tokens one more row of a dispatch being filled may run: the per-request
    ``cap``, and no more than the ``tokens_left`` of the budget; nothing once no row is
    left."""
    if rows_left <= 0:
        return 0
    return cap if cap < tokens_left else tokens_left


def page_room(position: int, pages_held: int, pages_free: int, page_size: int) -> int:
    """Admission by free pages: the most tokens a request at ``position`` may run when it holds
    ``pages_held`` KV pages and ``pages_free`` are free. A chunk is planned only if the pages it
    needs can be had (vLLM V1 admits a request only when its slots can be allocated), so this
    bounds the tokens allowed like the budget left does (:func:`chunk_limit`)."""
    room = (pages_held + pages_free) * page_size - position
    return room if room > 0 else 0


def preemption_victim(
    requester: Hashable, requester_age: int, holders: Iterable[tuple[Hashable, int]]
) -> Hashable:
    """The request to preempt when ``requester`` (arrived ``requester_age``-th) needs a KV page
    and none is free: the youngest of the ``(request, age)`` page ``holders`` younger than it,
    else the requester itself. Never an older request: see *Fairness of preemption*."""
    victim, victim_age = requester, requester_age
    for holder, age in holders:
        if age > victim_age:
            victim, victim_age = holder, age
    return victim


def admits(size: int, remaining: int, num_partial: int, max_partial: int | None) -> bool:
    """``packed``'s admission rule: whether a waiting request with ``remaining`` tokens to
    prefill starts now with a chunk of ``size`` tokens (its :func:`chunk_size`), while
    ``num_partial`` requests are part-way through their prefill.

    It needs at least one token, and a chunk that leaves it part-way (``size < remaining``)
    needs a free place under ``max_partial`` (``None``: no limit). Admission is in order, so a
    request refused here holds back every request behind it.
    """
    if size <= 0:
        return False
    return size == remaining or max_partial is None or num_partial < max_partial


def dispatch_bound(total: int, first: int, second: int, count: int, config: PlannerConfig) -> int:
    """The fewest dispatches any schedule within ``config``'s limits could take for ``count``
    requests with ``total`` tokens to prefill, the two most left to one request being
    ``first >= second`` (``second`` is 0 for one request): :attr:`Schedule.lower_bound`.

    The largest of: the requests over ``max_num_seqs``; the tokens over what a dispatch holds
    (the budget, and each row at most the cap); the dispatches the longest request needs
    under its cap. Under ``packed`` only the longest request may run alone, with the whole
    budget, and it runs at most ``chunk_cap`` a dispatch while the second longest is
    unfinished.
    """
    cap, rows = config.chunk_cap, config.max_num_seqs
    shared, lone = _dispatch_holds(config)
    if lone == cap:
        tokens = -(-total // shared)
    else:  # only the longest may run alone, the others' tokens run shared
        tokens = -(-((total - first) * lone + first * shared) // (shared * lone))
    if count == 1:
        longest = -(-first // lone)
    elif lone == cap:
        longest = -(-first // cap)
    else:  # capped while the second longest is unfinished, alone after
        together = -(-second // cap)
        longest = together + -(-max(first - together * cap, 0) // lone)
    bound = tokens if tokens > longest else longest
    if rows is not None:
        bound = max(bound, -(-count // rows))
    return bound


def _dispatch_holds(config: PlannerConfig) -> tuple[int, int]:
    """The most tokens a dispatch holds while requests share it (the budget, and at most
    ``max_num_seqs`` rows of ``chunk_cap``), and the most a request alone runs."""
    budget, rows = config.max_num_batched_tokens, config.max_num_seqs
    shared = budget if rows is None else min(budget, rows * config.chunk_cap)
    return shared, request_cap(config, 1, 0, 0)


def bound_rule_applies(config: PlannerConfig, num_requests: Any) -> Any:
    """Whether a ``packed`` dispatch planned with the whole budget and rows (and a page
    pool, if any, that holds every request whole), ``num_requests`` requests being
    unfinished, is kept to the bound (see *Keeping to the bound* in the header): more than
    one request, and no limit that the bound does not count can bind on the work left -- no
    ``page_size`` above 1, no more requests than ``max_num_seqs`` rows or than
    ``max_num_partial_prefills``. Elementwise on arrays."""
    applies = np.greater(num_requests, 1)
    if config.policy != "packed" or (config.page_size or 1) > 1:
        return np.logical_and(applies, False)
    for limit in (config.max_num_seqs, config.max_num_partial_prefills):
        if limit is not None:
            applies = applies & (num_requests <= limit)
    return applies


def surely_keeps_to_the_bound(
    tokens_run: Any, total: Any, longest: Any, count: Any, config: PlannerConfig
) -> Any:
    """A quick sufficient test that a greedy dispatch keeps to the bound: it ran
    ``tokens_run``, all a dispatch holds while requests share it (the budget, or
    ``max_num_seqs`` rows of ``chunk_cap``), from ``count`` requests with ``total`` tokens
    left, none more than ``longest``; and with ``d = ceil(total / that)``, ``longest`` is at
    most ``(d - 1) * chunk_cap`` and ``count`` at most ``(d - 1) * max_num_seqs``.

    (The bound was at least ``d``; after such a dispatch every term of it is at most
    ``d - 1``. That needs a request alone to run no more than ``that`` either: where
    ``max_num_seqs`` rows of ``chunk_cap`` hold less than a lone request's whole budget, the
    bound's token term can be below ``d``, and the test is never sure.) Elementwise on
    arrays.
    """
    cap, rows = config.chunk_cap, config.max_num_seqs
    shared, lone = _dispatch_holds(config)
    after = -(-total // shared) - 1
    sure = (tokens_run >= shared) & (longest <= after * cap)
    if shared < lone:
        sure = np.logical_and(sure, False)
    return sure if rows is None else sure & (count <= after * rows)


def deadline_minimums(
    remaining: Sequence[int],
    num_started: int,
    others: tuple[int, int],
    dispatches: int,
    config: PlannerConfig,
) -> tuple[list[int] | None, bool]:
    """The fewest tokens each request must run in this dispatch so that all can finish in
    ``dispatches - 1`` more, ``dispatches`` being their bound; ``None`` if no dispatch that
    starts requests in order can do it (see *Keeping to the bound* in the header).

    ``remaining`` holds the tokens left to the requests in fill order, the ``num_started``
    started ones first; ``others`` the two most left to waiting requests behind them, if any
    (``(0, 0)``: none). Those are taken not to start in this dispatch: the second value
    returned says whether one of them would have to (list it in ``remaining`` to know).

    The longest request (the oldest of equals) is the one that may be left alone; for ``k``
    dispatches after this one it shares them, then runs with the whole budget, and every
    other request must be done within those ``k``. Of the two ``k`` that matter -- the
    fewest dispatches the second longest needs capped, and one fewer -- the one needing the
    fewest tokens now is taken (the larger on a tie); a waiting request before one that must
    start runs a token.
    """
    budget, cap = config.max_num_batched_tokens, config.chunk_cap
    after = dispatches - 1
    ahead = max(range(len(remaining)), key=lambda j: (remaining[j], -j))
    behind, behind_second = others
    if behind > remaining[ahead]:  # the longest waits behind
        longest, first = -1, behind
        second = max(remaining[ahead], behind_second)
        behind = behind_second  # the most left to another request behind
    else:
        longest, first = ahead, remaining[ahead]
        second = max(max((r for j, r in enumerate(remaining) if j != ahead), default=0), behind)
    best: list[int] | None = None
    best_total = 0
    blocked = False
    shared = min(-(-second // cap), after)
    for k in (shared, shared - 1):
        alone = first - k * cap - (after - k) * budget
        if k < 0:
            continue
        if behind > k * cap or (longest < 0 and alone > 0):
            blocked = True  # a request behind would have to start
            continue
        minimums = [r - k * cap if r > k * cap else 0 for r in remaining]
        if longest >= 0:
            minimums[longest] = alone if alone > 0 else 0
        if any(m > cap or m > r for m, r in zip(minimums, remaining, strict=True)):
            continue
        last = max((j for j in range(num_started, len(remaining)) if minimums[j]), default=0)
        for j in range(num_started, last):
            if not minimums[j]:
                minimums[j] = 1
        total = sum(minimums)
        if total <= budget and (best is None or total < best_total):
            best, best_total = minimums, total
    return best, blocked


def fill_sizes(
    positions: Sequence[int],
    lengths: Sequence[int],
    minimums: Sequence[int],
    num_started: int,
    cap: int,
    budget: int,
) -> list[int] | None:
    """The chunk of each request, in fill order (the ``num_started`` started ones first), at
    ``positions`` of prompts of ``lengths``, when each runs at least its minimum (at most
    what it has left) and the budget those leave goes first come, first served: each as
    much as :func:`chunk_size` allows it with ``min(cap, its minimum + the budget left)``;
    ``None`` if a minimum is above ``cap`` or they exceed the budget. As in the greedy fill,
    no waiting request runs after one that cannot. The rule applies without pages only
    (:func:`bound_rule_applies`). (All minimums zero: ``packed``'s greedy fill.)"""
    least = [
        max(0, min(minimum, length - start))
        for start, length, minimum in zip(positions, lengths, minimums, strict=True)
    ]
    free = budget - sum(least)
    if free < 0 or any(size > cap for size in least):
        return None
    sizes = least
    for j, (start, length) in enumerate(zip(positions, lengths, strict=True)):
        size = chunk_size(start, length, min(cap, sizes[j] + free), 1)
        if size > sizes[j]:
            free -= size - sizes[j]
            sizes[j] = size
        elif not sizes[j] and j >= num_started:  # admission stops here
            break
    return sizes


def fits_one_dispatch(
    num_tokens: int, num_requests: int, budget: int, max_rows: int | None
) -> bool:
    """``round_robin``'s whole-batch rule: requests holding ``num_tokens`` tokens to prefill
    run in one dispatch, each whole, when the tokens fit ``budget`` and the requests fit
    ``max_rows`` (``None``: no limit)."""
    return num_tokens <= budget and (max_rows is None or num_requests <= max_rows)


def prefill_room(
    config: PlannerConfig, reserved_tokens: int, reserved_rows: int
) -> tuple[int, int | None]:
    """The tokens and rows a dispatch leaves for prefill once the caller has reserved
    ``reserved_tokens`` and ``reserved_rows`` for its decode tokens (see the header).

    Decode tokens count against ``max_num_batched_tokens`` under both policies; prefill also
    stays within ``config.effective_budget``. A reservation above the dispatch leaves no room
    (0, not an error). The rows are ``None`` when ``max_num_seqs`` is not set: rows are not
    limited and ``reserved_rows`` takes nothing from prefill.
    """
    # (Conditional expressions, not min() and max(): this runs on every online step.)
    budget = config.effective_budget
    tokens = config.max_num_batched_tokens - reserved_tokens
    tokens = budget if budget < tokens else tokens if tokens > 0 else 0
    max_rows = config.max_num_seqs
    if max_rows is None:
        return tokens, None
    rows = max_rows - reserved_rows
    return tokens, rows if rows > 0 else 0


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
    under ``config``: no chunk is above the :func:`request_cap` of a request alone."""
    lone = request_cap(config, 1, 0, 0)
    return int((-(-remaining // lone)).sum())


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
    page = config.page_size or 1
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
        self.page = page = config.page_size or 1
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
