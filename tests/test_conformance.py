"""check_backend accepts a correct backend and names what a broken one gets wrong.

The broken backends wrap the reference backend and spoil one part of the contract each;
tests/test_broken_backends.py plants every bug class in the documented toy backend.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import attrs
import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pypto_sched
from pypto_sched import (
    BackendError,
    DispatchArrays,
    DispatchInput,
    DispatchOutput,
    GenerationResult,
    InvalidInputError,
    PlannerConfig,
    generate,
    plan_one_shot,
)
from pypto_sched.execute import execute_schedule
from pypto_sched.testing import _conformance, check_backend

reference = pytest.importorskip("pypto_sched_reference")


class Wrapped:
    """The reference backend, passed through unchanged; subclasses spoil one thing."""

    name: ClassVar[str] = "wrapped"

    def __init__(self) -> None:
        self.inner = reference.ReferenceBackend.from_seed(seed=1)

    @property
    def tolerance(self) -> float:
        return float(self.inner.tolerance)

    @property
    def vocab_size(self) -> int:
        return int(self.inner.vocab_size)

    @property
    def hidden_size(self) -> int:
        return int(self.inner.hidden_size)

    def new_cache(self, *, num_pages: int, page_size: int) -> Any:
        return self.inner.new_cache(num_pages=num_pages, page_size=page_size)

    def embed(self, token_ids: npt.NDArray[np.int64]) -> npt.NDArray[np.floating[Any]]:
        return self.inner.embed(token_ids)  # type: ignore[no-any-return]

    def run_dispatch(self, batch: DispatchInput, cache: Any) -> DispatchOutput:
        return self.inner.run_dispatch(batch, cache)  # type: ignore[no-any-return]


class ChunkSensitive(Wrapped):
    """Final logits shift with the dispatch's size, so chunking changes them."""

    def run_dispatch(self, batch: DispatchInput, cache: Any) -> DispatchOutput:
        output = super().run_dispatch(batch, cache)
        if output.logits is None:
            return output
        return attrs.evolve(output, logits=output.logits + 1e-3 * batch.arrays.num_tokens)


class WrongGreedy(Wrapped):
    """Greedy ids are the token after the argmax."""

    def run_dispatch(self, batch: DispatchInput, cache: Any) -> DispatchOutput:
        output = super().run_dispatch(batch, cache)
        if output.logits is None or output.greedy_token_ids is None:
            return output
        wrong = (np.argmax(output.logits, axis=1) + 1) % self.vocab_size
        return attrs.evolve(output, greedy_token_ids=wrong)


class AllRowLogits(Wrapped):
    """Returns a logits row for every row, even in a dispatch of intermediate chunks."""

    def run_dispatch(self, batch: DispatchInput, cache: Any) -> DispatchOutput:
        output = super().run_dispatch(batch, cache)
        rows = batch.arrays.num_rows
        return DispatchOutput(
            logits=np.zeros((rows, self.vocab_size)),
            greedy_token_ids=output.greedy_token_ids,
        )


class ShortEmbeddings(Wrapped):
    def embed(self, token_ids: npt.NDArray[np.int64]) -> npt.NDArray[np.floating[Any]]:
        return super().embed(token_ids)[:, :-1]


def test_the_reference_backend_conforms() -> None:
    check_backend(Wrapped(), max_examples=8, seed=0)


@pytest.mark.parametrize(
    ("backend", "message"),
    [
        (
            ChunkSensitive(),
            r"chunked over \d+ dispatches.*: final logits of request \d+ at position \d+ differ "
            r"from one-shot by .* at vocabulary column \d+",
        ),
        (
            WrongGreedy(),
            r"greedy id \(vocabulary column\) \d+ of request \d+ at position \d+ is not an "
            r"argmax",
        ),
        (AllRowLogits(), r"malformed output for dispatch \d+ of \d+ .*: logits must be None when"),
        (ShortEmbeddings(), r"embed\(\) of 3 ids must have shape \(3, 32\): \(3, 31\)"),
    ],
    ids=["chunking-changes-logits", "greedy-not-argmax", "intermediate-logits", "embed-shape"],
)
def test_a_backend_breaking_the_contract_fails_with_a_clear_message(
    backend: Wrapped, message: str
) -> None:
    with pytest.raises(AssertionError, match=message) as info:
        check_backend(backend, max_examples=8, seed=0)
    if "embed" not in message:
        assert "example" in str(info.value)  # names the example to reproduce it


