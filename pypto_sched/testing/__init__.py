"""Testing tools for pypto_sched users and backend authors.

Each part lives in its own private module. :func:`check_backend` needs only NumPy; names
from modules that import Hypothesis (the strategies) are listed in ``_LAZY`` and imported on
first use, so ``import pypto_sched.testing`` works where Hypothesis is not installed.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._conformance import check_backend

if TYPE_CHECKING:  # what type checkers see for the lazily imported names
    from ._strategies import (
        planner_configs,
        prefill_states,
        prefill_states_with_configs,
        prompt_lengths,
        schedules,
    )

#: Public names defined in modules that import Hypothesis: name -> private module. A name
#: added here is also added to ``__all__`` and imported under ``TYPE_CHECKING`` above.
_LAZY: dict[str, str] = {
    "planner_configs": "._strategies",
    "prefill_states": "._strategies",
    "prefill_states_with_configs": "._strategies",
    "prompt_lengths": "._strategies",
    "schedules": "._strategies",
}

__all__ = [
    "check_backend",
    "planner_configs",
    "prefill_states",
    "prefill_states_with_configs",
    "prompt_lengths",
    "schedules",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
