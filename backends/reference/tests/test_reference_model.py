"""The reference model: its arithmetic, its paged KV cache, its checkpoints and its options."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import numpy.typing as npt
import pytest

from pypto_sched import (
    CheckpointError,
    ExecutionError,
    InvalidInputError,
    PlannerConfig,
    dispatch_arrays,
    generate,
    plan_pages,
    plan_prefill,
)
from pypto_sched.backends import DispatchInput, load_backend
from pypto_sched.checkpoints import ModelConfig, encode_safetensors, read_safetensors
from pypto_sched.execute import execute_schedule
from pypto_sched.testing import check_backend
from pypto_sched_reference import (
    TINY_MODEL,
    CacheWriteError,
    InvalidModelError,
    PagedKVCache,
    ReferenceBackend,
    ReferenceBackendError,
    Weights,
    create_backend,
    load_checkpoint,
    save_checkpoint,
)

Array = npt.NDArray[np.floating[Any]]


# -- an independent dense decoder: one head at a time, no cache ------------------------------


def _norm(x: Array, gain: Array, eps: float) -> Array:
    return x / np.sqrt((x**2).mean(axis=-1, keepdims=True) + eps) * gain  # type: ignore[no-any-return]


def _rope(x: Array, theta: float) -> Array:
    n, dim = x.shape
    frequencies = 1.0 / theta ** (np.arange(0, dim, 2) / dim)
    angles = np.outer(np.arange(n), frequencies)
    cos, sin = np.cos(np.hstack([angles, angles])), np.sin(np.hstack([angles, angles]))
    rotated = np.hstack([-x[:, dim // 2 :], x[:, : dim // 2]])
    return x * cos + rotated * sin  # type: ignore[no-any-return]


def dense_last_logits(weights: Weights, prompt: npt.NDArray[np.int64]) -> Array:
    """Logits of the prompt's last token, computed the textbook way."""
    c = weights.config
    d, eps, n = c.head_dim, c.rms_norm_eps, prompt.size
    x = weights.embed[prompt].astype(np.float64)
    future = np.triu(np.ones((n, n), dtype=bool), k=1)
    for w in weights.layers:
        h = _norm(x, w.input_norm, eps)
        zero = np.zeros(c.num_attention_heads * d)  # no bias
        qb, kb, vb = (zero if b is None else b for b in (w.q_bias, w.k_bias, w.v_bias))
        outputs = []
        for head in range(c.num_attention_heads):
            kv = head // (c.num_attention_heads // c.num_key_value_heads)
            hs, ks = slice(head * d, (head + 1) * d), slice(kv * d, (kv + 1) * d)
            q = _rope(_norm(h @ w.q_proj[hs].T + qb[hs], w.q_norm, eps), c.rope_theta)
            k = _rope(_norm(h @ w.k_proj[ks].T + kb[ks], w.k_norm, eps), c.rope_theta)
            v = h @ w.v_proj[ks].T + vb[ks]
            scores = np.where(future, -np.inf, q @ k.T / np.sqrt(d))
            p = np.exp(scores - scores.max(axis=1, keepdims=True))
            outputs.append(p / p.sum(axis=1, keepdims=True) @ v)
        x = x + np.hstack(outputs) @ w.o_proj.T + (0.0 if w.o_bias is None else w.o_bias)
        h = _norm(x, w.post_norm, eps)
        gate = h @ w.gate_proj.T
        x = x + (gate / (1.0 + np.exp(-gate)) * (h @ w.up_proj.T)) @ w.down_proj.T
    return _norm(x[-1], weights.norm, eps) @ weights.output_embedding.T


CONFIGS = {
    "gqa": TINY_MODEL,
    "mha-tied": attrs.evolve(TINY_MODEL, num_key_value_heads=4, tie_word_embeddings=True),
    "one-kv-head": attrs.evolve(TINY_MODEL, num_key_value_heads=1, head_dim=16),
    "biases": attrs.evolve(TINY_MODEL, attention_bias=True, rope_theta=500.0),
}


def prompts_of(lengths: list[int], vocab_size: int, seed: int = 0) -> list[npt.NDArray[np.int64]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab_size, size=n) for n in lengths]


