"""One public vocabulary (``docs/concepts.md``, *Words*): a dispatch (its rows and arrays), a
schedule, a step, a page (always a KV-cache page), the chunk alignment. The retired names
still work, each with a ``DeprecationWarning`` naming its replacement, and none is on the
public surface."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from typing import Any

import attrs
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import pypto_sched
from pypto_sched import PagePool, PlannerConfig, PrefillState, generate, load_backend, plan_step
from pypto_sched.testing import planner_configs

#: Retired public name -> the name that replaced it.
RETIRED = {"StepDone": "DispatchDone", "step_arrays": "dispatch_arrays"}
#: Retired names that are their replacement itself (``step_arrays`` keeps its signature).
ALIASES = {"StepDone": "DispatchDone"}
#: Words no public name may use any more.
RETIRED_WORDS = ("step_arrays", "StepDone")
#: The modules whose ``__all__`` is the public surface.
PUBLIC_MODULES = [
    "pypto_sched",
    "pypto_sched.backends",
    "pypto_sched.checkpoints",
    "pypto_sched.execute",
    "pypto_sched.testing",
]


@pytest.mark.parametrize(("old", "new"), RETIRED.items())
def test_a_retired_name_warns_naming_its_replacement_where_it_is_read(old: str, new: str) -> None:
    with pytest.warns(DeprecationWarning, match=rf"pypto_sched\.{old} .*pypto_sched\.{new}") as got:
        value = getattr(pypto_sched, old)
    assert got[0].filename == __file__  # the user's line, which Python's filters show
    if old in ALIASES:
        assert value is getattr(pypto_sched, new)


@pytest.mark.parametrize(("old", "new"), ALIASES.items())
def test_a_retired_alias_imports_with_a_warning(old: str, new: str) -> None:
    namespace: dict[str, object] = {}
    with pytest.warns(DeprecationWarning, match=new):
        exec(f"from pypto_sched import {old}", namespace)
    assert namespace[old] is getattr(pypto_sched, new)


def test_step_arrays_keeps_its_signature_and_gives_dispatch_arrays_arrays() -> None:
    state = PrefillState.from_prompt_lengths([5, 3])
    plan = plan_step(
        state, PlannerConfig(max_num_batched_tokens=6), pool=PagePool(num_pages=4, page_size=2)
    )
    assert plan.pool is not None
    with pytest.warns(DeprecationWarning, match="use pypto_sched.dispatch_arrays"):
        retired = pypto_sched.step_arrays
    want = pypto_sched.dispatch_arrays(plan.rows, plan.pool, index=3)
    for got in (
        retired(plan.rows, plan.pool, index=3),
        retired(rows=plan.rows, pool=plan.pool, index=3),
        retired(plan.rows, pool=plan.pool, index=3),
    ):
        assert attrs.asdict(got, recurse=False).keys() == attrs.asdict(want).keys()
        for name, value in attrs.asdict(got, recurse=False).items():
            np.testing.assert_array_equal(value, getattr(want, name), err_msg=name)


@pytest.mark.parametrize("module", PUBLIC_MODULES)
def test_no_public_name_uses_a_retired_word(module: str) -> None:
    names = importlib.import_module(module).__all__
    assert [n for n in names if any(word in n for word in RETIRED_WORDS)] == []


def test_every_replacement_is_public() -> None:
    assert set(RETIRED.values()) <= set(pypto_sched.__all__)
    assert not set(RETIRED) & set(pypto_sched.__all__)


def test_an_unknown_name_is_still_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="'no_such_name'"):
        pypto_sched.no_such_name  # noqa: B018


# -- the chunk alignment is not a page ----------------------------------------------------------


def test_planner_config_has_no_field_named_page_size() -> None:
    fields = {field.name for field in attrs.fields(PlannerConfig)}
    assert "page_size" not in fields
    assert "chunk_alignment" in fields


#: Callables with a retired keyword: (callable, retired keyword, its replacement, the other
#: arguments of a call that works).
RETIRED_KEYWORDS: list[tuple[Callable[..., Any], str, str, dict[str, Any]]] = [
    (PlannerConfig, "page_size", "chunk_alignment", {"max_num_batched_tokens": 8}),
    (
        PlannerConfig.from_engine_args,
        "page_size",
        "chunk_alignment",
        {"max_num_batched_tokens": 8},
    ),
    (
        lambda **kwargs: PlannerConfig.from_dict(kwargs),
        "page_size",
        "chunk_alignment",
        {"max_num_batched_tokens": 8},
    ),
]


@pytest.mark.parametrize(
    ("function", "old", "new", "others"),
    RETIRED_KEYWORDS,
    ids=[f"{f.__qualname__}-{old}" for f, old, _, _ in RETIRED_KEYWORDS],
)
def test_a_retired_keyword_warns_naming_its_replacement_and_gives_the_same_value(
    function: Callable[..., Any], old: str, new: str, others: dict[str, Any]
) -> None:
    with pytest.warns(DeprecationWarning, match=rf"'{old}' is deprecated: use '{new}'") as got:
        value = function(**others, **{old: 4})
    assert [w.filename for w in got] == [__file__]
    assert value == function(**others, **{new: 4})


@pytest.mark.parametrize(
    ("old", "new"),
    [("on_step", "on_dispatch"), ("num_pages", "num_kv_pages"), ("page_size", "kv_page_size")],
)
def test_generates_retired_keywords_come_after_every_current_one(old: str, new: str) -> None:
    parameters = list(inspect.signature(generate).parameters)
    assert parameters.index(new) < parameters.index(old)
    assert parameters[-3:] == ["on_step", "num_pages", "page_size"]


def test_generate_warns_for_each_retired_keyword() -> None:
    backend = load_backend("reference")
    config = PlannerConfig(max_num_batched_tokens=8)
    with pytest.warns(DeprecationWarning, match="is deprecated") as got:
        generate(
            backend, [[1, 2, 3]], config=config, max_new_tokens=2,
            on_step=lambda _done: None, num_pages=4, page_size=4,
        )  # fmt: skip
    assert sorted(str(w.message) for w in got) == [
        "generate's 'num_pages' is deprecated: use 'num_kv_pages'",
        "generate's 'on_step' is deprecated: use 'on_dispatch'",
        "generate's 'page_size' is deprecated: use 'kv_page_size'",
    ]
    assert [w.filename for w in got] == [__file__] * 3


@given(st.data())
def test_planner_configs_takes_page_size_by_its_retired_name(data: st.DataObject) -> None:
    with pytest.warns(DeprecationWarning, match="'page_size' is deprecated: use 'chunk_al") as got:
        strategy = planner_configs(page_size=st.just(2))
    assert [w.filename for w in got] == [__file__]  # once, when the strategy is made
    assert data.draw(strategy).chunk_alignment == 2
