"""pypto_sched as the scheduler of transformers' continuous batching.

transformers' continuous-batching server (``model.generate_batch``,
``model.init_continuous_batching``) asks a pluggable scheduler for every batch it runs; the
schedulers it offers are the classes of
``transformers.generation.continuous_batching.scheduler.SCHEDULER_MAPPING``, chosen by the
``scheduler_type`` of its ``ContinuousBatchingConfig``. :func:`register` puts
:class:`PyptoScheduler`, configured once with a :class:`~pypto_sched.PlannerConfig`, into that
mapping; nothing else of the server is touched.

How a batch is built
====================
The server owns the requests, the paged KV cache and its budgets; the planner owns the
prefill decisions. Every ``schedule_batch(token_budget, cache_budget)``:

1. *Reconcile.* The scheduler keeps a :class:`~pypto_sched.PrefillState` of the requests
   whose prefill is not finished (the server's waiting and prefilling requests), keyed by
   the server's request ids. Requests the server has finished, cancelled or failed leave it;
   new ones join it in arrival order, or, with ``order="shortest_first"``, the ones found
   together by fewest prompt tokens left first (see *Admission order*). A request in it
   whose progress the server moved forward on its own (a prefix-cache hit, an offload)
   joins it again where it now is, at the front of the queue; so does a decoding request
   the server offloaded to the CPU, which its own schedulers serve first; a request it
   reset to its start (prefilling or decoding) joins at the back, as the server queues it.
2. *Decode first.* Decoding requests run one token each, in the server's order, within the
   dispatch's tokens and rows (below), by the planner's rule,
   :func:`~pypto_sched.decode_rows_first`.
3. *Prefill.* :func:`~pypto_sched.plan_step` plans the prefill rows with the decode tokens
   and rows reserved: the policy, the chunk cap, page alignment and the partial-prefill
   limit all come from the planner.
4. *The server's checks.* Each planned row then goes through the server's own checks, in
   order: new requests wait while ``block_new_requests`` is set or the cache is under its
   safety margin (see *The safety margin*), a row must fit the cache budget, and its cache
   blocks must be allocated. The server looks up a new request's prefix in its
   cache as its row is taken: a hit moves the request forward, and the rest of the batch is
   planned again with it at the front, from where the hit left it (the rows after it were
   sized for its old start), so it runs in this batch, as under the server's own
   schedulers. A row refused there does not run; the state advances
   only by the rows that run (the plan restricted to them), so a refused request keeps its
   place and is planned again next batch. If every planned row is refused, the step is
   planned again without them, new requests included (as the server's own schedulers go on
   to the next request when one finds no free block: a request that fits the cache runs
   even behind ones that never will), so that a started request that cannot get blocks is
   reported in ``starved_requests``; when nothing runs because the cache is full the batch
   is ``None``, and the server offloads requests and asks again.

The safety margin
=================
The server gives its scheduler a safety margin (``0.15`` by default, as for ``"fifo"``): the
share of the cache that must be free for new prefill requests to be scheduled, in the words
of the server's ``Scheduler``. Its own schedulers stop every prefill row under the margin,
a prompt already part-way included, unless the batch is otherwise empty; the batch then
runs the decodes alone while the part-way prompt holds its blocks. This scheduler applies
the margin to admission, as the server's words say and as vLLM's watermark does: under the
margin no new request starts (except as the only row of an empty batch, the server's rule),
and the requests already part-way go on, each chunk only if the cache can still give every
decoding request a new block after it (the next page each may need, counted by the cache's
own ``count_storable_requests``), so going on does not starve the decodes. Above the
margin, nothing changes: ``packed`` without a threshold runs ``"fifo"``'s batches.

Admission order
===============
The planner starts requests in the order they joined its state. ``order="arrival"`` (the
default) is the server's order, as its own schedulers keep it. ``order="shortest_first"``
sorts the requests that join in one reconciliation by the prompt tokens they have left,
fewest first (equal ones in arrival order): those the server queued since the last batch,
all of them when ``generate_batch`` queues a whole batch before the first one. It never
moves a request ahead of one that joined at an earlier batch, so no request waits for
requests that arrived after it, and with requests arriving one at a time it is the arrival
order. Serving the short prompts of a batch first gives more requests their first token
early (the mean time to first token falls by about half on long-tailed batches, with the
same tokens), and the longest prompts get theirs last: where the KV cache cannot hold the
long prompts left for the end at once, they prefill a few at a time and the batch takes
longer (``docs/transformers.md`` has the figures).

Not covered: parallel sampling (``num_return_sequences > 1``). The server stops a forked
request's prefill one token short of the planned chunk, so that chunk may end off the
config's page boundaries.

The dispatch's limits are the tighter of the server's and the config's: at most
``min(token_budget, max_num_batched_tokens)`` tokens and ``min(max_requests_per_batch,
max_num_seqs)`` rows. Page alignment is the config's: ``chunk_alignment=None`` (the default)
cuts chunks anywhere, as the server's own schedulers do -- its paged cache fills a page across
chunks, so alignment is not needed for correctness, and aligning leaves up to a page of a
batch's tokens unused whenever a chunk is cut; a ``chunk_alignment`` (the server's cache page
size, say) makes every non-final chunk end on a multiple of it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar, Literal, get_args

import attrs
from transformers.generation.continuous_batching.cache import PagedAttentionCache
from transformers.generation.continuous_batching.requests import (
    FutureRequestState,
    RequestState,
    RequestStatus,
)
from transformers.generation.continuous_batching.scheduler import SCHEDULER_MAPPING, Scheduler

from .. import (
    InvalidConfigError,
    PlannerConfig,
    PrefillState,
    StepChunk,
    decode_rows_first,
    plan_step,
)
from ..core._config import check_config
from ..core._validate import check_callback, check_int

__all__ = ["ORDERS", "Order", "PyptoScheduler", "ScheduledBatch", "ScheduledRow", "register"]

#: The default ``scheduler_type`` :func:`register` uses.
DEFAULT_NAME = "pypto_sched"

#: The order in which requests found together join the planner (see *Admission order*).
Order = Literal["arrival", "shortest_first"]
ORDERS: tuple[Order, ...] = get_args(Order)


@attrs.frozen(kw_only=True)
class ScheduledRow:
    """One request in a batch the server runs: positions ``start:start + length``."""

    request_id: str
    start: int
    length: int
    #: A prefill chunk (``False``: a decode token).
    is_prefill: bool
    #: Whether the request's prefill is complete after this row (always for decodes).
    is_final: bool

    @property
    def end(self) -> int:
        return self.start + self.length


@attrs.frozen(kw_only=True)
class ScheduledBatch:
    """A batch :class:`PyptoScheduler` gave the server, decode rows first, and the budgets
    the server offered for it."""

    rows: tuple[ScheduledRow, ...]
    token_budget: int
    cache_budget: int
    #: Whether the cache's free share was under the server's safety margin when the batch
    #: was built (see *The safety margin*): no new request starts beside other rows.
    under_safety_margin: bool = False

    @property
    def num_tokens(self) -> int:
        return sum(row.length for row in self.rows)


#: Called with every non-empty batch, before the server runs it.
BatchObserver = Callable[[ScheduledBatch], None]


def register(
    config: PlannerConfig,
    *,
    name: str = DEFAULT_NAME,
    on_batch: BatchObserver | None = None,
    order: Order = "arrival",
) -> type[PyptoScheduler]:
    """Offer pypto_sched to transformers' continuous batching as ``scheduler_type=name``.

    Puts a :class:`PyptoScheduler` subclass configured with ``config``, ``on_batch``
    (called with every batch it schedules) and the admission ``order`` (see *Admission
    order*) into the server's ``SCHEDULER_MAPPING`` under ``name``, replacing what was
    there (a pypto_sched scheduler; the name of any other, such as the server's ``"fifo"``,
    is refused), and returns it. The server picks it up for every
    continuous-batching run whose config says ``scheduler_type=name``.
    """
    check_config(config, error=InvalidConfigError)
    if not isinstance(name, str) or not name:
        raise InvalidConfigError.about("name", f"must be a non-empty string: {name!r}")
    if order not in ORDERS:
        raise InvalidConfigError.about("order", f"must be one of {ORDERS}: {order!r}")
    existing = SCHEDULER_MAPPING.get(name)
    if existing is not None and not (
        isinstance(existing, type) and issubclass(existing, PyptoScheduler)
    ):
        raise InvalidConfigError.about(
            "name",
            f"{name!r} is another scheduler's ({getattr(existing, '__name__', existing)}): "
            f"registering over it would change every run that asks for it; choose another name",
        )
    check_callback("on_batch", on_batch, error=InvalidConfigError)
    observers = () if on_batch is None else (on_batch,)

    class Registered(PyptoScheduler):
        planner_config = config
        batch_observers = observers
        admission_order = order

    Registered.__qualname__ = Registered.__name__ = f"PyptoScheduler[{name}]"
    SCHEDULER_MAPPING[name] = Registered
    return Registered


@attrs.define
class _Batch:
    """A batch being built: what runs, and what is left of the budgets."""

    tokens_left: int
    rows_left: int
    cache_left: int
    decode_fast_path: bool
    in_safety_margin: bool
    scheduled: list[FutureRequestState] = attrs.Factory(list)
    #: What runs, for the batch observers (``None`` without any: not built).
    rows: list[ScheduledRow] | None = None
    leaving_waiting: set[str] = attrs.Factory(set)
    allocation_failed: bool = False

    def rows_used(self, config: PlannerConfig) -> int:
        assert config.max_num_seqs is not None  # PyptoScheduler.step_config sets it
        return config.max_num_seqs - self.rows_left


class PyptoScheduler(Scheduler):
    """A transformers continuous-batching scheduler whose prefill chunks pypto_sched plans.

    Use :func:`register` rather than this class: it is configured through the class
    attributes :func:`register` sets, because the server builds its scheduler itself.
    """

    #: The planner's config (set by :func:`register`).
    planner_config: ClassVar[PlannerConfig]
    #: Called with every batch (set by :func:`register`).
    batch_observers: ClassVar[tuple[BatchObserver, ...]] = ()
    #: The order in which requests found together join the planner (set by :func:`register`).
    admission_order: ClassVar[Order] = "arrival"

    def __init__(
        self, cache: PagedAttentionCache, safety_margin: float | None, max_requests_per_batch: int
    ) -> None:
        if not isinstance(getattr(type(self), "planner_config", None), PlannerConfig):
            raise InvalidConfigError(
                f"{type(self).__name__} has no planner config: put it in SCHEDULER_MAPPING "
                "with pypto_sched.integrations.transformers.register(config, name=...), "
                "not by hand, and ask for scheduler_type=name"
            )
        check_int("max_requests_per_batch", max_requests_per_batch, min_value=1,
                  error=InvalidConfigError)  # fmt: skip
        if safety_margin is not None and not (
            isinstance(safety_margin, int | float)
            and not isinstance(safety_margin, bool)
            and 0 <= safety_margin <= 1
        ):
            raise InvalidConfigError.about(
                "safety_margin", f"must be None or a number in [0, 1]: {safety_margin!r}"
            )
        # The server's FIFO default: stop admitting prefills when under 15% of the cache is free.
        super().__init__(
            cache, 0.15 if safety_margin is None else safety_margin, max_requests_per_batch
        )
        self._step_configs: dict[int, PlannerConfig] = {}
        self.step_config(cache.max_batch_tokens)  # a config that cannot fit fails here

    def reset(self) -> None:
        super().reset()
        self.prefill_state: PrefillState[str] = PrefillState()
        #: Each request of ``prefill_state``: (prompt length, tokens computed).
        self.progress: dict[str, tuple[int, int]] = {}

    def step_config(self, token_budget: int) -> PlannerConfig:
        """The planner config of a dispatch the server allows ``token_budget`` tokens: the
        config given to :func:`register` within the server's limits."""
        config = self._step_configs.get(token_budget)
        if config is not None:
            return config
        check_int("token_budget", token_budget, min_value=1, error=InvalidConfigError)
        given = self.planner_config
        rows = self.max_requests_per_batch
        if given.max_num_seqs is not None:
            rows = min(rows, given.max_num_seqs)
        tokens = min(token_budget, given.max_num_batched_tokens)
        try:
            config = attrs.evolve(given, max_num_batched_tokens=tokens, max_num_seqs=rows)
        except InvalidConfigError as error:
            raise InvalidConfigError(
                f"the planner config does not fit the server ({token_budget} tokens a "
                f"batch): {error}",
                parameter=error.parameter,
            ) from error
        self._step_configs[token_budget] = config
        return config

    # -- the batch ------------------------------------------------------------------------------

    def schedule_batch(
        self, token_budget: int, cache_budget: int
    ) -> tuple[list[FutureRequestState] | None, bool, int, int]:
        config = self.step_config(token_budget)
        self._reconcile()
        assert config.max_num_seqs is not None  # step_config sets it
        batch = _Batch(
            tokens_left=config.max_num_batched_tokens,
            rows_left=config.max_num_seqs,
            cache_left=cache_budget,
            decode_fast_path=self.cache.max_blocks_per_request > 0,
            in_safety_margin=self._try_to_meet_safety_margin(),
            rows=[] if self.batch_observers else None,
        )
        self.starved_requests = []
        self._schedule_decodes(config, batch)
        self._schedule_prefill(config, batch)
        self._cleanup_waiting_queue(batch.leaving_waiting)
        if not batch.scheduled and batch.allocation_failed:
            return None, batch.decode_fast_path, 0, 0
        if batch.rows:
            scheduled = ScheduledBatch(
                rows=tuple(batch.rows),
                token_budget=token_budget,
                cache_budget=cache_budget,
                under_safety_margin=not batch.in_safety_margin,
            )
            for observer in self.batch_observers:
                observer(scheduled)
        num_q_tokens = config.max_num_batched_tokens - batch.tokens_left
        return (
            batch.scheduled,
            batch.decode_fast_path,
            num_q_tokens,
            cache_budget - batch.cache_left,
        )

    def _reconcile(self) -> None:
        """Bring the prefill state in line with the server's requests (see the module doc).

        A request whose progress the server moved forward keeps its place at the front of
        the queue, as do the requests the server offloaded to the CPU (its own schedulers
        serve those first); a request reset by the server comes back as a new one, last.
        New requests join in :attr:`admission_order`.

        ``self.progress`` mirrors the state's progress in a plain dict (the state's own
        lookups cost microseconds each, and this runs over every request before every batch).
        """
        state, progress = self.prefill_state, self.progress
        server_requests = self._prefilling_requests()
        current = {server.request_id: server for server in server_requests}
        for request_id in [r for r in progress if r not in current]:
            state = state.remove(request_id)  # finished, cancelled, failed or decoding
            del progress[request_id]
        changed: set[str] = set()
        offloaded: list[RequestState] = []
        back: list[RequestState] = []
        for server in server_requests:
            planned = progress.get(server.request_id)
            if planned is None:
                (offloaded if server.is_cpu_offloaded else back).append(server)
                continue
            now = _progress(server)
            if now == planned:
                continue
            if now[1] < planned[1] and not server.is_cpu_offloaded:
                # reset to its start: it joins where the server queues it, at the back
                state = state.remove(server.request_id)
                back.append(server)
            else:  # a prefix-cache hit, an offload: it keeps its place
                changed.add(server.request_id)
        # the changed ones in the state's order (rare: a prefix-cache hit, an offload)
        front = [current[r] for r in state if r in changed] if changed else []
        front += offloaded
        self.prefill_state = state
        for server in reversed(front):  # each goes ahead of the one after it
            self._requeue_at_front(server)
        state = self.prefill_state
        if self.admission_order == "shortest_first":
            back.sort(key=lambda server: len(server.remaining_prefill_tokens))  # stable
        for server in back:
            length, computed = progress[server.request_id] = _progress(server)
            state = state.add(server.request_id, length, num_computed_tokens=computed)
        self.prefill_state = state

    def _requeue_at_front(self, server: RequestState) -> None:
        """Put ``server``'s request in the prefill state where the server now has it, ahead
        of every waiting request (it keeps its place; see *How a batch is built*)."""
        length, computed = self.progress[server.request_id] = _progress(server)
        self.prefill_state = self.prefill_state.discard(server.request_id).add(
            server.request_id, length, num_computed_tokens=computed, at_front=True
        )

    def _prefilling_requests(self) -> list[RequestState]:
        """The server's requests with prompt tokens left: active ones, then waiting ones,
        each in the server's order."""
        active = [s for s in self.active_requests.values() if s.status == RequestStatus.PREFILLING]
        waiting = [self.waiting_requests[rid] for rid in self.waiting_requests_order]
        return [s for s in active + waiting if s.remaining_prefill_tokens]

    def _partial_room(self, config: PlannerConfig, skipped: set[str]) -> tuple[PlannerConfig, bool]:
        """The config to plan the rest of the batch with, and whether new requests may start:
        the requests ``skipped`` (left out of the state planned from) that are part-way
        through their prefill still hold places under ``max_num_partial_prefills``."""
        limit = config.max_num_partial_prefills
        if limit is None or not skipped:
            return config, True
        held = sum(1 for r in skipped if r in self.progress and self.progress[r][1] > 0)
        if held == 0:
            return config, True
        if held >= limit:
            return config, False  # no place left: only requests already part-way go on
        return attrs.evolve(config, max_num_partial_prefills=limit - held), True

    def _plannable(self, skipped: set[str], *, new_requests: bool) -> PrefillState[str]:
        """The state to plan from: without the requests ``skipped`` in this batch, and
        without the new (waiting) ones unless ``new_requests``."""
        if new_requests:
            return self.prefill_state.discard_all(skipped)
        return self.prefill_state.discard_all(skipped.union(self.waiting_requests))

    def _server_request(self, request_id: str) -> RequestState | None:
        return self.active_requests.get(request_id) or self.waiting_requests.get(request_id)

    def _schedule_decodes(self, config: PlannerConfig, batch: _Batch) -> None:
        """The decoding requests' rows, in the server's order, by the planner's decode-first
        rule (:func:`~pypto_sched.decode_rows_first`) within the dispatch's tokens and rows,
        each if the server's checks let it run."""

        def decode_row(state: RequestState, tokens_left: int) -> int:
            tokens = self._infer_request_tokens(state, batch.leaving_waiting)
            before = batch.tokens_left
            self._run_row(state, tokens, min(len(tokens), tokens_left), batch)
            return before - batch.tokens_left

        decoding = [
            state
            for state in self.active_requests.values()
            if state.status == RequestStatus.DECODING
        ]
        decode_rows_first(decoding, config, take_row=decode_row)

    def _schedule_prefill(self, config: PlannerConfig, batch: _Batch) -> None:
        """Plan the prefill rows in the room the decodes left, and run those the server
        accepts (see *The safety margin* in the module doc for the cache under it)."""
        new_requests = not self.block_new_requests
        if batch.in_safety_margin:
            self._run_planned(config, batch, set(), new_requests=new_requests)
            return
        # Under the margin: the requests part-way go on, while they leave the decodes a block.
        self._run_planned(config, batch, set(), new_requests=False, keep_a_block_per_decode=True)
        if not batch.scheduled:
            # The server's rule for an empty batch: one prefill row, new or not. A request
            # reported starved is not asked again (it would be offloaded twice).
            starved = {state.request_id for state, _ in self.starved_requests}
            self._run_planned(config, batch, starved, new_requests=new_requests, one_row=True)

    def _run_planned(
        self,
        config: PlannerConfig,
        batch: _Batch,
        skipped: set[str],
        *,
        new_requests: bool,
        one_row: bool = False,
        keep_a_block_per_decode: bool = False,
    ) -> None:
        """Plan the rest of the batch without the requests ``skipped`` (and without new
        ones unless ``new_requests``), and run the planned rows the server accepts: only
        the first (``one_row``), or only those that leave a free cache block for every
        decoding request (``keep_a_block_per_decode``).

        A plan whose rows are all refused is planned again without them, until a row runs
        or nothing is left to plan: a request whose blocks cannot be allocated is then
        reported starved, so the server frees blocks (by offloading), and a new request
        that fits runs even behind new ones that found no free block (as under the
        server's own schedulers).
        """
        while not (one_row and batch.scheduled):
            step_config, may_start = self._partial_room(config, skipped)
            plan = plan_step(
                self._plannable(skipped, new_requests=new_requests and may_start),
                step_config,
                reserved_tokens=config.max_num_batched_tokens - batch.tokens_left,
                reserved_rows=batch.rows_used(config),
            )
            ran: dict[str, StepChunk] = {}
            refused: list[str] = []
            moved: RequestState | None = None
            for request_id, chunk in plan.rows.items():
                if one_row and batch.scheduled:
                    break
                state = self._server_request(request_id)
                if state is not None and self._run_prefill_row(
                    state, chunk, batch, keep_a_block_per_decode=keep_a_block_per_decode
                ):
                    ran[request_id] = chunk
                    continue
                refused.append(request_id)
                if state is not None and state.position_offset != chunk.start:
                    moved = state  # a prefix-cache hit: the rows after it were sized wrong
                    break
            # (The plan restricted to the rows that ran; as it is when all of them did.)
            ran_plan = plan if len(ran) == len(plan.rows) else attrs.evolve(plan, rows=ran)
            self.prefill_state = self.prefill_state.apply(ran_plan)
            for request_id, chunk in ran.items():
                if chunk.is_final:
                    del self.progress[request_id]
                else:
                    self.progress[request_id] = (self.progress[request_id][0], chunk.end)
            skipped.update(ran)
            if moved is not None:
                # Planned again from where the hit left it, first in the room left, as the
                # server's own schedulers run it in the batch that finds the hit; the rows
                # that ran keep theirs (one row a request).
                # The rows refused before it are not asked again (a request reported starved
                # twice would be offloaded twice).
                self._requeue_at_front(moved)
                skipped.update(r for r in refused if r != moved.request_id)
                continue
            skipped.update(refused)
            if ran or not plan.rows:
                return

    def _run_prefill_row(
        self,
        state: RequestState,
        chunk: StepChunk,
        batch: _Batch,
        *,
        keep_a_block_per_decode: bool = False,
    ) -> bool:
        """Run a planned chunk if the server accepts it (and, with
        ``keep_a_block_per_decode``, if it leaves a free cache block for every decoding
        request); whether it runs."""
        if state.position_offset != chunk.start:
            return False  # changed since the reconciliation; planned again next batch
        if keep_a_block_per_decode and not self._keeps_a_block_per_decode(state, chunk.length):
            return False
        tokens = self._infer_request_tokens(state, batch.leaving_waiting)
        if state.position_offset != chunk.start:
            return False  # a prefix-cache hit moved it: planned again from there next batch
        return self._run_row(state, tokens, chunk.length, batch)

    def _keeps_a_block_per_decode(self, state: RequestState, size: int) -> bool:
        """Whether the cache could store ``size`` more tokens of ``state`` and still give
        every decoding request a new block (the next page each may need), by the cache's
        own count of what its free blocks can hold."""
        allocators = self.cache.cache_allocators
        chunk = {
            name: allocator.needs_new_blocks(state.request_id, state.current_len(), size)
            for name, allocator in allocators.items()
        }
        page = dict.fromkeys(allocators, 1)
        decoding = sum(
            1 for s in self.active_requests.values() if s.status == RequestStatus.DECODING
        )
        needed = [chunk] + [page] * decoding
        return bool(self.cache.count_storable_requests(needed) == len(needed))

    def _run_row(self, state: RequestState, tokens: list[int], size: int, batch: _Batch) -> bool:
        """Put ``size`` of ``tokens`` of ``state`` into the batch if the server's cache
        budget and free blocks allow it (the checks of the server's own schedulers)."""
        is_prefill = state.status != RequestStatus.DECODING
        read_needed = state.current_len()
        if self.cache.read_cache_limit is not None:
            read_needed = min(read_needed, self.cache.read_cache_limit)
        decode_eligible = (
            size == 1 and state.position_offset < self.cache.max_decode_fast_path_length
        )
        if not (batch.decode_fast_path and decode_eligible) and batch.cache_left < read_needed:
            return False
        if not self.cache.can_store_request_tokens(state, size):
            batch.allocation_failed = True
            starved = any(s.request_id == state.request_id for s, _ in self.starved_requests)
            if state.request_id in self.active_requests and not starved:
                self.starved_requests.append((state, size))
            return False
        start = state.position_offset
        self._schedule_request(state, tokens, size, batch.leaving_waiting)
        size = len(state.tokens_to_process)
        batch.decode_fast_path &= (
            size == 1 and state.position_offset < self.cache.max_decode_fast_path_length
        )
        batch.tokens_left -= size
        batch.rows_left -= 1
        batch.cache_left -= read_needed
        complete_blocks = self.cache.count_new_complete_blocks(state, size)
        finished_prefill = not state.remaining_prefill_tokens
        batch.scheduled.append(FutureRequestState(state, finished_prefill, complete_blocks, size))
        if batch.rows is not None:
            batch.rows.append(
                ScheduledRow(
                    request_id=state.request_id,
                    start=start,
                    length=size,
                    is_prefill=is_prefill,
                    is_final=finished_prefill,
                )
            )
        if self.waiting_requests.pop(state.request_id, None) is not None:
            batch.leaving_waiting.add(state.request_id)
        return True


def _progress(state: RequestState) -> tuple[int, int]:
    """A waiting or prefilling request's prompt length and tokens already computed."""
    computed = state.position_offset
    return computed + len(state.remaining_prefill_tokens), computed
