"""Hypothesis strategies for the planner's inputs and outputs, for use in other projects' tests.

They follow Hypothesis's own API style (its ``guides/api-style.rst``):

* Plural names; keyword-only arguments; bounds named ``min_value``/``max_value`` and
  ``min_size``/``max_size``; a strategy wherever a value should vary (wrap a constant in
  ``st.just``); ``allow_*`` flags for what a test may want to leave out.
* Every argument is checked lazily, as Hypothesis checks its own: calling a strategy
  function never raises, drawing from it raises :class:`~hypothesis.errors.InvalidArgument`
  for an argument that is wrong, or for a value that a strategy passed as an argument
  draws and that can never be used, naming the argument and the value.
* Values are valid by construction: every draw is used, nothing is filtered, assumed away
  or retried. (One exception belongs to Hypothesis, not to us: ids from a ``request_ids``
  strategy you pass are drawn as ``st.lists(..., unique=True)``, which redraws duplicates.)
* Defaults are bounded so that every example plans in milliseconds: lengths up to 4,096
  tokens, budgets up to 512, 10 requests; where a default depends on another drawn value
  it follows that value (default prompt lengths are up to four of the drawn config's
  chunks, and the default config of a schedule of long prompts you pass has chunks large
  enough to plan them in a few hundred dispatches).
* Reprs are the public call, ``schedules(max_size=3)``: each strategy is an
  ``st.composite``, whose repr Hypothesis builds from the function and its arguments.

How each default is derived is stated by the function that draws it; the sizes are the
constants below.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any, Literal, TypeGuard, TypeVar

try:
    from hypothesis import strategies as st
    from hypothesis.errors import InvalidArgument
except ImportError as error:  # pragma: no cover - depends on the environment
    raise ImportError(
        "the strategies of pypto_sched.testing need Hypothesis; install it with "
        "pip install 'pypto-sched[testing]'"
    ) from error

import attrs
import numpy as np

from pypto_sched import (
    POLICIES,
    InvalidConfigError,
    InvalidInputError,
    PlannerConfig,
    Policy,
    Schedule,
    plan_prefill,
)
from pypto_sched.core._config import check_config
from pypto_sched.core._online import PrefillState, plan_step
from pypto_sched.core._policies import request_cap
from pypto_sched.core._validate import MAX_TOKENS, retired_argument

__all__ = [
    "planner_configs",
    "prefill_states",
    "prefill_states_with_configs",
    "prompt_lengths",
    "schedules",
]

T = TypeVar("T")

#: ``prompt_lengths(max_value=None)`` draws up to ``min_value + _LENGTH_SPAN - 1``.
_LENGTH_SPAN = 4096
#: A default budget is drawn from ``BUDGET_SPAN`` values, ``[1, 512]`` unless raised.
_BUDGET_SPAN = 512
#: Default prompt lengths reach this many chunks of the drawn config's chunk cap.
_CHUNKS_PER_PROMPT = 4
#: The default config of ``schedules(prompt_lengths=...)`` has a chunk cap of at least the
#: schedule's tokens over this. Every dispatch runs a chunk of its first request; a request
#: has at most twice this many chunks over all (a page-aligned chunk is at least half the
#: cap) plus two (a short first chunk after a prefix hit, and its last), so a schedule has
#: at most ``2 * _CHUNKS_PER_SCHEDULE`` dispatches plus two per request.
_CHUNKS_PER_SCHEDULE = 128
#: Default upper bounds of the optional limits a config draws.
_MAX_NUM_SEQS = 16
_MAX_NUM_PARTIAL_PREFILLS = 8
#: The number of requests drawn when ``max_size`` is ``None`` (or ``min_size`` if larger).
_DEFAULT_MAX_SIZE = 10
#: The largest ``min_size``: Hypothesis draws every example from a bounded buffer, and past
#: about a thousand requests (with their ids, lengths and progress) it cannot finish drawing
#: one. Past a few hundred its health checks on slow and large inputs need suppressing.
MAX_MIN_SIZE = 1000


# -- prompt lengths -----------------------------------------------------------------------------


@st.composite
def prompt_lengths(draw: st.DrawFn, *, min_value: int = 1, max_value: int | None = None) -> int:
    """Prompt lengths: ints in ``[min_value, max_value]``.

    ``max_value=None`` means ``min_value + 4095`` (lengths up to 4,096 with the default
    ``min_value``); the largest length the planner accepts is ``2**31 - 1``. As with
    ``st.integers``, a bound may be a NumPy int or an integral float.
    """
    low = _check_int("min_value", _bound(min_value), min_value=1, max_value=MAX_TOKENS)
    if max_value is None:
        high = min(low + _LENGTH_SPAN - 1, MAX_TOKENS)
    else:
        high = _check_int("max_value", _bound(max_value), min_value=1, max_value=MAX_TOKENS)
    if low > high:
        raise InvalidArgument(f"min_value={low} must be <= max_value={high}")
    return draw(st.integers(min_value=low, max_value=high))


# -- configs ------------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class _FieldStrategies:
    """The strategies passed to :func:`planner_configs`, one per config field (``None``:
    the default)."""

    policy: st.SearchStrategy[Policy] | None = None
    max_num_batched_tokens: st.SearchStrategy[int] | None = None
    long_prefill_token_threshold: st.SearchStrategy[int | None] | None = None
    max_num_seqs: st.SearchStrategy[int | None] | None = None
    chunk_alignment: st.SearchStrategy[int | None] | None = None
    max_num_partial_prefills: st.SearchStrategy[int | None] | None = None

    def check(self) -> None:
        for name, value in attrs.asdict(self, recurse=False).items():
            _check_strategy(name, value)


def planner_configs(
    *,
    policy: st.SearchStrategy[Policy] | None = None,
    max_num_batched_tokens: st.SearchStrategy[int] | None = None,
    long_prefill_token_threshold: st.SearchStrategy[int | None] | None = None,
    max_num_seqs: st.SearchStrategy[int | None] | None = None,
    chunk_alignment: st.SearchStrategy[int | None] | None = None,
    max_num_partial_prefills: st.SearchStrategy[int | None] | None = None,
    page_size: st.SearchStrategy[int | None] | None = None,
) -> st.SearchStrategy[PlannerConfig]:
    """Valid :class:`~pypto_sched.PlannerConfig` values; each argument draws that field.

    By default: any policy; a budget in ``[1, 512]``; each optional limit either off
    (``None``) or on: the threshold up to twice the budget, the chunk alignment up to the
    chunk cap, up to 16 rows and up to 8 partial prefills. Defaults adapt to what you pass so
    the config stays valid: with a ``chunk_alignment`` strategy, the default budget and
    threshold are at least the alignment drawn (the budget in ``[a, a + 511]``), and with a
    ``max_num_partial_prefills`` strategy, the default policy is ``packed`` when it draws a
    limit. The default ``max_num_partial_prefills`` is drawn for ``packed`` configs only.

    Raises ``InvalidArgument`` when drawn if an argument is not a strategy, if a strategy
    draws a value the field cannot take (``max_num_batched_tokens=st.just(0)``), or if the
    strategies you pass draw a combination ``PlannerConfig`` rejects (an alignment larger than
    the budget, say, or a partial-prefill limit under ``round_robin``).

    ``page_size`` is the retired name of ``chunk_alignment`` (a ``DeprecationWarning``).
    """
    if page_size is not None and chunk_alignment is not None:
        raise InvalidArgument(
            "planner_configs() takes 'chunk_alignment' or its retired name 'page_size', not "
            f"both: {page_size!r}"
        )
    retired = retired_argument("planner_configs", "page_size", page_size, "chunk_alignment",
                               new_given=False)  # fmt: skip
    fields = {
        "policy": policy,
        "max_num_batched_tokens": max_num_batched_tokens,
        "long_prefill_token_threshold": long_prefill_token_threshold,
        "max_num_seqs": max_num_seqs,
        "chunk_alignment": chunk_alignment if retired is None else retired,
        "max_num_partial_prefills": max_num_partial_prefills,
    }
    return _config_strategy(**{name: value for name, value in fields.items() if value is not None})


def _named_planner_configs() -> Callable[..., st.SearchStrategy[PlannerConfig]]:
    """The strategy :func:`planner_configs` returns, a composite of its own name (Hypothesis
    names a strategy by its function: ``planner_configs(chunk_alignment=just(16))``)."""

    @st.composite
    def planner_configs(
        draw: st.DrawFn, /, **fields: st.SearchStrategy[Any] | None
    ) -> PlannerConfig:
        given = _FieldStrategies(**fields)
        given.check()
        return _draw_config(draw, given, min_chunk_cap=1)

    return planner_configs


_config_strategy = _named_planner_configs()


def _draw_config(draw: st.DrawFn, given: _FieldStrategies, *, min_chunk_cap: int) -> PlannerConfig:
    """A config from ``given`` whose defaults leave a chunk cap of at least
    ``min_chunk_cap`` (strategies you pass are drawn as they are)."""
    limit = None
    if given.max_num_partial_prefills is not None:  # drawn first: the default policy follows it
        limit = _draw_limit(draw, "max_num_partial_prefills", given.max_num_partial_prefills)
    if limit is not None and given.policy is None:
        policy: Policy = "packed"  # the one policy a partial-prefill limit applies to
    else:
        policy = _draw_policy(draw, given.policy)
    page = None
    if given.chunk_alignment is not None:  # drawn first: the default budget and threshold follow
        page = _draw_limit(draw, "chunk_alignment", given.chunk_alignment)
    floor = max(min_chunk_cap, page or 1)
    if given.max_num_batched_tokens is None:
        high = min(floor + _BUDGET_SPAN - 1, MAX_TOKENS)
        budget = draw(st.integers(min_value=floor, max_value=high))
    else:
        budget = _draw_count(draw, "max_num_batched_tokens", given.max_num_batched_tokens)
    if given.long_prefill_token_threshold is None:
        threshold = draw(_optional_counts(floor, min(2 * budget, MAX_TOKENS)))
    else:
        threshold = _draw_limit(
            draw, "long_prefill_token_threshold", given.long_prefill_token_threshold
        )
    if given.chunk_alignment is None:  # the default alignment fits the chunk cap
        page = draw(_optional_counts(1, budget if threshold is None else min(budget, threshold)))
    if given.max_num_seqs is None:
        seqs = draw(_optional_counts(1, _MAX_NUM_SEQS))
    else:
        seqs = _draw_limit(draw, "max_num_seqs", given.max_num_seqs)
    # A limit you pass is kept under any policy, so that PlannerConfig refuses it under
    # round_robin (InvalidArgument below) rather than it being dropped quietly.
    partial = limit
    if policy == "packed" and given.max_num_partial_prefills is None:
        partial = draw(_optional_counts(1, _MAX_NUM_PARTIAL_PREFILLS))
    try:
        return PlannerConfig(
            policy=policy,
            max_num_batched_tokens=budget,
            long_prefill_token_threshold=threshold,
            max_num_seqs=seqs,
            chunk_alignment=page,
            max_num_partial_prefills=partial,
        )
    except InvalidConfigError as error:
        drawn = (
            f"policy={policy!r}, max_num_batched_tokens={budget}, "
            f"long_prefill_token_threshold={threshold}, max_num_seqs={seqs}, "
            f"chunk_alignment={page}, max_num_partial_prefills={partial}"
        )
        raise InvalidArgument(
            f"planner_configs() drew a combination PlannerConfig rejects ({drawn}): {error}"
        ) from error


def _draw_policy(draw: st.DrawFn, strategy: st.SearchStrategy[Policy] | None) -> Policy:
    if strategy is None:
        return draw(st.sampled_from(POLICIES))
    value = draw(strategy)
    if value not in POLICIES:
        choices = ", ".join(repr(policy) for policy in POLICIES)
        raise _drew("policy", value, f"a policy must be one of {choices}")
    return value


def _draw_count(draw: st.DrawFn, name: str, strategy: st.SearchStrategy[Any]) -> int:
    """An int in ``[1, MAX_TOKENS]`` from a strategy the user passed as ``name``."""
    value = draw(strategy)
    if not _is_count(value):
        raise _drew(name, value, f"it must be an int in [1, {MAX_TOKENS}]")
    return int(value)


def _draw_limit(draw: st.DrawFn, name: str, strategy: st.SearchStrategy[Any]) -> int | None:
    """``None`` (off) or an int in ``[1, MAX_TOKENS]``, from a strategy passed as ``name``."""
    value = draw(strategy)
    if value is not None and not _is_count(value):
        raise _drew(name, value, f"it must be None or an int in [1, {MAX_TOKENS}]")
    return None if value is None else int(value)


def _draw_planner_config(
    draw: st.DrawFn, configs: st.SearchStrategy[PlannerConfig] | None, *, min_chunk_cap: int = 1
) -> PlannerConfig:
    """A config from ``configs``, or from :func:`planner_configs`' defaults."""
    if configs is None:
        return _draw_config(draw, _FieldStrategies(), min_chunk_cap=min_chunk_cap)
    value = draw(configs)
    try:
        return check_config(value, name="configs")
    except InvalidInputError:
        raise _drew("configs", value, "a config must be a PlannerConfig") from None


