"""The driver: run every dispatch of a schedule through a backend, in order.

The driver owns no device state. It derives each dispatch's kernel arrays with
:func:`~pypto_sched.dispatch_arrays`, gathers the dispatch's token ids (and host embeddings,
when the caller gave them), calls :meth:`Backend.run_dispatch`, and files the final rows'
outputs under their requests. Intermediate chunks are never asked for logits, and only what
the caller asked for is returned by the backend.

A failure inside the backend, or an output that breaks the contract (wrong type, shape or
dtype, something not asked for, non-finite logits, greedy ids outside the vocabulary), stops
the run with an :class:`~pypto_sched.ExecutionError` naming the dispatch (and the request);
the outputs collected so far are dropped with the call frame, so a failed run never yields
something that looks like a complete result.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import attrs
import numpy as np
import numpy.typing as npt

from ..core._arrays import dispatch_arrays
from ..core._dispatch import DispatchArrays
from ..core._errors import CacheTooSmallError, ExecutionError, InvalidInputError
from ..core._pages import BlockTables, plan_pages
from ..core._plan import plan_one_shot
from ..core._policies import check_num_computed_tokens
from ..core._schedule import Dispatch, Schedule
from ..core._validate import (
    arrays_stay_read_only,
    check_bool,
    check_callback,
    check_int,
    check_positions,
    ints_array,
    is_sequence,
    read_only,
)
from .backends import (
    Backend,
    DispatchInput,
    DispatchOutput,
    check_is_backend,
    make_cache,
    max_positions,
)

__all__ = [
    "DEFAULT_PAGE_SIZE",
    "DispatchDone",
    "ExecutionResult",
    "execute_schedule",
    "write_prefixes",
]

#: KV page size used when neither block tables nor the schedule's config name one.
DEFAULT_PAGE_SIZE = 16

TokenIds = Sequence[Sequence[int] | npt.NDArray[np.integer[Any]]] | npt.NDArray[np.integer[Any]]
Embeddings = Sequence[npt.NDArray[np.floating[Any]]] | npt.NDArray[np.floating[Any]]


@attrs.frozen(kw_only=True)
class DispatchDone:
    """Progress: one dispatch has run and its outputs passed the driver's checks.

    Handed, after each dispatch and in order, to the ``on_dispatch`` callback of
    :func:`execute_schedule` (a schedule's dispatches, planned ahead) and of
    :func:`~pypto_sched.generate` (each dispatch planned as a step). What only a generation
    has is 0 offline (``num_decode_rows``, ``num_generated_tokens``); what only a schedule
    knows is ``None`` for a generation (``num_dispatches``).
    """

    #: Index of the dispatch just run, counted from 0.
    index: int
    #: Rows in the dispatch (one chunk a request), decode rows first.
    num_rows: int
    #: Tokens the dispatch ran (its rows' chunk lengths summed).
    num_tokens: int
    #: How many of the rows are decode rows (0 offline).
    num_decode_rows: int = 0
    #: Requests whose final row has run so far, of ``num_requests``.
    num_finished: int
    num_requests: int
    #: Tokens generated so far, over every request (0 offline).
    num_generated_tokens: int = 0
    #: Dispatches in the schedule; ``None`` for a generation, whose count is not known ahead.
    num_dispatches: int | None = None

    @property
    def fraction(self) -> float:
        """Share of the work done, in ``[0, 1]``: of the schedule's dispatches when their
        number is known, else of the requests finished."""
        if self.num_dispatches is not None:
            return (self.index + 1) / self.num_dispatches
        return self.num_finished / self.num_requests if self.num_requests else 1.0


@arrays_stay_read_only
@attrs.frozen(eq=False, kw_only=True)
class ExecutionResult:
    """The outcome of a complete run, in request order."""

    #: ``[num_requests, vocab_size]`` final logits (read-only), or ``None`` if not asked for.
    logits: npt.NDArray[np.floating[Any]] | None
    #: ``[num_requests]`` greedy token ids (read-only), or ``None`` if not asked for.
    greedy_token_ids: npt.NDArray[np.int64] | None
    #: The block tables the run used (planned by the driver unless the caller gave them).
    block_tables: BlockTables
    #: The KV cache, holding every request's prompt (ready for decoding).
    cache: Any = attrs.field(repr=False)


def execute_schedule(
    schedule: Schedule,
    backend: Backend,
    token_ids: TokenIds,
    *,
    input_embeddings: Embeddings | None = None,
    return_logits: bool = True,
    return_greedy: bool = False,
    block_tables: BlockTables | None = None,
    page_size: int | None = None,
    cache: Any = None,
    on_dispatch: Callable[[DispatchDone], None] | None = None,
) -> ExecutionResult:
    """Run every dispatch of ``schedule`` on ``backend`` and collect each request's final
    logits (and greedy token id when ``return_greedy``).

    ``token_ids[r]`` is request ``r``'s whole prompt (``schedule.prompt_lengths[r]`` ids,
    cached prefix included); ``input_embeddings[r]``, when given, its ``[length,
    hidden_size]`` host embeddings, in which case the backend does no lookup. Without
    ``block_tables`` the driver plans one with :func:`~pypto_sched.plan_pages` at
    ``page_size`` (default: the schedule's ``config.chunk_alignment``, else
    :data:`DEFAULT_PAGE_SIZE`). Without ``cache`` it asks the backend for an empty one. A
    schedule with cached prefixes (``num_computed_tokens`` > 0) needs a ``cache`` that holds
    them, filled with :func:`write_prefixes` or the caller's prefix cache: the driver cannot
    see inside a cache, so the rule it checks is that such a schedule comes with one
    (:class:`~pypto_sched.InvalidInputError` otherwise).

    Every output is checked before it is filed: the type, shape and dtype the contract asks
    for, nothing that was not asked for, finite logits, and greedy ids in ``[0,
    vocab_size)``; a breach is an :class:`~pypto_sched.ExecutionError` naming the dispatch and
    the final row's request.

    ``on_dispatch``, when given, is called with a :class:`DispatchDone` after each dispatch
    has run and its output passed the checks (for progress bars); an exception it raises
    stops the run and propagates unchanged.
    """
    return execute_schedule_with_options(
        schedule,
        backend,
        token_ids,
        input_embeddings=input_embeddings,
        return_logits=return_logits,
        return_greedy=return_greedy,
        block_tables=block_tables,
        page_size=page_size,
        cache=cache,
        on_dispatch=on_dispatch,
        names=None,
    )


def execute_schedule_with_options(
    schedule: Schedule,
    backend: Backend,
    token_ids: TokenIds,
    *,
    input_embeddings: Embeddings | None,
    return_logits: bool,
    return_greedy: bool,
    block_tables: BlockTables | None,
    page_size: int | None,
    cache: Any,
    on_dispatch: Callable[[DispatchDone], None] | None,
    names: Sequence[int] | None,
    finite_embeddings: bool = True,
) -> ExecutionResult:
    """:func:`execute_schedule`, its errors naming request ``r`` ``names[r]`` (the indices of
    a part's requests in the whole batch; ``None``: ``r``). ``finite_embeddings=False`` lets
    non-finite input embeddings through to the backend (the conformance check hands it NaN
    ones to see that it refuses its NaN logits)."""
    if not isinstance(schedule, Schedule):
        raise InvalidInputError.about("schedule", f"must be a Schedule: {type(schedule).__name__}")
    check_is_backend(backend)
    schedule.validate()
    check_callback("on_dispatch", on_dispatch)
    return_logits = check_bool("return_logits", return_logits)
    return_greedy = check_bool("return_greedy", return_greedy)
    prompts = checked_token_ids(token_ids, schedule, backend)
    embeddings = (
        None
        if input_embeddings is None
        else _embeddings(
            input_embeddings, schedule, hidden_size=backend.hidden_size, finite=finite_embeddings
        )
    )
    tables = _block_tables(schedule, block_tables, page_size)
    if cache is None and schedule.num_computed_tokens.any():
        r = int(np.flatnonzero(schedule.num_computed_tokens)[0])
        raise InvalidInputError.about(
            "cache",
            f"must be given when the schedule has cached prefixes: request {r} has "
            f"num_computed_tokens {int(schedule.num_computed_tokens[r])}, and a new cache "
            f"would be empty; fill one with write_prefixes (or your prefix cache) and pass it",
        )
    if cache is None:
        cache = make_cache(backend, num_pages=tables.num_pages, page_size=tables.page_size)
    logits, greedy = _Collector(schedule.num_requests), _Collector(schedule.num_requests)
    num_finished = 0
    for dispatch in schedule.dispatches:
        arrays = dispatch_arrays(dispatch, tables)
        # Outputs (and device sampling) are only ever asked of a dispatch holding a final
        # chunk; a dispatch of intermediate chunks only fills the cache.
        has_final = bool(arrays.is_final.any())
        batch = DispatchInput(
            arrays=arrays,
            token_ids=_gather(prompts, arrays),
            input_embeddings=None if embeddings is None else _gather(embeddings, arrays),
            return_logits=return_logits and has_final,
            return_greedy=return_greedy and has_final,
        )
        rows = _describe_dispatch(dispatch, names)
        where = f"dispatch {dispatch.index} of {schedule.num_dispatches} ({rows})"
        output = run_dispatch_checked(
            backend, batch, cache, index=dispatch.index, where=where, names=names
        )
        if batch.return_logits:
            logits.put(arrays.final_requests, output.logits)
        if batch.return_greedy:
            greedy.put(arrays.final_requests, output.greedy_token_ids)
        num_finished += int(arrays.final_requests.size)
        if on_dispatch is not None:
            on_dispatch(
                DispatchDone(
                    index=dispatch.index,
                    num_rows=arrays.num_rows,
                    num_tokens=arrays.num_tokens,
                    num_finished=num_finished,
                    num_requests=schedule.num_requests,
                    num_dispatches=schedule.num_dispatches,
                )
            )
    return ExecutionResult(
        logits=logits.result() if return_logits else None,
        greedy_token_ids=greedy.result(np.int64) if return_greedy else None,
        block_tables=tables,
        cache=cache,
    )


def write_prefixes(
    backend: Backend,
    token_ids: TokenIds,
    num_computed_tokens: Sequence[int] | npt.NDArray[np.integer[Any]],
    *,
    block_tables: BlockTables,
    cache: Any,
) -> None:
    """Write each request's cached prefix (its first ``num_computed_tokens[r]`` tokens) into
    ``cache`` at its pages, as a prefix cache would have, in one dispatch that returns nothing.

    Use it to prepare the cache for :func:`execute_schedule` of a schedule planned with
    ``num_computed_tokens``, which is checked as :func:`~pypto_sched.plan_prefill` checks it
    (one count per prompt, each leaving a token to prefill). Requests without a prefix are
    left alone.
    """
    check_is_backend(backend)
    prompts = [
        token_array(f"token_ids[{r}]", prompt, vocab_size=backend.vocab_size)
        for r, prompt in enumerate(_per_request("token_ids", token_ids))
    ]
    lengths = np.array([prompt.size for prompt in prompts], dtype=np.int64)
    computed = check_num_computed_tokens(num_computed_tokens, lengths).tolist()
    hits = [r for r, c in enumerate(computed) if c > 0]
    if not hits:
        return
    execute_schedule(
        plan_one_shot([computed[r] for r in hits]),
        backend,
        [token_ids[r][: computed[r]] for r in hits],
        return_logits=False,
        block_tables=BlockTables.from_lists(
            [block_tables.table(r).tolist() for r in hits],
            page_size=block_tables.page_size,
            num_pages=block_tables.num_pages,
        ),
        cache=cache,
    )


# -- inputs ---------------------------------------------------------------------------------


def checked_token_ids(
    token_ids: object, schedule: Schedule, backend: Backend
) -> list[npt.NDArray[np.int64]]:
    prompts = _per_request("token_ids", token_ids, schedule.num_requests)
    longest = max_positions(backend)
    checked = []
    for r, prompt in enumerate(prompts):
        array = token_array(f"token_ids[{r}]", prompt, vocab_size=backend.vocab_size)
        _check_length(f"token_ids[{r}]", array, int(schedule.prompt_lengths[r]))
        check_positions(f"'token_ids[{r}]'", array.size, longest)
        checked.append(array)
    return checked


def token_array(name: str, values: object, *, vocab_size: int) -> npt.NDArray[np.int64]:
    """``values`` as a read-only int64 array of token ids in ``[0, vocab_size)``, or an
    :class:`InvalidInputError` naming ``name``."""
    array = ints_array(name, values) if is_sequence(values) else np.asarray(values)
    if array.ndim != 1 or (array.size and array.dtype.kind not in "iu"):
        raise InvalidInputError.about(
            name, f"must be a 1-D sequence of ints: shape {array.shape}, dtype {array.dtype}"
        )
    outside = (array < 0) | (array >= vocab_size)
    if outside.any():
        raise InvalidInputError.about(
            name,
            f"values must be in [0, {vocab_size}), the backend's vocabulary: "
            f"{int(array[outside][0])}",
        )
    return read_only(array.astype(np.int64))


def _embeddings(
    input_embeddings: object, schedule: Schedule, *, hidden_size: int, finite: bool
) -> list[npt.NDArray[np.floating[Any]]]:
    """``input_embeddings`` checked: one float array ``[length, hidden_size]`` per request,
    each finite (if ``finite``): a NaN there is the caller's, not a backend fault to be found
    in its logits."""
    prompts = _per_request("input_embeddings", input_embeddings, schedule.num_requests)
    checked = []
    for r, prompt in enumerate(prompts):
        array = np.asarray(prompt)
        if array.ndim != 2 or array.shape[1] != hidden_size or array.dtype.kind != "f":
            raise InvalidInputError.about(
                f"input_embeddings[{r}]",
                f"must be a float array [length, {hidden_size}]: "
                f"shape {array.shape}, dtype {array.dtype}",
            )
        _check_length(f"input_embeddings[{r}]", array, int(schedule.prompt_lengths[r]))
        if finite and not np.isfinite(array).all():
            position = int(np.argmin(np.isfinite(array).all(axis=1)))
            raise InvalidInputError.about(
                f"input_embeddings[{r}]",
                f"must be finite: position {position} holds "
                f"{array[position][~np.isfinite(array[position])][0]}",
            )
        checked.append(array)
    return checked


def _per_request(
    name: str, values: object, count: int | None = None
) -> Sequence[Any] | npt.NDArray[Any]:
    """``values``, a sequence (not text) or an array of one entry per request (``count`` of
    them, when given)."""
    if not isinstance(values, Sequence | np.ndarray) or isinstance(values, str | bytes):
        raise InvalidInputError.about(
            name, f"must hold one entry per request: {type(values).__name__}"
        )
    if count is not None and len(values) != count:
        raise InvalidInputError.about(
            name, f"must hold one entry per request ({count}): {len(values)} entries"
        )
    return values


def _check_length(name: str, array: npt.NDArray[Any], length: int) -> None:
    if array.shape[0] != length:
        raise InvalidInputError.about(
            name, f"must cover the whole prompt, {length} tokens: {array.shape[0]}"
        )


def _block_tables(
    schedule: Schedule, block_tables: BlockTables | None, page_size: int | None
) -> BlockTables:
    if block_tables is None:
        if page_size is None:
            page_size = schedule.config.chunk_alignment or DEFAULT_PAGE_SIZE
        page_size = check_int("page_size", page_size, min_value=1)
        pages = int((-(-schedule.prompt_lengths // page_size)).sum())
        return plan_pages(schedule.prompt_lengths, page_size=page_size, num_pages=pages)
    if not isinstance(block_tables, BlockTables):
        raise InvalidInputError.about(
            "block_tables", f"must be BlockTables: {type(block_tables).__name__}"
        )
    if page_size is not None and page_size != block_tables.page_size:
        raise InvalidInputError.about(
            "page_size",
            f"must match the block tables' page size {block_tables.page_size}: {page_size}",
        )
    if block_tables.num_requests != schedule.num_requests:
        raise InvalidInputError.about(
            "block_tables",
            f"must hold one table per request ({schedule.num_requests}): "
            f"{block_tables.num_requests}",
        )
    short = block_tables.capacity < schedule.prompt_lengths
    if short.any():
        r = int(np.flatnonzero(short)[0])
        raise CacheTooSmallError.about(
            "block_tables",
            f"must hold every prompt: request {r} has "
            f"{int(schedule.prompt_lengths[r])} tokens, its pages hold "
            f"{int(block_tables.capacity[r])}",
        )
    return block_tables


def _gather(per_request: Sequence[npt.NDArray[Any]], arrays: DispatchArrays) -> npt.NDArray[Any]:
    """The dispatch's flat token-level slice of per-request arrays, rows concatenated."""
    parts = [
        per_request[r][start:end]
        for r, start, end in zip(
            arrays.requests.tolist(),
            arrays.token_starts.tolist(),
            arrays.token_ends.tolist(),
            strict=True,
        )
    ]
    return read_only(np.concatenate(parts))


# -- running and collecting ------------------------------------------------------------------


def run_dispatch_checked(
    backend: Backend,
    batch: DispatchInput,
    cache: Any,
    *,
    index: int,
    where: str,
    names: Sequence[int] | None = None,
) -> DispatchOutput:
    """``backend.run_dispatch`` with every failure, and every output that breaks the
    contract, turned into an :class:`ExecutionError` naming dispatch ``index`` (``where``
    says which it is, for the message) and request ``r`` as ``names[r]`` (``None``: ``r``).

    A ``SystemExit`` from the backend is such a failure too (left alone, it would end the
    caller's program, with success if its code is 0); a ``KeyboardInterrupt`` is the user's
    and passes through unchanged."""
    try:
        output = backend.run_dispatch(batch, cache)
    except Exception as error:
        raise ExecutionError(
            f"backend {backend.name!r} failed on {where}: {type(error).__name__}: {error}",
            dispatch=index,
        ) from error
    except SystemExit as error:
        raise ExecutionError(
            f"backend {backend.name!r} exited on {where}: SystemExit({error.code!r}) (a "
            "backend must raise an exception, not exit)",
            dispatch=index,
        ) from error
    problem = _output_problem(batch, output, backend.vocab_size, names)
    if problem is not None:
        raise ExecutionError(
            f"backend {backend.name!r} returned a malformed output for {where}: {problem}",
            dispatch=index,
        )
    return output


def _output_problem(
    batch: DispatchInput, output: object, vocab_size: int, names: Sequence[int] | None
) -> str | None:
    """Why ``output`` breaks the contract for ``batch``, or ``None`` when it keeps it."""
    if not isinstance(output, DispatchOutput):
        return f"expected a DispatchOutput, got {type(output).__name__}"
    rows = batch.num_final_rows
    requests = batch.arrays.final_requests.astype(np.int64)
    if names is not None:  # (only the rows' names: converting all of them cost O(batch))
        requests = np.fromiter(
            (names[r] for r in requests.tolist()), dtype=np.int64, count=requests.size
        )
    return (
        _array_problem("logits", output.logits, (rows, vocab_size), "f", asked=batch.return_logits)
        or _array_problem(
            "greedy_token_ids", output.greedy_token_ids, (rows,), "iu", asked=batch.return_greedy
        )
        or _logits_problem(output.logits, requests)
        or _greedy_problem(output.greedy_token_ids, requests, vocab_size)
    )


def _logits_problem(
    logits: npt.NDArray[Any] | None, requests: npt.NDArray[np.integer[Any]]
) -> str | None:
    if logits is None:
        return None
    bad = ~np.isfinite(logits)
    if not bad.any():
        return None
    row, column = (int(i) for i in np.argwhere(bad)[0])
    return (
        f"logits must be finite: final row {row} (request {int(requests[row])}) has "
        f"{logits[row, column]} at vocabulary column {column}"
    )


def _greedy_problem(
    greedy: npt.NDArray[Any] | None, requests: npt.NDArray[np.integer[Any]], vocab_size: int
) -> str | None:
    if greedy is None:
        return None
    outside = (greedy < 0) | (greedy >= vocab_size)
    if not outside.any():
        return None
    row = int(np.flatnonzero(outside)[0])
    return (
        f"greedy_token_ids must be in [0, {vocab_size}), the vocabulary: final row {row} "
        f"(request {int(requests[row])}) has {int(greedy[row])}"
    )


def _array_problem(
    name: str, value: object, shape: tuple[int, ...], kinds: str, *, asked: bool
) -> str | None:
    if not asked:
        return None if value is None else f"{name} must be None when not asked for"
    if isinstance(value, np.ndarray) and value.shape == shape and value.dtype.kind in kinds:
        return None
    got = (
        f"shape {value.shape}, dtype {value.dtype}"
        if isinstance(value, np.ndarray)
        else type(value).__name__
    )
    return (
        f"{name} must be a host {_KIND_NAMES[kinds]} array of shape {shape}, one row per final "
        f"row: {got}"
    )


#: What the dtype kinds an output may have are called, for messages.
_KIND_NAMES = {"f": "float", "iu": "integer"}


def _describe_dispatch(dispatch: Dispatch, names: Sequence[int] | None, *, limit: int = 3) -> str:
    rows = [
        f"request {c.request if names is None else names[c.request]} tokens {c.start}:{c.end}"
        for c in dispatch.rows[:limit]
    ]
    if dispatch.num_rows > limit:
        rows.append(f"{dispatch.num_rows - limit} more rows")
    return ", ".join(rows)


class _Collector:
    """Per-request rows filled dispatch by dispatch; the array is allocated on first use so
    it takes the backend's dtype."""

    def __init__(self, num_requests: int) -> None:
        self._num_requests = num_requests
        self._array: npt.NDArray[Any] | None = None

    def put(self, requests: npt.NDArray[np.int32], values: object) -> None:
        rows = np.asarray(values)
        if self._array is None:
            self._array = np.empty((self._num_requests, *rows.shape[1:]), dtype=rows.dtype)
        self._array[requests] = rows

    def result(self, dtype: type[np.generic] | None = None) -> npt.NDArray[Any]:
        # A validated schedule gives every request exactly one final row, so every row of
        # the array has been written by the time the last dispatch returns.
        if self._array is None:  # unreachable for a validated schedule; explicit under -O
            raise ExecutionError("no dispatch returned a final row", dispatch=-1)
        array = self._array if dtype is None else self._array.astype(dtype)
        return read_only(array)
