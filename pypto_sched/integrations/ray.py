"""Run an offline batch on Ray: one actor per replica, parts balanced by tokens.

``pip install 'pypto-sched[ray]'``; this module imports Ray, nothing else in ``pypto_sched``
does.

Theory of operation
===================
:class:`RayReplicas` starts one Ray actor per replica. Each actor builds one backend, once,
from the backend's name and options (:func:`pypto_sched.load_backend`), and then runs *parts*
of batches, one part at a time, each in a KV cache of its own:

* prefill (:meth:`RayReplicas.prefill`): the part is planned with
  :func:`~pypto_sched.plan_prefill` and run with :func:`~pypto_sched.execute_schedule`, as
  ``pypto-sched run`` does; it returns each request's greedy next token and, only when asked,
  its final logits (a batch of full-vocabulary logits is gigabytes);
* generation (:meth:`RayReplicas.generate`): :func:`~pypto_sched.generate` on the part, each
  request's random stream seeded by its index in the whole batch.

The batch is split by :func:`~pypto_sched.partition_requests`, weighing each request by its
prompt tokens for prefill and by prompt plus ``max_new_tokens`` for generation: part ``i`` is
replica ``i``'s. Every result comes back under its request index, so the output is in input
order, and for a batch-invariant backend equal to a one-device run (see
``docs/scaling-out.md`` for what "equal" means per backend).

Faults
------
* An actor that dies (its process or node lost, or :func:`ray.kill`) fails its part with a
  :class:`ray.exceptions.RayActorError`; the part goes back to the queue and a new actor takes
  the dead one's place. A part that loses its actor more than ``max_restarts`` times stops
  the job with :class:`ReplicaError`. A part runs from scratch on the new actor and its
  results are filed once, when it completes: nothing is lost or counted twice.
* The inputs are checked on the whole batch before any part runs, with the checks of
  :func:`~pypto_sched.generate` and :func:`~pypto_sched.execute_schedule` (token ids, the
  model's ``max_position_embeddings``, each request alone against ``num_pages``), so an
  error names the request by its index in the batch, as a one-device run does, never by its
  place in a part; so does an error from the backend while a part generates (its dispatch
  index is the part's).
* A deterministic failure (:class:`~pypto_sched.ExecutionError` from the backend, a bad input)
  is raised unchanged, never retried: running it again would fail again.
* Before starting any actor, the cluster's nodes are checked for room for every replica; when
  there is none the error says so at once rather than waiting for Ray to place actors that
  never fit. Actors that are not ready within ``start_timeout`` seconds (the cluster busy with
  other work) are a :class:`ReplicaError` too.

Output
------
Nothing of Ray's reaches stdout: the driver's messages about the cluster (a worker that
died, the autoscaler) and the workers' output go to stderr (:func:`ray_output_to_stderr`),
so a program that writes its results to stdout keeps it clean, faults included.

Progress
--------
With ``on_progress``, the driver asks every busy actor what its part has done every
``poll_seconds`` (the actors run two threads: one works, one answers) and reports a
:class:`BatchProgress`: requests and tokens done, over all replicas and per replica.
"""

from __future__ import annotations

import collections
import math
import signal
import socket
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from types import MappingProxyType
from typing import Any, Literal

import attrs
import numpy as np
import numpy.typing as npt
import ray
import ray.exceptions

from ..core._config import PlannerConfig, check_config
from ..core._errors import BackendError, InvalidInputError
from ..core._partition import Partition, partition_requests
from ..core._plan import plan_prefill
from ..core._sampling import SamplingParams
from ..core._validate import check_bool, check_callback, check_int, check_positions, read_only
from ..runtime._generate import (
    GeneratedSequence,
    GenerationInputs,
    GenerationStats,
    kv_pool_arguments,
    prepare_generation,
    run_generation,
    token_arrays,
)
from ..runtime.backends import (
    Backend,
    BackendFactory,
    check_is_backend,
    load_backend,
    max_positions,
    relative_tolerance,
)
from ..runtime.execute import (
    DispatchDone,
    TokenIds,
    execute_schedule_with_options,
)

__all__ = [
    "DEFAULT_RESOURCES",
    "BatchProgress",
    "RayGenerationResult",
    "RayPrefillResult",
    "RayReplicas",
    "ReplicaError",
    "ReplicaProgress",
    "default_resources",
    "ray_output_to_stderr",
    "ray_session",
]

