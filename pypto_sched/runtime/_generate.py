"""The generation driver: plan each step, run it on a backend, sample, repeat.

:func:`generate` owns no scheduling rule: every dispatch comes from
:func:`~pypto_sched.plan_generation_step` (decode rows first, prefill chunks by the online
planner, admission by free KV pages, preemption by recomputation), and every token from
:func:`~pypto_sched.sample_token` (greedy asks the backend for its argmax instead, so that no
logits cross to the host). The driver keeps each request's tokens, feeds each row the tokens
of its positions (a recomputing request's generated tokens included), stops a request on
``max_new_tokens``, a stop token or a stop string (each request's
:class:`~pypto_sched.SamplingParams` says which), and reports what happened, each request as
it finishes.

Like :func:`~pypto_sched.execute_schedule`, it checks every backend output and stops with an
:class:`~pypto_sched.ExecutionError` naming the dispatch on the first failure, a backend's
``SystemExit`` included (raised through, it would end the caller's program, as a success
when its code is 0); a ``KeyboardInterrupt`` passes through unchanged.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, Literal, cast

import attrs
import numpy as np
import numpy.typing as npt

from ..core._config import PlannerConfig, check_config
from ..core._errors import InvalidConfigError, InvalidInputError, PyptoSchedError
from ..core._generation import GenerationState, GenerationStep, plan_generation_step
from ..core._pool import PagePool
from ..core._sampling import DEFAULT_MAX_TOKENS, SamplingParams, sample_token, token_logprobs
from ..core._validate import (
    MAX_TOKENS,
    arrays_stay_read_only,
    check_callback,
    check_int,
    check_positions,
    is_int,
    read_only,
    retired_argument,
)
from .backends import Backend, DispatchInput, check_is_backend, make_cache, max_positions
from .execute import (
    DEFAULT_PAGE_SIZE,
    DispatchDone,
    TokenIds,
    run_dispatch_checked,
    token_array,
)

__all__ = ["GeneratedSequence", "GenerationResult", "GenerationStats", "generate"]

FinishReason = Literal["length", "stop"]


@arrays_stay_read_only
@attrs.frozen(kw_only=True)
class GeneratedSequence:
    """What one request generated."""

    #: The generated token ids (read-only), stop token included when one ended it.
    token_ids: npt.NDArray[np.int64] = attrs.field(eq=False)
    #: ``"length"`` (``max_new_tokens`` reached) or ``"stop"`` (a stop token or string).
    finish_reason: FinishReason
    #: What stopped it: the stop token id or the stop string; ``None`` for ``"length"``.
    stop_reason: int | str | None = None
    #: The index of the dispatch that gave its first token, counted from 0 (as
    #: ``DispatchDone.index``); ``GenerationStats``' time to first token counts from 1.
    first_token_dispatch: int
    #: How often it was preempted (and recomputed).
    num_preemptions: int
    #: With ``SamplingParams.logprobs``: each generated token's log-probability (read-only),
    #: and the likeliest tokens' ids and log-probabilities at each step, one row a token.
    logprobs: npt.NDArray[np.float64] | None = attrs.field(default=None, eq=False)
    top_token_ids: npt.NDArray[np.int64] | None = attrs.field(default=None, eq=False)
    top_logprobs: npt.NDArray[np.float64] | None = attrs.field(default=None, eq=False)


@attrs.frozen(kw_only=True)
class GenerationStats:
    """What a generation cost, counted in dispatches and, for throughput, in wall time."""

    num_dispatches: int
    #: Dispatches holding both decode rows and prefill chunks.
    num_mixed_dispatches: int
    num_preemptions: int
    num_prompt_tokens: int
    num_generated_tokens: int
    #: Tokens run through the model, recomputation included.
    num_computed_tokens: int
    #: Mean and worst dispatch that gave a request its first token, counted from 1 (the
    #: number of dispatches run until then): ``GeneratedSequence.first_token_dispatch + 1``.
    mean_time_to_first_token: float
    max_time_to_first_token: int
    wall_seconds: float
    #: Seconds spent planning (a share of ``wall_seconds``).
    planning_seconds: float

    @property
    def tokens_per_second(self) -> float:
        """Generated tokens per second of wall time."""
        return self.num_generated_tokens / self.wall_seconds if self.wall_seconds > 0 else 0.0


@attrs.frozen(kw_only=True, eq=False)
class GenerationResult:
    """Every request's output, in input order, and the statistics of the run."""

    sequences: tuple[GeneratedSequence, ...]
    stats: GenerationStats