def test_something_that_is_not_a_backend_is_refused() -> None:
    with pytest.raises(AssertionError, match="object does not implement the Backend protocol"):
        check_backend(object(), max_examples=1)  # type: ignore[arg-type]


class NoDispatch(Wrapped):
    """Everything but ``run_dispatch``, and an ``embed`` that is not a method."""

    run_dispatch = None  # type: ignore[assignment]
    embed = 3  # type: ignore[assignment]


def test_a_backend_short_of_the_protocol_is_told_what_it_lacks() -> None:
    class Half:
        name = "half"
        tolerance = 0.0

    with pytest.raises(
        AssertionError,
        match=r"^Half does not implement the Backend protocol: "
        r"it has no vocab_size, hidden_size, new_cache, embed, run_dispatch$",
    ):
        check_backend(Half(), max_examples=1)  # type: ignore[arg-type]
    with pytest.raises(AssertionError, match=r": embed, run_dispatch not callable$"):
        check_backend(NoDispatch(), max_examples=1)  # type: ignore[arg-type]


class IntTolerance(Wrapped):
    """Promises a tolerance of 1, an int."""

    @property
    def tolerance(self) -> float:
        return 1


def test_a_tolerance_may_be_an_int() -> None:
    check_backend(IntTolerance(), max_examples=2, generation_examples=1)


class BadMetadata(Wrapped):
    """Declares metadata it cannot have: each keyword replaces that attribute."""

    def __init__(self, **bad: object) -> None:
        super().__init__()
        self.bad = bad

    @property
    def tolerance(self) -> Any:
        return self.bad.get("tolerance", super().tolerance)

    @property
    def vocab_size(self) -> Any:
        return self.bad.get("vocab_size", super().vocab_size)

    @property
    def hidden_size(self) -> Any:
        return self.bad.get("hidden_size", super().hidden_size)


class Unnamed(Wrapped):
    name: ClassVar[str] = ""


@pytest.mark.parametrize(
    ("backend", "message"),
    [
        (BadMetadata(tolerance=-1), r"^backend.tolerance must be a finite real number >= 0 "
         r"\(an int too\): -1 \(int\)$"),
        (BadMetadata(tolerance=True), r"^backend.tolerance must be .*: True \(bool\)$"),
        # An infinite tolerance would pass any logits: the check would check nothing.
        (BadMetadata(tolerance=float("inf")), r"^backend.tolerance must be .*: inf \(float\)$"),
        (BadMetadata(tolerance="0"), r"^backend.tolerance must be .*: '0' \(str\)$"),
        (BadMetadata(vocab_size=0), r"^backend.vocab_size must be an int >= 1: 0 \(int\)$"),
        (BadMetadata(hidden_size=2.0), r"^backend.hidden_size must be an int >= 1: 2.0 "
         r"\(float\)$"),
        (Unnamed(), r"^backend.name must be a non-empty str: '' \(str\)$"),
    ],
)  # fmt: skip
def test_bad_metadata_says_what_is_expected(backend: Wrapped, message: str) -> None:
    with pytest.raises(AssertionError, match=message):
        check_backend(backend, max_examples=1)


@pytest.mark.parametrize(
    ("oracle", "got"),
    [
        (lambda prompts: None, r"None \(NoneType\)"),
        (lambda prompts: np.zeros((len(prompts), 3)), r"shape \(\d, 3\), dtype float64"),
        (lambda prompts: np.zeros((len(prompts), 64), int), r"shape \(\d, 64\), dtype int64"),
        (lambda prompts: [[0.0]] * len(prompts) + [[0.0, 1.0]], r"\[\[0.0\].*\(list\)"),
    ],
    ids=["None", "wrong-width", "int", "ragged"],
)
def test_a_bad_oracle_output_is_blamed_on_the_oracle_and_names_the_example(
    oracle: Any, got: str
) -> None:
    backend = Wrapped()
    shape = rf"\(\d, {backend.vocab_size}\)"
    with pytest.raises(
        AssertionError,
        match=rf"^backend 'wrapped', seed 0, example 0 \(.*\): the oracle's output is wrong, "
        rf"not the backend's: it must be float logits of shape {shape}, one row per prompt and "
        rf"backend.vocab_size columns: {got}$",
    ):
        check_backend(backend, max_examples=1, generation_examples=0, oracle=oracle)


