"""Planning prefill one step at a time, for a server whose requests come and go.

The rules -- what a step's room is, how each policy chooses its rows, the equivalence with
``plan_prefill`` and the fairness bounds -- are stated once, with the offline planner's, in
the theory of operation of ``_policies.py`` ("Online: one step at a time" and "Fairness"),
and every choice here is made by a rule function of that module. This module holds the
state a server keeps between steps and how stepping it stays cheap.

How a step stays cheap
----------------------
A step touches only the started requests, the requests it takes from the head of the queue
and the few it puts back; the new state shares everything else with the old one
(``_persistent.py``). The queue is a persistent FIFO of two linked lists. The only work that
grows with the number of waiting requests is turning its back list into its front, done by
the step that takes the last request of the front, and kept in the state it returns: O(1)
amortized per request, and a step that takes no one from the queue never does it. The
requests in the queue are also in a persistent map from id to record, which makes ``add``,
``remove`` and ``in`` cost ``O(log32 n)`` (plus a scan of ``packed``'s started requests,
which live in a small tuple that each step rewrites). A removed request's queue entry is left
in place and skipped when it reaches the head: an entry is live only while the map holds that
very record (the queue counts its entries: while it holds no more than the map holds records,
none is dead, and a step takes its head without a lookup); ``apply`` drops the entries of the
requests it admitted off the queue's head, as a step's admissions pop them, so a server that
applies every plan to a newer state does not walk them again at each step. ``discard_all``
deletes a few requests from the map and makes the queue's summary of its two longest live
once; dropping many, it rebuilds the state of the others in one pass.

With a page pool, a step reads each row's block table from the owners' map (one dict while
it is small), notes the pages the row lacks, and makes every hold at once: each request's
pages are taken straight from the runs of freed pages, the owners' dict is copied once and
one new pool is built (``PagePool._grown``). ``round_robin``'s search for a request that can
run behind a head waiting for pages asks the pool's owners first when no page is free
(nobody else can run then), so a step stuck for pages does not walk the queue.

What is left is the interpreter's work, kept small: both policies size a row by
``_StepSizing.size`` (the rule functions) and add it by ``_run``; rows, records,
states, pools and plans are built through their slots (in a third of the time attrs'
``__init__`` takes). In the steady state of a long prefill (the started requests run a
chunk each and fill the budget again) a step touches only them, never the queue or the map.
``benchmarks/bench_online.py`` and ``benchmarks/bench_vs_vllm.py`` measure all of this.

What still grows with the requests (docs/serving.md, "Cost"): keeping to the bound reads up to
``budget + 1`` waiting requests, and with a pool checks that it holds every request
(:func:`_pool_holds_everything`); removing one of the two longest waiting requests rebuilds the
queue's summary, unless it is the oldest (:func:`_without_best`); ``add``, ``remove`` and
``in`` scan the started requests.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Generic, NamedTuple, NoReturn, TypeVar

import attrs
import numpy as np
import numpy.typing as npt

from ._config import PlannerConfig, Policy, check_config
from ._dispatch import DispatchArrays, rows_arrays
from ._errors import (
    CacheTooSmallError,
    DuplicateRequestError,
    InvalidInputError,
    UnknownRequestError,
)
from ._persistent import Frozen, PersistentMap, PersistentQueue
from ._policies import (
    admits,
    bound_rule_applies,
    check_num_computed_tokens,
    chunk_limit,
    chunk_size,
    computed_tokens_error,
    deadline_minimums,
    dispatch_bound,
    fill_sizes,
    fits_one_dispatch,
    leaves_tokens_to_prefill,
    prefill_room,
    request_cap,
    surely_keeps_to_the_bound,
)
from ._pool import PagePool, StepHolds, check_holds_alone
from ._validate import (
    MAX_TOKENS,
    as_count_array,
    check_bool,
    check_chunk_end,
    check_hashable,
    check_ids,
    check_int,
    chunk_is_final,
    chunk_length,
    chunk_start,
)

__all__ = ["PrefillRequest", "PrefillState", "StepChunk", "StepPlan", "plan_step"]

RequestId = TypeVar("RequestId", bound=Hashable)


class RequestRecord(NamedTuple):
    """One request's progress. Records are never changed; progress makes a new one."""

    id: Any
    prompt_length: int
    #: Tokens computed so far: prefix-cache hits plus the chunks already run.
    position: int
    #: Whether it has run a chunk.
    started: bool


def _prompt_length(value: object) -> int:
    return check_int("prompt_length", value, min_value=1)


def _computed(value: object) -> int:
    return check_int("num_computed_tokens", value, min_value=0)


def _is_started(value: object) -> bool:
    return check_bool("is_started", value)


def _check_progress(request: PrefillRequest, _field: object, computed: int) -> None:
    if computed >= request.prompt_length:
        raise InvalidInputError.about(
            "num_computed_tokens",
            f"must be below 'prompt_length' ({request.prompt_length}), "
            f"as a request with tokens left to prefill has: {computed}",
        )


@attrs.frozen(kw_only=True)
class PrefillRequest:
    """A request's prefill progress, as ``state[request_id]`` reports it (checked when
    built: ``0 <= num_computed_tokens < prompt_length``, ``is_started`` a bool)."""

    prompt_length: int = attrs.field(converter=_prompt_length)
    #: Tokens already in the KV cache: prefix-cache hits plus the chunks already run.
    num_computed_tokens: int = attrs.field(converter=_computed, validator=_check_progress)
    #: Whether it has run a chunk (a prefix-cache hit alone does not start it).
    is_started: bool = attrs.field(converter=_is_started)

    @property
    def num_remaining_tokens(self) -> int:
        return self.prompt_length - self.num_computed_tokens


