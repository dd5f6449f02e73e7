"""The backend contract, and how installed backends are found.

The contract
============
A backend executes the dispatches of a :class:`~pypto_sched.Schedule` on some device. It holds
weights but no per-batch state: the KV cache is an object the backend creates with
:meth:`Backend.new_cache` and receives back with every dispatch, so a caller (or a conformance
check) can run the same prompts through two caches side by side.

For one dispatch a backend is told (:class:`DispatchInput`) the token ids, the host-side input
embeddings when the caller has them (``None`` when the backend looks the ids up itself), and
the kernel arrays of :class:`~pypto_sched.DispatchArrays`: positions, cumulative query
lengths, context lengths, block tables, slot mapping, which rows are final and where their
last tokens are. It writes the dispatch's K/V into the cache at the slot mapping only, reads
each row's whole context through its block table, and returns (:class:`DispatchOutput`) host
NumPy arrays for the final rows only: their logits when asked, their greedy token ids when
asked. Intermediate chunks produce no output at all, and nothing else leaves the device.

Two attributes are optional. ``max_position_embeddings`` (read with :func:`max_positions`),
the most positions the model takes: :func:`~pypto_sched.execute_schedule`,
:func:`~pypto_sched.generate` and ``pypto-sched generate`` refuse a request too long for the
model before running anything. ``relative_tolerance`` (read with
:func:`relative_tolerance`, 0 when absent): chunked and one-shot logits may then differ by
``tolerance`` plus ``relative_tolerance`` times the largest magnitude of the request's
logits, for backends whose arithmetic errs in proportion to the logits' size (float16,
bfloat16).

Nothing here imports torch or any device library.

Discovery
=========
A distribution registers a backend under the ``pypto_sched.backends`` entry-point group; the
entry point names a callable that takes keyword options and returns a :class:`Backend` (a
class, a classmethod or a factory function). Registered entry points are read once and
cached; :func:`refresh_backends` forgets them (after installing a backend in a running
process).

* :func:`load_backend` imports and builds only the backend asked for, so a heavy or broken
  backend costs nothing to the others; an unknown name is an error listing what is installed.
* :func:`list_backends` imports every registered backend (once, cached). One whose import
  fails is reported with a :class:`RuntimeWarning` carrying its error and left out; the
  others still load.
* :func:`backend_statuses` (and :func:`backend_status` for one name) says, for every
  registered backend, where it comes from, whether it can run here and why, and the options
  its factory takes, without building it. One that fails to import is listed as unable to
  run, with the error as the reason.

What a factory may declare
--------------------------
Two optional attributes of the factory (for a class or a classmethod factory, of the class)
describe it without building a backend:

* ``is_available()``: whether it can run on this machine, a bool or a ``(bool, reason)``
  pair (the reason may also say *how* it runs, e.g. on the CPU for want of a device); an
  exception it raises reads as "cannot run", with the exception as the reason. Without it,
  a backend that imports can run.
* ``options``: a mapping from each keyword the factory takes to a one-line description.

:func:`describe_factory` attaches both to a factory function.

The work is done by small functions over ``EntryPoint`` objects (:func:`build_backends`), so
tests can pass hand-made entry points.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Iterable, Mapping
from importlib.metadata import EntryPoint, entry_points
from types import MappingProxyType
from typing import Any, ClassVar, Protocol, TypeVar, runtime_checkable

import attrs
import numpy as np
import numpy.typing as npt

from ..core._dispatch import DispatchArrays
from ..core._errors import BackendError, BackendNotFoundError, InvalidInputError

__all__ = [
    "ENTRY_POINT_GROUP",
    "Backend",
    "BackendError",
    "BackendFactory",
    "BackendNotFoundError",
    "BackendStatus",
    "DispatchInput",
    "DispatchOutput",
    "backend_status",
    "backend_statuses",
    "build_backends",
    "describe_factory",
    "list_backends",
    "load_backend",
    "refresh_backends",
]

#: The entry-point group backends register under.
ENTRY_POINT_GROUP = "pypto_sched.backends"


@attrs.frozen(eq=False, kw_only=True)
class DispatchInput:
    """Everything a backend is told for one dispatch.

    Token-level arrays are flat, rows concatenated, in the order of ``arrays.positions``;
    ``arrays.row_tokens(i)`` is row ``i``'s slice of them. Every array is read-only and must
    stay unchanged: copy one (``np.array(x)``) to change it. Handing one to torch without a
    copy (``torch.from_numpy``) works but warns that the array is not writable; that is safe
    only if nothing writes to the tensor.
    """

    #: Positions, cumulative query lengths, context lengths, block tables, slots, final rows
    #: and the flat indices of their last tokens (``arrays.logits_indices``).
    arrays: DispatchArrays
    #: Per token: the token id.
    token_ids: npt.NDArray[np.int64]
    #: Per token: host-side input embeddings ``[num_tokens, hidden_size]``, or ``None`` when
    #: the backend must look the token ids up itself (the device-embedding path).
    input_embeddings: npt.NDArray[np.floating[Any]] | None
    #: Whether to return the final rows' logits.
    return_logits: bool
    #: Whether to return the final rows' greedy (argmax) token ids.
    return_greedy: bool

    @property
    def num_final_rows(self) -> int:
        """Rows whose logits (and greedy ids) this dispatch returns."""
        return int(self.arrays.logits_indices.size)


@attrs.frozen(eq=False, kw_only=True)
class DispatchOutput:
    """What a backend returns for one dispatch: host arrays for its final rows only.

    Row ``i`` of each array belongs to the ``i``-th final row of the dispatch, in row order
    (``DispatchArrays.final_requests``). What was not asked for is ``None``; the driver asks
    nothing of a dispatch of intermediate chunks, which returns ``DispatchOutput()`` --
    returning ``None`` itself is an error. Logits must be finite and greedy ids in ``[0,
    vocab_size)``; the driver checks both. Greedy ids must come from finite logits, which
    only the backend sees when it returns ids alone: it raises a :class:`BackendError`
    instead of returning ids of logits that are not finite.
    """

    #: ``[num_final_rows, vocab_size]`` logits when asked for, else ``None``.
    logits: npt.NDArray[np.floating[Any]] | None = None
    #: ``[num_final_rows]`` greedy token ids when asked for, else ``None``.
    greedy_token_ids: npt.NDArray[np.integer[Any]] | None = None


@runtime_checkable
class Backend(Protocol):
    """A dispatch executor. Register one under the ``pypto_sched.backends`` entry point, with
    ``name`` the entry point's name, and check it with
    :func:`pypto_sched.testing.check_backend`. It holds weights but no per-batch state: the
    KV cache is the object :meth:`new_cache` returns, handed back with every dispatch."""

    #: The name it is registered under.
    name: ClassVar[str]

    @property
    def tolerance(self) -> float:
        """Largest absolute difference between chunked and one-shot logits it promises."""
        ...

    @property
    def vocab_size(self) -> int: ...

    @property
    def hidden_size(self) -> int: ...

    def new_cache(self, *, num_pages: int, page_size: int) -> Any:
        """An empty KV cache of ``num_pages`` pages of ``page_size`` slots each."""
        ...

    def embed(self, token_ids: npt.NDArray[np.int64]) -> npt.NDArray[np.floating[Any]]:
        """Host-side input embeddings of ``token_ids``: ``[len(token_ids), hidden_size]``."""
        ...

    def run_dispatch(self, batch: DispatchInput, cache: Any) -> DispatchOutput:
        """Run one dispatch: write its K/V into ``cache`` at ``batch.arrays.slot_mapping``
        and return what ``batch`` asks for, for its final rows only (greedy ids only of
        finite logits: see :class:`DispatchOutput`)."""
        ...


#: The protocol's members: its attributes (``name`` and the properties), then its methods.
_ATTRIBUTES = (
    *Backend.__annotations__,
    *(name for name, member in vars(Backend).items() if isinstance(member, property)),
)
_METHODS = tuple(
    name
    for name, member in vars(Backend).items()
    if callable(member) and not name.startswith("_") and name not in _ATTRIBUTES
)


def protocol_gaps(value: object) -> str:
    """What ``value`` lacks of the :class:`Backend` protocol, for a message: the members it
    does not have, then its methods that are not callable; empty if it implements it."""
    missing = [name for name in (*_ATTRIBUTES, *_METHODS) if not hasattr(value, name)]
    uncallable = [
        name for name in _METHODS if hasattr(value, name) and not callable(getattr(value, name))
    ]
    gaps = []
    if missing:
        gaps.append(f"it has no {', '.join(missing)}")
    if uncallable:
        gaps.append(f"{', '.join(uncallable)} not callable")
    return "; ".join(gaps)


def make_cache(backend: Backend, *, num_pages: int, page_size: int) -> Any:
    """``backend.new_cache(...)``, refusing ``None`` with a :class:`BackendError`: the cache
    is the object the backend's dispatches are then handed, and the driver takes ``None``
    for no cache given."""
    cache = backend.new_cache(num_pages=num_pages, page_size=page_size)
    if cache is None:
        raise BackendError(
            f"backend {backend.name!r}: new_cache() returned None: it must return the cache "
            f"object that run_dispatch is then handed (any object but None)"
        )
    return cache


def check_is_backend(value: object) -> None:
    """Raise :class:`InvalidInputError` naming what ``value``, given as ``backend``, lacks of
    the :class:`Backend` protocol."""
    gaps = protocol_gaps(value)
    if gaps:
        raise InvalidInputError.about(
            "backend", f"must implement the Backend protocol: {type(value).__name__} ({gaps})"
        )


#: What an entry point names: a callable taking keyword options and returning a backend.
BackendFactory = Callable[..., Backend]


# -- discovery: small functions over entry points --------------------------------------------


def _first_per_name(entry_points: Iterable[EntryPoint]) -> list[EntryPoint]:
    """Keep the first entry point of each name, warning when others claim the same name."""
    chosen: dict[str, EntryPoint] = {}
    for entry_point in entry_points:
        first = chosen.setdefault(entry_point.name, entry_point)
        if first.value != entry_point.value:
            warnings.warn(
                f"backend {entry_point.name!r} is registered more than once; using "
                f"{first.value!r}, ignoring {entry_point.value!r}",
                RuntimeWarning,
                stacklevel=2,
            )
    return list(chosen.values())


def load_factory(entry_point: EntryPoint) -> BackendFactory:
    """Import the entry point's factory; raise :class:`BackendError` when that fails."""
    try:
        factory: BackendFactory = entry_point.load()
    except Exception as error:  # any import-time failure of a plugin is reported the same way
        raise BackendError(
            f"backend {entry_point.name!r} ({entry_point.value}) failed to load: "
            f"{type(error).__name__}: {error}"
        ) from error
    if not callable(factory):
        raise BackendError(
            f"backend {entry_point.name!r} ({entry_point.value}) must name a callable that "
            f"returns a backend: {type(factory).__name__}"
        )
    return factory


