"""The exception hierarchy: one base class, a few specific kinds.

Every message names the parameter, the rule it broke and the value received, in the form
``'max_num_batched_tokens' must be >= 1: 0``. An error about one parameter also says which in
its ``parameter`` attribute, so that a caller that names parameters its own way (the command
line, by its flags) never reads the message to find it.
"""

from __future__ import annotations

import pickle
from typing import Self

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
    """Base class of every error raised by pypto_sched.

    ``parameter`` is the argument or config field the error is about (``"num_pages"``; for
    an error about one of its items, such as ``max_new_tokens[2]``, the argument), ``None``
    when it is not about one. An error about a parameter as a whole, built by :meth:`about`,
    also keeps its ``rule``: the message after the parameter's quoted name, for a caller that
    names the parameter its own way (``--num-kv-pages: must be >= 1: 0``).
    """

    #: The message after ``'<parameter>'`` when the error is about the parameter as a whole
    #: (see :meth:`about`), else ``None``.
    rule: str | None = None

    def __init__(self, *args: object, parameter: str | None = None) -> None:
        super().__init__(*args)
        self.parameter = parameter

    @classmethod
    def about(cls, name: str, rule: str) -> Self:
        """The error ``'<name>' <rule>`` (``about("num_pages", "must be >= 1: 0")``) about
        the parameter ``name`` names: itself, or the argument it is an item or a field of
        (``max_new_tokens[2]``, ``sampling[0].stop``: ``max_new_tokens``, ``sampling``)."""
        parameter = name.split("[", 1)[0].split(".", 1)[0]
        error = cls(f"{name!r} {rule}", parameter=parameter)
        if parameter == name:
            error.rule = rule
        return error


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
