"""The reference backend of pypto_sched: a Qwen3 decoder in NumPy with a paged KV cache.

Registered under the ``pypto_sched.backends`` entry point as ``reference``::

    backend = pypto_sched.load_backend("reference", seed=0)

It is exact enough (float64) to serve as the oracle every other backend is checked against,
and is itself checked against transformers. Checkpoints are read by the shared reader
:mod:`pypto_sched.checkpoints`, and the model is described by its
:class:`~pypto_sched.checkpoints.ModelConfig`.
"""

from ._backend import ReferenceBackend, create_backend
from ._cache import PagedKVCache
from ._errors import CacheWriteError, InvalidModelError, ReferenceBackendError
from ._weights import DTYPES, TINY_MODEL, LayerWeights, Weights, load_checkpoint, save_checkpoint

__all__ = [
    "DTYPES",
    "TINY_MODEL",
    "CacheWriteError",
    "InvalidModelError",
    "LayerWeights",
    "PagedKVCache",
    "ReferenceBackend",
    "ReferenceBackendError",
    "Weights",
    "create_backend",
    "load_checkpoint",
    "save_checkpoint",
]
