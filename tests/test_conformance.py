"""check_backend accepts a correct backend and names what a broken one gets wrong.

The broken backends wrap the reference backend and spoil one part of the contract each.
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any, ClassVar

import attrs
import numpy as np
import numpy.typing as npt
import pytest

from pypto_sched import DispatchInput, DispatchOutput
from pypto_sched.testing import check_backend

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
        (ChunkSensitive(), r"chunked over \d+ dispatches.*differ from one-shot by"),
        (WrongGreedy(), r"greedy id \d+ of request \d+ is not an argmax"),
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


@pytest.mark.parametrize("page_sizes", [(), (0,), (16, True), "16", None])
def test_bad_page_sizes_are_rejected(page_sizes: Any) -> None:
    with pytest.raises(ValueError, match="'page_sizes'"):
        check_backend(Wrapped(), max_examples=1, page_sizes=page_sizes)