Job = Literal["prefill", "generate"]
IntArray = npt.NDArray[np.int64]

#: What one replica's actor asks of the cluster, per backend name; any other backend (and a
#: factory passed directly) asks for one CPU. ``NPU`` is Ray's own Ascend accelerator
#: resource: Ray sets ``ASCEND_RT_VISIBLE_DEVICES`` for the actor.
DEFAULT_RESOURCES: Mapping[str, Mapping[str, float]] = MappingProxyType(
    {"npu": MappingProxyType({"NPU": 1.0})}
)
#: What a replica of any other backend asks for.
_ONE_CPU: Mapping[str, float] = MappingProxyType({"CPU": 1.0})

#: Ray errors that mean an actor (or the node holding it, or its result) is gone: the part
#: it was running is resubmitted to a new actor.
_LOST = (ray.exceptions.RayActorError, ray.exceptions.WorkerCrashedError,
         ray.exceptions.ObjectLostError)  # fmt: skip


#: How long :func:`ray_session` waits for a ``host:port`` address to accept a connection.
_PROBE_SECONDS = 10.0


class ReplicaError(BackendError):
    """The Ray cluster could not provide the replicas asked for, or kept losing them."""


def default_resources(
    backend: str | BackendFactory,
    options: Mapping[str, Any] | None = None,
    *,
    cluster: Mapping[str, float] | None = None,
) -> Mapping[str, float]:
    """What one replica of ``backend`` built with ``options`` asks Ray for: its entry of
    :data:`DEFAULT_RESOURCES`, else one CPU.

    The ``npu`` backend runs on the CPU where it finds no NPU, or with the option
    ``device="cpu"``; it then asks for a CPU: with that option, and (unless it says
    ``device="npu"``) when the ``cluster``'s resources (:func:`ray.cluster_resources`,
    when given) hold no NPU, so that it runs on a machine without one instead of waiting
    for an NPU that is not there.
    """
    if not isinstance(backend, str):
        return _ONE_CPU
    wanted = DEFAULT_RESOURCES.get(backend, _ONE_CPU)
    if "NPU" not in wanted:
        return wanted
    device = str((options or {}).get("device", "auto")).lower()
    if device == "cpu" or (device != "npu" and cluster is not None and not cluster.get("NPU")):
        return _ONE_CPU
    return wanted


def ray_output_to_stderr() -> None:
    """Send what Ray's driver prints about its cluster to stderr, never to stdout.

    The driver prints the cluster's messages (``(raylet) A worker died ...`` when an actor's
    process dies, autoscaler notes) and, with ``log_to_driver``, the workers' output, all
    through one function of ``ray._private.worker`` that writes everything but a worker's
    stderr to ``sys.stdout``: in a program whose stdout carries data (JSON Lines) that
    corrupts it. This routes all of it to ``sys.stderr``. :func:`ray_session` and
    :class:`RayReplicas` call it; it is idempotent, and lasts for the process.
    """
    worker = ray._private.worker
    printer = worker.print_to_stdstream
    if getattr(printer, "to_stderr", False):
        return

    def to_stderr(data: dict[str, Any], ignore_prefix: bool) -> None:
        printer({**data, "is_err": True}, ignore_prefix)

    to_stderr.to_stderr = True  # type: ignore[attr-defined]
    worker.print_to_stdstream = to_stderr


