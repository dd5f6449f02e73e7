"""Generation on the reference backend gives transformers' ``generate()`` tokens.

Tiny random Qwen3 checkpoints saved by transformers itself (tied and untied embeddings, GQA
ratios, head_dim != hidden / heads) generate greedily through :func:`pypto_sched.generate`
under both policies, with and without page alignment, and with a KV pool so small that
requests are preempted and recomputed (asserted); every request's tokens must equal
transformers' ``generate()`` of that prompt alone, token for token. transformers runs in
float64 like the backend, so no near-tie can flip a token.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pypto_sched import GenerationResult, PlannerConfig, SamplingParams, generate
from pypto_sched_reference import ReferenceBackend

torch = pytest.importorskip("torch", reason="transformers, the oracle, runs on torch")
transformers = pytest.importorskip("transformers", reason="the oracle is transformers' Qwen3")

VOCAB_SIZE = 97
NEW_TOKENS = 10
MODELS: dict[str, dict[str, Any]] = {
    "tied, GQA 2:1, head_dim 24 != 64 / 4": {
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 24,
        "tie_word_embeddings": True,
    },
    "untied, one KV head": {
        "hidden_size": 48,
        "num_attention_heads": 3,
        "num_key_value_heads": 1,
        "head_dim": 16,
        "tie_word_embeddings": False,
        "rope_theta": 5000.0,
    },
}
PROMPT_LENGTHS = [1, 7, 23, 40, 3, 17]
#: (name, config, page_size, num_pages): num_pages None is room for everything.
RUNS: list[tuple[str, PlannerConfig, int, int | None]] = [
    ("round_robin", PlannerConfig(max_num_batched_tokens=64, long_prefill_token_threshold=8),
     4, None),
    ("packed", PlannerConfig(max_num_batched_tokens=24, long_prefill_token_threshold=8,
                             policy="packed", max_num_seqs=4), 4, None),
    ("packed, pages aligned", PlannerConfig(max_num_batched_tokens=16, chunk_alignment=4,
                                            policy="packed"), 4, None),
    ("round_robin, small pool", PlannerConfig(max_num_batched_tokens=32), 4, 14),
    ("packed, small pool", PlannerConfig(max_num_batched_tokens=32, policy="packed",
                                         chunk_alignment=4), 4, 14),
]  # fmt: skip


def _save(directory: Path, overrides: dict[str, Any], seed: int) -> None:
    torch.manual_seed(seed)
    config = transformers.Qwen3Config(
        vocab_size=VOCAB_SIZE, intermediate_size=96, num_hidden_layers=2,
        initializer_range=0.1, **overrides,
    )  # fmt: skip
    transformers.Qwen3ForCausalLM(config).save_pretrained(directory)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("generate")
    paths = {}
    for seed, (name, overrides) in enumerate(MODELS.items()):
        paths[name] = root / f"model{seed}"
        _save(paths[name], overrides, seed)
    return paths


@pytest.fixture(scope="module")
def prompts() -> list[np.ndarray]:
    rng = np.random.default_rng(7)
    return [rng.integers(0, VOCAB_SIZE, size=n) for n in PROMPT_LENGTHS]


@pytest.fixture(scope="module")
def expected(checkpoints: dict[str, Path], prompts: list[np.ndarray]) -> dict[str, list[list[int]]]:
    """transformers' greedy ``generate()`` of each prompt alone, in float64."""
    tokens = {}
    for name, path in checkpoints.items():
        model = transformers.Qwen3ForCausalLM.from_pretrained(path, dtype=torch.float64).eval()
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


def _generate(
    backend: ReferenceBackend,
    prompts: list[np.ndarray],
    run: tuple[str, PlannerConfig, int, int | None],
    **options: Any,
) -> GenerationResult:
    _, config, page_size, num_pages = run
    return generate(
        backend, prompts, config=config, max_new_tokens=NEW_TOKENS, kv_page_size=page_size,
        num_kv_pages=num_pages, **options,
    )  # fmt: skip


@pytest.mark.parametrize("model", list(MODELS))
@pytest.mark.parametrize("run", RUNS, ids=[run[0] for run in RUNS])
def test_greedy_tokens_equal_transformers_generate(
    model: str,
    run: tuple[str, PlannerConfig, int, int | None],
    checkpoints: dict[str, Path],
    prompts: list[np.ndarray],
    expected: dict[str, list[list[int]]],
) -> None:
    backend = ReferenceBackend.from_checkpoint(checkpoints[model], dtype="float64")
    result = _generate(backend, prompts, run)
    assert [s.token_ids.tolist() for s in result.sequences] == expected[model]
    assert all(s.finish_reason == "length" for s in result.sequences)
    if run[3] is not None:  # the small pool: someone had to wait and recompute
        assert result.stats.num_preemptions > 0
    assert result.stats.num_mixed_dispatches > 0
    assert result.stats.num_generated_tokens == NEW_TOKENS * len(prompts)


def test_a_stop_token_ends_a_request_there(
    checkpoints: dict[str, Path], prompts: list[np.ndarray], expected: dict[str, list[list[int]]]
) -> None:
    model = next(iter(MODELS))
    backend = ReferenceBackend.from_checkpoint(checkpoints[model], dtype="float64")
    stop = expected[model][2][4]  # request 2's fifth token
    result = _generate(
        backend, prompts, RUNS[1], request_stop_token_ids=[[], [], [stop], [], [], []]
    )
    tokens = result.sequences[2].token_ids.tolist()
    assert tokens == expected[model][2][: expected[model][2].index(stop) + 1]
    assert result.sequences[2].finish_reason == "stop"
    assert [s.token_ids.tolist() for i, s in enumerate(result.sequences) if i != 2] == [
        e for i, e in enumerate(expected[model]) if i != 2
    ]


def test_seeded_sampling_does_not_depend_on_policy_budget_or_pool(
    checkpoints: dict[str, Path], prompts: list[np.ndarray]
) -> None:
    backend = ReferenceBackend.from_checkpoint(checkpoints[next(iter(MODELS))], dtype="float64")
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
