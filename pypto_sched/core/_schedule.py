"""Schedule: the planner's output, a read-only struct of arrays with a versioned JSON form.

A schedule lists chunks (rows) in dispatch order. Dispatch ``d`` holds rows
``dispatch_offsets[d]:dispatch_offsets[d + 1]``; each row says which request runs tokens
``start:start + length`` of its prompt and whether that chunk is the request's final one (the
only chunk whose logits are sampled). The invariants every schedule satisfies are listed in
``_policies.py`` and checked by :meth:`Schedule.validate`.

Schedules are immutable and hashable: equality and hash cover the config, the inputs and every
row, so two schedules are equal exactly when they describe the same dispatches.
"""

from __future__ import annotations

import functools
import itertools
import json
from collections.abc import Callable, Iterator, Sequence
from typing import Any, cast, overload

import attrs
import numpy as np
import numpy.typing as npt

from ._check import check_schedule
from ._config import PlannerConfig, check_config
from ._errors import InvalidConfigError, InvalidInputError, InvalidScheduleError
from ._json import load_json
from ._policies import dispatch_bound
from ._stats import ScheduleStats
from ._validate import (
    MAX_TOKENS,
    arrays_stay_read_only,
    as_count_array,
    check_chunk_end,
    check_index,
    check_int,
    chunk_is_final,
    chunk_length,
    chunk_start,
    is_int,
    read_only,
)

__all__ = ["FORMAT_NAME", "FORMAT_VERSION", "Chunk", "Dispatch", "Schedule"]

#: The ``"format"`` value of a serialised schedule.
FORMAT_NAME = "pypto-sched.schedule"
#: The version of the JSON format this library writes (it also reads version 1).
FORMAT_VERSION = 2


def _config_v1(config: object) -> object:
    """Version 1 named ``max_num_seqs`` ``max_batch_size``; nothing else changed. (A version
    1 config holding the version 2 name is refused, not read as either.)"""
    if not isinstance(config, dict):
        return config  # refused by PlannerConfig.from_dict, naming what it is
    if "max_num_seqs" in config:
        raise InvalidScheduleError(
            "config: version 1 names the row limit 'max_batch_size', not 'max_num_seqs' "
            '(a version 2 key; write "version": 2 with it)'
        )
    return _config_v2(
        {("max_num_seqs" if k == "max_batch_size" else k): v for k, v in config.items()}
    )


def _config_v2(config: object) -> object:
    """Both versions name ``PlannerConfig.chunk_alignment`` ``page_size`` (the file format
    kept the key when the field was renamed). A config holding the field's own name is
    refused, not read as either."""
    if not isinstance(config, dict):
        return config
    if "chunk_alignment" in config:
        raise InvalidScheduleError(
            "config: the schedule format names the chunk alignment 'page_size', not "
            "'chunk_alignment' (PlannerConfig's field)"
        )
    return {(_ALIGNMENT if k == _ALIGNMENT_KEY else k): v for k, v in config.items()}


def _config_for_file(config: PlannerConfig) -> dict[str, Any]:
    """``config.to_dict()`` with its keys as the file format names them."""
    data = config.to_dict()
    return {(_ALIGNMENT_KEY if k == _ALIGNMENT else k): v for k, v in data.items()}


#: ``PlannerConfig.chunk_alignment``, and its key in the file format (every version).
_ALIGNMENT, _ALIGNMENT_KEY = "chunk_alignment", "page_size"
#: Each version this library reads, with how its config becomes ``PlannerConfig.from_dict``'s.
_READABLE_VERSIONS: dict[int, Callable[[object], object]] = {1: _config_v1, 2: _config_v2}

IntArray = npt.NDArray[np.int64]

#: The keys of the JSON format: those a schedule must have, and those it may
#: (``num_computed_tokens``, zeros when absent; ``summary``, which ``pypto-sched plan`` adds).
_REQUIRED_KEYS = frozenset({"format", "version", "config", "prompt_lengths", "dispatches"})
_OPTIONAL_KEYS = frozenset({"num_computed_tokens", "summary"})


