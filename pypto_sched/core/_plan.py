"""The planner's entry points: a whole batch in, a :class:`~pypto_sched.Schedule` out.

The policies and every rule they follow are in ``_policies.py`` (its header is the theory of
operation); this module checks the inputs and wraps the rows in a schedule.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from ._config import PlannerConfig
from ._errors import InvalidInputError
from ._online import PrefillState, RequestRecord, plan_step, restore_prefill_state
from ._policies import (
    IntArray,
    Rows,
    bound_rule_applies,
    check_num_computed_tokens,
    plan_rows,
    surely_keeps_to_the_bound,
)
from ._schedule import Schedule, lower_bound
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
    if not isinstance(config, PlannerConfig):
        raise InvalidInputError(f"'config' must be a PlannerConfig: {type(config).__name__}")
    lengths = as_count_array("prompt_lengths", prompt_lengths, min_value=1)
    computed = check_num_computed_tokens(num_computed_tokens, lengths)
    rows = plan_rows(lengths, computed, config)
    if config.policy == "packed":  # kept to the bound
        rows = _rows_kept_to_the_bound(lengths, computed, config, rows)
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
        raise InvalidInputError(
            f"'prompt_lengths' must leave at most {MAX_TOKENS:,} tokens to prefill for a "
            f"one-shot dispatch, which would hold every remaining token: {budget:,} (plan "
            f"these prompts in chunks, or in smaller batches)"
        )
    return plan_prefill(
        lengths, PlannerConfig(max_num_batched_tokens=budget), num_computed_tokens=computed
    )


def _rows_kept_to_the_bound(
    lengths: IntArray, computed: IntArray, config: PlannerConfig, greedy: Rows
) -> Rows:
    """``packed``'s rows kept to the bound (``_policies.py``, *Keeping to the bound*), from
    its ``greedy`` rows: they stand up to the first dispatch to which the rule applies
    (:func:`bound_rule_applies`) and that does not surely keep to the bound
    (:func:`surely_keeps_to_the_bound`), and the rest is planned step by step, as
    :func:`plan_step` plans it, from the state before that dispatch."""
    offsets, requests, starts, sizes, final = greedy
    remaining = lengths - computed
    num = offsets.size - 1
    if num <= lower_bound(remaining, config):
        return greedy
    # Before each dispatch: the requests unfinished, the tokens left, and the most any
    # unfinished request had.
    finish_at = np.searchsorted(offsets, np.flatnonzero(final), side="right") - 1  # ascending
    finished = np.bincount(finish_at, minlength=num)
    count = lengths.size - np.concatenate(([0], np.cumsum(finished)[:-1]))
    applies = bound_rule_applies(config, count)
    if not applies.any():
        return greedy
    tokens = np.add.reduceat(sizes.astype(np.int64), offsets[:-1])
    left = int(remaining.sum()) - np.concatenate(([0], np.cumsum(tokens)[:-1]))
    finishing = np.zeros(num, dtype=np.int64)
    groups = np.flatnonzero(np.diff(finish_at, prepend=-1))
    finishing[finish_at[groups]] = np.maximum.reduceat(remaining[requests[final]], groups)
    longest = np.maximum.accumulate(finishing[::-1])[::-1]
    sure = ~applies | surely_keeps_to_the_bound(tokens, left, longest, count, config)
    if sure.all():
        return greedy
    first = int(np.argmin(sure))
    done = int(offsets[first])
    ran = np.bincount(requests[:done], weights=sizes[:done], minlength=lengths.size)
    position = computed + ran.astype(np.int64)  # float sums of ints below 2**53: exact
    started: list[RequestRecord] = []
    queued: list[RequestRecord] = []
    for r in np.flatnonzero(position < lengths).tolist():
        at = int(position[r])
        record = RequestRecord(r, int(lengths[r]), at, at > computed[r])
        (started if record.started else queued).append(record)
    state: PrefillState[int] = restore_prefill_state(
        tuple(started), tuple(queued), int(left[first]), "packed"
    )
    rows: list[tuple[int, int, int, bool]] = []
    ends = list(offsets[: first + 1].tolist())
    while len(state):
        plan = plan_step(state, config)
        rows.extend((r, c.start, c.length, c.is_final) for r, c in plan.rows.items())
        ends.append(done + len(rows))
        state = plan.state
    tail = np.array(rows, dtype=np.int64).reshape(-1, 4)
    return (
        np.array(ends, dtype=np.int64),
        np.concatenate((requests[:done], tail[:, 0].astype(np.int32))),
        np.concatenate((starts[:done], tail[:, 1].astype(np.int32))),
        np.concatenate((sizes[:done], tail[:, 2].astype(np.int32))),
        np.concatenate((final[:done], tail[:, 3].astype(np.bool_))),
    )
