"""``pypto_sched.chat``: the public path of :mod:`pypto_sched.runtime.chat`, its home.

Everything that module exports is importable from here, as before the layering.
"""

from .runtime.chat import *  # noqa: F403
from .runtime.chat import __all__ as __all__
