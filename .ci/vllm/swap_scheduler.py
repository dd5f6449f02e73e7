"""A pytest plugin: vLLM's own scheduler tests, run against pypto_sched's scheduler.

``pytest -p swap_scheduler --pypto-sched-policy=packed`` (with this folder on
``PYTHONPATH``) points every collected test module, and ``tests/v1/core/utils.py`` whose
``create_scheduler`` builds the schedulers, at ``scheduler_class(policy)`` where they name
vLLM's ``Scheduler``, and at its async twin where they name ``AsyncScheduler``. vLLM's files
are not edited. Without the option the plugin does nothing (the stock run). The session
fails if the option is given and no pypto_sched scheduler was built. In every run, stock
included, it skips vLLM's per-test teardown of torch's distributed state (see
``pytest_collection_modifyitems``).
"""

from __future__ import annotations

import sys
from types import ModuleType
from typing import Any

import pytest
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler

from pypto_sched.integrations.vllm import PyptoScheduler, scheduler_class

_built = 0


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--pypto-sched-policy",
        default=None,
        help="run vLLM's scheduler tests with pypto_sched's scheduler under this policy",
    )


def _counting(cls: type[PyptoScheduler]) -> type[PyptoScheduler]:
    """``cls``, counting the schedulers built (a check that the swap took)."""
    init = cls.__init__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        global _built
        init(self, *args, **kwargs)
        _built += 1

    cls.__init__ = __init__  # type: ignore[method-assign]
    return cls


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # vLLM's conftest tears down torch's distributed state and collects garbage after every
    # test unless a test says it needs none (its note: a ~10x speedup for CPU unit tests).
    # These tests start no distributed state; the same in every run, stock included.
    for item in items:
        item.add_marker(pytest.mark.skip_global_cleanup)
    policy = config.getoption("--pypto-sched-policy")
    if policy is None:
        return
    ours = {
        Scheduler: _counting(scheduler_class(policy)),
        AsyncScheduler: _counting(scheduler_class(policy, asynchronous=True)),
    }
    modules: set[ModuleType] = {
        item.module for item in items if isinstance(getattr(item, "module", None), ModuleType)
    }
    utils = sys.modules.get("tests.v1.core.utils")
    if utils is not None:
        modules.add(utils)
    for module in modules:
        for name, value in list(vars(module).items()):
            if isinstance(value, type) and value in ours:
                setattr(module, name, ours[value])


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    if config.getoption("--pypto-sched-policy") is not None:
        terminalreporter.write_line(f"pypto_sched schedulers built: {_built}")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    swapped = session.config.getoption("--pypto-sched-policy") is not None
    if swapped and _built == 0 and session.testscollected:
        session.exitstatus = pytest.ExitCode.INTERNAL_ERROR
