"""Errors of the reference backend, under pypto_sched's :class:`~pypto_sched.BackendError`."""

from __future__ import annotations

from pypto_sched.backends import BackendError

__all__ = ["CacheWriteError", "CheckpointError", "InvalidModelError", "ReferenceBackendError"]


class ReferenceBackendError(BackendError):
    """Base class of the reference backend's errors."""


class InvalidModelError(ReferenceBackendError, ValueError):
    """A model config, its weights or a backend option is malformed."""


class CheckpointError(ReferenceBackendError, ValueError):
    """A checkpoint directory is missing files or tensors, or describes an unsupported model."""


class CacheWriteError(ReferenceBackendError, ValueError):
    """A dispatch would write or read KV slots outside its requests' pages, or its cache does
    not fit the model."""
