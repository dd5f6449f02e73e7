"""The prepared GPU check: the ``torch`` backend on one CUDA device, measured in one run.

    python benchmarks/gpu_check.py OUT            # a machine with one NVIDIA GPU
    python benchmarks/gpu_check.py OUT --smoke    # toy sizes on the CPU (the test suite runs it)

From a bare checkout on a machine that has torch (with CUDA), transformers, numpy, attrs and
safetensors, nothing else is installed but the project itself, without its dependencies:

    python -m pip install --no-deps --no-build-isolation -e . -e backends/npu
    python benchmarks/gpu_check.py out/gpu

It writes ``OUT/gpu_check.json`` (every figure, rewritten after each section, so a run cut
short keeps what it measured) and ``OUT/gpu_check.md`` (the table), and prints the table.
A section that fails is recorded with its error and the run goes on; the exit status is 1
when a section failed or a target was missed (``--no-check``: 0 unless a section failed).

The sections, in order (``--only`` runs some of them; the checkpoint is always written):

* ``checkpoint``: a random Qwen3 of Qwen3-0.6B's shape (28 layers, hidden 1,024, 16 query
  and 8 KV heads, head_dim 128, vocab 151,936; ``--smoke``: 2 layers of 64) made by
  transformers on the device and saved in bfloat16.
* ``logits``: the final logits of 8 prompts (lognormal lengths up to 1,024 tokens) under
  chunked schedules of both policies (the seed's settings: budget 8,192, threshold 256;
  ``packed`` with 8 rows), in float32 on the device, against transformers' float32 forward of
  each prompt on the device, by :func:`pypto_sched.compare_results` at the backend's
  tolerance.
* ``greedy``: 8 prompts, 32 new tokens each, generated in bfloat16 on the device, against
  transformers' ``generate()`` in bfloat16 on the device, under the near-tie rule
  ``pypto-sched generate --verify`` applies (:func:`verify_greedy_generation`).
* ``throughput``: :func:`pypto_sched.generate` (``packed``, budget 8,192, 256 rows, pages of
  128) on 256 prompts (lognormal lengths, median about 500, 16 to 4,096 tokens), 128 new
  tokens each, greedy, against transformers' ``generate_batch`` (continuous batching over
  its paged cache, the same budget, rows and page size) on the same device and checkpoint,
  in bfloat16: output tokens per second of each, side by side after one warm-up run of each,
  and planning's share of our wall time. Targets: our throughput at least theirs; planning
  under 2% of the wall time.
* ``seed``: the seed's workload (16 prompts of 3,338 tokens) prefilled in bfloat16 under the
  seed's ``round_robin`` (224 dispatches), ``packed`` with 16 rows (14 dispatches) and one
  shot (one dispatch); each the best of 2 runs. Target: ``packed`` at least 3x faster than
  ``round_robin``.
* ``transformers_cb``: transformers' continuous batching with its ``"fifo"`` scheduler and
  with pypto_sched's (:func:`pypto_sched.integrations.transformers.register`) under
  ``packed`` and ``round_robin`` (threshold 512), 64 prompts and 32 new tokens each, in
  alternating order over 2 rounds: seconds and time to first token, each over ``"fifo"``'s
  in the same round. The tokens must equal ``"fifo"``'s.

Every ratio is measured side by side in the same run; the absolute figures and the GPU's
name are recorded beside them. ``--smoke`` shrinks every size so the whole check runs on the
CPU in well under a minute; its figures mean nothing, its point is that the script runs.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import inspect
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import numpy.typing as npt
import torch

SECTIONS = ("logits", "greedy", "throughput", "seed", "transformers_cb", "profile")
PAGE_SIZE = 128


@attrs.frozen(kw_only=True)
class Sizes:
    """Every size the check uses; :data:`FULL` on a GPU, :data:`SMOKE` on a CPU."""

    model: dict[str, Any]
    logit_prompts: int
    logit_max_length: int
    greedy_prompts: int
    greedy_new_tokens: int
    throughput_prompts: int
    throughput_median: int
    throughput_max_length: int
    throughput_new_tokens: int
    budget: int
    seed_prompts: int
    seed_length: int
    seed_threshold: int
    cb_prompts: int
    cb_new_tokens: int
    cb_threshold: int


FULL = Sizes(
    model={
        "vocab_size": 151_936,
        "hidden_size": 1024,
        "intermediate_size": 3072,
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "max_position_embeddings": 40_960,
        "rope_theta": 1_000_000.0,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": True,
    },
    logit_prompts=8,
    logit_max_length=1024,
    greedy_prompts=8,
    greedy_new_tokens=32,
    throughput_prompts=256,
    throughput_median=500,
    throughput_max_length=4096,
    throughput_new_tokens=128,
    budget=8192,
    seed_prompts=16,
    seed_length=3338,
    seed_threshold=256,
    cb_prompts=64,
    cb_new_tokens=32,
    cb_threshold=512,
)
SMOKE = Sizes(
    model={
        "vocab_size": 512,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "max_position_embeddings": 4096,
        "tie_word_embeddings": True,
    },
    logit_prompts=3,
    logit_max_length=96,
    greedy_prompts=2,
    greedy_new_tokens=4,
    throughput_prompts=6,
    throughput_median=40,
    throughput_max_length=128,
    throughput_new_tokens=4,
    budget=128,
    seed_prompts=3,
    seed_length=300,
    seed_threshold=32,
    cb_prompts=4,
    cb_new_tokens=3,
    cb_threshold=32,
)
#: Targets (a benchmark's, not a test's): the ``throughput`` and ``seed`` sections'.
MIN_THROUGHPUT_RATIO = 1.0
MAX_PLANNING_SHARE = 0.02
MIN_SEED_SPEEDUP = 3.0


def lognormal_lengths(
    count: int, *, median: int, max_length: int, seed: int
) -> npt.NDArray[np.int64]:
    """``count`` prompt lengths, lognormal around ``median`` (sigma 0.8), in 16..max_length."""
    rng = np.random.default_rng(seed)
    drawn = rng.lognormal(mean=math.log(median), sigma=0.8, size=count)
    return np.clip(np.rint(drawn), min(16, max_length), max_length).astype(np.int64)


def random_prompts(
    lengths: Sequence[int] | npt.NDArray[np.int64], vocab_size: int, seed: int
) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab_size, size=int(n)).tolist() for n in lengths]


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(run: Callable[[], Any], device: torch.device) -> tuple[float, Any]:
    """Wall seconds of ``run()`` (the device's queue drained at both ends), and its value."""
    synchronize(device)
    start = time.perf_counter()
    value = run()
    synchronize(device)
    return time.perf_counter() - start, value


# -- the sections ---------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class Check:
    """What every section reads: the sizes, the device and the checkpoint."""

    sizes: Sizes
    device: torch.device
    checkpoint: Path

    def backend(self, dtype: str) -> Any:
        from pypto_sched.backends import load_backend

        return load_backend(
            "torch", checkpoint=self.checkpoint, dtype=dtype, device=str(self.device)
        )

    def transformers_model(self, dtype: torch.dtype, **options: Any) -> Any:
        from transformers import AutoModelForCausalLM

        model: Any = AutoModelForCausalLM.from_pretrained(
            str(self.checkpoint), dtype=dtype, **options
        )
        return model.to(self.device).eval()


def write_checkpoint(sizes: Sizes, device: torch.device, directory: Path) -> dict[str, Any]:
    torch.manual_seed(0)
    seconds, _ = timed(lambda: _save_random_qwen3(sizes, device, directory), device)
    size = sum(p.stat().st_size for p in directory.glob("*.safetensors"))
    return {"model": sizes.model, "stored_bytes": size, "seconds": round(seconds, 2)}


def _save_random_qwen3(sizes: Sizes, device: torch.device, directory: Path) -> None:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    with device:  # the parameters are made (and initialised) on the device
        model: Any = Qwen3ForCausalLM(Qwen3Config(**sizes.model))
    model.to(torch.bfloat16).save_pretrained(directory)
    del model


def check_logits(check: Check) -> dict[str, Any]:
    from pypto_sched import PlannerConfig, compare_results, execute_schedule, plan_prefill

    sizes = check.sizes
    lengths = lognormal_lengths(
        sizes.logit_prompts,
        median=sizes.logit_max_length // 2,
        max_length=sizes.logit_max_length,
        seed=1,
    )
    prompts = random_prompts(lengths, sizes.model["vocab_size"], seed=1)
    seed = PlannerConfig(
        max_num_batched_tokens=sizes.budget, long_prefill_token_threshold=sizes.seed_threshold
    )
    configs = {
        "round_robin": seed,
        "packed": attrs.evolve(seed, policy="packed", max_num_seqs=sizes.logit_prompts),
    }
    theirs = check.transformers_model(torch.float32)
    with torch.inference_mode():
        expected = np.stack(
            [
                theirs(
                    input_ids=torch.tensor([p], device=check.device),
                    logits_to_keep=1,
                )
                .logits[0, -1]
                .float()
                .cpu()
                .numpy()
                for p in prompts
            ]
        )
    del theirs
    backend = check.backend("float32")
    out: dict[str, Any] = {
        "prompt_lengths": lengths.tolist(),
        "tolerance": backend.tolerance,
        "relative_tolerance": backend.relative_tolerance,
    }
    for policy, config in configs.items():
        schedule = plan_prefill(lengths, config)
        result = execute_schedule(
            schedule, backend, prompts, page_size=PAGE_SIZE, return_greedy=True
        )
        verification = compare_results(
            result,
            expected,
            tolerance=backend.tolerance,
            relative_tolerance=backend.relative_tolerance,
            reference="transformers",
            prompt_lengths=lengths,
        )
        out[policy] = {
            "dispatches": schedule.num_dispatches,
            "max_abs_logit_diff": verification.max_abs_logit_diff,
            "passed": verification.passed,
            "verdict": verification.describe(),
        }
    out["passed"] = all(out[policy]["passed"] for policy in configs)
    return out


def check_greedy(check: Check) -> dict[str, Any]:
    from pypto_sched import PlannerConfig, generate
    from pypto_sched.integrations.hf_verify import verify_greedy_generation

    sizes = check.sizes
    lengths = lognormal_lengths(
        sizes.greedy_prompts, median=sizes.logit_max_length // 4, max_length=512, seed=2
    )
    prompts = random_prompts(lengths, sizes.model["vocab_size"], seed=2)
    backend = check.backend("bfloat16")
    config = PlannerConfig(
        max_num_batched_tokens=sizes.budget,
        long_prefill_token_threshold=sizes.seed_threshold,
        policy="packed",
        max_num_seqs=sizes.greedy_prompts,
    )
    result = generate(
        backend,
        prompts,
        config=config,
        max_new_tokens=sizes.greedy_new_tokens,
        kv_page_size=PAGE_SIZE,
    )
    generated = [s.token_ids.tolist() for s in result.sequences]
    verification = verify_greedy_generation(
        check.checkpoint,
        prompts,
        generated,
        max_new_tokens=sizes.greedy_new_tokens,
        dtype="bfloat16",
        tolerance=backend.tolerance,
        relative_tolerance=backend.relative_tolerance,
        device=str(check.device),
    )
    return {
        "prompt_lengths": lengths.tolist(),
        "requests": len(prompts),
        "tokens": verification.num_tokens,
        "requests_differing": verification.num_differing,
        "near_ties": len(verification.near_ties),
        "passed": verification.passed,
        "verdict": verification.describe(),
    }


def _generate_ours(
    backend: Any, prompts: list[list[int]], sizes: Sizes, new: int
) -> dict[str, Any]:
    from pypto_sched import PlannerConfig, generate

    config = PlannerConfig(
        max_num_batched_tokens=sizes.budget,
        max_num_seqs=sizes.throughput_prompts,
        policy="packed",
    )
    seconds, result = timed(
        lambda: generate(
            backend, prompts, config=config, max_new_tokens=new, kv_page_size=PAGE_SIZE
        ),
        backend.device,
    )
    stats = result.stats
    return {
        "seconds": seconds,
        "output_tokens": stats.num_generated_tokens,
        "dispatches": stats.num_dispatches,
        "planning_seconds": stats.planning_seconds,
        "tokens": [s.token_ids.tolist() for s in result.sequences],
    }


def _generate_batch(
    model: Any, prompts: list[list[int]], sizes: Sizes, new: int, **options: Any
) -> dict[str, Any]:
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    blocks = sum(-(-(len(p) + new) // PAGE_SIZE) for p in prompts)
    # transformers 5.24 (the project's pin) calls a cache page a page, earlier 5.x a block
    fields = inspect.signature(ContinuousBatchingConfig).parameters
    page: dict[str, Any] = {"page_size" if "page_size" in fields else "block_size": PAGE_SIZE}
    cb = ContinuousBatchingConfig(
        **page,
        num_blocks=blocks,
        max_batch_tokens=sizes.budget,
        max_requests_per_batch=sizes.throughput_prompts,
        allow_block_sharing=False,
        **options,
    )
    generation = GenerationConfig(  # type: ignore[no-untyped-call]
        max_new_tokens=new, do_sample=False, eos_token_id=-1, pad_token_id=0
    )
    device = torch.device(model.device)
    synchronize(device)
    start = time.perf_counter()
    outputs = model.generate_batch(
        prompts,
        generation_config=generation,
        continuous_batching_config=cb,
        record_timestamps=True,
        progress_bar=False,
        warmup=False,  # warmed up by the untimed run before
    )
    synchronize(device)
    seconds = time.perf_counter() - start
    ordered = sorted(outputs.values(), key=lambda out: int(out.request_id.rsplit("_", 1)[1]))
    failed = [out.request_id for out in ordered if out.error is not None]
    if failed:
        raise RuntimeError(f"generate_batch: requests {failed[:5]} failed")
    return {
        "seconds": seconds,
        "output_tokens": sum(len(out.generated_tokens) for out in ordered),
        "ttft": [out.timestamps[0] - start for out in ordered] if ordered[0].timestamps else [],
        "tokens": [list(out.generated_tokens) for out in ordered],
    }


def check_throughput(check: Check) -> dict[str, Any]:
    sizes = check.sizes
    lengths = lognormal_lengths(
        sizes.throughput_prompts,
        median=sizes.throughput_median,
        max_length=sizes.throughput_max_length,
        seed=3,
    )
    prompts = random_prompts(lengths, sizes.model["vocab_size"], seed=3)
    warm = prompts[: max(2, len(prompts) // 16)]
    backend = check.backend("bfloat16")
    _generate_ours(backend, warm, sizes, 4)
    ours = _generate_ours(backend, prompts, sizes, sizes.throughput_new_tokens)
    del backend
    _empty_cache(check.device)
    model = check.transformers_model(torch.bfloat16)
    _generate_batch(model, warm, sizes, 4)
    theirs = _generate_batch(model, prompts, sizes, sizes.throughput_new_tokens)
    del model
    _empty_cache(check.device)
    ours_rate = ours["output_tokens"] / ours["seconds"]
    theirs_rate = theirs["output_tokens"] / theirs["seconds"]
    same = sum(a == b for a, b in zip(ours["tokens"], theirs["tokens"], strict=True))
    planning_share = ours["planning_seconds"] / ours["seconds"]
    return {
        "prompts": len(prompts),
        "prompt_tokens": int(lengths.sum()),
        "prompt_length_median": float(np.median(lengths)),
        "prompt_length_max": int(lengths.max()),
        "new_tokens": sizes.throughput_new_tokens,
        "ours": {k: v for k, v in ours.items() if k != "tokens"} | {"tokens_per_s": ours_rate},
        "transformers_generate_batch": {
            "seconds": theirs["seconds"],
            "output_tokens": theirs["output_tokens"],
            "tokens_per_s": theirs_rate,
        },
        "throughput_ratio": ours_rate / theirs_rate,
        "planning_share": planning_share,
        "requests_with_equal_tokens": same,
        "targets_met": ours_rate / theirs_rate >= MIN_THROUGHPUT_RATIO
        and planning_share < MAX_PLANNING_SHARE,
    }


def check_seed(check: Check) -> dict[str, Any]:
    from pypto_sched import PlannerConfig, execute_schedule, plan_one_shot, plan_prefill

    sizes = check.sizes
    lengths = [sizes.seed_length] * sizes.seed_prompts
    prompts = random_prompts(lengths, sizes.model["vocab_size"], seed=4)
    seed = PlannerConfig(
        max_num_batched_tokens=sizes.budget, long_prefill_token_threshold=sizes.seed_threshold
    )
    schedules = {
        "round_robin": plan_prefill(lengths, seed),
        "packed": plan_prefill(
            lengths, attrs.evolve(seed, policy="packed", max_num_seqs=sizes.seed_prompts)
        ),
        "one_shot": plan_one_shot(lengths),
    }
    backend = check.backend("bfloat16")
    out: dict[str, Any] = {"prompts": sizes.seed_prompts, "length": sizes.seed_length}
    logits: dict[str, npt.NDArray[Any]] = {}
    for name, schedule in schedules.items():
        runs = []
        for _ in range(2):
            run = functools.partial(
                execute_schedule,
                schedule,
                backend,
                prompts,
                page_size=PAGE_SIZE,
                return_greedy=True,
            )
            seconds, result = timed(run, check.device)
            runs.append(seconds)
        logits[name] = result.logits
        out[name] = {"dispatches": schedule.num_dispatches, "seconds": min(runs)}
    for name in ("round_robin", "packed"):
        out[name]["max_abs_logit_diff_vs_one_shot"] = float(
            np.abs(logits[name] - logits["one_shot"]).max()
        )
    out["packed_speedup_over_round_robin"] = (
        out["round_robin"]["seconds"] / out["packed"]["seconds"]
    )
    out["one_shot_over_packed"] = out["packed"]["seconds"] / out["one_shot"]["seconds"]
    out["targets_met"] = out["packed_speedup_over_round_robin"] >= MIN_SEED_SPEEDUP
    return out


def check_transformers_cb(check: Check) -> dict[str, Any]:
    from pypto_sched import PlannerConfig
    from pypto_sched.integrations.transformers import register

    sizes = check.sizes
    lengths = lognormal_lengths(
        sizes.cb_prompts,
        median=sizes.throughput_median,
        max_length=sizes.throughput_max_length // 2,
        seed=5,
    )
    prompts = random_prompts(lengths, sizes.model["vocab_size"], seed=5)
    budget = sizes.budget // 4
    register(PlannerConfig(max_num_batched_tokens=budget, policy="packed"), name="gpu_packed")
    register(
        PlannerConfig(
            max_num_batched_tokens=budget, long_prefill_token_threshold=sizes.cb_threshold
        ),
        name="gpu_round_robin",
    )
    sides = {"fifo": "fifo", "packed": "gpu_packed", "round_robin": "gpu_round_robin"}
    model = check.transformers_model(torch.bfloat16)
    cb_sizes = attrs.evolve(sizes, budget=budget, throughput_prompts=sizes.cb_prompts)
    _generate_batch(model, prompts[:2], cb_sizes, 2)  # warm-up
    runs: dict[str, list[dict[str, Any]]] = {side: [] for side in sides}
    order = list(sides)
    for round_ in range(2):
        for side in order if round_ % 2 == 0 else order[::-1]:
            runs[side].append(
                _generate_batch(
                    model, prompts, cb_sizes, sizes.cb_new_tokens, scheduler_type=sides[side]
                )
            )
    out: dict[str, Any] = {"prompts": len(prompts), "prompt_tokens": int(lengths.sum())}
    fifo_tokens = runs["fifo"][0]["tokens"]
    for side, side_runs in runs.items():
        seconds = statistics.median(r["seconds"] for r in side_runs)
        ttfts = [statistics.mean(r["ttft"]) for r in side_runs if r["ttft"]]
        out[side] = {
            "seconds": seconds,
            "mean_ttft": statistics.median(ttfts) if ttfts else None,
            # In bfloat16 a request batched with other rows rounds differently, so a
            # near-tie can break the other way: equal tokens are counted, not required
            # (the float32 CPU benchmark, bench_transformers_cb.py, requires them).
            "requests_with_fifo_tokens": min(
                sum(a == b for a, b in zip(r["tokens"], fifo_tokens, strict=True))
                for r in side_runs
            ),
        }
    for side in ("packed", "round_robin"):
        out[side]["seconds_over_fifo"] = out[side]["seconds"] / out["fifo"]["seconds"]
        if out[side]["mean_ttft"] is not None and out["fifo"]["mean_ttft"]:
            out[side]["mean_ttft_over_fifo"] = out[side]["mean_ttft"] / out["fifo"]["mean_ttft"]
    return out


def check_profile(check: Check) -> dict[str, Any]:
    """Where our time goes: :func:`pypto_sched.generate` on a quarter of the throughput
    prompts, 16 new tokens each, under torch's profiler (host and device); the ops taking
    the most device time and the most host time."""
    from torch.profiler import ProfilerActivity, profile

    sizes = check.sizes
    lengths = lognormal_lengths(
        sizes.throughput_prompts,
        median=sizes.throughput_median,
        max_length=sizes.throughput_max_length,
        seed=3,
    )
    prompts = random_prompts(lengths, sizes.model["vocab_size"], seed=3)[
        : max(2, sizes.throughput_prompts // 4)
    ]
    backend = check.backend("bfloat16")
    _generate_ours(backend, prompts[:2], sizes, 2)
    activities = [ProfilerActivity.CPU]
    if check.device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    with profile(activities=activities) as profiler:
        ours = _generate_ours(backend, prompts, sizes, 16)
    averages = profiler.key_averages()
    device_sort = "self_device_time_total" if check.device.type == "cuda" else "self_cpu_time_total"
    device_us = sum(getattr(e, "self_device_time_total", 0.0) for e in averages)
    return {
        "prompts": len(prompts),
        "new_tokens": 16,
        "seconds": ours["seconds"],
        "dispatches": ours["dispatches"],
        "device_busy_share": device_us / 1e6 / ours["seconds"],
        "by_device_time": averages.table(sort_by=device_sort, row_limit=20),
        "by_host_time": averages.table(sort_by="self_cpu_time_total", row_limit=20),
    }


def _empty_cache(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()


CHECKS: dict[str, Callable[[Check], dict[str, Any]]] = {
    "logits": check_logits,
    "greedy": check_greedy,
    "throughput": check_throughput,
    "seed": check_seed,
    "transformers_cb": check_transformers_cb,
    "profile": check_profile,
}


# -- the report -----------------------------------------------------------------------------


def table(report: dict[str, Any]) -> str:
    """The Markdown table of ``report``'s headline figures."""
    env = report["environment"]
    lines = [
        f"GPU check on {env['device_name']} ({env['date']}; torch {env['torch']}, "
        f"transformers {env['transformers']}{', smoke sizes' if report['smoke'] else ''})",
        "",
        "| section | figure | value | target |",
        "| --- | --- | --- | --- |",
    ]

    def row(section: str, figure: str, value: str, target: str = "") -> None:
        lines.append(f"| {section} | {figure} | {value} | {target} |")

    sections = report["sections"]
    for name in ("checkpoint", *SECTIONS):
        data = sections.get(name)
        if data is None:
            continue
        if "error" in data:
            row(name, "error", data["error"].splitlines()[-1][:120])
            continue
        if name == "checkpoint":
            row(
                name,
                "stored (bf16)",
                f"{data['stored_bytes'] / 2**20:,.0f} MiB in {data['seconds']} s",
            )
        elif name == "logits":
            for policy in ("round_robin", "packed"):
                row(
                    name,
                    f"{policy}: max abs diff vs transformers fp32 "
                    f"({data[policy]['dispatches']} dispatches)",
                    f"{data[policy]['max_abs_logit_diff']:.2e}",
                    f"<= {data['tolerance']:g}: {'PASS' if data[policy]['passed'] else 'FAIL'}",
                )
        elif name == "greedy":
            row(
                name,
                "bf16 tokens vs generate()",
                f"{data['requests'] - data['requests_differing'] - data['near_ties']}/"
                f"{data['requests']} equal, {data['near_ties']} near-ties",
                "PASS" if data["passed"] else "FAIL",
            )
        elif name == "throughput":
            ours, theirs = data["ours"], data["transformers_generate_batch"]
            row(
                name,
                "ours, output tok/s",
                f"{ours['tokens_per_s']:,.0f} "
                f"({ours['seconds']:.2f} s, {ours['dispatches']} dispatches)",
            )
            row(
                name,
                "generate_batch, output tok/s",
                f"{theirs['tokens_per_s']:,.0f} ({theirs['seconds']:.2f} s)",
            )
            row(
                name,
                "ours / generate_batch",
                f"{data['throughput_ratio']:.2f}x",
                f">= {MIN_THROUGHPUT_RATIO}",
            )
            row(
                name,
                "planning share of wall",
                f"{data['planning_share']:.2%}",
                f"< {MAX_PLANNING_SHARE:.0%}",
            )
        elif name == "seed":
            for policy in ("round_robin", "packed", "one_shot"):
                row(
                    name,
                    f"{policy} prefill ({data[policy]['dispatches']} dispatches)",
                    f"{data[policy]['seconds'] * 1e3:,.1f} ms",
                )
            row(
                name,
                "round_robin / packed",
                f"{data['packed_speedup_over_round_robin']:.2f}x",
                f">= {MIN_SEED_SPEEDUP}",
            )
        elif name == "profile":
            row(
                name,
                f"device busy, {data['dispatches']} dispatches",
                f"{data['device_busy_share']:.0%} of {data['seconds']:.2f} s",
            )
        elif name == "transformers_cb":
            row(name, "fifo", f"{data['fifo']['seconds']:.2f} s")
            for side in ("packed", "round_robin"):
                ttft = data[side].get("mean_ttft_over_fifo")
                row(
                    name,
                    f"{side} / fifo",
                    f"seconds {data[side]['seconds_over_fifo']:.2f}x"
                    + (f", mean TTFT {ttft:.2f}x" if ttft is not None else "")
                    + f"; {data[side]['requests_with_fifo_tokens']}/{data['prompts']} "
                    "requests with fifo's tokens",
                )
    return "\n".join(lines) + "\n"


def failures(report: dict[str, Any], *, check_targets: bool) -> list[str]:
    found = []
    for name, data in report["sections"].items():
        if "error" in data:
            found.append(f"{name}: {data['error'].splitlines()[-1]}")
        elif data.get("passed") is False:
            found.append(f"{name}: failed")
        elif check_targets and data.get("targets_met") is False:
            found.append(f"{name}: target missed")
    return found


def environment(device: torch.device) -> dict[str, Any]:
    import transformers

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor()
    return {
        "date": time.strftime("%Y-%m-%d"),
        "device": str(device),
        "device_name": name or "CPU",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
    }


@contextlib.contextmanager
def section(report: dict[str, Any], name: str, write: Callable[[], None]) -> Iterator[None]:
    start = time.perf_counter()
    print(f"== {name}", file=sys.stderr, flush=True)
    try:
        yield
    except Exception:  # recorded, and the next section runs
        report["sections"][name] = {"error": traceback.format_exc()}
        print(traceback.format_exc(), file=sys.stderr, flush=True)
    report.setdefault("section_seconds", {})[name] = round(time.perf_counter() - start, 2)
    write()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="the folder to write gpu_check.json and .md to")
    parser.add_argument("--smoke", action="store_true", help="toy sizes, on the CPU by default")
    parser.add_argument("--device", help="default: cuda (cpu with --smoke)")
    parser.add_argument("--only", nargs="+", choices=SECTIONS, help="run only these sections")
    parser.add_argument("--no-check", action="store_true", help="report targets, exit 0")
    args = parser.parse_args(argv)
    device = torch.device(args.device or ("cpu" if args.smoke else "cuda"))
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("torch sees no CUDA device: run with --smoke (or --device cpu)")
    if device.type == "cuda":
        # float32 means float32: no TF32 in the matmuls the logits are compared on.
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    sizes = SMOKE if args.smoke else FULL
    args.out.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {
        "smoke": args.smoke,
        "environment": environment(device),
        "sizes": attrs.asdict(sizes),
        "sections": {},
    }

    def write() -> None:
        (args.out / "gpu_check.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
        (args.out / "gpu_check.md").write_text(table(report))

    with tempfile.TemporaryDirectory(prefix="gpu_check_") as scratch:
        checkpoint = Path(scratch) / "qwen3"
        with section(report, "checkpoint", write):
            report["sections"]["checkpoint"] = write_checkpoint(sizes, device, checkpoint)
        check = Check(sizes=sizes, device=device, checkpoint=checkpoint)
        for name in args.only or SECTIONS:
            if "error" in report["sections"].get("checkpoint", {}):
                break
            with section(report, name, write):
                report["sections"][name] = CHECKS[name](check)
            _empty_cache(device)
    print(table(report))
    found = failures(report, check_targets=not args.no_check)
    for failure in found:
        print(f"FAILED {failure}", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
