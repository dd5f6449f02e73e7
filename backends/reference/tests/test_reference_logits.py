"""The reference backend agrees with transformers, not only with itself.

Tiny random Qwen3 checkpoints saved by transformers itself (tied and untied, sharded,
bfloat16 weights, head_dim equal to and different from hidden/heads, one KV head, attention
biases, RoPE bases other than the default, which transformers 5 writes inside
``rope_parameters``) are run through chunked schedules of both policies, with several KV page
sizes and prefix-cache hits; every request's final logits must equal
``transformers.Qwen3ForCausalLM``'s at its last position within 1e-4 (float32 compute).
Chunked-vs-one-shot tests cannot catch a wrong model (a wrong RoPE base, say): this can.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pypto_sched import POLICIES, PlannerConfig, plan_pages, plan_prefill
from pypto_sched.checkpoints import encode_safetensors, read_safetensors
from pypto_sched.execute import ExecutionResult, execute_schedule, write_prefixes
from pypto_sched_reference import ReferenceBackend

torch = pytest.importorskip("torch", reason="transformers, the oracle, runs on torch")
transformers = pytest.importorskip("transformers", reason="the oracle is transformers' Qwen3")

FLOAT32_TOLERANCE = 1e-4
VOCAB_SIZE = 101

#: transformers config overrides and how each checkpoint is saved.
MODELS: dict[str, dict[str, Any]] = {
    "tied, RoPE base 1e6": {
        "config": {
            "hidden_size": 64,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 24,  # != 64 / 4
            "tie_word_embeddings": True,
            "rope_theta": 1_000_000.0,
        },
        "save": {},
    },
    "untied, one KV head, biases, RoPE base 500": {
        "config": {
            "hidden_size": 48,
            "num_attention_heads": 4,
            "num_key_value_heads": 1,
            "head_dim": 16,
            "tie_word_embeddings": False,
            "attention_bias": True,
            "rope_theta": 500.0,
        },
        "save": {},
    },
    "sharded bfloat16": {
        "config": {
            "hidden_size": 64,
            "num_attention_heads": 2,
            "num_key_value_heads": 2,
            "head_dim": 32,  # == 64 / 2
            "tie_word_embeddings": False,
        },
        "save": {"max_shard_size": "30KB", "dtype": "bfloat16"},
    },
}


def _save(directory: Path, spec: dict[str, Any], seed: int) -> None:
    torch.manual_seed(seed)
    config = transformers.Qwen3Config(
        vocab_size=VOCAB_SIZE,
        intermediate_size=96,
        num_hidden_layers=2,
        initializer_range=0.08,
        **spec["config"],
    )
    model = transformers.Qwen3ForCausalLM(config).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            # Random norms and biases, so every weight's handling shows in the logits.
            if name.endswith("norm.weight"):
                parameter.copy_(1.0 + 0.2 * torch.randn_like(parameter))
            elif name.endswith(".bias"):
                parameter.copy_(0.05 * torch.randn_like(parameter))
    save = dict(spec["save"])
    if "dtype" in save:
        model = model.to(getattr(torch, save.pop("dtype")))
    model.save_pretrained(directory, **save)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hf")
    paths = {}
    for seed, (name, spec) in enumerate(MODELS.items()):
        paths[name] = root / f"model{seed}"
        _save(paths[name], spec, seed)
    return paths


class Oracle:
    """transformers' logits at a prompt's last position, cached."""

    def __init__(self, checkpoints: dict[str, Path]) -> None:
        self._checkpoints = checkpoints
        self._models: dict[str, Any] = {}
        self._logits: dict[tuple[str, bytes], npt.NDArray[np.float32]] = {}

    def last_logits(self, name: str, prompt: npt.NDArray[np.int64]) -> npt.NDArray[np.float32]:
        key = (name, prompt.tobytes())
        if key not in self._logits:
            if name not in self._models:
                self._models[name] = transformers.Qwen3ForCausalLM.from_pretrained(
                    self._checkpoints[name], dtype=torch.float32
                ).eval()
            with torch.inference_mode():
                ids = torch.from_numpy(np.array(prompt, dtype=np.int64))[None]
                logits = self._models[name](input_ids=ids).logits[0, -1]
            self._logits[key] = logits.numpy().astype(np.float32)
        return self._logits[key]


@pytest.fixture(scope="module")
def oracle(checkpoints: dict[str, Path]) -> Oracle:
    return Oracle(checkpoints)


@pytest.fixture(scope="module")
def backends(checkpoints: dict[str, Path]) -> dict[tuple[str, str], ReferenceBackend]:
    return {
        (name, dtype): ReferenceBackend.from_checkpoint(path, dtype=dtype)
        for name, path in checkpoints.items()
        for dtype in ("float32", "float64")
    }


@attrs.frozen
class Case:
    prompts: tuple[npt.NDArray[np.int64], ...]
    config: PlannerConfig
    page_size: int
    computed: tuple[int, ...]


@st.composite
def cases(draw: st.DrawFn) -> Case:
    lengths = draw(st.lists(st.integers(1, 50), min_size=1, max_size=4))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    prompts = tuple(rng.integers(0, VOCAB_SIZE, size=n, dtype=np.int64) for n in lengths)
    budget = draw(st.integers(1, 100))
    threshold = draw(st.none() | st.integers(1, budget))
    policy = draw(st.sampled_from(POLICIES))
    config = PlannerConfig(
        max_num_batched_tokens=budget,
        long_prefill_token_threshold=threshold,
        max_num_seqs=draw(st.none() | st.integers(1, 4)),
        policy=policy,
    )
    computed = tuple(draw(st.integers(0, n - 1)) if draw(st.booleans()) else 0 for n in lengths)
    return Case(
        prompts=prompts,
        config=config,
        page_size=draw(st.sampled_from([1, 3, 4, 16])),
        computed=computed,
    )


def run(backend: ReferenceBackend, case: Case) -> ExecutionResult:
    lengths = [int(p.size) for p in case.prompts]
    page = case.page_size
    tables = plan_pages(lengths, page_size=page, num_pages=sum(-(-n // page) for n in lengths))
    cache = backend.new_cache(num_pages=tables.num_pages, page_size=page)
    write_prefixes(backend, list(case.prompts), case.computed, block_tables=tables, cache=cache)
    return execute_schedule(
        plan_prefill(lengths, case.config, num_computed_tokens=list(case.computed)),
        backend,
        list(case.prompts),
        block_tables=tables,
        cache=cache,
    )


@pytest.mark.parametrize("model", MODELS)
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases())
def test_chunked_final_logits_match_transformers_in_float32(
    model: str,
    case: Case,
    backends: dict[tuple[str, str], ReferenceBackend],
    oracle: Oracle,
) -> None:
    result = run(backends[model, "float32"], case)
    expected = np.stack([oracle.last_logits(model, p) for p in case.prompts])
    assert result.logits is not None
    assert np.abs(result.logits - expected).max() <= FLOAT32_TOLERANCE


@pytest.mark.parametrize("model", MODELS)
def test_float64_final_logits_match_transformers(
    model: str, backends: dict[tuple[str, str], ReferenceBackend], oracle: Oracle
) -> None:
    prompts = [np.arange(n, dtype=np.int64) * 7 % VOCAB_SIZE for n in (1, 33, 70)]
    config = PlannerConfig(max_num_batched_tokens=32, long_prefill_token_threshold=8)
    result = execute_schedule(
        plan_prefill([p.size for p in prompts], config), backends[model, "float64"], prompts
    )
    expected = np.stack([oracle.last_logits(model, p) for p in prompts])
    assert result.logits is not None
    assert np.abs(result.logits - expected).max() <= FLOAT32_TOLERANCE


def test_transformers_5_writes_the_rope_base_only_inside_rope_parameters(
    checkpoints: dict[str, Path], backends: dict[tuple[str, str], ReferenceBackend]
) -> None:
    name = "untied, one KV head, biases, RoPE base 500"
    data = json.loads((checkpoints[name] / "config.json").read_text())
    assert "rope_theta" not in data
    assert data["rope_parameters"] == {"rope_type": "default", "rope_theta": 500.0}
    assert backends[name, "float32"].config.rope_theta == 500.0


def test_the_transformers_4_layout_of_the_same_config_gives_the_same_logits(
    checkpoints: dict[str, Path],
    backends: dict[tuple[str, str], ReferenceBackend],
    tmp_path: Path,
) -> None:
    name = "tied, RoPE base 1e6"
    for file in checkpoints[name].iterdir():
        (tmp_path / file.name).write_bytes(file.read_bytes())
    data = json.loads((tmp_path / "config.json").read_text())
    data["rope_theta"] = data.pop("rope_parameters")["rope_theta"]
    data["rope_scaling"] = None
    (tmp_path / "config.json").write_text(json.dumps(data))
    old_layout = ReferenceBackend.from_checkpoint(tmp_path, dtype="float32")
    assert old_layout.config == backends[name, "float32"].config
    prompts = [np.arange(40, dtype=np.int64) % VOCAB_SIZE]
    schedule = plan_prefill([40], PlannerConfig(max_num_batched_tokens=16))
    a = execute_schedule(schedule, old_layout, prompts).logits
    b = execute_schedule(schedule, backends[name, "float32"], prompts).logits
    assert a is not None
    assert b is not None
    np.testing.assert_array_equal(a, b)


def _edited_copy(source: Path, target: Path, **config: Any) -> Path:
    """A copy of the checkpoint ``source`` in ``target`` with ``config`` fields changed."""
    for file in source.iterdir():
        (target / file.name).write_bytes(file.read_bytes())
    data = json.loads((target / "config.json").read_text()) | config
    (target / "config.json").write_text(json.dumps(data))
    return target


def _assert_runs_as_transformers(directory: Path) -> None:
    """The checkpoint's chunked logits equal transformers' on it, for a 40-token prompt."""
    backend = ReferenceBackend.from_checkpoint(directory, dtype="float32")
    prompt = np.arange(40, dtype=np.int64) * 5 % VOCAB_SIZE
    schedule = plan_prefill([40], PlannerConfig(max_num_batched_tokens=16))
    logits = execute_schedule(schedule, backend, [prompt], page_size=4).logits
    expected = Oracle({"model": directory}).last_logits("model", prompt)
    assert logits is not None
    assert np.abs(logits[0] - expected).max() <= FLOAT32_TOLERANCE


def test_a_tied_config_with_a_stored_lm_head_runs_as_transformers_runs_it(
    checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    # An untied model whose config says tied: transformers uses the stored lm_head.
    untied = checkpoints["untied, one KV head, biases, RoPE base 500"]
    _assert_runs_as_transformers(_edited_copy(untied, tmp_path, tie_word_embeddings=True))


def test_a_tied_checkpoint_storing_only_the_lm_head_runs_as_transformers_runs_it(
    checkpoints: dict[str, Path], tmp_path: Path
) -> None:
    # transformers ties the embedding to a stored lm_head.weight when the embedding is absent.
    directory = _edited_copy(checkpoints["tied, RoPE base 1e6"], tmp_path)
    weights = directory / "model.safetensors"
    tensors = {name: tensor.array for name, tensor in read_safetensors(weights).items()}
    tensors["lm_head.weight"] = tensors.pop("model.embed_tokens.weight")
    weights.write_bytes(encode_safetensors(tensors, metadata={"format": "pt"}))
    _assert_runs_as_transformers(directory)


@pytest.mark.parametrize(
    "config",
    [
        # transformers writes layer_types all full: the window reaches no layer of two.
        {"use_sliding_window": True, "sliding_window": 8, "max_window_layers": 28},
        {"use_sliding_window": True, "sliding_window": 8, "layer_types": ["full_attention"] * 2},
        {"hidden_act": "swish"},  # SiLU in transformers
    ],
    ids=["window past the last layer", "window with full layer types", "swish"],
)
def test_configs_transformers_runs_as_full_attention_silu_run_as_it_runs_them(
    config: dict[str, Any], tmp_path: Path
) -> None:
    sizes = {"hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8}
    spec = {"config": sizes | config}
    _save(tmp_path, spec | {"save": {}}, seed=7)
    _assert_runs_as_transformers(tmp_path)  # a 40-token prompt: 5 windows of 8