@contextmanager
def ray_session(address: str | None = None, **init_options: Any) -> Iterator[None]:
    """Join the Ray cluster at ``address`` (``"auto"``: the one this machine belongs to), or
    without one use the running connection, else start a local instance and stop it on exit.
    ``init_options`` go to :func:`ray.init` when this call connects. Ray's own output goes
    to stderr (:func:`ray_output_to_stderr`): stdout is the caller's."""
    if address is not None and not isinstance(address, str):
        raise InvalidInputError.about(
            "address", f"must be a string or None: {address!r} ({type(address).__name__})"
        )
    ray_output_to_stderr()  # (before ray.init, which binds the printer of log_to_driver)
    if ray.is_initialized() and address is None:
        yield
        return
    if ray.is_initialized():
        raise InvalidInputError.about(
            "address", f"must be None when Ray is already connected: {address!r}"
        )
    _probe(address)
    handler = signal.getsignal(signal.SIGTERM)
    try:
        ray.init(address=address, **init_options)
    except (TypeError, AssertionError) as error:  # ray.init checks its options by assert
        raise InvalidInputError.about(
            "init_options", f"were refused by ray.init: {_first_line(error)}"
        ) from None
    except RuntimeError as error:
        if str(error).startswith("Unknown keyword argument"):
            raise InvalidInputError.about("init_options", _first_line(error)) from None
        raise ReplicaError(
            f"could not join the Ray cluster at {address!r}: {_first_line(error)}"
        ) from None
    except (ConnectionError, ValueError) as error:
        raise ReplicaError(
            f"could not join the Ray cluster at {address!r}: {_first_line(error)}"
        ) from None
    # ray.init puts in its own SIGTERM handler, which prints a stack and exits with status 1;
    # one the caller had set (the CLI's ends a run as Ctrl-C does) is given back.
    if callable(handler) and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        ray.shutdown()


def _probe(address: str | None) -> None:
    """Refuse at once a ``host:port`` address where nothing accepts a connection: ray.init
    would wait for it for minutes."""
    if address is None:
        return
    host, colon, port = address.removeprefix("ray://").rpartition(":")
    if not colon or not port.isdigit() or not host:
        return  # "auto", "local" and whatever else ray.init reads itself
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=_PROBE_SECONDS).close()
    except (OSError, OverflowError) as error:
        raise ReplicaError(
            f"could not join the Ray cluster at {address!r}: nothing accepts a connection at "
            f"{host}:{port} ({_first_line(error)})"
        ) from None


# -- values -------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class ReplicaProgress:
    """What one replica has done of its part."""

    replica: int
    num_requests: int
    num_requests_done: int
    #: Prefill: prompt tokens; generation: tokens to generate (``max_new_tokens``, an upper
    #: bound when stop tokens end requests early).
    num_tokens: int
    num_tokens_done: int
    #: How often its actor was replaced.
    num_restarts: int

    @property
    def fraction(self) -> float:
        """Share of its tokens done, in ``[0, 1]`` (1 for an empty part)."""
        return self.num_tokens_done / self.num_tokens if self.num_tokens else 1.0


@attrs.frozen(kw_only=True)
class BatchProgress:
    """Told to ``on_progress``: what every replica has done so far."""

    job: Job
    replicas: tuple[ReplicaProgress, ...]

    @property
    def num_requests(self) -> int:
        return sum(r.num_requests for r in self.replicas)

    @property
    def num_requests_done(self) -> int:
        return sum(r.num_requests_done for r in self.replicas)

    @property
    def num_tokens(self) -> int:
        return sum(r.num_tokens for r in self.replicas)

    @property
    def num_tokens_done(self) -> int:
        return sum(r.num_tokens_done for r in self.replicas)

    @property
    def spread(self) -> float:
        """How far the busiest replica is behind the most advanced one, as a share of their
        tokens: ``max(fraction) - min(fraction)`` over non-empty replicas."""
        fractions = [r.fraction for r in self.replicas if r.num_requests]
        return max(fractions) - min(fractions) if fractions else 0.0


@attrs.frozen(kw_only=True, eq=False)
class RayPrefillResult:
    """A prefill run on replicas, in request (input) order."""

    #: ``[num_requests]`` greedy next token of every request (read-only).
    greedy_token_ids: IntArray
    #: ``[num_requests, vocab_size]`` final logits (read-only), or ``None`` if not asked for.
    logits: npt.NDArray[np.floating[Any]] | None
    partition: Partition
    #: Per replica: dispatches of its part's schedule.
    num_dispatches: tuple[int, ...]
    #: Actors replaced during the run.
    num_restarts: int
    wall_seconds: float


