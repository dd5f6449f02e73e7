"""A toy backend to copy: one rotary attention layer over a paged KV cache, in NumPy.

It keeps the whole backend contract of ``pypto_sched.backends`` with no index arithmetic of
its own (``DispatchArrays.row_tokens`` and ``context_slots`` do it) and passes
``pypto_sched.testing.check_backend``. Run it as a script to check it::

    python docs/examples/toy_backend.py
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import numpy.typing as npt

from pypto_sched.backends import BackendError, DispatchInput, DispatchOutput

F64 = npt.NDArray[np.float64]


class ToyCache:
    """Keys and values, one vector per KV slot: ``[num_pages * page_size, hidden_size]``."""

    def __init__(self, *, num_pages: int, page_size: int, hidden_size: int) -> None:
        self.keys = np.zeros((num_pages * page_size, hidden_size))
        self.values = np.zeros((num_pages * page_size, hidden_size))


class ToyBackend:
    """Embedding, one single-head attention layer with rotary positions, a residual and a
    vocabulary projection, in float64."""

    name: ClassVar[str] = "toy"

    def __init__(self, *, vocab_size: int = 64, hidden_size: int = 16, seed: int = 0) -> None:
        if hidden_size % 2:
            raise ValueError(f"'hidden_size' must be even (rotary pairs): {hidden_size}")
        rng = np.random.default_rng(seed)
        scale = hidden_size**-0.5
        self._embedding = rng.standard_normal((vocab_size, hidden_size))
        self._wq, self._wk, self._wv, self._wo, self._lm_head = (
            rng.standard_normal(shape) * scale
            for shape in [(hidden_size, hidden_size)] * 4 + [(hidden_size, vocab_size)]
        )

    @property
    def tolerance(self) -> float:
        return 1e-9  # float64 throughout: only the summation order changes with chunking

    @property
    def vocab_size(self) -> int:
        return int(self._lm_head.shape[1])

    @property
    def hidden_size(self) -> int:
        return int(self._embedding.shape[1])

    def new_cache(self, *, num_pages: int, page_size: int) -> ToyCache:
        return ToyCache(num_pages=num_pages, page_size=page_size, hidden_size=self.hidden_size)

    def embed(self, token_ids: npt.NDArray[np.int64]) -> F64:
        return self._embedding[token_ids]

    def run_dispatch(self, batch: DispatchInput, cache: Any) -> DispatchOutput:
        arrays = batch.arrays
        x = batch.input_embeddings  # host embeddings: use them, never the ids
        if x is None:  # the device-embedding path
            x = self.embed(batch.token_ids)
        positions = arrays.positions
        # This dispatch's keys and values, written at its slots only.
        cache.keys[arrays.slot_mapping] = _rotate(x @ self._wk, positions)
        cache.values[arrays.slot_mapping] = x @ self._wv
        if not (batch.return_logits or batch.return_greedy):
            return DispatchOutput()  # nothing asked (a dispatch of intermediate chunks)
        hidden = []
        for row in np.flatnonzero(arrays.is_final):
            last = arrays.row_tokens(row).stop - 1  # the row's last token, in flat order
            query = _rotate(x[last : last + 1] @ self._wq, positions[last : last + 1])[0]
            # The last token sees its whole context: cached prefix, earlier chunks, this one.
            slots = arrays.context_slots(row)
            scores = cache.keys[slots] @ query / np.sqrt(self.hidden_size)
            weights = np.exp(scores - scores.max())
            attended = weights / weights.sum() @ cache.values[slots]
            hidden.append(x[last] + attended @ self._wo)
        logits = np.array(hidden) @ self._lm_head
        finite = np.isfinite(logits).all(axis=1)
        if batch.return_greedy and not finite.all():  # the ids alone would hide a NaN
            bad = int(np.flatnonzero(~finite)[0])
            raise BackendError(f"logits must be finite to give greedy ids: final row {bad}")
        return DispatchOutput(
            logits=logits if batch.return_logits else None,
            greedy_token_ids=logits.argmax(axis=1) if batch.return_greedy else None,
        )


def _rotate(x: F64, positions: npt.NDArray[np.int32]) -> F64:
    """Rotary position embedding: rotate each pair of features by a position's angles."""
    half = x.shape[1] // 2
    angles = positions[:, None] * 10_000.0 ** (-np.arange(half) / half)
    cos, sin = np.cos(angles), np.sin(angles)
    first, second = x[:, :half], x[:, half:]
    return np.concatenate([first * cos - second * sin, first * sin + second * cos], axis=1)


def create_backend(**options: Any) -> ToyBackend:
    """The entry point's factory: keyword options in, a backend out."""
    return ToyBackend(**options)


if __name__ == "__main__":
    from pypto_sched.testing import check_backend

    check_backend(ToyBackend(), name="toy")
    print("toy backend passes check_backend")
