"""The layers of ``CONTRIBUTING.md`` (*Layers*), held by reading every module's imports.

Three rules, over ``pypto_sched/`` and both bundled backends:

- No module imports another module's private (``_``-prefixed) name, or reaches it through
  the module (``from ._online import _restore``, ``_online._restore``); importing a private
  *submodule* (``from . import _render``) is fine. A helper two modules need is a public name
  of the lower one. (Other projects' private names are outside this rule.)
- The layers, lowest first: ``pypto_sched/core/`` (the pure planner), ``pypto_sched/models/``
  (the Qwen3 checkpoint reader and tensor table), ``pypto_sched/runtime/`` (backends contract,
  driver, generate, verification, prompts, output). A layer imports its own and the ones below,
  never one above; the top (the package root and its public paths such as
  ``pypto_sched.backends``, ``cli``, ``integrations``, ``testing``) may import any of them.
- The core imports no device library, nothing that reads the clock, the environment or files,
  and calls no ``open()``.

A failure names the file, the line and the import. The checker itself is tested on snippets
below, so that a rule that stopped matching would fail here rather than pass quietly.
"""

from __future__ import annotations

import ast
import importlib
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
#: Folder that holds a top-level package -> that package's name.
ROOTS = {
    REPO: "pypto_sched",
    REPO / "backends" / "reference": "pypto_sched_reference",
    REPO / "backends" / "npu": "pypto_sched_npu",
}
#: The layers of ``pypto_sched``, lowest first: a module may import its own layer and those
#: below it, never one above. Everything not in a layer (the package root and its public
#: paths, ``cli``, ``integrations``, ``testing``) is on top and may import any of them.
LAYERS = ("pypto_sched.core", "pypto_sched.models", "pypto_sched.runtime")


def _layer(module: str) -> int:
    """The index of ``module``'s layer in :data:`LAYERS`; ``len(LAYERS)`` for the top."""
    for index, layer in enumerate(LAYERS):
        if module == layer or module.startswith(layer + "."):
            return index
    return len(LAYERS)


#: What the core may not import, with the reason: device libraries, and modules whose use
#: is I/O, the clock or the environment.
CORE_FORBIDDEN = {
    "torch": "a device library",
    "torch_npu": "a device library",
    "os": "the environment and files",
    "io": "files",
    "pathlib": "files",
    "shutil": "files",
    "tempfile": "files",
    "subprocess": "other processes",
    "socket": "the network",
    "time": "the clock",
    "datetime": "the clock",
    "logging": "logging",
    "random": "a global random stream",
}
#: Builtins the core may not call.
CORE_FORBIDDEN_CALLS = {"open": "files", "print": "output", "input": "input"}


def _module_files() -> dict[str, Path]:
    """Every module of the three packages: dotted name -> file."""
    modules: dict[str, Path] = {}
    for folder, package in ROOTS.items():
        for path in sorted((folder / package).rglob("*.py")):
            parts = path.relative_to(folder).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            modules[name] = path
    return modules


MODULES = _module_files()
#: The pure planning core: config, errors, validation, the rules and their engines, the
#: online state, the page pool, persistent structures, generation planning, the schedule and
#: its JSON, dispatch arrays, pages, warmup, stats, partitioning, the checker, workloads and
#: seeded sampling.
CORE = frozenset(name for name in MODULES if _layer(name) == 0)