@attrs.frozen(kw_only=True)
class StepChunk:
    """One row of a planned step: positions ``start:start + length`` of a request's prompt
    (checked as :class:`~pypto_sched.Chunk`'s: ``start`` at least 0, ``length`` at least 1,
    ``start + length`` at most ``2**31 - 1``, ``is_final`` a bool)."""

    start: int = attrs.field(converter=chunk_start)
    length: int = attrs.field(converter=chunk_length)
    #: Whether it is the request's final chunk (the only one whose logits are sampled).
    is_final: bool = attrs.field(converter=chunk_is_final)

    def __attrs_post_init__(self) -> None:
        check_chunk_end(self.start, self.length)

    @property
    def end(self) -> int:
        """One past the chunk's last position; the request's context length after it."""
        return self.start + self.length


# Every step builds a StepChunk per row. attrs' __init__ sets a frozen class's slots through
# object.__setattr__ by name; setting them through their slot descriptors builds the same
# value in about a third of the time. It skips the fields' checks, which the planner's own
# values pass by construction (tests/test_online.py checks that the two build equal values).
_new = object.__new__
_set_start = StepChunk.__dict__["start"].__set__
_set_length = StepChunk.__dict__["length"].__set__
_set_is_final = StepChunk.__dict__["is_final"].__set__


def step_chunk(start: int, length: int, is_final: bool) -> StepChunk:
    """``StepChunk(start=start, length=length, is_final=is_final)``, built faster."""
    chunk: StepChunk = _new(StepChunk)
    _set_start(chunk, start)
    _set_length(chunk, length)
    _set_is_final(chunk, is_final)
    return chunk


