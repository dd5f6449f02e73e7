"""Chunked against one-shot prefill on the reference backend: wall time and peak memory.

    python benchmarks/bench_reference.py            # 16 prompts of 1,024 tokens
    python benchmarks/bench_reference.py --quick    # 16 prompts of 512 tokens, one repeat

Both runs execute the same prompts on the same model in one invocation: one-shot (every
prompt whole in one dispatch) and chunked (``round_robin``, threshold 256: one request's
256-token chunk per dispatch). Each is measured in a fresh interpreter, so neither inherits
the other's allocations: wall time is the best of a few runs, and peak memory is the
``tracemalloc`` peak above what was allocated before the run (weights, prompts and the KV
cache, which both runs share in size), i.e. the activations.

BLAS runs on one thread by default (``--blas-threads``): a multi-threaded BLAS on a shared,
loaded machine measures thread scheduling more than the work. Timings are noisy, so the
script reports ratios against the targets and asserts no absolute time.

Targets: chunked takes at most 1.25x the one-shot time, and its peak activation memory is at
least 4x lower, because a dispatch never holds more than the budget's tokens.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Sequence
from typing import Any

import numpy as np

from pypto_sched import PlannerConfig, plan_prefill
from pypto_sched.execute import execute_schedule
from pypto_sched_reference import ReferenceBackend
from pypto_sched_reference.demo import DEMO_MODEL

# The demo's model, so the benchmark measures what `make demo` runs.
MODEL = DEMO_MODEL
THRESHOLD = 256
PAGE_SIZE = 16
MAX_TIME_RATIO = 1.25
MIN_MEMORY_RATIO = 4.0
MODES = ("one-shot", "chunked")
_THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def _arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="16 prompts of 512 tokens, 1 repeat")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--prompt-length", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per mode (best kept)")
    parser.add_argument("--dtype", choices=["float64", "float32"], default="float64")
    parser.add_argument("--blas-threads", type=int, default=1)
    parser.add_argument("--measure", choices=MODES, help=argparse.SUPPRESS)  # child process
    args = parser.parse_args(argv)
    if args.quick:
        args.prompts, args.prompt_length, args.repeats = 16, 512, 1
    return args


# -- one measurement, in a child process -------------------------------------------------------


def measure(
    mode: str, *, prompts: int, prompt_length: int, repeats: int, dtype: str
) -> dict[str, Any]:
    """Best wall time and peak activation bytes of one mode's run."""
    backend = ReferenceBackend.from_seed(MODEL, seed=0, dtype=dtype)
    lengths = [prompt_length] * prompts
    rng = np.random.default_rng(0)
    token_ids = [rng.integers(0, MODEL.vocab_size, size=n) for n in lengths]
    budget = THRESHOLD if mode == "chunked" else sum(lengths)
    schedule = plan_prefill(lengths, PlannerConfig(max_num_batched_tokens=budget))
    num_pages = sum(-(-n // PAGE_SIZE) for n in lengths)

    def run(*, trace: bool) -> float:
        cache = backend.new_cache(num_pages=num_pages, page_size=PAGE_SIZE)
        if trace:  # only allocations made from here on count: the activations
            tracemalloc.start()
        start = time.perf_counter()
        execute_schedule(schedule, backend, token_ids, page_size=PAGE_SIZE, cache=cache)
        return time.perf_counter() - start

    seconds = min(run(trace=False) for _ in range(repeats))
    run(trace=True)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return {"seconds": seconds, "peak_bytes": peak, "dispatches": schedule.num_dispatches}


# -- the side-by-side report --------------------------------------------------------------------


def _child(mode: str, args: argparse.Namespace) -> dict[str, Any]:
    env = dict(os.environ)
    env.update(dict.fromkeys(_THREAD_VARIABLES, str(args.blas_threads)))
    command = [
        sys.executable,
        __file__,
        "--measure",
        mode,
        f"--prompts={args.prompts}",
        f"--prompt-length={args.prompt_length}",
        f"--repeats={args.repeats}",
        f"--dtype={args.dtype}",
    ]
    done = subprocess.run(command, env=env, check=True, capture_output=True, text=True)
    return dict(json.loads(done.stdout))


def main(argv: Sequence[str] | None = None) -> int:
    args = _arguments(argv)
    if args.measure:
        figures = measure(
            args.measure,
            prompts=args.prompts,
            prompt_length=args.prompt_length,
            repeats=args.repeats,
            dtype=args.dtype,
        )
        print(json.dumps(figures))
        return 0
    results = {mode: _child(mode, args) for mode in MODES}
    one, chunked = results["one-shot"], results["chunked"]
    time_ratio = chunked["seconds"] / one["seconds"]
    memory_ratio = one["peak_bytes"] / chunked["peak_bytes"]
    print(
        f"reference backend: {args.prompts} prompts x {args.prompt_length:,} tokens, "
        f"{MODEL.num_hidden_layers} layers, hidden {MODEL.hidden_size}, {args.dtype}, "
        f"BLAS threads {args.blas_threads}, best of {args.repeats}"
    )
    print(f"{'':22}{'dispatches':>10}{'wall time':>12}{'peak activations':>19}")
    for label, mode in (("one-shot", "one-shot"), (f"chunked ({THRESHOLD})", "chunked")):
        figures = results[mode]
        print(
            f"{label:22}{figures['dispatches']:>10}{figures['seconds']:>10.2f} s"
            f"{figures['peak_bytes'] / 2**20:>15.1f} MiB"
        )
    time_ok, memory_ok = time_ratio <= MAX_TIME_RATIO, memory_ratio >= MIN_MEMORY_RATIO
    print(
        f"chunked / one-shot time: {time_ratio:.2f}x (target <= {MAX_TIME_RATIO}x) "
        f"{'OK' if time_ok else 'MISSED'}"
    )
    print(
        f"one-shot / chunked peak memory: {memory_ratio:.1f}x (target >= {MIN_MEMORY_RATIO:g}x) "
        f"{'OK' if memory_ok else 'MISSED'}"
    )
    return 0 if time_ok and memory_ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
