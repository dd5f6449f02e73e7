"""The runnable examples in ``docs/examples`` run, and do what their docstrings say."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from pypto_sched import PlannerConfig

EXAMPLES = Path(__file__).resolve().parent.parent / "docs" / "examples"


def load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"examples_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def test_the_serving_loop_runs_as_a_script() -> None:
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / "serving_loop.py")],
        capture_output=True,
        text=True,
        check=True,
    )
    served = re.match(r"(\d+) requests finished and (\d+) aborted", result.stdout)
    assert served is not None, result.stdout
    assert int(served[1]) + int(served[2]) == 200


@pytest.mark.parametrize(
    "config",
    [
        PlannerConfig(
            max_num_batched_tokens=2048,
            long_prefill_token_threshold=512,
            max_num_seqs=32,
            page_size=16,
            policy="packed",
        ),
        PlannerConfig(
            max_num_batched_tokens=1024,
            max_num_seqs=8,
            policy="packed",
            max_num_partial_prefills=2,
        ),
        PlannerConfig(max_num_batched_tokens=8192, long_prefill_token_threshold=256),
    ],
    ids=["packed", "packed-partial-limit", "round-robin"],
)
@pytest.mark.parametrize("seed", [0, 1])
def test_the_serving_loop_serves_every_request_within_the_limits(
    config: PlannerConfig, seed: int
) -> None:
    serving_loop = load("serving_loop")
    summary = serving_loop.serve(config, num_requests=120, seed=seed)
    assert summary.finished + summary.aborted == 120
    assert summary.aborted > 0
    assert len(summary.time_to_first_token) >= summary.finished
    assert summary.decode_tokens > 0