@pytest.mark.parametrize("config", CONFIGS.values(), ids=CONFIGS.keys())
@pytest.mark.parametrize("budget", [1000, 7])
def test_the_paged_model_matches_a_plain_dense_decoder(config: ModelConfig, budget: int) -> None:
    backend = ReferenceBackend.from_seed(config, seed=5)
    lengths = [17, 1, 30]
    prompts = prompts_of(lengths, config.vocab_size)
    schedule = plan_prefill(lengths, PlannerConfig(max_num_batched_tokens=budget, policy="packed"))
    result = execute_schedule(schedule, backend, prompts, page_size=4)
    assert result.logits is not None
    for r, prompt in enumerate(prompts):
        np.testing.assert_allclose(
            result.logits[r], dense_last_logits(backend.weights, prompt), rtol=0, atol=1e-10
        )


def test_tied_embeddings_use_the_token_embedding_as_lm_head() -> None:
    weights = Weights.random(attrs.evolve(TINY_MODEL, tie_word_embeddings=True), seed=0)
    assert weights.lm_head is None
    assert weights.output_embedding is weights.embed


def test_float32_weights_compute_in_float32() -> None:
    backend = ReferenceBackend.from_seed(seed=0, dtype="float32")
    prompts = prompts_of([5], backend.vocab_size)
    result = execute_schedule(
        plan_prefill([5], PlannerConfig(max_num_batched_tokens=8)), backend, prompts
    )
    assert result.logits is not None
    assert result.logits.dtype == np.float32
    assert backend.tolerance == 1e-4


# -- the paged KV cache --------------------------------------------------------------------


def test_kv_is_written_only_to_the_slots_of_the_prompts_positions() -> None:
    backend = ReferenceBackend.from_seed(seed=0)
    lengths = [6, 9]
    tables = plan_pages(lengths, page_size=4, num_pages=6)  # pages 0-1 and 2-4; page 5 spare
    result = execute_schedule(
        plan_prefill(lengths, PlannerConfig(max_num_batched_tokens=5)),
        backend,
        prompts_of(lengths, backend.vocab_size),
        block_tables=tables,
    )
    cache: PagedKVCache = result.cache
    expected = np.zeros(cache.num_slots, dtype=bool)
    expected[[0, 1, 2, 3, 4, 5]] = True  # request 0: positions 0-5 in pages 0, 1
    expected[8:17] = True  # request 1: positions 0-8 in pages 2, 3, 4
    np.testing.assert_array_equal(cache.written, expected)
    assert not cache.keys[:, ~expected].any()
    assert not cache.values[:, ~expected].any()
    assert cache.keys[:, expected].all()


def _first_batch(backend: ReferenceBackend, **changes: Any) -> tuple[DispatchInput, PagedKVCache]:
    lengths = [6, 9]
    tables = plan_pages(lengths, page_size=4, num_pages=6)
    schedule = plan_prefill(lengths, PlannerConfig(max_num_batched_tokens=100))
    arrays = attrs.evolve(dispatch_arrays(schedule.dispatch(0), tables), **changes)
    batch = DispatchInput(
        arrays=arrays,
        token_ids=np.zeros(arrays.num_tokens, dtype=np.int64),
        input_embeddings=None,
        return_logits=True,
        return_greedy=False,
    )
    return batch, backend.new_cache(num_pages=6, page_size=4)


def test_writing_outside_a_requests_pages_is_an_error() -> None:
    backend = ReferenceBackend.from_seed(seed=0)
    batch, _ = _first_batch(backend)
    slots = batch.arrays.slot_mapping.copy()
    slots[7] = 21  # request 1's position 1 sent to the spare page 5
    bad, cache = _first_batch(backend, slot_mapping=slots)
    with pytest.raises(CacheWriteError, match="write position 1 of request 1 to slot 21"):
        backend.run_dispatch(bad, cache)
    assert not cache.written.any()


def test_a_block_table_pointing_outside_the_cache_is_an_error() -> None:
    backend = ReferenceBackend.from_seed(seed=0)
    batch, _ = _first_batch(backend)
    tables = batch.arrays.block_tables.copy()
    tables[0, 1] = 99
    bad, cache = _first_batch(backend, block_tables=tables)
    with pytest.raises(CacheWriteError, match=r"row 0 \(request 0\) needs 2 valid pages"):
        backend.run_dispatch(bad, cache)


