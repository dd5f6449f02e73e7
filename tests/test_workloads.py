"""The CLI's synthetic workloads: bounds included, spreads as documented, bad arguments named."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pypto_sched import InvalidInputError
from pypto_sched.core._workloads import synthetic_lengths


def test_uniform_includes_both_bounds() -> None:
    assert (
        synthetic_lengths("uniform", num_requests=5, min_length=7, max_length=7).tolist() == [7] * 5
    )
    lengths = synthetic_lengths("uniform", num_requests=1000, min_length=1, max_length=2)
    assert set(lengths.tolist()) == {1, 2}


def test_bimodal_can_reach_max_length() -> None:
    lengths = synthetic_lengths("bimodal", num_requests=2000, min_length=1, max_length=8)
    assert lengths.max() == 8


# draws are clipped to each bound (sigma twice as wide would clip about 16%).
def test_lognormal_two_standard_deviations_reach_each_bound() -> None:
    low, high = 16, 4096
    lengths = synthetic_lengths("lognormal", num_requests=20_000, min_length=low, max_length=high)
    for bound in (low, high):
        assert 0.01 < np.mean(lengths == bound) < 0.04
    logs = np.log(lengths[(lengths > low) & (lengths < high)])
    assert abs(np.median(logs) - (math.log(low) + math.log(high)) / 2) < 0.1


def test_bimodal_long_prompts_are_in_the_top_half() -> None:
    lengths = synthetic_lengths("bimodal", num_requests=4000, min_length=16, max_length=4096)
    long = lengths[lengths > 4096 // 8]
    assert long.size > 0
    assert long.min() >= 4096 // 2


def test_min_length_one_above_max_length_is_refused() -> None:
    with pytest.raises(InvalidInputError, match=r"'min_length' must be <= max_length = 5: 6"):
        synthetic_lengths("uniform", num_requests=4, min_length=6, max_length=5)


# above 2**31 - 1 that the documented range [0, 2**63 - 1] accepts)
def test_the_seed_range_is_int64() -> None:
    for seed in (2**31, 2**63 - 1):
        assert synthetic_lengths("uniform", num_requests=4, seed=seed).shape == (4,)
    with pytest.raises(InvalidInputError, match=r"'seed'"):
        synthetic_lengths("uniform", num_requests=4, seed=2**63)
