"""The errors this backend raises beyond those of :mod:`pypto_sched`."""

from __future__ import annotations

from pypto_sched import PyptoSchedError

__all__ = ["CheckpointError", "NpuUnavailableError"]


class CheckpointError(PyptoSchedError, ValueError):
    """A checkpoint directory cannot be loaded; the message names the file and the tensor."""


class NpuUnavailableError(PyptoSchedError, RuntimeError):
    """torch_npu was asked for explicitly but cannot be used here; the message says why."""
