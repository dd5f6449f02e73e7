"""Generation planning: decode rows and prefill chunks in one dispatch, over a bounded KV pool.

Theory of operation
===================

A request of a generation has a prompt of ``P`` tokens and may generate up to ``N`` new ones.
Its *context* is every token known so far, prompt and generated: ``P + g`` after ``g`` tokens.
The last generated token is never written to the KV cache (nothing is sampled after it), so a
request holds at most ``P + N - 1`` tokens of KV: the pool must have the pages for that, for
every request alone (:meth:`GenerationState.add` raises ``InvalidConfigError`` naming the
request otherwise; a pool too small for one request would hang, not run).

A request is *prefilling* while its context is not all in the cache, and *decoding* once it
is and a token has been sampled from it. Each step (one dispatch) is planned in two parts:

1. **Decode rows first** (stall-free batching, as Sarathi-Serve and vLLM V1 run them):
   every decoding request, oldest first, gets a one-token row at position ``P + g - 1``
   (final: its logits give the next token), while ``max_num_batched_tokens`` and
   ``max_num_seqs`` last, in *rank* order (below). Its pages must grow to hold ``P + g``
   tokens. When they cannot, requests are *preempted by recomputation*: the
   :func:`preemption_victim` (the youngest-ranked page holder ranked after it, else
   itself) gives all its pages back and is queued again with its generated tokens
   appended to its prompt, so that its next prefill recomputes them: under ``packed`` at
   the front of the waiting queue, under ``round_robin`` (one queue of turns) at the back,
   so as not to take the turn it was preempted for.
2. **Prefill chunks** in the room left: :func:`~pypto_sched.plan_step` of the prefilling
   requests with the decode rows reserved and the pool, so that every prefill rule
   (policy, threshold, page alignment, partial-prefill limit) is the online planner's, and
   a chunk is planned only if the pages it needs are free (:func:`page_room`). In a step
   that preempted, no prefill runs beside the decodes (as in vLLM V1: the pages just freed
   are not handed straight back to a newcomer); a step that preempted every decode row it
   had runs prefill as any step does, in the policy's order (it would be empty otherwise).
   A preempted request *comes back* (its recomputation starts) only under the *promise*:
   the pages the requests never preempted hold now, plus every preempted page holder's
   largest context (``P + N - 1``), its own included, fit the pool. While they do not, it
   is left out of the plan and keeps its place in the queue.

A step with no row while requests remain means part-way prefills hold every page: the
youngest-ranked holder is preempted and the step planned again.

Rank, and the bound on preemptions
----------------------------------
The requests preempted once rank ahead of those never preempted; each group by arrival.
**Every request is preempted at most once**, so a run preempts at most as many times as it
has requests, under every policy (``round_robin`` preempted 9,158 times for 200 short
prompts in 5 pages before this rule: a request up to 140 times, as older requests took
its pages again and again). Why: the promise keeps the preempted page holders' largest
contexts within the pool at all times (a request joins them only by coming back, and they
only shrink otherwise). So when a preempted holder needs ``k`` pages and fewer are free,
requests never preempted hold the rest of its ``k``; they rank after it and are preempted
first, youngest first, and it is never its own victim. A never-preempted request's need
takes the pages of requests ranked after it (never preempted either) or its own. A step
in which nothing runs has a never-preempted holder for the same reason. The page holder
ranked first is never preempted and runs to its end; with at most one preemption each and
every step running a token, no request waits forever. (The promise also counts the pages
the never-preempted holders have now, so that a request that comes back does not take
them again at once: on the workload above, 130 preemptions under ``packed``, not 144.)

The rules themselves (:func:`page_room`, :func:`preemption_victim`) are stated once, in the
theory of operation of ``_policies.py`` ("Generation"), with ages read as ranks here; the
tests check the bound over whole runs.

With an unlimited pool and ``N = 1`` no request ever decodes and the prefill rows are
exactly those of :func:`~pypto_sched.plan_step` (and of :func:`~pypto_sched.plan_prefill`).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Generic, NamedTuple, TypeVar, cast

import attrs
import numpy as np

from ._config import PlannerConfig, check_config
from ._dispatch import DispatchArrays, rows_arrays
from ._errors import (
    DuplicateRequestError,
    InvalidConfigError,
    InvalidInputError,
    UnknownRequestError,
)
from ._online import (
    PrefillState,
    StepChunk,
    StepPlan,
    StepRows,
    plan_step,
    step_chunk,
)
from ._persistent import Frozen, PersistentMap
from ._policies import preemption_victim
from ._pool import PagePool, StepHolds, check_holds_alone
from ._validate import MAX_TOKENS, as_count_array, check_hashable, check_int

__all__ = [
    "GenerationRequest",
    "GenerationState",
    "GenerationStep",
    "decode_rows_first",
    "plan_generation_step",
]

RequestId = TypeVar("RequestId", bound=Hashable)
#: What :func:`decode_rows_first` offers rows to: whatever the caller names a request by.
Decoding = TypeVar("Decoding")


#: Added to a request's arrival to give its :attr:`_Sequence.rank` until it is preempted:
#: every request preempted once ranks ahead of every request never preempted.
_NEVER_PREEMPTED = 1 << 62


class _Sequence(NamedTuple):
    arrival: int
    prompt_length: int
    max_new_tokens: int
    num_generated: int
    #: Whether it has been preempted (it is never preempted again: see the module doc).
    preempted: bool

    @property
    def context(self) -> int:
        return self.prompt_length + self.num_generated

    @property
    def most_tokens(self) -> int:
        """The most tokens of KV it ever holds (its last token is never cached)."""
        return self.prompt_length + self.max_new_tokens - 1

    @property
    def rank(self) -> int:
        """Its place in the order of preemption, oldest (never preempted) first: the
        requests preempted once by arrival, then the others by arrival."""
        return self.arrival if self.preempted else self.arrival + _NEVER_PREEMPTED


@attrs.frozen(kw_only=True)
class GenerationRequest:
    """One request of a :class:`GenerationState`, as a server reads it."""

    prompt_length: int
    max_new_tokens: int
    #: Tokens generated so far.
    num_generated: int
    #: ``"prefilling"`` (waiting, part-way, or recomputing after a preemption) or
    #: ``"decoding"``.
    status: str


class GenerationState(Frozen, Generic[RequestId]):
    """The requests of a generation and the KV page pool they share, as an immutable value.

    Build one with :meth:`from_prompt_lengths` or by :meth:`add`-ing requests to
    ``GenerationState(num_pages=..., page_size=...)``; step it with
    :func:`plan_generation_step`.
    """

    __slots__ = ("_decoding", "_next_arrival", "_pool", "_prefill", "_sequences")

    _sequences: PersistentMap[RequestId, _Sequence]
    _prefill: PrefillState[RequestId]
    _decoding: tuple[tuple[int, RequestId], ...]  # (rank, id), oldest rank first
    _pool: PagePool[RequestId]
    _next_arrival: int

    def __init__(self, *, num_pages: int, page_size: int) -> None:
        pool: PagePool[RequestId] = PagePool(num_pages=num_pages, page_size=page_size)
        self._fill(
            sequences=PersistentMap(),
            prefill=PrefillState(),
            decoding=(),
            pool=pool,
            next_arrival=0,
        )

    @classmethod
    def from_prompt_lengths(
        cls,
        prompt_lengths: Sequence[int] | np.ndarray[Any, Any],
        *,
        max_new_tokens: int | Sequence[int] | np.ndarray[Any, Any],
        num_pages: int,
        page_size: int,
    ) -> GenerationState[int]:
        """A state of requests ``0 .. n-1`` arrived in that order; ``max_new_tokens`` is one
        int for all or one per request. It may be empty."""
        lengths = as_count_array("prompt_lengths", prompt_lengths, min_value=1, allow_empty=True)
        if isinstance(max_new_tokens, int | np.integer) and not isinstance(max_new_tokens, bool):
            new = check_int("max_new_tokens", max_new_tokens, min_value=1)
            news = np.full(lengths.size, new, dtype=np.int64)
        else:
            news = as_count_array("max_new_tokens", max_new_tokens, min_value=1, allow_empty=True)
            if news.size != lengths.size:
                raise InvalidInputError.about(
                    "max_new_tokens",
                    f"must have one entry per prompt ({lengths.size}): {news.size} entries",
                )
        state: GenerationState[int] = GenerationState(num_pages=num_pages, page_size=page_size)
        # The state add() after add() would build, built at once (a million requests take
        # seconds, not minutes). add()'s checks, for every request at once: the first
        # request to fail one is added, and add() raises its own error.
        contexts = lengths + news - 1
        pages = -(-contexts // state._pool.page_size)
        failing = np.flatnonzero((contexts > MAX_TOKENS) | (pages > state._pool.num_pages))
        if failing.size:
            first = int(failing[0])
            state.add(first, int(lengths[first]), max_new_tokens=int(news[first]))
            raise AssertionError(f"add() took request {first}, which fails its checks")
        sequences: PersistentMap[int, _Sequence] = PersistentMap()
        sequences = sequences.update(
            (r, _Sequence(r, length, new, 0, False))
            for r, (length, new) in enumerate(zip(lengths.tolist(), news.tolist(), strict=True))
        )
        return state._replace(
            sequences=sequences,
            prefill=PrefillState.from_prompt_lengths(lengths),
            next_arrival=lengths.size,
        )

    # -- changing -----------------------------------------------------------------------

    def add(
        self, request_id: RequestId, prompt_length: int, *, max_new_tokens: int
    ) -> GenerationState[RequestId]:
        """A state that also holds ``request_id``, arrived after every request here."""
        check_hashable(request_id)  # PrefillState.add's check, before the pool is consulted
        length = check_int("prompt_length", prompt_length, min_value=1)
        new = check_int("max_new_tokens", max_new_tokens, min_value=1)
        if length + new - 1 > MAX_TOKENS:
            raise InvalidInputError(
                f"prompt_length + max_new_tokens - 1 must be <= {MAX_TOKENS}: {length + new - 1}"
            )
        check_holds_alone(
            self._pool,
            request_id,
            length + new - 1,
            name="num_pages",
            what=f"a prompt of {length} and {new} new tokens, the last never cached",
            error=InvalidConfigError,
        )
        if request_id in self:
            raise DuplicateRequestError.about(
                "request_id", f"must not be in the state already: {request_id!r} is"
            )
        sequence = _Sequence(self._next_arrival, length, new, 0, False)
        return self._replace(
            sequences=self._sequences.set(request_id, sequence),
            prefill=self._prefill.add(request_id, length),
            next_arrival=self._next_arrival + 1,
        )

    def finish(self, request_id: RequestId) -> GenerationState[RequestId]:
        """A state without ``request_id`` (a stop token, or an abort): its pages are free.

        Raises :class:`UnknownRequestError` if it is not here (never added, or already
        finished: a request that reaches ``max_new_tokens`` leaves by itself).
        """
        sequence = self._sequence(request_id)
        return self._without(request_id, sequence)

    def _without(self, request_id: RequestId, sequence: _Sequence) -> GenerationState[RequestId]:
        return self._replace(
            sequences=self._sequences.delete(request_id),
            prefill=self._prefill.discard(request_id),
            decoding=_remove(self._decoding, sequence.rank, request_id),
            pool=self._pool.release(request_id),
        )

    # -- reading ------------------------------------------------------------------------

    @property
    def pool(self) -> PagePool[RequestId]:
        """The KV pages and who owns them."""
        return self._pool

    def __len__(self) -> int:
        return len(self._sequences)

    def __bool__(self) -> bool:
        return len(self._sequences) > 0

    def __contains__(self, request_id: object) -> bool:
        try:
            return self._sequences.get(request_id) is not None  # type: ignore[arg-type]
        except TypeError:
            return False

    def __getitem__(self, request_id: RequestId) -> GenerationRequest:
        sequence = self._sequence(request_id)
        decoding = _index(self._decoding, sequence.rank, request_id) is not None
        return GenerationRequest(
            prompt_length=sequence.prompt_length,
            max_new_tokens=sequence.max_new_tokens,
            num_generated=sequence.num_generated,
            status="decoding" if decoding else "prefilling",
        )

    def __iter__(self) -> Iterator[RequestId]:
        """The request ids, in arrival order."""
        return (request_id for request_id, _ in self._in_arrival_order())

    @property
    def num_decoding(self) -> int:
        return len(self._decoding)

    def _sequence(self, request_id: RequestId) -> _Sequence:
        try:
            sequence = self._sequences.get(request_id)
        except TypeError:
            sequence = None
        if sequence is None:
            raise UnknownRequestError.about(
                "request_id",
                f"must be a request of the state: {request_id!r} is not (never added, or finished)",
            )
        return sequence

    def _in_arrival_order(self) -> list[tuple[RequestId, _Sequence]]:
        return sorted(self._sequences.items(), key=lambda pair: pair[1].arrival)

    def __eq__(self, other: object) -> bool:
        """Equal when the same requests arrived in the same order, with the same progress
        (prompt, tokens generated, prefill position, decoding or not) and the same pool;
        the arrival counters themselves may differ."""
        if not isinstance(other, GenerationState):
            return NotImplemented
        if (len(self), self.num_decoding) != (len(other), other.num_decoding):
            return False
        mine = [(rid, seq[1:]) for rid, seq in self._in_arrival_order()]
        theirs = [(rid, seq[1:]) for rid, seq in other._in_arrival_order()]
        return (
            mine == theirs
            and [rid for _, rid in self._decoding] == [rid for _, rid in other._decoding]
            and self._prefill == other._prefill
            and self._pool == other._pool
        )

    __hash__ = None  # type: ignore[assignment]  # equal by content, which is not cheap to hash

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        # The default would restore the slots with setattr, which an immutable state refuses;
        # the map is rebuilt from its items (its layout follows hashes, which are per process).
        return _restore_state, (
            [(rid, tuple(seq)) for rid, seq in self._sequences.items()],
            self._prefill,
            self._decoding,
            self._pool,
            self._next_arrival,
        )

    def __repr__(self) -> str:
        return (
            f"GenerationState({len(self)} requests, {self.num_decoding} decoding, {self._pool!r})"
        )


def _restore_state(
    sequences: list[tuple[Any, tuple[int, int, int, int, bool]]],
    prefill: PrefillState[Any],
    decoding: tuple[tuple[int, Any], ...],
    pool: PagePool[Any],
    next_arrival: int,
) -> GenerationState[Any]:
    restored: PersistentMap[Any, _Sequence] = PersistentMap()
    restored = restored.update((rid, _Sequence(*fields)) for rid, fields in sequences)
    return GenerationState._build(
        sequences=restored,
        prefill=prefill,
        decoding=decoding,
        pool=pool,
        next_arrival=next_arrival,
    )


def _index(decoding: tuple[tuple[int, Any], ...], rank: int, request_id: object) -> int | None:
    i = bisect.bisect_left(decoding, rank, key=lambda pair: pair[0])
    if i < len(decoding) and decoding[i][0] == rank:
        return i
    return None


def _remove(
    decoding: tuple[tuple[int, RequestId], ...], rank: int, request_id: RequestId
) -> tuple[tuple[int, RequestId], ...]:
    i = _index(decoding, rank, request_id)
    return decoding if i is None else decoding[:i] + decoding[i + 1 :]


@attrs.frozen(kw_only=True)
class GenerationStep(Generic[RequestId]):
    """One planned dispatch of a generation, and the state once it has run."""

    #: Each request's row, decode rows first (oldest first), then prefill chunks. A decode
    #: row is a final one-token chunk at position ``context - 1``.
    rows: Mapping[RequestId, StepChunk]
    #: How many of ``rows`` (the first ones) are decode rows.
    num_decode_rows: int
    #: Requests preempted by this step (they hold no pages and will recompute).
    preempted: tuple[RequestId, ...]
    #: Requests whose final row here gives their last token (``max_new_tokens``): they
    #: have left ``state``.
    finished: tuple[RequestId, ...]
    #: The pool as the dispatch uses it: every row's pages held.
    pool: PagePool[RequestId]
    #: The state once the dispatch has run and each final row has given one token.
    state: GenerationState[RequestId]

    @property
    def num_rows(self) -> int:
        return len(self.rows)

    @property
    def num_tokens(self) -> int:
        return sum(chunk.length for chunk in self.rows.values())

    @property
    def is_mixed(self) -> bool:
        """Whether decode rows and prefill chunks share the dispatch."""
        return 0 < self.num_decode_rows < len(self.rows)

    @property
    def sampled(self) -> tuple[RequestId, ...]:
        """The requests that get a token from this dispatch (its final rows), in row order."""
        return tuple(rid for rid, chunk in self.rows.items() if chunk.is_final)

    def arrays(self, *, index: int = 0) -> DispatchArrays:
        """The dispatch's kernel arrays; row ``i``'s ``requests`` entry is ``i``."""
        return rows_arrays(self.rows, self.pool, index=index)


def decode_rows_first(
    requests: Iterable[Decoding],
    config: PlannerConfig,
    *,
    take_row: Callable[[Decoding, int], int],
) -> tuple[int, int]:
    """The decode-first rule (step 1 of the module doc): a dispatch's decode rows come
    before its prefill chunks, and the decoding ``requests``, in the order given (oldest
    first), are offered a row each while the dispatch has a token and a row left under
    ``config``'s ``max_num_batched_tokens`` and ``max_num_seqs``.

    ``take_row(request, tokens_left)`` is the caller's: it puts the request's row into the
    dispatch if it can (its pages, a server's own checks) and returns the tokens the row
    takes, from 1 (a decode token) to ``tokens_left``, or 0 when the request takes no row.
    Returns the tokens and the rows the decode rows took: the prefill chunks are planned in
    the room they left (``plan_step(..., reserved_tokens=tokens, reserved_rows=rows)``).
    :func:`plan_generation_step` and the transformers integration build their decode rows
    with it.
    """
    check_config(config)
    tokens_left = config.max_num_batched_tokens
    rows_left = config.max_num_seqs or MAX_TOKENS
    for request in requests:
        if tokens_left == 0 or rows_left == 0:
            break
        taken = take_row(request, tokens_left)
        if taken:
            if (
                isinstance(taken, bool)
                or not isinstance(taken, int)
                or not 0 < taken <= tokens_left
            ):
                raise InvalidInputError.about(
                    "take_row", f"must return an int in [0, {tokens_left}]: {taken!r}"
                )
            tokens_left -= taken
            rows_left -= 1
    rows = (config.max_num_seqs or MAX_TOKENS) - rows_left
    return config.max_num_batched_tokens - tokens_left, rows


def plan_generation_step(
    state: GenerationState[RequestId], config: PlannerConfig
) -> GenerationStep[RequestId]:
    """Plan the next dispatch of a generation: decode rows, then prefill chunks, as the
    module docstring states. ``state`` must not be empty."""
    if not isinstance(state, GenerationState):
        raise InvalidInputError.about("state", f"must be a GenerationState: {type(state).__name__}")
    check_config(config)
    if not state:
        raise InvalidInputError.about("state", "must hold a request to plan a step: it is empty")
    planner = _GenerationStep(state, config)
    while True:
        step = planner.plan()
        if step is not None:
            return step
        planner.preempt_youngest_holder()


class _GenerationStep(Generic[RequestId]):
    """One step being planned; ``plan`` returns ``None`` when nothing could run."""

    def __init__(self, state: GenerationState[RequestId], config: PlannerConfig) -> None:
        self.config = config
        self.sequences = state._sequences
        self.prefill = state._prefill
        self.decoding = state._decoding
        self.pool = state._pool
        self.next_arrival = state._next_arrival
        self.preempted: list[RequestId] = []
        # The ranks the requests preempted in this step had (their decode entries and
        # holder entries carry them).
        self.preempted_ranks: set[int] = set()
        # The page holders by rank, youngest last, made at the first preemption; a holder
        # preempted since is dropped from the end when it is reached.
        self.holders: list[tuple[int, RequestId]] | None = None

    def plan(self) -> GenerationStep[RequestId] | None:
        rows: dict[RequestId, StepChunk] = {}
        # The decode rows' holds are made at once, as plan_step makes its rows' (one new pool
        # a step, not one a row); a preemption first makes those noted so far.
        holds = StepHolds(self.pool)

        def decode_row(entry: tuple[int, RequestId], tokens_left: int) -> int:
            nonlocal holds
            rank, request_id = entry
            if rank in self.preempted_ranks:
                return 0  # preempted in this step, for a request ranked ahead of it
            context = self._sequence(request_id).context
            while not holds.can_hold(request_id, context):
                self.pool = holds.pool()
                victim = self.preempt_for(rank, request_id)
                holds = StepHolds(self.pool)
                if victim == request_id:
                    return 0
            holds.hold(request_id, context)
            rows[request_id] = step_chunk(context - 1, 1, True)
            return 1

        decode_rows_first(self.decoding, self.config, take_row=decode_row)
        self.pool = holds.pool()
        num_decode = len(rows)
        prefill_after = self.prefill
        if not (self.preempted and rows):
            plan, prefill_after = self.plan_prefill(num_decode)
            rows.update(plan.rows)
            assert plan.pool is not None
            self.pool = plan.pool
        if not rows:
            return None
        return self.finish(rows, num_decode, prefill_after)

    def plan_prefill(self, num_decode: int) -> tuple[StepPlan[RequestId], PrefillState[RequestId]]:
        """The prefill chunks in the room the decode rows left, and the prefill state after
        them: :func:`~pypto_sched.plan_step`'s, without the preempted requests whose
        return the pool cannot promise (:meth:`over_promise`), which keep their places."""
        left_out: set[RequestId] = set()
        while True:
            state = self.prefill.discard_all(left_out) if left_out else self.prefill
            plan = plan_step(
                state,
                self.config,
                reserved_tokens=num_decode,
                reserved_rows=num_decode,
                pool=self.pool,
            )
            refused = self.over_promise(plan)
            if refused is None:
                return plan, (self.prefill.apply(plan) if left_out else plan.state)
            left_out.add(refused)

    def over_promise(self, plan: StepPlan[RequestId]) -> RequestId | None:
        """The first preempted request ``plan`` starts again beyond the promise (the pages
        of the holders never preempted and the largest contexts of the preempted ones fit
        the pool: see the module doc), or ``None``."""
        promised: int | None = None
        for request_id, chunk in plan.rows.items():
            if chunk.start > 0:
                continue  # holding its pages (promised already, if it was preempted)
            sequence = self._sequence(request_id)
            if not sequence.preempted:
                continue
            if promised is None:
                promised = sum(map(self.promised_pages, self.pool.owners()))
            promised += self.pool.pages_for(sequence.most_tokens)
            if promised > self.pool.num_pages:
                return request_id
        return None

    def promised_pages(self, holder: RequestId) -> int:
        """The pages the promise counts for ``holder``: its largest context's if it was
        preempted, else those it holds."""
        sequence = self._sequence(holder)
        if sequence.preempted:
            return self.pool.pages_for(sequence.most_tokens)
        return self.pool.capacity(holder) // self.pool.page_size

    def _sequence(self, request_id: RequestId) -> _Sequence:
        sequence = self.sequences.get(request_id)
        assert sequence is not None
        return sequence

    def preempt_for(self, rank: int, request_id: RequestId) -> RequestId:
        """Preempt :func:`preemption_victim` for ``request_id``; return the victim.

        The youngest holder ranked after the requester is the youngest holder, if it ranks
        after it: the rule is asked about that one alone, so that a step with many
        preemptions costs one sort of the holders, not a walk over them for each.
        """
        youngest = self._youngest_holder()
        victim = cast(RequestId, preemption_victim(request_id, rank, youngest))
        self.preempt(victim)
        return victim

    def _youngest_holder(self) -> list[tuple[RequestId, int]]:
        """``[(request, rank)]`` of the youngest page holder (``[]`` if none)."""
        holders = self.holders
        if holders is None:
            holders = self.holders = sorted((self._sequence(h).rank, h) for h in self.pool.owners())
        # The holders only shrink while a step is planned: decode rows hold pages already,
        # and prefill runs after the preemptions.
        while holders and holders[-1][0] in self.preempted_ranks:
            holders.pop()
        return [(holders[-1][1], holders[-1][0])] if holders else []

    def preempt_youngest_holder(self) -> None:
        """Nothing could run: preempt the youngest page holder (never the oldest, which
        would have run)."""
        holders = [(h, self._sequence(h).rank) for h in self.pool.owners()]
        if not holders:
            raise AssertionError("unreachable: a request alone always fits the pool")
        oldest, rank = min(holders, key=lambda pair: pair[1])
        self.preempt(cast(RequestId, preemption_victim(oldest, rank, holders)))

    def preempt(self, victim: RequestId) -> None:
        sequence = self._sequence(victim)
        self.pool = self.pool.release(victim)
        # (Its decode entry is dropped when the step is finished, with the others'.)
        # Under ``packed`` the waiting queue is behind every started request, so the victim
        # goes to its front; ``round_robin`` has one queue of turns, and a victim at its front
        # would take the turn of the request it was preempted for.
        self.prefill = self.prefill.discard(victim).add(
            victim, sequence.context, at_front=self.config.policy == "packed"
        )
        self.sequences = self.sequences.set(victim, sequence._replace(preempted=True))
        self.preempted.append(victim)
        self.preempted_ranks.add(sequence.rank)

    def finish(
        self,
        rows: dict[RequestId, StepChunk],
        num_decode: int,
        prefill_after: PrefillState[RequestId],
    ) -> GenerationStep[RequestId]:
        sequences, decoding, pool = self.sequences, self.decoding, self.pool
        finished: list[RequestId] = []
        gone: set[int] = set()  # ranks of the decoding requests that finish
        grown: list[tuple[RequestId, _Sequence]] = []
        started: list[tuple[int, RequestId]] = []  # requests whose prefill ends here
        for row, (request_id, chunk) in enumerate(rows.items()):
            if not chunk.is_final:
                continue
            sequence = self._sequence(request_id)
            is_decode = row < num_decode  # (the decode rows come first)
            if sequence.num_generated + 1 == sequence.max_new_tokens:
                finished.append(request_id)
                sequences = sequences.delete(request_id)
                pool = pool.release(request_id)
                if is_decode:
                    gone.add(sequence.rank)
                continue
            grown.append((request_id, sequence._replace(num_generated=sequence.num_generated + 1)))
            if not is_decode:
                started.append((sequence.rank, request_id))
        sequences = sequences.update(grown)  # (one pass over the map, not one per row)
        gone |= self.preempted_ranks
        if gone:
            decoding = tuple(pair for pair in decoding if pair[0] not in gone)
        if started:  # by rank: ranks are unique
            decoding = tuple(sorted((*decoding, *started), key=lambda pair: pair[0]))
        after: GenerationState[RequestId] = GenerationState._build(
            sequences=sequences,
            prefill=prefill_after,
            decoding=decoding,
            pool=pool,
            next_arrival=self.next_arrival,
        )
        return GenerationStep(
            rows=StepRows(rows),
            num_decode_rows=num_decode,
            preempted=tuple(self.preempted),
            finished=tuple(finished),
            pool=self.pool,
            state=after,
        )
