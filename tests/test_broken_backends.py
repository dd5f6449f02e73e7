"""check_backend catches every bug class a backend author can plant.

Each backend here is the documented toy backend (``docs/examples/toy_backend.py``, which
passes) with one deliberate bug, of the kinds real backends have shipped: index arithmetic
that assumes contiguous pages, a host-embedding path that is ignored, a cache that is
ignored or assumed zeroed, positions off by one, K/V written at the wrong slots, outputs in
the wrong order, NaNs, a greedy id that is not the argmax, a wrong name, a missing output,
inputs mutated in place, and decode rows mishandled (the cache ignored, K/V written at the
wrong slot or into the wrong page when a new one is granted, decode rows assumed to come
last, reused pages assumed to keep their K/V), a block-table width fixed by a cache's first
dispatch and a fixed 8-row buffer. Every one must fail ``check_backend`` at its
default settings, with a message that says what broke; every decode bug must also fail its
generation case alone.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from collections.abc import Iterator
from importlib.metadata import EntryPoint
from pathlib import Path
from typing import Any, ClassVar

import attrs
import numpy as np
import numpy.typing as npt
import pytest

from pypto_sched import (
    BackendError,
    DispatchInput,
    DispatchOutput,
    execute_schedule,
    load_backend,
    plan_one_shot,
    refresh_backends,
)
from pypto_sched.backends import ENTRY_POINT_GROUP as GROUP
from pypto_sched.runtime import backends
from pypto_sched.testing import check_backend

EXAMPLE = Path(__file__).resolve().parent.parent / "docs" / "examples" / "toy_backend.py"


def _load_toy() -> Any:
    spec = importlib.util.spec_from_file_location("examples_toy_backend", EXAMPLE)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


toy = _load_toy()
ToyBackend: Any = toy.ToyBackend


def with_arrays(batch: DispatchInput, **changes: Any) -> DispatchInput:
    """``batch`` with some of its kernel arrays replaced."""
    return attrs.evolve(batch, arrays=attrs.evolve(batch.arrays, **changes))


def row_of_each_token(batch: DispatchInput) -> npt.NDArray[np.int64]:
    return np.repeat(np.arange(batch.arrays.num_rows), batch.arrays.query_lens)


# -- paging and the cache -----------------------------------------------------------------


class ContiguousPages(ToyBackend):  # type: ignore[misc]
    """Assumes a request's pages follow its first one: slot = first page * size + position."""

    def run_dispatch(self, batch: DispatchInput, cache: Any) -> DispatchOutput:
        arrays = batch.arrays
        first = arrays.block_tables[:, :1].astype(np.int64)
        width = arrays.block_tables.shape[1]
        tables = np.where(arrays.block_tables >= 0, first + np.arange(width), -1)
        rows = row_of_each_token(batch)
        slots = first[rows, 0] * arrays.page_size + arrays.positions
        num_slots = cache.keys.shape[0]
        return super().run_dispatch(  # type: ignore[no-any-return]
            with_arrays(
                batch,
                block_tables=(tables % (num_slots // arrays.page_size)).astype(np.int32),
                slot_mapping=slots % num_slots,
            ),
            cache,
        )


class WritesOneSlotLate(ToyBackend):  # type: ignore[misc]
    """Writes each token's K/V at the slot after its own (reads go through the tables)."""

    def run_dispatch(self, batch: DispatchInput, cache: Any) -> DispatchOutput:
        late = (batch.arrays.slot_mapping + 1) % cache.keys.shape[0]
        return super().run_dispatch(  # type: ignore[no-any-return]
            with_arrays(batch, slot_mapping=late), cache
        )


class IgnoresTheCache(ToyBackend):  # type: ignore[misc]
    """Attends only to the chunk: every dispatch runs on a fresh, empty cache."""

    def run_dispatch(self, batch: DispatchInput, cache: Any) -> DispatchOutput:
        fresh = toy.ToyCache(num_pages=cache.keys.shape[0], page_size=1, hidden_size=16)
        output = super().run_dispatch(batch, fresh)
        cache.keys[batch.arrays.slot_mapping] = fresh.keys[batch.arrays.slot_mapping]
        cache.values[batch.arrays.slot_mapping] = fresh.values[batch.arrays.slot_mapping]
        return output  # type: ignore[no-any-return]


class AssumesAZeroedCache(ToyBackend):  # type: ignore[misc]
    """Adds K/V into its slots instead of overwriting them: right only on fresh pages."""

    def run_dispatch(self, batch: DispatchInput, cache: Any) -> DispatchOutput:
        slots = batch.arrays.slot_mapping
        old_keys, old_values = cache.keys[slots].copy(), cache.values[slots].copy()
        output = super().run_dispatch(batch, cache)
        cache.keys[slots] += old_keys
        cache.values[slots] += old_values
        return output  # type: ignore[no-any-return]


class ReadsWholePages(ToyBackend):  # type: ignore[misc]
    """Attends to every slot of the context's pages, past the context's end."""

    def run_dispatch(self, batch: DispatchInput, cache: Any) -> DispatchOutput:
        page = batch.arrays.page_size
        rounded = -(-batch.arrays.seq_lens // page) * page
        return super().run_dispatch(  # type: ignore[no-any-return]
            with_arrays(batch, seq_lens=rounded.astype(np.int32)), cache
        )


class KeepsItsOwnCache(ToyBackend):  # type: ignore[misc]
    """Keeps the first cache it made and uses it for every dispatch."""

    def __init__(self) -> None:
        super().__init__()
        self._own: Any = None

    def run_dispatch(self, batch: DispatchInput, cache: Any) -> DispatchOutput:
        if self._own is None or self._own.keys.shape[0] < cache.keys.shape[0]:
            self._own = cache
        return super().run_dispatch(batch, self._own)  # type: ignore[no-any-return]


# -- positions ------------------------------------------------------------------------------


class ChunkLocalPositions(ToyBackend):  # type: ignore[misc]
    """Counts positions from the chunk's start instead of the prompt's."""

    def run_dispatch(self, batch: DispatchInput, cache: Any) -> DispatchOutput:
        starts = batch.arrays.token_starts[row_of_each_token(batch)]
        return super().run_dispatch(  # type: ignore[no-any-return]
            with_arrays(batch, positions=(batch.arrays.positions - starts).astype(np.int32)),
            cache,
        )


class OffByOneAfterTheFirstChunk(ToyBackend):  # type: ignore[misc]
    """Positions one too far in every chunk but a prompt's first (``seq_len - query_len + 1``)."""

    def run_dispatch(self, batch: DispatchInput, cache: Any) -> DispatchOutput:
        later = batch.arrays.token_starts[row_of_each_token(batch)] > 0
        return super().run_dispatch(  # type: ignore[no-any-return]
            with_arrays(batch, positions=(batch.arrays.positions + later).astype(np.int32)),
            cache,
        )


# -- embeddings -----------------------------------------------------------------------------


class IgnoresHostEmbeddings(ToyBackend):  # type: ignore[misc]
    """Looks the token ids up even when host embeddings are given."""

    def run_dispatch(self, batch: DispatchInput, cache: Any) -> DispatchOutput:
        return super().run_dispatch(  # type: ignore[no-any-return]
            attrs.evolve(batch, input_embeddings=None), cache
        )


class ScalesHostEmbeddings(ToyBackend):  # type: ignore[misc]
    """Its host path scales the embeddings (a normalisation the device path does not do)."""

    def run_dispatch(self, batch: DispatchInput, cache: Any) -> DispatchOutput:
        x = batch.input_embeddings
        scaled = None if x is None else x * np.sqrt(self.hidden_size)
        return super().run_dispatch(  # type: ignore[no-any-return]
            attrs.evolve(batch, input_embeddings=scaled), cache
        )


# -- outputs --------------------------------------------------------------------------------


class ReversedRows(ToyBackend):  # type: ignore[misc]
    """Returns the final rows' outputs in reverse order."""

    def run_dispatch(self, batch: DispatchInput, cache: Any) -> DispatchOutput:
        output = super().run_dispatch(batch, cache)
        return DispatchOutput(
            logits=_flip(output.logits), greedy_token_ids=_flip(output.greedy_token_ids)
        )


def _flip(rows: Any) -> Any:
    return None if rows is None else rows[::-1]


class NaNLogits(ToyBackend):  # type: ignore[misc]
    def run_dispatch(self, batch: DispatchInput, cache: Any) -> DispatchOutput:
        output = super().run_dispatch(batch, cache)
        if output.logits is None:
            return output  # type: ignore[no-any-return]
        logits = output.logits.copy()
        logits[-1, 5] = np.nan
        return attrs.evolve(output, logits=logits)  # type: ignore[no-any-return]


class GreedyNotArgmax(ToyBackend):  # type: ignore[misc]
    """Greedy ids are the token after the argmax."""

    def run_dispatch(self, batch: DispatchInput, cache: Any) -> DispatchOutput:
        output = super().run_dispatch(batch, cache)
        if output.greedy_token_ids is None:
            return output  # type: ignore[no-any-return]
        wrong = (output.greedy_token_ids + 1) % self.vocab_size
        return attrs.evolve(output, greedy_token_ids=wrong)  # type: ignore[no-any-return]


class GreedyOutsideTheVocabulary(ToyBackend):  # type: ignore[misc]
    def run_dispatch(self, batch: DispatchInput, cache: Any) -> DispatchOutput:
        output = super().run_dispatch(batch, cache)
        if output.greedy_token_ids is None:
            return output  # type: ignore[no-any-return]
        return attrs.evolve(  # type: ignore[no-any-return]
            output, greedy_token_ids=np.full_like(output.greedy_token_ids, self.vocab_size)
        )


class LogitsForEveryRow(ToyBackend):  # type: ignore[misc]
    """Returns a logits row for intermediate chunks too."""

    def run_dispatch(self, batch: DispatchInput, cache: Any) -> DispatchOutput:
        super().run_dispatch(batch, cache)
        return DispatchOutput(logits=np.zeros((batch.arrays.num_rows, self.vocab_size)))


class ReturnsNone(ToyBackend):  # type: ignore[misc]
    """Returns None when nothing is asked, instead of DispatchOutput()."""

    def run_dispatch(self, batch: DispatchInput, cache: Any) -> Any:
        output = super().run_dispatch(batch, cache)
        return output if batch.return_logits or batch.return_greedy else None


class MutatesItsInputs(ToyBackend):  # type: ignore[misc]
    """Makes the token ids writeable and reuses them as scratch space. (A read-only view
    of a read-only array cannot be made writeable: it reaches the array that owns them.)"""

    def run_dispatch(self, batch: DispatchInput, cache: Any) -> DispatchOutput:
        output = super().run_dispatch(batch, cache)
        owner = batch.token_ids
        while isinstance(owner.base, np.ndarray):
            owner = owner.base
        owner.flags.writeable = True
        batch.token_ids.flags.writeable = True
        batch.token_ids[:] = 0
        return output  # type: ignore[no-any-return]


class MisnamedBackend(ToyBackend):  # type: ignore[misc]
    """Registered as 'toy' but declares another name."""

    name: ClassVar[str] = "toy2"


# -- decode rows ----------------------------------------------------------------------------
# A decode row is a final one-token chunk at position context - 1, before the dispatch's
# prefill chunks; a backend cannot tell it from a prefill's last one-token chunk, and these
# bugs key on that shape, as real decode paths do.


def decode_rows(batch: DispatchInput) -> npt.NDArray[np.bool_]:
    """Per row: whether it has a decode row's shape (final, one token, past position 0)."""
    arrays = batch.arrays
    decode: npt.NDArray[np.bool_] = (
        arrays.is_final & (arrays.query_lens == 1) & (arrays.token_starts > 0)
    )
    return decode


class DecodeIgnoresTheCache(ToyBackend):  # type: ignore[misc]
    """A decode path that attends to the new token alone, not to its context in the cache."""

    def run_dispatch(self, batch: DispatchInput, cache: Any) -> DispatchOutput:
        output = super().run_dispatch(batch, cache)
        decode = decode_rows(batch)[batch.arrays.is_final]  # among the final rows
        if not decode.any():
            return output  # type: ignore[no-any-return]
        x = batch.input_embeddings
        x = self.embed(batch.token_ids) if x is None else x
        new = x[batch.arrays.logits_indices[decode]]
        # Attention over one key gives its own value.
        alone = (new + new @ self._wv @ self._wo) @ self._lm_head
        logits = None if output.logits is None else np.array(output.logits)
        greedy = None if output.greedy_token_ids is None else np.array(output.greedy_token_ids)
        if logits is not None:
            logits[decode] = alone
        if greedy is not None:
            greedy[decode] = alone.argmax(axis=1)
        return DispatchOutput(logits=logits, greedy_token_ids=greedy)


def decode_tokens(batch: DispatchInput) -> npt.NDArray[np.int64]:
    """The flat indices of the decode rows' tokens."""
    return batch.arrays.cu_seqlens[:-1][decode_rows(batch)].astype(np.int64)


class DecodeWritesOneSlotLate(ToyBackend):  # type: ignore[misc]
    """Writes a decode row's K/V at the slot after its own."""

    def run_dispatch(self, batch: DispatchInput, cache: Any) -> DispatchOutput:
        slots = np.array(batch.arrays.slot_mapping)
        tokens = decode_tokens(batch)
        slots[tokens] = (slots[tokens] + 1) % cache.keys.shape[0]
        return super().run_dispatch(  # type: ignore[no-any-return]
            with_arrays(batch, slot_mapping=slots), cache
        )


class DecodeWritesIntoThePreviousPage(ToyBackend):  # type: ignore[misc]
    """Finds a decode row's page from the position before it (the last one cached): wrong
    when the new token is the first of a page granted for it."""

    def run_dispatch(self, batch: DispatchInput, cache: Any) -> DispatchOutput:
        arrays = batch.arrays
        slots = np.array(arrays.slot_mapping)
        size = arrays.page_size
        for row in np.flatnonzero(decode_rows(batch)):
            token = arrays.cu_seqlens[row]
            position = int(arrays.positions[token])
            page = arrays.block_tables[row, (position - 1) // size]
            slots[token] = page * size + position % size
        return super().run_dispatch(  # type: ignore[no-any-return]
            with_arrays(batch, slot_mapping=slots), cache
        )


class DecodeRowsAssumedLast(ToyBackend):  # type: ignore[misc]
    """Returns the prefill rows' outputs first, then the decode rows': it assumes a batch
    lays out its prefill chunks before its decode rows."""

    def run_dispatch(self, batch: DispatchInput, cache: Any) -> DispatchOutput:
        output = super().run_dispatch(batch, cache)
        order = np.argsort(decode_rows(batch)[batch.arrays.is_final], kind="stable")
        return DispatchOutput(
            logits=None if output.logits is None else output.logits[order],
            greedy_token_ids=None
            if output.greedy_token_ids is None
            else output.greedy_token_ids[order],
        )


class WritesEachSlotOnce(ToyBackend):  # type: ignore[misc]
    """Keeps the first K/V written to a slot (a later write lasts only its dispatch), as a
    cache that assumes a page keeps its owner would: wrong once pages freed by a finished
    or preempted request are reused."""

    def run_dispatch(self, batch: DispatchInput, cache: Any) -> DispatchOutput:
        if not hasattr(cache, "written"):
            cache.written = np.zeros(cache.keys.shape[0], dtype=bool)
        slots = batch.arrays.slot_mapping
        kept = slots[cache.written[slots]]
        keys, values = cache.keys[kept].copy(), cache.values[kept].copy()
        output = super().run_dispatch(batch, cache)
        cache.keys[kept], cache.values[kept] = keys, values
        cache.written[slots] = True
        return output  # type: ignore[no-any-return]


class StaticTableWidth(ToyBackend):  # type: ignore[misc]
    """Sizes a cache's block-table buffer from the first dispatch it sees, as a static
    (CUDA-graph style) buffer would, and cuts wider tables to it."""

    def run_dispatch(self, batch: DispatchInput, cache: Any) -> DispatchOutput:
        tables = batch.arrays.block_tables
        if not hasattr(cache, "width"):
            cache.width = tables.shape[1]
        cut = np.where(np.arange(tables.shape[1]) < cache.width, tables, 0)
        narrowed = with_arrays(batch, block_tables=cut.astype(tables.dtype))
        return super().run_dispatch(narrowed, cache)  # type: ignore[no-any-return]


class EightRowBuffer(ToyBackend):  # type: ignore[misc]
    """Writes the K/V of a dispatch's first 8 rows only, as a fixed 8-row buffer would."""

    def run_dispatch(self, batch: DispatchInput, cache: Any) -> DispatchOutput:
        arrays = batch.arrays
        dropped = arrays.slot_mapping[row_of_each_token(batch) >= 8]
        keys, values = cache.keys[dropped].copy(), cache.values[dropped].copy()
        output = super().run_dispatch(batch, cache)
        cache.keys[dropped], cache.values[dropped] = keys, values
        return output  # type: ignore[no-any-return]


class Int8Positions(ToyBackend):  # type: ignore[misc]
    """Keeps positions in an 8-bit type: they wrap past 127. Chunking does not change what
    it computes, so only an oracle catches it."""

    def run_dispatch(self, batch: DispatchInput, cache: Any) -> DispatchOutput:
        wrapped = batch.arrays.positions.astype(np.int8).astype(np.int32)
        return super().run_dispatch(with_arrays(batch, positions=wrapped), cache)  # type: ignore[no-any-return]


# -- the suite ------------------------------------------------------------------------------

DIFFERS = (
    r"final logits of request \d+ at position \d+ differ from one-shot by .* at vocabulary "
    r"column \d+"
)
GREEDY = r"greedy id \(vocabulary column\) \d+ of request \d+ at position \d+ is not an argmax"
GENERATED = (
    r"generation example \d+ .*, generated over \d+ dispatches .*: generated token \d+ of "
    r"request \d+, \d+, from the logits at position \d+, is not an argmax of the one-shot "
    r"logits of its context"
)
#: Decode bugs may show first in a prefill example's last one-token chunk, which has a
#: decode row's shape.
DECODE = rf"(?:{DIFFERS}|{GENERATED})"

BROKEN: list[tuple[type[Any], str]] = [
    (ContiguousPages, rf"scattered block tables .*: (?:{DIFFERS}|{GREEDY})"),
    (WritesOneSlotLate, rf"device embeddings, scattered block tables .*: {DIFFERS}"),
    (IgnoresTheCache, rf"chunked over \d+ dispatches, device embeddings.*: {DIFFERS}"),
    (AssumesAZeroedCache, rf"device embeddings.*: {DIFFERS}"),
    (ReadsWholePages, DIFFERS),
    (KeepsItsOwnCache, rf"(?:{DIFFERS}|failed on dispatch)"),
    (ChunkLocalPositions, rf"device embeddings.*: {DIFFERS}"),
    (OffByOneAfterTheFirstChunk, rf"device embeddings.*: {DIFFERS}"),
    (IgnoresHostEmbeddings, rf"host embeddings.*: {DIFFERS}"),
    (ScalesHostEmbeddings, rf"host embeddings.*: {DIFFERS}"),
    (ReversedRows, rf"(?:{DIFFERS}|{GREEDY})"),
    (
        NaNLogits,
        r"logits must be finite: final row \d+ \(request \d+\) has nan at vocabulary column 5",
    ),
    (GreedyNotArgmax, GREEDY),
    (GreedyOutsideTheVocabulary, r"greedy_token_ids must be in \[0, 64\), the vocabulary"),
    (LogitsForEveryRow, r"malformed output for dispatch \d+ of \d+ .*: logits must be"),
    (
        ReturnsNone,
        r"malformed output for dispatch \d+ of \d+ .*: expected a DispatchOutput, got NoneType",
    ),
    (MutatesItsInputs, r"run_dispatch modified its input batch.token_ids"),
    (DecodeIgnoresTheCache, DECODE),
    (DecodeWritesOneSlotLate, DECODE),
    (DecodeWritesIntoThePreviousPage, DECODE),
    (DecodeRowsAssumedLast, DECODE),
    (WritesEachSlotOnce, DECODE),
    (StaticTableWidth, rf"(?:{DIFFERS}|{GREEDY}|failed on dispatch)"),
    (EightRowBuffer, rf"(?:{DIFFERS}|{GREEDY})"),
]
DECODE_BUGS = [
    DecodeIgnoresTheCache,
    DecodeWritesOneSlotLate,
    DecodeWritesIntoThePreviousPage,
    DecodeRowsAssumedLast,
    WritesEachSlotOnce,
]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_toy_backend_itself_passes(seed: int) -> None:
    # Without this, a check that fails everything would "catch" every planted bug.
    check_backend(ToyBackend(seed=seed), name="toy", seed=seed)


@pytest.mark.parametrize(("broken", "message"), BROKEN, ids=[b.__name__ for b, _ in BROKEN])
def test_every_planted_bug_is_caught_with_a_message_naming_it(
    broken: type[Any], message: str
) -> None:
    with pytest.raises(AssertionError, match=message) as info:
        check_backend(broken())
    # Names the example to reproduce it.
    assert re.search(r"seed 0, (?:generation )?example \d+", str(info.value))


@pytest.mark.parametrize("broken", DECODE_BUGS, ids=[b.__name__ for b in DECODE_BUGS])
def test_every_decode_bug_fails_the_generation_case_alone(broken: type[Any]) -> None:
    with pytest.raises(AssertionError, match=GENERATED) as info:
        check_backend(broken(), max_examples=0)
    assert "seed 0, generation example" in str(info.value)


def test_a_bug_in_positions_past_127_passes_alone_and_fails_against_an_oracle() -> None:
    def oracle(prompts: Any) -> Any:
        lengths = [len(prompt) for prompt in prompts]
        return execute_schedule(plan_one_shot(lengths), ToyBackend(), prompts).logits

    check_backend(Int8Positions())  # chunking invariance holds: it is the model that is wrong
    with pytest.raises(AssertionError, match=r"one-shot: final logits of request \d+ at position"):
        check_backend(Int8Positions(), oracle=oracle)


def test_a_model_of_very_few_positions_passes() -> None:
    class FewPositions(ToyBackend):  # type: ignore[misc]
        max_position_embeddings = 1

    check_backend(FewPositions(), max_examples=4, generation_examples=0)


def test_a_backend_declaring_another_name_than_its_registration_fails() -> None:
    with pytest.raises(AssertionError, match="backend registered as 'toy' declares name 'toy2'"):
        check_backend(MisnamedBackend(), name="toy")


def test_the_toy_backend_checks_itself_when_run_as_a_script() -> None:
    result = subprocess.run(
        [sys.executable, str(EXAMPLE)], capture_output=True, text=True, check=True
    )
    assert result.stdout == "toy backend passes check_backend\n"


# -- registration -----------------------------------------------------------------------------


@pytest.fixture
def registered(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Pretend the toy backend is installed the way docs/writing-a-backend.md registers it,
    and also under a second, wrong name."""
    entry_points = [
        EntryPoint(name=name, value="examples_toy_backend:create_backend", group=GROUP)
        for name in ("toy", "toy2")
    ]
    monkeypatch.setattr(backends, "entry_points", lambda *, group: entry_points)
    refresh_backends()
    yield
    monkeypatch.undo()
    refresh_backends()


def test_the_registered_toy_backend_loads_and_passes_under_its_name(registered: None) -> None:
    backend = load_backend("toy", seed=3)
    check_backend(backend, name="toy", max_examples=5)


def test_load_backend_refuses_a_backend_registered_under_another_name(registered: None) -> None:
    with pytest.raises(
        BackendError,
        match=r"backend 'toy2' \(examples_toy_backend:create_backend\) must declare the name it "
        r"is registered under: it declares 'toy'",
    ):
        load_backend("toy2")


def test_the_docs_show_the_toy_backend_file_verbatim() -> None:
    # docs/writing-a-backend.md runs the code it shows (tests/test_docs.py); this keeps the
    # file a reader copies the same code.
    page = (EXAMPLE.parent.parent / "writing-a-backend.md").read_text()
    assert f"```python\n{EXAMPLE.read_text()}```\n" in page
