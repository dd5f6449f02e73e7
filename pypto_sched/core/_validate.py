"""Argument checking shared by every public entry point.

All checks happen at the boundary, before any arithmetic, so that bad input raises a library
error naming the parameter instead of failing deep inside NumPy.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeGuard, TypeVar

import attrs
import numpy as np
import numpy.typing as npt

from ._errors import InvalidConfigError, InvalidInputError, PyptoSchedError

__all__ = [
    "MAX_TOKENS",
    "as_count_array",
    "check_callback",
    "check_chunk_end",
    "check_index",
    "check_int",
    "check_positions",
    "ints_array",
    "is_int",
    "is_sequence",
    "read_only",
    "utf8_error",
]

#: The largest token count (prompt length, budget, threshold, position) the planner accepts.
#: Kernels index positions and slots with 32-bit integers; so does the schedule.
MAX_TOKENS = 2**31 - 1


def is_int(value: object) -> bool:
    """Whether ``value`` is an int: a Python or NumPy integer, not a bool."""
    return isinstance(value, int | np.integer) and not isinstance(value, bool | np.bool_)


def check_int(
    name: str,
    value: object,
    *,
    min_value: int,
    max_value: int = MAX_TOKENS,
    error: type[PyptoSchedError] = InvalidInputError,
) -> int:
    """Return ``value`` as an ``int`` or raise ``error`` naming ``name``."""
    if not is_int(value):
        raise error.about(name, f"must be an int: {value!r} ({type(value).__name__})")
    number: int = int(value)  # type: ignore[call-overload]
    if number < min_value:
        raise error.about(name, f"must be >= {min_value}: {number}")
    if number > max_value:
        raise error.about(name, f"must be <= {max_value}: {number}")
    return number


def count_validator(
    low: int = 1, *, optional: bool = False
) -> Callable[[object, attrs.Attribute[Any], object], None]:
    """An attrs validator: the field holds an int of at least ``low`` (or ``None`` when
    ``optional``); anything else is an :class:`InvalidConfigError` naming the field."""

    def check(_instance: object, field: attrs.Attribute[Any], value: object) -> None:
        if value is not None or not optional:
            check_int(field.name, value, min_value=low, error=InvalidConfigError)

    return check


def check_index(name: str, value: object, count: int, *, from_end: bool = False) -> int:
    """``value`` as an index into ``count`` items (``from_end``: negative ones count from the
    end, and the index returned is the item's own). Anything but an int (a bool too: it is
    not read as 0 or 1) is an :class:`InvalidInputError` naming ``name``; an int out of range
    an ``IndexError``, as a sequence raises."""
    if isinstance(value, bool | np.bool_):  # operator.index would read True as 1
        raise InvalidInputError.about(name, f"must be an int, not a bool: {value!r}")
    if not is_int(value):
        raise InvalidInputError.about(name, f"must be an int: {value!r} ({type(value).__name__})")
    index: int = int(value)  # type: ignore[call-overload]
    low = -count if from_end else 0
    if not low <= index < count:
        raise IndexError(f"{name!r} must be in [{low}, {count}): {index}")
    return index % count


def utf8_error(data: bytes, error: UnicodeDecodeError) -> str:
    """Where ``data`` stops being UTF-8, by line (as the errors of line-based inputs name
    their lines): ``"invalid start byte on line 3 (byte 47)"``."""
    line = data.count(b"\n", 0, error.start) + 1
    return f"{error.reason} on line {line} (byte {error.start})"


def check_ids(value: object) -> Iterable[Any]:
    """``value`` as an iterable of request ids, named ``'request_ids'``; a str or bytes, an
    iterable of characters, is refused rather than read as one-character ids."""
    if not isinstance(value, Iterable) or isinstance(value, str | bytes):
        raise InvalidInputError.about(
            "request_ids",
            f"must be an iterable of request ids ([id] for one): {value!r} "
            f"({type(value).__name__})",
        )
    return value


def check_bool(name: str, value: object) -> bool:
    """Return ``value`` as a ``bool`` (a NumPy bool too) or raise :class:`InvalidInputError`
    naming ``name``: a flag is not read from the truth of another value."""
    if not isinstance(value, bool | np.bool_):
        raise InvalidInputError.about(name, f"must be a bool: {value!r} ({type(value).__name__})")
    return bool(value)


def check_chunk_end(start: int, length: int) -> None:
    """A chunk's ``start + length`` within the positions the planner takes (the check of
    :class:`Chunk` and :class:`StepChunk` after their fields', as :class:`Dispatch` checks
    its rows)."""
    if start + length > MAX_TOKENS:
        raise InvalidInputError(f"'start' + 'length' must be <= {MAX_TOKENS}: {start + length}")


def chunk_start(value: object) -> int:
    """A chunk's ``start`` checked (an int at least 0): the converter of :class:`Chunk` and
    :class:`StepChunk`, which state a row's fields by one rule."""
    return check_int("start", value, min_value=0)


