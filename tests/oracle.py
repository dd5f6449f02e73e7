"""A deliberately simple planner: the policies of ``pypto_sched/core/_policies.py`` as plain loops.

It shares no code with the library. The tests check that ``plan_prefill`` matches it dispatch
for dispatch, and ``benchmarks/`` measures the fast planner against it.
"""

from __future__ import annotations

from pypto_sched import PlannerConfig

# A dispatch is a list of rows (request, start, length, is_final).
Row = tuple[int, int, int, bool]


def oracle_plan(
    lengths: list[int],
    config: PlannerConfig,
    computed: list[int] | None = None,
    *,
    greedy: bool = False,
) -> list[list[Row]]:
    """The plan of ``config``'s policy; with ``greedy``, ``packed`` only ever fills greedily
    (vLLM V1's rule), never keeping to the bound."""
    position = list(computed) if computed is not None else [0] * len(lengths)
    if config.policy == "round_robin":
        return _round_robin(lengths, position, config)
    if not greedy:
        return _packed_to_the_bound(lengths, position, config)
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
                size = _chunk(position[r], lengths[r], budget, config.chunk_alignment)
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
            size = _chunk(position[r], lengths[r], min(cap, left), config.chunk_alignment)
            if size > 0:
                rows.append((r, position[r], size, position[r] + size == lengths[r]))
                position[r] += size
                left -= size
        started = [r for r in started if position[r] < lengths[r]]
        while next_new < len(lengths) and len(rows) < max_rows and left > 0:
            r = next_new
            size = _chunk(position[r], lengths[r], min(cap, left), config.chunk_alignment)
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


def _packed_to_the_bound(
    lengths: list[int], position: list[int], config: PlannerConfig
) -> list[list[Row]]:
    """``packed``: the greedy fill, unless it would leave more than the bound less one
    dispatch where no limit can bind (no pages, no more requests than rows or than the
    partial limit); then each request first gets the least it must run now (the docs' deadline
    minimums), the rest of the budget first come, first served, if that keeps to the bound.
    (The rows and partial-limit checks of that fill cannot fail where the rule applies; they
    stay as the library's plain restatement.)

    Requests start in order, so the waiting ones are those from ``next_new`` on, unchanged
    since the start: the two most they have left, from any index on, are listed once, and
    the greedy fill reads them only as far as it runs them."""
    budget = config.max_num_batched_tokens
    cap = min(budget, config.long_prefill_token_threshold or budget)
    page = config.chunk_alignment or 1
    rows_limit = config.max_num_seqs
    max_rows = rows_limit or len(lengths)
    max_partial = config.max_num_partial_prefills or len(lengths)
    n = len(lengths)
    most = [(0, 0)] * (n + 1)  # the two most left to requests i, i + 1, ...
    for i in range(n - 1, -1, -1):
        first, second = most[i + 1]
        tokens = lengths[i] - position[i]
        most[i] = (tokens, first) if tokens >= first else (first, max(second, tokens))
    total = sum(lengths[r] - position[r] for r in range(n))
    started: list[int] = []
    next_new = 0
    dispatches: list[list[Row]] = []
    while started or next_new < n:
        count = len(started) + n - next_new
        own_cap = budget if count == 1 else cap
        # The greedy fill, over the waiting ones up to where it stops (read twice as far
        # while it runs every one read and has budget left).
        width = 16
        while True:
            reach = min(n, next_new + width)
            order = started + list(range(next_new, reach))
            left = [lengths[r] - position[r] for r in order]
            sizes = _page_fill(
                order, position, lengths, [0] * len(order), len(started), own_cap, budget, page
            )
            assert sizes is not None
            sizes = _within_rows(sizes, len(started), max_rows)
            sizes = _admitted(sizes, left, len(started), max_partial)
            if reach == n or sum(sizes) >= budget or not all(sizes[len(started) :]):
                break
            width *= 2
        unlimited = (
            page == 1
            and (rows_limit is None or count <= rows_limit)
            and count <= (config.max_num_partial_prefills or count)
        )
        if count > 1 and unlimited:
            rest = most[reach]
            bound = _bound_with(left, rest, total, count, budget, cap, rows_limit)
            after = _minus(left, sizes)
            ran, finished = sum(sizes), after.count(0)
            if _bound_with(after, rest, total - ran, count - finished, budget, cap, rows_limit) > (
                bound - 1
            ):
                # Every request, plainly.
                order = started + list(range(next_new, n))
                left = [lengths[r] - position[r] for r in order]
                sizes += [0] * (len(order) - len(sizes))
                least = _least(left, len(started), bound, budget, cap)
                kept = (
                    None
                    if least is None
                    else _page_fill(
                        order, position, lengths, least, len(started), own_cap, budget, page
                    )
                )
                if (
                    kept is not None
                    and sum(1 for size in kept if size) <= max_rows
                    and _admitted(kept, left, len(started), max_partial) == kept
                    and _bound(_minus(left, kept), budget, cap, rows_limit) <= bound - 1
                ):
                    sizes = kept
        rows: list[Row] = []
        for r, size in zip(order, sizes, strict=True):
            if size:
                rows.append((r, position[r], size, position[r] + size == lengths[r]))
                position[r] += size
                total -= size
                if r not in started:
                    started.append(r)
                    next_new += 1
        started = [r for r in started if position[r] < lengths[r]]
        dispatches.append(rows)
    return dispatches