def generate(
    backend: Backend,
    prompts: TokenIds,
    *,
    config: PlannerConfig,
    max_new_tokens: int | Sequence[int] | npt.NDArray[np.integer[Any]] | None = None,
    sampling: SamplingParams | Sequence[SamplingParams] | None = None,
    stop_token_ids: Collection[int] = (),
    request_stop_token_ids: Sequence[Collection[int]] | None = None,
    num_kv_pages: int | None = None,
    kv_page_size: int | None = None,
    on_dispatch: Callable[[DispatchDone], None] | None = None,
    request_indices: Sequence[int] | npt.NDArray[np.integer[Any]] | None = None,
    on_finish: Callable[[int, GeneratedSequence], None] | None = None,
    detokenize: Callable[[Sequence[int]], str] | None = None,
    on_step: Callable[[DispatchDone], None] | None = None,
    num_pages: int | None = None,
    page_size: int | None = None,
) -> GenerationResult:
    """Generate up to ``max_new_tokens`` tokens (one int, or one per prompt) for each of
    ``prompts`` (token id arrays) on ``backend``, every dispatch planned under ``config``.

    A request stops at ``max_new_tokens`` or at a token of ``stop_token_ids`` (for every
    request, e.g. the EOS ids, unless its ``ignore_eos``) or of its own
    ``request_stop_token_ids[r]`` or ``sampling`` ``stop_token_ids``. ``sampling`` is one
    :class:`~pypto_sched.SamplingParams` for every request or one per request; a request's
    ``max_tokens`` takes the place of ``max_new_tokens`` (give one or the other: a request
    with neither gets :data:`~pypto_sched.DEFAULT_MAX_TOKENS`), and its ``stop`` strings need
    ``detokenize`` (generated ids to text). The KV cache has ``num_kv_pages`` pages (default:
    what a step's rows can use at once, see ``default_num_pages``) of ``kv_page_size`` tokens
    (default: 16); when it holds fewer than every request, requests wait for pages and are
    preempted by recomputation. A pool the backend cannot allocate is an
    :class:`~pypto_sched.InvalidConfigError` before any dispatch.
    ``sampling`` defaults to greedy. Results come back in input order.

    ``request_indices[r]`` is the request index that seeds prompt ``r``'s random stream
    (default: ``r``); a part of a larger batch passes its requests' indices in the batch, so
    that sampling does not depend on how the batch was split, and so that an error from the
    backend names a request by its index in the batch. They must be distinct (two requests
    with one index would draw the same random tokens).

    ``on_finish(r, sequence)`` is told each request as it finishes (``r``: its place in
    ``prompts``), before ``on_dispatch`` hears of the dispatch: a caller that writes results as
    they come keeps every finished request when a later dispatch fails. ``on_dispatch`` is
    told a :class:`~pypto_sched.DispatchDone` after each dispatch.

    ``on_step``, ``num_pages`` and ``page_size`` are the retired names of ``on_dispatch``,
    ``num_kv_pages`` and ``kv_page_size`` (a ``DeprecationWarning``; with the new name too,
    an ``InvalidInputError``).
    """
    old_callback = retired_argument(
        "generate", "on_step", on_step, "on_dispatch", new_given=on_dispatch is not None
    )
    on_dispatch = on_dispatch if old_callback is None else old_callback
    num_kv_pages, kv_page_size = kv_pool_arguments(
        "generate", num_kv_pages, kv_page_size, num_pages=num_pages, page_size=page_size
    )
    check_is_backend(backend)
    inputs = prepare_generation(
        prompts,
        vocab_size=backend.vocab_size,
        max_positions=max_positions(backend),
        config=config,
        max_new_tokens=max_new_tokens,
        sampling=sampling,
        stop_token_ids=stop_token_ids,
        request_stop_token_ids=request_stop_token_ids,
        num_kv_pages=num_kv_pages,
        kv_page_size=kv_page_size,
        on_dispatch=on_dispatch,
        request_indices=request_indices,
        on_finish=on_finish,
        detokenize=detokenize,
    )
    return run_generation(backend, inputs)


def kv_pool_arguments(
    where: str,
    num_kv_pages: int | None,
    kv_page_size: int | None,
    *,
    num_pages: int | None,
    page_size: int | None,
) -> tuple[int | None, int]:
    """``where``'s KV pool arguments ``(num_kv_pages, kv_page_size)`` given under their new
    or retired names (see :func:`~pypto_sched.core._validate.retired_argument`), the page size
    defaulting to
    :data:`DEFAULT_PAGE_SIZE`."""
    # (stacklevel 3: the warning is the caller of `where`'s, two frames above this one.)
    old_pages = retired_argument(
        where, "num_pages", num_pages, "num_kv_pages", new_given=num_kv_pages is not None,
        stacklevel=3,
    )  # fmt: skip
    old_size = retired_argument(
        where, "page_size", page_size, "kv_page_size", new_given=kv_page_size is not None,
        stacklevel=3,
    )  # fmt: skip
    num_kv_pages = num_kv_pages if old_pages is None else old_pages
    kv_page_size = kv_page_size if old_size is None else old_size
    return num_kv_pages, DEFAULT_PAGE_SIZE if kv_page_size is None else kv_page_size


