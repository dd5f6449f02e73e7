"""The planner's entry points: a whole batch in, a :class:`~pypto_sched.Schedule` out.

The policies and every rule they follow are in ``_policies.py`` (its header is the theory of
operation), their fast engines in ``_offline.py``; this module checks the inputs and wraps the
rows in a schedule.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from ._config import PlannerConfig, check_config
from ._errors import InvalidInputError
from ._offline import plan_rows, rows_kept_to_the_bound
from ._policies import (
    check_num_computed_tokens,
)
from ._schedule import Schedule
from ._validate import MAX_TOKENS, as_count_array, read_only

__all__ = ["plan_one_shot", "plan_prefill"]


def plan_prefill(
    prompt_lengths: Sequence[int] | npt.NDArray[np.integer],
    config: PlannerConfig,
    *,
    num_computed_tokens: Sequence[int] | npt.NDArray[np.integer] | None = None,
) -> Schedule:
    """Plan the prefill of a batch of prompts.

    ``prompt_lengths`` holds one length ``>= 1`` per request, in request order.
    ``num_computed_tokens``, when given, holds per request the tokens already in the KV cache
    (``0 <= c < length``); that request's chunks start at ``c``. The inputs are not mutated;
    equal inputs give equal schedules.
    """
    check_config(config)
    lengths = as_count_array("prompt_lengths", prompt_lengths, min_value=1)
    computed = check_num_computed_tokens(num_computed_tokens, lengths)
    rows = plan_rows(lengths, computed, config)
    if config.policy == "packed":  # kept to the bound
        rows = rows_kept_to_the_bound(lengths, computed, config, rows)
    offsets, requests, starts, sizes, final = rows
    return Schedule(
        config=config,
        prompt_lengths=lengths,
        num_computed_tokens=computed,
        dispatch_offsets=read_only(offsets),
        requests=read_only(requests),
        starts=read_only(starts),
        lengths=read_only(sizes),
        is_final=read_only(final),
    )


def plan_one_shot(
    prompt_lengths: Sequence[int] | npt.NDArray[np.integer],
    *,
    num_computed_tokens: Sequence[int] | npt.NDArray[np.integer] | None = None,
) -> Schedule:
    """The unchunked schedule: every request's remaining tokens whole, in one dispatch.

    It is what chunked schedules are verified against (the same logits, by construction of
    the backend contract), and what fills a cache with prefixes.
    """
    lengths = as_count_array("prompt_lengths", prompt_lengths, min_value=1)
    computed = check_num_computed_tokens(num_computed_tokens, lengths)
    budget = max(int((lengths - computed).sum()), 1)
    if budget > MAX_TOKENS:
        raise InvalidInputError.about(
            "prompt_lengths",
            f"must leave at most {MAX_TOKENS:,} tokens to prefill for a one-shot dispatch, "
            f"which would hold every remaining token: {budget:,} (plan these prompts in "
            "chunks, or in smaller batches)",
        )
    return plan_prefill(
        lengths, PlannerConfig(max_num_batched_tokens=budget), num_computed_tokens=computed
    )
