"""The one verification rule: do a run's final logits and greedy ids agree with a reference?

A chunked run of a backend must give the final logits of the same prompts run whole (the
one-shot schedule) within the backend's own ``tolerance``; that is what the backend contract
promises and what :func:`~pypto_sched.testing.check_backend`, ``pypto-sched run --verify`` and
any server-side check use. The rule, stated once:

* **the allowed difference** of a request is ``tolerance + relative_tolerance * scale``,
  ``scale`` the largest magnitude of its reference logits (``relative_tolerance`` is 0 unless
  the backend declares one: low-precision arithmetic errs in proportion to the logits'
  size, so a bfloat16 backend's absolute tolerance alone would hold for small models only);
* **logits**: every final logit is within the allowed difference of the reference's
  (absolute difference, in float64); a non-finite logit never agrees;
* **greedy ids** (tie-aware): a greedy id agrees when the reference's logit for it is within
  twice the allowed difference of the reference row's maximum -- both logits compared may be
  off by it, so a near-tie may break either way -- and, when the run returned logits with
  it, it is an argmax of those logits (no slack: the backend picked it from them).

:func:`compare_results` applies the rule to two results (or a result and reference logits,
e.g. from an oracle model); :func:`verify_against_one_shot` runs the one-shot reference
itself. Both return a :class:`Verification`, a frozen report with ``passed`` and a one-line
:meth:`~Verification.describe`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import attrs
import numpy as np
import numpy.typing as npt

from ..core._errors import InvalidInputError
from ..core._pages import plan_pages
from ..core._plan import plan_one_shot
from ..core._schedule import Schedule
from ..core._validate import arrays_stay_read_only, check_int, read_only
from .backends import Backend, check_is_backend, make_cache
from .backends import relative_tolerance as backend_relative_tolerance
from .execute import (
    DEFAULT_PAGE_SIZE,
    DispatchDone,
    Embeddings,
    ExecutionResult,
    TokenIds,
    checked_token_ids,
    execute_schedule,
    write_prefixes,
)

__all__ = ["Verification", "compare_results", "verify_against_one_shot"]

F64 = npt.NDArray[np.float64]


@arrays_stay_read_only
@attrs.frozen(kw_only=True, eq=False)
class Verification:
    """What :func:`compare_results` found, per request (arrays are read-only).

    Logit fields are ``None`` when the run returned no logits; greedy fields are ``None``
    when it returned no greedy ids.
    """

    #: The tolerance the rule used (the backend's, unless the caller chose one).
    tolerance: float
    #: Per request: the largest magnitude of its finite reference logits.
    scales: F64
    #: What the run was compared with, for messages: ``"one-shot"``, ``"the oracle"``, ...
    reference: str
    #: The relative tolerance the rule used (0: the tolerance alone).
    relative_tolerance: float = 0.0
    #: Per request: its prompt's last position, where its final logits are computed.
    last_positions: npt.NDArray[np.int64] | None
    #: Per request: the largest absolute difference of its final logits (NaN if non-finite).
    logits_difference: F64 | None
    #: Per request: the vocabulary column of that largest difference.
    worst_columns: npt.NDArray[np.int64] | None
    #: Per request: the greedy id the run returned.
    greedy_token_ids: npt.NDArray[np.int64] | None
    #: Per request: the greedy id is an argmax of the reference within twice ``allowed``.
    greedy_agrees: npt.NDArray[np.bool_] | None
    #: Per request: the greedy id is an argmax of the logits returned with it (``None``
    #: when no logits came with it).
    greedy_consistent: npt.NDArray[np.bool_] | None

    @property
    def num_requests(self) -> int:
        arrays = (self.logits_difference, self.greedy_token_ids)
        return next((int(a.size) for a in arrays if a is not None), 0)

    @property
    def max_abs_logit_diff(self) -> float | None:
        """The largest absolute logit difference over all requests (NaN if any is
        non-finite), or ``None`` without logits."""
        difference = self.logits_difference
        if difference is None or difference.size == 0:
            return None if difference is None else 0.0
        return float(np.nan if np.isnan(difference).any() else difference.max())

    @property
    def allowed(self) -> F64:
        """Per request: the allowed difference, ``tolerance + relative_tolerance * scale``."""
        return read_only(self.tolerance + self.relative_tolerance * self.scales)

    @property
    def logits_agree(self) -> npt.NDArray[np.bool_] | None:
        """Per request: every final logit is within ``allowed`` of the reference's."""
        if self.logits_difference is None:
            return None
        return read_only(self.logits_difference <= self.allowed)

    @property
    def requests_agreeing(self) -> int:
        """Requests for which every check that ran passed."""
        return int(self._agrees().sum())

    @property
    def passed(self) -> bool:
        return bool(self._agrees().all())

    def _agrees(self) -> npt.NDArray[np.bool_]:
        agrees = np.ones(self.num_requests, dtype=bool)
        for part in (self.logits_agree, self.greedy_agrees, self.greedy_consistent):
            if part is not None:
                agrees &= part
        return agrees

    def first_problem(self) -> str | None:
        """The first disagreement in words, naming the request, the position and the
        vocabulary column; ``None`` when the run agrees."""
        where = self._position
        agree = self.logits_agree
        difference, columns = self.logits_difference, self.worst_columns
        if agree is not None and difference is not None and columns is not None and not agree.all():
            r = int(np.flatnonzero(~agree)[0])
            return (
                f"final logits of request {r}{where(r)} differ from {self.reference} by "
                f"{float(difference[r]):.3g} > {self._allowed(r)} at vocabulary "
                f"column {int(columns[r])}"
            )
        greedy = self.greedy_token_ids
        for part, within in ((self.greedy_agrees, True), (self.greedy_consistent, False)):
            if part is not None and greedy is not None and not part.all():
                r = int(np.flatnonzero(~part)[0])
                name = (
                    f"the {self.reference} logits within {2 * float(self.allowed[r]):.3g} "
                    f"(twice the {self._allowed(r)})"
                    if within
                    else "the logits returned with it"
                )
                return (
                    f"greedy id (vocabulary column) {int(greedy[r])} of "
                    f"request {r}{where(r)} is not an argmax of {name}"
                )
        return None

    def _allowed(self, request: int) -> str:
        """Request ``request``'s allowed difference in words."""
        if not self.relative_tolerance:
            return f"tolerance {self.tolerance:g}"
        return (
            f"allowed {float(self.allowed[request]):.3g} (tolerance {self.tolerance:g} + "
            f"relative_tolerance {self.relative_tolerance:g} x the reference's largest "
            f"|logit| {float(self.scales[request]):.3g})"
        )

    def _position(self, request: int) -> str:
        if self.last_positions is None:
            return ""
        return f" at position {int(self.last_positions[request])}"

    def describe(self) -> str:
        """One line: PASS or FAIL, the largest logit difference, greedy agreement and the
        first problem."""
        verdict = f"{'PASS' if self.passed else 'FAIL'} vs {self.reference}"
        parts = []
        worst = self.max_abs_logit_diff
        if worst is not None:
            relative = (
                f" + {self.relative_tolerance:g} x largest |logit|"
                if self.relative_tolerance
                else ""
            )
            parts.append(f"max |logit diff| {worst:.3g} (tolerance {self.tolerance:g}{relative})")
        if self.greedy_agrees is not None:
            parts.append(
                f"greedy ids agree for {int(self.greedy_agrees.sum())} of "
                f"{self.num_requests} requests"
            )
        problem = self.first_problem()
        if problem is not None:
            parts.append(problem)
        return f"{verdict}: {'; '.join(parts)}"


