"""The backend contract: what a backend is told for one dispatch and what it returns.

A backend executes dispatches of a :class:`~pypto_sched.Schedule` on some device. It holds
weights but no per-batch state: the KV cache is an object the backend creates with
:meth:`Backend.new_cache` and receives back with every dispatch, so a caller (or a
conformance check) can run the same prompts through two caches side by side.

Nothing here imports torch or any device library; array arguments are NumPy arrays, and a
backend may return its own array type (a device tensor) as long as it supports ``shape``,
indexing and ``numpy.asarray`` when the caller asks for host data.
"""

from __future__ import annotations

from typing import Any, ClassVar, Protocol, runtime_checkable

import attrs
import numpy as np
import numpy.typing as npt

from ._dispatch import DispatchArrays

__all__ = ["Backend", "DispatchInput", "DispatchOutput"]


@attrs.frozen(eq=False)
class DispatchInput:
    """Everything a backend needs to run one dispatch."""

    #: Positions, cumulative query lengths, context lengths, block tables, slots, final rows.
    arrays: DispatchArrays
    #: Per token (flat, rows concatenated): the token id.
    token_ids: npt.NDArray[np.int64]
    #: Per token: host-side input embeddings ``[num_tokens, hidden_size]``, or ``None`` when
    #: the backend must look the token ids up itself (the device-embedding path).
    input_embeddings: npt.NDArray[np.floating[Any]] | None
    #: Whether to return greedy (argmax) token ids for the final rows.
    return_greedy: bool


@attrs.frozen(eq=False)
class DispatchOutput:
    """What a backend returns for one dispatch: results for its final rows only."""

    #: ``[num_final_rows, vocab_size]`` logits, one row per final row in row order.
    logits: Any
    #: ``[num_final_rows]`` greedy token ids when they were asked for, else ``None``.
    greedy_token_ids: Any | None = None


@runtime_checkable
class Backend(Protocol):
    """A dispatch executor. Register one under the ``pypto_sched.backends`` entry point."""

    #: The name it is registered under.
    name: ClassVar[str]
    #: Largest absolute difference between chunked and one-shot logits this backend
    #: promises (see :func:`pypto_sched.testing.check_backend`).
    tolerance: ClassVar[float]

    @property
    def vocab_size(self) -> int: ...

    @property
    def hidden_size(self) -> int: ...

    def new_cache(self, *, num_pages: int, page_size: int) -> Any:
        """An empty KV cache of ``num_pages`` pages of ``page_size`` slots."""
        ...

    def embed(self, token_ids: npt.NDArray[np.int64]) -> npt.NDArray[np.floating[Any]]:
        """Host-side input embeddings of ``token_ids`` (``[n, hidden_size]``)."""
        ...

    def run_dispatch(self, batch: DispatchInput, cache: Any) -> DispatchOutput:
        """Run one dispatch: write its K/V into ``cache`` at ``batch.arrays.slot_mapping``
        and return logits (and greedy ids if asked) for its final rows only."""
        ...