def _request_index(value: object) -> int:
    return check_int("request", value, min_value=0)


def _dispatch_index(value: object) -> int:
    return check_int("index", value, min_value=0)


def _row_array(name: str, values: object, *, min_value: int) -> npt.NDArray[np.int32]:
    """``values`` as a read-only int32 row array, checked (an error names ``name``)."""
    counts = as_count_array(name, values, min_value=min_value, allow_empty=True)
    return read_only(counts.astype(np.int32))


def _requests(values: object) -> npt.NDArray[np.int32]:
    return _row_array("requests", values, min_value=0)


def _starts(values: object) -> npt.NDArray[np.int32]:
    return _row_array("starts", values, min_value=0)


def _lengths(values: object) -> npt.NDArray[np.int32]:
    return _row_array("lengths", values, min_value=1)


@attrs.frozen(kw_only=True)
class Chunk:
    """One row of a dispatch: tokens ``start:start + length`` of request ``request``
    (``request`` and ``start`` at least 0, ``length`` at least 1, ``start + length`` at
    most ``2**31 - 1``, ``is_final`` a bool)."""

    request: int = attrs.field(converter=_request_index)
    start: int = attrs.field(converter=chunk_start)
    length: int = attrs.field(converter=chunk_length)
    is_final: bool = attrs.field(converter=chunk_is_final)

    def __attrs_post_init__(self) -> None:
        check_chunk_end(self.start, self.length)

    @property
    def end(self) -> int:
        """One past the chunk's last position; the request's context length after it."""
        return self.start + self.length


def _finality(values: object) -> npt.NDArray[np.bool_]:
    array = np.asarray(values) if isinstance(values, Sequence) else values
    if not isinstance(array, np.ndarray) or array.ndim != 1:
        raise InvalidInputError.about(
            "is_final", f"must be a sequence or 1-D array of bools: {type(values).__name__}"
        )
    if array.size and array.dtype != np.bool_:
        raise InvalidInputError.about("is_final", f"must hold bools: dtype {array.dtype}")
    return read_only(array.astype(np.bool_))


def _check_dispatch_rows(dispatch: Dispatch, _attribute: object, _value: object) -> None:
    """The rows of a dispatch built by hand: one length, each request at most once, within
    the positions a prompt may have. (Their order is free here: a schedule's dispatches keep
    request order, which :meth:`Schedule.validate` checks.)"""
    sizes = {
        dispatch.requests.size,
        dispatch.starts.size,
        dispatch.lengths.size,
        dispatch.is_final.size,
    }
    if len(sizes) > 1:
        raise InvalidInputError(
            f"'requests', 'starts', 'lengths' and 'is_final' must have one length: "
            f"{dispatch.requests.size}, {dispatch.starts.size}, {dispatch.lengths.size}, "
            f"{dispatch.is_final.size}"
        )
    requests = dispatch.requests
    if np.unique(requests).size < requests.size:  # two rows would write the same slots
        raise InvalidInputError.about(
            "requests", f"must name each request at most once: {requests.tolist()}"
        )
    _check_ends(dispatch.starts, dispatch.lengths)


def _check_ends(starts: npt.NDArray[np.integer], lengths: npt.NDArray[np.integer]) -> None:
    """:func:`check_chunk_end` over row arrays."""
    ends = starts.astype(np.int64) + lengths
    if ends.size and int(ends.max()) > MAX_TOKENS:
        raise InvalidInputError(f"'starts' + 'lengths' must be <= {MAX_TOKENS}: {int(ends.max())}")


