"""The one verification rule: compare_results and verify_against_one_shot.

The rule is checked against a plain loop written from its statement in the docs, and on the
reference backend, whose chunked runs must pass and whose spoiled runs must not.
"""

from __future__ import annotations

from typing import Any

import attrs
import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from pypto_sched import (
    ExecutionResult,
    InvalidInputError,
    PlannerConfig,
    Verification,
    compare_results,
    plan_pages,
    plan_prefill,
    verify_against_one_shot,
)
from pypto_sched.execute import execute_schedule, write_prefixes

reference = pytest.importorskip("pypto_sched_reference")


def result(logits: Any = None, greedy: Any = None) -> ExecutionResult:
    return ExecutionResult(
        logits=None if logits is None else np.asarray(logits, dtype=np.float64),
        greedy_token_ids=None if greedy is None else np.asarray(greedy, dtype=np.int64),
        block_tables=plan_pages([1], page_size=1, num_pages=1),
        cache=None,
    )


def plain_loop_passes(
    logits: npt.NDArray[np.float64] | None,
    greedy: npt.NDArray[np.int64] | None,
    expected: npt.NDArray[np.float64],
    tolerance: float,
    relative_tolerance: float = 0.0,
) -> bool:
    """The rule as the docs state it, one request and one column at a time."""
    for r in range(expected.shape[0]):
        row = [float(v) for v in expected[r]]
        scale = max([abs(v) for v in row if np.isfinite(v)], default=0.0)
        allowed = tolerance + relative_tolerance * scale
        if logits is not None:
            for c, value in enumerate(row):
                got = float(logits[r, c])
                if not (np.isfinite(got) and abs(got - value) <= allowed):
                    return False
        if greedy is not None:
            g = int(greedy[r])
            if not 0 <= g < len(row) or not all(np.isfinite(row)):
                return False
            if row[g] < max(row) - 2 * allowed:
                return False
            if logits is not None:
                own = [float(v) for v in logits[r]]
                if not all(np.isfinite(own)) or own[g] < max(own):
                    return False
    return True


values = st.sampled_from([0.0, 0.5, 1.0, 1.00001, 2.0, -1.0, np.nan, np.inf])


@settings(max_examples=200, deadline=None)
@given(
    expected=hnp.arrays(
        np.float64, st.tuples(st.integers(1, 3), st.integers(1, 4)), elements=values
    ),
    noise=st.data(),
    tolerance=st.sampled_from([0.0, 1e-5, 0.5]),
    relative_tolerance=st.sampled_from([0.0, 0.25]),
    with_logits=st.booleans(),
    with_greedy=st.booleans(),
)
def test_compare_results_follows_the_rule_as_stated(
    expected: npt.NDArray[np.float64],
    noise: st.DataObject,
    tolerance: float,
    relative_tolerance: float,
    with_logits: bool,
    with_greedy: bool,
) -> None:
    shape = expected.shape
    logits = noise.draw(hnp.arrays(np.float64, shape, elements=values)) if with_logits else None
    greedy = (
        noise.draw(hnp.arrays(np.int64, (shape[0],), elements=st.integers(-1, shape[1])))
        if with_greedy or not with_logits
        else None
    )
    verification = compare_results(
        result(logits, greedy),
        expected,
        tolerance=tolerance,
        relative_tolerance=relative_tolerance,
    )
    assert verification.passed == plain_loop_passes(
        logits, greedy, expected, tolerance, relative_tolerance
    )
    assert verification.describe().startswith("PASS" if verification.passed else "FAIL")
    assert (verification.first_problem() is None) == verification.passed


def test_a_near_tie_may_break_either_way_within_twice_the_tolerance() -> None:
    expected = np.array([[1.0, 1.0 + 1.5e-5, 0.0]])
    near = compare_results(result(greedy=[0]), expected, tolerance=1e-5)
    assert near.passed
    far = compare_results(result(greedy=[0]), expected, tolerance=5e-6)
    assert not far.passed
    assert far.describe() == (
        "FAIL vs one-shot: greedy ids agree for 0 of 1 requests; greedy id (vocabulary "
        "column) 0 of request 0 is not an argmax of the one-shot logits within 1e-05 (twice "
        "the tolerance 5e-06)"
    )


