"""pypto_sched_npu: a Qwen3 backend for pypto_sched, on CPU with torch and on Ascend NPUs
with torch_npu.

Load a Hugging Face Qwen3 checkpoint with :meth:`NpuBackend.from_checkpoint` (or
``pypto_sched.backends.load_backend("npu", checkpoint=...)``) and run schedules through it
with the pypto_sched driver. The checkpoint is read by the shared reader
:mod:`pypto_sched.checkpoints` and the model described by its ``ModelConfig``. torch_npu
is optional and imported only when an NPU is asked for or detected
(:func:`npu_availability`).
"""

from ._availability import (
    FORCE_CPU_ENV,
    NpuAvailability,
    npu_availability,
    refresh_availability,
)
from ._errors import NpuUnavailableError
from ._kv_cache import PagedKVCache
from ._loader import Checkpoint, load_checkpoint
from .backend import DTYPES, NpuBackend, TorchBackend
from .ops import OPS_CHOICES, OpsChoice

__all__ = [
    "DTYPES",
    "FORCE_CPU_ENV",
    "OPS_CHOICES",
    "Checkpoint",
    "NpuAvailability",
    "NpuBackend",
    "NpuUnavailableError",
    "OpsChoice",
    "PagedKVCache",
    "TorchBackend",
    "load_checkpoint",
    "npu_availability",
    "refresh_availability",
]