@arrays_stay_read_only
@attrs.frozen(eq=False, kw_only=True)
class Dispatch:
    """One device call: its rows as read-only arrays (views into the schedule, for a
    schedule's dispatches). Two dispatches are equal when their index and rows are
    (whichever schedule they come from).

    Built by hand, the arrays are checked and copied: ``requests`` at least 0, each at most
    once, ``starts`` at least 0, ``lengths`` at least 1, all of one length; ``index`` an int
    at least 0.
    """

    index: int = attrs.field(converter=_dispatch_index)
    requests: npt.NDArray[np.int32] = attrs.field(converter=_requests)
    starts: npt.NDArray[np.int32] = attrs.field(converter=_starts)
    lengths: npt.NDArray[np.int32] = attrs.field(converter=_lengths)
    is_final: npt.NDArray[np.bool_] = attrs.field(
        converter=_finality, validator=_check_dispatch_rows
    )

    @property
    def num_rows(self) -> int:
        return int(self.requests.size)

    @property
    def num_tokens(self) -> int:
        return int(self.lengths.sum(dtype=np.int64))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Dispatch):
            return NotImplemented
        return self.index == other.index and self.rows == other.rows

    def __hash__(self) -> int:
        return hash((self.index, self.rows))

    @property
    def rows(self) -> tuple[Chunk, ...]:
        """The rows as :class:`Chunk` values, in order."""
        return tuple(
            _chunk(r, s, n, f)
            for r, s, n, f in zip(
                self.requests.tolist(),
                self.starts.tolist(),
                self.lengths.tolist(),
                self.is_final.tolist(),
                strict=True,
            )
        )


def _chunk(request: int, start: int, length: int, is_final: bool) -> Chunk:
    """``Chunk(request=request, ...)`` of values already checked, built without its checks."""
    chunk: Chunk = object.__new__(Chunk)
    _set_request(chunk, request)
    _set_start(chunk, start)
    _set_length(chunk, length)
    _set_final(chunk, is_final)
    return chunk


_set_request = Chunk.__dict__["request"].__set__
_set_start = Chunk.__dict__["start"].__set__
_set_length = Chunk.__dict__["length"].__set__
_set_final = Chunk.__dict__["is_final"].__set__
_set_index = Dispatch.__dict__["index"].__set__
_set_requests = Dispatch.__dict__["requests"].__set__
_set_starts = Dispatch.__dict__["starts"].__set__
_set_lengths = Dispatch.__dict__["lengths"].__set__
_set_is_final = Dispatch.__dict__["is_final"].__set__


class _Dispatches(Sequence[Dispatch]):
    """A lazy sequence view of a schedule's dispatches."""

    __slots__ = ("_schedule",)

    def __init__(self, schedule: Schedule) -> None:
        self._schedule = schedule

    def __len__(self) -> int:
        return self._schedule.num_dispatches

    @overload
    def __getitem__(self, index: int) -> Dispatch: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[Dispatch]: ...
    def __getitem__(self, index: int | slice) -> Dispatch | Sequence[Dispatch]:
        if isinstance(index, slice):
            return [self._schedule.dispatch(i) for i in range(*index.indices(len(self)))]
        return self._schedule.dispatch(index)

    def __iter__(self) -> Iterator[Dispatch]:
        for index in range(len(self)):
            yield self._schedule.dispatch(index)


