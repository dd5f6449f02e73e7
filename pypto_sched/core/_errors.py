"""The exception hierarchy: one base class, a few specific kinds.

Every message names the parameter, the rule it broke and the value received, in the form
``'max_num_batched_tokens' must be >= 1: 0``.
"""

from __future__ import annotations

import pickle

__all__ = [
    "BackendError",
    "BackendNotFoundError",
    "CacheTooSmallError",
    "CheckpointError",
    "DuplicateRequestError",
    "ExecutionError",
    "InvalidConfigError",
    "InvalidInputError",
    "InvalidScheduleError",
    "PyptoSchedError",
    "UnknownRequestError",
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


class CheckpointError(InvalidInputError):
    """A checkpoint file is missing, malformed or describes a model the backends do not
    implement; the message names the file and, where there is one, the tensor."""


class DuplicateRequestError(InvalidInputError):
    """A request id was added to a ``PrefillState`` that already holds it."""


class UnknownRequestError(InvalidInputError, KeyError):
    """A request id is not in the ``PrefillState`` (never added, finished or removed).

    It is also a ``KeyError``, so ``state.get(request_id)`` and ``in`` work as for a dict.
    """

    def __str__(self) -> str:  # KeyError would wrap the message in quotes
        return str(self.args[0]) if self.args else ""


class BackendError(PyptoSchedError):
    """A backend could not be found, loaded or run."""


class BackendNotFoundError(BackendError, ValueError):
    """No installed backend is registered under the name asked for."""


class ExecutionError(BackendError):
    """A backend failed while running one dispatch of a schedule.

    ``dispatch`` is the index of the dispatch that failed; the error's cause is the backend's
    own exception. No partial result survives it.
    """

    def __init__(self, message: str, *, dispatch: int) -> None:
        super().__init__(message)
        self.dispatch = dispatch

    def __reduce__(self) -> tuple[object, ...]:
        # Pickling an exception drops its cause; an error sent from a worker process (a Ray
        # actor) keeps it, or its text when the cause itself cannot be pickled.
        return (_execution_error, (str(self), self.dispatch, _portable(self.__cause__)))


def _execution_error(message: str, dispatch: int, cause: BaseException | None) -> ExecutionError:
    error = ExecutionError(message, dispatch=dispatch)
    error.__cause__ = cause
    return error


def _portable(cause: BaseException | None) -> BaseException | None:
    """``cause``, or a ``RuntimeError`` with its text when it cannot be pickled and read
    back (an exception whose ``__init__`` takes other arguments than its ``args`` pickles,
    but fails to unpickle, and the receiver gets no error at all)."""
    if cause is None:
        return None
    try:
        pickle.loads(pickle.dumps(cause))
    except Exception:
        return RuntimeError(f"{type(cause).__name__}: {cause}")
    return cause