def test_reading_a_prefix_no_dispatch_wrote_is_an_error() -> None:
    backend = ReferenceBackend.from_seed(seed=0)
    lengths = [6, 9]
    schedule = plan_prefill(
        lengths, PlannerConfig(max_num_batched_tokens=100), num_computed_tokens=[0, 3]
    )
    tables = plan_pages(lengths, page_size=4, num_pages=6)
    empty = backend.new_cache(num_pages=6, page_size=4)  # the prefix was never written
    with pytest.raises(ExecutionError, match="reads position 0 of request 1") as info:
        execute_schedule(
            schedule,
            backend,
            prompts_of(lengths, backend.vocab_size),
            block_tables=tables,
            cache=empty,
        )
    assert isinstance(info.value.__cause__, CacheWriteError)


def test_a_cache_must_come_from_a_matching_backend_and_page_size() -> None:
    backend = ReferenceBackend.from_seed(seed=0)
    batch, _ = _first_batch(backend)
    other = ReferenceBackend.from_seed(attrs.evolve(TINY_MODEL, num_hidden_layers=3), seed=0)
    with pytest.raises(CacheWriteError, match="must be built by this backend"):
        backend.run_dispatch(batch, other.new_cache(num_pages=6, page_size=4))
    with pytest.raises(CacheWriteError, match="page_size must match the cache's 8: 4"):
        backend.run_dispatch(batch, backend.new_cache(num_pages=6, page_size=8))
    with pytest.raises(CacheWriteError, match="must be a PagedKVCache"):
        backend.run_dispatch(batch, {})


def test_host_embeddings_must_match_the_tokens_and_hidden_size() -> None:
    backend = ReferenceBackend.from_seed(seed=0)
    batch, cache = _first_batch(backend)
    wrong = attrs.evolve(batch, input_embeddings=np.zeros((batch.arrays.num_tokens, 3)))
    with pytest.raises(InvalidModelError, match=r"'input_embeddings' must have shape \(15, 32\)"):
        backend.run_dispatch(wrong, cache)


def test_embed_rejects_ids_outside_the_vocabulary() -> None:
    backend = ReferenceBackend.from_seed(seed=0)
    with pytest.raises(InvalidModelError, match=r"must be ints in \[0, 64\)"):
        backend.embed(np.array([3, 64]))


# -- checkpoints ---------------------------------------------------------------------------


def _same_weights(a: Weights, b: Weights) -> bool:
    ta, tb = a.to_tensors(), b.to_tensors()
    return ta.keys() == tb.keys() and all(np.array_equal(ta[k], tb[k]) for k in ta)


@pytest.mark.parametrize("max_shard_tensors", [None, 7], ids=["single-file", "sharded"])
@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_a_saved_checkpoint_loads_back_identically(
    tmp_path: Path, max_shard_tensors: int | None, tied: bool
) -> None:
    weights = Weights.random(attrs.evolve(TINY_MODEL, tie_word_embeddings=tied), seed=2)
    save_checkpoint(weights, tmp_path, max_shard_tensors=max_shard_tensors)
    assert (tmp_path / "model.safetensors.index.json").exists() == (max_shard_tensors is not None)
    loaded = load_checkpoint(tmp_path)
    assert loaded.config == weights.config
    assert _same_weights(loaded, weights)
    backend = ReferenceBackend.from_checkpoint(tmp_path, dtype="float32")
    assert backend.dtype == np.float32


def test_a_tied_checkpoint_that_still_stores_lm_head_uses_it_as_transformers_does(
    tmp_path: Path,
) -> None:
    weights = Weights.random(attrs.evolve(TINY_MODEL, tie_word_embeddings=True), seed=2)
    save_checkpoint(weights, tmp_path)
    tensors = {n: t.array for n, t in read_safetensors(tmp_path / "model.safetensors").items()}
    tensors["lm_head.weight"] = np.zeros_like(tensors["model.embed_tokens.weight"])
    (tmp_path / "model.safetensors").write_bytes(encode_safetensors(tensors))
    loaded = load_checkpoint(tmp_path)
    assert not loaded.config.tie_word_embeddings
    assert loaded.lm_head is not None
    np.testing.assert_array_equal(loaded.output_embedding, 0.0)


