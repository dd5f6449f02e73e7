"""Hypothesis strategies for the planner's inputs and outputs, for use in other projects' tests.

They follow Hypothesis's own API style: plural names, keyword-only arguments, bounds named
``min_value``/``max_value`` and ``min_size``/``max_size``, a strategy wherever a value should
vary (wrap a constant in ``st.just``), :class:`~hypothesis.errors.InvalidArgument` for
arguments that can never produce a value, and values that are valid by construction, not by
filtering. Defaults keep generated plans small enough to run in a test: where a default
depends on another drawn value (prompt lengths depend on the config's chunk cap) it is
``None`` in the signature and documented.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any, TypeVar

try:
    from hypothesis import strategies as st
    from hypothesis.errors import InvalidArgument
except ImportError as error:  # pragma: no cover - depends on the environment
    raise ImportError(
        "the strategies of pypto_sched.testing need Hypothesis; install it with "
        "pip install 'pypto-sched[testing]'"
    ) from error

from pypto_sched import (
    POLICIES,
    InvalidConfigError,
    PlannerConfig,
    Policy,
    Schedule,
    plan_prefill,
)
from pypto_sched._online import PrefillState, plan_step
from pypto_sched._validate import MAX_TOKENS

__all__ = ["planner_configs", "prefill_states", "prompt_lengths", "schedules"]

T = TypeVar("T")

#: The default bound of ``max_num_batched_tokens`` in :func:`planner_configs`.
_MAX_BUDGET = 512
#: Default prompt lengths reach this many chunks (of the drawn config's chunk cap).
_MAX_CHUNKS_PER_PROMPT = 4
#: Default prompt lengths of :func:`prefill_states` with no configs to relate them to.
_MAX_UNRELATED_LENGTH = 1024
#: The number of requests drawn when ``max_size`` is ``None``.
_DEFAULT_MAX_SIZE = 10


def prompt_lengths(*, min_value: int = 1, max_value: int | None = None) -> st.SearchStrategy[int]:
    """Prompt lengths: ints in ``[min_value, max_value]``.

    ``max_value=None`` means the largest length the planner accepts, ``2**31 - 1``; bound it
    when the lengths will be planned with a small budget, or the plan will be long.
    """
    low = _check_count("min_value", min_value, minimum=1)
    high = MAX_TOKENS if max_value is None else _check_count("max_value", max_value, minimum=1)
    if high > MAX_TOKENS:
        raise InvalidArgument(f"max_value={high} must be <= {MAX_TOKENS}, the largest length")
    if low > high:
        raise InvalidArgument(f"min_value={low} must be <= max_value={high}")
    return st.integers(min_value=low, max_value=high)


def planner_configs(
    *,
    policy: st.SearchStrategy[Policy] | None = None,
    max_num_batched_tokens: st.SearchStrategy[int] | None = None,
    long_prefill_token_threshold: st.SearchStrategy[int | None] | None = None,
    max_num_seqs: st.SearchStrategy[int | None] | None = None,
    page_size: st.SearchStrategy[int | None] | None = None,
    max_num_partial_prefills: st.SearchStrategy[int | None] | None = None,
) -> st.SearchStrategy[PlannerConfig]:
    """Valid :class:`~pypto_sched.PlannerConfig` values; each argument draws that field.

    By default: any policy; a budget in ``[1, 512]``; each optional limit either off
    (``None``) or on: the threshold up to twice the budget, the page size up to the chunk
    cap, up to 16 rows and up to 8 partial prefills. Defaults adapt to what you pass, so the
    config stays valid: with a ``page_size`` strategy, the default threshold is at least the
    page drawn. ``max_num_partial_prefills`` is drawn for ``packed`` configs only. A strategy
    you pass that yields a combination ``PlannerConfig`` rejects (a page larger than the
    budget, say) raises ``InvalidArgument`` when drawn.
    """
    strategies = {
        "policy": policy,
        "max_num_batched_tokens": max_num_batched_tokens,
        "long_prefill_token_threshold": long_prefill_token_threshold,
        "max_num_seqs": max_num_seqs,
        "page_size": page_size,
        "max_num_partial_prefills": max_num_partial_prefills,
    }
    for name, value in strategies.items():
        _check_strategy(name, value)
    return _planner_configs(
        _or_default(policy, st.sampled_from(POLICIES)),
        _or_default(max_num_batched_tokens, st.integers(min_value=1, max_value=_MAX_BUDGET)),
        long_prefill_token_threshold,
        _or_default(max_num_seqs, _optional_counts(1, 16)),
        page_size,
        _or_default(max_num_partial_prefills, _optional_counts(1, 8)),
    )


@st.composite
def _planner_configs(
    draw: st.DrawFn,
    policies: st.SearchStrategy[Policy],
    budgets: st.SearchStrategy[int],
    thresholds: st.SearchStrategy[int | None] | None,
    batch_sizes: st.SearchStrategy[int | None],
    page_sizes: st.SearchStrategy[int | None] | None,
    partial_limits: st.SearchStrategy[int | None],
) -> PlannerConfig:
    policy = draw(policies)
    budget = draw(budgets)
    if page_sizes is None:  # the default page size fits the chunk cap
        threshold = draw(_or_default(thresholds, _optional_counts(1, 2 * budget)))
        chunk_cap = budget if threshold is None else min(budget, threshold)
        page = draw(_optional_counts(1, chunk_cap))
    else:  # the default threshold leaves room for the page size passed
        page = draw(page_sizes)
        threshold = draw(_or_default(thresholds, _optional_counts(page or 1, 2 * budget)))
    batch_size = draw(batch_sizes)
    partial = draw(partial_limits) if policy == "packed" else None
    try:
        return PlannerConfig(
            max_num_batched_tokens=budget,
            long_prefill_token_threshold=threshold,
            max_num_seqs=batch_size,
            page_size=page,
            policy=policy,
            max_num_partial_prefills=partial,
        )
    except InvalidConfigError as error:
        raise InvalidArgument(
            f"planner_configs() drew values PlannerConfig rejects: {error}"
        ) from error


def schedules(
    *,
    configs: st.SearchStrategy[PlannerConfig] | None = None,
    prompt_lengths: st.SearchStrategy[int] | None = None,
    min_size: int = 1,
    max_size: int | None = None,
    allow_prefix_hits: bool = True,
) -> st.SearchStrategy[Schedule]:
    """Schedules planned by :func:`~pypto_sched.plan_prefill` for ``min_size`` to ``max_size``
    requests (a schedule holds at least one).

    ``configs`` defaults to :func:`planner_configs`; ``prompt_lengths`` to lengths of up to
    four chunks of the drawn config's chunk cap. With ``allow_prefix_hits``, requests may
    start with some tokens already computed.
    """
    _check_strategy("configs", configs)
    _check_strategy("prompt_lengths", prompt_lengths)
    low, high = _check_sizes(min_size, max_size, minimum=1)
    _check_bool("allow_prefix_hits", allow_prefix_hits)
    return _schedules(
        _or_default(configs, planner_configs()), prompt_lengths, low, high, allow_prefix_hits
    )


@st.composite
def _schedules(
    draw: st.DrawFn,
    configs: st.SearchStrategy[PlannerConfig],
    lengths: st.SearchStrategy[int] | None,
    min_size: int,
    max_size: int,
    allow_prefix_hits: bool,
) -> Schedule:
    config = draw(configs)
    if lengths is None:
        lengths = _prompt_lengths(max_value=_MAX_CHUNKS_PER_PROMPT * config.chunk_cap)
    drawn = draw(st.lists(lengths, min_size=min_size, max_size=max_size))
    computed = [draw(_prefix_hits(length, allow_prefix_hits)) for length in drawn]
    return plan_prefill(drawn, config, num_computed_tokens=computed)


def prefill_states(
    *,
    configs: st.SearchStrategy[PlannerConfig] | None = None,
    request_ids: st.SearchStrategy[Hashable] | None = None,
    prompt_lengths: st.SearchStrategy[int] | None = None,
    min_size: int = 0,
    max_size: int | None = None,
    allow_prefix_hits: bool = True,
) -> st.SearchStrategy[PrefillState[Any]]:
    """:class:`~pypto_sched.PrefillState` values holding ``min_size`` to ``max_size``
    requests.

    With ``configs=None`` every request is waiting, in arrival order. Otherwise a config is
    drawn and the state is the end of a drawn history of arrivals, removals and
    :func:`~pypto_sched.plan_step` calls under it (with drawn reservations), so requests may
    be part-way and the state may be part-way through a run of that config's policy: pass
    ``configs=st.just(config)`` to step the state further with a known config.

    ``request_ids`` defaults to non-negative ints (an id may come back after its request has
    left); ``prompt_lengths`` to lengths of up to four chunks of the drawn config's chunk
    cap, or up to 1024 tokens with no configs.
    """
    _check_strategy("configs", configs)
    _check_strategy("request_ids", request_ids)
    _check_strategy("prompt_lengths", prompt_lengths)
    low, high = _check_sizes(min_size, max_size, minimum=0)
    _check_bool("allow_prefix_hits", allow_prefix_hits)
    return _prefill_states(
        configs,
        _or_default(request_ids, st.integers(min_value=0)),
        prompt_lengths,
        low,
        high,
        allow_prefix_hits,
    )


@st.composite
def _prefill_states(
    draw: st.DrawFn,
    configs: st.SearchStrategy[PlannerConfig] | None,
    ids: st.SearchStrategy[Hashable],
    lengths: st.SearchStrategy[int] | None,
    min_size: int,
    max_size: int,
    allow_prefix_hits: bool,
) -> PrefillState[Any]:
    config = None if configs is None else draw(configs)
    if lengths is None:
        longest = (
            _MAX_UNRELATED_LENGTH if config is None else _MAX_CHUNKS_PER_PROMPT * config.chunk_cap
        )
        lengths = _prompt_lengths(max_value=longest)
    state: PrefillState[Any] = PrefillState()

    def arrive(request_id: Hashable) -> None:
        nonlocal state
        length = draw(lengths)
        cached = draw(_prefix_hits(length, allow_prefix_hits))
        state = state.add(request_id, length, num_computed_tokens=cached)

    if config is not None:
        actions = st.sampled_from(["add", "remove", "step"])
        for action in draw(st.lists(actions, max_size=3 * max_size)):
            if action == "add" and len(state) < max_size:
                request_id = draw(ids)
                if request_id not in state:  # else the arrival is skipped
                    arrive(request_id)
            elif action == "remove" and state:
                state = state.remove(draw(st.sampled_from(list(state))))
            elif action == "step":
                tokens = draw(st.integers(min_value=0, max_value=config.effective_budget))
                rows = draw(st.integers(min_value=0, max_value=config.max_num_seqs or 0))
                state = plan_step(state, config, reserved_tokens=tokens, reserved_rows=rows).state
    missing = draw(
        st.integers(min_value=max(min_size - len(state), 0), max_value=max_size - len(state))
    )
    fresh = ids.filter(lambda request_id: request_id not in state)
    for request_id in draw(st.lists(fresh, min_size=missing, max_size=missing, unique=True)):
        arrive(request_id)
    return state


_prompt_lengths = prompt_lengths  # the arguments named `prompt_lengths` shadow it


def _optional_counts(low: int, high: int) -> st.SearchStrategy[int | None]:
    """``None``, or an int in ``[low, high]`` if there is one."""
    if low > high:
        return st.none()
    return st.none() | st.integers(min_value=low, max_value=high)


def _prefix_hits(length: int, allowed: bool) -> st.SearchStrategy[int]:
    """Tokens already computed for a prompt of ``length``: ``0 <= c < length``."""
    if not allowed:
        return st.just(0)
    return st.integers(min_value=0, max_value=length - 1)


def _or_default(
    strategy: st.SearchStrategy[T] | None, default: st.SearchStrategy[T]
) -> st.SearchStrategy[T]:
    # Not `strategy or default`: Hypothesis warns when a strategy is used as a bool.
    return default if strategy is None else strategy


# -- argument checks ------------------------------------------------------------------------


def _check_strategy(name: str, value: object) -> None:
    if value is not None and not isinstance(value, st.SearchStrategy):
        raise InvalidArgument(
            f"{name}={value!r} must be a strategy or None; wrap a constant in st.just()"
        )


def _check_bool(name: str, value: object) -> None:
    if not isinstance(value, bool):
        raise InvalidArgument(f"{name}={value!r} must be a bool")


def _check_count(name: str, value: object, *, minimum: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidArgument(f"{name}={value!r} must be an int")
    if value < minimum:
        raise InvalidArgument(f"{name}={value} must be >= {minimum}")
    return value


def _check_sizes(min_size: object, max_size: object, *, minimum: int) -> tuple[int, int]:
    low = _check_count("min_size", min_size, minimum=minimum)
    if max_size is None:
        return low, max(low, _DEFAULT_MAX_SIZE)
    high = _check_count("max_size", max_size, minimum=minimum)
    if low > high:
        raise InvalidArgument(f"min_size={low} must be <= max_size={high}")
    return low, high
