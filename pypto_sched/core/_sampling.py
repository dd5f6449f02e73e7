"""Choosing the next token from a row of logits: greedy, or seeded sampling.

Reproducibility is the rule that shapes this module. The random stream that picks request
``r``'s ``t``-th generated token is seeded by ``(seed, r, t)`` alone (NumPy's PCG64 from a
``SeedSequence`` of the three), so the tokens a batch generates do not depend on the policy,
the token budget, the pool size, preemptions or how the batch is split across devices: only on
the logits, which a batch-invariant backend computes the same way in every case.

Sampling, for ``temperature > 0``: logits less their maximum are divided by the temperature
and turned into probabilities in float64 (subtracting first keeps a tiny temperature or huge
logits from overflowing: the scaled values are at most 0, and an overflow is a -inf, a
probability of 0); tokens are ranked by probability (ties: lower id first); ``top_k``
keeps the ``k`` first, then ``top_p`` keeps the shortest prefix of the ranking whose
probability reaches ``p``; one uniform draw ``u`` in ``[0, 1)`` picks the first kept token
whose cumulative (renormalised) probability exceeds ``u``. ``temperature == 0`` is greedy: the
highest logit, lower id first on ties, and no random number is drawn (``top_k``, ``top_p``
and ``seed`` are ignored, as in vLLM and transformers). ``banned`` tokens (a request's stop
tokens while it has fewer than ``min_tokens``) are never chosen, greedy or sampled.

:class:`SamplingParams` also says when a request ends and what it reports, as vLLM's does:
``max_tokens``, ``min_tokens``, ``stop`` strings, ``stop_token_ids``, ``ignore_eos`` and
``logprobs``; :func:`~pypto_sched.generate` applies them (stop strings need text: it takes a
``detokenize`` function, which :class:`~pypto_sched.LLM` passes).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable
from typing import Any

import attrs
import numpy as np
import numpy.typing as npt

from ._errors import InvalidConfigError, InvalidInputError
from ._validate import check_int, count_validator

__all__ = ["DEFAULT_MAX_TOKENS", "SamplingParams", "sample_token", "token_logprobs"]

#: New tokens of a request that names no number (vLLM's ``SamplingParams`` default).
DEFAULT_MAX_TOKENS = 16


def _python_number(value: object) -> object:
    """A NumPy number as the Python float it holds (checked by the validators after)."""
    return float(value) if isinstance(value, np.floating | np.integer) else value


def _finite_non_negative(instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise InvalidConfigError.about(attribute.name, f"must be a finite number: {value!r}")
    try:
        finite = math.isfinite(value)
    except OverflowError:  # an int beyond every float (its repr may be too long to show)
        bits = int(value).bit_length()
        raise InvalidConfigError.about(
            attribute.name, f"must be a finite number: an int of {bits} bits, beyond every float"
        ) from None
    if not finite:
        raise InvalidConfigError.about(attribute.name, f"must be a finite number: {value!r}")
    if value < 0:
        raise InvalidConfigError.about(attribute.name, f"must be >= 0: {value!r}")


def _optional_top_p(
    instance: object, attribute: attrs.Attribute[float | None], value: object
) -> None:
    if value is None:
        return
    if not isinstance(value, int | float) or isinstance(value, bool) or not 0 < value <= 1:
        raise InvalidConfigError.about("top_p", f"must be a number in (0, 1]: {value!r}")


def _seed(instance: object, attribute: attrs.Attribute[int], value: object) -> None:
    check_int("seed", value, min_value=0, max_value=2**63 - 1, error=InvalidConfigError)


def _tuple_of(value: object) -> object:
    """A list or tuple as a tuple (a lone string is one stop string); anything else as is,
    for the validator to name."""
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list | tuple | frozenset | set):
        return tuple(sorted(value)) if isinstance(value, frozenset | set) else tuple(value)
    return value


def _stop_strings(
    instance: object, attribute: attrs.Attribute[tuple[str, ...]], value: object
) -> None:
    if not isinstance(value, tuple):
        raise InvalidConfigError.about("stop", f"must be a string or a list of strings: {value!r}")
    for i, stop in enumerate(value):
        if not isinstance(stop, str) or not stop:
            raise InvalidConfigError.about(f"stop[{i}]", f"must be a non-empty string: {stop!r}")


def _stop_ids(instance: object, attribute: attrs.Attribute[tuple[int, ...]], value: object) -> None:
    if not isinstance(value, tuple):
        raise InvalidConfigError.about("stop_token_ids", f"must be a list of token ids: {value!r}")
    for i, token in enumerate(value):
        check_int(f"stop_token_ids[{i}]", token, min_value=0, error=InvalidConfigError)


def _bool(instance: object, attribute: attrs.Attribute[bool], value: object) -> None:
    if not isinstance(value, bool):
        raise InvalidConfigError.about(attribute.name, f"must be a bool: {value!r}")


@attrs.frozen(kw_only=True)
class SamplingParams:
    """How a request's tokens are chosen, when it ends and what it reports. The default is
    greedy, up to the caller's number of new tokens.

    ``top_k``, ``top_p`` and ``seed`` shape sampling only: at ``temperature == 0`` (greedy)
    they are accepted and ignored, as vLLM and transformers ignore them under greedy decoding.
    """

    #: ``0``: greedy (argmax). Above ``0``: sample from ``softmax(logits / temperature)``.
    temperature: float = attrs.field(
        default=0.0, converter=_python_number, validator=_finite_non_negative
    )
    #: Keep only the ``top_k`` most likely tokens (``None``: all).
    top_k: int | None = attrs.field(default=None, validator=count_validator(1, optional=True))
    #: Keep the fewest most likely tokens whose probability reaches ``top_p`` (``None``: all).
    top_p: float | None = attrs.field(
        default=None, converter=_python_number, validator=_optional_top_p
    )
    #: Seeds every request's random stream, with the request index and the token index.
    seed: int = attrs.field(default=0, validator=_seed)
    #: New tokens at most (``None``: the caller's default, else :data:`DEFAULT_MAX_TOKENS`).
    max_tokens: int | None = attrs.field(default=None, validator=count_validator(1, optional=True))
    #: Stop tokens and stop strings do not end the request before it has this many tokens
    #: (stop tokens are not chosen until then, as vLLM masks them).
    min_tokens: int = attrs.field(default=0, validator=count_validator(0))
    #: Strings that end the request when its text holds one; the text ends before it.
    stop: tuple[str, ...] = attrs.field(default=(), converter=_tuple_of, validator=_stop_strings)
    #: Token ids that end the request (the token is kept), beside the EOS ids.
    stop_token_ids: tuple[int, ...] = attrs.field(
        default=(), converter=_tuple_of, validator=_stop_ids
    )
    #: Do not stop on the ids every request stops on (the model's EOS ids).
    ignore_eos: bool = attrs.field(default=False, validator=_bool)
    #: Completions of the prompt (:class:`~pypto_sched.LLM` draws each as a request of its
    #: own; :func:`~pypto_sched.generate` runs one a request and refuses more).
    n: int = attrs.field(default=1, validator=count_validator(1))
    #: Report each generated token's log-probability and the ``logprobs`` likeliest
    #: tokens' (``0``: the chosen token's only; ``None``: none), from the model's raw
    #: logits, as vLLM reports them.
    logprobs: int | None = attrs.field(default=None, validator=count_validator(0, optional=True))

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0


def sample_token(
    logits: npt.NDArray[np.floating[Any]],
    params: SamplingParams,
    *,
    request_index: int,
    token_index: int,
    banned: Collection[int] = (),
) -> int:
    """The token chosen from one row of ``logits`` for request ``request_index``'s
    ``token_index``-th generated token (both counted from 0), as the module docstring states;
    never one of ``banned``.
    """
    if not isinstance(params, SamplingParams):
        raise InvalidInputError.about(
            "params", f"must be a SamplingParams: {type(params).__name__}"
        )
    row = _logits_row(logits)
    # (Checked under greedy decoding too, which does not read them: a bad index is a bug
    # whichever the params.)
    request = check_int("request_index", request_index, min_value=0, max_value=2**63 - 1)
    token = check_int("token_index", token_index, min_value=0, max_value=2**63 - 1)
    banned_ids = _banned(banned, row.size)
    if banned_ids.size:
        row = row.astype(np.float64)
        row[banned_ids] = -np.inf
    if params.is_greedy:
        return int(np.argmax(row))
    row = row.astype(np.float64, copy=False)  # (a copy already when some were banned)
    with np.errstate(over="ignore", invalid="ignore"):  # an overflow is a -inf: a probability 0
        scaled = (row - row.max()) / params.temperature
    ranking = np.argsort(-scaled, kind="stable")  # most likely first, lower id on ties
    if params.top_k is not None:
        ranking = ranking[: params.top_k]
    weights = np.exp(scaled[ranking])
    probabilities = weights / weights.sum()
    if params.top_p is not None:
        reach = np.cumsum(probabilities)
        keep = int(np.searchsorted(reach, params.top_p * (1 - 1e-12))) + 1
        ranking, probabilities = ranking[:keep], probabilities[:keep]
        probabilities = probabilities / probabilities.sum()
    draw = np.random.default_rng([params.seed, request, token]).random()
    cumulative = np.cumsum(probabilities)
    choice = min(int(np.searchsorted(cumulative, draw, side="right")), ranking.size - 1)
    return int(ranking[choice])


def _logits_row(logits: npt.NDArray[np.floating[Any]]) -> npt.NDArray[Any]:
    """``logits`` as one non-empty row of finite real numbers, or :class:`InvalidInputError`."""
    row = np.asarray(logits)
    if row.ndim != 1 or row.size == 0:
        raise InvalidInputError.about("logits", f"must be one non-empty row: shape {row.shape}")
    if row.dtype.kind not in "fiu":  # not bools, complex numbers, strings or objects
        raise InvalidInputError.about("logits", f"must hold real numbers: dtype {row.dtype}")
    if not np.isfinite(row).all():
        bad = int(np.flatnonzero(~np.isfinite(row))[0])
        raise InvalidInputError.about("logits", f"must be finite: column {bad} is {row[bad]}")
    return row


def _banned(banned: Iterable[int], vocab_size: int) -> npt.NDArray[np.int64]:
    ids = sorted({check_int("banned", token, min_value=0) for token in banned})
    if ids and ids[-1] >= vocab_size:
        raise InvalidInputError.about(
            "banned", f"ids must be < the row's {vocab_size} columns: {ids[-1]}"
        )
    if len(ids) == vocab_size:
        raise InvalidInputError.about(
            "banned", f"must leave a token to choose: all {vocab_size} banned"
        )
    return np.array(ids, dtype=np.int64)


def token_logprobs(
    logits: npt.NDArray[np.floating[Any]], token: int, *, top: int
) -> tuple[float, npt.NDArray[np.int64], npt.NDArray[np.float64]]:
    """The log-probability of ``token`` under ``softmax(logits)`` (the raw logits: no
    temperature, no top-k or top-p, as vLLM's default ``raw_logprobs``), and the ``top``
    likeliest tokens' ids and log-probabilities, likeliest first (lower id on ties); every
    token when ``top`` is more than the row holds. ``logits`` is checked as
    :func:`sample_token` checks it, ``token`` must be a column of it and ``top`` at least 0.
    """
    row = _logits_row(logits).astype(np.float64, copy=False)
    token = check_int("token", token, min_value=0, max_value=row.size - 1)
    top = check_int("top", top, min_value=0)
    shifted = row - row.max()
    logprobs = shifted - np.log(np.exp(shifted).sum())
    best = np.argsort(-logprobs, kind="stable")[:top]
    return float(logprobs[token]), best.astype(np.int64), logprobs[best]
