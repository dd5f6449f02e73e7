"""Generation on the npu backend gives transformers' ``generate()`` tokens, on the torch path
and on the torch_npu path (against the fake torch_npu).

The conftest's tiny random Qwen3 checkpoints, saved by transformers (tied with GQA 2:1 and
head_dim 64 != 64 / 4; untied with one KV head, attention biases and head_dim 128 != 96 / 4;
sharded bfloat16 weights with head_dim 32 = 64 / 2), generate greedily through
:func:`pypto_sched.generate` under both policies, with and without page alignment, and with a
KV pool so small that requests are preempted and recomputed (asserted). Every request's tokens
must equal transformers' float32 ``generate()`` of that prompt alone, token for token.

Both sides compute in float32, so their logits differ by summation order (~1e-5). A token
may differ only where transformers itself has a near-tie: at the first differing position the
two candidates' logits (transformers', after the common prefix) must be within
:data:`NEAR_TIE`; the rest of that request is then a different continuation and not compared.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from pypto_sched import (
    GenerationResult,
    InvalidInputError,
    PlannerConfig,
    SamplingParams,
    generate,
)
from pypto_sched.backends import relative_tolerance
from pypto_sched.integrations.hf_verify import verify_greedy_generation

pytest.importorskip("torch", reason="the npu backend runs on torch")

import torch

from pypto_sched_npu import NpuBackend
from pypto_sched_npu.ops._npu_ops import PREFILL_HEAD_DIMS

Backends = Callable[..., NpuBackend]
Run = tuple[str, PlannerConfig, int, int | None]

MODELS = ["tied_varied", "untied", "sharded"]
NEW_TOKENS = 8
VOCAB_SIZE = 101
#: Around the 128-slot pages the NPU kernels take: prompts that fill a page to one or two
#: slots short (their decode rows open a new page), span two pages, or sit inside one.
PROMPT_LENGTHS = [3, 126, 40, 250, 127, 9]
#: Alone, the longest request holds 250 + 8 - 1 tokens of KV: 3 pages of 128.
SMALL_POOL = 4
#: How far apart transformers' logits of two tokens may be for a flip between them to count
#: as a near-tie rather than a bug: 10x the float32 logit error the logits tests allow.
NEAR_TIE = 1e-3
#: (name, config, KV page size, num_pages); num_pages None is room for everything.
RUNS: list[Run] = [
    ("round_robin", PlannerConfig(max_num_batched_tokens=128, long_prefill_token_threshold=48),
     128, None),
    ("packed", PlannerConfig(max_num_batched_tokens=96, long_prefill_token_threshold=64,
                             policy="packed", max_num_seqs=4), 128, None),
    ("packed, pages aligned", PlannerConfig(max_num_batched_tokens=256, chunk_alignment=128,
                                            policy="packed"), 128, None),
    ("round_robin, small pool", PlannerConfig(max_num_batched_tokens=128), 128, SMALL_POOL),
    ("packed, pages aligned, small pool",
     PlannerConfig(max_num_batched_tokens=256, policy="packed", chunk_alignment=128), 128,
     SMALL_POOL),
    # The torch path takes any page size: decode rows open a page every 16 tokens.
    ("round_robin, 16-slot pages, small pool",
     PlannerConfig(max_num_batched_tokens=64, long_prefill_token_threshold=32), 16, 17),
]  # fmt: skip
#: The runs of each op path: the NPU kernels take pages of 128 slots.
CASES = [
    pytest.param(run, ops, id=f"{ops}: {run[0]}")
    for ops in ("torch", "npu")
    for run in RUNS
    if ops == "torch" or run[2] >= 128
]


@pytest.fixture(scope="module")
def prompts() -> list[npt.NDArray[np.int64]]:
    rng = np.random.default_rng(11)
    return [rng.integers(0, VOCAB_SIZE, size=n) for n in PROMPT_LENGTHS]


@pytest.fixture(scope="module")
def expected(reference: Any, prompts: list[npt.NDArray[np.int64]]) -> dict[str, list[list[int]]]:
    """transformers' greedy float32 ``generate()`` of each prompt alone, per model."""
    tokens = {}
    for name in MODELS:
        model = reference.model(name)
        outputs = []
        for prompt in prompts:
            ids = torch.from_numpy(prompt)[None]
            with torch.inference_mode():
                out = model.generate(
                    ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS,
                    min_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0,
                )  # fmt: skip
            outputs.append(out[0, len(prompt) :].tolist())
        tokens[name] = outputs
    return tokens


