"""``pypto_sched.output``: the public path of :mod:`pypto_sched.runtime.output`, its home.

Everything that module exports is importable from here, as before the layering.
"""

from __future__ import annotations

from .runtime.output import (
    PARTIAL_SUFFIX as PARTIAL_SUFFIX,
)
from .runtime.output import (
    OutputFile as OutputFile,
)
from .runtime.output import (
    ResumeError as ResumeError,
)
from .runtime.output import (
    fingerprint as fingerprint,
)
from .runtime.output import (
    write_atomically as write_atomically,
)

__all__ = [
    "PARTIAL_SUFFIX",
    "OutputFile",
    "ResumeError",
    "fingerprint",
    "write_atomically",
]
