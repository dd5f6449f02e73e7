"""The public surface: ``__all__`` is complete, ordered, importable and documented."""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import types
from pathlib import Path

import attrs
import numpy as np
import pytest

import pypto_sched
import pypto_sched.testing

PUBLIC = list(pypto_sched.__all__)

# Names in the ``__all__`` of a module the package draws from that are deliberately kept off
# the public surface: argument checking and invariant checks shared between private modules.
INTERNAL = {
    "MAX_TOKENS",
    "as_count_array",
    "check_config",
    "check_int",
    "read_only",
    "check_schedule",
}
PUBLIC_SUBMODULES = ["backends", "checkpoints", "execute"]


def _modules_the_package_imports_from() -> list[types.ModuleType]:
    tree = ast.parse(Path(pypto_sched.__file__).read_text())
    names = sorted(
        {
            node.module
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module
        }
    )
    return [importlib.import_module(f"pypto_sched.{name}") for name in names]


def _exported_by_public_submodules() -> set[str]:
    exported: set[str] = set()
    for name in PUBLIC_SUBMODULES:
        exported.update(importlib.import_module(f"pypto_sched.{name}").__all__)
    return exported


def test_all_has_no_duplicates() -> None:
    assert len(PUBLIC) == len(set(PUBLIC))


def test_all_is_sorted_constants_then_classes_then_functions() -> None:
    # The order ruff's RUF022 keeps: SCREAMING_CASE, then CamelCase, then snake_case.
    def key(name: str) -> tuple[int, str]:
        if name.isupper():
            return (0, name)
        return (1 if name[0].isupper() else 2, name)

    assert sorted(PUBLIC, key=key) == PUBLIC


@pytest.mark.parametrize("name", PUBLIC)
def test_every_name_in_all_is_importable(name: str) -> None:
    namespace: dict[str, object] = {}
    exec(f"from pypto_sched import {name}", namespace)
    assert namespace[name] is getattr(pypto_sched, name)


def test_star_import_gives_exactly_all() -> None:
    namespace: dict[str, object] = {}
    exec("from pypto_sched import *", namespace)
    assert set(namespace) - {"__builtins__"} == set(PUBLIC)


def test_every_public_attribute_of_the_package_is_in_all() -> None:
    public = {
        name
        for name, value in vars(pypto_sched).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    }
    assert public <= set(PUBLIC), sorted(public - set(PUBLIC))


def test_every_name_of_a_module_the_package_draws_from_is_exported() -> None:
    # Re-exporting part of a module's __all__ means exporting all of it, from the package
    # root or from a public submodule, unless it is a known internal helper.
    exported = set(PUBLIC) | _exported_by_public_submodules() | INTERNAL
    missing = {
        module.__name__: sorted(set(module.__all__) - exported)
        for module in _modules_the_package_imports_from()
        if set(module.__all__) - exported
    }
    assert not missing, f"exported by these modules but not by pypto_sched: {missing}"


def test_internal_names_stay_out_of_all() -> None:
    assert not INTERNAL & set(PUBLIC)


@pytest.mark.parametrize("name", PUBLIC)
def test_every_public_name_is_documented(name: str) -> None:
    value = getattr(pypto_sched, name)
    if inspect.isclass(value) or inspect.isfunction(value):
        assert inspect.getdoc(value), f"{name} has no docstring"
        assert value.__doc__ is not None
        assert value.__doc__.strip(), f"{name} has an empty docstring"
        return
    # A constant or type alias: its defining assignment carries a `#:` doc comment.
    pattern = re.compile(rf"^#:.*\n{re.escape(name)}\b[^=\n]*=", re.MULTILINE)
    package = Path(pypto_sched.__file__).parent
    sources = [path.read_text() for path in sorted(package.rglob("*.py"))]
    assert any(pattern.search(text) for text in sources), f"{name} has no #: doc comment"


API_REFERENCE = Path(__file__).resolve().parent.parent / "docs" / "api.md"


