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
and ``seed`` are ignored, as in vLLM and transformers).
"""

from __future__ import annotations

import math
from typing import Any

import attrs
import numpy as np
import numpy.typing as npt

from ._errors import InvalidConfigError, InvalidInputError
from ._validate import check_int

__all__ = ["SamplingParams", "sample_token"]


def _python_number(value: object) -> object:
    """A NumPy number as the Python float it holds (checked by the validators after)."""
    return float(value) if isinstance(value, np.floating | np.integer) else value


def _finite_non_negative(instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise InvalidConfigError(f"'{attribute.name}' must be a finite number: {value!r}")
    try:
        finite = math.isfinite(value)
    except OverflowError:  # an int beyond every float (its repr may be too long to show)
        bits = int(value).bit_length()
        raise InvalidConfigError(
            f"'{attribute.name}' must be a finite number: an int of {bits} bits, beyond every float"
        ) from None
    if not finite:
        raise InvalidConfigError(f"'{attribute.name}' must be a finite number: {value!r}")
    if value < 0:
        raise InvalidConfigError(f"'{attribute.name}' must be >= 0: {value!r}")


def _optional_top_k(
    instance: object, attribute: attrs.Attribute[int | None], value: object
) -> None:
    if value is not None:
        check_int("top_k", value, min_value=1, error=InvalidConfigError)


def _optional_top_p(
    instance: object, attribute: attrs.Attribute[float | None], value: object
) -> None:
    if value is None:
        return
    if not isinstance(value, int | float) or isinstance(value, bool) or not 0 < value <= 1:
        raise InvalidConfigError(f"'top_p' must be a number in (0, 1]: {value!r}")


def _seed(instance: object, attribute: attrs.Attribute[int], value: object) -> None:
    check_int("seed", value, min_value=0, max_value=2**63 - 1, error=InvalidConfigError)


@attrs.frozen(kw_only=True)
class SamplingParams:
    """How the next token is chosen. The default is greedy.

    ``top_k``, ``top_p`` and ``seed`` shape sampling only: at ``temperature == 0`` (greedy)
    they are accepted and ignored, as vLLM and transformers ignore them under greedy decoding.
    """

    #: ``0``: greedy (argmax). Above ``0``: sample from ``softmax(logits / temperature)``.
    temperature: float = attrs.field(
        default=0.0, converter=_python_number, validator=_finite_non_negative
    )
    #: Keep only the ``top_k`` most likely tokens (``None``: all).
    top_k: int | None = attrs.field(default=None, validator=_optional_top_k)
    #: Keep the fewest most likely tokens whose probability reaches ``top_p`` (``None``: all).
    top_p: float | None = attrs.field(
        default=None, converter=_python_number, validator=_optional_top_p
    )
    #: Seeds every request's random stream, with the request index and the token index.
    seed: int = attrs.field(default=0, validator=_seed)

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0


def sample_token(
    logits: npt.NDArray[np.floating[Any]],
    params: SamplingParams,
    *,
    request_index: int,
    token_index: int,
) -> int:
    """The token chosen from one row of ``logits`` for request ``request_index``'s
    ``token_index``-th generated token (both counted from 0), as the module docstring states.
    """
    if not isinstance(params, SamplingParams):
        raise InvalidInputError(f"'params' must be a SamplingParams: {type(params).__name__}")
    row = np.asarray(logits)
    if row.ndim != 1 or row.size == 0:
        raise InvalidInputError(f"'logits' must be one non-empty row: shape {row.shape}")
    if row.dtype.kind not in "fiu":  # not bools, complex numbers, strings or objects
        raise InvalidInputError(f"'logits' must hold real numbers: dtype {row.dtype}")
    if not np.isfinite(row).all():
        bad = int(np.flatnonzero(~np.isfinite(row))[0])
        raise InvalidInputError(f"'logits' must be finite: column {bad} is {row[bad]}")
    # (Checked under greedy decoding too, which does not read them: a bad index is a bug
    # whichever the params.)
    request = check_int("request_index", request_index, min_value=0, max_value=2**63 - 1)
    token = check_int("token_index", token_index, min_value=0, max_value=2**63 - 1)
    if params.is_greedy:
        return int(np.argmax(row))
    row = row.astype(np.float64)
    with np.errstate(over="ignore"):  # an overflow is a -inf: a probability of 0
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
