"""Fixtures: tiny random Qwen3 checkpoints written with transformers, transformers' own logits
as the oracle, backends on the CPU and fake-NPU op paths, and the fake torch_npu module.

The tests import nothing from this directory; everything they need comes from fixtures (the
test runner imports test files by path, so sibling modules are not importable by name).
"""

from __future__ import annotations

import contextlib
import importlib.util
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

# This file is loaded even where torch or transformers is missing, so it imports them only
# where they are used: each test module skips itself without torch (with the reason), and
# the fixtures that need transformers skip their tests without it.
try:
    import torch

    from pypto_sched_npu import NpuBackend, refresh_availability
except ImportError:
    pass


def _transformers() -> Any:
    return pytest.importorskip("transformers", reason="the oracle is transformers' Qwen3")


FAKE_PATH = Path(__file__).with_name("fake_torch_npu.py")

#: Tiny checkpoints: transformers config overrides and how to save them. Together they cover
#: tied and untied embeddings, a sharded checkpoint, bfloat16 weights, head_dim both equal to
#: and different from hidden/heads, one KV head, attention biases, and RoPE bases other than
#: the default (transformers 5 writes them inside ``rope_parameters``).
#: On the NPU path "untied" (head_dim 128) uses npu_apply_rotary_pos_emb, which takes 128
#: only, and the TND prefill call, which takes 64 or 128; "tied" (64) takes the TND call
#: with the portable rotary; "sharded" (32) exercises the portable fallback of both.
TINY_MODELS: dict[str, dict[str, Any]] = {
    "tied": {
        "config": {
            "hidden_size": 64,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 64,
            "tie_word_embeddings": True,
            "rope_theta": 1_000_000.0,
        },
        "save": {},
    },
    "untied": {
        "config": {
            "hidden_size": 96,
            "num_attention_heads": 4,
            "num_key_value_heads": 1,
            "head_dim": 128,
            "tie_word_embeddings": False,
            "attention_bias": True,
            "rope_theta": 500.0,
        },
        "save": {},
    },
    "sharded": {
        "config": {
            "hidden_size": 64,
            "num_attention_heads": 2,
            "num_key_value_heads": 2,
            "head_dim": 32,
            "tie_word_embeddings": False,
        },
        "save": {"max_shard_size": "60KB", "dtype": "bfloat16"},
    },
    # Weights large enough that greedy decoding does not just repeat the prompt's last token
    # (with small tied embeddings, the residual's own embedding wins every step).
    "tied_varied": {
        "config": {
            "hidden_size": 64,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 64,
            "tie_word_embeddings": True,
            "initializer_range": 0.25,
        },
        "save": {},
    },
}
VOCAB_SIZE = 101