@attrs.frozen(kw_only=True, eq=False)
class RayGenerationResult:
    """A generation run on replicas, in request (input) order."""

    #: One per prompt; ``first_token_dispatch`` counts the dispatches of its own replica.
    sequences: tuple[GeneratedSequence, ...]
    partition: Partition
    #: Per replica: the statistics of its part (``None`` for an empty part).
    stats: tuple[GenerationStats | None, ...]
    num_restarts: int
    wall_seconds: float

    @property
    def total_stats(self) -> GenerationStats:
        """The replicas' statistics as one run: counts summed, first tokens over every
        request (each counted on its own replica), the job's wall time, and the longest
        planning time of a replica (they plan in parallel)."""
        parts = [s for s in self.stats if s is not None]
        requests = [int(part.size) for part, s in zip(self.partition.parts, self.stats,
                                                        strict=True) if s is not None]  # fmt: skip
        return GenerationStats(
            num_dispatches=sum(s.num_dispatches for s in parts),
            num_mixed_dispatches=sum(s.num_mixed_dispatches for s in parts),
            num_preemptions=sum(s.num_preemptions for s in parts),
            num_prompt_tokens=sum(s.num_prompt_tokens for s in parts),
            num_generated_tokens=sum(s.num_generated_tokens for s in parts),
            num_computed_tokens=sum(s.num_computed_tokens for s in parts),
            mean_time_to_first_token=sum(
                s.mean_time_to_first_token * n for s, n in zip(parts, requests, strict=True)
            )
            / sum(requests),
            max_time_to_first_token=max(s.max_time_to_first_token for s in parts),
            wall_seconds=self.wall_seconds,
            planning_seconds=max(s.planning_seconds for s in parts),
        )


# -- the actor ----------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class _Facts:
    """What a replica tells the driver of its backend once it is built."""

    name: str
    vocab_size: int
    max_position_embeddings: int | None
    tolerance: float
    relative_tolerance: float


class _Replica:
    """One replica: a backend built once, running one part at a time (a Ray actor)."""

    def __init__(self, backend: str | BackendFactory, options: Mapping[str, Any]) -> None:
        # A backend that cannot be built is reported by every call, as the backend's own
        # error: an actor whose constructor raises dies, and a death would be retried.
        self._error: Exception | None = None
        self._backend: Backend | None = None
        try:
            built = (
                load_backend(backend, **options) if isinstance(backend, str) else backend(**options)
            )
            check_is_backend(built)
            self._backend = built
        except Exception as error:
            self._error = error
        self._done = (-1, 0, 0)  # part, requests done, tokens done

    def ready(self) -> _Facts:
        """What the driver reads of the backend, once it is built."""
        backend = self._get()
        return _Facts(
            name=backend.name,
            vocab_size=backend.vocab_size,
            max_position_embeddings=max_positions(backend),
            tolerance=float(backend.tolerance),
            relative_tolerance=relative_tolerance(backend),
        )

    def progress(self) -> tuple[int, int, int]:
        return self._done

    def prefill(
        self,
        part: int,
        prompts: list[IntArray],
        indices: list[int],
        config: PlannerConfig,
        return_logits: bool,
        page_size: int | None,
    ) -> tuple[IntArray, npt.NDArray[np.floating[Any]] | None, int]:
        self._done = (part, 0, 0)
        schedule = plan_prefill([len(p) for p in prompts], config)
        tokens = [0]

        def on_dispatch(done: DispatchDone) -> None:
            tokens[0] += done.num_tokens
            self._done = (part, done.num_finished, tokens[0])

        # (Requests named by their indices in the batch, as in generate.)
        result = execute_schedule_with_options(
            schedule,
            self._get(),
            prompts,
            input_embeddings=None,
            return_logits=return_logits,
            return_greedy=True,
            block_tables=None,
            page_size=page_size,
            cache=None,
            on_dispatch=on_dispatch,
            names=indices,
        )
        assert result.greedy_token_ids is not None  # asked for, so execute_schedule returns them
        return result.greedy_token_ids, result.logits, schedule.num_dispatches

    def generate(
        self, part: int, inputs: GenerationInputs
    ) -> tuple[tuple[GeneratedSequence, ...], GenerationStats]:
        self._done = (part, 0, 0)

        def on_dispatch(done: DispatchDone) -> None:
            self._done = (part, done.num_finished, done.num_generated_tokens)

        result = run_generation(self._get(), attrs.evolve(inputs, on_dispatch=on_dispatch))
        return result.sequences, result.stats

    def _get(self) -> Backend:
        if self._error is not None:
            raise self._error
        assert self._backend is not None
        return self._backend


# -- the driver ---------------------------------------------------------------------------


