"""The errors this backend raises beyond those of :mod:`pypto_sched` (checkpoint problems are
:class:`pypto_sched.CheckpointError`, raised by the shared reader)."""

from __future__ import annotations

from pypto_sched import PyptoSchedError

__all__ = ["NpuUnavailableError"]


class NpuUnavailableError(PyptoSchedError, RuntimeError):
    """torch_npu was asked for explicitly but cannot be used here; the message says why."""
