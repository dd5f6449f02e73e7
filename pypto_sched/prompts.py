"""``pypto_sched.prompts``: the public path of :mod:`pypto_sched.runtime.prompts`, its home.

Everything that module exports is importable from here, as before the layering.
"""

from __future__ import annotations

from .runtime.prompts import (
    LINE_ALIASES as LINE_ALIASES,
)
from .runtime.prompts import (
    LINE_SAMPLING as LINE_SAMPLING,
)
from .runtime.prompts import (
    MAX_LINE_BYTES as MAX_LINE_BYTES,
)
from .runtime.prompts import (
    TOKENIZER_FILE as TOKENIZER_FILE,
)
from .runtime.prompts import (
    ChatRenderer as ChatRenderer,
)
from .runtime.prompts import (
    MissingDependencyError as MissingDependencyError,
)
from .runtime.prompts import (
    PromptRequest as PromptRequest,
)
from .runtime.prompts import (
    TextCodec as TextCodec,
)
from .runtime.prompts import (
    Tokenizer as Tokenizer,
)
from .runtime.prompts import (
    eos_token_ids as eos_token_ids,
)
from .runtime.prompts import (
    generated_text as generated_text,
)
from .runtime.prompts import (
    load_tokenizer as load_tokenizer,
)
from .runtime.prompts import (
    output_line as output_line,
)
from .runtime.prompts import (
    output_lines as output_lines,
)
from .runtime.prompts import (
    read_bounded as read_bounded,
)
from .runtime.prompts import (
    read_config as read_config,
)
from .runtime.prompts import (
    read_prompts as read_prompts,
)

__all__ = [
    "LINE_ALIASES",
    "LINE_SAMPLING",
    "MAX_LINE_BYTES",
    "TOKENIZER_FILE",
    "ChatRenderer",
    "MissingDependencyError",
    "PromptRequest",
    "TextCodec",
    "Tokenizer",
    "eos_token_ids",
    "generated_text",
    "load_tokenizer",
    "output_line",
    "output_lines",
    "read_bounded",
    "read_config",
    "read_prompts",
]
