"""The backend's final logits equal transformers' Qwen3ForCausalLM logits at each prompt's
last position, for any schedule the planner makes: both policies, budgets, thresholds,
planner and KV page sizes, prefix-cache hits, host or device embeddings; on the CPU op path
and on the NPU op path (against the fake torch_npu)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pypto_sched import POLICIES, BlockTables, PlannerConfig, plan_pages, plan_prefill
from pypto_sched.execute import ExecutionResult, execute_schedule

pytest.importorskip("torch", reason="the npu backend runs on torch")


from pypto_sched_npu import NpuBackend

FLOAT32_TOLERANCE = 1e-4
MODELS = ("tied", "untied", "sharded")


@attrs.frozen
class Case:
    """One generated run: prompts, planner config, KV page size and prefix hits."""

    prompts: tuple[npt.NDArray[np.int64], ...]
    config: PlannerConfig
    kv_page_size: int
    computed: tuple[int, ...]
    host_embeddings: bool

    @property
    def lengths(self) -> list[int]:
        return [int(p.size) for p in self.prompts]


@st.composite
def cases(
    draw: st.DrawFn, *, max_length: int, min_budget: int, kv_page_sizes: tuple[int, ...]
) -> Case:
    count = draw(st.integers(1, 4))
    lengths = draw(st.lists(st.integers(1, max_length), min_size=count, max_size=count))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    prompts = tuple(rng.integers(0, 101, size=n, dtype=np.int64) for n in lengths)
    budget = draw(st.integers(min_budget, 2 * max_length))
    threshold = draw(st.none() | st.integers(1, budget))
    cap = min(budget, threshold or budget)
    policy = draw(st.sampled_from(POLICIES))
    config = PlannerConfig(
        max_num_batched_tokens=budget,
        long_prefill_token_threshold=threshold,
        max_num_seqs=draw(st.none() | st.integers(1, 4)),
        chunk_alignment=draw(st.none() | st.integers(1, cap)),
        policy=policy,
        max_num_partial_prefills=(
            draw(st.none() | st.integers(1, 3)) if policy == "packed" else None
        ),
    )
    hits = draw(st.lists(st.booleans(), min_size=count, max_size=count))
    computed = tuple(
        draw(st.integers(0, n - 1)) if hit and n > 1 else 0
        for n, hit in zip(lengths, hits, strict=True)
    )
    return Case(
        prompts=prompts,
        config=config,
        kv_page_size=draw(st.sampled_from(kv_page_sizes)),
        computed=computed,
        host_embeddings=draw(st.booleans()),
    )


def run(backend: NpuBackend, case: Case) -> ExecutionResult:
    """Fill the cache with the prefix hits (a schedule of their own), then run the rest."""
    page = case.kv_page_size
    tables = plan_pages(
        case.lengths, page_size=page, num_pages=sum(-(-n // page) for n in case.lengths)
    )
    cache = backend.new_cache(num_pages=tables.num_pages, page_size=page)
    hit = [r for r, c in enumerate(case.computed) if c > 0]
    if hit:
        prefix_tables = BlockTables.from_lists(
            [tables.table(r).tolist() for r in hit], page_size=page, num_pages=tables.num_pages
        )
        execute_schedule(
            plan_prefill([case.computed[r] for r in hit], case.config),
            backend,
            [case.prompts[r][: case.computed[r]] for r in hit],
            block_tables=prefix_tables,
            cache=cache,
            return_logits=False,
        )
    embeddings = [backend.embed(p) for p in case.prompts] if case.host_embeddings else None
    return execute_schedule(
        plan_prefill(case.lengths, case.config, num_computed_tokens=list(case.computed)),
        backend,
        list(case.prompts),
        input_embeddings=embeddings,
        block_tables=tables,
        cache=cache,
        return_greedy=True,
    )


def assert_matches(result: ExecutionResult, expected: npt.NDArray[np.float32]) -> None:
    """Every request's final logits equal transformers' in float32; greedy ids are argmaxes."""
    assert result.logits is not None
    assert np.abs(result.logits - expected).max() <= FLOAT32_TOLERANCE
    np.testing.assert_array_equal(result.greedy_token_ids, result.logits.argmax(axis=1))


Backends = Callable[..., NpuBackend]

SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("model", MODELS)
@SETTINGS
@given(case=cases(max_length=60, min_budget=1, kv_page_sizes=(1, 2, 3, 8, 16)))
def test_cpu_path_final_logits_match_transformers(
    model: str, case: Case, backends: Backends, reference: Any
) -> None:
    result = run(backends(model, ops="torch"), case)
    assert_matches(result, reference.batch(model, list(case.prompts)))


@pytest.mark.parametrize("model", MODELS)
@SETTINGS
@given(case=cases(max_length=300, min_budget=24, kv_page_sizes=(128,)))
def test_fake_npu_path_final_logits_match_transformers(
    model: str, case: Case, backends: Backends, reference: Any
) -> None:
    result = run(backends(model, ops="npu"), case)
    assert_matches(result, reference.batch(model, list(case.prompts)))
