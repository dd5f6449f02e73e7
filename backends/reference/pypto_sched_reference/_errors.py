"""Errors of the reference backend, under pypto_sched's :class:`~pypto_sched.BackendError`.

Checkpoint problems are pypto_sched's own :class:`~pypto_sched.CheckpointError`, raised by
the shared reader :mod:`pypto_sched.checkpoints`.
"""

from __future__ import annotations

from pypto_sched.backends import BackendError

__all__ = ["CacheWriteError", "InvalidModelError", "ReferenceBackendError"]


class ReferenceBackendError(BackendError):
    """Base class of the reference backend's errors."""


class InvalidModelError(ReferenceBackendError, ValueError):
    """A model's weights or a backend option is malformed."""


class CacheWriteError(ReferenceBackendError, ValueError):
    """A dispatch would write or read KV slots outside its requests' pages, or its cache does
    not fit the model."""
