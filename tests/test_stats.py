"""ScheduleStats.from_arrays: each figure on a case that tells it from its near misses."""

from __future__ import annotations

import pytest

from pypto_sched import InvalidInputError, ScheduleStats


def stats_of(
    tokens: list[int], finish: list[int], budget: int, lower_bound: int = 1
) -> ScheduleStats:
    return ScheduleStats.from_arrays(
        tokens_per_dispatch=tokens,
        finish_dispatch=finish,
        max_num_batched_tokens=budget,
        lower_bound=lower_bound,
    )


def test_the_mean_finish_dispatch_is_the_mean_not_the_median() -> None:
    stats = stats_of([1, 1, 1, 1], [0, 0, 3], budget=4)
    assert stats.mean_finish_dispatch == 1.0  # the median is 0
    assert stats.worst_finish_dispatch == 3


def test_utilization_is_over_the_budget_even_when_no_dispatch_fills_it() -> None:
    stats = stats_of([2, 4], [1], budget=8)
    assert stats.mean_utilization == 3 / 8
    assert stats.min_utilization == 2 / 8


def test_a_lower_bound_of_zero_is_refused() -> None:
    with pytest.raises(InvalidInputError, match=r"'lower_bound' must be >= 1: 0"):
        stats_of([1], [0], budget=1, lower_bound=0)