class PrefillState(Frozen, Mapping[RequestId, PrefillRequest], Generic[RequestId]):
    """The requests whose prefill is not finished, keyed by the server's request ids.

    ``PrefillState()`` is empty. A state is an immutable mapping from request id to
    :class:`PrefillRequest`, iterated in the order the planner considers the requests
    (``packed``'s started requests, then the queue). Two states are equal when they hold the
    same requests with the same progress, in the same order, in the same run; like other
    mappings, states are not hashable.
    """

    __slots__ = ("_num_tokens", "_policy", "_queue", "_requests", "_started")

    #: Every request in the queue, by id. An entry of the queue is live only while this
    #: map holds that very record.
    _requests: PersistentMap[RequestId, RequestRecord]
    #: Waiting requests (and under ``round_robin`` every request) in turn order, ranked by
    #: the tokens they have left (``packed`` keeps to the bound with the two most).
    _queue: PersistentQueue[RequestRecord]
    #: ``packed``: the started, unfinished requests in arrival order (not in the queue).
    _started: tuple[RequestRecord, ...]
    #: Tokens still to prefill, over every request.
    _num_tokens: int
    #: The policy of the run in progress (see :attr:`policy`).
    _policy: Policy | None

    def __init__(self: PrefillState[Any]) -> None:
        # `self: PrefillState[Any]` types a bare `PrefillState()` as taking any ids; annotate
        # the variable (`state: PrefillState[str] = PrefillState()`) to narrow them.
        self._fill(requests=PersistentMap(), queue=_NO_QUEUE, started=(), num_tokens=0, policy=None)

    def _evolve(
        self,
        requests: PersistentMap[RequestId, RequestRecord],
        queue: PersistentQueue[RequestRecord],
        started: tuple[RequestRecord, ...],
        num_tokens: int,
        policy: Policy | None,
    ) -> PrefillState[RequestId]:
        """A new state made of these parts (this one is not changed)."""
        if not requests and not started:  # drained: the run is over
            queue, policy = _NO_QUEUE, None
        return self._build(
            requests=requests, queue=queue, started=started, num_tokens=num_tokens, policy=policy
        )

    # -- named constructor -------------------------------------------------------------------

    @classmethod
    def from_prompt_lengths(
        cls,
        prompt_lengths: Sequence[int] | npt.NDArray[np.integer],
        *,
        num_computed_tokens: Sequence[int] | npt.NDArray[np.integer] | None = None,
    ) -> PrefillState[int]:
        """A state holding request ``i`` for every ``prompt_lengths[i]``, arrived in order.

        Takes the arguments of :func:`pypto_sched.plan_prefill` (but may be empty); stepped
        until it drains, it gives the dispatches of that schedule.
        """
        lengths = as_count_array("prompt_lengths", prompt_lengths, min_value=1, allow_empty=True)
        computed = check_num_computed_tokens(num_computed_tokens, lengths)
        # (Built at once, as add after add would build it: a map updated once and a queue.)
        records = tuple(
            RequestRecord(index, length, cached, False)
            for index, (length, cached) in enumerate(
                zip(lengths.tolist(), computed.tolist(), strict=True)
            )
        )
        return restore_prefill_state((), records, int((lengths - computed).sum()), None)

    # -- changes -----------------------------------------------------------------------------

    def add(
        self,
        request_id: RequestId,
        prompt_length: int,
        *,
        num_computed_tokens: int = 0,
        at_front: bool = False,
    ) -> PrefillState[RequestId]:
        """A state that also holds ``request_id``, arrived after every request here.

        ``num_computed_tokens`` (``0 <= c < prompt_length``) tokens are already in the KV
        cache, a prefix-cache hit; the prefill runs positions ``c .. prompt_length - 1``.
        ``at_front`` queues it ahead of every waiting request instead (its turn comes next
        under ``round_robin``; it is admitted first under ``packed``): how a request preempted
        to free KV pages comes back before requests that arrived after it.
        Raises :class:`DuplicateRequestError` if the id is already here.
        """
        length = check_int("prompt_length", prompt_length, min_value=1)
        cached = check_int("num_computed_tokens", num_computed_tokens, min_value=0)
        at_front = check_bool("at_front", at_front)
        if not leaves_tokens_to_prefill(cached, length):
            raise computed_tokens_error(cached, length)
        check_hashable(request_id)
        if self._find(request_id) is not None:
            raise DuplicateRequestError.about(
                "request_id", f"must not be in the state already: {request_id!r} is"
            )
        record = RequestRecord(request_id, length, cached, False)
        return self._evolve(
            self._requests.set(request_id, record),
            self._queue.push_front(record) if at_front else self._queue.push(record),
            self._started,
            self._num_tokens + length - cached,
            self._policy,
        )

    def remove(self, request_id: RequestId) -> PrefillState[RequestId]:
        """A state without ``request_id``: an aborted request.

        Raises :class:`UnknownRequestError` if it is not here: never added, already removed,
        or finished (a request leaves the state with the step that runs its final chunk).
        """
        record = self._record(request_id)
        requests, queue = self._requests, self._queue
        started = tuple(r for r in self._started if r is not record)
        if len(started) == len(self._started):  # it is in the queue, whose entry now dies
            requests = requests.delete(request_id)
            best = queue.best()
            if best[1] is record or best[3] is record:  # keep the queue's two best live
                queue = _without_best(requests, queue)
        return self._evolve(
            requests,
            queue,
            started,
            self._num_tokens - (record.prompt_length - record.position),
            self._policy,
        )

    def discard(self, request_id: RequestId) -> PrefillState[RequestId]:
        """A state without ``request_id`` if it is here, else this state: an abort that need
        not know whether the request has finished its prefill."""
        if request_id not in self:
            return self
        return self.remove(request_id)

    def discard_all(self, request_ids: Iterable[RequestId]) -> PrefillState[RequestId]:
        """A state without each of ``request_ids`` that is here (the others are ignored, as
        :meth:`discard` ignores them): many aborts at once, equal to discarding them one by
        one. ``request_ids`` is an iterable of ids, never a single ``str`` or ``bytes``.

        It costs a removal from the map for each of a few ids and one pass over the state
        for many, never a rebuild of the queue's summary for each (see the module doc).
        """
        ids = tuple(check_ids(request_ids))
        try:
            gone = set(ids)
        except TypeError:  # an unhashable id, which no state holds
            gone = {request_id for request_id in ids if _is_hashable(request_id)}
        if not gone:
            return self
        started = tuple(record for record in self._started if record.id not in gone)
        if len(gone) * _REBUILD_SHARE >= len(self):  # most go: build the rest at once
            requests = self._requests
            queued = tuple(
                record
                for record in self._queue
                if record.id not in gone and requests.get(record.id) is record
            )
            if len(started) + len(queued) == len(self):
                return self
            num_tokens = sum(map(_left, started)) + sum(map(_left, queued))
            return restore_prefill_state(started, queued, num_tokens, self._policy)
        # A few go: out of the map (their queue entries die), and the queue's two best made
        # live once, if one of them went.
        requests = self._requests
        num_tokens = self._num_tokens - sum(_left(r) for r in self._started if r.id in gone)
        for request_id in gone:
            record = requests.get(request_id)
            if record is not None:
                requests = requests.delete(request_id)
                num_tokens -= _left(record)
        if requests is self._requests and len(started) == len(self._started):
            return self
        queue = self._queue
        if not _best_are_live(requests, queue):
            queue = _without_best(requests, queue)
        return self._evolve(requests, queue, started, num_tokens, self._policy)

    def apply(self, plan: StepPlan[RequestId]) -> PrefillState[RequestId]:
        """This state after the dispatch ``plan`` describes has run.

        ``plan`` was planned from an earlier state, and this one is that state changed only by
        :meth:`add`, :meth:`remove`, :meth:`discard` and :meth:`discard_all` while the dispatch
        ran: the requests that arrived meanwhile are kept, and a request removed meanwhile
        stays removed (its row is ignored; do not add its id again before applying). Applied
        to the state it was planned from, it gives ``plan.state``.
        A request whose chunk ran rejoins ``round_robin``'s queue behind the requests that
        arrived while it ran, as if queued when the dispatch ended; ``packed``'s newly
        started requests follow its started ones, as in ``plan.state``. The run is the plan's:
        one that finished every request ends it, and otherwise it goes on (its policy stays),
        even if the requests the plan left were all removed while it ran, as long as the
        state holds a request (an empty state is no run, however it emptied).

        Raises :class:`InvalidInputError` if a request of the plan is here at another
        position than its chunk's start, or its chunk does not end where it would here (past
        its prompt, or final before its end: the plan was applied already, even to a request
        that reused the id, or was made from another state), or if the plan's policy is not
        the run's.
        """
        if not isinstance(plan, StepPlan):
            raise InvalidInputError.about("plan", f"must be a StepPlan: {type(plan).__name__}")
        if not plan.rows:
            return self
        policy = plan.state._policy  # None: every row finished its request
        if self._policy is not None and policy is not None and policy != self._policy:
            raise InvalidInputError.about(
                "plan",
                f"must be planned with {self._policy!r}, the policy of the run in "
                f"progress: it was planned with {policy!r}",
            )
        requests, queue = self._requests, self._queue
        started: list[RequestRecord | None] = list(self._started)  # None: finished here
        # (Started requests found by a dict made once, not by a walk over them for each
        # row: a plan of many started rows made apply quadratic.)
        started_at = {record.id: i for i, record in enumerate(self._started)}
        num_tokens = self._num_tokens
        admitted: list[RequestRecord] = []
        for request_id, chunk in plan.rows.items():
            index = _index_of(started_at, request_id)
            record = requests.get(request_id) if index is None else started[index]
            if record is None:  # removed while the dispatch ran
                continue
            ends = chunk.end == record.prompt_length
            if (
                record.position != chunk.start
                or chunk.end > record.prompt_length
                or (chunk.is_final != ends)
            ):
                raise InvalidInputError.about(
                    "plan",
                    f"must run request {request_id!r} as it is here, at position "
                    f"{record.position} of {record.prompt_length} tokens: its chunk runs "
                    f"{chunk.start}:{chunk.end}{', final' if chunk.is_final else ''} (applied "
                    f"twice, or planned from another state?)",
                )
            num_tokens -= chunk.length
            after = None
            if not chunk.is_final:
                after = RequestRecord(request_id, record.prompt_length, chunk.end, True)
            if index is not None:  # packed: a started request
                started[index] = after
            elif after is None:  # finished: its queue entry dies
                requests = requests.delete(request_id)
            elif policy == "round_robin":  # back to the tail of the queue
                requests = requests.set(request_id, after)
                queue = queue.push(after)
            else:  # packed: it leaves the queue, started
                requests = requests.delete(request_id)
                admitted.append(after)
        still = tuple(record for record in started if record is not None)
        # The entries of the requests that left the queue here are dropped off its head, as
        # plan_step drops them: left there, every later step would walk them again.
        _, queue = _next_waiting(requests, queue)
        return self._evolve(requests, queue, (*still, *admitted), num_tokens, policy)

    # -- reading -----------------------------------------------------------------------------

    def _find(self, request_id: RequestId) -> RequestRecord | None:
        record = self._requests.get(request_id)
        if record is None:
            for candidate in self._started:
                if candidate.id is request_id or candidate.id == request_id:
                    return candidate
        return record

    def _record(self, request_id: RequestId) -> RequestRecord:
        check_hashable(request_id)
        record = self._find(request_id)
        if record is None:
            raise UnknownRequestError.about(
                "request_id",
                f"must be a request in the state (not finished or removed): {request_id!r}",
            )
        return record

    def __getitem__(self, request_id: RequestId) -> PrefillRequest:
        record = self._record(request_id)
        return PrefillRequest(
            prompt_length=record.prompt_length,
            num_computed_tokens=record.position,
            is_started=record.started,
        )

    def __contains__(self, request_id: object) -> bool:
        try:
            return self._find(request_id) is not None  # type: ignore[arg-type]
        except TypeError:  # unhashable
            return False

    def __len__(self) -> int:
        return len(self._requests) + len(self._started)

    def __iter__(self) -> Iterator[RequestId]:
        for record in self._in_order():
            yield record.id

    def _in_order(self) -> Iterator[RequestRecord]:
        """Every request: ``packed``'s started ones, then the live entries of the queue."""
        yield from self._started
        requests, queue = self._requests, self._queue
        if _all_live(requests, queue):
            yield from queue
            return
        for record in queue:
            if requests.get(record.id) is record:
                yield record

    @property
    def num_tokens(self) -> int:
        """Tokens still to prefill, over every request."""
        return self._num_tokens

    @property
    def policy(self) -> Policy | None:
        """The policy of the run in progress, which every step must use until the state
        drains; ``None`` if no run is in progress (no ``packed`` step, and no
        ``round_robin`` step that had to split, since the state was last empty)."""
        return self._policy

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PrefillState):
            return NotImplemented
        if (len(self), self._num_tokens, self._policy) != (
            len(other),
            other._num_tokens,
            other._policy,
        ):
            return False
        return all(
            (a.id, a.prompt_length, a.position, a.started)
            == (b.id, b.prompt_length, b.position, b.started)
            for a, b in zip(self._in_order(), other._in_order(), strict=True)
        )

    __hash__ = None  # type: ignore[assignment]

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        # The default would restore the slots with setattr, which an immutable state refuses.
        return restore_prefill_state, (
            self._started,
            tuple(self._in_order())[len(self._started) :],
            self._num_tokens,
            self._policy,
        )

    def __repr__(self) -> str:
        return (
            f"PrefillState(requests={len(self)}, tokens={self._num_tokens}, "
            f"policy={self._policy!r})"
        )


