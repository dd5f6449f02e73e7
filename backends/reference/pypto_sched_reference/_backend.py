"""ReferenceBackend: the NumPy model behind pypto_sched's Backend protocol."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import attrs
import numpy as np
import numpy.typing as npt

from pypto_sched.backends import DispatchInput, DispatchOutput, describe_factory
from pypto_sched.checkpoints import ModelConfig

from ._cache import PagedKVCache
from ._errors import CacheWriteError, InvalidModelError, ReferenceBackendError
from ._model import final_hidden, logits_of
from ._weights import TINY_MODEL, Weights, load_checkpoint

__all__ = ["ReferenceBackend", "create_backend"]

#: Chunked-vs-one-shot logits agreement promised per dtype: only the summation order of
#: attention and matrix products differs between the two, so float64 agrees to rounding.
_TOLERANCE = {np.dtype(np.float64): 1e-9, np.dtype(np.float32): 1e-4}


@attrs.frozen(eq=False)
class ReferenceBackend:
    """A Qwen3-style decoder in NumPy with a paged KV cache: the oracle for other backends.

    Build one with :meth:`from_seed` or :meth:`from_checkpoint` (or, through discovery,
    ``pypto_sched.load_backend("reference", **options)``; see :func:`create_backend`).
    """

    name: ClassVar[str] = "reference"

    weights: Weights

    @classmethod
    def from_seed(
        cls, config: ModelConfig | None = None, *, seed: int = 0, dtype: str = "float64"
    ) -> ReferenceBackend:
        """A model of ``config`` (default: :data:`TINY_MODEL`) with weights drawn from
        ``seed``."""
        return cls(Weights.random(config or TINY_MODEL, seed=seed, dtype=dtype))

    @classmethod
    def from_checkpoint(cls, directory: str | Path, *, dtype: str = "float64") -> ReferenceBackend:
        """A Hugging Face Qwen3 checkpoint directory (``config.json`` + safetensors)."""
        return cls(load_checkpoint(directory, dtype=dtype))

    @property
    def config(self) -> ModelConfig:
        return self.weights.config

    @property
    def dtype(self) -> np.dtype[Any]:
        return self.weights.dtype

    @property
    def tolerance(self) -> float:
        return _TOLERANCE[self.dtype]

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    @property
    def hidden_size(self) -> int:
        return self.config.hidden_size

    @property
    def max_position_embeddings(self) -> int:
        """The model's positions (the optional attribute of the backend contract)."""
        return self.config.max_position_embeddings

    def new_cache(self, *, num_pages: int, page_size: int) -> PagedKVCache:
        return PagedKVCache.empty(
            self.config, num_pages=num_pages, page_size=page_size, dtype=self.dtype
        )

    def embed(self, token_ids: npt.NDArray[np.int64]) -> npt.NDArray[np.floating[Any]]:
        ids = np.asarray(token_ids)
        self._check_token_ids(ids)
        return self.weights.embed[ids]

    def run_dispatch(self, batch: DispatchInput, cache: Any) -> DispatchOutput:
        self._check_cache(cache)
        tokens = batch.arrays.num_tokens
        ids = np.asarray(batch.token_ids)
        if ids.shape != (tokens,):
            raise InvalidModelError.about("token_ids", f"must have shape ({tokens},): {ids.shape}")
        if batch.input_embeddings is None:
            x = self.embed(ids)
        else:
            x = np.asarray(batch.input_embeddings, dtype=self.dtype)
            if x.shape != (tokens, self.hidden_size):
                raise InvalidModelError.about(
                    "input_embeddings", f"must have shape ({tokens}, {self.hidden_size}): {x.shape}"
                )
        hidden = final_hidden(self.weights, x, cache=cache, arrays=batch.arrays)
        if not (batch.return_logits or batch.return_greedy):
            return DispatchOutput()
        logits = logits_of(self.weights, hidden)
        if batch.return_greedy:
            _check_finite(logits, batch.arrays.final_requests)
        return DispatchOutput(
            logits=logits if batch.return_logits else None,
            greedy_token_ids=np.argmax(logits, axis=-1).astype(np.int64)
            if batch.return_greedy
            else None,
        )

    def _check_token_ids(self, ids: npt.NDArray[Any]) -> None:
        if ids.dtype.kind not in "iu" or (
            ids.size and not 0 <= ids.min() <= ids.max() < self.vocab_size
        ):
            raise InvalidModelError.about(
                "token_ids",
                f"must be ints in [0, {self.vocab_size}): dtype {ids.dtype}, "
                f"range [{ids.min() if ids.size else None}, {ids.max() if ids.size else None}]",
            )

    def _check_cache(self, cache: object) -> None:
        if not isinstance(cache, PagedKVCache):
            raise CacheWriteError.about(
                "cache", f"must be a PagedKVCache from new_cache(): {type(cache).__name__}"
            )
        expected = (
            self.config.num_hidden_layers,
            cache.num_slots,
            self.config.num_key_value_heads,
            self.config.head_dim,
        )
        if cache.keys.shape != expected or cache.keys.dtype != self.dtype:
            raise CacheWriteError.about(
                "cache",
                f"must be built by this backend: shape {cache.keys.shape}, dtype "
                f"{cache.keys.dtype}; expected {expected}, {self.dtype}",
            )


def _check_finite(logits: npt.NDArray[np.floating[Any]], requests: npt.NDArray[Any]) -> None:
    """Refuse greedy ids from non-finite logits: the argmax of a NaN row is a valid-looking id,
    and the driver, handed only the ids, could not tell (it checks the logits it gets)."""
    if np.isfinite(logits).all():
        return
    row, column = (int(i) for i in np.argwhere(~np.isfinite(logits))[0])
    raise ReferenceBackendError(
        f"logits must be finite to give greedy ids: final row {row} (request "
        f"{int(requests[row])}) has {logits[row, column]} at vocabulary column {column}"
    )


#: The options of :func:`create_backend`, as ``pypto-sched backends`` lists them.
_OPTIONS = {
    "checkpoint": "a Hugging Face Qwen3 checkpoint directory (default: random weights)",
    "seed": "random weights only: their seed (default 0)",
    "dtype": "float64 (default) or float32",
    **{
        field.name: (
            f"random weights only: the model's {field.name} "
            f"(default {getattr(TINY_MODEL, field.name)!r})"
        )
        for field in attrs.fields(ModelConfig)
    },
}


@describe_factory(options=_OPTIONS)
def create_backend(
    *,
    checkpoint: str | Path | None = None,
    seed: int | None = None,
    dtype: str = "float64",
    **config: Any,
) -> ReferenceBackend:
    """The ``reference`` entry point: a model loaded from ``checkpoint``, or else one with
    random weights from ``seed`` (default 0) whose
    :class:`~pypto_sched.checkpoints.ModelConfig` fields are ``config`` (the others those of
    :data:`TINY_MODEL`). The random-weight options are refused with ``checkpoint``."""
    if checkpoint is not None:
        ignored = sorted(config) + ([] if seed is None else ["seed"])
        if ignored:
            raise InvalidModelError(
                f"the weights and model sizes come from the checkpoint; drop the options {ignored}"
            )
        return ReferenceBackend.from_checkpoint(checkpoint, dtype=dtype)
    known = {field.name for field in attrs.fields(ModelConfig)}
    unknown = sorted(set(config) - known)
    if unknown:
        raise InvalidModelError(f"unknown options {unknown}; model options: {sorted(known)}")
    model = attrs.evolve(TINY_MODEL, **config)
    return ReferenceBackend.from_seed(model, seed=0 if seed is None else seed, dtype=dtype)
