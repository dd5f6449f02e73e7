"""Named synthetic workloads: prompt lengths drawn from a distribution with a seed.

Pure functions: the same name, parameters and seed give the same lengths on every machine
(NumPy's ``Generator`` with PCG64 is stable across platforms and versions for the draws used
here). The command line offers them as ``--workload NAME``.

- ``seed``: the seed's batch, every prompt 3,338 tokens (the bounds and the seed are unused);
- ``uniform``: lengths uniform in ``[min_length, max_length]``;
- ``lognormal``: log-lengths normal, median the geometric middle of the bounds, two standard
  deviations reaching each bound, clipped to them — most prompts mid-sized, a long tail;
- ``bimodal``: four in five prompts short (uniform up to an eighth of ``max_length``), one in
  five long (uniform in the top half) — chat turns mixed with documents.
"""

from __future__ import annotations

import math
from typing import Literal, get_args

import numpy as np
import numpy.typing as npt

from ._errors import InvalidInputError
from ._validate import check_int, read_only

__all__ = ["SEED_PROMPT_LENGTH", "WORKLOADS", "Workload", "synthetic_lengths"]

Workload = Literal["seed", "uniform", "lognormal", "bimodal"]
#: The named workloads, in the order the docs describe them.
WORKLOADS: tuple[Workload, ...] = get_args(Workload)

#: Every prompt of the seed's batch (16 prompts of 3,338 tokens).
SEED_PROMPT_LENGTH = 3338

#: Share of long prompts in ``bimodal``.
_LONG_SHARE = 0.2


def synthetic_lengths(
    name: str,
    *,
    num_requests: int,
    seed: int = 0,
    min_length: int = 1,
    max_length: int = 4096,
) -> npt.NDArray[np.int64]:
    """Return ``num_requests`` prompt lengths of workload ``name``, a read-only int64 array.

    Raises :class:`~pypto_sched.InvalidInputError` for an unknown name or bad bounds.
    """
    if name not in WORKLOADS:
        choices = ", ".join(repr(w) for w in WORKLOADS)
        raise InvalidInputError.about("workload", f"must be one of {choices}: {name!r}")
    count = check_int("num_requests", num_requests, min_value=1, max_value=10_000_000)
    low = check_int("min_length", min_length, min_value=1)
    high = check_int("max_length", max_length, min_value=1)
    if low > high:
        raise InvalidInputError.about("min_length", f"must be <= max_length = {high}: {low}")
    seed = check_int("seed", seed, min_value=0, max_value=2**63 - 1)
    rng = np.random.default_rng(seed)
    draw = _DRAWS[name]
    return read_only(draw(rng, count, low, high))


def _seed_lengths(
    _rng: np.random.Generator, n: int, _low: int, _high: int
) -> npt.NDArray[np.int64]:
    return np.full(n, SEED_PROMPT_LENGTH, dtype=np.int64)


def _uniform(rng: np.random.Generator, n: int, low: int, high: int) -> npt.NDArray[np.int64]:
    return rng.integers(low, high, size=n, endpoint=True, dtype=np.int64)


def _lognormal(rng: np.random.Generator, n: int, low: int, high: int) -> npt.NDArray[np.int64]:
    log_low, log_high = math.log(low), math.log(high)
    mean = (log_low + log_high) / 2
    sigma = (log_high - log_low) / 4
    values = np.exp(rng.normal(mean, sigma, size=n))
    return np.clip(np.rint(values), low, high).astype(np.int64)


def _bimodal(rng: np.random.Generator, n: int, low: int, high: int) -> npt.NDArray[np.int64]:
    short_high = max(low, high // 8)
    long_low = max(low, high // 2)
    is_long = rng.random(n) < _LONG_SHARE
    short = rng.integers(low, short_high, size=n, endpoint=True, dtype=np.int64)
    long = rng.integers(long_low, high, size=n, endpoint=True, dtype=np.int64)
    return np.where(is_long, long, short)


_DRAWS = {
    "seed": _seed_lengths,
    "uniform": _uniform,
    "lognormal": _lognormal,
    "bimodal": _bimodal,
}