def build_backends(entry_points: Iterable[EntryPoint]) -> dict[str, BackendFactory]:
    """Load ``entry_points`` into a name -> factory dict, sorted by name.

    One that fails to load is left out with a :class:`RuntimeWarning` carrying its error, so
    a broken plugin never hides the others.
    """
    factories: dict[str, BackendFactory] = {}
    for entry_point in _first_per_name(entry_points):
        try:
            factories[entry_point.name] = load_factory(entry_point)
        except BackendError as error:
            warnings.warn(f"{error} (skipped)", RuntimeWarning, stacklevel=2)
    return dict(sorted(factories.items()))


# -- discovery: the installed backends, cached -----------------------------------------------


@functools.cache
def _installed_entry_points() -> Mapping[str, EntryPoint]:
    found = _first_per_name(entry_points(group=ENTRY_POINT_GROUP))
    return MappingProxyType({ep.name: ep for ep in sorted(found, key=lambda ep: ep.name)})


@functools.cache
def _installed_backends() -> Mapping[str, BackendFactory]:
    return MappingProxyType(build_backends(_installed_entry_points().values()))


def list_backends() -> Mapping[str, BackendFactory]:
    """The installed backends that load, name -> factory, sorted by name (read-only).

    Imports every registered backend the first time; the result is cached.
    """
    return _installed_backends()