def chunk_length(value: object) -> int:
    """A chunk's ``length`` checked (an int at least 1; see :func:`chunk_start`)."""
    return check_int("length", value, min_value=1)


def chunk_is_final(value: object) -> bool:
    """A chunk's ``is_final`` checked (see :func:`chunk_start`)."""
    # An int is not a bool here, as a bool is not an int: 0 and 1 are refused, not guessed.
    if not isinstance(value, bool | np.bool_):
        raise InvalidInputError.about(
            "is_final",
            "must be a bool (True or False, a NumPy bool too; convert 0/1 with bool()): "
            f"{value!r} ({type(value).__name__})",
        )
    return bool(value)


def check_callback(
    name: str, value: object, *, error: type[PyptoSchedError] = InvalidInputError
) -> None:
    """Raise ``error`` naming ``name`` unless ``value`` is callable or ``None`` (checked
    before anything runs, not when it is first called)."""
    if value is not None and not callable(value):
        raise error.about(name, f"must be callable or None: {value!r} ({type(value).__name__})")


def check_positions(
    where: str,
    prompt_length: int,
    max_positions: int | None,
    *,
    max_new_tokens: int | None = None,
    parameter: str | None = None,
) -> None:
    """Raise :class:`InvalidInputError` (about ``parameter``) when a request runs more
    positions than the model's ``max_positions`` (its ``max_position_embeddings``; ``None``:
    not said). A prefill runs its prompt's ``P`` positions; generating ``N`` tokens runs
    ``P + N - 1`` (the last generated token is never run)."""
    if max_positions is None:
        return
    new = 1 if max_new_tokens is None else max_new_tokens
    positions = prompt_length + new - 1
    if positions > max_positions:
        request = f"a prompt of {prompt_length} token{'s' * (prompt_length != 1)}"
        if max_new_tokens is not None:
            request += f" and {max_new_tokens} new token{'s' * (max_new_tokens != 1)}"
        raise InvalidInputError(
            f"{where}: {request} runs {positions} positions, more than the model's "
            f"{max_positions} (max_position_embeddings)",
            parameter=parameter,
        )