def _imported_module(name: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute name of the module ``node`` (in module ``name``) imports from."""
    if not node.level:
        return node.module or ""
    package = name.split(".") if is_package else name.split(".")[:-1]
    base = package[: len(package) - node.level + 1]
    return ".".join([*base, *([node.module] if node.module else [])])


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _is_ours(module: str) -> bool:
    return module.split(".")[0] in ROOTS.values()


def _private_imports(name: str, is_package: bool, tree: ast.AST) -> Iterator[tuple[int, str]]:
    bound: dict[str, str] = {}  # a local name -> the module of ours it is bound to
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            bound.update({alias.asname: alias.name for alias in node.names if alias.asname})
        if not isinstance(node, ast.ImportFrom):
            continue
        source = _imported_module(name, is_package, node)
        for alias in node.names:
            full = f"{source}.{alias.name}"
            if full in MODULES:
                bound[alias.asname or alias.name] = full
            elif _is_private(alias.name) and _is_ours(source):
                yield node.lineno, f"imports the private name {alias.name!r} from {source}"
    # The same name reached through the module: ``from . import _online`` then
    # ``_online._restore``.
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and bound.get(node.value.id, "") in MODULES
            and _is_private(node.attr)
        ):
            module = bound[node.value.id]
            yield node.lineno, f"uses the private name {node.attr!r} of {module}"


def _imports(name: str, is_package: bool, tree: ast.AST) -> Iterator[tuple[int, str]]:
    """``(line, absolute module)`` for every import of the module."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            source = _imported_module(name, is_package, node)
            for alias in node.names:
                full = f"{source}.{alias.name}"
                yield node.lineno, full if full in MODULES else source


def _layer_breaches(name: str, is_package: bool, tree: ast.AST) -> Iterator[tuple[int, str]]:
    own = _layer(name)
    for line, imported in _imports(name, is_package, tree):
        if imported.split(".")[0] == "pypto_sched" and _layer(imported) > own:
            yield line, f"imports {imported}, above {LAYERS[own]}"


def _core_breaches(name: str, is_package: bool, tree: ast.AST) -> Iterator[tuple[int, str]]:
    yield from _layer_breaches(name, is_package, tree)
    for line, imported in _imports(name, is_package, tree):
        top = imported.split(".")[0]
        if top in CORE_FORBIDDEN:
            yield line, f"imports {imported} ({CORE_FORBIDDEN[top]})"
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            reason = CORE_FORBIDDEN_CALLS.get(node.func.id)
            if reason is not None:
                yield node.lineno, f"calls {node.func.id}() ({reason})"


RULES = {"private": _private_imports, "core": _core_breaches, "layers": _layer_breaches}


def _report(check: str) -> list[str]:
    found = []
    for name, path in MODULES.items():
        if check == "core" and name not in CORE:
            continue
        if check == "layers" and _layer(name) == len(LAYERS):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        rule = RULES[check]
        for line, what in rule(name, path.name == "__init__.py", tree):
            found.append(f"{path.relative_to(REPO)}:{line}: {what}")
    return found


def test_the_packages_are_found() -> None:
    assert {"pypto_sched.core._online", "pypto_sched.core._policies"} <= CORE
    assert {"pypto_sched.runtime.execute", "pypto_sched.models.qwen3"} <= MODULES.keys()
    assert {"pypto_sched_reference", "pypto_sched_npu"} <= MODULES.keys()
    # The root holds no private module of its own: each one lives in its layer.
    root = {name.split(".")[1] for name in MODULES if name.startswith("pypto_sched.")}
    assert {name for name in root if name.startswith("_")} == {"__main__"}


def test_no_layer_imports_one_above_it() -> None:
    found = _report("layers")
    assert not found, "core < models < runtime < the rest:\n" + "\n".join(found)


def test_no_module_imports_another_modules_private_name() -> None:
    found = _report("private")
    assert not found, "give the name a public one in its module:\n" + "\n".join(found)


def test_the_core_imports_nothing_above_it_and_does_no_io() -> None:
    found = _report("core")
    assert not found, "the core is NumPy and attrs only:\n" + "\n".join(found)


# -- the checker, on snippets --------------------------------------------------------------------


def _check(rule: str, name: str, source: str) -> list[str]:
    tree = ast.parse(source)
    checker = RULES[rule]
    return [what for _, what in checker(name, False, tree)]


@pytest.mark.parametrize(
    ("name", "source"),
    [
        ("pypto_sched.core._plan", "from ._online import _restore"),
        ("pypto_sched.cli.generate", "from .run import _load"),
        ("pypto_sched.integrations.ray", "from ..runtime.execute import _run"),
        ("pypto_sched.cli.run", "from pypto_sched.core._online import _Rows"),
        ("pypto_sched_reference._backend", "from pypto_sched.backends import _factory"),
        ("pypto_sched.cli.run", "from ..core import _online\n_online._restore()"),
        ("pypto_sched.cli.run", "import pypto_sched.core._pool as pool\npool._Holds"),
    ],
)
def test_the_checker_finds_a_private_name_import(name: str, source: str) -> None:
    assert _check("private", name, source)


@pytest.mark.parametrize(
    ("name", "source"),
    [
        ("pypto_sched.cli.run", "from . import _render, _progress"),
        ("pypto_sched.__init__", "from .core._online import plan_step"),
        ("pypto_sched.runtime.execute", "from ..core import _validate"),
        ("pypto_sched.core._plan", "from __future__ import annotations"),
        ("pypto_sched.cli.run", "import argparse\nargparse._SubParsersAction"),
        ("pypto_sched.cli.run", "from . import _render\n_render.emit()"),
    ],
)
def test_the_checker_lets_a_private_submodule_or_a_public_name_through(
    name: str, source: str
) -> None:
    assert _check("private", name, source) == []


@pytest.mark.parametrize(
    "source",
    [
        "from ..runtime.execute import execute_schedule",
        "from ..models.qwen3 import read_config",
        "from ..cli import main",
        "from .. import PlannerConfig",
        "from ..execute import execute_schedule",
        "import pypto_sched.testing",
        "import torch",
        "import os",
        "from os import environ",
        "import time",
        "from logging import getLogger",
        "from pathlib import Path",
        "with open('x') as f: pass",
    ],
)
def test_the_checker_finds_a_core_breach(source: str) -> None:
    assert _check("core", "pypto_sched.core._online", source)


@pytest.mark.parametrize(
    "source",
    [
        "from ._policies import request_cap",
        "from . import _validate",
        "import numpy as np",
        "import attrs",
        "import json",
        "from collections.abc import Mapping",
    ],
)
def test_the_checker_lets_the_core_import_the_core_numpy_and_attrs(source: str) -> None:
    assert _check("core", "pypto_sched.core._online", source) == []


@pytest.mark.parametrize(
    ("name", "source", "breach"),
    [
        ("pypto_sched.models.qwen3", "from ..runtime.backends import Backend", True),
        ("pypto_sched.models.qwen3", "from ..core._errors import CheckpointError", False),
        ("pypto_sched.runtime.execute", "from ..cli import main", True),
        ("pypto_sched.runtime.execute", "from .. import generate", True),
        ("pypto_sched.runtime.execute", "from ..models.qwen3 import read_config", False),
        ("pypto_sched.runtime.execute", "from ..integrations.ray import generate_on_ray", True),
    ],
)
def test_the_checker_holds_the_layer_order(name: str, source: str, breach: bool) -> None:
    assert bool(_check("layers", name, source)) is breach


def test_a_private_name_means_one_thing_across_the_package() -> None:
    # A module-level function or class named ``_x`` is defined in one module of pypto_sched:
    # two ``_plan_packed`` in two files that do different things read as one.
    homes: dict[str, list[str]] = {}
    for name, path in MODULES.items():
        if not name.startswith("pypto_sched."):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        defined = {
            node.name
            for node in tree.body
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
            and _is_private(node.name)
        }
        for private in defined:
            homes.setdefault(private, []).append(name)
    twice = {private: where for private, where in homes.items() if len(where) > 1}
    assert not twice, f"give each a name of its own: {twice}"


#: The public module paths kept at the root, and each one's home in its layer.
PUBLIC_PATHS = {
    "pypto_sched.backends": "pypto_sched.runtime.backends",
    "pypto_sched.execute": "pypto_sched.runtime.execute",
    "pypto_sched.prompts": "pypto_sched.runtime.prompts",
    "pypto_sched.chat": "pypto_sched.runtime.chat",
    "pypto_sched.output": "pypto_sched.runtime.output",
    "pypto_sched.checkpoints": "pypto_sched.models.qwen3",
}


@pytest.mark.parametrize(("path", "home"), PUBLIC_PATHS.items())
def test_a_public_path_is_its_homes_names(path: str, home: str) -> None:
    public, own = importlib.import_module(path), importlib.import_module(home)
    assert public.__all__ == own.__all__
    for name in own.__all__:
        assert getattr(public, name) is getattr(own, name), name
    # and nothing of its own: a function defined there would be a second home
    defined = [
        n
        for n in ast.parse(MODULES[path].read_text()).body
        if isinstance(n, ast.FunctionDef | ast.ClassDef)
    ]
    assert not defined