def _write_checkpoint(directory: Path, spec: dict[str, Any], seed: int) -> None:
    transformers = _transformers()
    torch.manual_seed(seed)
    config = transformers.Qwen3Config(
        **{
            "vocab_size": VOCAB_SIZE,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "max_position_embeddings": 1024,
            "initializer_range": 0.08,
            **spec["config"],
        }
    )
    model = transformers.Qwen3ForCausalLM(config).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            # Random norms and biases, so every weight's handling is visible in the logits.
            if name.endswith("norm.weight"):
                parameter.copy_(1.0 + 0.2 * torch.randn_like(parameter))
            elif name.endswith(".bias"):
                parameter.copy_(0.05 * torch.randn_like(parameter))
    dtype = spec["save"].get("dtype")
    if dtype is not None:
        model = model.to(getattr(torch, dtype))
    shard = spec["save"].get("max_shard_size")
    if shard is None:
        model.save_pretrained(directory)
    else:
        model.save_pretrained(directory, max_shard_size=shard)


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Name -> directory of each tiny checkpoint in :data:`TINY_MODELS`."""
    root = tmp_path_factory.mktemp("checkpoints")
    paths = {}
    for seed, (name, spec) in enumerate(TINY_MODELS.items()):
        paths[name] = root / name
        _write_checkpoint(paths[name], spec, seed)
    return paths


class Reference:
    """transformers' Qwen3ForCausalLM logits at a prompt's last position (float32)."""

    def __init__(self, checkpoints: dict[str, Path]) -> None:
        self._checkpoints = checkpoints
        self._models: dict[str, Any] = {}
        self._logits: dict[tuple[str, bytes], npt.NDArray[np.float32]] = {}

    def model(self, name: str) -> Any:
        if name not in self._models:
            self._models[name] = (
                _transformers()
                .Qwen3ForCausalLM.from_pretrained(self._checkpoints[name], dtype=torch.float32)
                .eval()
            )
        return self._models[name]

    def last_logits(self, name: str, prompt: npt.NDArray[np.int64]) -> npt.NDArray[np.float32]:
        key = (name, np.asarray(prompt, dtype=np.int64).tobytes())
        if key not in self._logits:
            with torch.inference_mode():
                ids = torch.from_numpy(np.array(prompt, dtype=np.int64))[None]
                logits = self.model(name)(input_ids=ids).logits[0, -1]
            self._logits[key] = logits.numpy().astype(np.float32)
        return self._logits[key]

    def batch(self, name: str, prompts: list[npt.NDArray[np.int64]]) -> npt.NDArray[np.float32]:
        return np.stack([self.last_logits(name, prompt) for prompt in prompts])


@pytest.fixture(scope="session")
def reference(checkpoints: dict[str, Path]) -> Reference:
    return Reference(checkpoints)


def load_fake_torch_npu() -> ModuleType:
    """A fresh copy of the fake, loaded under the name ``torch_npu``."""
    spec = importlib.util.spec_from_file_location("torch_npu", FAKE_PATH)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@contextlib.contextmanager
def installed(module: ModuleType | None) -> Iterator[None]:
    """``sys.modules["torch_npu"]`` is ``module`` (absent for ``None``) inside the block, and
    availability is detected afresh on entry and on exit."""
    saved = sys.modules.pop("torch_npu", None)
    if module is not None:
        sys.modules["torch_npu"] = module
    refresh_availability()
    try:
        yield
    finally:
        sys.modules.pop("torch_npu", None)
        if saved is not None:
            sys.modules["torch_npu"] = saved
        refresh_availability()


@pytest.fixture(scope="session")
def fake_npu_module() -> ModuleType:
    """The fake torch_npu module the session's fake-NPU backends call."""
    return load_fake_torch_npu()


@pytest.fixture
def fake_torch_npu() -> Iterator[ModuleType]:
    """A fresh fake torch_npu, installed in ``sys.modules`` for one test."""
    module = load_fake_torch_npu()
    with installed(module):
        yield module


@pytest.fixture(scope="session", autouse=True)
def _one_torch_thread() -> Iterator[None]:
    """The tiny models' matmuls take microseconds; a second OpenMP thread only adds
    synchronisation, which costs milliseconds on a busy 2-core machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


BackendFactory = Callable[..., "NpuBackend"]


@pytest.fixture(scope="session")
def backends(checkpoints: dict[str, Path], fake_npu_module: ModuleType) -> BackendFactory:
    """``backends(name, ops="torch" | "npu", dtype="float32")``: a cached backend. The
    ``"npu"`` ones run the NPU op path on CPU against the session's fake torch_npu."""
    cache: dict[tuple[str, str, str], NpuBackend] = {}

    def get(name: str, *, ops: str = "torch", dtype: str = "float32") -> NpuBackend:
        key = (name, ops, dtype)
        if key not in cache:
            with installed(fake_npu_module if ops == "npu" else None):
                cache[key] = NpuBackend.from_checkpoint(
                    checkpoints[name],
                    dtype=dtype,
                    device="cpu",
                    ops=ops,  # type: ignore[arg-type]
                )
        return cache[key]

    return get
