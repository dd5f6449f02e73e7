"""The exception hierarchy: one base class, a few specific kinds.

Every message names the parameter, the rule it broke and the value received, in the form
``'max_num_batched_tokens' must be >= 1: 0``.
"""

from __future__ import annotations

__all__ = [
    "CacheTooSmallError",
    "InvalidConfigError",
    "InvalidInputError",
    "InvalidScheduleError",
    "PyptoSchedError",
]


class PyptoSchedError(Exception):
    """Base class of every error raised by pypto_sched."""


class InvalidConfigError(PyptoSchedError, ValueError):
    """A planner configuration is malformed or could never make progress."""


class InvalidInputError(PyptoSchedError, ValueError):
    """Prompt lengths, computed-token counts or other call arguments are malformed."""


class InvalidScheduleError(PyptoSchedError, ValueError):
    """A schedule (usually one loaded from JSON) breaks a schedule invariant."""


class CacheTooSmallError(InvalidInputError):
    """The KV cache has fewer pages than the batch needs."""