def compare_results(
    actual: ExecutionResult,
    expected: ExecutionResult | npt.NDArray[np.floating[Any]],
    *,
    tolerance: float,
    relative_tolerance: float = 0.0,
    reference: str = "one-shot",
    prompt_lengths: Sequence[int] | npt.NDArray[np.integer[Any]] | None = None,
) -> Verification:
    """Apply the verification rule (see the module docstring) to ``actual`` against
    ``expected``: another run's result holding logits, or ``[num_requests, vocab_size]``
    reference logits (e.g. an oracle model's). ``prompt_lengths``, when given, lets messages
    name each request's last position."""
    if isinstance(expected, ExecutionResult):
        if expected.logits is None:
            raise InvalidInputError.about("expected", "must hold logits: it was run without them")
        expected_logits = expected.logits
    else:
        expected_logits = expected
    reference_logits = _float_rows("expected", expected_logits)
    if not isinstance(actual, ExecutionResult):
        raise InvalidInputError.about(
            "actual", f"must be an ExecutionResult: {type(actual).__name__}"
        )
    if actual.logits is None and actual.greedy_token_ids is None:
        raise InvalidInputError.about("actual", "must hold logits or greedy ids: it holds neither")
    for name, value in (("tolerance", tolerance), ("relative_tolerance", relative_tolerance)):
        if not is_tolerance(value):
            raise InvalidInputError.about(name, f"must be a finite real number >= 0: {value!r}")
    num_requests = reference_logits.shape[0]
    scales = _scales(reference_logits)
    positions = _last_positions(prompt_lengths, num_requests)
    difference = columns = None
    logits = None
    if actual.logits is not None:
        logits = _float_rows("actual.logits", actual.logits)
        if logits.shape != reference_logits.shape:
            raise InvalidInputError.about(
                "actual.logits",
                f"must have the reference's shape {reference_logits.shape}: {logits.shape}",
            )
        difference, columns = _row_differences(logits, reference_logits)
    greedy = agrees = consistent = None
    if actual.greedy_token_ids is not None:
        greedy = np.asarray(actual.greedy_token_ids).astype(np.int64)
        if greedy.shape != (num_requests,):
            raise InvalidInputError.about(
                "actual.greedy_token_ids",
                f"must have one id per request ({num_requests}): shape {greedy.shape}",
            )
        agrees, _ = greedy_ids_agree(
            reference_logits, greedy, tolerance=tolerance, relative_tolerance=relative_tolerance
        )
        consistent = None if logits is None else _is_argmax(logits, greedy, slack=0.0)
    return Verification(
        tolerance=float(tolerance),
        relative_tolerance=float(relative_tolerance),
        scales=read_only(scales),
        reference=reference,
        last_positions=positions,
        logits_difference=difference,
        worst_columns=columns,
        greedy_token_ids=None if greedy is None else read_only(greedy),
        greedy_agrees=agrees,
        greedy_consistent=consistent,
    )


