"""``pypto_sched.backends``: the public path of :mod:`pypto_sched.runtime.backends`, its home.

Everything that module exports is importable from here, as before the layering.
"""

from .runtime.backends import *  # noqa: F403
from .runtime.backends import __all__ as __all__
from .runtime.backends import (
    relative_tolerance as relative_tolerance,
)  # not in __all__: the npu backend's tests use it
