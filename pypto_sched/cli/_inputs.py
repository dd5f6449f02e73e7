"""From parsed options to the library's inputs: prompt lengths, cached prefixes, the planner
configuration, and the schedule; with the bounds that keep a huge workload a clear error
instead of memory exhaustion."""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np
import numpy.typing as npt

from ..core._config import PlannerConfig
from ..core._offline import fewest_chunks
from ..core._plan import plan_prefill
from ..core._schedule import Schedule
from ..core._workloads import SEED_PROMPT_LENGTH, synthetic_lengths
from ._errors import UsageError, flags_named
from ._lengths import parse_lengths, read_lengths, read_text
from ._options import CONFIG_FLAGS, WORKLOAD_FLAGS

__all__ = [
    "MAX_CHUNKS",
    "check_size",
    "chunk_alignment",
    "config",
    "engine_args",
    "lengths_flag",
    "num_computed",
    "plan",
    "workload",
    "workload_flags",
]

#: Most chunks a command plans: planning 10 million takes about 0.7 GB and 4 s, their JSON
#: several times that. (The command line's own limit, below the planner's ``MAX_CHUNKS``,
#: 2**28, because it also renders what it plans.)
MAX_CHUNKS = 10_000_000

_WORKLOAD_DEFAULTS = {"num_requests": 16, "seed": 0, "min_length": 16, "max_length": 4096}

Lengths = npt.NDArray[np.int64]


def lengths_flag(args: argparse.Namespace) -> str:
    """The flag that gave the prompt lengths, for errors about them."""
    if args.workload is not None:
        return "--workload"
    return "--lengths" if args.lengths_file is None else "--lengths-file"


def workload(args: argparse.Namespace) -> tuple[Lengths, str]:
    """The prompt lengths and a short description of where they came from."""
    _refuse_unused(args)
    if args.workload is None:
        if args.lengths_file is not None:
            text = read_text(args.lengths_file, name="--lengths-file")
            return parse_lengths(text, name="--lengths-file"), "--lengths-file"
        if not isinstance(args.lengths, str):  # CPython 3.11's argparse reads "--lengths=--" as []
            raise UsageError("--lengths: must be a list of prompt lengths, e.g. '3338x16': '--'")
        return read_lengths(args.lengths, name="--lengths"), "--lengths"
    params = {
        key: default if getattr(args, key) is None else getattr(args, key)
        for key, default in _WORKLOAD_DEFAULTS.items()
    }
    if args.min_length is not None and params["max_length"] < args.min_length:
        raise UsageError(
            f"--min-length: must be <= --max-length {params['max_length']}: {args.min_length}"
        )
    if args.min_length is None and params["max_length"] < params["min_length"]:
        raise UsageError(
            f"--max-length: must be >= the default --min-length {params['min_length']} "
            f"(or give --min-length): {params['max_length']}"
        )
    with flags_named(**WORKLOAD_FLAGS):
        lengths = synthetic_lengths(args.workload, **params)
    # The description is the options that draw the same lengths again.
    source = f"--workload {args.workload} --num-requests {params['num_requests']}"
    if args.workload != "seed":
        source += (
            f" --seed {params['seed']} --min-length {params['min_length']}"
            f" --max-length {params['max_length']}"
        )
    return lengths, source


def _refuse_unused(args: argparse.Namespace) -> None:
    """Refuse a workload option the workload would ignore: the lengths of a list are given,
    the seed workload's are all 3,338 tokens. ``--seed`` also seeds ``run``'s token ids."""
    unused = ["min_length", "max_length"]
    if not getattr(args, "seeds_token_ids", False):
        unused.append("seed")
    if args.workload is None:
        unused.append("num_requests")
        why = "applies only with --workload, not with a lengths list"
    elif args.workload == "seed":
        why = f"does not apply to --workload seed (every prompt {SEED_PROMPT_LENGTH:,} tokens)"
    else:
        return
    for option in WORKLOAD_FLAGS:
        if option in unused and getattr(args, option) is not None:
            raise UsageError(f"{WORKLOAD_FLAGS[option]} {why}")


def num_computed(args: argparse.Namespace) -> Lengths | None:
    if args.num_computed is None:
        return None
    return read_lengths(args.num_computed, name="--num-computed")


def chunk_alignment(args: argparse.Namespace) -> int | None:
    """``--chunk-alignment``, or its retired name ``--page-size``; both is a usage error."""
    if args.page_size is None:
        return args.chunk_alignment  # type: ignore[no-any-return]
    if args.chunk_alignment is not None:
        raise UsageError(
            "--page-size is the retired name of --chunk-alignment: give one (--page-size "
            f"{args.page_size}, --chunk-alignment {args.chunk_alignment})"
        )
    return args.page_size  # type: ignore[no-any-return]


def engine_args(args: argparse.Namespace) -> dict[str, Any]:
    """The configuration options as :meth:`PlannerConfig.from_engine_args` takes them."""
    return {
        "max_num_batched_tokens": args.max_num_batched_tokens,
        "long_prefill_token_threshold": args.long_prefill_token_threshold,
        "max_num_seqs": args.max_num_seqs,
        "chunk_alignment": chunk_alignment(args),
        "policy": args.policy,
        "max_num_partial_prefills": args.max_num_partial_prefills,
    }


def config(args: argparse.Namespace) -> PlannerConfig:
    with flags_named(**CONFIG_FLAGS):
        return PlannerConfig.from_engine_args(**engine_args(args))


def check_size(lengths: Lengths, computed: Lengths | None, planner: PlannerConfig) -> None:
    """Refuse, before planning, a workload whose schedule holds more than :data:`MAX_CHUNKS`
    chunks, by the planner's own count of the fewest a schedule can hold."""
    remaining = lengths.astype(np.int64)
    if computed is not None and computed.size == lengths.size:
        remaining = remaining - np.minimum(computed, lengths)
    tokens = int(remaining.sum())
    least = fewest_chunks(remaining, planner)
    if least > MAX_CHUNKS:
        raise UsageError(
            f"the workload's {tokens:,} tokens need at least {least:,} chunks of at most "
            f"{planner.chunk_cap:,} tokens; the command line plans at most {MAX_CHUNKS:,} "
            "(raise --max-num-batched-tokens or --long-prefill-token-threshold)"
        )


def plan(args: argparse.Namespace) -> tuple[Schedule, str]:
    """The schedule the options describe, and where its lengths came from."""
    lengths, source = workload(args)
    computed = num_computed(args)
    planner = config(args)
    check_size(lengths, computed, planner)
    with flags_named(**workload_flags(args)):
        return plan_prefill(lengths, planner, num_computed_tokens=computed), source


def workload_flags(args: argparse.Namespace) -> dict[str, str]:
    """The planner's parameters for the workload and the flags that gave them."""
    return {"prompt_lengths": lengths_flag(args), "num_computed_tokens": "--num-computed"}