def dividing_by_zero(prompts: Sequence[npt.NDArray[np.int64]]) -> npt.NDArray[np.float64]:
    return np.zeros(1 // 0)


def not_finite(prompts: Sequence[npt.NDArray[np.int64]]) -> npt.NDArray[np.float64]:
    logits = np.zeros((len(prompts), Wrapped().vocab_size))
    logits[-1, 5] = np.nan
    return logits


def test_an_oracle_that_fails_or_gives_non_finite_logits_is_blamed_not_the_backend() -> None:
    where = r"^backend 'wrapped', seed 0, example 0 \(.*\): "
    with pytest.raises(
        AssertionError,
        match=where + r"the oracle failed, not the backend: ZeroDivisionError: integer division "
        r"or modulo by zero$",
    ) as info:
        check_backend(Wrapped(), max_examples=1, generation_examples=0, oracle=dividing_by_zero)
    assert isinstance(info.value.__cause__, ZeroDivisionError)
    with pytest.raises(
        AssertionError,
        match=where + r"the oracle's output is wrong, not the backend's: its logits must be "
        r"finite: row \d+, column 5 is nan$",
    ):
        check_backend(Wrapped(), max_examples=1, generation_examples=0, oracle=not_finite)


class Lenient(Wrapped):
    """Promises a tolerance as wide as its logits: any logits would agree."""

    @property
    def tolerance(self) -> float:
        return 1e6


def test_a_tolerance_within_which_any_logits_agree_is_refused() -> None:
    with pytest.raises(
        AssertionError,
        match=r"^backend 'wrapped': backend.tolerance 1e\+06 allows at least half of what a "
        r"row of its logits spans \(over 2 examples\): .* proved nothing",
    ):
        check_backend(Lenient(), max_examples=2, generation_examples=0)
    with pytest.raises(
        AssertionError,
        match=r"^backend 'wrapped': backend.tolerance 1e-09 \+ relative_tolerance 10 x the "
        r"largest \|logit\| allows at least half",
    ):
        check_backend(ScaledNoise(relative_tolerance=10.0), max_examples=2, generation_examples=0)


class ScaledNoise(Wrapped):
    """Low-precision arithmetic in miniature: the logits of a dispatch of an odd number of
    tokens are shifted by 1% of their row's largest magnitude (a shift of the whole row, so
    the greedy ids stay), and it declares ``relative_tolerance``."""

    def __init__(self, *, relative_tolerance: Any) -> None:
        super().__init__()
        self.relative_tolerance = relative_tolerance

    def run_dispatch(self, batch: DispatchInput, cache: Any) -> DispatchOutput:
        output = super().run_dispatch(batch, cache)
        if output.logits is None or batch.arrays.num_tokens % 2 == 0:
            return output
        shift = 0.01 * np.abs(output.logits).max(axis=1, keepdims=True)
        return attrs.evolve(output, logits=output.logits + shift)


def test_a_relative_tolerance_allows_differences_in_proportion_to_the_logits() -> None:
    check_backend(ScaledNoise(relative_tolerance=0.02), max_examples=4, generation_examples=1)
    message = r"> allowed .* \(tolerance 1e-09 \+ relative_tolerance 0.005 x the reference's"
    with pytest.raises(AssertionError, match=message):
        check_backend(ScaledNoise(relative_tolerance=0.005), max_examples=4, generation_examples=0)
    for bad in (-1.0, float("nan"), "0.1"):
        with pytest.raises(AssertionError, match=r"backend\.relative_tolerance must be None or"):
            check_backend(ScaledNoise(relative_tolerance=bad), max_examples=1)


class UncheckedGreedy(Wrapped):
    """Takes greedy ids as the argmax of its logits, whatever they are (NaN gives id 0)."""

    def run_dispatch(self, batch: DispatchInput, cache: Any) -> DispatchOutput:
        if not batch.return_greedy:
            return super().run_dispatch(batch, cache)
        ask = attrs.evolve(batch, return_logits=True, return_greedy=False)
        logits = super().run_dispatch(ask, cache).logits
        assert logits is not None
        return DispatchOutput(
            logits=logits if batch.return_logits else None,
            greedy_token_ids=np.argmax(logits, axis=1),
        )


def test_greedy_ids_of_non_finite_logits_fail_the_check() -> None:
    with pytest.raises(
        AssertionError,
        match=r"^backend 'wrapped' returned greedy ids of NaN input embeddings: asked for ids "
        r"alone, it must check that its logits are finite and raise a BackendError",
    ):
        check_backend(UncheckedGreedy(), max_examples=2, generation_examples=0)


class NoCache(Wrapped):
    def new_cache(self, *, num_pages: int, page_size: int) -> Any:
        return None


def test_a_cache_of_none_is_refused_by_name() -> None:
    with pytest.raises(
        AssertionError,
        match=r"^backend 'wrapped', seed 0, example 0 .*: backend 'wrapped': new_cache\(\) "
        r"returned None: it must return the cache object that run_dispatch is then handed",
    ):
        check_backend(NoCache(), max_examples=1)
    with pytest.raises(BackendError, match=r"new_cache\(\) returned None"):
        execute_schedule(plan_one_shot([3]), NoCache(), [np.arange(3)])


class ShortTable(Wrapped):
    """Its model runs 60 positions and fails beyond them."""

    max_position_embeddings = 60

    def run_dispatch(self, batch: DispatchInput, cache: Any) -> DispatchOutput:
        assert batch.arrays.positions.max() < 60, "a position beyond the model's 60"
        return super().run_dispatch(batch, cache)


def test_no_example_runs_more_positions_than_the_model_takes() -> None:
    # Large pages move prompts past page boundaries, and filling a cache with stale K/V
    # runs prompts over all its pages: none is longer than the model's positions.
    check_backend(ShortTable(), max_examples=8, page_sizes=(16, 128))


class ForgetsWrites(Wrapped):
    """Puts back, after a dispatch, what some of its K/V writes overwrote (the dispatch
    itself still reads them): a kernel that drops writes. Subclasses say which."""

    def forgotten(self, arrays: DispatchArrays) -> tuple[slice, npt.NDArray[Any]] | None:
        """The layers and slots whose writes are dropped, if any."""
        raise NotImplementedError

    def run_dispatch(self, batch: DispatchInput, cache: Any) -> DispatchOutput:
        lost = self.forgotten(batch.arrays)
        if lost is None:
            return super().run_dispatch(batch, cache)
        keys, values = cache.keys[lost].copy(), cache.values[lost].copy()
        output = super().run_dispatch(batch, cache)
        cache.keys[lost], cache.values[lost] = keys, values
        return output


class FourRowWriter(ForgetsWrites):
    """Keeps no K/V of the rows of a dispatch past its fourth (a batch limit of its kernels)."""

    def forgotten(self, arrays: DispatchArrays) -> tuple[slice, npt.NDArray[Any]] | None:
        if arrays.num_rows <= 4:
            return None
        return slice(None), arrays.slot_mapping[arrays.row_tokens(4).start :]


def test_prefill_examples_draw_dispatches_of_more_than_four_rows() -> None:
    with pytest.raises(
        AssertionError, match=r"seed 0, example \d+ .*, chunked over \d+ dispatches"
    ):
        check_backend(FourRowWriter(), max_examples=20, generation_examples=0)


def test_importing_the_check_does_not_import_hypothesis() -> None:
    # The strategies (and Hypothesis) load only when one of them is used.
    code = (
        "import sys\n"
        "from pypto_sched.testing import check_backend\n"
        "assert 'hypothesis' not in sys.modules, 'hypothesis was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


class PagesOf128Only(Wrapped):
    """Refuses KV page sizes its (pretend) kernels cannot take."""

    def new_cache(self, *, num_pages: int, page_size: int) -> Any:
        assert page_size % 128 == 0, f"page size {page_size} is not a multiple of 128"
        return super().new_cache(num_pages=num_pages, page_size=page_size)


def test_page_sizes_keep_the_examples_within_what_the_backend_accepts() -> None:
    with pytest.raises(AssertionError, match="not a multiple of 128"):
        check_backend(PagesOf128Only(), max_examples=3)
    check_backend(PagesOf128Only(), max_examples=3, page_sizes=(128, 256))


class ContiguousReads:
    """A dispatch's arrays, except that a row's context is read as if its pages followed
    its first one in the cache: right whenever a request fits in one page."""

    def __init__(self, arrays: Any) -> None:
        self.arrays = arrays

    def __getattr__(self, name: str) -> Any:
        return getattr(self.arrays, name)

    def context_slots(self, row: int) -> npt.NDArray[np.int64]:
        first = int(self.arrays.block_tables[row, 0]) * self.arrays.page_size
        return np.arange(first, first + int(self.arrays.seq_lens[row]))


def contiguous_reader() -> Any:
    """The documented toy backend, writing K/V where it should and reading it back as if a
    request's pages were contiguous."""
    toy = toy_backend()

    class ContiguousReader(type(toy)):  # type: ignore[misc]
        def run_dispatch(self, batch: DispatchInput, cache: Any) -> DispatchOutput:
            read = attrs.evolve(batch, arrays=ContiguousReads(batch.arrays))  # type: ignore[arg-type]
            return super().run_dispatch(read, cache)  # type: ignore[no-any-return]

    return ContiguousReader()


@pytest.mark.parametrize("page_sizes", [(128, 256), (64,), (1, 2, 3, 4, 8, 16)])
def test_pages_are_crossed_whatever_their_size(page_sizes: tuple[int, ...]) -> None:
    # Prompts reach past a page boundary at any page size (once every drawn prompt fitted
    # in a page of 41 or more, and a backend assuming contiguous pages passed).
    with pytest.raises(AssertionError, match=r"seed 0, example \d"):
        check_backend(contiguous_reader(), max_examples=6, generation_examples=0,
                      page_sizes=page_sizes)  # fmt: skip
    with pytest.raises(AssertionError, match=r"seed 0, generation example \d"):
        check_backend(contiguous_reader(), max_examples=0, generation_examples=6,
                      page_sizes=page_sizes)  # fmt: skip


@pytest.mark.parametrize("page_sizes", [(), (0,), (16, True), "16", None])
def test_bad_page_sizes_are_rejected(page_sizes: Any) -> None:
    with pytest.raises(ValueError, match="'page_sizes'"):
        check_backend(Wrapped(), max_examples=1, page_sizes=page_sizes)


# -- explicit failures, the oracle and the registered name -----------------------------------

EXAMPLES = Path(__file__).resolve().parent.parent / "docs" / "examples"


def toy_backend() -> Any:
    """The documented toy backend (docs/examples/toy_backend.py), a correct one."""
    spec = importlib.util.spec_from_file_location("toy_backend", EXAMPLES / "toy_backend.py")
    if spec is None or spec.loader is None:
        raise ImportError("docs/examples/toy_backend.py cannot be loaded")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.ToyBackend()


def test_a_broken_backend_fails_under_python_dash_o() -> None:
    # check_backend raises explicitly: `python -O` strips assert statements, not raises.
    code = (
        "import sys, attrs\n"
        f"sys.path.insert(0, {str(EXAMPLES)!r})\n"
        "from toy_backend import ToyBackend\n"
        "from pypto_sched.testing import check_backend\n"
        "class Broken(ToyBackend):\n"
        "    def run_dispatch(self, batch, cache):\n"
        "        return super().run_dispatch(attrs.evolve(batch, input_embeddings=None), cache)\n"
        "assert False, 'asserts are on'\n"
        "try:\n"
        "    check_backend(Broken(), max_examples=3)\n"
        "except AssertionError as error:\n"
        "    print('caught:', error)\n"
        "else:\n"
        "    print('passed')\n"
    )
    result = subprocess.run(
        [sys.executable, "-O", "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.startswith("caught: backend 'toy'"), result.stdout + result.stderr
    assert "host embeddings" in result.stdout


def whole_prompt_logits(backend: Wrapped, prompts: Sequence[npt.NDArray[np.int64]]) -> Any:
    """An oracle: each prompt run alone, whole, on a fresh reference backend of the same
    weights (no chunks, no shared cache, one request per run)."""
    rows = []
    for prompt in prompts:
        inner = reference.ReferenceBackend.from_seed(seed=1)
        schedule = plan_one_shot([prompt.size])
        rows.append(execute_schedule(schedule, inner, [prompt]).logits[0])  # type: ignore[index]
    return np.array(rows)


def test_an_oracle_that_agrees_passes() -> None:
    backend = Wrapped()
    check_backend(
        backend, max_examples=4, oracle=lambda prompts: whole_prompt_logits(backend, prompts)
    )


class WrongModel(Wrapped):
    """Consistently the wrong model: every logit scaled, however the batch is chunked."""

    def run_dispatch(self, batch: DispatchInput, cache: Any) -> DispatchOutput:
        output = super().run_dispatch(batch, cache)
        if output.logits is None:
            return output
        return attrs.evolve(output, logits=output.logits * 1.01)


def test_a_wrong_model_passes_alone_and_fails_against_an_oracle() -> None:
    backend = WrongModel()
    check_backend(backend, max_examples=4)  # consistent with itself: chunking invariance holds
    with pytest.raises(
        AssertionError,
        match=r"example 0 .*, one-shot: final logits of request \d+ at position \d+ differ "
        r"from the oracle by .* at vocabulary column \d+",
    ):
        check_backend(
            backend, max_examples=4, oracle=lambda prompts: whole_prompt_logits(backend, prompts)
        )
    check_backend(  # unless the oracle's tolerance is loose enough
        backend,
        max_examples=2,
        oracle=lambda prompts: whole_prompt_logits(backend, prompts),
        oracle_tolerance=1e3,
    )


def test_the_registered_name_must_be_the_declared_one() -> None:
    check_backend(Wrapped(), max_examples=1, name="wrapped")
    with pytest.raises(AssertionError, match="registered as 'reference' declares name 'wrapped'"):
        check_backend(Wrapped(), max_examples=1, name="reference")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"max_examples": -1}, "'max_examples' must be an int >= 0"),
        ({"generation_examples": 1.5}, "'generation_examples' must be an int >= 0"),
        ({"max_examples": 0, "generation_examples": 0}, "must not both be 0"),
        ({"name": 3}, "'name' must be a str or None"),
        ({"oracle": 3}, "'oracle' must be callable or None"),
        ({"seed": -1}, "'seed' must be >= 0: -1"),
        ({"seed": 1.5}, r"'seed' must be an int: 1.5 \(float\)"),
        ({"seed": "x"}, r"'seed' must be an int: 'x' \(str\)"),
        (
            {"oracle_tolerance": -1.0},
            "'oracle_tolerance' must be a finite real number >= 0 or None",
        ),
        ({"oracle_tolerance": float("inf")}, "'oracle_tolerance' must be a finite real .*: inf$"),
    ],
)
def test_bad_options_are_rejected(options: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidInputError, match=message):
        check_backend(Wrapped(), **options)