@attrs.frozen(kw_only=True, eq=False)
class GenerationInputs:
    """The arguments of one :func:`generate` call, checked, one entry a request: what
    :func:`prepare_generation` returns and :func:`run_generation` runs.

    A driver that splits a batch (the Ray replicas) prepares the whole batch once, so that
    every check runs once and an error names a request by its index in the batch, and runs
    a :meth:`part` of it on each device.
    """

    config: PlannerConfig
    #: Each request's prompt token ids (read-only arrays).
    prompts: tuple[npt.NDArray[np.int64], ...]
    #: Each request's new tokens: ``max_new_tokens``' or its params' ``max_tokens``.
    max_new_tokens: tuple[int, ...]
    params: tuple[SamplingParams, ...]
    #: Each request's stop tokens: the common ones (unless its ``ignore_eos``), its own and
    #: its params'.
    stop_token_ids: tuple[frozenset[int], ...]
    #: Each request's index in the batch: the seed of its random stream, its name in errors.
    request_indices: tuple[int, ...]
    #: The KV pool: ``None`` is :func:`default_num_pages` of the requests run.
    num_kv_pages: int | None
    kv_page_size: int
    on_dispatch: Callable[[DispatchDone], None] | None
    on_finish: Callable[[int, GeneratedSequence], None] | None
    detokenize: Callable[[Sequence[int]], str] | None

    def part(self, rows: Sequence[int]) -> GenerationInputs:
        """The requests ``rows`` alone, in that order, each keeping its index in the batch
        (so its random stream and its name in errors); without the callbacks but
        ``detokenize``, which are the caller's of the whole batch."""
        return attrs.evolve(
            self,
            prompts=tuple(self.prompts[r] for r in rows),
            max_new_tokens=tuple(self.max_new_tokens[r] for r in rows),
            params=tuple(self.params[r] for r in rows),
            stop_token_ids=tuple(self.stop_token_ids[r] for r in rows),
            request_indices=tuple(self.request_indices[r] for r in rows),
            on_dispatch=None,
            on_finish=None,
        )


def prepare_generation(
    prompts: TokenIds,
    *,
    vocab_size: int,
    max_positions: int | None,
    config: PlannerConfig,
    max_new_tokens: int | Sequence[int] | npt.NDArray[np.integer[Any]] | None = None,
    sampling: SamplingParams | Sequence[SamplingParams] | None = None,
    stop_token_ids: Collection[int] = (),
    request_stop_token_ids: Sequence[Collection[int]] | None = None,
    num_kv_pages: int | None = None,
    kv_page_size: int = DEFAULT_PAGE_SIZE,
    on_dispatch: Callable[[DispatchDone], None] | None = None,
    request_indices: Sequence[int] | npt.NDArray[np.integer[Any]] | None = None,
    on_finish: Callable[[int, GeneratedSequence], None] | None = None,
    detokenize: Callable[[Sequence[int]], str] | None = None,
) -> GenerationInputs:
    """:func:`generate`'s arguments checked for a backend of ``vocab_size`` tokens whose model
    takes ``max_positions`` positions (``None``: it does not say), every request against the
    model and, alone, against the KV pool; an :class:`InvalidInputError` (or
    :class:`InvalidConfigError`) naming the argument and the request if not."""
    check_config(config)
    tokens = token_arrays("prompts", prompts, vocab_size=vocab_size)
    params = sampling_list(sampling, len(tokens))
    common = _token_set("stop_token_ids", stop_token_ids, vocab_size)
    stops = stop_sets((), request_stop_token_ids, len(tokens), vocab_size=vocab_size)
    for r, p in enumerate(params):
        own = _token_set(f"sampling[{r}].stop_token_ids", p.stop_token_ids, vocab_size)
        stops[r] |= own if p.ignore_eos else own | common  # (ignore_eos: not the common ones)
        if p.stop and detokenize is None:
            raise InvalidInputError.about(
                f"sampling[{r}].stop", f"needs text: pass 'detokenize' (ids to text): {p.stop!r}"
            )
    check_callback("on_dispatch", on_dispatch)
    check_callback("on_finish", on_finish)
    check_callback("detokenize", detokenize)
    seeds = (
        list(range(len(tokens)))
        if request_indices is None
        else per_request_counts(request_indices, len(tokens), name="request_indices", low=0)
    )
    if len(set(seeds)) != len(seeds):  # two requests would draw the same random tokens
        again = next(r for r, seed in enumerate(seeds) if seed in seeds[:r])
        raise InvalidInputError.about(
            "request_indices",
            f"must be distinct: item {again} is {seeds[again]}, as is item "
            f"{seeds.index(seeds[again])}",
        )
    news = _max_new_tokens(max_new_tokens, params)
    kv_page_size = check_int("kv_page_size", kv_page_size, min_value=1)
    if num_kv_pages is not None:
        num_kv_pages = check_int("num_kv_pages", num_kv_pages, min_value=1)
    try:
        check_requests(
            [prompt.size for prompt in tokens],
            news,
            config=config,
            max_positions=max_positions,
            num_pages=num_kv_pages,
            page_size=kv_page_size,
        )
    except PyptoSchedError as error:  # the pool's own names for generate's arguments
        if error.parameter != "num_pages" or error.rule is None:
            raise
        raise type(error).about("num_kv_pages", error.rule) from None
    return GenerationInputs(
        config=config,
        prompts=tuple(tokens),
        max_new_tokens=tuple(news),
        params=tuple(params),
        stop_token_ids=tuple(stops),
        request_indices=tuple(seeds),
        num_kv_pages=num_kv_pages,
        kv_page_size=kv_page_size,
        on_dispatch=on_dispatch,
        on_finish=on_finish,
        detokenize=detokenize,
    )