def refresh_backends() -> None:
    """Forget the cached discovery, so the next call looks at the installed backends anew."""
    _installed_entry_points.cache_clear()
    _installed_backends.cache_clear()


def installed_entry_point(name: str) -> EntryPoint:
    installed = _installed_entry_points()
    entry_point = installed.get(name)
    if entry_point is None:
        known = ", ".join(repr(n) for n in installed) or "none"
        raise BackendNotFoundError.about(
            "name", f"must be an installed backend (installed: {known}): {name!r}"
        )
    return entry_point


def load_backend(name: str, **options: Any) -> Backend:
    """Build the installed backend registered as ``name``, passing it ``options``.

    Only that backend is imported. Raises :class:`BackendNotFoundError` (listing the
    installed names) for an unknown name, :class:`InvalidInputError` for an option the
    factory does not declare (when it declares its options: :func:`describe_factory`), and
    :class:`BackendError` when the backend fails to import, its factory returns something
    that is not a :class:`Backend`, or the backend declares a ``name`` other than the one it
    is registered under.
    """
    entry_point = installed_entry_point(name)
    factory = load_factory(entry_point)
    declared = _declared_options(factory)
    unknown = sorted(set(options) - set(declared))
    if declared and unknown:
        raise InvalidInputError(
            f"unknown options {unknown}; the options of backend {name!r}: {sorted(declared)}"
        )
    backend = factory(**options)
    gaps = protocol_gaps(backend)
    if gaps:
        raise BackendError(
            f"backend {name!r} returned an object that does not implement the Backend "
            f"protocol: {type(backend).__name__} ({gaps})"
        )
    if backend.name != name:
        raise BackendError(
            f"backend {name!r} ({entry_point.value}) must declare the name it is registered "
            f"under: it declares {backend.name!r}"
        )
    return backend


# -- status: what each installed backend is, without building it -----------------------------

_Factory = TypeVar("_Factory", bound=Callable[..., Any])


