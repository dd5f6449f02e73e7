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
4. With ``chunk_alignment`` set, every non-final chunk ends on a multiple of ``chunk_alignment``.
5. With ``max_num_partial_prefills`` set (``packed`` only), at most that many requests are
   started but unfinished after any dispatch.

Because ``chunk_alignment <= chunk_cap`` (checked by ``PlannerConfig``), from any position there is
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
* ``fewest_chunks`` (``_offline.py``, where it is applied): the fewest chunks any schedule of
  a batch holds; the offline planner refuses a batch whose schedule would hold more than
  ``MAX_CHUNKS`` (before building any).
* :func:`bound_rule_applies`, :func:`surely_keeps_to_the_bound`, :func:`deadline_minimums`,
  :func:`fill_sizes`: ``packed`` keeping to the bound (below).

Policy ``round_robin`` (the seed's behaviour)
---------------------------------------------
Effective budget ``E = min(max_num_batched_tokens, long_prefill_token_threshold)``.

* If the tokens still to run fit in ``E`` and the requests fit in ``max_num_seqs`` rows:
  one dispatch holding every request whole.
* Otherwise one request per dispatch, round-robin over the unfinished requests in request
  order. Each chunk is ``min(remaining, E)`` tokens; with ``chunk_alignment`` a non-final
  chunk's end is rounded down to a multiple of it (a page boundary). Equivalently: round
  ``k`` holds the ``k``-th chunk of every request that has one, and rounds run in order.

The seed's case, 16 prompts of 3,338 tokens with threshold 256, is 224 dispatches: each
request runs 13 chunks of 256 tokens and one of 10.

Policy ``packed`` (co-scheduled chunks)
---------------------------------------
Each dispatch is filled greedily with budget ``max_num_batched_tokens`` and ``max_num_seqs``
rows. A request may run up to ``chunk_cap`` tokens; a chunk limited by the budget left, by
the cap or by a page boundary is non-final. The dispatch is filled in this order:

1. Started requests, in request order. One that cannot run a single token here (only
   possible with ``chunk_alignment``) is skipped for this dispatch; the others still run.
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
workloads without ``chunk_alignment`` (the seed's case with budget 8192 and 16 rows takes 14).

*Keeping to the bound.* A dispatch planned with the whole budget and rows (and a page pool,
if any, that holds every request whole), where no limit can bind on the work left
(:func:`bound_rule_applies`: no ``chunk_alignment`` above 1, and no more requests than
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
(``_offline.rows_kept_to_the_bound``), so both make the same choices. ``docs/semantics.md`` has the
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
cannot run a token in the room left (only possible with ``chunk_alignment`` and reservations), the
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
  ``R - p`` of the ``R`` tokens of room (``p`` is ``chunk_alignment``, or 1 without pages); newer
  requests and arrivals never displace it. With the same config and room in every dispatch:

  - without ``chunk_alignment``, ``r`` runs in every dispatch until it finishes. (In the dispatch
    where ``r`` last ran, every older request ran a whole ``min(remaining, chunk_cap)``
    chunk and left room for ``r``; from then on each of them runs at most that.)
  - with ``chunk_alignment``, ``r`` is skipped at most ``T // min(M, R - p + 1)`` times, ``T``
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

The engines
-----------
The fast offline engines that apply these rules to a whole batch, and the handover from
them to the online planner where the bound needs it, are in ``_offline.py`` (its header
says how they are computed fast).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from typing import Any, overload

import numpy as np
import numpy.typing as npt

from ._config import PlannerConfig
from ._errors import InvalidInputError
from ._validate import as_count_array, read_only

__all__ = ["request_cap"]

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
    return InvalidInputError.about(
        "num_computed_tokens",
        "must be < the prompt length, leaving at least one token to prefill: "
        f"{where}{computed} for length {length}",
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
        raise InvalidInputError.about(
            "num_computed_tokens",
            f"must have one entry per prompt ({lengths.size}): {computed.size} entries",
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
    ``page`` within reach (1 without ``chunk_alignment``), which is 0 when no page boundary is in
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
    ``chunk_alignment`` above 1, no more requests than ``max_num_seqs`` rows or than
    ``max_num_partial_prefills``. Elementwise on arrays."""
    applies = np.greater(num_requests, 1)
    if config.policy != "packed" or (config.chunk_alignment or 1) > 1:
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