def run_generation(backend: Backend, inputs: GenerationInputs) -> GenerationResult:
    """Run ``inputs``, checked by :func:`prepare_generation` for ``backend``'s vocabulary and
    positions, on ``backend`` (see :func:`generate`)."""
    run = _Run(backend, inputs)
    state = initial_state(
        [prompt.size for prompt in inputs.prompts],
        inputs.max_new_tokens,
        config=inputs.config,
        num_pages=inputs.num_kv_pages,
        page_size=inputs.kv_page_size,
        count=run.window,
    )
    return run.until_done(state)


def sampling_list(sampling: object, count: int) -> list[SamplingParams]:
    """``sampling`` (``None``: greedy; one :class:`SamplingParams`; or one per request) as
    ``count`` params, or an :class:`InvalidInputError` naming the argument."""
    if sampling is None:
        return [SamplingParams()] * count
    if isinstance(sampling, SamplingParams):
        params = [sampling] * count
    elif not isinstance(sampling, Sequence) or isinstance(sampling, str | bytes):
        raise InvalidInputError.about(
            "sampling",
            f"must be SamplingParams, one per prompt, or None: {type(sampling).__name__}",
        )
    elif len(sampling) != count:
        raise InvalidInputError.about(
            "sampling", f"must have one SamplingParams per prompt ({count}): {len(sampling)}"
        )
    else:
        params = list(sampling)
    for r, p in enumerate(params):
        if not isinstance(p, SamplingParams):
            raise InvalidInputError.about(
                f"sampling[{r}]", f"must be SamplingParams: {type(p).__name__}"
            )
        if p.n != 1:
            raise InvalidInputError.about(
                f"sampling[{r}].n",
                "must be 1: generate runs one sequence a request (LLM.generate runs n of a "
                f"prompt): {p.n}",
            )
    return params


def _max_new_tokens(
    values: int | Sequence[int] | npt.NDArray[np.integer[Any]] | None,
    params: Sequence[SamplingParams],
) -> list[int]:
    """Each request's new tokens: ``max_new_tokens``' or its params' ``max_tokens`` (given
    once), else :data:`DEFAULT_MAX_TOKENS`."""
    news = [None] * len(params) if values is None else per_request_counts(values, len(params))
    resolved = []
    for r, (new, p) in enumerate(zip(news, params, strict=True)):
        if new is not None and p.max_tokens is not None:
            raise InvalidInputError.about(
                "max_new_tokens",
                f"and 'sampling[{r}].max_tokens' both give request {r}'s new tokens ({new} and "
                f"{p.max_tokens}): give one",
            )
        resolved.append(next(n for n in (new, p.max_tokens, DEFAULT_MAX_TOKENS) if n is not None))
    return resolved


#: The fewest requests a generation keeps waiting in its planner state (see
#: :func:`_admission_window`).
MIN_ADMISSION_WINDOW = 4096


