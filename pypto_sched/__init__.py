"""pypto_sched: a pure chunked-prefill planner for LLM inference engines."""

from ._config import POLICIES, PlannerConfig, Policy
from ._errors import (
    CacheTooSmallError,
    InvalidConfigError,
    InvalidInputError,
    InvalidScheduleError,
    PyptoSchedError,
)
from ._policies import plan_prefill
from ._schedule import FORMAT_VERSION, Chunk, Dispatch, Schedule

__all__ = [
    "FORMAT_VERSION",
    "POLICIES",
    "CacheTooSmallError",
    "Chunk",
    "Dispatch",
    "InvalidConfigError",
    "InvalidInputError",
    "InvalidScheduleError",
    "PlannerConfig",
    "Policy",
    "PyptoSchedError",
    "Schedule",
    "plan_prefill",
]
