"""Summary figures of a schedule: what the CLI prints and ``compare`` tabulates.

Built from a schedule's arrays (:meth:`ScheduleStats.from_arrays`), so this module does not
import ``_schedule.py``, which imports it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs
import numpy as np
import numpy.typing as npt

from ._validate import as_count_array, check_int

__all__ = ["ScheduleStats"]


@attrs.frozen(kw_only=True)
class ScheduleStats:
    """How many dispatches a schedule takes, how full they are, and when requests finish."""

    num_requests: int
    num_tokens: int
    num_dispatches: int
    lower_bound: int
    min_tokens_per_dispatch: int
    mean_tokens_per_dispatch: float
    max_tokens_per_dispatch: int
    #: Tokens carried over ``max_num_batched_tokens``, averaged over dispatches.
    mean_utilization: float
    min_utilization: float
    #: Dispatch index (0-based) at which requests finish: mean and worst.
    mean_finish_dispatch: float
    worst_finish_dispatch: int

    @classmethod
    def from_arrays(
        cls,
        *,
        tokens_per_dispatch: npt.NDArray[np.int64] | Sequence[int],
        finish_dispatch: npt.NDArray[np.int64] | Sequence[int],
        max_num_batched_tokens: int,
        lower_bound: int,
    ) -> ScheduleStats:
        """The figures of a schedule whose dispatches carry ``tokens_per_dispatch`` tokens and
        whose requests finish in dispatches ``finish_dispatch`` (what
        :attr:`Schedule.stats` returns, cached).

        Each is checked: at least one dispatch, each of 1 to ``max_num_batched_tokens``
        tokens; at least one request, each finishing in one of those dispatches; a lower
        bound of at least 1. Sequences of ints are taken as arrays are.
        """
        budget = check_int("max_num_batched_tokens", max_num_batched_tokens, min_value=1)
        tokens = as_count_array(
            "tokens_per_dispatch", tokens_per_dispatch, min_value=1, max_value=budget
        )
        finish_dispatch = as_count_array(
            "finish_dispatch", finish_dispatch, min_value=0, max_value=tokens.size - 1
        )
        lower_bound = check_int("lower_bound", lower_bound, min_value=1)
        utilization = tokens / budget
        return cls(
            num_requests=int(finish_dispatch.size),
            num_tokens=int(tokens.sum()),
            num_dispatches=int(tokens.size),
            lower_bound=lower_bound,
            min_tokens_per_dispatch=int(tokens.min()),
            mean_tokens_per_dispatch=float(tokens.mean()),
            max_tokens_per_dispatch=int(tokens.max()),
            mean_utilization=float(utilization.mean()),
            min_utilization=float(utilization.min()),
            mean_finish_dispatch=float(finish_dispatch.mean()),
            worst_finish_dispatch=int(finish_dispatch.max()),
        )

    def to_dict(self) -> dict[str, Any]:
        """The figures as a JSON-ready dict, keyed by attribute name."""
        return attrs.asdict(self)
