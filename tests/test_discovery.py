"""Backend discovery through the ``pypto_sched.backends`` entry-point group.

Entry points are built by hand and point into a module written to a temporary directory, so
the tests do not depend on what is installed.
"""

from __future__ import annotations

import importlib.util
import textwrap
from collections.abc import Iterator
from importlib.metadata import EntryPoint
from pathlib import Path
from typing import Any

import pytest

from pypto_sched import BackendError, BackendNotFoundError, InvalidInputError
from pypto_sched.backends import (
    ENTRY_POINT_GROUP,
    Backend,
    BackendStatus,
    backend_status,
    backend_statuses,
    build_backends,
    list_backends,
    load_backend,
    refresh_backends,
)
from pypto_sched.runtime import backends

PLUGINS = """
from typing import ClassVar

import numpy as np

from pypto_sched.backends import DispatchOutput, describe_factory


class FakeBackend:
    name: ClassVar[str] = "fake"
    tolerance = 0.0
    vocab_size = 4
    hidden_size = 2

    def __init__(self, **options):
        self.options = options

    def new_cache(self, *, num_pages, page_size):
        return None

    def embed(self, token_ids):
        return np.zeros((len(token_ids), 2))

    def run_dispatch(self, batch, cache):
        return DispatchOutput()


NOT_CALLABLE = 42


class DeclaredBackend(FakeBackend):
    options = {"seed": "seed of the weights"}

    @classmethod
    def create(cls, **options):
        return cls(**options)

    @staticmethod
    def is_available():
        return False, "no device here"


@describe_factory(options={"size": "the size"}, is_available=lambda: True)
def described(**options):
    return FakeBackend(**options)


def broken_check(**options):
    return FakeBackend(**options)


def _raise():
    raise OSError("driver missing")


broken_check.is_available = _raise


def odd_answer(**options):
    return FakeBackend(**options)


odd_answer.is_available = lambda: "maybe"


def not_a_backend(**options):
    return object()
"""

BROKEN = "raise ImportError('libhccl.so: cannot open shared object file')\n"


@pytest.fixture(autouse=True)
def plugin_modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    (tmp_path / "fake_plugins.py").write_text(textwrap.dedent(PLUGINS))
    (tmp_path / "broken_plugin.py").write_text(BROKEN)
    monkeypatch.syspath_prepend(str(tmp_path))
    refresh_backends()
    yield
    refresh_backends()


def entry_point(name: str, value: str) -> EntryPoint:
    return EntryPoint(name=name, value=value, group=ENTRY_POINT_GROUP)


FAKE = entry_point("fake", "fake_plugins:FakeBackend")
BROKEN_EP = entry_point("npu", "broken_plugin:Backend")


def test_build_backends_maps_each_name_to_its_factory_sorted_by_name() -> None:
    other = entry_point("another", "fake_plugins:FakeBackend")
    found = build_backends([FAKE, other])
    assert list(found) == ["another", "fake"]
    assert found["fake"] is FAKE.load()


def test_a_backend_that_fails_to_import_is_a_warning_and_the_others_still_load() -> None:
    with pytest.warns(
        RuntimeWarning, match=r"'npu' .* failed to load: ImportError: libhccl.*skipped"
    ):
        found = build_backends([BROKEN_EP, FAKE])
    assert list(found) == ["fake"]


def test_an_entry_point_naming_something_not_callable_is_skipped_with_a_warning() -> None:
    with pytest.warns(RuntimeWarning, match="must name a callable"):
        found = build_backends([entry_point("odd", "fake_plugins:NOT_CALLABLE"), FAKE])
    assert list(found) == ["fake"]


def test_a_name_registered_twice_keeps_the_first_with_a_warning() -> None:
    twin = entry_point("fake", "fake_plugins:not_a_backend")
    with pytest.warns(RuntimeWarning, match="registered more than once"):
        found = build_backends([FAKE, twin])
    assert found["fake"] is FAKE.load()


def test_the_same_entry_point_seen_twice_is_not_a_conflict() -> None:
    assert list(build_backends([FAKE, FAKE])) == ["fake"]


# -- the cached, installed view ---------------------------------------------------------------


