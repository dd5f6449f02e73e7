"""The driver: execute_schedule runs every dispatch in order and keeps the backend contract.

The backend here is a stand-in whose "logits" are a position-weighted count of the tokens a
row's whole context holds, read back from its cache through the block tables: any mistake in
slots, tables, positions or gathering changes them, yet they do not depend on how the prompt
was chunked.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

import attrs
import numpy as np
import numpy.typing as npt
import pytest

from pypto_sched import (
    BlockTables,
    CacheTooSmallError,
    ExecutionError,
    InvalidInputError,
    PlannerConfig,
    SamplingParams,
    generate,
    plan_pages,
    plan_prefill,
)
from pypto_sched.backends import Backend, DispatchInput, DispatchOutput
from pypto_sched.execute import (
    DEFAULT_PAGE_SIZE,
    DispatchDone,
    ExecutionResult,
    execute_schedule,
    write_prefixes,
)

VOCAB = 11


class CountingBackend:
    """Caches token ids; a final row's logits weigh each context token by its position + 1."""

    name: ClassVar[str] = "counting"
    tolerance = 0.0
    vocab_size = VOCAB
    hidden_size = VOCAB

    def __init__(self) -> None:
        self.batches: list[DispatchInput] = []

    def new_cache(self, *, num_pages: int, page_size: int) -> npt.NDArray[np.int64]:
        return np.full(num_pages * page_size, -1, dtype=np.int64)

    def embed(self, token_ids: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
        return np.eye(VOCAB)[token_ids]

    def run_dispatch(self, batch: DispatchInput, cache: Any) -> DispatchOutput:
        self.batches.append(batch)
        arrays = batch.arrays
        ids = (
            batch.token_ids
            if batch.input_embeddings is None
            else np.argmax(batch.input_embeddings, axis=1)
        )
        cache[arrays.slot_mapping] = ids
        final_rows = np.flatnonzero(arrays.is_final)
        logits = np.array([self._row_logits(arrays, int(r), cache) for r in final_rows])
        logits = logits.reshape(final_rows.size, VOCAB)
        return DispatchOutput(
            logits=logits if batch.return_logits else None,
            greedy_token_ids=np.argmax(logits, axis=1) if batch.return_greedy else None,
        )

    @staticmethod
    def _row_logits(arrays: Any, row: int, cache: npt.NDArray[np.int64]) -> Any:
        context = int(arrays.seq_lens[row])
        page = arrays.page_size
        positions = np.arange(context)
        tokens = cache[arrays.block_tables[row][positions // page] * page + positions % page]
        assert (tokens >= 0).all(), "read a slot no dispatch wrote"
        return np.bincount(tokens, weights=positions + 1.0, minlength=VOCAB)


def expected_logits(prompt: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
    counts = np.bincount(prompt, weights=np.arange(prompt.size) + 1.0, minlength=VOCAB)
    return counts.astype(np.float64)


def prompts_of(lengths: list[int], seed: int = 0) -> list[npt.NDArray[np.int64]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, VOCAB, size=n) for n in lengths]


LENGTHS = [9, 3, 14, 6]
CHUNKED = PlannerConfig(max_num_batched_tokens=8, long_prefill_token_threshold=4)
PACKED = PlannerConfig(max_num_batched_tokens=8, long_prefill_token_threshold=4, policy="packed")


def test_the_stand_in_backend_implements_the_protocol() -> None:
    assert isinstance(CountingBackend(), Backend)


@pytest.mark.parametrize("config", [CHUNKED, PACKED], ids=["round_robin", "packed"])
@pytest.mark.parametrize("page_size", [1, 3, 16])
def test_final_logits_come_back_in_request_order(config: PlannerConfig, page_size: int) -> None:
    prompts = prompts_of(LENGTHS)
    result = execute_schedule(
        plan_prefill(LENGTHS, config), CountingBackend(), prompts, page_size=page_size
    )
    assert result.logits is not None
    np.testing.assert_array_equal(result.logits, [expected_logits(p) for p in prompts])


def test_every_dispatch_runs_once_in_order_with_its_own_tokens() -> None:
    backend, prompts = CountingBackend(), prompts_of(LENGTHS)
    schedule = plan_prefill(LENGTHS, CHUNKED)
    execute_schedule(schedule, backend, prompts)
    assert [b.arrays.index for b in backend.batches] == list(range(schedule.num_dispatches))
    for batch in backend.batches:
        arrays = batch.arrays
        expected = np.concatenate(
            [
                prompts[r][s:e]
                for r, s, e in zip(
                    arrays.requests, arrays.token_starts, arrays.token_ends, strict=True
                )
            ]
        )
        np.testing.assert_array_equal(batch.token_ids, expected)
        assert batch.input_embeddings is None


def test_only_dispatches_holding_a_final_chunk_are_asked_for_output() -> None:
    backend = CountingBackend()
    execute_schedule(
        plan_prefill(LENGTHS, CHUNKED), backend, prompts_of(LENGTHS), return_greedy=True
    )
    for batch in backend.batches:
        has_final = bool(batch.arrays.is_final.any())
        assert batch.return_logits is has_final
        assert batch.return_greedy is has_final
    assert any(not b.arrays.is_final.any() for b in backend.batches)


def test_greedy_ids_only_when_asked() -> None:
    prompts = prompts_of(LENGTHS)
    schedule = plan_prefill(LENGTHS, PACKED)
    plain = execute_schedule(schedule, CountingBackend(), prompts)
    assert plain.greedy_token_ids is None
    greedy = execute_schedule(schedule, CountingBackend(), prompts, return_greedy=True)
    assert greedy.greedy_token_ids is not None
    assert greedy.greedy_token_ids.dtype == np.int64
    np.testing.assert_array_equal(
        greedy.greedy_token_ids, [np.argmax(expected_logits(p)) for p in prompts]
    )


class Int32GreedyBackend(CountingBackend):
    """Returns its greedy ids as int32, which the contract allows (any integer dtype)."""

    def run_dispatch(self, batch: DispatchInput, cache: Any) -> DispatchOutput:
        output = super().run_dispatch(batch, cache)
        ids = output.greedy_token_ids
        return attrs.evolve(output, greedy_token_ids=None if ids is None else ids.astype(np.int32))


def test_greedy_ids_come_back_as_int64_whatever_the_backends_integer_dtype() -> None:
    prompts = prompts_of(LENGTHS)
    schedule = plan_prefill(LENGTHS, PACKED)
    ids = execute_schedule(schedule, Int32GreedyBackend(), prompts, return_greedy=True)
    assert ids.greedy_token_ids is not None
    assert ids.greedy_token_ids.dtype == np.int64
    np.testing.assert_array_equal(
        ids.greedy_token_ids, [np.argmax(expected_logits(p)) for p in prompts]
    )


def test_without_return_logits_no_logits_are_asked_for() -> None:
    backend = CountingBackend()
    result = execute_schedule(
        plan_prefill(LENGTHS, CHUNKED),
        backend,
        prompts_of(LENGTHS),
        return_logits=False,
        return_greedy=True,
    )
    assert result.logits is None
    assert result.greedy_token_ids is not None
    assert not any(b.return_logits for b in backend.batches)


def test_host_embeddings_reach_the_backend_with_the_token_ids() -> None:
    backend, prompts = CountingBackend(), prompts_of(LENGTHS)
    embeddings = [backend.embed(p) for p in prompts]
    result = execute_schedule(
        plan_prefill(LENGTHS, PACKED), backend, prompts, input_embeddings=embeddings
    )
    assert result.logits is not None
    np.testing.assert_array_equal(result.logits, [expected_logits(p) for p in prompts])
    for batch in backend.batches:
        assert batch.input_embeddings is not None
        np.testing.assert_array_equal(np.argmax(batch.input_embeddings, axis=1), batch.token_ids)


def test_prefix_hits_run_only_the_uncached_tokens_against_a_filled_cache() -> None:
    backend, prompts = CountingBackend(), prompts_of(LENGTHS)
    computed = [4, 0, 13, 5]
    tables = plan_pages(LENGTHS, page_size=4, num_pages=20)
    cache = backend.new_cache(num_pages=20, page_size=4)
    for r, prompt in enumerate(prompts):  # what a prefix cache would hold
        positions = np.arange(computed[r])
        cache[tables.table(r)[positions // 4] * 4 + positions % 4] = prompt[: computed[r]]
    schedule = plan_prefill(LENGTHS, CHUNKED, num_computed_tokens=computed)
    result = execute_schedule(schedule, backend, prompts, block_tables=tables, cache=cache)
    assert result.logits is not None
    np.testing.assert_array_equal(result.logits, [expected_logits(p) for p in prompts])
    assert sum(b.arrays.num_tokens for b in backend.batches) == sum(LENGTHS) - sum(computed)
    assert result.cache is cache
    assert result.block_tables is tables


def test_results_are_read_only() -> None:
    result = execute_schedule(
        plan_prefill(LENGTHS, CHUNKED), CountingBackend(), prompts_of(LENGTHS), return_greedy=True
    )
    assert isinstance(result, ExecutionResult)
    assert result.logits is not None
    assert result.greedy_token_ids is not None
    assert not result.logits.flags.writeable
    assert not result.greedy_token_ids.flags.writeable


def test_on_dispatch_reports_each_dispatch_after_it_ran_in_order() -> None:
    backend, prompts = CountingBackend(), prompts_of(LENGTHS)
    schedule = plan_prefill(LENGTHS, CHUNKED)
    seen: list[tuple[DispatchDone, int]] = []
    execute_schedule(
        schedule,
        backend,
        prompts,
        on_dispatch=lambda done: seen.append((done, len(backend.batches))),
    )
    assert [done for done, _ in seen] == [
        DispatchDone(
            index=d.index,
            num_rows=d.num_rows,
            num_tokens=d.num_tokens,
            num_decode_rows=0,
            num_finished=int((schedule.finish_dispatch <= d.index).sum()),
            num_requests=len(LENGTHS),
            num_generated_tokens=0,
            num_dispatches=schedule.num_dispatches,
        )
        for d in schedule.dispatches
    ]
    assert [ran for _, ran in seen] == list(range(1, schedule.num_dispatches + 1))
    assert [done.fraction for done, _ in seen] == [
        (i + 1) / schedule.num_dispatches for i in range(schedule.num_dispatches)
    ]
    assert seen[-1][0].num_finished == len(LENGTHS)


def test_an_exception_from_on_dispatch_stops_the_run_unchanged() -> None:
    backend = CountingBackend()

    def stop(done: DispatchDone) -> None:
        if done.index == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        execute_schedule(
            plan_prefill(LENGTHS, CHUNKED), backend, prompts_of(LENGTHS), on_dispatch=stop
        )
    assert len(backend.batches) == 3


# -- pages ---------------------------------------------------------------------------------


def test_pages_are_planned_at_the_config_page_size_else_the_default() -> None:
    aligned = PlannerConfig(max_num_batched_tokens=8, chunk_alignment=4)
    prompts = prompts_of(LENGTHS)
    assert (
        execute_schedule(
            plan_prefill(LENGTHS, aligned), CountingBackend(), prompts
        ).block_tables.page_size
        == 4
    )
    assert (
        execute_schedule(
            plan_prefill(LENGTHS, CHUNKED), CountingBackend(), prompts
        ).block_tables.page_size
        == DEFAULT_PAGE_SIZE
    )


def test_a_page_size_contradicting_the_block_tables_is_rejected() -> None:
    tables = plan_pages(LENGTHS, page_size=4, num_pages=20)
    with pytest.raises(InvalidInputError, match="'page_size' must match"):
        execute_schedule(
            plan_prefill(LENGTHS, CHUNKED),
            CountingBackend(),
            prompts_of(LENGTHS),
            block_tables=tables,
            page_size=8,
        )


def test_block_tables_too_small_for_a_prompt_fail_before_any_dispatch() -> None:
    backend = CountingBackend()
    tables = plan_pages([9, 3, 12, 6], page_size=4, num_pages=20)
    with pytest.raises(CacheTooSmallError, match="request 2 has 14 tokens"):
        execute_schedule(
            plan_prefill(LENGTHS, CHUNKED), backend, prompts_of(LENGTHS), block_tables=tables
        )
    assert backend.batches == []


def test_block_tables_one_token_short_fail_before_any_dispatch() -> None:
    backend = CountingBackend()
    tables = BlockTables.from_lists([[0, 1]], page_size=2, num_pages=3)  # 4 of 5 tokens
    with pytest.raises(CacheTooSmallError, match="must hold every prompt"):
        execute_schedule(plan_prefill([5], CHUNKED), backend, prompts_of([5]), block_tables=tables)
    assert backend.batches == []


def test_block_tables_for_another_number_of_requests_are_refused() -> None:
    tables = plan_pages([4, 4], page_size=4, num_pages=2)
    with pytest.raises(InvalidInputError, match="one table per request"):
        execute_schedule(
            plan_prefill([4], CHUNKED), CountingBackend(), prompts_of([4]), block_tables=tables
        )


# -- failures --------------------------------------------------------------------------------


class FailingBackend(CountingBackend):
    """Fails on one dispatch."""

    def __init__(self, fail_at: int) -> None:
        super().__init__()
        self.fail_at = fail_at

    def run_dispatch(self, batch: DispatchInput, cache: Any) -> DispatchOutput:
        if batch.arrays.index == self.fail_at:
            raise RuntimeError("device lost")
        return super().run_dispatch(batch, cache)


def test_a_backend_failure_names_the_dispatch_and_yields_no_result() -> None:
    schedule = plan_prefill(LENGTHS, CHUNKED)
    backend = FailingBackend(fail_at=5)
    with pytest.raises(ExecutionError, match=r"dispatch 5 of \d+ \(request \d+ tokens") as info:
        execute_schedule(schedule, backend, prompts_of(LENGTHS))
    assert info.value.dispatch == 5
    assert isinstance(info.value.__cause__, RuntimeError)
    assert "RuntimeError: device lost" in str(info.value)
    assert len(backend.batches) == 5  # nothing ran after the failure


class AllRowsBackend(CountingBackend):
    """Breaks the contract: returns logits for every row, not only the final ones."""

    def run_dispatch(self, batch: DispatchInput, cache: Any) -> DispatchOutput:
        super().run_dispatch(batch, cache)
        return DispatchOutput(logits=np.zeros((batch.arrays.num_rows, VOCAB)))


class UnaskedGreedyBackend(CountingBackend):
    """Breaks the contract: returns greedy ids nobody asked for."""

    def run_dispatch(self, batch: DispatchInput, cache: Any) -> DispatchOutput:
        output = super().run_dispatch(batch, cache)
        rows = batch.num_final_rows
        return DispatchOutput(logits=output.logits, greedy_token_ids=np.zeros(rows, np.int64))


@pytest.mark.parametrize(
    ("backend", "problem"),
    [
        (AllRowsBackend(), "logits must be a host float array of shape"),
        (UnaskedGreedyBackend(), "greedy_token_ids must be None when not asked for"),
    ],
)
def test_an_output_breaking_the_contract_is_an_execution_error(
    backend: CountingBackend, problem: str
) -> None:
    # Packed rows mix final and intermediate chunks in one dispatch.
    with pytest.raises(ExecutionError, match=problem):
        execute_schedule(plan_prefill(LENGTHS, PACKED), backend, prompts_of(LENGTHS))


class WrongDtypeBackend(CountingBackend):
    """Breaks the contract: float greedy ids, or integer logits."""

    def __init__(self, what: str) -> None:
        super().__init__()
        self.what = what

    def run_dispatch(self, batch: DispatchInput, cache: Any) -> DispatchOutput:
        output = super().run_dispatch(batch, cache)
        if self.what == "greedy" and output.greedy_token_ids is not None:
            greedy: Any = output.greedy_token_ids.astype(np.float64)
            return DispatchOutput(logits=output.logits, greedy_token_ids=greedy)
        if self.what == "logits" and output.logits is not None:
            return DispatchOutput(logits=output.logits.astype(np.int64))
        return output


@pytest.mark.parametrize(
    ("what", "problem"),
    [
        (
            "greedy",
            r"greedy_token_ids must be a host integer array of shape \(1,\), one row per final "
            r"row: shape \(1,\), dtype float64$",
        ),
        (
            "logits",
            rf"logits must be a host float array of shape \(1, {VOCAB}\), one row per final "
            rf"row: shape \(1, {VOCAB}\), dtype int64$",
        ),
    ],
)
def test_an_output_of_the_wrong_dtype_names_the_dtype_expected(what: str, problem: str) -> None:
    with pytest.raises(ExecutionError, match=problem):
        execute_schedule(
            plan_prefill([5], CHUNKED),
            WrongDtypeBackend(what),
            prompts_of([5]),
            return_greedy=what == "greedy",
        )


class SpoiledRowBackend(CountingBackend):
    """Spoils one final row's output: a NaN logit, or a greedy id outside the vocabulary."""

    def __init__(self, what: str) -> None:
        super().__init__()
        self.what = what

    def run_dispatch(self, batch: DispatchInput, cache: Any) -> DispatchOutput:
        output = super().run_dispatch(batch, cache)
        if batch.arrays.index != 3 or output.logits is None or output.greedy_token_ids is None:
            return output
        logits, greedy = output.logits.copy(), output.greedy_token_ids.copy()
        if self.what == "nan":
            logits[-1, 7] = np.nan
        elif self.what == "inf":
            logits[0, 2] = -np.inf
        else:
            greedy[-1] = VOCAB if self.what == "high" else -1
        return DispatchOutput(logits=logits, greedy_token_ids=greedy)


@pytest.mark.parametrize(
    ("what", "problem"),
    [
        (
            "nan",
            r"logits must be finite: final row \d+ \(request \d+\) has nan at vocabulary "
            r"column 7",
        ),
        (
            "inf",
            r"logits must be finite: final row 0 \(request \d+\) has -inf at vocabulary "
            r"column 2",
        ),
        (
            "high",
            r"greedy_token_ids must be in \[0, 11\), the vocabulary: final row \d+ "
            r"\(request \d+\) has 11",
        ),
        ("negative", r"greedy_token_ids must be in \[0, 11\).*has -1"),
    ],
)
def test_non_finite_logits_and_ids_outside_the_vocabulary_are_execution_errors(
    what: str, problem: str
) -> None:
    schedule = plan_prefill(LENGTHS, PACKED)
    assert schedule.dispatches[3].is_final.any()
    with pytest.raises(ExecutionError, match=r"dispatch 3 of \d+ .*" + problem) as info:
        execute_schedule(schedule, SpoiledRowBackend(what), prompts_of(LENGTHS), return_greedy=True)
    assert info.value.dispatch == 3


def test_final_rows_are_named_by_their_request() -> None:
    schedule = plan_prefill(LENGTHS, PACKED)
    finals = schedule.dispatches[3].requests[schedule.dispatches[3].is_final]
    with pytest.raises(ExecutionError) as info:
        execute_schedule(
            schedule, SpoiledRowBackend("nan"), prompts_of(LENGTHS), return_greedy=True
        )
    assert f"final row {finals.size - 1} (request {int(finals[-1])})" in str(info.value)


def test_a_schedule_with_cached_prefixes_needs_a_cache_from_the_caller() -> None:
    backend = CountingBackend()
    schedule = plan_prefill(LENGTHS, CHUNKED, num_computed_tokens=[0, 2, 0, 0])
    with pytest.raises(
        InvalidInputError,
        match=r"'cache' must be given when the schedule has cached prefixes: request 1 has "
        r"num_computed_tokens 2.*fill one with write_prefixes",
    ):
        execute_schedule(schedule, backend, prompts_of(LENGTHS))
    assert backend.batches == []


def test_write_prefixes_then_execute_equals_the_whole_prompts() -> None:
    backend, prompts = CountingBackend(), prompts_of(LENGTHS)
    computed = [4, 0, 13, 5]
    tables = plan_pages(LENGTHS, page_size=3, num_pages=20)
    cache = backend.new_cache(num_pages=20, page_size=3)
    write_prefixes(backend, prompts, computed, block_tables=tables, cache=cache)
    assert [b.arrays.num_tokens for b in backend.batches] == [sum(computed)]  # one dispatch
    schedule = plan_prefill(LENGTHS, CHUNKED, num_computed_tokens=computed)
    result = execute_schedule(schedule, backend, prompts, block_tables=tables, cache=cache)
    assert result.logits is not None
    np.testing.assert_array_equal(result.logits, [expected_logits(p) for p in prompts])


@pytest.mark.parametrize(
    ("computed", "message"),
    [
        ([4, 0, 13], "'num_computed_tokens' must have one entry per prompt (4): 3 entries"),
        ([-1, 0, 0, 0], "'num_computed_tokens' values must be in [0, 2147483647]: item 0 is -1"),
        ([4.9, 0, 0, 0], "'num_computed_tokens' must hold ints: item 0 is 4.9 (float)"),
        ([0, LENGTHS[1] + 10, 0, 0], f"item 1 is {LENGTHS[1] + 10} for length {LENGTHS[1]}"),
        ([0, 0, LENGTHS[2], 0], f"item 2 is {LENGTHS[2]} for length {LENGTHS[2]}"),
    ],
)
def test_write_prefixes_checks_num_computed_tokens_as_plan_prefill_does(
    computed: list[Any], message: str
) -> None:
    backend = CountingBackend()
    tables = plan_pages(LENGTHS, page_size=3, num_pages=40)
    cache = backend.new_cache(num_pages=40, page_size=3)
    with pytest.raises(InvalidInputError, match=re.escape(message)):
        write_prefixes(backend, prompts_of(LENGTHS), computed, block_tables=tables, cache=cache)
    with pytest.raises(InvalidInputError, match=re.escape(message)):
        plan_prefill(LENGTHS, CHUNKED, num_computed_tokens=computed)
    assert backend.batches == []


# -- inputs ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("token_ids", "message"),
    [
        ([[1, 2]], r"'token_ids' must hold one entry per request \(4\): 1 entries"),
        ([[1] * 9, [1] * 3, [1] * 13, [1] * 6], r"'token_ids\[2\]' must cover the whole prompt"),
        ([[1] * 9, [1] * 3, [1] * 15, [1] * 6], r"'token_ids\[2\]' must cover the whole prompt"),
        ([[1] * 9, [1] * 3, [VOCAB] * 14, [1] * 6], r"values must be in \[0, 11\).*: 11"),
        ([[1.5] * 9, [1] * 3, [1] * 14, [1] * 6], r"'token_ids\[0\]' must hold ints: item 0 "),
        ("abcd", "'token_ids' must hold one entry per request"),
    ],
)
def test_bad_token_ids_are_rejected(token_ids: Any, message: str) -> None:
    with pytest.raises(InvalidInputError, match=message):
        execute_schedule(plan_prefill(LENGTHS, CHUNKED), CountingBackend(), token_ids)


def test_bad_embeddings_are_rejected() -> None:
    prompts = prompts_of(LENGTHS)
    embeddings = [np.zeros((n, VOCAB - 1)) for n in LENGTHS]
    with pytest.raises(InvalidInputError, match=r"'input_embeddings\[0\]' must be a float"):
        execute_schedule(
            plan_prefill(LENGTHS, CHUNKED), CountingBackend(), prompts, input_embeddings=embeddings
        )


def test_the_schedule_and_backend_are_checked() -> None:
    schedule = plan_prefill(LENGTHS, CHUNKED)
    with pytest.raises(InvalidInputError, match="'schedule' must be a Schedule"):
        execute_schedule(schedule.to_dict(), CountingBackend(), prompts_of(LENGTHS))  # type: ignore[arg-type]
    with pytest.raises(
        InvalidInputError,
        match=r"^'backend' must implement the Backend protocol: object \(it has no name, "
        r"tolerance, vocab_size, hidden_size, new_cache, embed, run_dispatch\)$",
    ):
        execute_schedule(schedule, object(), prompts_of(LENGTHS))  # type: ignore[arg-type]


def test_an_on_dispatch_that_is_not_callable_is_refused_before_anything_runs() -> None:
    backend = CountingBackend()
    with pytest.raises(InvalidInputError, match=r"^'on_dispatch' must be callable or None: 5 "):
        execute_schedule(
            plan_prefill(LENGTHS, CHUNKED),
            backend,
            prompts_of(LENGTHS),
            on_dispatch=5,  # type: ignore[arg-type]
        )
    assert backend.batches == []


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"stop_token_ids": 5},
            r"^'stop_token_ids' must be a collection of token ids \(ints >= 0\): 5 \(int\)$",
        ),
        (
            {"stop_token_ids": "5"},
            r"^'stop_token_ids' must be a collection of token ids .*: '5' \(str\)$",
        ),
        (
            {"request_stop_token_ids": [5]},
            r"^'request_stop_token_ids\[0\]' must be a collection of token ids .*: 5 \(int\)$",
        ),
        (
            {"request_stop_token_ids": 5},
            r"^'request_stop_token_ids' must be None or one collection of token ids per "
            r"prompt: 5 \(int\)$",
        ),
        (
            {"stop_token_ids": np.array(3)},
            r"^'stop_token_ids' must be a collection of token ids .*: array\(3\) \(ndarray\)$",
        ),
        (
            {"request_stop_token_ids": [np.array(3)]},
            r"^'request_stop_token_ids\[0\]' must be a collection of token ids .*\(ndarray\)$",
        ),
        ({"on_dispatch": 5}, r"^'on_dispatch' must be callable or None: 5 \(int\)$"),
        (
            {"stop_token_ids": {3: 1}},
            r"^'stop_token_ids' must be a collection of token ids .*: \{3: 1\} \(dict\)$",
        ),
        (
            {"stop_token_ids": [3, VOCAB]},
            rf"^'stop_token_ids' values must be in \[0, {VOCAB}\), the backend's vocabulary: "
            rf"{VOCAB}$",
        ),
        (
            {"request_stop_token_ids": [[10**6]]},
            r"^'request_stop_token_ids\[0\]' values must be in \[0, \d+\), the backend's "
            r"vocabulary: 1000000$",
        ),
    ],
)
def test_bad_generate_options_are_refused_before_anything_runs(
    options: dict[str, Any], message: str
) -> None:
    backend = CountingBackend()
    with pytest.raises(InvalidInputError, match=message):
        generate(backend, [[1, 2]], config=CHUNKED, max_new_tokens=2, **options)
    assert backend.batches == []


