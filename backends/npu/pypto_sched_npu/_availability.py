"""Whether torch_npu can be used here: found out lazily, once, and never by a bare import.

``torch_npu`` is an optional extra that is absent from CI and most machines, and a broken
install is common (installed without the CANN toolkit, ``import torch_npu`` raises about a
missing ``libhccl.so``; ``importlib.util.find_spec`` alone says it is there). So detection
takes three steps, each of which can say no with a reason:

1. the module's spec is found;
2. importing it succeeds (any exception is caught and becomes the reason);
3. ``torch.npu.is_available()`` is true.

Nothing is imported until someone asks. The answer is cached; :func:`refresh_availability`
forgets it (after installing torch_npu in a running process, or in tests). Setting the
environment variable :data:`FORCE_CPU_ENV` to a true value (``1``, ``true``, ``yes``, ``on``)
makes the answer "unavailable" without importing anything, so the backend picks the CPU path.
An explicit ``ops="npu"`` still imports the module: an argument outranks the environment.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
from types import ModuleType

import attrs
import torch

from ._errors import NpuUnavailableError

__all__ = [
    "FORCE_CPU_ENV",
    "NpuAvailability",
    "npu_availability",
    "refresh_availability",
    "torch_npu_module",
]

#: Environment variable that forces the CPU path when set to a true value.
FORCE_CPU_ENV = "PYPTO_SCHED_FORCE_CPU"

_TRUE_VALUES = frozenset({"1", "true", "yes", "on"})


@attrs.frozen
class NpuAvailability:
    """The outcome of detection: whether the NPU path can run, and if not, why not."""

    available: bool
    reason: str

    def __bool__(self) -> bool:
        return self.available


@functools.cache
def _import_torch_npu() -> ModuleType | str:
    """The torch_npu module, or the reason it cannot be imported."""
    try:
        spec = importlib.util.find_spec("torch_npu")
    except (ImportError, ValueError) as error:
        return f"looking for torch_npu failed: {type(error).__name__}: {error}"
    if spec is None:
        return "torch_npu is not installed"
    try:
        return importlib.import_module("torch_npu")
    except Exception as error:  # a broken install raises anything from ImportError to OSError
        return f"torch_npu is installed but importing it failed: {type(error).__name__}: {error}"


@functools.cache
def _detect() -> NpuAvailability:
    forced = os.environ.get(FORCE_CPU_ENV, "").strip().lower()
    if forced in _TRUE_VALUES:
        return NpuAvailability(available=False, reason=f"{FORCE_CPU_ENV}={forced} forces CPU")
    module = _import_torch_npu()
    if isinstance(module, str):
        return NpuAvailability(available=False, reason=module)
    npu = getattr(torch, "npu", None)
    if npu is None:
        return NpuAvailability(
            available=False, reason="torch_npu imported but registered no torch.npu"
        )
    try:
        found = bool(npu.is_available())
    except Exception as error:
        return NpuAvailability(
            available=False,
            reason=f"torch.npu.is_available() failed: {type(error).__name__}: {error}",
        )
    if not found:
        return NpuAvailability(available=False, reason="torch.npu.is_available() is False")
    return NpuAvailability(available=True, reason="torch_npu imported and an NPU is visible")


def npu_availability() -> NpuAvailability:
    """Whether an NPU can be used here (cached; see the module docstring)."""
    return _detect()


def torch_npu_module() -> ModuleType:
    """The imported torch_npu module, for an explicit request of the NPU ops.

    Raises :class:`NpuUnavailableError` with the reason when it cannot be imported.
    """
    module = _import_torch_npu()
    if isinstance(module, str):
        raise NpuUnavailableError(f"the NPU ops need torch_npu: {module}")
    return module


def refresh_availability() -> None:
    """Forget the cached detection, so the next question looks again."""
    _import_torch_npu.cache_clear()
    _detect.cache_clear()
