"""The fewest dispatches any schedule within a config's limits can take, by exhaustive search.

A breadth-first search over the tokens each request has run, one dispatch per level, trying
every chunk size for every request. It shares no code with the library and states the limits
from the docs (``docs/semantics.md``, "Invariants"): a dispatch holds at most the config's
dispatch budget and ``max_num_seqs`` rows; a chunk holds at most ``chunk_cap`` tokens, or under
``packed`` the whole ``max_num_batched_tokens`` for a request that is the only one unfinished;
a non-final chunk ends on a page boundary; at most ``max_num_partial_prefills`` requests are
part-way after a dispatch. Exponential: for a handful of short prompts only.

With ``in_order``, only schedules that start the requests in the order given count (a request
runs its first token in the dispatch of the one before it or later), as ``packed`` and vLLM's
first-come-first-served admission do.
"""

from __future__ import annotations

import itertools

from pypto_sched import PlannerConfig


def optimum(lengths: list[int], config: PlannerConfig, *, in_order: bool = False) -> int:
    """The fewest dispatches that run every prompt of ``lengths`` under ``config``'s limits
    (with ``in_order``, starting them in the order given)."""
    budget = config.max_num_batched_tokens
    threshold = config.long_prefill_token_threshold
    cap = budget if threshold is None else min(threshold, budget)
    dispatch_budget = cap if config.policy == "round_robin" else budget
    rows = config.max_num_seqs or len(lengths)
    page = config.chunk_alignment or 1
    goal = tuple(lengths)
    level: set[tuple[int, ...]] = {tuple(0 for _ in lengths)}
    seen = set(level)
    dispatches = 0
    while goal not in level:
        dispatches += 1
        following: set[tuple[int, ...]] = set()
        for done in level:
            unfinished = sum(d < n for d, n in zip(done, lengths, strict=True))
            alone = unfinished == 1 and config.policy == "packed"
            for sizes in itertools.product(
                *(
                    _sizes(d, n, budget if alone else cap, page)
                    for d, n in zip(done, lengths, strict=True)
                )
            ):
                if not any(sizes) or sum(sizes) > dispatch_budget:
                    continue
                if sum(size > 0 for size in sizes) > rows:
                    continue
                after = tuple(d + size for d, size in zip(done, sizes, strict=True))
                if in_order and any(
                    later > 0 and earlier == 0 for earlier, later in itertools.pairwise(after)
                ):
                    continue
                limit = config.max_num_partial_prefills
                if limit is not None and (
                    sum(0 < a < n for a, n in zip(after, lengths, strict=True)) > limit
                ):
                    continue
                if after not in seen:
                    seen.add(after)
                    following.add(after)
        level = following
    return dispatches


def _sizes(done: int, length: int, cap: int, page: int) -> list[int]:
    """The chunk sizes a request that has run ``done`` of ``length`` tokens may run next."""
    left = length - done
    return [0] + [
        size for size in range(1, min(cap, left) + 1) if size == left or (done + size) % page == 0
    ]
