"""A deliberately simple planner: the policies of ``pypto_sched/_policies.py`` as plain loops.

It shares no code with the library. The tests check that ``plan_prefill`` matches it dispatch
for dispatch, and ``benchmarks/`` measures the fast planner against it.
"""

from __future__ import annotations

from pypto_sched import PlannerConfig

# A dispatch is a list of rows (request, start, length, is_final).
Row = tuple[int, int, int, bool]


def oracle_plan(
    lengths: list[int], config: PlannerConfig, computed: list[int] | None = None
) -> list[list[Row]]:
    position = list(computed) if computed is not None else [0] * len(lengths)
    if config.policy == "round_robin":
        return _round_robin(lengths, position, config)
    return _packed(lengths, position, config)


def _chunk(start: int, length: int, limit: int, page: int | None) -> int:
    """Tokens to run from ``start`` with ``limit`` tokens allowed; 0 if none can run."""
    if length - start <= limit:
        return length - start
    end = start + limit
    if page is not None:
        end = end // page * page
    return max(end - start, 0)


def _round_robin(lengths: list[int], position: list[int], config: PlannerConfig) -> list[list[Row]]:
    budget = config.max_num_batched_tokens
    if config.long_prefill_token_threshold is not None:
        budget = min(budget, config.long_prefill_token_threshold)
    rows_ok = config.max_num_seqs is None or len(lengths) <= config.max_num_seqs
    remaining = sum(length - start for length, start in zip(lengths, position, strict=True))
    if rows_ok and remaining <= budget:
        return [[(r, position[r], lengths[r] - position[r], True) for r in range(len(lengths))]]
    dispatches: list[list[Row]] = []
    while any(position[r] < lengths[r] for r in range(len(lengths))):
        for r in range(len(lengths)):
            if position[r] < lengths[r]:
                size = _chunk(position[r], lengths[r], budget, config.page_size)
                final = position[r] + size == lengths[r]
                dispatches.append([(r, position[r], size, final)])
                position[r] += size
    return dispatches


def _packed(lengths: list[int], position: list[int], config: PlannerConfig) -> list[list[Row]]:
    cap = config.max_num_batched_tokens
    if config.long_prefill_token_threshold is not None:
        cap = min(cap, config.long_prefill_token_threshold)
    max_rows = config.max_num_seqs or len(lengths)
    max_partial = config.max_num_partial_prefills or len(lengths)
    started: list[int] = []  # started and unfinished, in request order
    next_new = 0
    dispatches: list[list[Row]] = []
    while started or next_new < len(lengths):
        left = config.max_num_batched_tokens
        # The work-conserving tail: a request left alone may use the whole budget.
        if len(started) + len(lengths) - next_new == 1:
            cap = config.max_num_batched_tokens
        rows: list[Row] = []
        for r in started:
            if len(rows) == max_rows:
                break
            size = _chunk(position[r], lengths[r], min(cap, left), config.page_size)
            if size > 0:
                rows.append((r, position[r], size, position[r] + size == lengths[r]))
                position[r] += size
                left -= size
        started = [r for r in started if position[r] < lengths[r]]
        while next_new < len(lengths) and len(rows) < max_rows and left > 0:
            r = next_new
            size = _chunk(position[r], lengths[r], min(cap, left), config.page_size)
            final = position[r] + size == lengths[r]
            if size == 0 or (not final and len(started) >= max_partial):
                break
            rows.append((r, position[r], size, final))
            position[r] += size
            left -= size
            next_new += 1
            if not final:
                started.append(r)
        dispatches.append(rows)
    return dispatches