class _JobRun:
    """One job in progress on the replicas: which parts wait, run and are done."""

    def __init__(self, job: Job, partition: Partition, part_tokens: list[int]) -> None:
        self.job = job
        self.partition = partition
        self.part_tokens = part_tokens
        self.queue = collections.deque(i for i, p in enumerate(partition.parts) if p.size)
        self.running: dict[Any, int] = {}  # a part's result ref -> the part (= replica)
        self.losses = [0] * partition.num_parts  # actors each part lost
        self.done = [(0, 0)] * partition.num_parts  # per part: requests, tokens done
        self.outputs: dict[int, Any] = {}
        self.reported: BatchProgress | None = None

    def progress(self) -> BatchProgress:
        return BatchProgress(
            job=self.job,
            replicas=tuple(
                ReplicaProgress(
                    replica=i,
                    num_requests=int(part.size),
                    num_requests_done=self.done[i][0],
                    num_tokens=self.part_tokens[i],
                    num_tokens_done=min(self.done[i][1], self.part_tokens[i]),
                    num_restarts=self.losses[i],
                )
                for i, part in enumerate(self.partition.parts)
            ),
        )


class RayReplicas:
    """``num_replicas`` Ray actors, each holding one ``backend`` built with ``options``.

    ``backend`` is a registered backend's name (or a factory, pickled to the actors);
    ``resources`` what one actor asks Ray for (default: :func:`default_resources`), as
    ``{"CPU": 1}``, ``{"GPU": 1}``, ``{"NPU": 1}`` or any custom resource. Ray must be
    connected (:func:`ray_session`). Use it as a context manager, or call :meth:`close`.
    """

    def __init__(
        self,
        backend: str | BackendFactory,
        *,
        num_replicas: int,
        options: Mapping[str, Any] | None = None,
        resources: Mapping[str, float] | None = None,
        max_restarts: int = 3,
        start_timeout: float = 300.0,
        poll_seconds: float = 0.2,
    ) -> None:
        if not isinstance(backend, str) and not callable(backend):
            raise InvalidInputError.about(
                "backend",
                f"must be a backend's name or a factory: {backend!r} ({type(backend).__name__})",
            )
        self.num_replicas = check_int("num_replicas", num_replicas, min_value=1)
        self.max_restarts = check_int("max_restarts", max_restarts, min_value=0)
        self.start_timeout = _seconds("start_timeout", start_timeout)
        self.poll_seconds = _seconds("poll_seconds", poll_seconds)
        for name, value in (("options", options), ("resources", resources)):
            if value is not None and not isinstance(value, Mapping):
                raise InvalidInputError.about(
                    name, f"must be a mapping or None: {value!r} ({type(value).__name__})"
                )
        if not ray.is_initialized():
            raise ReplicaError("Ray is not connected: use ray_session() or ray.init() first")
        ray_output_to_stderr()
        if resources is None:
            resources = default_resources(backend, options, cluster=_totals())
        self.resources = dict(resources)
        for key, amount in self.resources.items():
            if not isinstance(amount, int | float) or not math.isfinite(amount) or amount < 0:
                raise InvalidInputError.about(
                    "resources", f"must map names to finite amounts >= 0: {key!r}: {amount!r}"
                )
            if key in _NOT_ACTOR_RESOURCES:
                raise InvalidInputError.about(
                    "resources",
                    f"cannot ask for {key!r}: Ray reserves it (an actor asks for CPU, GPU, "
                    "memory and custom resources)",
                )
        _check_room(self.resources, self.num_replicas)
        cpus = self.resources.get("CPU", 0.0)
        gpus = self.resources.get("GPU", 0.0)
        memory = self.resources.get("memory")
        custom = {k: v for k, v in self.resources.items() if k not in ("CPU", "GPU", "memory")}
        self._actor_class = ray.remote(_Replica).options(
            num_cpus=cpus,
            num_gpus=gpus,
            memory=None if memory is None else int(memory),
            resources=custom,
            max_concurrency=2,
        )
        self._backend = backend
        self._options = dict(options or {})
        _check_portable(backend, self._options)
        self._actors: list[Any] = []
        try:
            for _ in range(self.num_replicas):
                self._actors.append(self._start())
            facts = self._wait_ready()
            #: The backend's registered name, vocabulary size, and longest sequence it takes
            #: (its ``max_position_embeddings``; ``None`` when it does not say).
            self.name = facts.name
            self.vocab_size = facts.vocab_size
            self.max_position_embeddings = facts.max_position_embeddings
            #: The logits difference it promises: ``tolerance`` plus ``relative_tolerance``
            #: times the largest |logit| (see :func:`~pypto_sched.compare_results`).
            self.tolerance = facts.tolerance
            self.relative_tolerance = facts.relative_tolerance
        except BaseException:
            self.close()  # no actor outlives a pool that failed to start
            raise

    @property
    def actors(self) -> tuple[Any, ...]:
        """The actor handles, one per replica (for monitoring and fault drills)."""
        return tuple(self._actors)

    def __enter__(self) -> RayReplicas:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop every actor."""
        for actor in self._actors:
            ray.kill(actor)
        self._actors = []

    # -- the two jobs --

    def prefill(
        self,
        prompts: TokenIds,
        *,
        config: PlannerConfig,
        return_logits: bool = False,
        page_size: int | None = None,
        on_progress: Callable[[BatchProgress], None] | None = None,
    ) -> RayPrefillResult:
        """Prefill every prompt on the replicas; greedy next tokens (and logits when asked)
        in input order."""
        tokens = self._prompts(prompts)
        check_config(config)
        return_logits = check_bool("return_logits", return_logits)
        if page_size is not None:
            check_int("page_size", page_size, min_value=1)
        check_callback("on_progress", on_progress)
        for r, prompt in enumerate(tokens):  # execute_schedule's check, named in the batch
            check_positions(f"'prompts[{r}]'", prompt.size, self.max_position_embeddings)
        lengths = np.array([p.size for p in tokens], dtype=np.int64)
        partition = partition_requests(lengths, self.num_replicas)
        start = time.perf_counter()
        outputs, restarts = self._run(
            "prefill",
            partition,
            [int(lengths[part].sum()) for part in partition.parts],
            lambda actor, i, part: actor.prefill.remote(
                i,
                [tokens[r] for r in part.tolist()],
                part.tolist(),
                config,
                return_logits,
                page_size,
            ),
            on_progress,
        )
        greedy = np.zeros(len(tokens), dtype=np.int64)
        logits: npt.NDArray[np.floating[Any]] | None = None
        dispatches = [0] * self.num_replicas
        for i, (ids, part_logits, count) in outputs.items():
            part = partition.parts[i]
            greedy[part] = ids
            dispatches[i] = count
            if part_logits is not None:
                if logits is None:
                    logits = np.zeros((len(tokens), part_logits.shape[1]), part_logits.dtype)
                logits[part] = part_logits
        return RayPrefillResult(
            greedy_token_ids=read_only(greedy),
            logits=None if logits is None else read_only(logits),
            partition=partition,
            num_dispatches=tuple(dispatches),
            num_restarts=restarts,
            wall_seconds=time.perf_counter() - start,
        )

    def generate(
        self,
        prompts: TokenIds,
        *,
        config: PlannerConfig,
        max_new_tokens: int | Sequence[int] | None = None,
        sampling: SamplingParams | Sequence[SamplingParams] | None = None,
        stop_token_ids: Collection[int] = (),
        request_stop_token_ids: Sequence[Collection[int]] | None = None,
        num_kv_pages: int | None = None,
        kv_page_size: int | None = None,
        on_progress: Callable[[BatchProgress], None] | None = None,
        num_pages: int | None = None,
        page_size: int | None = None,
    ) -> RayGenerationResult:
        """:func:`~pypto_sched.generate` on the replicas; ``num_kv_pages`` is each replica's KV
        pool (default: what a step's rows can use, from its part's requests). Sequences in
        input order. ``num_pages`` and ``page_size`` are the retired names of
        ``num_kv_pages`` and ``kv_page_size``, as in ``generate``."""
        num_kv_pages, kv_page_size = kv_pool_arguments(
            "RayReplicas.generate",
            num_kv_pages,
            kv_page_size,
            num_pages=num_pages,
            page_size=page_size,
        )
        # generate()'s checks, on the whole batch before any part runs: a part would name its
        # requests by their place in the part.
        inputs = prepare_generation(
            prompts,
            vocab_size=self.vocab_size,
            max_positions=self.max_position_embeddings,
            config=config,
            max_new_tokens=max_new_tokens,
            sampling=sampling,
            stop_token_ids=stop_token_ids,
            request_stop_token_ids=request_stop_token_ids,
            num_kv_pages=num_kv_pages,
            kv_page_size=kv_page_size,
        )
        check_callback("on_progress", on_progress)
        news = np.array(inputs.max_new_tokens, dtype=np.int64)
        lengths = np.array([p.size for p in inputs.prompts], dtype=np.int64)
        partition = partition_requests(lengths, self.num_replicas, weights=lengths + news)

        def submit(actor: Any, i: int, part: IntArray) -> Any:
            return actor.generate.remote(i, inputs.part(part.tolist()))

        start = time.perf_counter()
        outputs, restarts = self._run(
            "generate", partition, [int(news[part].sum()) for part in partition.parts],
            submit, on_progress,
        )  # fmt: skip
        sequences: list[GeneratedSequence | None] = [None] * len(lengths)
        stats: list[GenerationStats | None] = [None] * self.num_replicas
        for i, (part_sequences, part_stats) in outputs.items():
            for r, sequence in zip(partition.parts[i].tolist(), part_sequences, strict=True):
                sequences[r] = sequence
            stats[i] = part_stats
        assert all(s is not None for s in sequences)  # every part completed
        return RayGenerationResult(
            sequences=tuple(s for s in sequences if s is not None),
            partition=partition,
            stats=tuple(stats),
            num_restarts=restarts,
            wall_seconds=time.perf_counter() - start,
        )

    # -- running parts, replacing dead actors --

    def _run(
        self,
        job: Job,
        partition: Partition,
        part_tokens: list[int],
        submit: Callable[[Any, int, IntArray], Any],
        on_progress: Callable[[BatchProgress], None] | None,
    ) -> tuple[dict[int, Any], int]:
        """Run every non-empty part, part ``i`` on actor ``i``; return each part's output
        and how many actors were replaced."""
        if not self._actors:
            raise ReplicaError("the replicas are closed")
        run = _JobRun(job, partition, part_tokens)
        try:
            while run.queue or run.running:
                while run.queue:
                    i = run.queue.popleft()
                    run.running[submit(self._actors[i], i, partition.parts[i])] = i
                ready, _ = ray.wait(list(run.running), num_returns=1, timeout=self.poll_seconds)
                for ref in ready:
                    self._collect(run, ref)
                if on_progress is not None:
                    self._poll(run)
                    progress = run.progress()
                    if progress != run.reported:
                        on_progress(progress)
                        run.reported = progress
        except BaseException:
            self._cancel(run.running)  # the job failed: stop the other parts' work
            raise
        return run.outputs, sum(run.losses)

    def _collect(self, run: _JobRun, ref: Any) -> None:
        """File a finished part's output; requeue it on a new actor if its actor died."""
        i = run.running.pop(ref)
        try:
            run.outputs[i] = ray.get(ref)
        except _LOST as error:
            run.losses[i] += 1
            self._replace(i)  # the pool stays whole, whether the job goes on or fails
            if run.losses[i] > self.max_restarts:
                raise ReplicaError(
                    f"replica {i} lost its actor {run.losses[i]} times (max_restarts "
                    f"{self.max_restarts}): {_first_line(error)}"
                ) from None
            run.done[i] = (0, 0)
            run.queue.append(i)
        except ray.exceptions.RayTaskError as error:
            raise _cause(error)  # noqa: B904 (its own cause is kept)
        else:
            run.done[i] = (int(run.partition.parts[i].size), run.part_tokens[i])

    def _poll(self, run: _JobRun) -> None:
        """Ask each busy actor how far its part is (a dead one just does not answer)."""
        asked = {self._actors[i].progress.remote(): i for i in run.running.values()}
        if not asked:
            return
        answered, _ = ray.wait(list(asked), num_returns=len(asked), timeout=self.poll_seconds)
        for ref in answered:
            try:
                part, requests, tokens = ray.get(ref)
            except ray.exceptions.RayError:
                continue
            if part == asked[ref]:
                run.done[part] = (requests, tokens)

    def _cancel(self, running: Mapping[Any, int]) -> None:
        """Stop the other parts' work: their actors are replaced, the job having failed."""
        for i in running.values():
            self._replace(i)

    def _start(self) -> Any:
        return self._actor_class.remote(self._backend, self._options)

    def _replace(self, i: int) -> None:
        ray.kill(self._actors[i])
        self._actors[i] = self._start()

    def _wait_ready(self) -> _Facts:
        refs = [actor.ready.remote() for actor in self._actors]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=self.start_timeout)
        if len(ready) < len(refs):
            raise ReplicaError(
                f"{len(refs) - len(ready)} of {len(refs)} replicas were not ready within "
                f"start_timeout {self.start_timeout:g} s (each asks for {self.resources}; the "
                f"cluster has {_totals()} available {_available()})"
            )
        try:
            answers: list[_Facts] = ray.get(refs)
        except ray.exceptions.RayTaskError as error:
            raise _cause(error)  # noqa: B904 (its own cause is kept)
        except _LOST as error:  # its process died while building the backend
            raise ReplicaError(
                f"a replica's actor died while it started: {_first_line(error)}"
            ) from None
        return answers[0]

    def _prompts(self, prompts: TokenIds) -> list[IntArray]:
        """``prompts`` as :func:`~pypto_sched.generate` reads them, as read-only arrays."""
        return token_arrays("prompts", prompts, vocab_size=self.vocab_size)


