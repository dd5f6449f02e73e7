"""One public vocabulary (``docs/concepts.md``, *Words*): the retired names still work, each
with a ``DeprecationWarning`` naming its replacement, and none is on the public surface."""

from __future__ import annotations

import pytest

import pypto_sched

#: Retired public name -> the name that replaced it.
RETIRED = {"StepDone": "DispatchDone", "step_arrays": "dispatch_arrays"}


@pytest.mark.parametrize(("old", "new"), RETIRED.items())
def test_a_retired_name_warns_and_is_its_replacement(old: str, new: str) -> None:
    with pytest.warns(DeprecationWarning, match=rf"pypto_sched\.{old} .*pypto_sched\.{new}"):
        value = getattr(pypto_sched, old)
    assert value is getattr(pypto_sched, new)


@pytest.mark.parametrize(("old", "new"), RETIRED.items())
def test_a_retired_name_imports_with_a_warning(old: str, new: str) -> None:
    namespace: dict[str, object] = {}
    with pytest.warns(DeprecationWarning, match=new):
        exec(f"from pypto_sched import {old}", namespace)
    assert namespace[old] is getattr(pypto_sched, new)


def test_no_public_name_is_a_retired_one() -> None:
    assert not set(RETIRED) & set(pypto_sched.__all__)
    assert set(RETIRED.values()) <= set(pypto_sched.__all__)


def test_an_unknown_name_is_still_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="'no_such_name'"):
        pypto_sched.no_such_name  # noqa: B018