def _admission_window(config: PlannerConfig, count: int) -> int:
    """How many of ``count`` requests the planner state holds at the start; the others join
    it in arrival order as it runs, whenever fewer than that many wait in it.

    A request in the state costs about a kilobyte of records and time to build them (a
    million requests: a gigabyte, and minutes of garbage collection), and a larger state
    makes each step's updates deeper; one behind the window costs its place in a list. The
    window (the larger of :data:`MIN_ADMISSION_WINDOW` and four budgets) holds more waiting
    requests than a step can start, so every rule that reads the queue's head plans as with
    the whole batch, and ``round_robin``'s "the whole batch fits one dispatch" is false of
    the window as of the batch; ``packed``'s bound, kept only where the pool holds every
    request of the state whole, is the window's. Batches up to twice the window join at
    once.
    """
    window = max(MIN_ADMISSION_WINDOW, 4 * config.max_num_batched_tokens)
    return count if count <= 2 * window else window


def default_num_pages(
    lengths: Sequence[int], news: Sequence[int], *, config: PlannerConfig, page_size: int
) -> int:
    """The KV pages a generation gets when it names none: what the run can use at once.

    A step runs at most ``max_num_seqs`` rows (at most ``max_num_batched_tokens`` without
    it), so no more requests than that usefully hold pages at once: the pool holds that many
    of the largest request (prompt + new tokens - 1), or every request whole if that is
    fewer pages. It never depends on the number of requests beyond those rows: a million
    one-token prompts get the pool of a step's rows, not a million requests' pages.
    """
    if not lengths:
        return 1
    pages = np.asarray(lengths, dtype=np.int64) + np.asarray(news, dtype=np.int64) - 2
    pages = pages // page_size + 1  # pages of prompt + new - 1 tokens (>= 1)
    rows = min(config.max_num_seqs or config.max_num_batched_tokens, len(lengths))
    return int(min(pages.sum(), rows * pages.max()))


def check_requests(
    lengths: Sequence[int],
    news: Sequence[int],
    *,
    config: PlannerConfig,
    max_positions: int | None,
    num_pages: int | None,
    page_size: int,
) -> None:
    """Check every request of a generation, prompts of ``lengths`` and ``news[r]`` new tokens
    for prompt ``r``, against the model's ``max_positions`` and, alone, against a pool of
    ``num_pages`` pages of ``page_size`` tokens (default: :func:`default_num_pages`); errors
    name a request by its index in ``lengths``."""
    for r, (length, new) in enumerate(zip(lengths, news, strict=True)):
        check_positions(
            f"'prompts[{r}]'", length, max_positions, max_new_tokens=new, parameter="prompts"
        )
    if num_pages is None:
        num_pages = default_num_pages(lengths, news, config=config, page_size=page_size)
    # The state of the requests up to the first that fails raises its error
    # (GenerationState.add's, naming its index); of the first request alone, the pool's.
    contexts = np.asarray(lengths, dtype=np.int64) + np.asarray(news, dtype=np.int64) - 1
    limit = num_pages * page_size if is_int(num_pages) else 0
    failing = np.flatnonzero(contexts > min(limit, MAX_TOKENS))
    end = int(failing[0]) + 1 if failing.size else 1
    GenerationState.from_prompt_lengths(
        lengths[:end], max_new_tokens=news[:end], num_pages=num_pages, page_size=page_size
    )


def initial_state(
    lengths: Sequence[int],
    news: Sequence[int],
    *,
    config: PlannerConfig,
    num_pages: int | None,
    page_size: int,
    count: int,
) -> GenerationState[int]:
    """The state a generation of requests checked by :func:`check_requests` starts from,
    holding the first ``count`` of them, in a pool of ``num_pages`` pages (default:
    :func:`default_num_pages` of every request)."""
    if num_pages is None:
        num_pages = default_num_pages(lengths, news, config=config, page_size=page_size)
    return GenerationState.from_prompt_lengths(
        lengths[:count], max_new_tokens=news[:count], num_pages=num_pages, page_size=page_size
    )


def token_lists(
    name: str, values: object, *, vocab_size: int, allow_empty: bool = False
) -> list[list[int]]:
    """:func:`token_arrays` as lists of ids."""
    return [
        ids.tolist()
        for ids in token_arrays(name, values, vocab_size=vocab_size, allow_empty=allow_empty)
    ]