def greedy_ids_agree(
    reference: F64, ids: npt.NDArray[np.int64], *, tolerance: float, relative_tolerance: float
) -> tuple[npt.NDArray[np.bool_], F64]:
    """The greedy-id rule (see the module docstring), row by row: whether ``ids[i]`` agrees
    with ``reference[i]``, and twice row ``i``'s allowed difference (the slack it had)."""
    slack = 2 * (float(tolerance) + float(relative_tolerance) * _scales(reference))
    return _is_argmax(reference, ids, slack=slack), read_only(slack)


def is_tolerance(value: object) -> bool:
    """Whether ``value`` can be a tolerance: a finite real number >= 0, an int too (not a
    bool). (An infinite one would pass any logits: no check at all.)"""
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        return False
    return bool(0 <= value < np.inf)  # a NaN is not


def verify_against_one_shot(
    schedule: Schedule,
    backend: Backend,
    token_ids: TokenIds,
    *,
    chunked: ExecutionResult | None = None,
    input_embeddings: Embeddings | None = None,
    page_size: int | None = None,
    tolerance: float | None = None,
    relative_tolerance: float | None = None,
    on_dispatch: Callable[[DispatchDone], None] | None = None,
) -> Verification:
    """Run ``schedule``'s prompts whole (:func:`~pypto_sched.plan_one_shot`, from an empty
    cache, no prefix hits) on ``backend`` and compare ``chunked`` with it by
    :func:`compare_results` at ``tolerance`` and ``relative_tolerance`` (default: the
    backend's, :func:`~pypto_sched.backends.relative_tolerance`).

    ``chunked`` is the caller's result of ``schedule`` on the same backend and prompts; when
    it is ``None`` the schedule is run here too, asking logits and greedy ids, from a fresh
    cache whose cached prefixes (``schedule.num_computed_tokens``) are written first with
    :func:`~pypto_sched.execute.write_prefixes`. ``on_dispatch`` sees the dispatches run
    here (the chunked ones first, when run here, then the one-shot one). ``page_size`` is the
    KV page size of a chunked run made here (default: the schedule's ``config.chunk_alignment``,
    else :data:`~pypto_sched.execute.DEFAULT_PAGE_SIZE`); the one-shot run uses the chunked
    run's.
    """
    check_is_backend(backend)
    if not isinstance(schedule, Schedule):
        raise InvalidInputError.about("schedule", f"must be a Schedule: {type(schedule).__name__}")
    if chunked is None:
        chunked = _run_chunked(
            schedule, backend, token_ids, input_embeddings, page_size, on_dispatch
        )
    elif not isinstance(chunked, ExecutionResult):
        raise InvalidInputError.about(
            "chunked", f"must be an ExecutionResult or None: {type(chunked).__name__}"
        )
    one_shot = execute_schedule(
        plan_one_shot(schedule.prompt_lengths),
        backend,
        token_ids,
        input_embeddings=input_embeddings,
        page_size=chunked.block_tables.page_size,
        on_dispatch=on_dispatch,
    )
    return compare_results(
        chunked,
        one_shot,
        tolerance=backend.tolerance if tolerance is None else tolerance,
        relative_tolerance=(
            backend_relative_tolerance(backend)
            if relative_tolerance is None
            else relative_tolerance
        ),
        prompt_lengths=schedule.prompt_lengths,
    )