def test_a_greedy_id_must_be_an_argmax_of_the_logits_returned_with_it() -> None:
    # Within the tolerance of one-shot's logits, and within twice it of their best, but not
    # the best of its own run's logits: the backend's two outputs contradict each other.
    verification = compare_results(
        result(logits=[[0.0, 1.0]], greedy=[0]), np.array([[0.0, 1.0]]), tolerance=1.0
    )
    assert verification.logits_agree is not None
    assert verification.logits_agree.all()
    assert verification.greedy_agrees is not None
    assert verification.greedy_agrees.all()
    assert verification.greedy_consistent is not None
    assert not verification.greedy_consistent.any()
    assert not verification.passed
    assert "not an argmax of the logits returned with it" in str(verification.first_problem())


def test_a_relative_tolerance_grows_with_the_rows_largest_logit() -> None:
    """Low-precision backends err in proportion to their logits' size (see the backend
    contract's optional ``relative_tolerance``)."""
    expected = np.array([[10.0, 0.0, -20.0], [1.0, 0.0, -2.0]])
    actual = expected + 0.25
    strict = compare_results(result(actual), expected, tolerance=0.05)
    assert strict.logits_agree is not None
    assert strict.logits_agree.tolist() == [False, False]
    scaled = compare_results(result(actual), expected, tolerance=0.05, relative_tolerance=0.01)
    assert scaled.allowed.tolist() == [0.25, 0.07]  # 0.05 + 0.01 x 20 and 0.05 + 0.01 x 2
    assert scaled.logits_agree is not None
    assert scaled.logits_agree.tolist() == [True, False]
    assert scaled.first_problem() == (
        "final logits of request 1 differ from one-shot by 0.25 > allowed 0.07 (tolerance "
        "0.05 + relative_tolerance 0.01 x the reference's largest |logit| 2) at vocabulary "
        "column 0"
    )
    assert "(tolerance 0.05 + 0.01 x largest |logit|)" in scaled.describe()
    with pytest.raises(InvalidInputError, match="'relative_tolerance' must be a finite real"):
        compare_results(result(actual), expected, tolerance=0.05, relative_tolerance=-1)


def test_verify_against_one_shot_takes_the_backends_relative_tolerance() -> None:
    class Relative(reference.ReferenceBackend):  # type: ignore[misc,name-defined]
        relative_tolerance = 0.125

    backend = Relative(reference.ReferenceBackend.from_seed(seed=2).weights)
    schedule = plan_prefill(LENGTHS, CONFIG)
    verification = verify_against_one_shot(schedule, backend, prompts(backend))
    assert verification.relative_tolerance == 0.125
    mine = verify_against_one_shot(schedule, backend, prompts(backend), relative_tolerance=0)
    assert mine.relative_tolerance == 0.0


def test_messages_name_the_request_the_position_and_the_column_separately() -> None:
    expected = np.zeros((2, 5))
    logits = expected.copy()
    logits[1, 3] = 0.25
    verification = compare_results(
        result(logits, [0, 0]), expected, tolerance=1e-3, prompt_lengths=[7, 9]
    )
    assert verification.first_problem() == (
        "final logits of request 1 at position 8 differ from one-shot by 0.25 > tolerance "
        "0.001 at vocabulary column 3"
    )
    assert verification.max_abs_logit_diff == 0.25
    assert verification.requests_agreeing == 1
    assert verification.logits_agree is not None
    assert verification.logits_agree.tolist() == [True, False]


def test_non_finite_logits_never_agree() -> None:
    logits = np.zeros((1, 3))
    logits[0, 2] = np.nan
    verification = compare_results(result(logits), np.zeros((1, 3)), tolerance=1.0)
    assert not verification.passed
    assert verification.max_abs_logit_diff is not None
    assert np.isnan(verification.max_abs_logit_diff)
    assert "at vocabulary column 2" in verification.describe()


@pytest.mark.parametrize(
    ("actual", "expected", "message"),
    [
        (result(), np.zeros((1, 2)), "'actual' must hold logits or greedy ids"),
        (result(np.zeros((1, 3))), np.zeros((1, 2)), r"'actual.logits' must have .* \(1, 2\)"),
        (result(greedy=[0, 1]), np.zeros((1, 2)), "'actual.greedy_token_ids' must have one id"),
        (result(greedy=[0]), result(greedy=[0]), "'expected' must hold logits"),
        (result(greedy=[0]), np.zeros(2), r"'expected' must be a float array"),
        (result(greedy=[0]), np.array([[1, 0]]), r"'expected' must be a float array"),
    ],
)
def test_bad_arguments_are_rejected(actual: Any, expected: Any, message: str) -> None:
    with pytest.raises(InvalidInputError, match=message):
        compare_results(actual, expected, tolerance=0.0)