def test_generate_takes_a_2d_array_as_one_prompt_per_row() -> None:
    prompts = np.array([[1, 2, 3], [4, 5, 6]], dtype=np.int32)
    rows = generate(CountingBackend(), prompts, config=CHUNKED, max_new_tokens=2)
    lists = generate(CountingBackend(), prompts.tolist(), config=CHUNKED, max_new_tokens=2)
    assert [s.token_ids.tolist() for s in rows.sequences] == [
        s.token_ids.tolist() for s in lists.sequences
    ]


@pytest.mark.parametrize(
    ("prompts", "message"),
    [
        (np.array([1, 2, 3]), r"or a 2-D array of one per row: ndarray of shape \(3,\)$"),
        (np.zeros((0, 3), dtype=np.int64), r"one per row: ndarray of shape \(0, 3\)$"),
        (np.array([[1.0, 2.0]]), r"^'prompts\[0\]' must be a 1-D sequence of ints: .*float64$"),
    ],
)
def test_generate_names_prompts_that_are_not_token_id_arrays(prompts: Any, message: str) -> None:
    with pytest.raises(InvalidInputError, match=message):
        generate(CountingBackend(), prompts, config=CHUNKED, max_new_tokens=2)


def test_generate_refuses_a_request_index_given_twice_before_anything_runs() -> None:
    backend = CountingBackend()
    with pytest.raises(
        InvalidInputError, match=r"^'request_indices' must be distinct: item 2 is 7, as is item 0$"
    ):
        generate(backend, [[1], [2], [3]], config=CHUNKED, max_new_tokens=2,
                 sampling=SamplingParams(temperature=1.0), request_indices=[7, 3, 7])  # fmt: skip
    assert backend.batches == []
    generate(backend, [[1], [2], [3]], config=CHUNKED, max_new_tokens=2, request_indices=[7, 3, 0])


