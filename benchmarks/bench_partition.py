"""How evenly three ways of splitting an offline batch across replicas load them.

    python benchmarks/bench_partition.py            # 2 to 16 replicas, 20 seeds
    python benchmarks/bench_partition.py --seeds 5
    python benchmarks/bench_partition.py --ray      # also: a generation job on 1 and 2 actors

The splits, side by side on the same long-tailed batches (lognormal prompt lengths, mean about
1,000 tokens, tail cut at 32k, as seen in offline batch jobs):

* ``contiguous``: equal-count contiguous slices (vLLM's and vllm-ascend's data-parallel
  examples);
* ``round_robin``: request ``i`` to replica ``i mod N`` (SGLang's data parallelism);
* ``longest_first``: :func:`pypto_sched.partition_requests`.

For each it prints the makespan over the lower bound, mean and worst over the seeds, measured
two ways: in tokens (``Partition.lower_bound``) and in dispatches, planning each replica's part
with ``packed`` (budget 8,192, threshold 2,048, 256 rows) against the dispatch lower bound of
the whole batch over ``N``. It also times ``partition_requests`` against a plain heap loop on
a million prompts into 16 parts (best of 3, CPU time; a ratio, not an absolute claim).

With ``--ray`` (needs ``pypto-sched[ray]``) it also times a generation job (long-tailed
prompts, greedy, the reference backend's tiny model) on 2 local Ray actors against 1, actors
started beforehand, and prints the ratio and whether the tokens are the same.

Targets (asserted here, never in the test suite): longest-first within 1% of the token bound
on every draw, and no worse than either count-based split on any draw.
"""

from __future__ import annotations

import argparse
import heapq
import math
import time
from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from pypto_sched import PlannerConfig, partition_requests, plan_prefill

Split = Callable[[npt.NDArray[np.int64], int], list[npt.NDArray[np.int64]]]
REQUESTS = 1024
REPLICAS = (2, 4, 8, 16)
CONFIG = PlannerConfig(
    max_num_batched_tokens=8192, long_prefill_token_threshold=2048, max_num_seqs=256,
    policy="packed",
)  # fmt: skip


def long_tailed(seed: int, count: int) -> npt.NDArray[np.int64]:
    rng = np.random.default_rng(seed)
    lengths = np.round(rng.lognormal(np.log(1000) - 0.5, 1.0, count)).astype(np.int64) + 1
    return np.minimum(lengths, 32768)


def contiguous(lengths: npt.NDArray[np.int64], n: int) -> list[npt.NDArray[np.int64]]:
    return list(np.array_split(np.arange(lengths.size), n))


def round_robin(lengths: npt.NDArray[np.int64], n: int) -> list[npt.NDArray[np.int64]]:
    return [np.arange(part, lengths.size, n) for part in range(n)]


def longest_first(lengths: npt.NDArray[np.int64], n: int) -> list[npt.NDArray[np.int64]]:
    return list(partition_requests(lengths, n).parts)


SPLITS: dict[str, Split] = {
    "contiguous": contiguous,
    "round_robin": round_robin,
    "longest_first": longest_first,
}


def ratios(lengths: npt.NDArray[np.int64], n: int, split: Split) -> tuple[float, float]:
    """Makespan over lower bound, in tokens and in planned dispatches."""
    parts = split(lengths, n)
    token_bound = max(math.ceil(int(lengths.sum()) / n), int(lengths.max()))
    tokens = max(int(lengths[part].sum()) for part in parts)
    whole = plan_prefill(lengths, CONFIG)
    dispatch_bound = max(math.ceil(whole.lower_bound / n), 1)
    dispatches = max(
        plan_prefill(lengths[part], CONFIG).num_dispatches for part in parts if part.size
    )
    return tokens / token_bound, dispatches / dispatch_bound


def heap_loop(weights: list[int], n: int) -> list[int]:
    heap = [(0, part) for part in range(n)]
    assignment = [0] * len(weights)
    for request in sorted(range(len(weights)), key=lambda r: (-weights[r], r)):
        load, part = heap[0]
        heapq.heapreplace(heap, (load + weights[request], part))
        assignment[request] = part
    return assignment