@pytest.mark.parametrize("tolerance", [-1.0, float("nan"), float("inf"), True, "0"])
def test_a_tolerance_is_a_finite_real_number_at_least_zero(tolerance: Any) -> None:
    # (An infinite one would let any logits agree.)
    with pytest.raises(InvalidInputError, match="'tolerance' must be a finite real number >= 0"):
        compare_results(result(greedy=[0]), np.zeros((1, 2)), tolerance=tolerance)


def test_a_verification_is_frozen() -> None:
    verification = compare_results(result(greedy=[0]), np.zeros((1, 2)), tolerance=0.0)
    assert isinstance(verification, Verification)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        verification.tolerance = 1.0  # type: ignore[misc]


# -- on the reference backend ----------------------------------------------------------------

LENGTHS = [9, 3, 14]
CONFIG = PlannerConfig(max_num_batched_tokens=6, long_prefill_token_threshold=4)


def prompts(backend: Any) -> list[npt.NDArray[np.int64]]:
    rng = np.random.default_rng(3)
    return [rng.integers(0, backend.vocab_size, size=n) for n in LENGTHS]


def test_a_chunked_run_of_the_reference_agrees_with_one_shot() -> None:
    backend = reference.ReferenceBackend.from_seed(seed=2)
    computed = [4, 0, 13]
    schedule = plan_prefill(LENGTHS, CONFIG, num_computed_tokens=computed)
    seen: list[int] = []
    verification = verify_against_one_shot(
        schedule, backend, prompts(backend), on_dispatch=lambda done: seen.append(done.index)
    )
    assert verification.passed, verification.describe()
    assert verification.greedy_agrees is not None
    assert verification.requests_agreeing == len(LENGTHS)
    assert seen == [*range(schedule.num_dispatches), 0]  # chunked, then the one-shot dispatch


@pytest.mark.parametrize(
    ("page_size", "message"),
    [
        (0, r"^'page_size' must be >= 1: 0$"),
        (False, r"^'page_size' must be an int: False \(bool\)$"),
        ("4", r"^'page_size' must be an int: '4' \(str\)$"),
    ],
)
def test_a_bad_page_size_is_refused_as_execute_schedule_refuses_it(
    page_size: Any, message: str
) -> None:
    backend = reference.ReferenceBackend.from_seed(seed=2)
    schedule = plan_prefill(LENGTHS, CONFIG, num_computed_tokens=[4, 0, 13])
    with pytest.raises(InvalidInputError, match=message):
        verify_against_one_shot(schedule, backend, prompts(backend), page_size=page_size)
    assert verify_against_one_shot(schedule, backend, prompts(backend), page_size=1).passed


@pytest.mark.parametrize("count", [2, 4])
def test_too_few_or_many_prompts_are_named_as_token_ids_before_prefixes_are_written(
    count: int,
) -> None:
    backend = reference.ReferenceBackend.from_seed(seed=2)
    schedule = plan_prefill(LENGTHS, CONFIG, num_computed_tokens=[4, 0, 13])
    ids = (prompts(backend) * 2)[:count]
    with pytest.raises(InvalidInputError, match=rf"^'token_ids' must hold one entry per "
                       rf"request \(3\): {count} entries$"):  # fmt: skip
        verify_against_one_shot(schedule, backend, ids)


def test_the_callers_chunked_result_is_compared_and_a_spoiled_one_fails() -> None:
    backend = reference.ReferenceBackend.from_seed(seed=2)
    ids = prompts(backend)
    schedule = plan_prefill(LENGTHS, CONFIG)
    tables = plan_pages(LENGTHS, page_size=4, num_pages=8)
    cache = backend.new_cache(num_pages=8, page_size=4)
    write_prefixes(backend, ids, [0, 0, 0], block_tables=tables, cache=cache)
    chunked = execute_schedule(
        schedule, backend, ids, return_greedy=True, block_tables=tables, cache=cache
    )
    assert verify_against_one_shot(schedule, backend, ids, chunked=chunked).passed
    assert chunked.logits is not None
    spoiled = attrs.evolve(chunked, logits=chunked.logits + 1e-6)
    verification = verify_against_one_shot(schedule, backend, ids, chunked=spoiled)
    assert not verification.passed
    assert verification.describe().startswith("FAIL vs one-shot: max |logit diff| 1e-06")
    # A looser tolerance chosen by the caller passes the same run.
    assert verify_against_one_shot(schedule, backend, ids, chunked=spoiled, tolerance=1e-5).passed
