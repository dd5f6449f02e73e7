"""The runnable examples in ``docs/examples`` run, and do what their docstrings say."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from pypto_sched import PlannerConfig, generate

EXAMPLES = Path(__file__).resolve().parent.parent / "docs" / "examples"

reference = pytest.importorskip("pypto_sched_reference", reason="the server runs the reference")


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
    assert int(served[1]) + int(served[2]) == 60
    preemptions = re.search(r"(\d+) preemptions", result.stdout)
    assert preemptions is not None
    assert int(preemptions[1]) > 0, result.stdout


@pytest.mark.parametrize(
    ("config", "page_size"),
    [
        (
            PlannerConfig(
                max_num_batched_tokens=128,
                long_prefill_token_threshold=32,
                max_num_seqs=16,
                chunk_alignment=8,
                policy="packed",
            ),
            8,
        ),
        (
            PlannerConfig(
                max_num_batched_tokens=64,
                max_num_seqs=8,
                policy="packed",
                max_num_partial_prefills=2,
            ),
            4,
        ),
        (PlannerConfig(max_num_batched_tokens=256, long_prefill_token_threshold=16), 8),
    ],
    ids=["packed", "packed-partial-limit", "round-robin"],
)
@pytest.mark.parametrize("seed", [0, 1])
def test_the_serving_loop_gives_each_request_the_tokens_of_its_prompt_alone(
    config: PlannerConfig, page_size: int, seed: int
) -> None:
    serving_loop = load("serving_loop")
    backend = reference.ReferenceBackend.from_seed(seed=seed)
    summary = serving_loop.serve(
        config, backend=backend, num_requests=30, num_pages=160 // page_size,
        page_size=page_size, seed=seed,
    )  # fmt: skip
    assert summary.finished + summary.aborted == 30
    assert summary.aborted > 0
    assert summary.preemptions > 0
    assert summary.mixed_steps > 0
    finished = {
        request_id: request
        for request_id, request in summary.requests.items()
        if request_id not in summary.aborted_ids
    }
    assert len(finished) == summary.finished
    alone = generate(
        backend,
        [request.prompt for request in finished.values()],
        config=PlannerConfig(max_num_batched_tokens=4096),
        max_new_tokens=[request.max_new_tokens for request in finished.values()],
    )
    assert [request.generated for request in finished.values()] == [
        sequence.token_ids.tolist() for sequence in alone.sequences
    ]


def test_the_serving_loop_runs_the_backend_contract_s_toy_backend() -> None:
    # The toy backend of writing-a-backend.md follows the contract to the letter: a dispatch
    # without final rows is asked for nothing. The loop must not ask it for tokens there.
    serving_loop = load("serving_loop")
    toy = load("toy_backend").ToyBackend()
    config = PlannerConfig(
        max_num_batched_tokens=16, long_prefill_token_threshold=8, policy="packed"
    )
    summary = serving_loop.serve(config, backend=toy, num_requests=4, num_pages=64, page_size=8)
    assert summary.finished == 4
