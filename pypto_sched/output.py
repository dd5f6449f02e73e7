"""``pypto_sched.output``: the public path of :mod:`pypto_sched.runtime.output`, its home.

Everything that module exports is importable from here, as before the layering.
"""

from .runtime.output import *  # noqa: F403
from .runtime.output import __all__ as __all__