@arrays_stay_read_only
@attrs.frozen(eq=False, kw_only=True)
class Schedule:
    """Which tokens of which request run in which dispatch.

    Build one with :func:`pypto_sched.plan_prefill` or load one with :meth:`from_json`; the
    initializer trusts its arguments (it neither copies nor checks them), the loaders check
    every invariant.
    """

    config: PlannerConfig
    #: Per request: prompt length.
    prompt_lengths: IntArray
    #: Per request: tokens already in the KV cache before the first chunk.
    num_computed_tokens: IntArray
    #: ``num_dispatches + 1`` row offsets; dispatch ``d`` is rows ``[o[d], o[d + 1])``.
    dispatch_offsets: IntArray
    #: Per row: the request it belongs to.
    requests: npt.NDArray[np.int32]
    #: Per row: the first position of the chunk.
    starts: npt.NDArray[np.int32]
    #: Per row: the number of tokens in the chunk (>= 1).
    lengths: npt.NDArray[np.int32]
    #: Per row: whether this is the request's final chunk (whose logits are sampled).
    is_final: npt.NDArray[np.bool_]

    # -- sizes -------------------------------------------------------------------------------

    @property
    def num_requests(self) -> int:
        return int(self.prompt_lengths.size)

    @property
    def num_dispatches(self) -> int:
        return int(self.dispatch_offsets.size - 1)

    @property
    def num_chunks(self) -> int:
        return int(self.requests.size)

    @property
    def num_tokens(self) -> int:
        """Tokens the schedule runs: prompt lengths less the already computed tokens."""
        return int(self.prompt_lengths.sum() - self.num_computed_tokens.sum())

    # -- dispatches --------------------------------------------------------------------------

    def dispatch(self, index: int | np.integer[Any]) -> Dispatch:
        """Dispatch ``index`` (negative indices count from the end; NumPy ints too)."""
        index = check_index("index", index, self.num_dispatches, from_end=True)
        lo, hi = int(self.dispatch_offsets[index]), int(self.dispatch_offsets[index + 1])
        # (Views of the schedule's checked rows, set through the slots: the checks and
        # copies of Dispatch's initializer are for dispatches built by hand.)
        dispatch: Dispatch = object.__new__(Dispatch)
        _set_index(dispatch, index)
        _set_requests(dispatch, self.requests[lo:hi])
        _set_starts(dispatch, self.starts[lo:hi])
        _set_lengths(dispatch, self.lengths[lo:hi])
        _set_is_final(dispatch, self.is_final[lo:hi])
        return dispatch

    @property
    def dispatches(self) -> Sequence[Dispatch]:
        """Every dispatch, in order, as a lazy sequence."""
        return _Dispatches(self)

    # -- derived figures (computed on demand, cached) ---------------------------------------

    @functools.cached_property
    def row_dispatch(self) -> npt.NDArray[np.int64]:
        """Per row: the index of the dispatch holding it."""
        counts = np.diff(self.dispatch_offsets)
        return read_only(np.repeat(np.arange(self.num_dispatches, dtype=np.int64), counts))

    @functools.cached_property
    def tokens_per_dispatch(self) -> IntArray:
        """Per dispatch: tokens it carries."""
        sums = np.add.reduceat(self.lengths.astype(np.int64), self.dispatch_offsets[:-1])
        return read_only(sums.astype(np.int64))

    @functools.cached_property
    def rows_per_dispatch(self) -> IntArray:
        """Per dispatch: rows (requests) it carries."""
        return read_only(np.diff(self.dispatch_offsets))

    @functools.cached_property
    def utilization(self) -> npt.NDArray[np.float64]:
        """Per dispatch: tokens carried over ``max_num_batched_tokens``."""
        return read_only(self.tokens_per_dispatch / self.config.max_num_batched_tokens)

    @functools.cached_property
    def finish_dispatch(self) -> IntArray:
        """Per request: the index of the dispatch that runs its final chunk."""
        finish = np.empty(self.num_requests, dtype=np.int64)
        finish[self.requests[self.is_final]] = self.row_dispatch[self.is_final]
        return read_only(finish)

    @functools.cached_property
    def lower_bound(self) -> int:
        """Fewest dispatches any schedule within this config's limits could take.

        The largest of: requests over ``max_num_seqs``; the tokens over what a dispatch
        holds, ``max_num_batched_tokens`` and at most ``max_num_seqs`` rows of ``chunk_cap``;
        and the dispatches the longest request needs under the request cap. Under ``packed``,
        whose work-conserving tail lets a request left alone run the whole budget, only the
        longest request's tokens may run alone, and it runs at most ``chunk_cap`` tokens a
        dispatch while the second longest is unfinished. ``docs/semantics.md`` has the
        formulas.
        """
        return lower_bound(self.prompt_lengths - self.num_computed_tokens, self.config)

    @functools.cached_property
    def stats(self) -> ScheduleStats:
        """Summary figures: dispatches vs lower bound, tokens, utilization, finishing."""
        return ScheduleStats.from_arrays(
            tokens_per_dispatch=self.tokens_per_dispatch,
            finish_dispatch=self.finish_dispatch,
            max_num_batched_tokens=self.config.max_num_batched_tokens,
            lower_bound=self.lower_bound,
        )

    # -- equality and hashing ----------------------------------------------------------------

    def _arrays(self) -> tuple[npt.NDArray[Any], ...]:
        return (
            self.prompt_lengths,
            self.num_computed_tokens,
            self.dispatch_offsets,
            self.requests,
            self.starts,
            self.lengths,
            self.is_final,
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Schedule):
            return NotImplemented
        return self.config == other.config and all(
            np.array_equal(a, b) for a, b in zip(self._arrays(), other._arrays(), strict=True)
        )

    def __hash__(self) -> int:
        return hash((self.config, *(a.tobytes() for a in self._arrays())))

    def __repr__(self) -> str:
        return (
            f"Schedule(policy={self.config.policy!r}, requests={self.num_requests}, "
            f"dispatches={self.num_dispatches}, lower_bound={self.lower_bound}, "
            f"chunks={self.num_chunks})"
        )

    # -- construction from rows and serialisation -------------------------------------------

    @classmethod
    def from_dispatches(
        cls,
        config: PlannerConfig,
        prompt_lengths: Sequence[int | np.integer[Any]] | npt.NDArray[np.integer[Any]],
        dispatches: Sequence[Sequence[Chunk | Sequence[object]]],
        *,
        num_computed_tokens: Sequence[int | np.integer[Any]]
        | npt.NDArray[np.integer[Any]]
        | None = None,
    ) -> Schedule:
        """Build and validate a schedule from explicit rows.

        ``prompt_lengths`` and ``num_computed_tokens`` are lists or 1-D integer arrays (a
        schedule's own, say); ``dispatches`` is a list of dispatches, each a list of
        :class:`Chunk` values or ``[request, start, length, is_final]`` lists (the JSON form).
        """
        check_config(config, error=InvalidScheduleError)
        lengths = _int_list("prompt_lengths", prompt_lengths, min_value=1)
        if not lengths:
            raise InvalidScheduleError.about("prompt_lengths", "must hold at least one request: []")
        computed = (
            [0] * len(lengths)
            if num_computed_tokens is None
            else _int_list("num_computed_tokens", num_computed_tokens, min_value=0)
        )
        if not isinstance(dispatches, Sequence) or isinstance(dispatches, str | bytes):
            raise InvalidScheduleError.about(
                "dispatches", f"must be a list of dispatches: {type(dispatches).__name__}"
            )
        if not dispatches:
            raise InvalidScheduleError.about(
                "dispatches",
                "must hold at least one dispatch (every request has a token to "
                f"prefill): [] for {len(lengths)} requests",
            )
        offsets, (requests, starts, sizes, final) = _json_rows(dispatches) or _checked_rows(
            dispatches
        )
        schedule = cls(
            config=config,
            prompt_lengths=read_only(np.array(lengths, dtype=np.int64)),
            num_computed_tokens=read_only(np.array(computed, dtype=np.int64)),
            dispatch_offsets=read_only(offsets),
            requests=read_only(requests.astype(np.int32)),
            starts=read_only(starts.astype(np.int32)),
            lengths=read_only(sizes.astype(np.int32)),
            is_final=read_only(final.astype(np.bool_)),
        )
        schedule.validate()
        return schedule

    def to_dict(self) -> dict[str, Any]:
        """The schedule in the documented JSON format (version :data:`FORMAT_VERSION`)."""
        rows = [
            list(row)
            for row in zip(
                self.requests.tolist(),
                self.starts.tolist(),
                self.lengths.tolist(),
                self.is_final.tolist(),
                strict=True,
            )
        ]
        offsets = self.dispatch_offsets.tolist()
        return {
            "format": FORMAT_NAME,
            "version": FORMAT_VERSION,
            "config": _config_for_file(self.config),
            "prompt_lengths": self.prompt_lengths.tolist(),
            "num_computed_tokens": self.num_computed_tokens.tolist(),
            "dispatches": [rows[lo:hi] for lo, hi in itertools.pairwise(offsets)],
        }

    def to_json(self, *, indent: int | None = None) -> str:
        """The schedule as a JSON string (see :meth:`to_dict`)."""
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_dict(cls, data: object) -> Schedule:
        """Load and validate a schedule from :meth:`to_dict`'s output."""
        if not isinstance(data, dict):
            raise InvalidScheduleError.about(
                "data", f"must be a JSON object: {type(data).__name__}"
            )
        if data.get("format") != FORMAT_NAME:
            raise InvalidScheduleError.about(
                "format", f"must be {FORMAT_NAME!r}: {data.get('format')!r}"
            )
        version = data.get("version")
        # `type() is int`: JSON true and 1.0 compare equal to 1 but are not version 1.
        if type(version) is not int or version not in _READABLE_VERSIONS:
            raise InvalidScheduleError.about(
                "version",
                f"must be one of {sorted(_READABLE_VERSIONS)} (the versions this "
                f"library reads): {version!r}",
            )
        missing = sorted(_REQUIRED_KEYS - set(data))
        if missing:
            raise InvalidScheduleError.about(
                "data", f"must hold the keys {missing}: they are missing"
            )
        unknown = sorted(map(str, set(data) - _REQUIRED_KEYS - _OPTIONAL_KEYS))
        if unknown:
            raise InvalidScheduleError.about(
                "data",
                f"must hold only the keys of the format "
                f"{sorted(_REQUIRED_KEYS | _OPTIONAL_KEYS)}: {unknown} are not",
            )
        try:
            config = PlannerConfig.from_dict(_READABLE_VERSIONS[version](data["config"]))
        except InvalidConfigError as error:
            raise InvalidScheduleError(f"bad 'config': {error}") from error
        return cls.from_dispatches(
            config,
            data["prompt_lengths"],
            data["dispatches"],
            num_computed_tokens=data.get("num_computed_tokens"),
        )

    @classmethod
    def from_json(cls, text: str | bytes) -> Schedule:
        """Load and validate a schedule from :meth:`to_json`'s output."""
        if not isinstance(text, str | bytes | bytearray):
            raise InvalidScheduleError.about(
                "text", f"must be a JSON str or bytes: {type(text).__name__}"
            )
        return cls.from_dict(load_json(text, what="a schedule", error=InvalidScheduleError))

    # -- invariants --------------------------------------------------------------------------

    def validate(self) -> None:
        """Raise :class:`InvalidScheduleError` if any schedule invariant is broken."""
        check_schedule(self)