def _run_chunked(
    schedule: Schedule,
    backend: Backend,
    token_ids: TokenIds,
    input_embeddings: Embeddings | None,
    page_size: int | None,
    on_dispatch: Callable[[DispatchDone], None] | None,
) -> ExecutionResult:
    if page_size is None:
        size = schedule.config.chunk_alignment or DEFAULT_PAGE_SIZE
    else:
        size = check_int("page_size", page_size, min_value=1)
    # The prompts checked against the schedule first, as execute_schedule checks them: the
    # prefixes are written before it runs, and would blame another argument.
    prompts = checked_token_ids(token_ids, schedule, backend)
    lengths = schedule.prompt_lengths
    tables = plan_pages(lengths, page_size=size, num_pages=int((-(-lengths // size)).sum()))
    cache = make_cache(backend, num_pages=tables.num_pages, page_size=tables.page_size)
    write_prefixes(backend, prompts, schedule.num_computed_tokens, block_tables=tables, cache=cache)
    return execute_schedule(
        schedule,
        backend,
        token_ids,
        input_embeddings=input_embeddings,
        return_greedy=True,
        block_tables=tables,
        cache=cache,
        on_dispatch=on_dispatch,
    )


def _float_rows(name: str, values: object) -> F64:
    array = np.asarray(values)
    if array.ndim != 2 or array.dtype.kind != "f":
        raise InvalidInputError.about(
            name,
            f"must be a float array [num_requests, vocab_size]: shape {array.shape}, "
            f"dtype {array.dtype}",
        )
    return array.astype(np.float64)


def _last_positions(lengths: object, num_requests: int) -> npt.NDArray[np.int64] | None:
    if lengths is None:
        return None
    array = np.asarray(lengths, dtype=np.int64)
    if array.shape != (num_requests,):
        raise InvalidInputError.about(
            "prompt_lengths",
            f"must have one entry per request ({num_requests}): shape {array.shape}",
        )
    return read_only(array - 1)


def _row_differences(logits: F64, reference: F64) -> tuple[F64, npt.NDArray[np.int64]]:
    """Per row: the largest absolute difference (NaN when any logit is not finite) and
    its column (the first non-finite one, if any)."""
    with np.errstate(invalid="ignore", over="ignore"):  # inf - inf is a NaN we report
        difference = np.abs(logits - reference)
    bad = ~np.isfinite(difference)
    # A NaN or infinite logit is the worst difference a row can have.
    ranked = np.where(bad, np.inf, difference)
    columns = np.argmax(ranked, axis=1) if ranked.shape[1] else np.zeros(len(ranked), int)
    worst = ranked.max(axis=1, initial=0.0)
    worst = np.where(bad.any(axis=1), np.nan, worst)
    return read_only(worst.astype(np.float64)), read_only(columns.astype(np.int64))


def _scales(logits: F64) -> F64:
    """Per row: the largest magnitude of its finite logits (0 for a row of none)."""
    finite: F64 = np.where(np.isfinite(logits), np.abs(logits), 0.0)
    scales: F64 = finite.max(axis=1, initial=0.0)
    return scales


def _is_argmax(
    logits: F64, ids: npt.NDArray[np.int64], *, slack: float | F64
) -> npt.NDArray[np.bool_]:
    """Per row: ``ids`` is a column of ``logits`` whose value is within ``slack`` (one for
    every row, or one per row) of the row's maximum (an id outside the row, or a non-finite
    row, never is)."""
    vocab = logits.shape[1]
    inside = (ids >= 0) & (ids < vocab)
    chosen = logits[np.arange(ids.size), np.where(inside, ids, 0)]
    finite = np.isfinite(logits).all(axis=1)
    return read_only(inside & finite & (chosen >= logits.max(axis=1, initial=-np.inf) - slack))