@pytest.mark.parametrize(
    "name", [*PUBLIC, *(f"testing.{name}" for name in pypto_sched.testing.__all__)]
)
def test_every_public_name_is_in_the_api_reference(name: str) -> None:
    # Named in code spans as written: `plan_prefill(` or `Schedule` or `check_backend(`.
    text = API_REFERENCE.read_text()
    short = name.removeprefix("testing.")
    assert re.search(rf"`{re.escape(short)}\b", text), f"docs/api.md does not describe {name}"


def test_every_public_function_takes_options_by_keyword() -> None:
    # Data positional, options keyword-only: at most three positional parameters
    # (execute_schedule takes the schedule, the backend and the prompts).
    for name in PUBLIC:
        value = getattr(pypto_sched, name)
        if inspect.isfunction(value):
            positional = [
                p
                for p in inspect.signature(value).parameters.values()
                if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
            ]
            assert len(positional) <= 3, name


def _public_value_classes() -> list[tuple[str, type]]:
    classes: dict[type, str] = {}
    submodules = [importlib.import_module(f"pypto_sched.{name}") for name in PUBLIC_SUBMODULES]
    for module in (pypto_sched, *submodules):
        for name in module.__all__:
            value = getattr(module, name)
            if inspect.isclass(value) and attrs.has(value):
                classes.setdefault(value, f"{module.__name__}.{name}")
    return [(name, cls) for cls, name in classes.items()]


@pytest.mark.parametrize(("name", "cls"), _public_value_classes())
def test_every_public_value_class_is_keyword_only(name: str, cls: type) -> None:
    positional = [f.name for f in attrs.fields(cls) if f.init and not f.kw_only]
    assert not positional, f"{name} takes {positional} by position"


def test_the_dispatch_and_result_values_refuse_positional_arguments() -> None:
    # The four that were positional until issue #35; positional construction is a TypeError.
    arrays = pypto_sched.dispatch_arrays(
        pypto_sched.plan_one_shot([2]).dispatches[0],
        pypto_sched.plan_pages([2], page_size=2, num_pages=1),
    )
    ids = np.zeros(2, dtype=np.int64)
    tables = pypto_sched.plan_pages([2], page_size=2, num_pages=1)
    fields = {
        pypto_sched.DispatchArrays: [getattr(arrays, f.name) for f in attrs.fields(type(arrays))],
        pypto_sched.DispatchInput: [arrays, ids, None, False, False],
        pypto_sched.DispatchOutput: [None, None],
        pypto_sched.ExecutionResult: [None, None, tables, None],
    }
    for cls, values in fields.items():
        with pytest.raises(TypeError):
            cls(*values)
        built = cls(**{f.name: v for f, v in zip(attrs.fields(cls), values, strict=True)})
        assert isinstance(built, cls)


def test_the_driver_and_verification_names_are_public() -> None:
    # The CLI, check_backend and servers call these; they must stay on the surface.
    for name in ("DispatchDone", "Verification", "compare_results", "verify_against_one_shot"):
        assert name in PUBLIC, name


def test_the_package_is_typed() -> None:
    assert (Path(pypto_sched.__file__).parent / "py.typed").is_file()


@pytest.mark.parametrize("name", importlib.import_module("pypto_sched.models.qwen3").__all__)
def test_every_name_of_the_checkpoint_reader_is_documented(name: str) -> None:
    module = importlib.import_module("pypto_sched.models.qwen3")
    value = getattr(module, name)
    if inspect.isclass(value) or inspect.isfunction(value):
        assert inspect.getdoc(value), f"checkpoints.{name} has no docstring"
    else:
        source = Path(module.__file__ or "").read_text()
        assert re.search(rf"^#:.*\n{re.escape(name)}\b[^=\n]*=", source, re.MULTILINE), name
    text = API_REFERENCE.read_text()
    assert re.search(rf"`{re.escape(name)}\b", text), f"docs/api.md does not describe {name}"
