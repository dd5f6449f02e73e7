"""``pypto_sched.backends``: the public path of :mod:`pypto_sched.runtime.backends`, its home.

Everything that module exports is importable from here, as before the layering.
"""

from __future__ import annotations

from .runtime.backends import (
    ENTRY_POINT_GROUP as ENTRY_POINT_GROUP,
)
from .runtime.backends import (
    Backend as Backend,
)
from .runtime.backends import (
    BackendError as BackendError,
)
from .runtime.backends import (
    BackendFactory as BackendFactory,
)
from .runtime.backends import (
    BackendNotFoundError as BackendNotFoundError,
)
from .runtime.backends import (
    BackendStatus as BackendStatus,
)
from .runtime.backends import (
    DispatchInput as DispatchInput,
)
from .runtime.backends import (
    DispatchOutput as DispatchOutput,
)
from .runtime.backends import (
    backend_status as backend_status,
)
from .runtime.backends import (
    backend_statuses as backend_statuses,
)
from .runtime.backends import (
    build_backends as build_backends,
)
from .runtime.backends import (
    describe_factory as describe_factory,
)
from .runtime.backends import (
    list_backends as list_backends,
)
from .runtime.backends import (
    load_backend as load_backend,
)
from .runtime.backends import (
    refresh_backends as refresh_backends,
)
from .runtime.backends import (
    relative_tolerance as relative_tolerance,
)

__all__ = [
    "ENTRY_POINT_GROUP",
    "Backend",
    "BackendError",
    "BackendFactory",
    "BackendNotFoundError",
    "BackendStatus",
    "DispatchInput",
    "DispatchOutput",
    "backend_status",
    "backend_statuses",
    "build_backends",
    "describe_factory",
    "list_backends",
    "load_backend",
    "refresh_backends",
]
