"""``generate`` on large batches: a default pool sized from what a step can use, a pool the
backend cannot allocate refused before any dispatch, and requests joining the planner state
as it runs (so that a million of them are not a million planner records at once).

(Step cost against the number waiting, and a million requests end to end, are measured by
``benchmarks/bench_scale.py``, not timed here.)
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import pytest

import pypto_sched.runtime._generate as generate_module
from pypto_sched import (
    DispatchDone,
    DispatchInput,
    DispatchOutput,
    InvalidConfigError,
    PlannerConfig,
    Policy,
    generate,
    load_backend,
    plan_generation_step,
)
from pypto_sched.runtime._generate import default_num_pages


class CountingBackend:
    """Computes nothing (greedy token 0); records the KV cache sizes asked for."""

    name: ClassVar[str] = "counting"
    tolerance = 0.0
    vocab_size = 64
    hidden_size = 8

    def __init__(self) -> None:
        self.caches: list[tuple[int, int]] = []

    def new_cache(self, *, num_pages: int, page_size: int) -> Any:
        self.caches.append((num_pages, page_size))
        return object()

    def embed(self, token_ids: Any) -> Any:
        return np.zeros((len(token_ids), self.hidden_size))

    def run_dispatch(self, batch: DispatchInput, cache: Any) -> DispatchOutput:
        return DispatchOutput(greedy_token_ids=np.zeros(batch.num_final_rows, dtype=np.int64))


@pytest.mark.parametrize(
    ("max_num_seqs", "pages"),
    [(None, 64), (8, 8)],
)
def test_the_default_pool_is_a_steps_rows_of_the_largest_request_not_the_batch(
    max_num_seqs: int | None, pages: int
) -> None:
    """5,000 one-token prompts got 5,000 pages (a million: 3.8 GiB of KV on the reference
    backend); a step runs at most 64 rows here, so 64 requests' pages are what it uses."""
    backend = CountingBackend()
    config = PlannerConfig(max_num_batched_tokens=64, max_num_seqs=max_num_seqs)
    result = generate(backend, np.ones((5000, 1), dtype=np.int64), config=config,
                      max_new_tokens=3)  # fmt: skip
    assert backend.caches == [(pages, 16)]
    assert result.stats.num_generated_tokens == 5000 * 3


def test_a_batch_of_fewer_requests_than_rows_gets_every_request_whole() -> None:
    lengths, news = [5, 40, 17], [3, 9, 1]
    config = PlannerConfig(max_num_batched_tokens=64)
    assert default_num_pages(lengths, news, config=config, page_size=4) == 2 + 12 + 5
    # one row a step: the largest request (48 tokens, 12 pages)
    config = PlannerConfig(max_num_batched_tokens=64, max_num_seqs=1)
    assert default_num_pages(lengths, news, config=config, page_size=4) == 12


def test_the_default_pool_gives_the_tokens_of_an_ample_one() -> None:
    backend = load_backend("reference")
    rng = np.random.default_rng(3)
    prompts = [rng.integers(0, 64, n).tolist() for n in rng.integers(1, 30, 40)]
    config = PlannerConfig(max_num_batched_tokens=16, max_num_seqs=4, policy="packed")
    small = generate(backend, prompts, config=config, max_new_tokens=5)
    ample = generate(backend, prompts, config=config, max_new_tokens=5, num_kv_pages=10_000)
    assert [s.token_ids.tolist() for s in small.sequences] == [
        s.token_ids.tolist() for s in ample.sequences
    ]


def test_a_pool_the_backend_cannot_allocate_is_a_config_error_before_any_dispatch() -> None:
    """The reference backend's cache of 2**31 - 1 pages (terabytes) fails to allocate: the
    error names ``num_kv_pages`` and says what to do, and nothing has run."""
    steps: list[DispatchDone] = []
    message = (
        r"^'num_kv_pages' must fit in memory: backend 'reference' cannot allocate a KV cache of "
        r"2,147,483,647 pages"
    )
    with pytest.raises(InvalidConfigError, match=message):
        generate(
            load_backend("reference"),
            [[1, 2, 3]],
            config=PlannerConfig(max_num_batched_tokens=8),
            max_new_tokens=2,
            num_kv_pages=2**31 - 1,
            on_dispatch=steps.append,
        )
    assert steps == []


def test_requests_beyond_the_admission_window_join_as_it_runs_with_the_same_tokens(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With a window of 4 (budget 1), 40 requests never sit in the planner state at once,
    and every request gets the tokens of a run that holds them all from the start."""
    backend = load_backend("reference")
    rng = np.random.default_rng(5)
    prompts = [rng.integers(0, 64, n).tolist() for n in rng.integers(1, 12, 40)]
    news = rng.integers(1, 6, 40).tolist()
    policies: list[Policy] = ["round_robin", "packed"]
    for policy in policies:
        config = PlannerConfig(max_num_batched_tokens=1, policy=policy)
        whole = generate(backend, prompts, config=config, max_new_tokens=news)
        sizes: list[int] = []

        def spying(
            state: Any,
            config: PlannerConfig,
            sizes: list[int] = sizes,
            real: Any = plan_generation_step,
        ) -> Any:
            sizes.append(len(state))
            return real(state, config)

        monkeypatch.setattr(generate_module, "MIN_ADMISSION_WINDOW", 4)
        monkeypatch.setattr(generate_module, "plan_generation_step", spying)
        done: list[DispatchDone] = []
        windowed = generate(backend, prompts, config=config, max_new_tokens=news,
                            on_dispatch=done.append)  # fmt: skip
        monkeypatch.undo()
        assert [s.token_ids.tolist() for s in windowed.sequences] == [
            s.token_ids.tolist() for s in whole.sequences
        ]
        assert max(sizes) < 40
        assert [d.num_finished for d in done] == sorted(d.num_finished for d in done)
        assert done[-1].num_finished == 40
