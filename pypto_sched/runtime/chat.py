"""Chat templates: a conversation of messages to the prompt text a model was trained on, as
transformers' ``apply_chat_template`` renders it.

A checkpoint directory saved by transformers holds its template in ``chat_template.jinja``
(transformers 5) or under ``"chat_template"`` in ``tokenizer_config.json`` (a string, or a
list of named templates of which ``"default"`` is used), and its special tokens
(``bos_token``, ``eos_token``, ...) in ``tokenizer_config.json``. :class:`ChatTemplate`
renders the template with Jinja2 in a sandbox as transformers does: blocks trimmed
(``trim_blocks``, ``lstrip_blocks``), ``loop controls``, a ``tojson`` that keeps non-ASCII
text, ``raise_exception(message)``, ``strftime_now(format)``, the special tokens as
variables, and ``messages`` and ``add_generation_prompt``. The text is then tokenized without
adding special tokens (the template writes them), as transformers tokenizes it.

Jinja2 is an optional dependency (``pip install 'pypto-sched[tokenizer]'``), imported only
when a template is rendered.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from ..core._errors import InvalidInputError
from .prompts import MissingDependencyError, read_bounded, read_config

__all__ = ["CHAT_TEMPLATE_FILE", "TOKENIZER_CONFIG_FILE", "ChatTemplate", "check_messages"]

#: Where transformers 5 saves a single chat template.
CHAT_TEMPLATE_FILE = "chat_template.jinja"
#: Where older checkpoints keep it, and where every checkpoint keeps its special tokens.
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
#: The special tokens transformers passes to a template by name.
_SPECIAL_TOKENS = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)
_MAX_BYTES = 16 * 1024 * 1024


class ChatTemplate:
    """A chat template and the special tokens it may name; :meth:`render` applies it."""

    def __init__(
        self, source: str, *, special_tokens: Mapping[str, str] | None = None, where: str = ""
    ) -> None:
        if not isinstance(source, str):
            raise InvalidInputError.about(
                "source", f"must be a template string: {type(source).__name__}"
            )
        self.source = source
        self.special_tokens = dict(special_tokens or {})
        self.where = where or "the chat template"
        self._compiled: Any = None

    @classmethod
    def from_directory(cls, directory: str | Path) -> ChatTemplate | None:
        """The template of the checkpoint ``directory``, or ``None`` when it has none."""
        folder = Path(directory)
        config_path = folder / TOKENIZER_CONFIG_FILE
        config = read_config(config_path) if config_path.is_file() else {}
        special = {
            name: token
            for name in _SPECIAL_TOKENS
            if (token := _token_text(config.get(name))) is not None
        }
        template_path = folder / CHAT_TEMPLATE_FILE
        if template_path.is_file():
            source = read_bounded(template_path, _MAX_BYTES).decode("utf-8", errors="strict")
            return cls(source, special_tokens=special, where=repr(str(template_path)))
        found = config.get("chat_template")
        if isinstance(found, list):  # named templates: the default one
            found = next(
                (t.get("template") for t in found if isinstance(t, dict)
                 and t.get("name") == "default"),
                None,
            )  # fmt: skip
        if found is None:
            return None
        if not isinstance(found, str):
            raise InvalidInputError(
                f"{str(config_path)!r}: 'chat_template' must be a string or a list of named "
                f"templates: {type(found).__name__}"
            )
        return cls(found, special_tokens=special, where=repr(str(config_path)))

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        **variables: Any,
    ) -> str:
        """The prompt text of the conversation ``messages`` (each a mapping with a ``"role"``
        and usually a ``"content"``); ``add_generation_prompt`` opens the assistant's turn.
        ``variables`` reach the template beside the special tokens (they win over them, as in
        transformers), e.g. ``enable_thinking=False``. A template that fails is an
        :class:`~pypto_sched.InvalidInputError` with its message."""
        check_messages(messages)
        compiled = self._template()
        try:
            return str(
                compiled.render(
                    messages=[dict(m) for m in messages],
                    add_generation_prompt=add_generation_prompt,
                    # (transformers passes both, None when not given: "tools is none" holds.)
                    **{"tools": None, "documents": None, **self.special_tokens, **variables},
                )
            )
        except Exception as error:  # Jinja2's TemplateError, or a template's own mistake
            raise InvalidInputError(
                f"{self.where} failed: {type(error).__name__}: {error}"
            ) from None

    def _template(self) -> Any:
        if self._compiled is None:
            self._compiled = _compile(self.source, self.where)
        return self._compiled

    def __repr__(self) -> str:
        return f"ChatTemplate({self.where})"


def check_messages(messages: object, *, what: str = "messages") -> None:
    """Refuse anything but a non-empty list of messages, each a mapping with a string
    ``"role"`` (an :class:`~pypto_sched.InvalidInputError` about ``what``: ``"messages"``,
    or an item of another argument, ``"prompts[2]['messages']"``)."""
    if not isinstance(messages, Sequence) or isinstance(messages, str | bytes) or not messages:
        raise InvalidInputError.about(
            what, f"must be a non-empty list of messages: {type(messages).__name__}"
        )
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise InvalidInputError.about(
                f"{what}[{i}]",
                f"must be a message, an object with a 'role': {type(message).__name__}",
            )
        if not isinstance(message.get("role"), str):
            raise InvalidInputError.about(
                f"{what}[{i}]", f"must have a string 'role': {dict(message)!r}"
            )


def _compile(source: str, where: str) -> Any:
    try:
        import jinja2
        import jinja2.ext
        import jinja2.nodes
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError:
        raise MissingDependencyError(
            f"{where} needs the jinja2 library: pip install 'pypto-sched[tokenizer]'"
        ) from None

    class Generation(jinja2.ext.Extension):
        """``{% generation %}...{% endgeneration %}`` (transformers marks the assistant's
        tokens with it): renders its body."""

        tags = {"generation"}  # noqa: RUF012 - Jinja2's own class attribute

        def parse(self, parser: Any) -> Any:
            line = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(line)

        def _body(self, caller: Any) -> str:
            return str(caller())

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(
        value: Any,
        ensure_ascii: bool = False,
        indent: int | None = None,
        separators: Any = None,
        sort_keys: bool = False,
    ) -> str:
        # Jinja2's own tojson escapes HTML characters; templates expect plain JSON.
        return json.dumps(
            value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
            sort_keys=sort_keys,
        )  # fmt: skip

    def strftime_now(format: str) -> str:
        return datetime.now().strftime(format)

    environment = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[Generation, jinja2.ext.loopcontrols],
    )
    environment.filters["tojson"] = tojson
    environment.globals["raise_exception"] = raise_exception
    environment.globals["strftime_now"] = strftime_now
    try:
        return environment.from_string(source)
    except jinja2.exceptions.TemplateError as error:
        raise InvalidInputError(f"{where} is not a Jinja2 template: {error}") from None


def _token_text(value: object) -> str | None:
    """A special token as tokenizer_config.json saves it: a string, or an AddedToken's
    ``{"content": ...}``."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None
