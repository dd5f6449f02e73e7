"""vLLM V1's scheduler over a dummy model, stepped with fake model outputs.

Shared by ``tests/test_integration_vllm.py`` and ``benchmarks/bench_vllm_scheduler.py``; it
needs vLLM (import it only where vLLM is installed). No model runs: the scheduler gets a tiny
Qwen3 ``config.json`` written to a temporary folder, and a KV cache config built by hand.
After each ``schedule()`` the driver calls ``update_from_output()`` with one sampled token for
every request whose prefill is complete, so a request decodes until it has ``max_tokens``.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import attrs

# vLLM finds no accelerator here: its CPU platform (set before vLLM is imported).
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

import torch
from vllm.config import CacheConfig, SchedulerConfig, VllmConfig
from vllm.config import ModelConfig as VllmModelConfig
from vllm.sampling_params import SamplingParams
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request, RequestStatus
from vllm.v1.structured_output import StructuredOutputManager

from pypto_sched.checkpoints import ModelConfig

BLOCK_SIZE = 16
MAX_MODEL_LEN = 1 << 15
SAMPLED_TOKEN = 7


def write_model_config(directory: Path, *, max_model_len: int = MAX_MODEL_LEN) -> None:
    """A tiny Qwen3 ``config.json`` (as transformers writes it): vLLM reads the architecture
    and the context length."""
    config = ModelConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=max_model_len,
        tie_word_embeddings=True,
    )
    hf_config = {**config.to_hf_config(), "dtype": "float32"}
    (directory / "config.json").write_text(json.dumps(hf_config))


@attrs.frozen(kw_only=True)
class Knobs:
    """vLLM's scheduler settings for one run."""

    max_num_batched_tokens: int = 256
    long_prefill_token_threshold: int = 0
    max_num_seqs: int = 16
    num_blocks: int = 4096
    enable_prefix_caching: bool = False
    policy: str = "fcfs"
    enable_chunked_prefill: bool = True


def vllm_config(knobs: Knobs) -> Any:
    """A ``VllmConfig`` with these knobs over the dummy model."""
    with tempfile.TemporaryDirectory() as model_dir:
        write_model_config(Path(model_dir))
        model = VllmModelConfig(
            model=model_dir, skip_tokenizer_init=True, dtype="float32", max_model_len=MAX_MODEL_LEN
        )
        scheduler = SchedulerConfig(
            max_num_batched_tokens=knobs.max_num_batched_tokens,
            long_prefill_token_threshold=knobs.long_prefill_token_threshold,
            max_num_seqs=knobs.max_num_seqs,
            max_model_len=MAX_MODEL_LEN,
            enable_chunked_prefill=knobs.enable_chunked_prefill,
            is_encoder_decoder=False,
            policy=knobs.policy,
        )
        cache = CacheConfig(
            block_size=BLOCK_SIZE, enable_prefix_caching=knobs.enable_prefix_caching
        )
        cache.num_gpu_blocks = knobs.num_blocks
        return VllmConfig(scheduler_config=scheduler, model_config=model, cache_config=cache)


def build(scheduler_cls: type[Any], knobs: Knobs) -> Any:
    """A scheduler of ``scheduler_cls`` (vLLM's ``Scheduler`` or a subclass)."""
    config = vllm_config(knobs)
    group = KVCacheGroupSpec(
        ["layer"],
        FullAttentionSpec(block_size=BLOCK_SIZE, num_kv_heads=1, head_size=1, dtype=torch.float32),
    )
    kv_cache = KVCacheConfig(
        num_blocks=knobs.num_blocks, kv_cache_tensors=[], kv_cache_groups=[group]
    )
    return scheduler_cls(
        vllm_config=config,
        kv_cache_config=kv_cache,
        structured_output_manager=StructuredOutputManager(config),
        block_size=BLOCK_SIZE,
    )


def make_request(request_id: str, tokens: list[int], max_tokens: int = 1, priority: int = 0) -> Any:
    return Request(
        request_id=request_id,
        prompt_token_ids=tokens,
        sampling_params=SamplingParams(max_tokens=max_tokens, ignore_eos=True),
        pooling_params=None,
        priority=priority,
    )


class Driver:
    """Steps a scheduler, recording what each step scheduled."""

    def __init__(self, scheduler: Any) -> None:
        self.scheduler = scheduler
        #: Each step's ``num_scheduled_tokens`` (request id -> tokens), in step order.
        self.steps: list[dict[str, int]] = []
        #: Each request's position before each of its rows: (step, start, tokens).
        self.rows: dict[str, list[tuple[int, int, int]]] = {}
        #: The step in which each request got its first token.
        self.first_token: dict[str, int] = {}
        self.finished: set[str] = set()

    def add(
        self, request_id: str, length: int, *, max_tokens: int = 1, fill: int = 0, priority: int = 0
    ) -> None:
        tokens = [(fill + i) % 200 + 1 for i in range(length)]
        self.scheduler.add_request(make_request(request_id, tokens, max_tokens, priority))

    def abort(self, request_id: str) -> None:
        self.scheduler.finish_requests(request_id, RequestStatus.FINISHED_ABORTED)
        self.finished.add(request_id)

    def step(self) -> Any:
        scheduler = self.scheduler
        start_ns = time.perf_counter_ns()
        output = scheduler.schedule()
        #: The wall time of the last ``schedule()``.
        self.last_schedule_ns = time.perf_counter_ns() - start_ns
        scheduled = dict(output.num_scheduled_tokens)
        index = len(self.steps)
        self.steps.append(scheduled)
        for request_id, tokens in scheduled.items():
            # (vLLM has moved each scheduled request on by its tokens already.)
            start = scheduler.requests[request_id].num_computed_tokens - tokens
            self.rows.setdefault(request_id, []).append((index, start, tokens))
        requests = scheduler.requests
        ids = list(scheduled)
        sampled = [
            [SAMPLED_TOKEN] if requests[i].num_computed_tokens >= requests[i].num_tokens else []
            for i in ids
        ]
        for request_id, tokens in zip(ids, sampled, strict=True):
            if tokens and request_id not in self.first_token:
                self.first_token[request_id] = index
        runner_output = ModelRunnerOutput(
            req_ids=ids,
            req_id_to_index={request_id: i for i, request_id in enumerate(ids)},
            sampled_token_ids=sampled,
        )
        engine_outputs = scheduler.update_from_output(output, runner_output)
        for outputs in engine_outputs.values():
            for out in outputs.outputs:
                if out.finish_reason is not None:
                    self.finished.add(out.request_id)
        return output

    def run(self, *, max_steps: int = 100_000) -> int:
        """Step until every request is finished; the steps taken (raises if it takes more
        than ``max_steps``: a request is stuck)."""
        taken = 0
        while self.scheduler.has_requests():
            if taken >= max_steps:
                raise AssertionError(f"requests still unfinished after {max_steps} steps")
            self.step()
            taken += 1
        return taken


def stock() -> type[Any]:
    """vLLM's own scheduler class."""
    scheduler: type[Any] = Scheduler
    return scheduler