def test_a_checkpoint_missing_a_tensor_names_it(tmp_path: Path) -> None:
    weights = Weights.random(TINY_MODEL, seed=2)
    tensors = weights.to_tensors()
    del tensors["model.layers.1.self_attn.k_norm.weight"]
    (tmp_path / "config.json").write_text(json.dumps(weights.config.to_hf_config()))
    (tmp_path / "model.safetensors").write_bytes(encode_safetensors(tensors))
    with pytest.raises(CheckpointError, match=r"tensor 'model\.layers\.1\.self_attn\.k_norm"):
        load_checkpoint(tmp_path)


def test_a_directory_without_weights_is_a_checkpoint_error(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(TINY_MODEL.to_hf_config()))
    with pytest.raises(CheckpointError, match=r"neither model\.safetensors nor"):
        load_checkpoint(tmp_path)
    with pytest.raises(CheckpointError, match="does not exist"):
        load_checkpoint(tmp_path / "missing")


def test_greedy_ids_from_non_finite_logits_are_refused() -> None:
    # Only ids come back on the greedy path, so the driver cannot see the logits: the argmax
    # of a NaN row would be a valid-looking id (every token 0) unless the backend refuses it.
    weights = Weights.random(TINY_MODEL, seed=0)
    norm = np.full_like(weights.norm, np.nan)
    backend = ReferenceBackend(attrs.evolve(weights, norm=norm))
    config = PlannerConfig(max_num_batched_tokens=8)
    with pytest.raises(ExecutionError, match="dispatch 0") as raised:
        generate(backend, [[1, 2, 3], [4]], config=config, max_new_tokens=4)
    assert raised.value.dispatch == 0
    assert isinstance(raised.value.__cause__, ReferenceBackendError)
    assert "logits must be finite to give greedy ids: final row 0 (request 0)" in str(raised.value)
    schedule = plan_prefill([3], config)
    with pytest.raises(ExecutionError, match="logits must be finite to give greedy ids"):
        execute_schedule(schedule, backend, [[1, 2, 3]], return_logits=False, return_greedy=True)


# -- options through the entry point ---------------------------------------------------------


def test_create_backend_takes_model_sizes_seed_and_dtype() -> None:
    backend = create_backend(seed=4, dtype="float32", hidden_size=16, num_hidden_layers=1)
    assert backend.config == attrs.evolve(TINY_MODEL, hidden_size=16, num_hidden_layers=1)
    assert backend.dtype == np.float32


def test_create_backend_rejects_unknown_or_conflicting_options(tmp_path: Path) -> None:
    with pytest.raises(InvalidModelError, match=r"unknown options \['hiden_size'\]"):
        create_backend(hiden_size=16)
    with pytest.raises(InvalidModelError, match=r"from the checkpoint; drop .* \['hidden_size'\]"):
        create_backend(checkpoint=tmp_path, hidden_size=16)
    for seed in (0, 123):  # the checkpoint's weights would silently replace the seed's
        with pytest.raises(InvalidModelError, match=r"from the checkpoint; drop .* \['seed'\]$"):
            load_backend("reference", checkpoint=tmp_path, seed=seed)
    with pytest.raises(InvalidModelError, match="'dtype' must be one of"):
        create_backend(dtype="float16")
    with pytest.raises(InvalidInputError, match="'hidden_size' must be >= 1: 0"):
        create_backend(hidden_size=0)


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"seed": "abc"}, InvalidModelError, r"^'seed' must be an int >= 0: 'abc' \(str\)$"),
        ({"seed": -1}, InvalidModelError, r"^'seed' must be an int >= 0: -1 \(int\)$"),
        ({"seed": True}, InvalidModelError, r"^'seed' must be an int >= 0: True \(bool\)$"),
        ({"seed": 1.5}, InvalidModelError, r"^'seed' must be an int >= 0: 1\.5 \(float\)$"),
        ({"dtype": ["float64"]}, InvalidModelError, r"^'dtype' must be one of"),
        ({"checkpoint": 5}, CheckpointError, r"^the checkpoint directory must be a path .*: 5 "),
    ],
)  # fmt: skip
def test_bad_option_values_are_the_backends_errors_naming_them(
    options: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        load_backend("reference", **options)


# -- conformance -----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_the_reference_backend_passes_the_conformance_check(dtype: str) -> None:
    check_backend(ReferenceBackend.from_seed(seed=7, dtype=dtype), max_examples=12, seed=3)