# -- the generation case ----------------------------------------------------------------------


def test_the_reference_backend_generates_the_tokens_of_one_shot_recomputation() -> None:
    check_backend(Wrapped(), max_examples=0, generation_examples=12, seed=1)


@pytest.fixture
def generations(monkeypatch: pytest.MonkeyPatch) -> list[GenerationResult]:
    """Every generation check_backend runs, as it runs it."""
    results: list[GenerationResult] = []

    def recorded(*args: Any, **kwargs: Any) -> GenerationResult:
        result = generate(*args, **kwargs)
        results.append(result)
        return result

    monkeypatch.setattr(_conformance, "generate", recorded)
    return results


def test_the_default_generation_examples_preempt_mix_and_decode(
    generations: list[GenerationResult],
) -> None:
    check_backend(Wrapped(), max_examples=1)
    assert len(generations) == _conformance.DEFAULT_GENERATION_EXAMPLES
    assert any(result.stats.num_preemptions > 0 for result in generations)
    assert any(result.stats.num_mixed_dispatches > 0 for result in generations)
    decoded = sum(s.token_ids.size - 1 for result in generations for s in result.sequences)
    assert decoded >= 10  # tokens after the first come from decode rows


class DecodeWritesTheFirstLayerOnly(ForgetsWrites):
    """In a dispatch of one-token rows only (a decode step), writes K/V for the first layer
    and leaves the other layers' slots as they were."""

    def forgotten(self, arrays: DispatchArrays) -> tuple[slice, npt.NDArray[Any]] | None:
        if arrays.num_tokens > arrays.num_rows:
            return None
        return slice(1, None), arrays.slot_mapping


