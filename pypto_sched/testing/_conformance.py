"""check_backend: the conformance check every backend runs, the reference one included.

Each example draws (from a seeded NumPy generator, so no Hypothesis is needed) a small batch
of prompts, a planner config under one of the policies (they alternate), a KV page size and,
every third example, prefix-cache hits. It then runs the batch three times:

1. one-shot: every prompt whole in one dispatch, from an empty cache, asking for logits;
2. chunked, the backend looking token ids up itself (``input_embeddings=None``), asking for
   logits and greedy ids;
3. chunked, with host embeddings from ``backend.embed``, asking for greedy ids and, on half
   the examples, logits too;

where a chunked run with prefix hits first fills each request's prefix in a dispatch that
asks for no output. It asserts that

* every dispatch returns exactly what was asked, for its final rows only, and nothing for a
  dispatch of intermediate chunks (the driver enforces the contract and names the dispatch
  that broke it);
* chunked final logits equal the one-shot ones within ``backend.tolerance``;
* every greedy id is an argmax of the logits returned with it, and of the one-shot logits up
  to twice the tolerance (both logits it compares may be off by the tolerance, so a near-tie
  may break either way).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs
import numpy as np
import numpy.typing as npt

from .._config import POLICIES, PlannerConfig, Policy
from .._errors import ExecutionError, InvalidConfigError, InvalidInputError
from .._pages import plan_pages
from .._policies import plan_prefill
from ..backends import Backend
from ..execute import ExecutionResult, execute_schedule, write_prefixes

__all__ = ["check_backend"]

#: KV page sizes the examples draw from by default: one-token pages, odd and power-of-two sizes.
DEFAULT_PAGE_SIZES = (1, 2, 3, 4, 8, 16)
_MAX_REQUESTS = 4
_MAX_PROMPT = 40

Prompt = npt.NDArray[np.int64]


@attrs.frozen(eq=False)
class _Example:
    """One drawn batch, and how to plan and page it."""

    prompts: tuple[Prompt, ...]
    computed: tuple[int, ...]
    config: PlannerConfig
    page_size: int

    @property
    def lengths(self) -> list[int]:
        return [prompt.size for prompt in self.prompts]

    def describe(self) -> str:
        return (
            f"prompt lengths {self.lengths}, computed tokens {list(self.computed)}, "
            f"page size {self.page_size}, {self.config}"
        )


def check_backend(
    backend: Backend,
    *,
    max_examples: int = 20,
    seed: int = 0,
    page_sizes: Sequence[int] = DEFAULT_PAGE_SIZES,
) -> None:
    """Check that ``backend`` keeps the :class:`~pypto_sched.backends.Backend` contract.

    Runs ``max_examples`` generated examples (see the module docstring) drawn from ``seed``;
    each uses a KV page size drawn from ``page_sizes`` (pass the sizes your kernels accept,
    e.g. ``(128, 256)`` for Ascend's paged attention). Raises :class:`AssertionError` naming
    the example and what differed.
    """
    _check_metadata(backend)
    if type(max_examples) is not int or max_examples < 1:
        raise InvalidInputError(f"'max_examples' must be an int >= 1: {max_examples!r}")
    sizes = tuple(page_sizes) if isinstance(page_sizes, Sequence) else ()
    if not sizes or any(type(size) is not int or size < 1 for size in sizes):
        raise InvalidInputError(
            f"'page_sizes' must be a non-empty sequence of ints >= 1: {page_sizes!r}"
        )
    rng = np.random.default_rng(seed)
    for index in range(max_examples):
        example = _draw(
            rng,
            backend.vocab_size,
            policy=POLICIES[index % len(POLICIES)],
            prefix_hits=index % 3 == 2,
            page_sizes=sizes,
        )
        where = f"backend {backend.name!r}, example {index} ({example.describe()})"
        try:
            # Policies alternate every example, greedy-only host runs every two.
            _check_example(backend, example, where, greedy_only=index // 2 % 2 == 1)
        except ExecutionError as error:
            raise AssertionError(f"{where}: {error}") from error


def _check_metadata(backend: Backend) -> None:
    assert isinstance(backend, Backend), (
        f"{type(backend).__name__} does not implement the Backend protocol"
    )
    problems = {
        "name": not (isinstance(backend.name, str) and backend.name),
        "tolerance": not (isinstance(backend.tolerance, float) and backend.tolerance >= 0),
        "vocab_size": not (isinstance(backend.vocab_size, int) and backend.vocab_size >= 1),
        "hidden_size": not (isinstance(backend.hidden_size, int) and backend.hidden_size >= 1),
    }
    for attribute, bad in problems.items():
        assert not bad, f"bad {attribute}: {getattr(backend, attribute)!r}"
    ids = np.arange(min(3, backend.vocab_size), dtype=np.int64)
    embedded = backend.embed(ids)
    shape = getattr(embedded, "shape", None)
    assert isinstance(embedded, np.ndarray), f"embed() must return a host array: {embedded!r}"
    assert shape == (ids.size, backend.hidden_size), (
        f"embed() of {ids.size} ids must have shape ({ids.size}, {backend.hidden_size}): {shape}"
    )


# -- drawing examples -----------------------------------------------------------------------


def _draw(
    rng: np.random.Generator,
    vocab_size: int,
    *,
    policy: Policy,
    prefix_hits: bool,
    page_sizes: tuple[int, ...],
) -> _Example:
    count = int(rng.integers(1, _MAX_REQUESTS + 1))
    lengths = rng.integers(1, _MAX_PROMPT + 1, size=count)
    prompts = tuple(rng.integers(0, vocab_size, size=int(n)).astype(np.int64) for n in lengths)
    computed = tuple(int(rng.integers(0, n)) for n in lengths) if prefix_hits else (0,) * count
    page_size = int(rng.choice(page_sizes))
    return _Example(
        prompts=prompts,
        computed=computed,
        config=_draw_config(rng, policy, int(lengths.sum()), count, page_size),
        page_size=page_size,
    )


def _draw_config(
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
        options["page_size"] = page_size
    try:
        return PlannerConfig(**options)
    except InvalidConfigError:  # the page is larger than the chunk cap: plan unaligned
        options["page_size"] = None
        return PlannerConfig(**options)


def _maybe(rng: np.random.Generator, low: int, high: int) -> int | None:
    return int(rng.integers(low, high + 1)) if rng.random() < 0.5 else None


# -- running and comparing ------------------------------------------------------------------


def _check_example(backend: Backend, example: _Example, where: str, *, greedy_only: bool) -> None:
    lengths = example.lengths
    tolerance = backend.tolerance
    one_shot = execute_schedule(
        plan_prefill(lengths, PlannerConfig(max_num_batched_tokens=sum(lengths))),
        backend,
        example.prompts,
        page_size=example.page_size,
    )
    schedule = plan_prefill(lengths, example.config, num_computed_tokens=example.computed)
    for path in ("device", "host"):
        host = path == "host"
        tables = plan_pages(
            lengths,
            page_size=example.page_size,
            num_pages=sum(-(-n // example.page_size) for n in lengths),
        )
        cache = backend.new_cache(num_pages=tables.num_pages, page_size=tables.page_size)
        write_prefixes(backend, example.prompts, example.computed, block_tables=tables, cache=cache)
        chunked = execute_schedule(
            schedule,
            backend,
            example.prompts,
            input_embeddings=[backend.embed(p) for p in example.prompts] if host else None,
            return_logits=not (greedy_only and host),
            return_greedy=True,
            block_tables=tables,
            cache=cache,
        )
        label = f"{where}, chunked over {schedule.num_dispatches} dispatches, {path} embeddings"
        if chunked.logits is not None:
            _check_logits(chunked, one_shot, tolerance, label)
        _check_greedy(chunked, one_shot, tolerance, label)


def _check_logits(
    result: ExecutionResult, expected: ExecutionResult, tolerance: float, where: str
) -> None:
    assert result.logits is not None
    assert expected.logits is not None
    assert result.logits.shape == expected.logits.shape, (
        f"{where}: logits shape {result.logits.shape} != one-shot {expected.logits.shape}"
    )
    difference = np.abs(result.logits.astype(np.float64) - expected.logits.astype(np.float64))
    worst = np.unravel_index(int(np.argmax(difference)), difference.shape)
    assert difference[worst] <= tolerance, (
        f"{where}: final logits of request {int(worst[0])} differ from one-shot by "
        f"{float(difference[worst]):.3g} > tolerance {tolerance:g} (token {int(worst[1])})"
    )


def _check_greedy(
    result: ExecutionResult, expected: ExecutionResult, tolerance: float, where: str
) -> None:
    assert result.greedy_token_ids is not None
    assert expected.logits is not None
    references = [("the one-shot logits", expected.logits, 2 * tolerance)]
    if result.logits is not None:
        references.append(("the logits returned with it", result.logits, 0.0))
    rows = np.arange(expected.logits.shape[0])
    for name, logits, slack in references:
        chosen = logits[rows, result.greedy_token_ids]
        short = chosen < logits.max(axis=1) - slack
        assert not short.any(), (
            f"{where}: greedy id {int(result.greedy_token_ids[short][0])} of request "
            f"{int(np.flatnonzero(short)[0])} is not an argmax of {name}"
        )