def _index_of(positions: dict[Any, int], request_id: object) -> int | None:
    """``positions.get(request_id)``, ``None`` for an unhashable id too (it is in no state)."""
    try:
        return positions.get(request_id)
    except TypeError:
        return None


def _left(record: RequestRecord) -> int:
    """A queued request's rank: the tokens it has left to prefill."""
    return record.prompt_length - record.position


_NO_QUEUE: PersistentQueue[Any] = PersistentQueue(_left)

#: :meth:`PrefillState.discard_all` rebuilds the state once the ids to drop are at least one
#: in this many of its requests; below, it deletes each from the map. (A deletion costs about
#: 5 us, the rebuild about 2 us a request it keeps and 0.3 us one it passes over.)
_REBUILD_SHARE = 4


def restore_prefill_state(
    started: tuple[RequestRecord, ...],
    queued: tuple[RequestRecord, ...],
    num_tokens: int,
    policy: Policy | None,
) -> PrefillState[Any]:
    requests: PersistentMap[Any, RequestRecord] = PersistentMap()
    requests = requests.update((record.id, record) for record in queued)
    queue: PersistentQueue[RequestRecord] = _NO_QUEUE.extend(queued)
    return PrefillState()._evolve(requests, queue, started, num_tokens, policy)


def _is_hashable(request_id: object) -> bool:
    try:
        hash(request_id)
    except TypeError:
        return False
    return True


class StepRows(dict[RequestId, StepChunk]):
    """A plan's rows: a read-only dict that pickles and copies like any value.

    (A dict subclass rather than a ``Mapping`` wrapper: it is built on every step without
    a Python ``__init__``, and reads are a dict's own.) Its mutators raise ``TypeError``.
    """

    __slots__ = ()

    def _read_only(self, *args: object, **kwargs: object) -> NoReturn:
        raise TypeError("a plan's rows are read-only")

    __setitem__ = __delitem__ = __ior__ = _read_only
    clear = pop = popitem = setdefault = update = _read_only

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        # The default would rebuild the dict item by item through __setitem__.
        return StepRows, (dict(self),)


