"""Chunked prefill on the npu backend's CPU path against transformers' one-shot forward.

    python benchmarks/bench_npu.py            # 8 prompts of 1,024 tokens
    python benchmarks/bench_npu.py --quick    # 2 prompts of 512 tokens (a smoke test)

Both sides run the same small random Qwen3 checkpoint (written by transformers into a
temporary directory) in float32 on the CPU, in one process, with the same torch threads:

* ours: ``plan_prefill`` under the seed's settings (``max_num_batched_tokens=8192``,
  ``long_prefill_token_threshold=256``, round robin), so 8 x 1,024 tokens become 32
  dispatches of 256 tokens, each reading its prompt's earlier chunks from the paged KV cache;
  logits for the final chunks only, greedy ids sampled on the device;
* transformers: ``Qwen3ForCausalLM`` on the whole ``[8, 1024]`` batch in one call, with
  ``logits_to_keep=1`` (the last position's logits, all a prefill needs) and, for reference,
  with every position's logits (its default).

The script checks that both produce the same final logits, then times each side several
times, alternating, and reports the best time of each (the least disturbed by other work on
the machine), the ratio ours / transformers of the best times, and the median of the ratios
of runs made back to back. The target is a ratio <= 1.0 against the ``logits_to_keep=1``
forward.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
import transformers

from pypto_sched import PlannerConfig, plan_prefill
from pypto_sched.backends import load_backend
from pypto_sched.execute import execute_schedule

#: A small Qwen3: 8 layers of width 512, grouped-query attention with head_dim 64.
MODEL: dict[str, Any] = {
    "vocab_size": 8192,
    "hidden_size": 512,
    "intermediate_size": 1536,
    "num_hidden_layers": 8,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 64,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": True,
}
CONFIG = PlannerConfig(max_num_batched_tokens=8192, long_prefill_token_threshold=256)
PAGE_SIZE = 128
TOLERANCE = 1e-3


def write_checkpoint(directory: Path) -> None:
    torch.manual_seed(0)
    model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**MODEL))
    model.save_pretrained(directory)


def seconds(run: Callable[[], object]) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 prompts of 512 tokens")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per side")
    parser.add_argument(
        "--threads", type=int, default=None, help="torch threads (default: torch's)"
    )
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    count, length = (2, 512) if args.quick else (8, 1024)

    rng = np.random.default_rng(0)
    prompts = rng.integers(0, MODEL["vocab_size"], size=(count, length), dtype=np.int64)
    schedule = plan_prefill([length] * count, CONFIG)

    with tempfile.TemporaryDirectory() as tmp:
        write_checkpoint(Path(tmp))
        # Found through the pypto_sched.backends entry point, as an engine would.
        ours = load_backend("npu", checkpoint=tmp, dtype="float32", device="cpu")
        # from_pretrained returns the model in eval mode.
        theirs = transformers.Qwen3ForCausalLM.from_pretrained(tmp, dtype=torch.float32)

    ids = torch.from_numpy(prompts)

    def run_ours() -> npt.NDArray[np.floating[Any]]:
        result = execute_schedule(
            schedule, ours, list(prompts), page_size=PAGE_SIZE, return_greedy=True
        )
        assert result.logits is not None
        return result.logits

    def run_theirs(keep: int) -> npt.NDArray[np.floating[Any]]:
        with torch.inference_mode():
            logits: torch.Tensor = theirs(input_ids=ids, logits_to_keep=keep).logits
        last: npt.NDArray[np.floating[Any]] = logits[:, -1].numpy()
        return last

    difference = float(np.abs(run_ours() - run_theirs(1)).max())
    assert difference <= TOLERANCE, f"final logits differ from transformers by {difference}"

    # Alternate the sides so that a burst of other work on the machine hits all of them.
    timings: dict[str, list[float]] = {"ours": [], "last": [], "all": []}
    for _ in range(args.repeats):
        timings["ours"].append(seconds(run_ours))
        timings["last"].append(seconds(lambda: run_theirs(1)))
        timings["all"].append(seconds(lambda: run_theirs(0)))
    best = {side: min(values) for side, values in timings.items()}
    paired = statistics.median(
        ours / last for ours, last in zip(timings["ours"], timings["last"], strict=True)
    )

    print(
        f"{count} prompts x {length} tokens, {MODEL['num_hidden_layers']} layers of width "
        f"{MODEL['hidden_size']}, float32, {torch.get_num_threads()} torch threads, "
        f"best of {args.repeats}"
    )
    print(
        f"ours: {schedule.num_dispatches} dispatches (threshold "
        f"{CONFIG.long_prefill_token_threshold}), max |logits - transformers| = "
        f"{difference:.2e}"
    )
    print(f"  ours, chunked prefill                  {best['ours'] * 1e3:9.1f} ms")
    print(f"  transformers, one shot, last logits    {best['last'] * 1e3:9.1f} ms")
    print(f"  transformers, one shot, every logit    {best['all'] * 1e3:9.1f} ms")
    print(f"ratio ours / transformers (last logits): {best['ours'] / best['last']:.2f}")
    print(f"ratio ours / transformers (every logit): {best['ours'] / best['all']:.2f}")
    print(f"median of the paired ratios (last logits): {paired:.2f}")


if __name__ == "__main__":
    main()
