"""The seed's workload, scaled to run in seconds: plan, execute, verify against one-shot.

The seed's batch was 16 prompts of 3,338 tokens, chunked with a 256-token threshold. This
demo plans 16 prompts of a quarter of that length with the same threshold, runs the schedule
on the reference backend (a small random Qwen3-style model, or a checkpoint), and checks each
request's final logits and greedy token against a one-shot prefill of the whole batch.

BLAS runs on one thread unless ``--blas-threads`` says otherwise: chunked prefill makes many
small matrix products, and a multi-threaded BLAS on a busy machine spends them waiting for
its threads rather than computing::

    python -m pypto_sched_reference.demo
    python -m pypto_sched_reference.demo --policy packed --prompt-length 3338
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence

import attrs
import numpy as np
from threadpoolctl import threadpool_limits  # type: ignore[import-untyped]

from pypto_sched import POLICIES, PlannerConfig, Schedule, plan_prefill
from pypto_sched.checkpoints import ModelConfig
from pypto_sched.execute import ExecutionResult, execute_schedule

from ._backend import ReferenceBackend

#: The demo's model: small enough for seconds on two cores, large enough to mean something.
DEMO_MODEL = ModelConfig(
    vocab_size=1024,
    hidden_size=128,
    intermediate_size=384,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
)


def _arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m pypto_sched_reference.demo", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--prompts", type=int, default=16, help="number of prompts (16)")
    parser.add_argument(
        "--prompt-length", type=int, default=3338 // 4, help="tokens per prompt (834)"
    )
    parser.add_argument("--max-num-batched-tokens", type=int, default=8192)
    parser.add_argument("--threshold", type=int, default=256, help="long_prefill_token_threshold")
    parser.add_argument("--policy", choices=POLICIES, default="round_robin")
    parser.add_argument("--page-size", type=int, default=16, help="KV page size (16)")
    parser.add_argument("--dtype", choices=["float64", "float32"], default="float64")
    parser.add_argument("--checkpoint", help="a Hugging Face Qwen3 directory instead")
    parser.add_argument("--seed", type=int, default=0, help="weights and prompts seed (0)")
    parser.add_argument("--blas-threads", type=int, default=1, help="BLAS threads (1)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the demo; return 0 when chunked prefill matches one-shot prefill."""
    args = _arguments(argv)
    if args.checkpoint:
        backend = ReferenceBackend.from_checkpoint(args.checkpoint, dtype=args.dtype)
        source = f"checkpoint {args.checkpoint}"
    else:
        backend = ReferenceBackend.from_seed(DEMO_MODEL, seed=args.seed, dtype=args.dtype)
        source = f"random weights, seed {args.seed}"
    lengths = [args.prompt_length] * args.prompts
    rng = np.random.default_rng(args.seed)
    prompts = [rng.integers(0, backend.vocab_size, size=n) for n in lengths]
    config = PlannerConfig.from_engine_args(
        max_num_batched_tokens=args.max_num_batched_tokens,
        long_prefill_token_threshold=args.threshold,
        policy=args.policy,
    )
    schedule = plan_prefill(lengths, config)
    one_shot_schedule = plan_prefill(lengths, PlannerConfig(max_num_batched_tokens=sum(lengths)))

    c = backend.config
    print(
        f"Workload: {args.prompts} prompts x {args.prompt_length:,} tokens "
        f"(the seed's 16 x 3,338, scaled)"
    )
    print(
        f"Model:    Qwen3-style, {c.num_hidden_layers} layers, hidden {c.hidden_size}, "
        f"{c.num_attention_heads}/{c.num_key_value_heads} q/kv heads, vocab {c.vocab_size}, "
        f"{args.dtype} ({source})"
    )
    print()
    _print_summary(schedule)
    with threadpool_limits(limits=args.blas_threads, user_api="blas"):
        chunked, chunked_seconds = _timed(schedule, backend, prompts, args.page_size)
        one_shot, one_shot_seconds = _timed(one_shot_schedule, backend, prompts, args.page_size)
    print()
    print(f"Executed: chunked in {chunked_seconds:.2f} s ({schedule.num_dispatches} dispatches)")
    print(f"          one-shot in {one_shot_seconds:.2f} s (1 dispatch of {sum(lengths):,} tokens)")
    return _verify(chunked, one_shot, backend.tolerance)


def _print_summary(schedule: Schedule) -> None:
    config, tokens = schedule.config, schedule.tokens_per_dispatch
    chunks = np.bincount(schedule.requests, minlength=schedule.num_requests)
    print(
        f"Schedule: policy {config.policy}, max_num_batched_tokens "
        f"{config.max_num_batched_tokens:,}, long_prefill_token_threshold "
        f"{config.long_prefill_token_threshold}"
    )
    print(f"  dispatches           {schedule.num_dispatches} (lower bound {schedule.lower_bound})")
    print(
        f"  tokens per dispatch  max {int(tokens.max())}, mean {float(tokens.mean()):.1f}, "
        f"budget {config.effective_budget}"
    )
    print(f"  chunks per request   {int(chunks.min())} to {int(chunks.max())}")
    print(
        f"  requests finish at   dispatch {int(schedule.finish_dispatch.min())} to "
        f"{int(schedule.finish_dispatch.max())}"
    )
    if config.policy == "round_robin":
        packed = plan_prefill(schedule.prompt_lengths, attrs.evolve(config, policy="packed"))
        print(f"  (policy packed: {packed.num_dispatches} dispatches under the same limits)")


def _timed(
    schedule: Schedule, backend: ReferenceBackend, prompts: list[np.ndarray], page_size: int
) -> tuple[ExecutionResult, float]:
    start = time.perf_counter()
    result = execute_schedule(schedule, backend, prompts, return_greedy=True, page_size=page_size)
    return result, time.perf_counter() - start


def _verify(chunked: ExecutionResult, one_shot: ExecutionResult, tolerance: float) -> int:
    assert chunked.logits is not None
    assert one_shot.logits is not None
    difference = float(np.abs(chunked.logits - one_shot.logits).max())
    same_ids = int(np.sum(chunked.greedy_token_ids == one_shot.greedy_token_ids))
    count = chunked.logits.shape[0]
    logits_ok, ids_ok = difference <= tolerance, same_ids == count
    print()
    print("Verification against one-shot prefill:")
    print(
        f"  max |final logit difference|  {difference:.2e} (tolerance {tolerance:g})  "
        f"{'OK' if logits_ok else 'FAILED'}"
    )
    print(f"  equal greedy token ids        {same_ids}/{count}  {'OK' if ids_ok else 'FAILED'}")
    return 0 if logits_ok and ids_ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