def lower_bound(remaining: IntArray, config: PlannerConfig) -> int:
    """Fewest dispatches for requests with ``remaining`` tokens each under ``config`` (see
    :attr:`Schedule.lower_bound`)."""
    second = int(np.partition(remaining, -2)[-2]) if remaining.size > 1 else 0
    return dispatch_bound(
        int(remaining.sum()), int(remaining.max()), second, remaining.size, config
    )


def _int_list(name: str, values: object, *, min_value: int) -> list[int]:
    if isinstance(values, np.ndarray) and values.ndim == 1:  # a schedule's own arrays too
        values = values.tolist()
    if not isinstance(values, Sequence) or isinstance(values, str | bytes):
        raise InvalidScheduleError.about(name, f"must be a list of ints: {type(values).__name__}")
    for index, value in enumerate(values):
        if not is_int(value) or not min_value <= value <= MAX_TOKENS:
            raise InvalidScheduleError.about(
                name, f"must hold ints in [{min_value}, {MAX_TOKENS}]: item {index} is {value!r}"
            )
    return [int(value) for value in values]


_Columns = tuple[IntArray, tuple[IntArray, IntArray, IntArray, npt.NDArray[np.bool_]]]


def _checked_rows(dispatches: Sequence[object]) -> _Columns:
    """The dispatch offsets and the four row columns of ``dispatches``, each row read by
    :func:`_row` (the first bad one is named)."""
    offsets = [0]
    rows: list[tuple[int, int, int, bool]] = []
    for d, dispatch in enumerate(dispatches):
        if not isinstance(dispatch, Sequence) or isinstance(dispatch, str | bytes):
            raise InvalidScheduleError(
                f"dispatch {d} must be a list of rows: {type(dispatch).__name__}",
                parameter="dispatches",
            )
        for k, row in enumerate(dispatch):
            rows.append(_row(row, f"dispatch {d} row {k}"))
        offsets.append(len(rows))
    columns: list[Sequence[object]] = list(zip(*rows, strict=True)) if rows else [[]] * 4
    return np.array(offsets, dtype=np.int64), (
        np.array(columns[0], dtype=np.int64),
        np.array(columns[1], dtype=np.int64),
        np.array(columns[2], dtype=np.int64),
        np.array(columns[3], dtype=np.bool_),
    )