def token_arrays(
    name: str, values: object, *, vocab_size: int, allow_empty: bool = False
) -> list[npt.NDArray[np.int64]]:
    """``values``, a non-empty sequence of token id arrays (one per request) or a 2-D array of
    one request per row, as read-only arrays of ids in ``[0, vocab_size)``, each holding at
    least one unless ``allow_empty``; or an :class:`InvalidInputError` naming ``name`` and
    the request."""
    if isinstance(values, np.ndarray) and values.ndim == 2 and len(values):
        values = list(values)  # equal-length prompts, one a row; token_array checks the dtype
    if not isinstance(values, Sequence) or isinstance(values, str | bytes) or not values:
        found = type(values).__name__
        if isinstance(values, np.ndarray):
            found += f" of shape {values.shape}"
        raise InvalidInputError.about(
            name,
            "must be a non-empty sequence of token id arrays, or a 2-D array of one per row: "
            f"{found}",
        )
    tokens = [
        token_array(f"{name}[{r}]", ids, vocab_size=vocab_size) for r, ids in enumerate(values)
    ]
    for r, ids in enumerate(tokens):
        if not ids.size and not allow_empty:
            raise InvalidInputError.about(
                f"{name}[{r}]", "must hold at least one token: it is empty"
            )
    return tokens


def per_request_counts(
    values: int | Sequence[int] | npt.NDArray[np.integer[Any]],
    count: int,
    *,
    name: str = "max_new_tokens",
    low: int = 1,
) -> list[int]:
    """One int for every request, or one per request (a sequence or a 1-D array): a list of
    ``count`` ints ``>= low``, or an :class:`InvalidInputError` naming ``name``."""
    if isinstance(values, int | np.integer) and not isinstance(values, bool):
        return [check_int(name, values, min_value=low)] * count
    if isinstance(values, np.ndarray) and values.ndim == 1:
        values = values.tolist()  # NumPy ints become ints; anything else fails check_int
    if not isinstance(values, Sequence) or len(values) != count:
        raise InvalidInputError.about(
            name, f"must be an int or one int per prompt ({count}): {values!r}"
        )
    return [check_int(f"{name}[{r}]", v, min_value=low) for r, v in enumerate(values)]


def stop_sets(
    common: Collection[int],
    per_request: Sequence[Collection[int]] | None,
    count: int,
    *,
    vocab_size: int,
) -> list[frozenset[int]]:
    """Each request's stop tokens: ``common`` and its own ``per_request[r]``, token ids in
    ``[0, vocab_size)`` as prompts' are; or an :class:`InvalidInputError` naming the
    argument."""
    shared = _token_set("stop_token_ids", common, vocab_size)
    if per_request is None:
        return [shared] * count
    if not isinstance(per_request, Sequence) or isinstance(per_request, str | bytes):
        raise InvalidInputError.about(
            "request_stop_token_ids",
            "must be None or one collection of token ids per prompt: "
            f"{per_request!r} ({type(per_request).__name__})",
        )
    if len(per_request) != count:
        raise InvalidInputError.about(
            "request_stop_token_ids",
            f"must have one entry per prompt ({count}): {len(per_request)} entries",
        )
    return [
        shared | _token_set(f"request_stop_token_ids[{r}]", ids, vocab_size)
        for r, ids in enumerate(per_request)
    ]


def _token_set(name: str, ids: object, vocab_size: int) -> frozenset[int]:
    # A mapping is a collection of its keys, which is never what was meant.
    # (A 0-d array claims to be a collection and is not iterable.)
    zero_d = isinstance(ids, np.ndarray) and ids.ndim == 0
    if not isinstance(ids, Collection) or isinstance(ids, str | bytes | Mapping) or zero_d:
        raise InvalidInputError.about(
            name, f"must be a collection of token ids (ints >= 0): {ids!r} ({type(ids).__name__})"
        )
    checked = sorted({check_int(name, t, min_value=0) for t in ids})
    return frozenset(token_array(name, checked, vocab_size=vocab_size).tolist())