def as_step_rows(rows: object) -> Mapping[Any, StepChunk]:
    """A plan's ``rows`` checked, as a read-only mapping."""
    if not isinstance(rows, Mapping):
        raise InvalidInputError.about(
            "rows", f"must be a mapping of request ids to StepChunk: {type(rows).__name__}"
        )
    for request_id, chunk in rows.items():
        if not isinstance(chunk, StepChunk):
            raise InvalidInputError.about(
                "rows",
                f"must map each request id to a StepChunk: {request_id!r} maps to "
                f"{chunk!r} ({type(chunk).__name__})",
            )
    return rows if type(rows) is StepRows else StepRows(rows)


def _check_state(_plan: object, _field: object, state: object) -> None:
    if not isinstance(state, PrefillState):
        raise InvalidInputError.about("state", f"must be a PrefillState: {type(state).__name__}")


def _check_pool(_plan: object, _field: object, pool: PagePool[Any] | None) -> None:
    if pool is not None and not isinstance(pool, PagePool):
        raise InvalidInputError.about("pool", f"must be a PagePool or None: {type(pool).__name__}")


@attrs.frozen(kw_only=True)
class StepPlan(Generic[RequestId]):
    """One planned dispatch and the state after it.

    ``rows`` maps each request id in the dispatch to its chunk, in the order the rows run
    (arrival order); it is read-only. ``state`` is the state once the dispatch has run:
    requests whose final chunk is here have left it; to apply the plan to a state that has
    changed while the dispatch ran, use :meth:`PrefillState.apply`. Plans pickle and copy
    (to ship them to worker processes).
    """

    rows: Mapping[RequestId, StepChunk] = attrs.field(converter=as_step_rows)
    state: PrefillState[RequestId] = attrs.field(validator=_check_state)
    #: With a pool given to :func:`plan_step`: that pool once the rows' pages are held
    #: (request ids are the state's); else ``None``.
    pool: PagePool[RequestId] | None = attrs.field(default=None, validator=_check_pool)

    @property
    def num_rows(self) -> int:
        return len(self.rows)

    @property
    def num_tokens(self) -> int:
        """Prefill tokens in the dispatch (reserved decode tokens not included)."""
        return sum(chunk.length for chunk in self.rows.values())

    @property
    def finished(self) -> tuple[RequestId, ...]:
        """The requests whose final chunk runs here, in row order."""
        return tuple(rid for rid, chunk in self.rows.items() if chunk.is_final)

    def arrays(self, *, index: int = 0) -> DispatchArrays:
        """The dispatch's kernel arrays over :attr:`pool`; row ``i``'s ``requests`` entry is
        ``i``. A plan made without a pool has no pages to read: ``InvalidInputError``."""
        if self.pool is None:
            raise InvalidInputError.about(
                "pool", "must be given to plan_step for a plan's arrays: this plan has none"
            )
        return rows_arrays(self.rows, self.pool, index=index)


def plan_step(
    state: PrefillState[RequestId],
    config: PlannerConfig,
    *,
    reserved_tokens: int = 0,
    reserved_rows: int = 0,
    pool: PagePool[RequestId] | None = None,
) -> StepPlan[RequestId]:
    """Plan the next prefill dispatch from ``state`` under ``config``.

    ``reserved_tokens`` and ``reserved_rows`` are what the caller's decode tokens take of
    the dispatch: prefill gets ``min(config.effective_budget, max_num_batched_tokens -
    reserved_tokens)`` tokens and ``max_num_seqs - reserved_rows`` rows, each at least 0
    (a reservation above the dispatch leaves no room; it is not an error). Without
    ``max_num_seqs`` rows are not limited and ``reserved_rows`` is ignored. With no room
    left, or nothing that fits it, the plan has no rows and its state is ``state``.

    With a KV page ``pool`` (keyed by the same request ids), a chunk is planned only if the
    pages it needs are free (:func:`~pypto_sched.core._policies.page_room`): a request runs at most
    what its pages plus the free pages hold, requests are admitted only while pages last, and
    ``round_robin``'s whole batch runs at once only if the pool holds all of it. ``plan.pool``
    is the pool with the rows' pages held.
    """
    if not isinstance(state, PrefillState):
        raise InvalidInputError.about("state", f"must be a PrefillState: {type(state).__name__}")
    check_config(config)
    reserved_tokens = _token_count("reserved_tokens", reserved_tokens)
    reserved_rows = _token_count("reserved_rows", reserved_rows)
    if config.max_num_seqs is None:
        reserved_rows = 0  # rows are not limited: no rule reads it (the tail, the bound)
    room_tokens, room_rows = prefill_room(config, reserved_tokens, reserved_rows)
    if state._policy is not None and state._policy != config.policy:
        raise InvalidInputError.about(
            "config.policy",
            f"must be {state._policy!r}, the policy of the run in progress, "
            f"until the state drains: {config.policy!r}",
        )
    if pool is not None:
        _check_pool(None, None, pool)
    num_requests = len(state)
    if num_requests == 0 or room_tokens == 0 or room_rows == 0:
        return _step_plan(_NO_ROWS, state, pool)
    rows = MAX_TOKENS if room_rows is None else room_rows  # an int bound, for counting down
    cap = request_cap(config, num_requests, reserved_tokens, reserved_rows)
    page = config.chunk_alignment or 1
    # The dispatch keeps to the bound when it has the whole budget and rows and no limit can
    # bind (see _keep_to_the_bound; a page pool must hold every request whole).
    whole = reserved_tokens == 0 and reserved_rows == 0
    to_bound = config if whole and bound_rule_applies(config, num_requests) else None
    holds = None if pool is None else StepHolds(pool)
    step: _StepSizing[RequestId] = _new_tuple(_StepSizing, (state, holds, cap, page, to_bound))
    if config.policy == "packed":
        plan = _plan_packed(step, room_tokens, rows, config.max_num_partial_prefills)
    else:
        plan = _plan_round_robin(step, room_tokens, rows)
    if pool is not None and not plan.rows:
        _check_pool_holds_each(state, pool)
    return plan