def _page_fill(
    order: list[int],
    position: list[int],
    lengths: list[int],
    least: list[int],
    num_started: int,
    cap: int,
    budget: int,
    page: int,
) -> list[int] | None:
    """Each request at least its ``least`` tokens, raised to the end of their page (or the
    prompt), then the budget in order, each chunk as the chunk rule cuts it; a waiting
    request that cannot run stops the fill. ``None``: the least do not fit."""
    sizes = []
    for r, tokens in zip(order, least, strict=True):
        if tokens <= 0:
            sizes.append(0)
            continue
        end = min(-(-(position[r] + tokens) // page) * page, lengths[r])
        if end - position[r] > cap:
            return None
        sizes.append(end - position[r])
    free = budget - sum(sizes)
    if free < 0:
        return None
    for j, r in enumerate(order):
        size = _chunk(position[r], lengths[r], min(cap, sizes[j] + free), page)
        if size > sizes[j]:
            free -= size - sizes[j]
            sizes[j] = size
        elif sizes[j] == 0 and j >= num_started:
            break
    return sizes


def _within_rows(sizes: list[int], num_started: int, rows: int) -> list[int]:
    """The greedy fill's rows: in order, until ``rows`` have run."""
    kept, used = [], 0
    for size in sizes:
        kept.append(size if used < rows else 0)
        used += bool(kept[-1])
    return kept


def _admitted(sizes: list[int], left: list[int], num_started: int, max_partial: int) -> list[int]:
    """``sizes`` with the waiting requests cut from the first that would be left part-way
    while ``max_partial`` requests are (counting the started ones still part-way)."""
    partial = sum(1 for j in range(num_started) if sizes[j] < left[j])
    kept = list(sizes)
    for j in range(num_started, len(sizes)):
        if kept[j] and kept[j] < left[j]:
            if partial >= max_partial:
                kept[j:] = [0] * (len(sizes) - j)
                break
            partial += 1
    return kept


def _minus(left: list[int], sizes: list[int]) -> list[int]:
    return [a - b for a, b in zip(left, sizes, strict=True)]


def _bound(left: list[int], budget: int, cap: int, rows: int | None) -> int:
    """The docs' lower bound under ``packed`` (0: nothing left)."""
    rest = [t for t in left if t > 0]
    return _bound_with(rest, (0, 0), sum(rest), len(rest), budget, cap, rows)


def _bound_with(
    left: list[int],
    others: tuple[int, int],
    total: int,
    count: int,
    budget: int,
    cap: int,
    rows: int | None,
) -> int:
    """The docs' lower bound of ``count`` requests with ``total`` tokens left, some with
    ``left`` each, the others' two most being ``others`` (0: nothing left)."""
    if not count:
        return 0
    first, second = sorted([*left, *others], reverse=True)[:2]
    shared = budget if rows is None else min(budget, rows * cap)
    if cap == budget:
        tokens = -(-total // shared)
    else:  # ceil((total - R1) / shared + R1 / budget)
        tokens = -(-((total - first) * budget + first * shared) // (shared * budget))
    least = 0 if rows is None else -(-count // rows)
    if count == 1:
        return max(tokens, -(-first // budget), least)
    k = -(-second // cap)
    return max(tokens, k + -(-max(first - k * cap, 0) // budget), least)


def _least(
    left: list[int], num_started: int, bound: int, budget: int, cap: int
) -> list[int] | None:
    """The docs' deadline minimums: the fewest tokens in all over the ``k`` that can give
    them (of equals, the largest ``k``). A request other than the longest runs at most a
    cap now, so ``k >= ceil(second / cap) - 1``; above ``ceil(second / cap)`` only the
    longest's minimum changes, and it grows with ``k``."""
    longest = max(range(len(left)), key=lambda j: (left[j], -j))  # the oldest of equals
    second = max((t for j, t in enumerate(left) if j != longest), default=0)
    top = min(bound - 1, -(-second // cap))
    best: list[int] | None = None
    for k in range(top, max(top - 2, -1), -1):
        least = [max(t - k * cap, 0) for t in left]
        least[longest] = max(left[longest] - k * cap - (bound - 1 - k) * budget, 0)
        if any(m > min(t, cap) for m, t in zip(least, left, strict=True)):
            continue
        must = [j for j in range(num_started, len(left)) if least[j]]
        for j in range(num_started, max(must, default=0)):
            least[j] = max(least[j], 1)
        if sum(least) <= budget and (best is None or sum(least) < sum(best)):
            best = least
    return best