class ShortModelBackend(CountingBackend):
    """A model of 8 positions."""

    max_position_embeddings = 8


def test_a_prompt_longer_than_the_model_is_refused_before_anything_runs() -> None:
    backend = ShortModelBackend()
    with pytest.raises(
        InvalidInputError,
        match=r"^'token_ids\[2\]': a prompt of 14 tokens runs 14 positions, more than the "
        r"model's 8 \(max_position_embeddings\)$",
    ):
        execute_schedule(plan_prefill([8, 3, 14], CHUNKED), backend, prompts_of([8, 3, 14]))
    assert backend.batches == []
    execute_schedule(plan_prefill([8, 3], CHUNKED), backend, prompts_of([8, 3]))  # they fit


def test_generate_refuses_a_prompt_and_new_tokens_longer_than_the_model() -> None:
    backend = ShortModelBackend()
    with pytest.raises(
        InvalidInputError,
        match=r"^'prompts\[1\]': a prompt of 6 tokens and 4 new tokens runs 9 positions, more "
        r"than the model's 8 \(max_position_embeddings\)$",
    ):
        generate(backend, [[1] * 4, [1] * 6], config=CHUNKED, max_new_tokens=[5, 4])
    assert backend.batches == []
    generate(backend, [[1] * 4, [1] * 6], config=CHUNKED, max_new_tokens=[5, 3])  # 8 fit