def _check_pool_holds_each(state: PrefillState[RequestId], pool: PagePool[RequestId]) -> None:
    """Raise :class:`CacheTooSmallError` if a request that could take the next pages needs
    more than ``pool`` has in all: no step could ever finish it, so the run would be stuck.

    Checked when a step plans no row, which is where such a request leaves the run, and only
    on the requests that can hold pages (the started ones, the pool's owners and the first
    live request of the queue): a stuck step costs the owners and the dead entries before
    that request, never the rest of the queue.
    """
    requests = state._requests
    # (An owner the state does not hold, a decode request, gives None. The head is the first
    # live entry: the entries a removal or an admission left dead before it hold no one.)
    head, _ = _next_waiting(requests, state._queue)
    candidates = [*state._started, *map(requests.get, pool.owners()), head]
    for record in candidates:
        if record is None:
            continue
        check_holds_alone(
            pool,
            record.id,
            record.prompt_length,
            name="pool",
            what="its prompt",
            error=CacheTooSmallError,
        )


_NO_ROWS: Mapping[Any, StepChunk] = StepRows({})

# A plan, a record and a step's sizing, built without a Python __init__ or __new__ (as
# step_chunk: each is built on every step, from values that need no check).
_set_rows = StepPlan.__dict__["rows"].__set__
_set_state = StepPlan.__dict__["state"].__set__
_set_pool = StepPlan.__dict__["pool"].__set__
_new_tuple = tuple.__new__


def _step_plan(
    rows: Mapping[RequestId, StepChunk],
    state: PrefillState[RequestId],
    pool: PagePool[RequestId] | None,
) -> StepPlan[RequestId]:
    """``StepPlan(rows=rows, state=state, pool=pool)``, built faster."""
    plan: StepPlan[RequestId] = _new(StepPlan)
    _set_rows(plan, rows)
    _set_state(plan, state)
    _set_pool(plan, pool)
    return plan


def _token_count(name: str, value: object) -> int:
    if type(value) is int and 0 <= value <= MAX_TOKENS:  # the common case, checked cheaply
        return value
    return check_int(name, value, min_value=0)


class _StepSizing(NamedTuple, Generic[RequestId]):
    """What a step's rows are sized with, fixed for the whole step."""

    state: PrefillState[RequestId]
    #: With a pool: the rows' page holds, made at once when the plan is built.
    holds: StepHolds[RequestId] | None
    #: The request cap of this step (see request_cap).
    cap: int
    #: Chunks end on multiples of it (1: anywhere).
    page: int
    #: The config, when ``packed`` keeps this dispatch to the bound; else ``None``.
    to_bound: PlannerConfig | None

    def size(self, record: RequestRecord, tokens_left: int, rows_left: int) -> int:
        """Tokens ``record`` may run in the room left (0: none)."""
        holds = self.holds
        if holds is not None:
            room = holds.room(record.id, record.position)
            tokens_left = room if room < tokens_left else tokens_left
        limit = chunk_limit(self.cap, tokens_left, rows_left)
        return chunk_size(record.position, record.prompt_length, limit, self.page)

    def plan(
        self,
        rows: dict[RequestId, StepChunk],
        requests: PersistentMap[RequestId, RequestRecord],
        queue: PersistentQueue[RequestRecord],
        started: tuple[RequestRecord, ...],
        tokens_run: int,
        policy: Policy,
    ) -> StepPlan[RequestId]:
        """The plan of ``rows`` and the state's new parts; with no row, the state is left as
        it was."""
        state, holds = self.state, self.holds
        if not rows:
            return _step_plan(_NO_ROWS, state, None if holds is None else holds.base)
        next_state = state._evolve(requests, queue, started, state._num_tokens - tokens_run, policy)
        return _step_plan(StepRows(rows), next_state, None if holds is None else holds.pool())


def _run(
    rows: dict[RequestId, StepChunk],
    record: RequestRecord,
    size: int,
    holds: StepHolds[RequestId] | None,
) -> RequestRecord | None:
    """Add a row of ``size`` tokens of ``record`` (with a pool, noting its pages' hold);
    return its new record, or ``None`` if the chunk is final."""
    request_id, length, start, _ = record
    end = start + size
    rows[request_id] = step_chunk(start, size, end == length)
    if holds is not None:
        holds.hold(request_id, end)
    return None if end == length else _new_tuple(RequestRecord, (request_id, length, end, True))


def _queue_of(
    requests: PersistentMap[RequestId, RequestRecord], queue: PersistentQueue[RequestRecord]
) -> PersistentQueue[RequestRecord]:
    """``queue`` rebuilt of its live entries only."""
    live = _NO_QUEUE
    for record in queue:
        if requests.get(record.id) is record:
            live = live.push(record)
    return live


def _without_best(
    requests: PersistentMap[RequestId, RequestRecord], queue: PersistentQueue[RequestRecord]
) -> PersistentQueue[RequestRecord]:
    """``queue``, one of whose two best entries just died, with its two best live again: the
    dead entries at its front popped, when that is enough (the oldest of equal lengths are
    the best: aborting the oldest first pops them), else rebuilt of its live entries."""
    _, rest = _live_head(requests, queue)
    return rest if _best_are_live(requests, rest) else _queue_of(requests, queue)


def _best_are_live(
    requests: PersistentMap[RequestId, RequestRecord], queue: PersistentQueue[RequestRecord]
) -> bool:
    """Whether the two entries ``queue`` ranks best (those it has) are live."""
    _, item, _, other = queue.best()
    return (item is None or requests.get(item.id) is item) and (
        other is None or requests.get(other.id) is other
    )