class _Run:
    """One generation in progress: the tokens so far and what to report."""

    def __init__(self, backend: Backend, inputs: GenerationInputs) -> None:
        self.backend = backend
        self.news = inputs.max_new_tokens
        self.config = inputs.config
        self.params = inputs.params
        # Each request's tokens so far: its prompt's, then those it generated.
        self.tokens: list[list[int]] = [prompt.tolist() for prompt in inputs.prompts]
        self.prompt_lengths = [len(t) for t in self.tokens]
        self.stops = inputs.stop_token_ids
        self.seeds = inputs.request_indices
        self.on_dispatch = inputs.on_dispatch
        self.on_finish = inputs.on_finish
        self.detokenize = inputs.detokenize
        count = len(self.tokens)
        self.reasons: list[FinishReason | None] = [None] * count
        self.stop_reasons: list[int | str | None] = [None] * count
        self.first_token: list[int] = [-1] * count
        self.preemptions = [0] * count
        # Per request with logprobs: (chosen token's logprob, top ids, top logprobs) a token.
        self.logprobs: list[list[tuple[float, npt.NDArray[np.int64], npt.NDArray[np.float64]]]]
        self.logprobs = [[] for _ in range(count)]
        self.num_dispatches = self.num_mixed = self.num_computed = self.num_generated = 0
        self.num_finished = 0
        self.window = _admission_window(self.config, count)

    def until_done(self, state: GenerationState[int]) -> GenerationResult:
        cache = self.new_cache(state.pool)
        planning = 0.0
        start = time.perf_counter()
        joined = len(state)  # requests 0 .. joined - 1 are (or were) in the state
        while state:
            before = time.perf_counter()
            step = plan_generation_step(state, self.config)
            planning += time.perf_counter() - before
            state = self.run(step, cache)
            # (The requests holding no pages are the waiting ones.)
            if joined < len(self.tokens) and len(state) - len(state.pool) < self.window:
                state, joined = self.admit(state, joined)
        return GenerationResult(
            sequences=tuple(self.sequence(r) for r in range(len(self.tokens))),
            stats=self.stats(wall=time.perf_counter() - start, planning=planning),
        )

    def generated(self, request: int) -> list[int]:
        return self.tokens[request][self.prompt_lengths[request] :]

    def generated_count(self, request: int) -> int:
        """How many tokens ``request`` has generated (its ``generated()``'s length, without
        copying them: asked several times a row a step)."""
        return len(self.tokens[request]) - self.prompt_lengths[request]

    def banned(self, request: int) -> frozenset[int]:
        """The tokens ``request`` may not choose next: its stop tokens, before its
        ``min_tokens``."""
        early = self.generated_count(request) < self.params[request].min_tokens
        return self.stops[request] if early else frozenset()

    def needs_logits(self, request: int) -> bool:
        p = self.params[request]
        return not p.is_greedy or p.logprobs is not None or bool(self.banned(request))

    def new_cache(self, pool: PagePool[int]) -> Any:
        """The backend's KV cache for ``pool``, or an error naming ``num_kv_pages`` when the
        backend cannot allocate it (before any dispatch runs)."""
        try:
            return make_cache(self.backend, num_pages=pool.num_pages, page_size=pool.page_size)
        except MemoryError:
            raise InvalidConfigError.about(
                "num_kv_pages",
                f"must fit in memory: backend {self.backend.name!r} cannot allocate a KV cache "
                f"of {pool.num_pages:,} pages of {pool.page_size} tokens; give fewer pages (the "
                "default is what a step's rows can use at once)",
            ) from None

    def admit(self, state: GenerationState[int], joined: int) -> tuple[GenerationState[int], int]:
        """``state`` with the next window of requests (in arrival order) added; and how many
        have joined since the start. (Checked with the whole batch, by initial_state.)"""
        end = min(len(self.tokens), joined + self.window)
        for r in range(joined, end):
            state = state.add(r, self.prompt_lengths[r], max_new_tokens=self.news[r])
        return state, end

    def run(self, step: GenerationStep[int], cache: Any) -> GenerationState[int]:
        """Run ``step`` on the backend; return the state with its tokens recorded."""
        index = self.num_dispatches
        # A dispatch of intermediate chunks only is asked for nothing (the contract); greedy
        # rows take the backend's argmax, so that no logits cross to the host for them.
        logits_rows = [self.needs_logits(r) for r in step.sampled]
        batch = DispatchInput(
            arrays=step.arrays(index=index),
            token_ids=read_only(
                np.array(
                    [
                        token
                        for r, chunk in step.rows.items()
                        for token in self.tokens[r][chunk.start : chunk.start + chunk.length]
                    ],
                    dtype=np.int64,
                )
            ),
            input_embeddings=None,
            return_logits=any(logits_rows),
            return_greedy=not all(logits_rows),
        )
        # (Requests named by their indices in the batch: a part's error names them as a
        # one-device run of the whole batch would.)
        rows = ", ".join(f"request {self.seeds[r]} tokens {c.start}:{c.start + c.length}"
                         for r, c in list(step.rows.items())[:3])  # fmt: skip
        output = run_dispatch_checked(
            self.backend,
            batch,
            cache,
            index=index,
            where=f"dispatch {index} ({rows})",
            names=self.seeds,
        )
        state = step.state
        finished = []
        counted = set(step.finished)  # (a tuple: one look-up a row made a step quadratic)
        for row, request in enumerate(step.sampled):
            # ``run_dispatch_checked`` checked that what was asked for is there, of the right shape.
            token = self.choose(request, row, output, logits_rows[row])
            self.tokens[request].append(token)
            self.num_generated += 1
            if self.first_token[request] < 0:
                self.first_token[request] = index
            stop = self.stop_reason(request, token)
            if stop is not None:
                self.reasons[request], self.stop_reasons[request] = "stop", stop
                self.num_finished += 1
                if request in state:
                    state = state.finish(request)
                finished.append(request)
            elif request in counted:
                self.reasons[request] = "length"
                self.num_finished += 1
                finished.append(request)
        for request in step.preempted:
            self.preemptions[request] += 1
        self.num_dispatches += 1
        self.num_mixed += step.is_mixed
        self.num_computed += step.num_tokens
        if self.on_finish is not None:
            for request in finished:
                self.on_finish(request, self.sequence(request))
        if self.on_dispatch is not None:
            self.on_dispatch(
                DispatchDone(
                    index=index,
                    num_rows=step.num_rows,
                    num_tokens=step.num_tokens,
                    num_decode_rows=step.num_decode_rows,
                    num_finished=self.num_finished,
                    num_requests=len(self.tokens),
                    num_generated_tokens=self.num_generated,
                )
            )
        return state

    def choose(self, request: int, row: int, output: Any, from_logits: bool) -> int:
        """``request``'s next token, from output row ``row``, its logprobs recorded."""
        p = self.params[request]
        if not from_logits:
            return int(cast(npt.NDArray[np.integer[Any]], output.greedy_token_ids)[row])
        logits = cast(npt.NDArray[np.floating[Any]], output.logits)[row]
        token = sample_token(
            logits,
            p,
            request_index=self.seeds[request],
            token_index=self.generated_count(request),
            banned=self.banned(request),
        )
        if p.logprobs is not None:
            self.logprobs[request].append(token_logprobs(logits, token, top=p.logprobs))
        return token

    def stop_reason(self, request: int, token: int) -> int | str | None:
        """What ends ``request`` now that it generated ``token``: the token, a stop string
        its text now holds (the earliest in the text), or ``None``."""
        p = self.params[request]
        if self.generated_count(request) < p.min_tokens:
            return None  # (its stop tokens were banned: only a stop string could be early)
        if token in self.stops[request]:
            return token
        if not p.stop:
            return None
        # Checked after every token, a stop string can only have appeared at the end of the
        # text: the last tokens' text holds it, and decoding them alone keeps the check's
        # cost flat (the whole text's would grow with every token: quadratic in the length).
        tokens = self.tokens[request]
        tail = tokens[max(self.prompt_lengths[request], len(tokens) - _stop_window(p.stop)) :]
        text = cast(Callable[[Sequence[int]], str], self.detokenize)(tail)
        found = [(text.find(stop), i) for i, stop in enumerate(p.stop) if stop in text]
        return p.stop[min(found)[1]] if found else None

    def sequence(self, request: int) -> GeneratedSequence:
        reason = self.reasons[request]
        if reason is None:  # unreachable: a request leaves the state only by finishing
            raise AssertionError(f"request {request} left the generation unfinished")
        logprobs = self.logprobs[request]
        wanted = self.params[request].logprobs is not None
        return GeneratedSequence(
            token_ids=read_only(np.array(self.generated(request), dtype=np.int64)),
            finish_reason=reason,
            stop_reason=self.stop_reasons[request],
            first_token_dispatch=self.first_token[request],
            num_preemptions=self.preemptions[request],
            logprobs=read_only(np.array([lp[0] for lp in logprobs], dtype=np.float64))
            if wanted
            else None,
            top_token_ids=_rows([lp[1] for lp in logprobs], np.int64, self.params[request])
            if wanted
            else None,
            top_logprobs=_rows([lp[2] for lp in logprobs], np.float64, self.params[request])
            if wanted
            else None,
        )

    def stats(self, *, wall: float, planning: float) -> GenerationStats:
        first = np.array(self.first_token, dtype=np.float64) + 1
        return GenerationStats(
            num_dispatches=self.num_dispatches,
            num_mixed_dispatches=self.num_mixed,
            num_preemptions=sum(self.preemptions),
            num_prompt_tokens=sum(self.prompt_lengths),
            num_generated_tokens=self.num_generated,
            num_computed_tokens=self.num_computed,
            mean_time_to_first_token=float(first.mean()),
            max_time_to_first_token=int(first.max()),
            wall_seconds=wall,
            planning_seconds=planning,
        )


def _stop_window(stops: Sequence[str]) -> int:
    """How many of the last tokens a stop string check decodes: four a character of the
    longest stop string, and 16 more (a token may decode to nothing, or to part of a
    character, until the next completes it)."""
    return 16 + 4 * max(len(stop) for stop in stops)


def _rows(rows: list[Any], dtype: Any, params: SamplingParams) -> Any:
    """Per-token rows of ``params.logprobs`` entries, as one read-only 2-D array."""
    width = params.logprobs or 0
    return read_only(np.array(rows, dtype=dtype).reshape(len(rows), width))