def check_same_assignment(lengths: npt.NDArray[np.int64], n: int) -> None:
    """Fail loudly unless ``partition_requests`` and the heap loop assign every request to
    the same part: timing them against each other would otherwise compare different work."""
    ours = partition_requests(lengths, n).assignment
    loop = np.asarray(heap_loop(lengths.tolist(), n))
    if not np.array_equal(ours, loop):
        first = int(np.flatnonzero(ours != loop)[0])
        raise SystemExit(
            f"partition_requests and the heap loop assign {lengths.size:,} prompts into {n} "
            f"parts differently: request {first} to part {int(ours[first])} against "
            f"{int(loop[first])}"
        )


def best_cpu_seconds(run: Callable[[], object], repeats: int = 3) -> float:
    best = math.inf
    for _ in range(repeats):
        start = time.process_time()
        run()
        best = min(best, time.process_time() - start)
    return best


def ray_generation(num_requests: int = 48, max_new_tokens: int = 48) -> None:
    """Wall time of one generation job on 1 and on 2 local Ray actors (best of 3 each)."""
    from pypto_sched.integrations.ray import RayReplicas, ray_session

    lengths = np.minimum(long_tailed(1, num_requests) // 8, 1024)
    rng = np.random.default_rng(1)
    prompts = [rng.integers(0, 64, size=int(n)) for n in lengths]  # the tiny model's vocab
    config = PlannerConfig(max_num_batched_tokens=512, policy="packed", max_num_seqs=64)
    seconds, tokens = {}, {}
    with ray_session(num_cpus=2, include_dashboard=False, logging_level="ERROR"):
        for n in (1, 2):
            with RayReplicas("reference", num_replicas=n) as pool:
                runs = [pool.generate(prompts, config=config, max_new_tokens=max_new_tokens)
                        for _ in range(3)]  # fmt: skip
            seconds[n] = min(run.wall_seconds for run in runs)
            tokens[n] = [s.token_ids.tolist() for s in runs[0].sequences]
            print(f"{n} actor(s): {seconds[n]:.2f} s for {num_requests} prompts "
                  f"({int(lengths.sum()):,} tokens) + {max_new_tokens} new tokens each, "
                  f"balance {runs[0].partition.imbalance:.3f}x")  # fmt: skip
    print(f"2 actors vs 1: {seconds[1] / seconds[2]:.2f}x faster; same tokens: "
          f"{tokens[1] == tokens[2]}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--ray", action="store_true", help="also time generation on Ray")
    args = parser.parse_args()
    failures = []
    print(f"{REQUESTS} long-tailed prompts, {args.seeds} seeds: makespan / lower bound")
    print(f"{'replicas':>8}  {'split':<14} {'tokens mean':>11} {'worst':>7}  "
          f"{'dispatches mean':>15} {'worst':>7}")  # fmt: skip
    for n in REPLICAS:
        results = {name: [ratios(long_tailed(s, REQUESTS), n, split) for s in range(args.seeds)]
                   for name, split in SPLITS.items()}  # fmt: skip
        for name, values in results.items():
            tokens, dispatches = np.array(values).T
            print(f"{n:>8}  {name:<14} {tokens.mean():>11.3f} {tokens.max():>7.3f}  "
                  f"{dispatches.mean():>15.3f} {dispatches.max():>7.3f}")  # fmt: skip
        ours = np.array(results["longest_first"])[:, 0]
        if ours.max() > 1.01:
            failures.append(f"{n} replicas: longest-first {ours.max():.4f}x the token bound")
        for name in ("contiguous", "round_robin"):
            theirs = np.array(results[name])[:, 0]
            if np.any(ours > theirs + 1e-12):
                failures.append(f"{n} replicas: longest-first worse than {name} on a draw")
    lengths = long_tailed(0, 1_000_000)
    check_same_assignment(lengths, 16)
    ours_s = best_cpu_seconds(lambda: partition_requests(lengths, 16))
    loop_s = best_cpu_seconds(lambda: heap_loop(lengths.tolist(), 16))
    print(f"1,000,000 prompts into 16 parts: partition_requests is {loop_s / ours_s:.1f}x "
          f"the plain heap loop (same assignment, checked)")  # fmt: skip
    if args.ray:
        ray_generation()
    if failures:
        raise SystemExit("targets missed:\n" + "\n".join(failures))
    print("targets met")


if __name__ == "__main__":
    main()