def _live_best(
    requests: PersistentMap[RequestId, RequestRecord], queue: PersistentQueue[RequestRecord]
) -> tuple[int, int]:
    """The two most tokens left to live entries of ``queue`` (0 where there are fewer).
    (Read off the queue; only if a dead entry is among its best, by a walk.)"""
    rank, _, second, _ = queue.best()
    if _best_are_live(requests, queue):
        return max(rank, 0), max(second, 0)
    best = _queue_of(requests, queue).best()
    return max(best[0], 0), max(best[2], 0)


def _live_head(
    requests: PersistentMap[RequestId, RequestRecord], queue: PersistentQueue[RequestRecord]
) -> tuple[RequestRecord | None, PersistentQueue[RequestRecord]]:
    """The first live record of ``queue`` (``None``: none), and ``queue`` without the dead
    entries before it."""
    while queue:
        record = queue.peek()
        if requests.get(record.id) is record:
            return record, queue
        queue = queue.pop()
    return None, queue


def _all_live(
    requests: PersistentMap[RequestId, RequestRecord], queue: PersistentQueue[RequestRecord]
) -> bool:
    """Whether every entry of ``queue`` is live, for a state's map and queue or both as a
    step changes them together (a record deleted or replaced in the map leaves its entry
    dead; a pop drops an entry and a step that admits its request deletes the record too).
    Every record of such a map has one live entry in the queue, so a queue no longer than
    the map has no dead entry: no lookup needed."""
    return len(queue) == len(requests)


def _next_waiting(
    requests: PersistentMap[RequestId, RequestRecord], queue: PersistentQueue[RequestRecord]
) -> tuple[RequestRecord | None, PersistentQueue[RequestRecord]]:
    """:func:`_live_head`, whose head is live without a lookup while :func:`_all_live`:
    most steps admit from such a queue, and inside a server's step that lookup is a cold
    walk of the trie."""
    if queue and _all_live(requests, queue):
        return queue.peek(), queue
    return _live_head(requests, queue)


def _plan_packed(
    step: _StepSizing[RequestId], tokens: int, rows_left: int, max_partial: int | None
) -> StepPlan[RequestId]:
    """``packed``'s step: the started requests in order, each a chunk if one fits, then
    waiting requests from the head of the queue while :func:`admits` takes them."""
    state, holds = step.state, step.holds
    tokens_left, room_rows = tokens, rows_left
    rows: dict[RequestId, StepChunk] = {}
    started: list[RequestRecord] = []
    for record in state._started:
        size = step.size(record, tokens_left, rows_left)
        if size == 0:  # no room for it in this step
            started.append(record)
            continue
        after = _run(rows, record, size, holds)
        if after is not None:
            started.append(after)
        tokens_left -= size
        rows_left -= 1
    requests, queue = state._requests, state._queue
    admitted: list[RequestRecord] = []
    # (With no room left no one is admitted; checking first spares the queue a walk.)
    while rows_left and tokens_left:
        head, queue = _next_waiting(requests, queue)
        if head is None:
            break
        size = step.size(head, tokens_left, rows_left)
        if not admits(size, head.prompt_length - head.position, len(started), max_partial):
            break
        admitted.append(head)
        queue = queue.pop()
        requests = requests.delete(head.id)  # it leaves the queue
        after = _run(rows, head, size, holds)
        if after is not None:
            started.append(after)
        tokens_left -= size
        rows_left -= 1
    config = step.to_bound
    if (
        config is not None
        and not surely_keeps_to_the_bound(
            tokens - tokens_left,
            state._num_tokens,
            max(state._queue.best()[0], max(map(_left, state._started), default=0)),
            len(state),
            config,
        )
        and _pool_holds_everything(state, step.holds)
    ):  # (else its free pages can bind)
        kept = _keep_to_the_bound(step, config, rows, admitted, requests, queue, tokens, room_rows)
        if kept is not None:
            return kept
    return step.plan(rows, requests, queue, tuple(started), tokens - tokens_left, "packed")


def _keep_to_the_bound(
    step: _StepSizing[RequestId],
    config: PlannerConfig,
    greedy: dict[RequestId, StepChunk],
    admitted: list[RequestRecord],
    waiting: PersistentMap[RequestId, RequestRecord],
    queue: PersistentQueue[RequestRecord],
    tokens: int,
    rows_room: int,
) -> StepPlan[RequestId] | None:
    """The step's plan when the ``greedy`` rows (which admit ``admitted`` and leave
    ``waiting`` in ``queue``) would
    leave more than the bound less one dispatch: every request runs at least its
    :func:`deadline_minimums`, the rest of the budget first come, first served
    (:func:`fill_sizes`). ``None``: the greedy rows stand (they keep to the bound, no
    in-order dispatch does, or the rows or a pool's pages do not hold it).

    Its cost does not grow with the queue: the bound needs only the two most tokens left,
    read off the queue for the requests still waiting, and the minimums only the started
    requests and the first ``budget + 1`` waiting ones (one behind them could start only if
    each of those ran a token: more than the budget).
    """
    state = step.state
    total, count = state._num_tokens, len(state)
    records = [*state._started, *admitted]
    requests, rest = state._requests, queue
    others = _live_best(waiting, queue)
    left = [_left(record) for record in records]
    ran = [greedy[record.id].length if record.id in greedy else 0 for record in records]
    bound = _bound_with(left, others, total, count, config)
    after = [r - size for r, size in zip(left, ran, strict=True)]
    if _bound_with(after, others, total - sum(ran), count - after.count(0), config) < bound:
        return None
    # The deadline fill, over the started requests and the waiting ones the greedy rows
    # admitted and one more; then twice as many while a request behind them would have to
    # start, or the fill runs every waiting one and has budget left (up to budget + 1
    # waiting ones: the fill cannot run more).
    num_started = len(state._started)
    most = num_started + tokens + 1
    grow = 1
    while True:
        while len(records) < most and grow:
            head, rest = _live_head(requests, rest)
            if head is None:
                break
            records.append(head)
            rest = rest.pop()
            grow -= 1
        left = [_left(record) for record in records]
        others = _live_best(requests, rest)
        minimums, blocked = deadline_minimums(left, num_started, others, bound, config)
        sizes = None
        if minimums is not None:
            sizes = fill_sizes(
                [record.position for record in records],
                [record.prompt_length for record in records],
                minimums,
                num_started,
                step.cap,
                tokens,
            )
        short = sizes is not None and sum(sizes) < tokens and all(sizes[num_started:])
        if not (blocked or short) or not rest or len(records) >= most:
            break
        grow = len(records)
    if sizes is None or len(sizes) - sizes.count(0) > rows_room:
        return None
    after = [r - size for r, size in zip(left, sizes, strict=True)]
    if _bound_with(after, others, total - sum(sizes), count - after.count(0), config) >= bound:
        return None
    holds = None if step.holds is None else StepHolds(step.holds.base)
    step = step._replace(holds=holds)
    rows: dict[RequestId, StepChunk] = {}
    started: list[RequestRecord] = []
    for record, size in zip(records[:num_started], sizes, strict=False):
        if holds is not None and size > holds.room(record.id, record.position):
            return None
        after_record = _run(rows, record, size, holds) if size else record
        if after_record is not None:
            started.append(after_record)
    # The waiting requests that run are the first ones in the queue: one that must start
    # has a run before it (deadline_minimums), and the budget is handed out in order.
    queue = state._queue
    for size in sizes[num_started:]:
        if not size:
            break
        head, queue = _next_waiting(requests, queue)
        assert head is not None  # (a record of the walk above)
        if holds is not None and size > holds.room(head.id, head.position):
            return None
        if not admits(size, _left(head), len(started), config.max_num_partial_prefills):
            return None
        queue = queue.pop()
        requests = requests.delete(head.id)
        after_record = _run(rows, head, size, holds)
        if after_record is not None:
            started.append(after_record)
    return step.plan(rows, requests, queue, tuple(started), sum(sizes), "packed")


