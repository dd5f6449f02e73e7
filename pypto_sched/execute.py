"""``pypto_sched.execute``: the public path of :mod:`pypto_sched.runtime.execute`, its home.

Everything that module exports is importable from here, as before the layering.
"""

from __future__ import annotations

from .runtime.execute import (
    DEFAULT_PAGE_SIZE as DEFAULT_PAGE_SIZE,
)
from .runtime.execute import (
    DispatchDone as DispatchDone,
)
from .runtime.execute import (
    ExecutionResult as ExecutionResult,
)
from .runtime.execute import (
    execute_schedule as execute_schedule,
)
from .runtime.execute import (
    write_prefixes as write_prefixes,
)

__all__ = [
    "DEFAULT_PAGE_SIZE",
    "DispatchDone",
    "ExecutionResult",
    "execute_schedule",
    "write_prefixes",
]
