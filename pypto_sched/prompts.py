"""``pypto_sched.prompts``: the public path of :mod:`pypto_sched.runtime.prompts`, its home.

Everything that module exports is importable from here, as before the layering.
"""

from .runtime.prompts import *  # noqa: F403
from .runtime.prompts import __all__ as __all__