# -- schedules ----------------------------------------------------------------------------------


@st.composite
def schedules(
    draw: st.DrawFn,
    *,
    configs: st.SearchStrategy[PlannerConfig] | None = None,
    prompt_lengths: st.SearchStrategy[int] | None = None,
    min_size: int = 1,
    max_size: int | None = None,
    allow_prefix_hits: bool = True,
) -> Schedule:
    """Schedules planned by :func:`~pypto_sched.plan_prefill` for ``min_size`` to
    ``max_size`` requests (a schedule holds at least one; ``max_size=None`` means 10, or
    ``min_size`` if larger).

    ``configs`` defaults to :func:`planner_configs`; ``prompt_lengths`` to lengths of up to
    four chunks of the drawn config's chunk cap. With ``prompt_lengths`` and no
    ``configs``, the lengths are drawn first and the default config's chunk cap is at least
    their sum over 128, so a schedule has at most 256 dispatches plus two per request
    however long the prompts. With ``allow_prefix_hits``, requests may start with some
    tokens already computed (``0 <= c < length``).

    Raises ``InvalidArgument`` when drawn for a bad argument, or when ``configs`` draws
    something other than a ``PlannerConfig`` or ``prompt_lengths`` a length the planner
    rejects.
    """
    _check_strategy("configs", configs)
    _check_strategy("prompt_lengths", prompt_lengths)
    low, high = _check_sizes(min_size, max_size, minimum=1)
    _check_bool("allow_prefix_hits", allow_prefix_hits)
    if prompt_lengths is None:
        config = _draw_planner_config(draw, configs)
        lengths = draw(st.lists(_default_lengths(config), min_size=low, max_size=high))
        computed = _draw_prefix_hits(draw, lengths, allow_prefix_hits)
    else:  # the lengths first: a default config follows them
        lengths = _draw_lengths(draw, prompt_lengths, low, high)
        computed = _draw_prefix_hits(draw, lengths, allow_prefix_hits)
        min_chunk_cap = min(-(-sum(lengths) // _CHUNKS_PER_SCHEDULE), MAX_TOKENS)
        config = _draw_planner_config(draw, configs, min_chunk_cap=min_chunk_cap)
    return plan_prefill(lengths, config, num_computed_tokens=computed)


def _default_lengths(config: PlannerConfig) -> st.SearchStrategy[int]:
    return st.integers(min_value=1, max_value=_longest_default(config.chunk_cap))


def _longest_default(chunk_cap: int) -> int:
    """The longest default prompt length: four chunks."""
    return min(_CHUNKS_PER_PROMPT * chunk_cap, MAX_TOKENS)


def _draw_lengths(
    draw: st.DrawFn, strategy: st.SearchStrategy[Any], min_size: int, max_size: int
) -> list[int]:
    lengths = draw(st.lists(strategy, min_size=min_size, max_size=max_size))
    return [_checked_length(length) for length in lengths]


def _checked_length(value: object) -> int:
    if not _is_count(value):
        rule = f"a prompt length must be an int in [1, {MAX_TOKENS}]"
        raise _drew("prompt_lengths", value, rule)
    return int(value)


def _draw_prefix_hits(draw: st.DrawFn, lengths: list[int], allowed: bool) -> list[int]:
    """Tokens already computed per prompt: ``0 <= c < length``, or all 0."""
    if not allowed:
        return [0] * len(lengths)
    return [draw(st.integers(min_value=0, max_value=length - 1)) for length in lengths]


# -- prefill states -----------------------------------------------------------------------------


@st.composite
def prefill_states(
    draw: st.DrawFn,
    *,
    configs: st.SearchStrategy[PlannerConfig] | None = None,
    request_ids: st.SearchStrategy[Hashable] | None = None,
    prompt_lengths: st.SearchStrategy[int] | None = None,
    min_size: int = 0,
    max_size: int | None = None,
    allow_prefix_hits: bool = True,
) -> PrefillState[Any]:
    """:class:`~pypto_sched.PrefillState` values holding ``min_size`` to ``max_size``
    requests (``max_size=None`` means 10, or ``min_size`` if larger).

    A config is drawn from ``configs`` (default :func:`planner_configs`) and the state is
    the end of a drawn history under it: arrivals, removals and
    :func:`~pypto_sched.plan_step` calls with drawn reservations. So requests may be
    waiting, part-way (started, not finished) or just arrived, and the state may be in the
    middle of a run of the config's policy (``state.policy``). With the default
    ``prompt_lengths``, at least a quarter of the states drawn hold a part-way request,
    whatever the config (if ``max_size >= 1``, and unless a request alone may run
    ``2**31 - 1`` tokens, the longest prompt: a ``packed`` budget that large), and some
    hold several. To step the state further you need its
    config: draw both with :func:`prefill_states_with_configs`.

    ``request_ids`` defaults to distinct ints in ``range(max_size)`` (an id may come back
    after its request has left); a strategy you pass must be able to draw ``min_size``
    distinct hashable ids. ``prompt_lengths`` defaults to lengths of up to four chunks of
    the drawn config's chunk cap. With ``prompt_lengths`` and no ``configs``, the lengths
    are drawn first and the default config's chunk cap is at least ``max_size`` times the
    longest over 128, so draining the state takes at most 256 steps plus two per request
    however long the prompts.

    Raises ``InvalidArgument`` when drawn for a bad argument, or when a strategy passed
    draws a value that cannot be used: a config that is not a ``PlannerConfig``, an id that
    is not hashable, a length the planner rejects.
    """
    state, _config = _draw_state(
        draw,
        configs=configs,
        request_ids=request_ids,
        prompt_lengths=prompt_lengths,
        min_size=min_size,
        max_size=max_size,
        allow_prefix_hits=allow_prefix_hits,
    )
    return state


@st.composite
def prefill_states_with_configs(
    draw: st.DrawFn,
    *,
    configs: st.SearchStrategy[PlannerConfig] | None = None,
    request_ids: st.SearchStrategy[Hashable] | None = None,
    prompt_lengths: st.SearchStrategy[int] | None = None,
    min_size: int = 0,
    max_size: int | None = None,
    allow_prefix_hits: bool = True,
) -> tuple[PrefillState[Any], PlannerConfig]:
    """``(state, config)`` pairs: a state drawn as by :func:`prefill_states` (same
    arguments) and the config of its history, ready for ``plan_step(state, config)``."""
    return _draw_state(
        draw,
        configs=configs,
        request_ids=request_ids,
        prompt_lengths=prompt_lengths,
        min_size=min_size,
        max_size=max_size,
        allow_prefix_hits=allow_prefix_hits,
    )


def _draw_state(
    draw: st.DrawFn,
    *,
    configs: st.SearchStrategy[PlannerConfig] | None,
    request_ids: st.SearchStrategy[Hashable] | None,
    prompt_lengths: st.SearchStrategy[int] | None,
    min_size: object,
    max_size: object,
    allow_prefix_hits: object,
) -> tuple[PrefillState[Any], PlannerConfig]:
    """A state and its config: a drawn history, then, in most draws, steps that leave a
    request part-way, then arrivals up to a drawn size of at least ``min_size``.

    The history's ids come from a pool of ``min_size`` to ``max_size`` distinct ids, so the
    state never holds more; its actions are at most three per id, its arrivals at most four.
    """
    _check_strategy("configs", configs)
    _check_strategy("request_ids", request_ids)
    _check_strategy("prompt_lengths", prompt_lengths)
    low, high = _check_sizes(min_size, max_size, minimum=0)
    allowed = _check_bool("allow_prefix_hits", allow_prefix_hits)
    free = _draw_id_pool(draw, request_ids, low, high)
    capacity = len(free)
    lengths = None
    min_chunk_cap = 1
    if prompt_lengths is not None:  # drawn first: a default config follows them
        arrivals = (_ACTIONS_PER_ID + 1) * capacity  # the most a history can use
        lengths = _draw_lengths(draw, prompt_lengths, arrivals, arrivals)
        most_tokens = capacity * max(lengths, default=1)
        min_chunk_cap = min(-(-most_tokens // _CHUNKS_PER_SCHEDULE), MAX_TOKENS)
    config = _draw_planner_config(draw, configs, min_chunk_cap=min_chunk_cap)
    history = _History(
        draw=draw, config=config, lengths=lengths, allow_prefix_hits=allowed, free=free
    )
    actions = st.lists(st.sampled_from(_ACTIONS), max_size=_ACTIONS_PER_ID * capacity)
    history.run(draw(actions))
    if draw(st.sampled_from(_LEAVE_PART_WAY)):
        # (Arrivals first, so that the steps can leave several requests part-way.)
        for _ in range(draw(st.integers(min_value=0, max_value=len(history.free)))):
            history.arrive()
        history.leave_part_way()
    missing = max(low - len(history.state), 0)
    room = capacity - len(history.state)
    for _ in range(draw(st.integers(min_value=missing, max_value=room))):
        history.arrive()
    return history.state, config


_ACTIONS: tuple[Literal["add", "remove", "step"], ...] = ("add", "remove", "step")
#: A history has at most this many actions per id of its pool.
_ACTIONS_PER_ID = 3
#: Whether a history ends by leaving a request part-way. Three of four choices say yes, so
#: that about half the draws do (Hypothesis favours the first choice, as it favours False
#: in a plain boolean: too much for "at least a quarter"); shrinking goes to the first, no.
_LEAVE_PART_WAY = (False, True, True, True)


@attrs.define(kw_only=True)
class _History:
    """The history :func:`prefill_states` draws, one change at a time.

    ``free`` holds the ids of the pool that are not in the state: an id goes back when its
    request leaves (removed or finished), so it may arrive again.
    """

    draw: st.DrawFn
    config: PlannerConfig
    #: Lengths drawn from the ``prompt_lengths`` passed, one per arrival (taken from the
    #: end), or ``None`` for the default lengths (up to four chunks), drawn on arrival.
    lengths: list[int] | None
    allow_prefix_hits: bool
    free: list[Any]
    state: PrefillState[Any] = attrs.field(factory=PrefillState)

    def run(self, actions: list[Literal["add", "remove", "step"]]) -> None:
        for action in actions:
            if action == "add" and self.free:
                self.arrive()
            elif action == "remove" and self.state:
                request_id = self.draw(st.sampled_from(list(self.state)))
                self.state = self.state.remove(request_id)
                self.free.append(request_id)
            elif action == "step" and self.state:
                tokens = self.draw(st.integers(min_value=0, max_value=self.config.effective_budget))
                rows = self.draw(st.integers(min_value=0, max_value=self.config.max_num_seqs or 0))
                self.step(reserved_tokens=tokens, reserved_rows=rows)

    def arrive(self, *, longer_than_alone: bool = False) -> None:
        """Add a request with a free id; ``longer_than_alone`` (default lengths only) leaves
        it more to prefill than a request alone runs in one step (:func:`_lone_run`)."""
        # (Popping in place keeps the pool's order, so ids shrink towards its first ones.)
        request_id = self.free.pop(
            self.draw(st.integers(min_value=0, max_value=len(self.free) - 1))
        )
        longest = _longest_default(self.config.chunk_cap)
        if self.lengths is not None:
            length = self.lengths.pop()
        else:
            shortest = _lone_run(self.config) + 1 if longer_than_alone else 1
            length = self.draw(st.integers(min_value=shortest, max_value=max(shortest, longest)))
        cached = 0
        if self.allow_prefix_hits:
            most = length - _lone_run(self.config) - 1 if longer_than_alone else length - 1
            cached = self.draw(st.integers(min_value=0, max_value=most))
        self.state = self.state.add(request_id, length, num_computed_tokens=cached)

    def step(self, *, reserved_tokens: int = 0, reserved_rows: int = 0) -> bool:
        """Plan and run one step; whether it ran any rows."""
        plan = plan_step(
            self.state, self.config, reserved_tokens=reserved_tokens, reserved_rows=reserved_rows
        )
        self.state = plan.state
        self.free.extend(plan.finished)
        return bool(plan.rows)

    def is_part_way(self) -> bool:
        return any(request.is_started for request in self.state.values())

    def leave_part_way(self) -> None:
        """Step with no reservations until a request is part-way, then up to a drawn number
        of steps more that keep one part-way, which leave more requests part-way (under
        ``round_robin`` each step starts the next request in turn).

        A step with no reservations runs at least the first request in the state's order,
        at most ``chunk_cap`` tokens of it (the whole budget under ``packed`` when it is
        alone), so it leaves that request part-way if more remain, and otherwise finishes
        every request it runs: after at most ``len(state)`` steps a request is part-way or
        the state is empty. An empty state gets a request longer than a request alone runs
        (if the default lengths can draw one), which one step leaves part-way.
        """
        while self.state and not self.is_part_way():
            if not self.step():  # cannot happen (see above); never loop forever if it does
                return
        can_be_long = self.lengths is None and _lone_run(self.config) < MAX_TOKENS
        if not self.state and self.free and can_be_long:
            self.arrive(longer_than_alone=True)
            self.step()
        for _ in range(self.draw(st.integers(min_value=0, max_value=len(self.state)))):
            plan = plan_step(self.state, self.config)
            if not any(request.is_started for request in plan.state.values()):
                return  # (that step would leave no request part-way: not taken)
            self.state = plan.state
            self.free.extend(plan.finished)


def _lone_run(config: PlannerConfig) -> int:
    """The most tokens a request alone in a state runs in a step without reservations."""
    return request_cap(config, 1, 0, 0)


def _draw_id_pool(
    draw: st.DrawFn, strategy: st.SearchStrategy[Any] | None, min_size: int, max_size: int
) -> list[Any]:
    """The distinct ids a state's history uses: ``range(max_size)`` by default."""
    if strategy is None:
        return list(range(max_size))
    checked = strategy.map(_checked_id)
    return draw(st.lists(checked, min_size=min_size, max_size=max_size, unique=True))


def _checked_id(value: object) -> Hashable:
    try:
        hash(value)
    except TypeError:
        raise _drew("request_ids", value, "request ids must be hashable") from None
    return value


# -- helpers ------------------------------------------------------------------------------------


def _optional_counts(low: int, high: int) -> st.SearchStrategy[int | None]:
    """``None``, or an int in ``[low, high]`` if there is one."""
    if low > high:
        return st.none()
    return st.none() | st.integers(min_value=low, max_value=high)


def _is_count(value: object) -> TypeGuard[int | np.integer[Any]]:
    """Whether ``value`` is an int in ``[1, MAX_TOKENS]`` (NumPy ints too, bools not)."""
    if not isinstance(value, int | np.integer) or isinstance(value, bool | np.bool_):
        return False
    return bool(1 <= value <= MAX_TOKENS)


def _drew(name: str, value: object, rule: str) -> InvalidArgument:
    """The error for a strategy passed as ``name`` that drew a value it must not.

    (Not the strategy's repr: Hypothesis hands a composite its arguments unwrapped, whose
    reprs are internal class names.)
    """
    return InvalidArgument(f"{name} drew {value!r} ({type(value).__name__}), but {rule}")


def _check_strategy(name: str, value: T) -> T:
    if value is not None and not isinstance(value, st.SearchStrategy):
        raise InvalidArgument(
            f"{name}={value!r} must be a strategy or None; wrap a constant in st.just()"
        )
    return value


def _check_bool(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise InvalidArgument(f"{name}={value!r} must be a bool")
    return value


def _check_int(name: str, value: object, *, min_value: int, max_value: int | None = None) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidArgument(f"{name}={value!r} must be an int")
    if value < min_value:
        raise InvalidArgument(f"{name}={value} must be >= {min_value}")
    if max_value is not None and value > max_value:
        raise InvalidArgument(f"{name}={value} must be <= {max_value}")
    return value


def _bound(value: object) -> object:
    """A bound as ``st.integers`` takes it: a NumPy int or an integral float is its int."""
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _check_sizes(min_size: object, max_size: object, *, minimum: int) -> tuple[int, int]:
    low = _check_int("min_size", min_size, min_value=minimum)
    if low > MAX_MIN_SIZE:
        raise InvalidArgument(
            f"min_size={low} must be <= {MAX_MIN_SIZE}: Hypothesis cannot draw an example of "
            "that many requests (one of a few hundred needs HealthCheck.too_slow and "
            "HealthCheck.large_base_example suppressed)"
        )
    if max_size is None:
        return low, max(low, _DEFAULT_MAX_SIZE)
    high = _check_int("max_size", max_size, min_value=minimum)
    if low > high:
        raise InvalidArgument(f"min_size={low} must be <= max_size={high}")
    return low, high
