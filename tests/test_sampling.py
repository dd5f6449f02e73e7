"""sample_token: greedy, and seeded sampling whose stream depends on (seed, request, token)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pypto_sched import (
    InvalidConfigError,
    InvalidInputError,
    SamplingParams,
    sample_token,
    token_logprobs,
)

logit_rows = st.lists(
    st.floats(min_value=-20, max_value=20, allow_nan=False), min_size=1, max_size=40
).map(np.array) | st.lists(  # few distinct values: long runs of ties, ranked by id
    st.integers(min_value=-2, max_value=2).map(float), min_size=1, max_size=60
).map(np.array)
sampled_params = st.builds(
    SamplingParams,
    temperature=st.floats(min_value=0.05, max_value=4),
    top_k=st.none() | st.integers(min_value=1, max_value=50),
    top_p=st.none() | st.floats(min_value=0.01, max_value=1),
    seed=st.integers(min_value=0, max_value=2**32),
)


def plain_sample(logits: list[float], params: SamplingParams, request: int, token: int) -> int:
    """The module docstring's rule, written as a loop over Python floats."""
    scaled = [(x - max(logits)) / params.temperature for x in logits]
    ranking = sorted(range(len(scaled)), key=lambda i: (-scaled[i], i))
    if params.top_k is not None:
        ranking = ranking[: params.top_k]
    top = scaled[ranking[0]]
    weights = [math.exp(scaled[i] - top) for i in ranking]
    probabilities = [w / sum(weights) for w in weights]
    if params.top_p is not None:
        total, keep = 0.0, 0
        for keep, p in enumerate(probabilities, start=1):  # noqa: B007
            total += p
            if total >= params.top_p * (1 - 1e-12):
                break
        ranking, probabilities = ranking[:keep], probabilities[:keep]
        probabilities = [p / sum(probabilities) for p in probabilities]
    draw = np.random.default_rng([params.seed, request, token]).random()
    total = 0.0
    for choice, p in zip(ranking, probabilities, strict=True):
        total += p
        if draw < total:
            return choice
    return ranking[-1]


@given(logit_rows)
def test_greedy_is_the_first_highest_logit(logits: np.ndarray) -> None:
    chosen = sample_token(logits, SamplingParams(), request_index=3, token_index=7)
    assert chosen == int(np.argmax(logits))
    assert logits[chosen] == logits.max()


@given(logit_rows, sampled_params, st.integers(0, 1000), st.integers(0, 1000))
def test_sampling_follows_the_stated_rule(
    logits: np.ndarray, params: SamplingParams, request: int, token: int
) -> None:
    chosen = sample_token(logits, params, request_index=request, token_index=token)
    assert chosen == plain_sample(logits.tolist(), params, request, token)


@given(logit_rows, sampled_params)
def test_the_choice_depends_only_on_seed_request_and_token(
    logits: np.ndarray, params: SamplingParams
) -> None:
    first = [sample_token(logits, params, request_index=2, token_index=t) for t in range(5)]
    again = [sample_token(logits.copy(), params, request_index=2, token_index=t) for t in range(5)]
    assert first == again


def test_frequencies_follow_the_probabilities() -> None:
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05]))
    params = SamplingParams(temperature=1.0, seed=11)
    draws = [sample_token(logits, params, request_index=0, token_index=t) for t in range(4000)]
    frequencies = np.bincount(draws, minlength=4) / len(draws)
    assert np.allclose(frequencies, [0.5, 0.3, 0.15, 0.05], atol=0.03)


def test_top_k_and_top_p_keep_only_the_most_likely() -> None:
    logits = np.log(np.array([0.05, 0.5, 0.3, 0.15]))
    top_k = SamplingParams(temperature=1.0, top_k=2)
    top_p = SamplingParams(temperature=1.0, top_p=0.8)
    for params in (top_k, top_p):
        drawn = {sample_token(logits, params, request_index=1, token_index=t) for t in range(300)}
        assert drawn == {1, 2}


def test_ties_rank_the_lower_id_first_however_many() -> None:
    """With ``top_k=1`` only the first of the ranking can be drawn: the lowest id of the
    highest logits (a sort that is not stable breaks ties otherwise beyond 16 of them)."""
    logits = np.random.default_rng(1).integers(0, 3, size=200).astype(np.float64)
    params = SamplingParams(temperature=1.0, top_k=1)
    drawn = {sample_token(logits, params, request_index=0, token_index=t) for t in range(20)}
    assert drawn == {int(np.argmax(logits))}


def test_the_tokens_top_p_keeps_are_renormalised() -> None:
    """top_p 0.6 keeps the tokens of probability 0.5 and 0.3, drawn 5/8 and 3/8 of the time:
    without renormalising, the 0.2 left over would go to the last kept token."""
    logits = np.log(np.array([0.5, 0.3, 0.2]))
    params = SamplingParams(temperature=1.0, top_p=0.6)
    drawn = [sample_token(logits, params, request_index=0, token_index=t) for t in range(4000)]
    assert set(drawn) == {0, 1}
    assert abs(drawn.count(0) / len(drawn) - 5 / 8) < 0.03  # 5 sigma is about 0.038


@pytest.mark.parametrize(
    ("logits", "temperature"),
    [
        ([1.0, 3.0, 2.0], 1e-310),  # 3 / 1e-310 overflows
        ([1.0, 3.0, 2.0], 5e-324),
        ([1e308, 1.7e308, -1.7e308], 0.5),  # 1.7e308 / 0.5 and 1.7e308 + 1.7e308 overflow
    ],
)
@pytest.mark.filterwarnings("error")
def test_a_tiny_temperature_or_huge_logits_pick_the_highest_logit_without_warnings(
    logits: list[float], temperature: float
) -> None:
    params = SamplingParams(temperature=temperature, seed=3)
    for token in range(20):
        chosen = sample_token(np.array(logits), params, request_index=0, token_index=token)
        assert chosen == 1