def describe_factory(
    *,
    options: Mapping[str, str],
    is_available: Callable[[], bool | tuple[bool, str]] | None = None,
) -> Callable[[_Factory], _Factory]:
    """Declare, on a factory function, the options it takes and whether it can run here.

    ``options`` maps each keyword the factory takes to a one-line description;
    ``is_available`` returns a bool or a ``(bool, reason)`` pair. Both are read by
    :func:`backend_status`. A class (or the class of a classmethod factory) declares the same
    two names as class attributes instead.
    """
    frozen = MappingProxyType({str(key): str(text) for key, text in options.items()})

    def declare(factory: _Factory) -> _Factory:
        factory.options = frozen  # type: ignore[attr-defined]  # functions take attributes
        if is_available is not None:
            factory.is_available = is_available  # type: ignore[attr-defined]
        return factory

    return declare


def _read_only_mapping(value: Mapping[str, str]) -> Mapping[str, str]:
    return MappingProxyType(dict(value))


@attrs.frozen(kw_only=True, unsafe_hash=False)
class BackendStatus:
    """One registered backend as :func:`backend_statuses` finds it, without building it.

    Statuses compare by value; they are not hashable, as they hold a mapping.
    """

    #: The name it is registered under.
    name: str
    #: The entry point's target, ``module:attribute``.
    entry_point: str
    #: The distribution that registers it, ``"name version"``, or ``None`` when unknown.
    distribution: str | None
    #: Whether it imports and says it can run on this machine.
    available: bool
    #: Why it cannot run (the import error, or its own answer), or a note on how it runs;
    #: ``""`` when there is nothing to say.
    reason: str
    #: Each keyword its factory takes, with a one-line description (empty when undeclared).
    options: Mapping[str, str] = attrs.field(factory=dict, converter=_read_only_mapping)

    def to_dict(self) -> dict[str, Any]:
        """The status as a JSON-ready dict."""
        return {
            "name": self.name,
            "entry_point": self.entry_point,
            "distribution": self.distribution,
            "available": self.available,
            "reason": self.reason,
            "options": dict(self.options),
        }


def _declared(factory: BackendFactory, attribute: str) -> Any:
    """``attribute`` of the factory, or of its class for a classmethod factory."""
    found = getattr(factory, attribute, None)
    if found is None:
        found = getattr(getattr(factory, "__self__", None), attribute, None)
    return found


def _availability(factory: BackendFactory) -> tuple[bool, str]:
    check = _declared(factory, "is_available")
    if check is None:
        return True, ""
    try:
        answer = check()
    except Exception as error:  # a broken check means "cannot run here", not a crash
        return False, f"its availability check failed: {type(error).__name__}: {error}"
    if isinstance(answer, tuple) and len(answer) == 2:
        return bool(answer[0]), str(answer[1])
    if isinstance(answer, bool):
        return answer, "" if answer else "its availability check said no"
    return False, f"its availability check must return a bool or (bool, reason): {answer!r}"


def _declared_options(factory: BackendFactory) -> Mapping[str, str]:
    declared = _declared(factory, "options")
    if not isinstance(declared, Mapping):
        return {}
    return {str(key): str(text) for key, text in declared.items()}


def _status(entry_point: EntryPoint) -> BackendStatus:
    dist = entry_point.dist
    status = functools.partial(
        BackendStatus,
        name=entry_point.name,
        entry_point=entry_point.value,
        distribution=None if dist is None else f"{dist.name} {dist.version}",
    )
    try:
        factory = load_factory(entry_point)
    except BackendError as error:
        return status(available=False, reason=str(error))
    available, reason = _availability(factory)
    return status(available=available, reason=reason, options=_declared_options(factory))


def backend_statuses() -> tuple[BackendStatus, ...]:
    """Every registered backend, sorted by name: where it comes from, whether it can run
    here and why, and the options its factory takes.

    Each backend is imported (not built); one that fails to import is listed as unable to
    run, with its error as the reason, and never hides the others.
    """
    return tuple(_status(entry_point) for entry_point in _installed_entry_points().values())


def backend_status(name: str) -> BackendStatus:
    """The :class:`BackendStatus` of the backend registered as ``name``.

    Raises :class:`BackendNotFoundError` (listing the installed names) for an unknown name.
    """
    return _status(installed_entry_point(name))


def relative_tolerance(backend: object) -> float:
    """``backend``'s optional ``relative_tolerance`` (0.0 when it does not say): the
    difference it promises between chunked and one-shot logits grows by this much per unit
    of the largest magnitude of a request's logits (see the module docstring)."""
    value = getattr(backend, "relative_tolerance", None)
    return 0.0 if value is None else float(value)


def max_positions(backend: object) -> int | None:
    """The most positions ``backend``'s model takes, its optional ``max_position_embeddings``
    (``None`` when it does not say)."""
    longest = getattr(backend, "max_position_embeddings", None)
    return None if longest is None else int(longest)