Generated = Callable[[str, Run, str], tuple[GenerationResult, dict[str, int]]]


@pytest.fixture(scope="module")
def generated(
    backends: Backends, prompts: list[npt.NDArray[np.int64]], fake_npu_module: ModuleType
) -> Generated:
    """``generated(model, run, ops)``: the greedy generation of ``prompts`` (computed once)
    and, on the npu path, its attention calls per layout."""
    results: dict[tuple[str, str, str], tuple[GenerationResult, dict[str, int]]] = {}

    def get(model: str, run: Run, ops: str) -> tuple[GenerationResult, dict[str, int]]:
        key = (model, run[0], ops)
        if key not in results:
            fake_npu_module.reset_calls()
            result = _generate(backends(model, ops=ops), prompts, run)
            results[key] = result, dict(fake_npu_module.LAYOUTS)
        return results[key]

    return get


def _generate(
    backend: NpuBackend, prompts: list[npt.NDArray[np.int64]], run: Run, **options: Any
) -> GenerationResult:
    _, config, page_size, num_pages = run
    return generate(
        backend, prompts, config=config, max_new_tokens=NEW_TOKENS, kv_page_size=page_size,
        num_kv_pages=num_pages, **options,
    )  # fmt: skip


def _assert_same_greedy_tokens(
    got: list[list[int]],
    want: list[list[int]],
    prompts: list[npt.NDArray[np.int64]],
    logits: Callable[[npt.NDArray[np.int64]], npt.NDArray[np.float32]],
) -> int:
    """Assert that ``got`` are ``want``'s tokens, a near-tie aside (see the module docstring);
    return how many requests differed at a near-tie."""
    near_ties = 0
    assert [len(tokens) for tokens in got] == [len(tokens) for tokens in want]
    for request, (ours, theirs) in enumerate(zip(got, want, strict=True)):
        if ours == theirs:
            continue
        first = next(i for i, (a, b) in enumerate(zip(ours, theirs, strict=True)) if a != b)
        context = np.concatenate([prompts[request], np.array(theirs[:first], dtype=np.int64)])
        at = logits(context)
        gap = abs(float(at[theirs[first]]) - float(at[ours[first]]))
        assert gap <= NEAR_TIE, (
            f"request {request}: token {first} is {ours[first]}, transformers gives "
            f"{theirs[first]} by a logit margin of {gap:.2e} (> {NEAR_TIE}): {ours} != {theirs}"
        )
        near_ties += 1
    return near_ties


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize(("run", "ops"), CASES)
def test_greedy_tokens_equal_transformers_generate(
    model: str,
    run: Run,
    ops: str,
    generated: Generated,
    backends: Backends,
    prompts: list[npt.NDArray[np.int64]],
    expected: dict[str, list[list[int]]],
    reference: Any,
) -> None:
    result, layouts = generated(model, run, ops)
    tokens = [s.token_ids.tolist() for s in result.sequences]
    near_ties = _assert_same_greedy_tokens(
        tokens, expected[model], prompts, lambda ids: reference.last_logits(model, ids)
    )
    assert near_ties <= 1  # a second near-tie in one run would be a suspicious coincidence
    assert all(s.finish_reason == "length" for s in result.sequences)
    assert result.stats.num_generated_tokens == NEW_TOKENS * len(prompts)
    assert result.stats.num_mixed_dispatches > 0
    if run[3] is not None:  # the small pool: someone had to give its pages back and recompute
        assert result.stats.num_preemptions > 0
        assert result.stats.num_computed_tokens > result.stats.num_prompt_tokens + (
            (NEW_TOKENS - 1) * len(prompts)
        )
    if ops == "npu":  # decode-only dispatches took the BSH decode call, the others TND
        assert layouts["BSH"] > 0
        # ... where the TND call takes the head size; "sharded" (32) attends them portably
        takes_tnd = backends(model).model.config.head_dim in PREFILL_HEAD_DIMS
        assert (layouts.get("TND", 0) > 0) == takes_tnd