def test_a_multi_layer_decode_bug_fails_the_generation_case() -> None:
    with pytest.raises(
        AssertionError,
        match=r"generation example \d+ .*: generated token \d+ of request \d+, \d+, from "
        r"the logits at position \d+, is not an argmax of the one-shot logits",
    ):
        check_backend(DecodeWritesTheFirstLayerOnly(), max_examples=0)


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(min_value=0, max_value=2**32 - 1))
def test_a_correct_backend_passes_the_generation_case_at_every_seed(seed: int) -> None:
    check_backend(toy_backend(), max_examples=0, generation_examples=3, seed=seed)


def test_a_decode_bug_fails_under_python_dash_o() -> None:
    code = (
        "import sys\n"
        f"sys.path.insert(0, {str(EXAMPLES)!r})\n"
        "from toy_backend import ToyBackend\n"
        "from pypto_sched.testing import check_backend\n"
        "class Broken(ToyBackend):\n"
        "    def run_dispatch(self, batch, cache):\n"
        "        if batch.arrays.num_tokens == batch.arrays.num_rows:\n"
        "            cache = self.new_cache(num_pages=cache.keys.shape[0], page_size=1)\n"
        "        return super().run_dispatch(batch, cache)\n"
        "assert False, 'asserts are on'\n"
        "try:\n"
        "    check_backend(Broken(), max_examples=0)\n"
        "except AssertionError as error:\n"
        "    print('caught:', error)\n"
        "else:\n"
        "    print('passed')\n"
    )
    result = subprocess.run(
        [sys.executable, "-O", "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.startswith("caught: backend 'toy', seed 0, generation example")
    assert "is not an argmax of the one-shot logits of its context" in result.stdout


class AsksRecorded(Wrapped):
    """Records, per dispatch, its number of final rows and whether anything was asked."""

    def __init__(self) -> None:
        super().__init__()
        self.asks: list[tuple[int, bool]] = []

    def run_dispatch(self, batch: DispatchInput, cache: Any) -> DispatchOutput:
        asked = batch.return_logits or batch.return_greedy
        self.asks.append((int(batch.arrays.is_final.sum()), asked))
        return super().run_dispatch(batch, cache)


def test_generation_asks_nothing_of_a_dispatch_of_intermediate_chunks() -> None:
    # The contract: such a dispatch is asked for nothing and returns DispatchOutput().
    backend = AsksRecorded()
    config = PlannerConfig(max_num_batched_tokens=4, long_prefill_token_threshold=2)
    generate(backend, [[1, 2, 3, 4, 5], [6, 7, 8]], config=config, max_new_tokens=3)
    assert any(finals == 0 for finals, _ in backend.asks)
    assert all(asked == (finals > 0) for finals, asked in backend.asks)


# -- from a mutation review: the scenarios the check runs, and bugs only one of them catches -----


@pytest.fixture
def planned(monkeypatch: pytest.MonkeyPatch) -> list[tuple[PlannerConfig, Any, list[int]]]:
    """(config, num_computed_tokens, prompt lengths) of every prefill example planned."""
    calls: list[tuple[PlannerConfig, Any, list[int]]] = []
    real = pypto_sched.plan_prefill

    def recorded(lengths: Any, config: PlannerConfig, **options: Any) -> Any:
        calls.append((config, options.get("num_computed_tokens"), list(lengths)))
        return real(lengths, config, **options)

    monkeypatch.setattr(_conformance, "plan_prefill", recorded)
    return calls


def test_prefill_examples_cover_both_policies_prefix_hits_and_every_option(
    planned: list[tuple[PlannerConfig, Any, list[int]]],
) -> None:
    check_backend(Wrapped(), max_examples=12, generation_examples=0)
    configs = [config for config, _, _ in planned]
    assert {config.policy for config in configs} == {"round_robin", "packed"}
    assert any(np.any(computed) for _, computed, _ in planned)
    assert any(config.chunk_alignment is not None for config in configs)
    assert any(config.max_num_seqs is not None for config in configs)
    assert any(config.max_num_partial_prefills is not None for config in configs)


def test_the_seed_changes_the_examples(
    planned: list[tuple[PlannerConfig, Any, list[int]]],
) -> None:
    check_backend(Wrapped(), max_examples=3, generation_examples=0, seed=0)
    check_backend(Wrapped(), max_examples=3, generation_examples=0, seed=1)
    assert [lengths for _, _, lengths in planned[:3]] != [lengths for _, _, lengths in planned[3:]]


def test_prefill_block_tables_leave_spare_pages(monkeypatch: pytest.MonkeyPatch) -> None:
    # Tables "drawn from a pool with spare pages", so that a backend must read its own.
    spare: list[int] = []
    real = _conformance._scattered_tables

    def recorded(rng: Any, lengths: Any, page_size: int, extra: int) -> Any:
        tables = real(rng, lengths, page_size, extra)
        spare.append(tables.num_pages - sum(-(-n // page_size) for n in lengths))
        return tables

    monkeypatch.setattr(_conformance, "_scattered_tables", recorded)
    check_backend(Wrapped(), max_examples=4, generation_examples=0)
    assert any(n > 0 for n in spare)


class WrongGreedyWhenAskedAlone(Wrapped):
    """Its greedy-only path (no logits asked for) returns the id after the argmax for host
    embeddings: a fast path that disagrees with the full one."""

    def run_dispatch(self, batch: DispatchInput, cache: Any) -> DispatchOutput:
        embeddings = batch.input_embeddings
        if batch.return_logits or not batch.return_greedy or embeddings is None:
            return super().run_dispatch(batch, cache)
        if not np.isfinite(embeddings).all():
            return super().run_dispatch(batch, cache)
        full = super().run_dispatch(attrs.evolve(batch, return_logits=True), cache)
        assert full.logits is not None
        wrong = (np.argmax(full.logits, axis=1) + 1) % self.vocab_size
        return DispatchOutput(greedy_token_ids=wrong)


def test_a_wrong_greedy_only_path_fails() -> None:
    with pytest.raises(AssertionError, match=r"host embeddings.*is not an argmax"):
        check_backend(WrongGreedyWhenAskedAlone(), max_examples=4, generation_examples=0)


class RowSpansOne(Wrapped):
    """Logits rescaled per row to [0, 1] (monotone: the same greedy ids), so that every row
    spans exactly 1 however it is chunked."""

    def __init__(self, tolerance: float) -> None:
        super().__init__()
        self._tolerance = tolerance

    @property
    def tolerance(self) -> float:
        return self._tolerance

    def run_dispatch(self, batch: DispatchInput, cache: Any) -> DispatchOutput:
        output = super().run_dispatch(batch, cache)
        if output.logits is None:
            return output
        logits = np.asarray(output.logits, dtype=np.float64)
        low, high = logits.min(axis=1, keepdims=True), logits.max(axis=1, keepdims=True)
        return attrs.evolve(output, logits=(logits - low) / (high - low))


@pytest.mark.parametrize(("tolerance", "refused"), [(0.4, False), (0.5, True), (0.75, True)])
def test_a_tolerance_of_half_a_rows_span_is_refused_and_below_it_passes(
    tolerance: float, refused: bool
) -> None:
    # Twice the tolerance is what greedy ids may differ by: from half the span on, any do.
    if not refused:
        check_backend(RowSpansOne(tolerance), max_examples=2, generation_examples=0)
        return
    with pytest.raises(AssertionError, match="allows at least half of what a row"):
        check_backend(RowSpansOne(tolerance), max_examples=2, generation_examples=0)


def test_the_oracles_relative_tolerance_is_used() -> None:
    backend = WrongModel()  # every logit 1% larger
    with pytest.raises(AssertionError, match="differ from the oracle"):
        check_backend(
            backend,
            max_examples=2,
            generation_examples=0,
            oracle=lambda prompts: whole_prompt_logits(backend, prompts),
        )
    check_backend(
        backend,
        max_examples=2,
        generation_examples=0,
        oracle=lambda prompts: whole_prompt_logits(backend, prompts),
        oracle_relative_tolerance=0.05,
    )