@pytest.mark.parametrize(
    "max_new_tokens", [np.array([3, 2]), np.array([3, 2], dtype=np.uint8), [np.int64(3), 2]]
)
def test_generate_takes_one_max_new_tokens_per_prompt_as_an_array(max_new_tokens: Any) -> None:
    result = generate(
        CountingBackend(), [[1, 2], [3]], config=CHUNKED, max_new_tokens=max_new_tokens
    )
    assert [len(s.token_ids) for s in result.sequences] == [3, 2]


@pytest.mark.parametrize(
    ("max_new_tokens", "message"),
    [
        (np.array([3, 2, 1]), r"^'max_new_tokens' must be an int or one int per prompt \(2\)"),
        (np.array([[3, 2]]), r"^'max_new_tokens' must be an int or one int per prompt \(2\)"),
        (np.array([3.0, 2.0]), r"^'max_new_tokens\[0\]' must be an int: 3\.0 \(float\)$"),
        (np.array([3, 0]), r"^'max_new_tokens\[1\]' must be >= 1: 0$"),
    ],
)
def test_a_bad_max_new_tokens_array_is_named(max_new_tokens: Any, message: str) -> None:
    with pytest.raises(InvalidInputError, match=message):
        generate(CountingBackend(), [[1, 2], [3]], config=CHUNKED, max_new_tokens=max_new_tokens)