def read_only(array: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """A read-only view of ``array``, which is made read-only too (callers pass arrays they
    own). NumPy lets an array that owns its memory be made writeable again, but not a view
    of a read-only array: what is handed out stays read-only."""
    array.flags.writeable = False
    return array.view()


_Class = TypeVar("_Class", bound=type[Any])
_T = TypeVar("_T")


def arrays_stay_read_only(cls: _Class) -> _Class:
    """Make the NumPy arrays of an attrs class's fields read-only again when an instance is
    unpickled or deep-copied (NumPy restores arrays writeable); apply it above
    ``@attrs.frozen``."""
    restore = cls.__setstate__  # attrs's, for a slotted class
    names = [field.name for field in attrs.fields(cls)]

    def __setstate__(self: Any, state: Any) -> None:
        restore(self, state)
        for name in names:
            value = getattr(self, name)
            if isinstance(value, np.ndarray):
                object.__setattr__(self, name, read_only(value))

    cls.__setstate__ = __setstate__
    return cls


def as_count_array(
    name: str,
    values: object,
    *,
    min_value: int,
    max_value: int = MAX_TOKENS,
    allow_empty: bool = False,
) -> npt.NDArray[np.int64]:
    """Return ``values`` (a sequence or 1-D array of ints) as a new read-only int64 array."""
    if isinstance(values, np.ndarray):
        if values.ndim != 1:
            raise InvalidInputError.about(name, f"must be 1-D: shape {values.shape}")
        if values.dtype.kind not in "iu":
            raise InvalidInputError.about(name, f"must hold integers: dtype {values.dtype}")
        if values.dtype.kind == "u" and values.size and int(values.max()) > max_value:
            # (Before the int64 cast, which would wrap the largest unsigned values.)
            index = int(np.argmax(values))
            raise InvalidInputError.about(
                name, f"values must be <= {max_value}: item {index} is {int(values[index])}"
            )
        array = values.astype(np.int64, copy=True)
    elif is_sequence(values):
        array = ints_array(name, values, min_value=min_value, max_value=max_value)
    else:
        raise InvalidInputError.about(
            name, f"must be a sequence or 1-D array of ints: {type(values).__name__}"
        )
    if not allow_empty and array.size == 0:
        raise InvalidInputError.about(name, "must hold at least one value: []")
    if array.size:
        low, high = int(array.min()), int(array.max())
        if low < min_value:
            index = int(np.argmin(array))
            raise InvalidInputError.about(
                name, f"values must be >= {min_value}: item {index} is {low}"
            )
        if high > max_value:
            index = int(np.argmax(array))
            raise InvalidInputError.about(
                name, f"values must be <= {max_value}: item {index} is {high}"
            )
    return read_only(array)


def is_sequence(values: object) -> TypeGuard[Sequence[Any]]:
    """Whether ``values`` is a sequence of items (text and bytes are not)."""
    return isinstance(values, Sequence) and not isinstance(
        values, str | bytes | bytearray | memoryview
    )


def ints_array(
    name: str,
    values: Sequence[Any],
    *,
    min_value: int = -(2**63),
    max_value: int = 2**63 - 1,
) -> npt.NDArray[np.int64]:
    """A sequence of ints in ``[min_value, max_value]`` as an int64 array, or an
    :class:`InvalidInputError` naming ``name`` and the first bad item (a bool, a float or a
    nested sequence is one: NumPy would read ``True`` as 1 and fail on a nested list)."""
    # Fast path: plain ints in range convert in one call (a list of 100,000 lengths takes
    # milliseconds instead of a checked loop's tenths of a second).
    if set(map(type, values)) == {int}:
        try:
            array = np.array(values, dtype=np.int64)
        except OverflowError:  # beyond int64: the loop below names the item
            pass
        else:
            if int(array.min()) >= min_value and int(array.max()) <= max_value:
                return array
    # Anything else (numpy ints, bools, floats, values out of range, an empty sequence) goes
    # item by item, so that the error names the first bad item.
    for index, value in enumerate(values):
        if not is_int(value):
            raise InvalidInputError.about(
                name, f"must hold ints: item {index} is {value!r} ({type(value).__name__})"
            )
        if not min_value <= value <= max_value:
            raise InvalidInputError.about(
                name, f"values must be in [{min_value}, {max_value}]: item {index} is {value}"
            )
    return np.array(values, dtype=np.int64)


def check_hashable(request_id: object) -> None:
    """Raise :class:`InvalidInputError` naming ``request_id`` unless it is hashable."""
    try:
        hash(request_id)
    except TypeError:
        raise InvalidInputError.about(
            "request_id", f"must be hashable: {request_id!r} ({type(request_id).__name__})"
        ) from None


def retired_argument(
    where: str,
    old: str,
    value: _T | None,
    new: str,
    *,
    new_given: bool,
    error: type[PyptoSchedError] = InvalidInputError,
    stacklevel: int = 2,
) -> _T | None:
    """``value``, given to ``where`` under ``old``, the retired name of its argument ``new``
    (``None``: not given). Given, it warns (``DeprecationWarning``, attributed ``stacklevel``
    frames above the caller of this function: 2, its caller's caller); given with ``new``
    too (``new_given``), it is an ``error`` naming ``old`` and its value."""
    if value is None:
        return None
    if new_given:
        raise error.about(old, f"must not be given with {new!r}, its new name: {value!r}")
    message = f"{where}'s {old!r} is deprecated: use {new!r}"
    warnings.warn(message, DeprecationWarning, stacklevel=stacklevel + 1)
    return value
