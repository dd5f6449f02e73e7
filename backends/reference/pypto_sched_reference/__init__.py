"""The reference backend of pypto_sched: a Qwen3-style decoder in NumPy with a paged KV cache.

Registered under the ``pypto_sched.backends`` entry point as ``reference``::

    backend = pypto_sched.load_backend("reference", seed=0)

It is exact enough (float64) to serve as the oracle every other backend is checked against.
"""

from ._backend import ReferenceBackend, create_backend
from ._cache import PagedKVCache
from ._config import ModelConfig
from ._errors import CacheWriteError, CheckpointError, InvalidModelError, ReferenceBackendError
from ._safetensors import read_safetensors, write_safetensors
from ._weights import DTYPES, LayerWeights, Weights, load_checkpoint, save_checkpoint

__all__ = [
    "DTYPES",
    "CacheWriteError",
    "CheckpointError",
    "InvalidModelError",
    "LayerWeights",
    "ModelConfig",
    "PagedKVCache",
    "ReferenceBackend",
    "ReferenceBackendError",
    "Weights",
    "create_backend",
    "load_checkpoint",
    "read_safetensors",
    "save_checkpoint",
    "write_safetensors",
]