#: Resource names an actor cannot ask Ray for.
_NOT_ACTOR_RESOURCES = frozenset({"object_store_memory", "bundle"})


def _check_portable(backend: str | BackendFactory, options: Mapping[str, Any]) -> None:
    """Refuse a backend factory or an option that cannot be sent to the actors."""
    named = [
        ("backend", "'backend'", backend),
        *(("options", f"option {key!r}", v) for key, v in options.items()),
    ]
    for parameter, name, value in named:
        try:
            ray.cloudpickle.dumps(value)  # type: ignore[no-untyped-call]
        except Exception as error:
            raise InvalidInputError(
                f"{name} cannot be sent to the Ray actors (it does not pickle): "
                f"{_first_line(error)}",
                parameter=parameter,
            ) from None


def _seconds(name: str, value: object) -> float:
    """``value``, a finite number of seconds > 0, as a float; or an
    :class:`InvalidInputError` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        raise InvalidInputError.about(
            name, f"must be a number of seconds > 0: {value!r} ({type(value).__name__})"
        )
    try:
        seconds = float(value)
    except OverflowError:  # an int beyond every float
        seconds = math.inf
    if not math.isfinite(seconds) or seconds <= 0:
        raise InvalidInputError.about(name, f"must be a finite number of seconds > 0: {value!r}")
    return seconds


def _check_room(resources: Mapping[str, float], num_replicas: int) -> None:
    """Raise :class:`ReplicaError` when the cluster's nodes cannot hold ``num_replicas``
    actors asking ``resources`` each, counting whole actors per node."""
    needed = {name: amount for name, amount in resources.items() if amount > 0}
    if not needed:
        return
    room = 0
    for node in ray.nodes():  # type: ignore[no-untyped-call]
        if node.get("Alive"):
            have = node.get("Resources", {})
            room += min(int(have.get(name, 0.0) // amount) for name, amount in needed.items())
    if room < num_replicas:
        totals = _totals()
        absent = sorted(name for name in needed if not totals.get(name))
        advice = (
            f"; it has no {' or '.join(map(repr, absent))} at all: ask each replica for what "
            "it has (resources=, --replica-resource; e.g. CPU=1, where the backend runs on "
            "the CPU), or join a cluster that has it (ray_session(address), --ray-address)"
            if absent
            else ""
        )
        raise ReplicaError(
            f"{num_replicas} replicas asking {dict(needed)} each do not fit the "
            f"Ray cluster: its nodes have room for {room} (cluster resources {totals})"
            f"{advice}"
        )


def _totals() -> dict[str, float]:
    totals = ray.cluster_resources()  # type: ignore[no-untyped-call]
    return {k: v for k, v in totals.items() if not k.startswith("node:")}


def _available() -> dict[str, float]:
    available = ray.available_resources()  # type: ignore[no-untyped-call]
    return {k: v for k, v in available.items() if not k.startswith("node:")}


def _cause(error: ray.exceptions.RayTaskError) -> BaseException:
    """The exception raised inside the actor (a RayTaskError also *is* one, but prints the
    remote traceback in its message)."""
    cause = error.cause
    if not isinstance(cause, BaseException):
        return error
    # Raised as it is: its own cause (the backend's exception under an ExecutionError) is
    # kept, and the RayTaskError it is raised from is not shown.
    cause.__suppress_context__ = True
    return cause


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0] if text else ''}"