def _json_rows(dispatches: Sequence[object]) -> _Columns | None:
    """:func:`_checked_rows` at once, for the JSON form whose rows all keep :class:`Chunk`'s
    rules: lists of ``[int, int, int, bool]`` (exactly those types) whose columns
    :class:`Dispatch`'s row arrays accept (the same rules over arrays). ``None`` for anything
    else, which :func:`_checked_rows` then reads row by row, naming the first bad row (a
    schedule of a million rows loads in a second instead of ten)."""
    if any(type(dispatch) is not list for dispatch in dispatches):
        return None
    flat: list[object] = list(itertools.chain.from_iterable(cast(list[list[object]], dispatches)))
    if not flat or any(type(row) is not list or len(row) != 4 for row in flat):
        return None
    requests, starts, sizes, final = zip(*cast(list[list[object]], flat), strict=True)
    if set(map(type, requests)) | set(map(type, starts)) | set(map(type, sizes)) != {int}:
        return None
    if set(map(type, final)) != {bool}:
        return None
    try:
        columns = np.array([requests, starts, sizes], dtype=np.int64)
        _requests(columns[0]), _starts(columns[1]), _lengths(columns[2])  # Dispatch's rules
        _check_ends(columns[1], columns[2])
    except (OverflowError, InvalidInputError):  # the checked reading names the row
        return None
    offsets = np.zeros(len(dispatches) + 1, dtype=np.int64)
    np.cumsum([len(cast(list[object], d)) for d in dispatches], out=offsets[1:])
    return offsets, (columns[0], columns[1], columns[2], np.array(final, dtype=np.bool_))


def _row(row: object, where: str) -> tuple[int, int, int, bool]:
    """A row's fields as Python values; a :class:`Chunk` and a list obey the same rules,
    :class:`Chunk`'s own (NumPy ints and bools count as ints and bools, as they do
    everywhere else; 0 and 1 are not bools)."""
    if not isinstance(row, Chunk):
        if not isinstance(row, Sequence) or isinstance(row, str | bytes) or len(row) != 4:
            raise InvalidScheduleError(
                f"{where} must be [request, start, length, is_final]: {row!r}",
                parameter="dispatches",
            )
        request, start, length, final = row
        try:
            row = Chunk(request=request, start=start, length=length, is_final=final)
        except InvalidInputError as error:
            raise InvalidScheduleError(f"{where}: {error}", parameter="dispatches") from None
    return (row.request, row.start, row.length, row.is_final)
