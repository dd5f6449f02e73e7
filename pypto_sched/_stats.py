"""Summary figures of a schedule: what the CLI prints and ``compare`` tabulates.

Built from a schedule's arrays (:meth:`ScheduleStats.from_arrays`), so this module does not
import ``_schedule.py``, which imports it.
"""

from __future__ import annotations

from typing import Any

import attrs
import numpy as np
import numpy.typing as npt

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
        tokens_per_dispatch: npt.NDArray[np.int64],
        finish_dispatch: npt.NDArray[np.int64],
        max_num_batched_tokens: int,
        lower_bound: int,
    ) -> ScheduleStats:
        """The figures of a schedule whose dispatches carry ``tokens_per_dispatch`` tokens and
        whose requests finish in dispatches ``finish_dispatch`` (what
        :attr:`Schedule.stats` returns, cached)."""
        tokens = tokens_per_dispatch
        utilization = tokens / max_num_batched_tokens
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
