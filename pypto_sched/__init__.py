"""pypto_sched: a pure chunked-prefill planner for LLM inference engines.

Plan with :func:`plan_prefill`, inspect the returned :class:`Schedule`, turn one dispatch into
kernel arrays with :func:`dispatch_arrays`, and run it with a backend.
"""

from ._config import POLICIES, PlannerConfig, Policy
from ._dispatch import DispatchArrays, dispatch_arrays
from ._errors import (
    CacheTooSmallError,
    InvalidConfigError,
    InvalidInputError,
    InvalidScheduleError,
    PyptoSchedError,
)
from ._pages import BlockTables, plan_pages
from ._policies import plan_prefill
from ._schedule import FORMAT_VERSION, Chunk, Dispatch, Schedule
from ._warmup import WarmupShape, plan_warmup

__all__ = [
    "FORMAT_VERSION",
    "POLICIES",
    "BlockTables",
    "CacheTooSmallError",
    "Chunk",
    "Dispatch",
    "DispatchArrays",
    "InvalidConfigError",
    "InvalidInputError",
    "InvalidScheduleError",
    "PlannerConfig",
    "Policy",
    "PyptoSchedError",
    "Schedule",
    "WarmupShape",
    "dispatch_arrays",
    "plan_pages",
    "plan_prefill",
    "plan_warmup",
]