def _bound_with(
    left: list[int], others: tuple[int, int], total: int, count: int, config: PlannerConfig
) -> int:
    """:func:`dispatch_bound` of ``count`` requests with ``total`` tokens left: some with
    ``left`` each (0: finished), the others' two most being ``others``."""
    first, second = others
    for tokens in left:
        if tokens > first:
            first, second = tokens, first
        elif tokens > second:
            second = tokens
    return dispatch_bound(total, first, second, count, config) if count else 0


def _plan_round_robin(
    step: _StepSizing[RequestId], tokens: int, rows_left: int
) -> StepPlan[RequestId]:
    state, holds = step.state, step.holds
    if (
        state._policy is None
        and fits_one_dispatch(state._num_tokens, len(state), tokens, rows_left)
        and _pool_holds_everything(state, holds)
    ):
        return _plan_whole_batch(step)
    requests = state._requests
    record, queue = _next_waiting(requests, state._queue)
    assert record is not None, "a non-empty round_robin state has a live queue entry"
    size = step.size(record, tokens, rows_left)
    if size == 0 and holds is not None:
        # The head waits for pages and keeps its turn; the first request behind it that
        # can run takes this dispatch (the pages it holds may be what the head needs).
        record, size = _first_runnable_behind_head(step, holds, requests, queue, tokens, rows_left)
    if size == 0:  # the head keeps its turn
        return step.plan({}, requests, queue, (), 0, "round_robin")
    if record is queue.peek():
        queue = queue.pop()
    rows: dict[RequestId, StepChunk] = {}
    after = _run(rows, record, size, holds)
    # Its queue entry is now dead (``requests`` no longer maps to it) wherever it was.
    if after is None:
        requests = requests.delete(record.id)
    else:  # back to the tail of the queue
        requests = requests.set(record.id, after)
        queue = queue.push(after)
    return step.plan(rows, requests, queue, (), size, "round_robin")


def _first_runnable_behind_head(
    step: _StepSizing[RequestId],
    holds: StepHolds[RequestId],
    requests: PersistentMap[RequestId, RequestRecord],
    queue: PersistentQueue[RequestRecord],
    tokens: int,
    rows_left: int,
) -> tuple[RequestRecord, int]:
    """The first live request after the head of ``queue`` that can run a token, and its
    chunk; the head and 0 if none can.

    With no page free, a request without pages cannot run (its :func:`page_room` is 0), so
    the pool's owners are asked first and the queue is walked only if one of them can run: a
    step stuck for pages costs the owners, not the length of the queue."""
    head = queue.peek()
    if holds.free == 0 and not any(
        record is not None and record is not head and step.size(record, tokens, rows_left)
        for record in map(requests.get, holds.base.owners())
    ):
        return head, 0
    for record in queue:
        if record is head or requests.get(record.id) is not record:
            continue
        size = step.size(record, tokens, rows_left)
        if size:
            return record, size
    return head, 0


def _pool_holds_everything(
    state: PrefillState[RequestId], holds: StepHolds[RequestId] | None
) -> bool:
    """Whether the pool (if any) holds every request of ``state`` whole."""
    if holds is None:
        return True
    pool = holds.base
    # (More tokens left than the whole pool holds: no need to count them request by request.)
    if state._num_tokens > pool.num_pages * pool.page_size:
        return False
    missing = sum(pool.missing_pages(r.id, r.prompt_length) for r in state._in_order())
    return missing <= pool.num_free


def _plan_whole_batch(step: _StepSizing[RequestId]) -> StepPlan[RequestId]:
    """Every request runs whole: the run ends (an empty map of requests drains the state)."""
    state, holds = step.state, step.holds
    rows: dict[RequestId, StepChunk] = {}
    for record in state._in_order():
        _run(rows, record, record.prompt_length - record.position, holds)
    return step.plan(rows, PersistentMap(), state._queue, (), state._num_tokens, "round_robin")
