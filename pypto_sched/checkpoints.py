"""``pypto_sched.checkpoints``: the public path of :mod:`pypto_sched.models.qwen3`, its home.

Everything that module exports is importable from here, as before the layering.
"""

from .models.qwen3 import *  # noqa: F403
from .models.qwen3 import __all__ as __all__