def test_streams_of_different_requests_differ() -> None:
    logits = np.zeros(1000)
    params = SamplingParams(temperature=1.0, seed=5)
    one = [sample_token(logits, params, request_index=0, token_index=t) for t in range(20)]
    two = [sample_token(logits, params, request_index=1, token_index=t) for t in range(20)]
    assert one != two


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"temperature": -1.0}, "'temperature' must be >= 0: -1.0"),
        ({"temperature": math.nan}, "'temperature' must be a finite number"),
        (
            {"temperature": 10**400},
            r"^'temperature' must be a finite number: an int of 1329 bits, beyond every float$",
        ),
        ({"temperature": 10**5000}, "an int of 16610 bits"),  # beyond what repr may show
        ({"top_k": 0}, "'top_k' must be >= 1: 0"),
        ({"top_p": 0.0}, r"'top_p' must be a number in \(0, 1\]: 0.0"),
        ({"top_p": 1.5}, r"'top_p' must be a number in \(0, 1\]"),
        ({"seed": -1}, "'seed' must be >= 0"),
    ],
)
def test_bad_params_name_the_field(kwargs: dict[str, float], match: str) -> None:
    with pytest.raises(InvalidConfigError, match=match):
        SamplingParams(**kwargs)  # type: ignore[arg-type]


def test_numpy_numbers_are_taken_as_the_python_floats_they_hold() -> None:
    params = SamplingParams(temperature=np.float32(0.5), top_p=np.float32(0.25))
    assert params == SamplingParams(temperature=0.5, top_p=0.25)
    assert type(params.temperature) is float
    assert type(params.top_p) is float
    assert SamplingParams(temperature=np.int64(2)).temperature == 2.0
    with pytest.raises(InvalidConfigError, match="'temperature' must be a finite number"):
        SamplingParams(temperature=np.bool_(True))
    with pytest.raises(InvalidConfigError, match="'top_p' must be a number in"):
        SamplingParams(top_p=np.float32(1.5))


@pytest.mark.parametrize(
    ("logits", "dtype"),
    [
        (np.array(["1", "2"]), "<U1"),
        (np.array([1.0, None]), "object"),
        (np.array([1 + 1j, 2 + 0j]), "complex128"),
        (np.array([True, False]), "bool"),
    ],
)
def test_logits_that_are_not_real_numbers_are_refused(logits: np.ndarray, dtype: str) -> None:
    for params in (SamplingParams(), SamplingParams(temperature=1.0)):
        with pytest.raises(
            InvalidInputError, match=f"^'logits' must hold real numbers: dtype {dtype}$"
        ):
            sample_token(logits, params, request_index=0, token_index=0)
    assert sample_token(np.array([1, 3, 2]), SamplingParams(), request_index=0, token_index=0) == 1


def test_params_must_be_sampling_params() -> None:
    with pytest.raises(InvalidInputError, match=r"^'params' must be a SamplingParams: dict$"):
        sample_token(np.zeros(3), {"temperature": 1.0}, request_index=0, token_index=0)  # type: ignore[arg-type]


def test_bad_logits_are_rejected() -> None:
    with pytest.raises(InvalidInputError, match="one non-empty row"):
        sample_token(np.zeros((2, 3)), SamplingParams(), request_index=0, token_index=0)
    with pytest.raises(InvalidInputError, match="column 1 is nan"):
        sample_token(np.array([0.0, np.nan]), SamplingParams(), request_index=0, token_index=0)


@pytest.mark.parametrize(
    ("logits", "token", "top", "message"),
    [
        (np.zeros((2, 3)), 0, 1, r"'logits' must be one non-empty row: shape \(2, 3\)"),
        (np.array([0.0, np.inf]), 0, 1, "'logits' must be finite: column 1 is inf"),
        (np.array(["a", "b"]), 0, 1, "'logits' must hold real numbers"),
        (np.zeros(3), 3, 1, "'token' must be <= 2: 3"),
        (np.zeros(3), -1, 1, "'token' must be >= 0: -1"),
        (np.zeros(3), 1.0, 1, "'token' must be an int"),
        (np.zeros(3), 0, -1, "'top' must be >= 0: -1"),
    ],
)
def test_token_logprobs_refuses_bad_arguments(
    logits: np.ndarray, token: object, top: object, message: str
) -> None:
    with pytest.raises(InvalidInputError, match=message):
        token_logprobs(logits, token, top=top)  # type: ignore[arg-type]


@given(st.lists(st.floats(-30, 30), min_size=1, max_size=12), st.data())
def test_token_logprobs_match_a_log_softmax(values: list[float], data: st.DataObject) -> None:
    token = data.draw(st.integers(0, len(values) - 1))
    top = data.draw(st.integers(0, len(values) + 2))
    logprob, ids, top_logprobs = token_logprobs(np.array(values), token, top=top)
    expected = [v - math.log(sum(math.exp(w) for w in values)) for v in values]
    assert logprob == pytest.approx(expected[token], abs=1e-9)
    assert len(ids) == min(top, len(values))  # every token when top is more than the row
    assert len(set(ids.tolist())) == len(ids)
    # The likeliest first (which of two within rounding comes first is the computation's).
    assert top_logprobs == pytest.approx(sorted(expected, reverse=True)[:top], abs=1e-9)
    assert top_logprobs == pytest.approx([expected[i] for i in ids], abs=1e-9)
