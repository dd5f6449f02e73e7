"""check_backend: the conformance check every backend runs, the reference one included.

What it proves
==============
That the backend computes the same final logits however a batch is chunked, paged, cached
and embedded -- the backend contract of :mod:`pypto_sched.backends`:

* **chunking invariance**: chunked final logits equal the one-shot ones (every prompt whole,
  in one dispatch, from an empty cache) within ``backend.tolerance``, under every policy,
  token budget, row cap, threshold and page alignment the examples draw;
* **cache discipline**: K/V written only at ``slot_mapping`` and read only through each row's
  block table up to ``seq_lens``: the tables are scattered and permuted (a request's pages
  are neither contiguous nor ascending), drawn from a pool with spare pages, every page is
  reused (it holds another prompt's stale K/V before the example runs; the first dispatch
  a cache sees has the narrowest block table, one page), page sizes vary
  and, whatever the size, prompts end near page boundaries and cross them, and every third
  example has prefix-cache hits filled by
  :func:`~pypto_sched.execute.write_prefixes`;
* **both embedding paths**: with ``input_embeddings=None`` the backend looks the ids up;
  with host embeddings it must use them and not the ids: the check hands it the embeddings
  (from ``backend.embed``) of *other* token ids and expects the logits of those other ids,
  so a backend that ignores the host path, or whose two paths disagree, fails;
* **the output contract**: exactly what was asked, for the final rows only, finite logits,
  greedy ids in the vocabulary (the driver, :func:`~pypto_sched.execute_schedule`, enforces
  this and names the dispatch); every greedy id agrees with the reference by the one
  verification rule (:func:`~pypto_sched.compare_results`: tie-aware, within twice the
  tolerance) and is an argmax of the logits returned with it; asked for greedy ids alone of
  NaN input embeddings, the backend raises rather than return ids (of logits the driver
  never sees);
* **inputs left alone**: the arrays a dispatch is handed are read-only by convention; a
  backend that changes them (after making them writeable) fails;
* **metadata**: ``name`` (and, given ``name=``, that it is the name the backend was
  registered under), ``tolerance``, ``vocab_size``, ``hidden_size`` and ``embed``'s shape;
* **generation** (``generation_examples``): greedy :func:`~pypto_sched.generate` of a drawn
  batch, under either policy, thresholds, row caps and page alignment, gives every request
  the tokens of one-shot recomputation: its generated token ``k`` is a greedy id of the
  one-shot prefill (one dispatch, the whole context, an empty cache) of its prompt and its
  first ``k`` generated tokens, by the same verification rule. Each token is checked against
  the context the backend itself generated, so a near-tie broken the other way (accepted by
  the rule) does not derail the tokens after it. Decode rows -- final one-token chunks at
  position ``context - 1``, placed before the dispatch's prefill chunks -- read their
  context through the backend's cache; pages are granted mid-generation as contexts grow;
  KV pools lie between the smallest that holds one request and room for all, and two
  examples in three take, among a few such sizes, one whose plan preempts by recomputation
  (when one does), so pages freed by a preempted or finished request are reused. The
  pool's pages are renamed to scattered pages of a larger cache whose every slot holds
  stale K/V.

What it does not prove
======================
**Model correctness.** A backend is compared with itself, so one that computes the wrong
model consistently (a wrong RoPE base, a missing norm) passes. Give an ``oracle`` -- a
function returning the last-token logits of whole prompts from an implementation you did
not write (transformers, the reference backend) -- and every example's one-shot logits are
also compared with it, which proves the model too, on those prompts. It also proves nothing
about speed, memory, sampling (the generation case is greedy) or host embeddings in
generation (the driver looks the ids up on the device).

Examples are drawn from a seeded NumPy generator, so no Hypothesis is needed and a failure
names the example (``seed`` and index) to reproduce it.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Iterator, Sequence
from typing import Any, cast

import attrs
import numpy as np
import numpy.typing as npt

from ..core._config import POLICIES, PlannerConfig, Policy
from ..core._errors import ExecutionError, InvalidConfigError, InvalidInputError
from ..core._generation import GenerationState, plan_generation_step
from ..core._pages import BlockTables
from ..core._plan import plan_one_shot, plan_prefill
from ..core._validate import check_callback, check_int, is_int, read_only
from ..runtime._generate import generate
from ..runtime._verify import Verification, compare_results, is_tolerance
from ..runtime.backends import (
    Backend,
    BackendError,
    DispatchInput,
    DispatchOutput,
    make_cache,
    max_positions,
    protocol_gaps,
    relative_tolerance,
)
from ..runtime.execute import (
    ExecutionResult,
    execute_schedule,
    execute_schedule_with_options,
    write_prefixes,
)

__all__ = ["check_backend"]

#: KV page sizes the examples draw from by default: one-token pages, odd and power-of-two sizes.
DEFAULT_PAGE_SIZES = (1, 2, 3, 4, 8, 16)
#: Generation examples run by default, after the prefill ones.
DEFAULT_GENERATION_EXAMPLES = 6
_MAX_REQUESTS = 8
#: Every fourth prefill example (the second of each four) draws up to this many prompts:
#: more rows a dispatch than a backend's small fixed-size buffers hold.
_MAX_WIDE_REQUESTS = 20
_MAX_PROMPT = 40
#: Every fourth prefill example (the fourth of each four) holds one prompt this long, at
#: most (positions past 255, where a narrow position type or a short RoPE table fails).
_LONG_PROMPT = (129, 320)
_MAX_GENERATION_REQUESTS = 4
_MAX_SPARE_PAGES = 3
_MAX_GENERATION_PROMPT = 24
_MAX_NEW_TOKENS = 6
#: Pool sizes tried when looking for one whose plan preempts.
_POOL_CANDIDATES = 8

Prompt = npt.NDArray[np.int64]

#: An oracle: given whole prompts, each one's last-token logits ``[num_prompts, vocab_size]``.
Oracle = Callable[[Sequence[Prompt]], npt.NDArray[np.floating[Any]]]


@attrs.frozen(kw_only=True, eq=False)
class _Example:
    """One drawn batch, how to plan and page it, and other ids for the host-embedding run."""

    prompts: tuple[Prompt, ...]
    #: Same lengths as ``prompts``, different ids: their embeddings are the host path's input.
    others: tuple[Prompt, ...]
    computed: tuple[int, ...]
    config: PlannerConfig
    page_size: int
    spare_pages: int

    @property
    def lengths(self) -> list[int]:
        return [prompt.size for prompt in self.prompts]

    def describe(self) -> str:
        return (
            f"prompt lengths {self.lengths}, computed tokens {list(self.computed)}, "
            f"page size {self.page_size}, {self.config}"
        )


@attrs.frozen(kw_only=True, eq=False)
class _GenerationExample:
    """One drawn generation: prompts, how many tokens each generates, the planner config
    and the KV pool."""

    prompts: tuple[Prompt, ...]
    max_new_tokens: tuple[int, ...]
    config: PlannerConfig
    page_size: int
    num_pages: int
    #: Preemptions the plan makes (it does not depend on the tokens: no stop tokens).
    num_preemptions: int

    def describe(self) -> str:
        return (
            f"prompt lengths {[prompt.size for prompt in self.prompts]}, max new tokens "
            f"{list(self.max_new_tokens)}, {self.num_pages} KV pages of {self.page_size} "
            f"({self.num_preemptions} preemptions planned), {self.config}"
        )


def check_backend(
    backend: Backend,
    *,
    max_examples: int = 20,
    generation_examples: int = DEFAULT_GENERATION_EXAMPLES,
    seed: int = 0,
    page_sizes: Sequence[int] = DEFAULT_PAGE_SIZES,
    name: str | None = None,
    oracle: Oracle | None = None,
    oracle_tolerance: float | None = None,
    oracle_relative_tolerance: float | None = None,
) -> None:
    """Check that ``backend`` keeps the :class:`~pypto_sched.backends.Backend` contract.

    Runs ``max_examples`` prefill examples, then ``generation_examples`` generation
    examples, drawn from ``seed``; each uses a KV page size drawn from ``page_sizes`` (pass
    the sizes your kernels accept, e.g. ``(128,)`` for Ascend's paged attention). Either
    count may be 0, not both. ``name``, when given, is the name the backend was registered
    (or loaded) under, and must be the one it declares. ``oracle``, when given, returns the
    last-token logits of whole prompts from an implementation you trust; each example's
    one-shot logits must equal its within ``oracle_tolerance`` and
    ``oracle_relative_tolerance`` (defaults: the backend's ``tolerance`` and
    ``relative_tolerance``, see :func:`~pypto_sched.compare_results`).

    Proves chunking invariance, cache discipline (scattered, permuted and reused pages,
    prefix hits), that the host-embedding path is honoured and agrees with the device one,
    the output contract, and that greedy generation (decode rows mixed with prefill chunks,
    pages granted as contexts grow, preemption by recomputation) gives the tokens of
    one-shot recomputation; **not** model correctness unless an ``oracle`` is given (see
    the module docstring). Raises :class:`AssertionError` (explicitly, so it works under
    ``python -O``) naming the example, the request, the position and the vocabulary column
    that differed (in generation, the request, the generated token's index and the
    position whose logits gave it); bad arguments raise
    :class:`~pypto_sched.InvalidInputError`.
    """
    for option, count in (
        ("max_examples", max_examples),
        ("generation_examples", generation_examples),
    ):
        if type(count) is not int or count < 0:
            raise InvalidInputError.about(option, f"must be an int >= 0: {count!r}")
    if max_examples + generation_examples == 0:
        raise InvalidInputError(
            "'max_examples' and 'generation_examples' must not both be 0: nothing would be checked"
        )
    sizes = tuple(page_sizes) if isinstance(page_sizes, Sequence) else ()
    if not sizes or any(type(size) is not int or size < 1 for size in sizes):
        raise InvalidInputError.about(
            "page_sizes", f"must be a non-empty sequence of ints >= 1: {page_sizes!r}"
        )
    if name is not None and not isinstance(name, str):
        raise InvalidInputError.about("name", f"must be a str or None: {name!r}")
    check_callback("oracle", oracle)
    seed = check_int("seed", seed, min_value=0, max_value=2**63 - 1)
    _check_metadata(backend, name)
    for option, value in (
        ("oracle_tolerance", oracle_tolerance),
        ("oracle_relative_tolerance", oracle_relative_tolerance),
    ):
        if value is not None and not is_tolerance(value):
            raise InvalidInputError.about(
                option, f"must be a finite real number >= 0 or None: {value!r}"
            )
    tolerance = Tolerance.of(backend)
    oracle_allows = Tolerance(
        tolerance.absolute if oracle_tolerance is None else float(oracle_tolerance),
        tolerance.relative
        if oracle_relative_tolerance is None
        else float(oracle_relative_tolerance),
    )
    longest = max_positions(backend)  # no example runs more positions than the model takes
    # The proxy's name is an instance property, not the ClassVar the protocol declares.
    watched = cast(Backend, _Watched(backend))
    rng = np.random.default_rng(seed)
    # The most a row of one-shot logits spans beyond twice its allowed difference, over the
    # examples (at most 0: any logits within it agree).
    excess = -np.inf
    for index in range(max_examples):
        example = _draw(
            rng,
            backend.vocab_size,
            policy=POLICIES[index % len(POLICIES)],
            prefix_hits=index % 3 == 2,
            page_sizes=sizes,
            longest=longest,
            wide=index % 4 == 1,
            long_prompt=index % 4 == 3,
        )
        where = f"backend {backend.name!r}, seed {seed}, example {index} ({example.describe()})"
        try:
            # Policies alternate every example, greedy-only host runs every two.
            excess = max(
                excess,
                _check_example(
                    watched, example, rng, where, tolerance, greedy_only=index // 2 % 2 == 1
                ),
            )
            if oracle is not None:
                _check_oracle(watched, example, oracle, oracle_allows, where)
        except BackendError as error:  # a dispatch that failed (ExecutionError) among them
            raise AssertionError(f"{where}: {error}") from error
    if max_examples and excess <= 0:
        # Logits within twice the allowed difference of each other all agree with any other
        # such row: a backend returning its row's midpoint, or any id, would pass.
        raise AssertionError(
            f"backend {backend.name!r}: {tolerance.describe()} allows at least half of what "
            f"a row of its logits spans (over {max_examples} examples): within it any logits "
            f"agree, so the check proved nothing; promise a tolerance well below that"
        )
    _check_refuses_non_finite(backend, sizes[0])
    for index in range(generation_examples):
        generation = _draw_generation(
            rng,
            backend.vocab_size,
            policy=POLICIES[index % len(POLICIES)],
            # Two examples in three look for a pool whose plan preempts.
            tight=index % 3 != 2,
            page_sizes=sizes,
            longest=longest,
        )
        where = (
            f"backend {backend.name!r}, seed {seed}, generation example {index} "
            f"({generation.describe()})"
        )
        try:
            _check_generation(watched, generation, rng, where, tolerance)
        except BackendError as error:  # a dispatch that failed (ExecutionError) among them
            raise AssertionError(f"{where}: {error}") from error


def _check_metadata(backend: Backend, name: str | None) -> None:
    gaps = protocol_gaps(backend)
    if gaps:
        raise AssertionError(
            f"{type(backend).__name__} does not implement the Backend protocol: {gaps}"
        )
    for attribute, expected, valid in _METADATA:
        value = getattr(backend, attribute)
        if not valid(value):
            raise AssertionError(
                f"backend.{attribute} must be {expected}: {value!r} ({type(value).__name__})"
            )
    relative = getattr(backend, "relative_tolerance", None)  # optional
    if relative is not None and not is_tolerance(relative):
        raise AssertionError(
            f"backend.relative_tolerance must be None or a finite real number >= 0: "
            f"{relative!r} ({type(relative).__name__})"
        )
    if name is not None and backend.name != name:
        raise AssertionError(
            f"backend registered as {name!r} declares name {backend.name!r}: the two must "
            f"be the same"
        )
    ids = np.arange(min(3, backend.vocab_size), dtype=np.int64)
    embedded = backend.embed(ids)
    if not isinstance(embedded, np.ndarray) or embedded.dtype.kind != "f":
        raise AssertionError(f"embed() must return a host float array: {embedded!r}")
    if embedded.shape != (ids.size, backend.hidden_size):
        raise AssertionError(
            f"embed() of {ids.size} ids must have shape ({ids.size}, {backend.hidden_size}): "
            f"{embedded.shape}"
        )


def _check_refuses_non_finite(backend: Backend, page_size: int) -> None:
    """Asked for greedy ids alone of NaN input embeddings, whose logits are NaN, the backend
    must raise rather than return ids: the driver never sees the logits behind them."""
    length = min(3, max_positions(backend) or 3)
    try:
        execute_schedule_with_options(
            plan_one_shot([length]),
            backend,
            [np.zeros(length, dtype=np.int64)],
            input_embeddings=[np.full((length, backend.hidden_size), np.nan)],
            return_logits=False,
            return_greedy=True,
            block_tables=None,
            page_size=page_size,
            cache=None,
            on_dispatch=None,
            names=None,
            finite_embeddings=False,  # (execute_schedule refuses them, as the caller's error)
        )
    except ExecutionError:
        return
    except BackendError as error:  # not a dispatch: the backend broke the contract before
        raise AssertionError(str(error)) from error
    raise AssertionError(
        f"backend {backend.name!r} returned greedy ids of NaN input embeddings: asked for "
        f"ids alone, it must check that its logits are finite and raise a BackendError if "
        f"not, the driver never seeing them (or it ignored the embeddings it was handed)"
    )


@attrs.frozen
class Tolerance:
    """A backend's promise: chunked and one-shot logits differ by at most ``absolute`` plus
    ``relative`` times the largest magnitude of the request's logits."""

    absolute: float
    relative: float

    @classmethod
    def of(cls, backend: Backend) -> Tolerance:
        return cls(float(backend.tolerance), relative_tolerance(backend))

    def compare(
        self,
        actual: ExecutionResult,
        expected: ExecutionResult | npt.NDArray[np.floating[Any]],
        *,
        prompt_lengths: Sequence[int],
        reference: str = "one-shot",
    ) -> Verification:
        """:func:`~pypto_sched.compare_results` within this tolerance."""
        return compare_results(
            actual,
            expected,
            tolerance=self.absolute,
            relative_tolerance=self.relative,
            reference=reference,
            prompt_lengths=prompt_lengths,
        )

    def describe(self) -> str:
        text = f"backend.tolerance {self.absolute:g}"
        if self.relative:
            text += f" + relative_tolerance {self.relative:g} x the largest |logit|"
        return text


#: Each metadata attribute, what it must be, and the test.
_METADATA: tuple[tuple[str, str, Callable[[Any], bool]], ...] = (
    ("name", "a non-empty str", lambda value: isinstance(value, str) and bool(value)),
    ("tolerance", "a finite real number >= 0 (an int too)", is_tolerance),
    ("vocab_size", "an int >= 1", lambda value: is_int(value) and value >= 1),
    ("hidden_size", "an int >= 1", lambda value: is_int(value) and value >= 1),
)


# -- drawing examples -----------------------------------------------------------------------


def _draw(
    rng: np.random.Generator,
    vocab_size: int,
    *,
    policy: Policy,
    prefix_hits: bool,
    page_sizes: tuple[int, ...],
    longest: int | None,
    wide: bool,
    long_prompt: bool,
) -> _Example:
    most = _MAX_WIDE_REQUESTS if wide else _MAX_REQUESTS
    count = int(rng.integers(most // 2 if wide else 1, most + 1))
    page_size = int(rng.choice(page_sizes))
    lengths = _prompt_lengths(rng, count, _MAX_PROMPT, page_size, longest)
    if long_prompt:
        long = int(rng.integers(_LONG_PROMPT[0], _LONG_PROMPT[1] + 1))
        lengths[int(rng.integers(0, count))] = long if longest is None else min(long, longest)
    prompts = tuple(rng.integers(0, vocab_size, size=int(n)).astype(np.int64) for n in lengths)
    others = tuple(rng.integers(0, vocab_size, size=int(n)).astype(np.int64) for n in lengths)
    computed = tuple(int(rng.integers(0, n)) for n in lengths) if prefix_hits else (0,) * count
    return _Example(
        prompts=prompts,
        others=others,
        computed=computed,
        config=_random_config(rng, policy, int(lengths.sum()), count, page_size),
        page_size=page_size,
        spare_pages=int(rng.integers(0, _MAX_SPARE_PAGES + 1)),
    )


def _prompt_lengths(
    rng: np.random.Generator, count: int, most: int, page_size: int, longest: int | None
) -> npt.NDArray[np.int64]:
    """``count`` prompt lengths of 1 to ``most`` tokens, none above ``longest`` (the model's
    positions, if it says). Where a page holds more than half of ``most``, such prompts would
    hardly ever cross a page boundary: so each in two is moved on by one or two pages less
    ``most // 2`` tokens, which puts it within ``most // 2`` tokens of a page boundary, on
    either side (a chunk, a prefix or a decode then ends near it or crosses it)."""
    lengths = rng.integers(1, most + 1, size=count)
    if page_size > most // 2:
        moved = lengths + rng.integers(1, 3, size=count) * page_size - most // 2
        lengths = np.where(rng.random(count) < 0.5, moved, lengths)
    return lengths if longest is None else np.minimum(lengths, longest)


def _random_config(
    rng: np.random.Generator, policy: Policy, total: int, count: int, page_size: int
) -> PlannerConfig:
    """A config that usually splits the batch: a budget below the total, an optional
    threshold, row cap, page alignment and (``packed``) partial-prefill limit."""
    budget = int(rng.integers(1, max(total // 2, 1) + 1))
    options: dict[str, Any] = {
        "max_num_batched_tokens": budget,
        "long_prefill_token_threshold": _maybe(rng, 1, budget),
        "max_num_seqs": _maybe(rng, 1, count),
        "policy": policy,
    }
    if policy == "packed":
        options["max_num_partial_prefills"] = _maybe(rng, 1, count)
    if rng.random() < 0.5:
        options["chunk_alignment"] = page_size  # chunks aligned to the KV pages
    try:
        return PlannerConfig(**options)
    except InvalidConfigError:  # the page is larger than the chunk cap: plan unaligned
        options["chunk_alignment"] = None
        return PlannerConfig(**options)


def _maybe(rng: np.random.Generator, low: int, high: int) -> int | None:
    return int(rng.integers(low, high + 1)) if rng.random() < 0.5 else None


def _scattered_tables(
    rng: np.random.Generator, lengths: Sequence[int], page_size: int, spare: int
) -> BlockTables:
    """Each request's pages drawn from a shuffled pool with ``spare`` pages left over, so a
    request's pages are neither contiguous nor ascending and some pages go unused."""
    needed = [-(-n // page_size) for n in lengths]
    num_pages = sum(needed) + spare
    pool = rng.permutation(num_pages).tolist()
    offsets = np.concatenate(([0], np.cumsum(needed))).tolist()
    tables = [pool[start:end] for start, end in itertools.pairwise(offsets)]
    return BlockTables.from_lists(tables, page_size=page_size, num_pages=num_pages)


def _draw_generation(
    rng: np.random.Generator,
    vocab_size: int,
    *,
    policy: Policy,
    tight: bool,
    page_sizes: tuple[int, ...],
    longest: int | None,
) -> _GenerationExample:
    """A small batch to generate for, with a pool between the smallest that holds every
    request alone and room for all; ``tight``: at least two requests that decode and, among
    a few pool sizes, one whose plan preempts (if any does)."""
    count = int(rng.integers(2 if tight else 1, _MAX_GENERATION_REQUESTS + 1))
    page_size = int(rng.choice(page_sizes))
    lengths = _prompt_lengths(rng, count, _MAX_GENERATION_PROMPT, page_size, longest)
    news = rng.integers(2 if tight else 1, _MAX_NEW_TOKENS + 1, size=count)
    if longest is not None:  # a request runs P + N - 1 positions
        news = np.maximum(np.minimum(news, longest - lengths + 1), 1)
    prompts = tuple(rng.integers(0, vocab_size, size=int(n)).astype(np.int64) for n in lengths)
    config = _random_config(rng, policy, int(lengths.sum()), count, page_size)
    # The last generated token is never cached: a request holds P + N - 1 tokens of KV.
    needed = [-(-int(n + m - 1) // page_size) for n, m in zip(lengths, news, strict=True)]
    smallest, room_for_all = max(needed), sum(needed)
    spread = np.linspace(smallest, room_for_all, _POOL_CANDIDATES).astype(int)
    candidates = np.unique(spread).tolist() if tight else []
    plans = {n: _planned_preemptions(lengths, news, config, n, page_size) for n in candidates}
    preempting = [size for size, preemptions in plans.items() if preemptions > 0]
    if preempting:
        num_pages = int(rng.choice(preempting))
    else:
        num_pages = int(rng.integers(smallest, room_for_all + 1))
    if num_pages not in plans:
        plans[num_pages] = _planned_preemptions(lengths, news, config, num_pages, page_size)
    return _GenerationExample(
        prompts=prompts,
        max_new_tokens=tuple(int(m) for m in news),
        config=config,
        page_size=page_size,
        num_pages=num_pages,
        num_preemptions=plans[num_pages],
    )


def _planned_preemptions(
    lengths: npt.NDArray[np.int64],
    news: npt.NDArray[np.int64],
    config: PlannerConfig,
    num_pages: int,
    page_size: int,
) -> int:
    """How often the generation's plan preempts: planning is pure and, without stop
    tokens, independent of the tokens, so this is what :func:`generate` will do."""
    state = GenerationState.from_prompt_lengths(
        lengths, max_new_tokens=news, num_pages=num_pages, page_size=page_size
    )
    preemptions = 0
    while state:
        step = plan_generation_step(state, config)
        preemptions += len(step.preempted)
        state = step.state
    return preemptions


# -- running and comparing ------------------------------------------------------------------


def _one_shot(backend: Backend, prompts: Sequence[Prompt], page_size: int) -> ExecutionResult:
    """Every prompt whole in one dispatch, from an empty cache: the reference."""
    lengths = [prompt.size for prompt in prompts]
    return execute_schedule(plan_one_shot(lengths), backend, prompts, page_size=page_size)


def _stale_cache(backend: Backend, rng: np.random.Generator, num_pages: int, page_size: int) -> Any:
    """A cache whose every slot holds K/V of some other prompt, as pages freed by one
    request and given to the next do in a server: random prompts over every page, in a
    shuffled order, each no longer than the model's positions."""
    cache = make_cache(backend, num_pages=num_pages, page_size=page_size)
    longest = max_positions(backend) or num_pages * page_size
    per_prompt = max(longest // page_size, 1)
    pages = rng.permutation(num_pages).tolist()
    # The first dispatch a cache sees holds one prompt of one page (the narrowest block
    # table): a backend that sizes per-cache buffers from it (a static table width, say)
    # then meets wider tables. The rest goes in one dispatch.
    first, rest = pages[:1], pages[1:]
    for group in ([first], [rest[i : i + per_prompt] for i in range(0, len(rest), per_prompt)]):
        if not group:
            continue
        lengths = [min(len(table) * page_size, longest) for table in group]
        junk = [rng.integers(0, backend.vocab_size, size=n).astype(np.int64) for n in lengths]
        execute_schedule(
            plan_one_shot(lengths),
            backend,
            junk,
            return_logits=False,
            block_tables=BlockTables.from_lists(group, page_size=page_size, num_pages=num_pages),
            cache=cache,
        )
    return cache


def _check_example(
    backend: Backend,
    example: _Example,
    rng: np.random.Generator,
    where: str,
    tolerance: Tolerance,
    *,
    greedy_only: bool,
) -> float:
    """Run ``example`` chunked, with device and with host embeddings, against one-shot runs;
    return the most a row of the device path's one-shot logits spans beyond twice its
    allowed difference."""
    lengths = example.lengths
    schedule = plan_prefill(lengths, example.config, num_computed_tokens=example.computed)
    runs = []
    for path in ("device", "host"):
        # The host run is handed the embeddings of other ids (with the example's ids as
        # token_ids): honouring them gives the other ids' logits, ignoring them does not.
        model_ids = example.others if path == "host" else example.prompts
        with _running(f"the one-shot run of the {path} path's ids"):
            expected = _one_shot(backend, model_ids, example.page_size)
        tables = _scattered_tables(rng, lengths, example.page_size, example.spare_pages)
        with _running("filling a cache with stale K/V"):
            cache = _stale_cache(backend, rng, tables.num_pages, tables.page_size)
        with _running("writing the prefix-cache hits"):
            write_prefixes(backend, model_ids, example.computed, block_tables=tables, cache=cache)
        runs.append((path, model_ids, expected, tables, cache))
    # Both caches are prepared before either runs: a backend that keeps state of its own
    # instead of in the cache it is handed mixes them up.
    for path, model_ids, expected, tables, cache in runs:
        host = path == "host"
        with _running(f"the chunked run, {path} embeddings"):
            chunked = execute_schedule(
                schedule,
                backend,
                example.prompts,
                input_embeddings=[backend.embed(ids) for ids in model_ids] if host else None,
                return_logits=not (greedy_only and host),
                return_greedy=True,
                block_tables=tables,
                cache=cache,
            )
        verification = tolerance.compare(chunked, expected, prompt_lengths=lengths)
        allowed = verification.allowed
        if not verification.passed:
            raise AssertionError(
                f"{where}, chunked over {schedule.num_dispatches} dispatches, {path} "
                f"embeddings, scattered block tables {_tables(tables)}: "
                f"{verification.first_problem()}"
            )
    logits = cast(npt.NDArray[np.floating[Any]], runs[0][2].logits)
    return float((logits.max(axis=1) - logits.min(axis=1) - 2 * allowed).max())


def _check_oracle(
    backend: Backend, example: _Example, oracle: Oracle, tolerance: Tolerance, where: str
) -> None:
    with _running("the one-shot run"):
        one_shot = _one_shot(backend, example.prompts, example.page_size)
    try:
        output = oracle(list(example.prompts))
    except Exception as error:  # whatever it raises is the oracle's failure, not the backend's
        raise AssertionError(
            f"{where}: the oracle failed, not the backend: {type(error).__name__}: {error}"
        ) from error
    try:
        expected = np.asarray(output)
    except ValueError:  # ragged rows
        expected = np.asarray(None)
    shape = (len(example.prompts), backend.vocab_size)
    if expected.shape != shape or expected.dtype.kind != "f":
        got = (
            f"shape {expected.shape}, dtype {expected.dtype}"
            if expected.dtype != object
            else f"{output!r:.80} ({type(output).__name__})"
        )
        raise AssertionError(
            f"{where}: the oracle's output is wrong, not the backend's: it must be float "
            f"logits of shape {shape}, one row per prompt and backend.vocab_size columns: {got}"
        )
    if not np.isfinite(expected).all():
        row, column = (int(i[0]) for i in np.nonzero(~np.isfinite(expected)))
        raise AssertionError(
            f"{where}: the oracle's output is wrong, not the backend's: its logits must be "
            f"finite: row {row}, column {column} is {expected[row, column]}"
        )
    verification = tolerance.compare(
        one_shot, expected, reference="the oracle", prompt_lengths=example.lengths
    )
    if not verification.passed:
        raise AssertionError(f"{where}, one-shot: {verification.first_problem()}")


def _check_generation(
    backend: Backend,
    example: _GenerationExample,
    rng: np.random.Generator,
    where: str,
    tolerance: Tolerance,
) -> None:
    """Greedy generation through the backend's cache must give, token by token, the greedy
    ids of one-shot prefills of the contexts it generated."""
    with _running("the generation"):
        result = generate(
            cast(Backend, _ReusedPages(backend, rng)),
            example.prompts,
            config=example.config,
            max_new_tokens=list(example.max_new_tokens),
            num_kv_pages=example.num_pages,
            kv_page_size=example.page_size,
        )
    # Row i of the one-shot run: request origins[i]'s context before its token origins[i].
    contexts: list[Prompt] = []
    origins: list[tuple[int, int]] = []
    for request, (prompt, sequence) in enumerate(
        zip(example.prompts, result.sequences, strict=True)
    ):
        for k in range(sequence.token_ids.size):
            contexts.append(np.concatenate([prompt, sequence.token_ids[:k]]))
            origins.append((request, k))
    lengths = [context.size for context in contexts]
    with _running("the one-shot recomputation of the generated contexts"):
        one_shot = execute_schedule(
            plan_one_shot(lengths),
            backend,
            contexts,
            page_size=example.page_size,
            return_logits=True,
            return_greedy=True,
        )
    generated = np.concatenate([sequence.token_ids for sequence in result.sequences])
    as_run = ExecutionResult(
        logits=None,
        greedy_token_ids=read_only(generated.astype(np.int64)),
        block_tables=one_shot.block_tables,
        cache=None,
    )
    verification = tolerance.compare(as_run, one_shot, prompt_lengths=lengths)
    agrees = verification.greedy_agrees
    if agrees is not None and not agrees.all():
        row = int(np.flatnonzero(~agrees)[0])
        request, k = origins[row]
        logits = cast(npt.NDArray[np.floating[Any]], one_shot.logits)[row]
        token, best = int(generated[row]), int(np.argmax(logits))
        stats = result.stats
        raise AssertionError(
            f"{where}, generated over {stats.num_dispatches} dispatches "
            f"({stats.num_mixed_dispatches} mixed, {stats.num_preemptions} preemptions): "
            f"generated token {k} of request {request}, {token}, from the logits at position "
            f"{lengths[row] - 1}, is not an argmax of the one-shot logits of its context "
            f"within {2 * float(verification.allowed[row]):.3g}: one-shot gives {best}, "
            f"{float(logits[best] - logits[token]):.3g} higher"
        )


@contextlib.contextmanager
def _running(what: str) -> Iterator[None]:
    """Name the run a backend failure comes from (the example runs several)."""
    try:
        yield
    except ExecutionError as error:
        raise ExecutionError(f"{what}: {error}", dispatch=error.dispatch) from error


def _tables(tables: BlockTables) -> str:
    return str([tables.table(r).tolist() for r in range(tables.num_requests)])


class _InputModifiedError(RuntimeError):
    """The backend changed an array of the batch it was handed."""


class _Wrapped:
    """A backend seen through a wrapper: its metadata, cache and embeddings forwarded."""

    def __init__(self, backend: Backend) -> None:
        self._backend = backend

    @property
    def name(self) -> str:
        return self._backend.name

    @property
    def tolerance(self) -> float:
        return self._backend.tolerance

    @property
    def relative_tolerance(self) -> float:
        return relative_tolerance(self._backend)

    @property
    def vocab_size(self) -> int:
        return self._backend.vocab_size

    @property
    def hidden_size(self) -> int:
        return self._backend.hidden_size

    @property
    def max_position_embeddings(self) -> int | None:
        return max_positions(self._backend)

    def new_cache(self, *, num_pages: int, page_size: int) -> Any:
        return self._backend.new_cache(num_pages=num_pages, page_size=page_size)

    def embed(self, token_ids: npt.NDArray[np.int64]) -> npt.NDArray[np.floating[Any]]:
        return self._backend.embed(token_ids)


class _Watched(_Wrapped):
    """``backend`` with every dispatch's inputs compared before and after it runs."""

    def embed(self, token_ids: npt.NDArray[np.int64]) -> npt.NDArray[np.floating[Any]]:
        return self._backend.embed(np.array(token_ids))

    def run_dispatch(self, batch: DispatchInput, cache: Any) -> DispatchOutput:
        before = _inputs(batch)
        output = self._backend.run_dispatch(batch, cache)
        for field, value in _inputs(batch).items():
            if not np.array_equal(value, before[field], equal_nan=value.dtype.kind == "f"):
                raise _InputModifiedError(
                    f"run_dispatch modified its input {field}; the arrays it is handed are "
                    f"read-only, copy one to change it"
                )
        return output


class _RenamedCache:
    """A backend's cache and where each page of the driver's pool lives in it."""

    def __init__(self, cache: Any, pages: npt.NDArray[np.int64]) -> None:
        self.cache = cache
        self.pages = pages


class _ReusedPages(_Wrapped):
    """``backend`` under :func:`generate`: the pool's pages renamed to scattered pages of a
    larger cache (spare pages included) whose every slot holds stale K/V, so that decode
    rows and pages granted mid-generation are neither contiguous, ascending nor fresh."""

    def __init__(self, backend: Backend, rng: np.random.Generator) -> None:
        super().__init__(backend)
        self._rng = rng

    def new_cache(self, *, num_pages: int, page_size: int) -> _RenamedCache:
        total = num_pages + int(self._rng.integers(0, _MAX_SPARE_PAGES + 1))
        cache = _stale_cache(self._backend, self._rng, total, page_size)
        return _RenamedCache(cache, self._rng.permutation(total)[:num_pages].astype(np.int64))

    def run_dispatch(self, batch: DispatchInput, cache: _RenamedCache) -> DispatchOutput:
        arrays = batch.arrays
        size, pages = arrays.page_size, cache.pages
        tables = arrays.block_tables
        slots = arrays.slot_mapping
        renamed = attrs.evolve(
            arrays,
            block_tables=read_only(
                np.where(tables >= 0, pages[np.maximum(tables, 0)], -1).astype(np.int32)
            ),
            slot_mapping=read_only(pages[slots // size] * size + slots % size),
        )
        return self._backend.run_dispatch(attrs.evolve(batch, arrays=renamed), cache.cache)


def _inputs(batch: DispatchInput) -> dict[str, npt.NDArray[Any]]:
    arrays = {
        f"batch.arrays.{field.name}": np.array(value)
        for field in attrs.fields(type(batch.arrays))
        if isinstance(value := getattr(batch.arrays, field.name), np.ndarray)
    }
    arrays["batch.token_ids"] = np.array(batch.token_ids)
    if batch.input_embeddings is not None:
        arrays["batch.input_embeddings"] = np.array(batch.input_embeddings)
    return arrays
