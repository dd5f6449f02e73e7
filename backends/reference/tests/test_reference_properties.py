"""Properties of chunked prefill on the reference model (float64).

For random tiny models, prompts, planner configs under both policies, page sizes and prefix
hits: chunking changes neither the final logits (beyond 1e-9) nor the KV cache, the host and
device embedding paths agree exactly, and greedy ids are the argmax of the one-shot logits.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from pypto_sched import (
    POLICIES,
    BlockTables,
    InvalidConfigError,
    PlannerConfig,
    Schedule,
    plan_pages,
    plan_prefill,
)
from pypto_sched.checkpoints import ModelConfig
from pypto_sched.execute import ExecutionResult, execute_schedule, write_prefixes
from pypto_sched_reference import PagedKVCache, ReferenceBackend

FLOAT64_TOLERANCE = 1e-9
EXAMPLES = settings(deadline=None)  # example counts come from the active profile


@st.composite
def model_configs(draw: st.DrawFn) -> ModelConfig:
    kv_heads = draw(st.integers(1, 2))
    return ModelConfig(
        vocab_size=draw(st.integers(8, 64)),
        hidden_size=draw(st.sampled_from([16, 32])),
        intermediate_size=draw(st.sampled_from([16, 48])),
        num_hidden_layers=draw(st.integers(1, 2)),
        num_attention_heads=kv_heads * draw(st.integers(1, 3)),
        num_key_value_heads=kv_heads,
        head_dim=draw(st.sampled_from([4, 8])),
        tie_word_embeddings=draw(st.booleans()),
        attention_bias=draw(st.booleans()),
    )


@st.composite
def cases(draw: st.DrawFn, *, prefix_hits: bool = False) -> dict[str, Any]:
    """A backend, prompts, a chunking config, a KV page size and computed-token counts."""
    config = draw(model_configs())
    backend = ReferenceBackend.from_seed(config, seed=draw(st.integers(0, 2**16)))
    lengths = draw(st.lists(st.integers(1, 24), min_size=1, max_size=4))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    prompts = [rng.integers(0, config.vocab_size, size=n) for n in lengths]
    computed = [draw(st.integers(0, n - 1)) for n in lengths] if prefix_hits else [0] * len(lengths)
    page_size = draw(st.sampled_from([1, 2, 3, 4, 8]))
    budget = draw(st.integers(1, max(sum(lengths) - 1, 1)))
    threshold = draw(st.none() | st.integers(1, budget))
    try:
        planner = PlannerConfig(
            max_num_batched_tokens=budget,
            long_prefill_token_threshold=threshold,
            chunk_alignment=draw(st.none() | st.just(page_size)),
            policy=draw(st.sampled_from(POLICIES)),
        )
    except InvalidConfigError:  # a page larger than the chunk cap: plan without alignment
        planner = PlannerConfig(
            max_num_batched_tokens=budget, long_prefill_token_threshold=threshold
        )
    return {
        "backend": backend,
        "prompts": prompts,
        "schedule": plan_prefill(lengths, planner, num_computed_tokens=computed),
        "tables": plan_pages(
            lengths, page_size=page_size, num_pages=sum(-(-n // page_size) for n in lengths)
        ),
    }


def one_shot(case: dict[str, Any]) -> ExecutionResult:
    lengths = [p.size for p in case["prompts"]]
    schedule = plan_prefill(lengths, PlannerConfig(max_num_batched_tokens=sum(lengths)))
    return execute_schedule(
        schedule, case["backend"], case["prompts"], return_greedy=True, block_tables=case["tables"]
    )


def chunked(case: dict[str, Any], *, host_embeddings: bool = False) -> ExecutionResult:
    backend: ReferenceBackend = case["backend"]
    schedule: Schedule = case["schedule"]
    tables: BlockTables = case["tables"]
    cache = backend.new_cache(num_pages=tables.num_pages, page_size=tables.page_size)
    write_prefixes(
        backend, case["prompts"], schedule.num_computed_tokens, block_tables=tables, cache=cache
    )
    return execute_schedule(
        schedule,
        backend,
        case["prompts"],
        input_embeddings=[backend.embed(p) for p in case["prompts"]] if host_embeddings else None,
        return_greedy=True,
        block_tables=tables,
        cache=cache,
    )


def assert_same_final_logits(a: ExecutionResult, b: ExecutionResult) -> None:
    assert a.logits is not None
    assert b.logits is not None
    assert float(np.abs(a.logits - b.logits).max()) < FLOAT64_TOLERANCE


def assert_same_cache(a: PagedKVCache, b: PagedKVCache) -> None:
    np.testing.assert_array_equal(a.written, b.written)
    np.testing.assert_allclose(a.keys, b.keys, rtol=0, atol=FLOAT64_TOLERANCE)
    np.testing.assert_allclose(a.values, b.values, rtol=0, atol=FLOAT64_TOLERANCE)


@EXAMPLES
@given(cases())
def test_chunked_prefill_leaves_final_logits_and_kv_cache_as_one_shot(case: dict[str, Any]) -> None:
    reference, result = one_shot(case), chunked(case)
    assert_same_final_logits(result, reference)
    assert_same_cache(result.cache, reference.cache)


@EXAMPLES
@given(cases(prefix_hits=True))
def test_chunked_prefill_after_prefix_hits_equals_one_shot(case: dict[str, Any]) -> None:
    reference, result = one_shot(case), chunked(case)
    assert_same_final_logits(result, reference)
    assert_same_cache(result.cache, reference.cache)


@EXAMPLES
@given(cases(prefix_hits=True))
def test_host_and_device_embedding_paths_agree_exactly(case: dict[str, Any]) -> None:
    device, host = chunked(case), chunked(case, host_embeddings=True)
    assert device.logits is not None
    assert host.logits is not None
    np.testing.assert_array_equal(host.logits, device.logits)
    np.testing.assert_array_equal(host.cache.keys, device.cache.keys)
    np.testing.assert_array_equal(host.cache.values, device.cache.values)


@EXAMPLES
@given(cases())
def test_greedy_ids_are_the_argmax_of_the_one_shot_logits(case: dict[str, Any]) -> None:
    reference, result = one_shot(case), chunked(case)
    assert reference.logits is not None
    np.testing.assert_array_equal(result.greedy_token_ids, np.argmax(reference.logits, axis=1))
    np.testing.assert_array_equal(reference.greedy_token_ids, np.argmax(reference.logits, axis=1))
