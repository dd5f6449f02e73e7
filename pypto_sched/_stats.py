"""Summary figures of a schedule: what the CLI prints and ``compare`` tabulates."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs
import numpy as np

if TYPE_CHECKING:
    from ._schedule import Schedule

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
    def of(cls, schedule: Schedule) -> ScheduleStats:
        """The figures of ``schedule`` (what :attr:`Schedule.stats` returns, cached)."""
        tokens = schedule.tokens_per_dispatch
        finish = schedule.finish_dispatch
        return cls(
            num_requests=schedule.num_requests,
            num_tokens=schedule.num_tokens,
            num_dispatches=schedule.num_dispatches,
            lower_bound=schedule.lower_bound,
            min_tokens_per_dispatch=int(tokens.min()),
            mean_tokens_per_dispatch=float(tokens.mean()),
            max_tokens_per_dispatch=int(tokens.max()),
            mean_utilization=float(np.mean(schedule.utilization)),
            min_utilization=float(np.min(schedule.utilization)),
            mean_finish_dispatch=float(finish.mean()),
            worst_finish_dispatch=int(finish.max()),
        )

    def to_dict(self) -> dict[str, Any]:
        """The figures as a JSON-ready dict, keyed by attribute name."""
        return attrs.asdict(self)
