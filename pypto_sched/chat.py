"""``pypto_sched.chat``: the public path of :mod:`pypto_sched.runtime.chat`, its home.

Everything that module exports is importable from here, as before the layering.
"""

from __future__ import annotations

from .runtime.chat import (
    CHAT_TEMPLATE_FILE as CHAT_TEMPLATE_FILE,
)
from .runtime.chat import (
    TOKENIZER_CONFIG_FILE as TOKENIZER_CONFIG_FILE,
)
from .runtime.chat import (
    ChatTemplate as ChatTemplate,
)
from .runtime.chat import (
    check_messages as check_messages,
)

__all__ = [
    "CHAT_TEMPLATE_FILE",
    "TOKENIZER_CONFIG_FILE",
    "ChatTemplate",
    "check_messages",
]