@pytest.fixture
def installed(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Pretend FAKE is the only installed backend; count the discovery calls."""
    calls: list[int] = []

    def fake_entry_points(*, group: str) -> list[EntryPoint]:
        assert group == ENTRY_POINT_GROUP
        calls.append(1)
        return [FAKE]

    monkeypatch.setattr(backends, "entry_points", fake_entry_points)
    refresh_backends()
    return calls


def test_discovery_is_cached_until_refreshed(installed: list[int]) -> None:
    assert list(list_backends()) == ["fake"]
    assert list(list_backends()) == ["fake"]
    assert len(installed) == 1
    refresh_backends()
    list_backends()
    assert len(installed) == 2


def test_the_installed_backends_cannot_be_changed_by_callers(installed: list[int]) -> None:
    found: Any = list_backends()
    with pytest.raises(TypeError):
        found["other"] = FAKE.load()


def test_load_backend_builds_the_named_backend_with_its_options(installed: list[int]) -> None:
    backend = load_backend("fake", seed=3)
    assert isinstance(backend, Backend)
    assert backend.options == {"seed": 3}  # type: ignore[attr-defined]


def test_an_unknown_name_is_an_error_listing_the_installed_backends(installed: list[int]) -> None:
    with pytest.raises(BackendNotFoundError, match=r"installed: 'fake'\): 'nope'"):
        load_backend("nope")
    assert issubclass(BackendNotFoundError, ValueError)


def test_an_unknown_name_with_nothing_installed_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(backends, "entry_points", lambda *, group: [])
    refresh_backends()
    with pytest.raises(BackendNotFoundError, match=r"installed: none"):
        load_backend("reference")


def test_a_factory_returning_something_else_is_a_backend_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    odd = entry_point("odd", "fake_plugins:not_a_backend")
    monkeypatch.setattr(backends, "entry_points", lambda *, group: [odd])
    refresh_backends()
    with pytest.raises(
        BackendError, match=r"does not implement the Backend protocol: .*\(it has no"
    ):
        load_backend("odd")


def test_load_backend_imports_only_the_backend_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    # The broken plugin would warn (an error under this suite's filters) if it were imported.
    monkeypatch.setattr(backends, "entry_points", lambda *, group: [BROKEN_EP, FAKE])
    refresh_backends()
    assert load_backend("fake").name == "fake"


def test_loading_a_broken_backend_by_name_is_an_error_carrying_its_cause(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(backends, "entry_points", lambda *, group: [BROKEN_EP, FAKE])
    refresh_backends()
    with pytest.raises(BackendError, match=r"'npu' .* failed to load: ImportError") as info:
        load_backend("npu")
    assert isinstance(info.value.__cause__, ImportError)


@pytest.mark.skipif(
    importlib.util.find_spec("pypto_sched_reference") is None,
    reason="the reference backend distribution is not installed",
)
def test_the_reference_backend_is_registered() -> None:
    backend = load_backend("reference", seed=1, hidden_size=16)
    assert backend.name == "reference"
    assert backend.hidden_size == 16


# -- status: what each backend is, without building it ----------------------------------------


@pytest.fixture
def declared(monkeypatch: pytest.MonkeyPatch) -> None:
    points = [
        entry_point("class", "fake_plugins:FakeBackend"),
        entry_point("classmethod", "fake_plugins:DeclaredBackend.create"),
        entry_point("function", "fake_plugins:described"),
        entry_point("check-raises", "fake_plugins:broken_check"),
        entry_point("check-odd", "fake_plugins:odd_answer"),
        BROKEN_EP,
    ]
    monkeypatch.setattr(backends, "entry_points", lambda *, group: points)
    refresh_backends()


@pytest.mark.usefixtures("declared")
def test_statuses_list_every_registered_backend_sorted_without_warnings() -> None:
    statuses = backend_statuses()  # a warning would fail this suite
    assert [s.name for s in statuses] == [
        "check-odd",
        "check-raises",
        "class",
        "classmethod",
        "function",
        "npu",
    ]
    assert all(isinstance(s, BackendStatus) for s in statuses)


@pytest.mark.usefixtures("declared")
@pytest.mark.parametrize(
    ("name", "available", "reason", "options"),
    [
        ("class", True, "", {}),
        ("classmethod", False, "no device here", {"seed": "seed of the weights"}),
        ("function", True, "", {"size": "the size"}),
        ("check-raises", False, "its availability check failed: OSError: driver missing", {}),
        (
            "check-odd",
            False,
            "its availability check must return a bool or (bool, reason): 'maybe'",
            {},
        ),
        (
            "npu",
            False,
            "backend 'npu' (broken_plugin:Backend) failed to load: ImportError: libhccl.so: "
            "cannot open shared object file",
            {},
        ),
    ],
)
def test_a_status_reads_what_the_factory_or_its_class_declares(
    name: str, available: bool, reason: str, options: dict[str, str]
) -> None:
    status = backend_status(name)
    assert (status.available, status.reason, dict(status.options)) == (available, reason, options)
    assert status.to_dict()["options"] == options


@pytest.mark.usefixtures("declared")
def test_a_status_names_the_entry_point_and_cannot_be_changed() -> None:
    status = backend_status("classmethod")
    assert status.entry_point == "fake_plugins:DeclaredBackend.create"
    assert status.distribution is None  # a hand-made entry point has no distribution
    with pytest.raises(TypeError):
        status.options["seed"] = "other"  # type: ignore[index]


@pytest.mark.usefixtures("declared")
def test_the_status_of_an_unknown_name_lists_the_installed_backends() -> None:
    with pytest.raises(BackendNotFoundError, match=r"installed: 'check-odd', .*\): 'nope'"):
        backend_status("nope")


@pytest.mark.usefixtures("declared")
def test_an_option_a_factory_does_not_declare_is_refused_before_it_runs() -> None:
    """A factory that declares its options is not called with others (a bare TypeError, or
    an option silently dropped); one that declares none gets what it is given."""
    with pytest.raises(
        InvalidInputError,
        match=r"^unknown options \['sead'\]; the options of backend 'classmethod': \['seed'\]$",
    ):
        load_backend("classmethod", sead=1)
    with pytest.raises(InvalidInputError, match=r"^unknown options \['length', 'width'\]"):
        load_backend("function", size=1, width=2, length=3)
    with pytest.raises(BackendError, match="must declare the name"):  # built: nothing declared
        load_backend("class", anything=1)
