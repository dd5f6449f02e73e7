"""``pypto_sched.execute``: the public path of :mod:`pypto_sched.runtime.execute`, its home.

Everything that module exports is importable from here, as before the layering.
"""

from .runtime.execute import *  # noqa: F403
from .runtime.execute import __all__ as __all__