@pytest.mark.parametrize("model", MODELS)
def test_the_fake_npu_path_gives_the_torch_paths_tokens(
    model: str,
    generated: Generated,
    prompts: list[npt.NDArray[np.int64]],
    reference: Any,
) -> None:
    for run in RUNS:
        if run[2] < 128:
            continue
        torch_result, _ = generated(model, run, "torch")
        npu_result, _ = generated(model, run, "npu")
        torch_tokens = [s.token_ids.tolist() for s in torch_result.sequences]
        npu_tokens = [s.token_ids.tolist() for s in npu_result.sequences]
        near_ties = _assert_same_greedy_tokens(
            npu_tokens, torch_tokens, prompts, lambda ids: reference.last_logits(model, ids)
        )
        assert near_ties == 0, f"{run[0]}: the two op paths split at a near-tie"
        assert npu_result.stats.num_dispatches == torch_result.stats.num_dispatches
        assert npu_result.stats.num_preemptions == torch_result.stats.num_preemptions


def test_seeded_sampling_does_not_depend_on_policy_budget_or_pool(
    backends: Backends, prompts: list[npt.NDArray[np.int64]]
) -> None:
    backend = backends("tied")
    sampling = SamplingParams(temperature=1.0, top_k=20, top_p=0.9, seed=3)
    outputs = [
        [
            s.token_ids.tolist()
            for s in _generate(backend, prompts, run, sampling=sampling).sequences
        ]
        for run in RUNS
    ]
    assert all(output == outputs[0] for output in outputs)
    greedy = [s.token_ids.tolist() for s in _generate(backend, prompts, RUNS[0]).sequences]
    assert outputs[0] != greedy  # it did sample


def test_a_stop_token_ends_a_request_there_on_the_npu_path(
    backends: Backends,
    prompts: list[npt.NDArray[np.int64]],
    generated: Generated,
) -> None:
    # The npu path's own tokens (the near-tie rule is the test above's business).
    tokens = [s.token_ids.tolist() for s in generated("tied", RUNS[3], "npu")[0].sequences]
    stop = tokens[1][3]  # request 1's fourth token
    stops: list[list[int]] = [[] for _ in prompts]
    stops[1] = [stop]
    result = _generate(backends("tied", ops="npu"), prompts, RUNS[3], request_stop_token_ids=stops)
    assert result.sequences[1].token_ids.tolist() == tokens[1][: tokens[1].index(stop) + 1]
    assert result.sequences[1].finish_reason == "stop"
    others = [s.token_ids.tolist() for i, s in enumerate(result.sequences) if i != 1]
    assert others == [t for i, t in enumerate(tokens) if i != 1]


def test_the_checkpoints_cover_the_shapes_the_issue_names(backends: Backends) -> None:
    configs = {name: backends(name).model.config for name in MODELS}
    assert {c.tie_word_embeddings for c in configs.values()} == {True, False}
    ratios = {c.num_attention_heads // c.num_key_value_heads for c in configs.values()}
    assert len(ratios) >= 2
    assert any(c.head_dim != c.hidden_size // c.num_attention_heads for c in configs.values())


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_generation_runs_the_npu_kernels_and_keeps_to_its_tolerance(
    dtype: str,
    backends: Backends,
    checkpoints: dict[str, Path],
    prompts: list[npt.NDArray[np.int64]],
    fake_npu_module: ModuleType,
) -> None:
    """The fake asserts the kernels' dtypes on every call (float16 never reaches the TND
    call, which takes bfloat16 only). Every generated token is transformers' greedy choice
    (in float64) after the same tokens, or within the backend's declared tolerance of it:
    half precision may break a near-tie the other way, and nothing more."""
    fake_npu_module.reset_calls()
    backend = backends("tied_varied", ops="npu", dtype=dtype)
    result = _generate(backend, prompts, RUNS[3])
    assert fake_npu_module.LAYOUTS["BSH"] > 0
    # The TND call takes bfloat16 only: float16 prefill attends on the portable path.
    assert (fake_npu_module.LAYOUTS["TND"] > 0) == (dtype == "bfloat16")
    assert all(s.token_ids.shape == (NEW_TOKENS,) for s in result.sequences)
    verification = verify_greedy_generation(
        checkpoints["tied_varied"], prompts, [s.token_ids for s in result.sequences],
        max_new_tokens=NEW_TOKENS, tolerance=backend.tolerance,
        relative_tolerance=relative_tolerance(backend),
    )  # fmt: skip
    assert verification.passed, verification.describe()


def test_the_npu_kernels_refuse_the_default_page_size_with_the_reason(
    backends: Backends, prompts: list[npt.NDArray[np.int64]]
) -> None:
    backend = backends("tied_varied", ops="npu")
    with pytest.raises(InvalidInputError, match=r"'page_size' must be 128 .*: 16$"):
        generate(backend, prompts, config=RUNS[0][1], max_new_tokens=2)