class FaultyBackend(CountingBackend):
    """Fails its fourth dispatch, as a device would."""

    def run_dispatch(self, batch: DispatchInput, cache: Any) -> DispatchOutput:
        if batch.arrays.index == 3:
            raise RuntimeError("device fault")
        return super().run_dispatch(batch, cache)


def test_a_backend_error_in_generation_names_requests_by_their_request_indices() -> None:
    # A part of a batch (Ray's) passes its requests' indices in the batch: an error names
    # the requests as a one-device run of the whole batch would.
    prompts = prompts_of(LENGTHS)
    with pytest.raises(ExecutionError, match="device fault") as plain:
        generate(FaultyBackend(), prompts, config=CHUNKED, max_new_tokens=3)
    with pytest.raises(ExecutionError, match="device fault") as indexed:
        generate(
            FaultyBackend(),
            prompts,
            config=CHUNKED,
            max_new_tokens=3,
            request_indices=[20 + r for r in range(len(prompts))],
        )
    named = re.findall(r"request (\d+) tokens", str(plain.value))
    assert named
    assert re.findall(r"request (\d+) tokens", str(indexed.value)) == [
        str(20 + int(r)) for r in named
    ]


def test_an_execution_error_pickles_with_its_cause() -> None:
    """Sent from a worker process (a Ray actor), the error keeps its dispatch and its cause,
    or the cause's text when the cause itself does not pickle."""
    import pickle
    import threading

    class Unpicklable(RuntimeError):
        def __init__(self) -> None:
            super().__init__("device fault")
            self.lock = threading.Lock()

    import attrs

    @attrs.frozen
    class Frozen:
        x: int = 0

    try:
        Frozen().x = 1  # type: ignore[misc]
    except attrs.exceptions.FrozenInstanceError as frozen:
        # Pickles, but fails to unpickle (its __init__ takes no message): the receiver (a
        # Ray driver) got no error at all, and printed a traceback of Ray's.
        unreadable: BaseException = frozen

    try:  # attrs before 24 unpickles it: then it is kept as it is
        unreadable_want = repr(pickle.loads(pickle.dumps(unreadable)))
    except Exception:
        unreadable_want = 'RuntimeError("FrozenInstanceError: can\'t set attribute")'
    for cause, want in [
        (RuntimeError("device fault"), "RuntimeError('device fault')"),
        (Unpicklable(), "RuntimeError('Unpicklable: device fault')"),
        (unreadable, unreadable_want),
        (None, "None"),
    ]:
        error = ExecutionError("backend 'x' failed", dispatch=3)
        error.__cause__ = cause
        copy = pickle.loads(pickle.dumps(error))
        assert (type(copy), str(copy), copy.dispatch) == (ExecutionError, str(error), 3)
        assert repr(copy.__cause__) == want
