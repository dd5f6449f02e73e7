"""The seed's workload as a generation job, scaled to run in seconds, verified.

The seed's batch was 16 prompts of 3,338 tokens, chunked with a 256-token threshold. This
demo generates 16 new tokens for each of 16 prompts of a tenth of that length, chunked with
a 64-token threshold, over a KV pool of 160 pages of 16 tokens (less than half of what the
batch would hold at once). Every dispatch is planned by
:func:`pypto_sched.plan_generation_step` (decode rows first, then prefill chunks, admission
by free pages, preemption by recomputation) and run on the reference backend (a small
random Qwen3-style model, or a checkpoint), so decode steps of the prompts already
prefilled share dispatches with the chunks of the others, and requests are preempted when
the pool runs short. It then generates the same batch again with every prompt prefilled
whole in the first dispatch (one-shot prefill) and a pool large enough for everything, and
checks that both give the same tokens, token for token.

BLAS runs on one thread unless ``--blas-threads`` says otherwise: chunked prefill makes many
small matrix products, and a multi-threaded BLAS on a busy machine spends them waiting for
its threads rather than computing::

    python -m pypto_sched_reference.demo
    python -m pypto_sched_reference.demo --policy packed --max-num-batched-tokens 512
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence

import numpy as np
from threadpoolctl import threadpool_limits  # type: ignore[import-untyped]

from pypto_sched import POLICIES, GenerationResult, GenerationStats, PlannerConfig, generate
from pypto_sched.checkpoints import ModelConfig

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
        "--prompt-length", type=int, default=3338 // 10, help="tokens per prompt (333)"
    )
    parser.add_argument(
        "--max-new-tokens", type=int, default=16, help="tokens generated per prompt (16)"
    )
    parser.add_argument("--max-num-batched-tokens", type=int, default=8192)
    parser.add_argument("--threshold", type=int, default=64, help="long_prefill_token_threshold")
    parser.add_argument("--policy", choices=POLICIES, default="round_robin")
    parser.add_argument("--page-size", type=int, default=16, help="KV page size (16)")
    parser.add_argument(
        "--num-kv-pages", type=int, default=160, help="KV pages of the chunked run (160)"
    )
    parser.add_argument("--dtype", choices=["float64", "float32"], default="float64")
    parser.add_argument("--checkpoint", help="a Hugging Face Qwen3 directory instead")
    parser.add_argument("--seed", type=int, default=0, help="weights and prompts seed (0)")
    parser.add_argument("--blas-threads", type=int, default=1, help="BLAS threads (1)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the demo; return 0 when chunked generation gives one-shot prefill's tokens."""
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
    chunked_config = PlannerConfig.from_engine_args(
        max_num_batched_tokens=args.max_num_batched_tokens,
        long_prefill_token_threshold=args.threshold,
        policy=args.policy,
    )
    # Every prompt whole in the first dispatch; then one decode row per request per step.
    one_shot_config = PlannerConfig(max_num_batched_tokens=sum(lengths))

    c = backend.config
    print(
        f"Workload: {args.prompts} prompts x {args.prompt_length:,} tokens (the seed's "
        f"16 x 3,338, scaled), {args.max_new_tokens} new tokens each, greedy"
    )
    print(
        f"Model:    Qwen3-style, {c.num_hidden_layers} layers, hidden {c.hidden_size}, "
        f"{c.num_attention_heads}/{c.num_key_value_heads} q/kv heads, vocab {c.vocab_size}, "
        f"{args.dtype} ({source})"
    )
    print(
        f"Chunked:  policy {args.policy}, max_num_batched_tokens "
        f"{args.max_num_batched_tokens:,}, long_prefill_token_threshold {args.threshold}; "
        f"{args.num_kv_pages} KV pages of {args.page_size} tokens"
    )
    with threadpool_limits(limits=args.blas_threads, user_api="blas"):
        runs = {
            "chunked": _generate(backend, prompts, chunked_config, args, args.num_kv_pages),
            "one-shot prefill": _generate(backend, prompts, one_shot_config, args, None),
        }
    print()
    _print_table(runs)
    return _verify(runs["chunked"], runs["one-shot prefill"])


def _generate(
    backend: ReferenceBackend,
    prompts: list[np.ndarray],
    config: PlannerConfig,
    args: argparse.Namespace,
    num_pages: int | None,
) -> GenerationResult:
    return generate(
        backend,
        prompts,
        config=config,
        max_new_tokens=args.max_new_tokens,
        num_kv_pages=num_pages,
        kv_page_size=args.page_size,
    )


def _print_table(runs: dict[str, GenerationResult]) -> None:
    rows: dict[str, Callable[[GenerationStats], str]] = {
        "dispatches": lambda s: f"{s.num_dispatches:,}",
        "mixed prefill and decode": lambda s: f"{s.num_mixed_dispatches:,}",
        "preemptions": lambda s: f"{s.num_preemptions:,}",
        "time to first token": lambda s: (
            f"{s.mean_time_to_first_token:.1f} mean, {s.max_time_to_first_token} worst"
        ),
        "generated tokens": lambda s: f"{s.num_generated_tokens:,}",
        "wall time": lambda s: f"{s.wall_seconds:.2f} s ({s.tokens_per_second:,.0f} tokens/s)",
    }
    names = list(runs)
    print(f"{'':26}{names[0]:>24}{names[1]:>24}")
    for label, cell in rows.items():
        values = [cell(runs[name].stats) for name in names]
        print(f"{label:26}{values[0]:>24}{values[1]:>24}")


def _verify(chunked: GenerationResult, one_shot: GenerationResult) -> int:
    pairs = list(zip(chunked.sequences, one_shot.sequences, strict=True))
    equal = sum(
        np.array_equal(a.token_ids, b.token_ids) and a.finish_reason == b.finish_reason
        for a, b in pairs
    )
    tokens = sum(s.token_ids.size for s in chunked.sequences)
    ok = equal == len(pairs)
    print()
    print(
        f"Verification: chunked generation equals one-shot prefill generation token for "
        f"token: {equal}/{len(pairs)} requests ({tokens:,} tokens)  {'OK' if ok else 'FAILED'}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
