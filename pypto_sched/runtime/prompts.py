"""A batch of generation requests read from JSON Lines, the tokenizer that reads text, and
the JSON Lines of what was generated.

The format, one request per line (blank lines are skipped)::

    {"token_ids": [151644, 872, 198]}
    {"prompt": "Hello", "max_new_tokens": 8, "stop_token_ids": [151645]}
    {"messages": [{"role": "user", "content": "Hi"}], "temperature": 0.7, "stop": ["\n"]}

Each line is one JSON object with exactly one of ``"token_ids"`` (a non-empty list of token
ids), ``"prompt"`` (text, which needs a tokenizer) or ``"messages"`` (a conversation, which
needs a chat template and a tokenizer: rendered with the generation prompt, tokenized without
special tokens, as transformers' ``apply_chat_template`` does), and optionally
``"max_new_tokens"`` (an int in [1, 2**31 - 1]; default: the caller's), ``"stop_token_ids"``
(a list of token ids that end the request when generated, on top of the caller's), and the
request's own :class:`~pypto_sched.SamplingParams` fields by their names (:data:`LINE_SAMPLING`:
``temperature``, ``top_k``, ``top_p``, ``seed``, ``min_tokens``, ``stop``, ``ignore_eos``,
``logprobs``), which replace the caller's. vLLM's names ``"prompt_token_ids"`` and
``"max_tokens"`` are taken for ``"token_ids"`` and ``"max_new_tokens"`` (:data:`LINE_ALIASES`;
a line giving both names is an error). Any other key is an error, so a typo is not silently
ignored.

:func:`read_prompts` reads every line through :func:`~pypto_sched.core._json.load_json` (strict,
bounded) and checks what a backend would otherwise fail on mid-run: token ids inside the
vocabulary, and a request that fits the model's positions. Every error is an
:class:`~pypto_sched.InvalidInputError` naming the line. This module is what a server
reading the same format would call; the command line ``pypto-sched generate`` does only that,
and writes :func:`output_lines`.

:func:`load_tokenizer` reads a checkpoint directory's ``tokenizer.json`` with the
``tokenizers`` library (``pip install 'pypto-sched[tokenizer]'``), imported only then;
:func:`eos_token_ids` reads the ids a checkpoint's model ends its text with, where
transformers reads them (``generation_config.json``, else ``config.json``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

import attrs

from ..core._errors import InvalidConfigError, InvalidInputError, PyptoSchedError
from ..core._json import load_json
from ..core._sampling import SamplingParams
from ..core._validate import MAX_TOKENS, check_int, check_positions, utf8_error
from ._generate import GeneratedSequence, GenerationResult

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

#: The tokenizer file :func:`load_tokenizer` looks for in a checkpoint directory.
TOKENIZER_FILE = "tokenizer.json"
#: Longest line read: 16 MiB, a prompt of about two million token ids.
MAX_LINE_BYTES = 16 * 1024 * 1024
#: Largest ``tokenizer.json`` read (a large vocabulary's is about 10 MB).
_MAX_TOKENIZER_BYTES = 256 * 1024 * 1024
#: Largest ``generation_config.json`` or ``config.json`` read for the EOS ids.
_MAX_CONFIG_BYTES = 16 * 1024 * 1024
#: Where transformers finds a model's EOS ids, in the order it looks.
_EOS_FILES = ("generation_config.json", "config.json")
#: The SamplingParams fields a line may set for its request.
LINE_SAMPLING = ("temperature", "top_k", "top_p", "seed", "min_tokens", "stop", "ignore_eos",
                 "logprobs")  # fmt: skip
_PROMPTS = ("token_ids", "prompt", "messages")
#: vLLM's names for two keys, taken as ours: a line may use either name, not both.
LINE_ALIASES = {"prompt_token_ids": "token_ids", "max_tokens": "max_new_tokens"}
_KEYS = frozenset({*_PROMPTS, "max_new_tokens", "stop_token_ids", *LINE_SAMPLING, *LINE_ALIASES})


class MissingDependencyError(PyptoSchedError, ImportError):
    """An optional package the call needs is not installed; the message says what to
    install."""


class ChatRenderer(Protocol):
    """What :func:`read_prompts` needs of a chat template
    (:class:`pypto_sched.chat.ChatTemplate`)."""

    def render(self, messages: Any, *, add_generation_prompt: bool = True) -> str: ...


class TextCodec(Protocol):
    """What :func:`read_prompts` needs of a tokenizer: text to ids, ids to text."""

    def encode(self, text: str) -> list[int]: ...

    def decode(self, token_ids: Sequence[int]) -> str: ...


@attrs.frozen(kw_only=True)
class PromptRequest:
    """One line of a prompts file, checked and resolved."""

    #: The prompt's token ids (the tokenizer's, when the line gave text).
    token_ids: tuple[int, ...]
    #: Tokens to generate at most: the line's, or the default.
    max_new_tokens: int
    #: Token ids that end this request, beyond the ones every request stops on.
    stop_token_ids: tuple[int, ...] = ()
    #: The line's ``"prompt"`` text (its ``"messages"`` rendered), or ``None`` for token ids.
    text: str | None = None
    #: How its tokens are chosen and when it stops: the caller's, with the line's fields.
    sampling: SamplingParams = attrs.field(factory=SamplingParams)


class Tokenizer:
    """A ``tokenizers.Tokenizer`` read from a ``tokenizer.json``, as a :class:`TextCodec`.

    ``encode`` adds the special tokens the file's post-processor asks for (as transformers'
    ``tokenizer(text)`` does); ``decode`` leaves special tokens out. :func:`load_tokenizer`
    turns off a truncation or padding the file saves (transformers' ``tokenizer(text)``
    applies neither).
    """

    def __init__(self, tokenizer: Any, *, path: Path) -> None:
        self._tokenizer = tokenizer
        self.path = path

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        """The ids of ``text``; without ``add_special_tokens`` (a chat template's text,
        which writes its own) none are added."""
        return list(self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, token_ids: Sequence[int]) -> str:
        return str(self._tokenizer.decode(list(token_ids), skip_special_tokens=True))

    def __repr__(self) -> str:
        return f"Tokenizer({str(self.path)!r})"


def load_tokenizer(directory: str | Path) -> Tokenizer | None:
    """The tokenizer of the checkpoint ``directory``, or ``None`` when it has no
    ``tokenizer.json``.

    The file is read through the strict JSON reader before ``tokenizers`` parses it. Raises
    :class:`MissingDependencyError` when ``tokenizers`` is not installed and
    :class:`~pypto_sched.InvalidInputError` when the file cannot be read or parsed.
    """
    path = Path(directory) / TOKENIZER_FILE
    if not path.is_file():
        return None
    try:
        from tokenizers import Tokenizer as HFTokenizer
    except ImportError:
        raise MissingDependencyError(
            f"{str(path)!r} needs the tokenizers library: pip install 'pypto-sched[tokenizer]'"
        ) from None
    data = _read(path, _MAX_TOKENIZER_BYTES)
    load_json(data, what=repr(str(path)), max_bytes=_MAX_TOKENIZER_BYTES)
    try:
        parsed = HFTokenizer.from_str(data.decode("utf-8"))
    except Exception as error:  # tokenizers raises its own Exception subclass
        raise InvalidInputError(f"{str(path)!r} is not a tokenizer: {error}") from None
    # A truncation or padding setting saved in the file would cut or pad every prompt.
    parsed.no_truncation()
    parsed.no_padding()
    return Tokenizer(parsed, path=path)


def eos_token_ids(directory: str | Path, *, vocab_size: int | None = None) -> tuple[int, ...]:
    """The ``eos_token_id`` (one id or a list) of the checkpoint ``directory``'s
    ``generation_config.json``, or of its ``config.json`` when it has none; ``()`` when
    neither names one. Raises :class:`~pypto_sched.InvalidInputError` for a file that is not
    strict JSON or an id that is not a non-negative int.

    With ``vocab_size``, only the ids inside the vocabulary: one outside it (a small model
    that kept its family's EOS) can never be generated, so it stops nothing, and
    :func:`~pypto_sched.generate` refuses stop ids outside the vocabulary."""
    for name in _EOS_FILES:
        path = Path(directory) / name
        if path.is_file():
            where = repr(str(path))
            fields = read_config(path)
            found = fields.get("eos_token_id")
            ids = [] if found is None else found if isinstance(found, list) else [found]
            if not all(_is_int(i) and i >= 0 for i in ids):
                raise InvalidInputError(
                    f"{where}: 'eos_token_id' must be an id or a list of ids: {found!r}"
                )
            return tuple(i for i in ids if vocab_size is None or i < vocab_size)
    return ()


def read_config(path: str | Path) -> dict[str, Any]:
    """The JSON object of a checkpoint's small JSON file (``generation_config.json``,
    ``tokenizer_config.json``, ...), read by the strict reader within 16 MiB; an
    :class:`~pypto_sched.InvalidInputError` naming the file otherwise."""
    path = Path(path)
    where = repr(str(path))
    fields = load_json(_read(path, _MAX_CONFIG_BYTES), what=where)
    if not isinstance(fields, dict):
        raise InvalidInputError(f"{where} must hold a JSON object")
    return fields


def read_bounded(path: str | Path, limit: int) -> bytes:
    """The bytes of ``path``, at most ``limit`` of them (a larger file, or one that cannot
    be read, is an :class:`~pypto_sched.InvalidInputError` naming it)."""
    return _read(Path(path), limit)


def _read(path: Path, limit: int) -> bytes:
    try:
        with path.open("rb") as stream:
            data = stream.read(limit + 1)
    except OSError as error:
        raise InvalidInputError(f"cannot read {str(path)!r}: {error.strerror or error}") from None
    if len(data) > limit:
        raise InvalidInputError(f"{str(path)!r} is larger than the limit of {limit:,} bytes")
    return data


def read_prompts(
    data: str | bytes,
    *,
    max_new_tokens: int,
    vocab_size: int,
    max_positions: int | None = None,
    tokenizer: TextCodec | None = None,
    what: str = "prompts",
    sampling: SamplingParams | None = None,
    chat_template: ChatRenderer | None = None,
) -> tuple[PromptRequest, ...]:
    """The requests of the JSON Lines ``data``, in order, as the module docstring states.

    ``max_new_tokens`` is the default of lines without one, ``sampling`` (default greedy)
    the settings a line's own sampling fields replace, and ``chat_template`` renders
    ``"messages"`` lines (a failing template is an error naming the line). Token ids
    (prompt and stop) must be in ``[0, vocab_size)``; with ``max_positions`` (the model's
    ``max_position_embeddings``), a request's prompt and new tokens must fit it (its last
    token is never run, so ``P + N - 1 <= max_positions``). ``what`` names the input in
    errors, e.g. ``"--prompts 'batch.jsonl'"``. A bad argument is an
    :class:`~pypto_sched.InvalidInputError` naming it, before any line is read.
    """
    if not isinstance(data, str | bytes):
        raise InvalidInputError.about(
            "data", f"must be JSON Lines, str or bytes: {type(data).__name__}"
        )
    max_new_tokens = check_int("max_new_tokens", max_new_tokens, min_value=1)
    vocab_size = check_int("vocab_size", vocab_size, min_value=1)
    if max_positions is not None:
        max_positions = check_int("max_positions", max_positions, min_value=1)
    sampling = SamplingParams() if sampling is None else sampling
    if not isinstance(sampling, SamplingParams):
        raise InvalidInputError.about(
            "sampling", f"must be SamplingParams or None: {type(sampling).__name__}"
        )
    context = _Context(max_new_tokens, vocab_size, tokenizer, sampling, chat_template)
    if isinstance(data, bytes):
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as error:
            raise InvalidInputError(f"{what} is not UTF-8: {utf8_error(data, error)}") from None
    else:
        text = data
    requests = []
    for number, line in enumerate(text.split("\n"), start=1):
        if line.strip():
            where = f"{what} line {number}"
            # (Depth 6: a message's content may be a list of parts, each an object.)
            fields = load_json(line, what=where, max_bytes=MAX_LINE_BYTES, max_depth=6)
            request = _request(fields, where, context)
            check_positions(
                where,
                len(request.token_ids),
                max_positions,
                max_new_tokens=request.max_new_tokens,
            )
            requests.append(request)
    if not requests:
        raise InvalidInputError(f"{what} holds no request: one JSON object per line expected")
    return tuple(requests)


def output_lines(result: GenerationResult, *, tokenizer: TextCodec | None = None) -> Iterator[str]:
    """The output format, one JSON line per request in input order (without newlines): each
    :func:`output_line`."""
    if not isinstance(result, GenerationResult):
        raise InvalidInputError.about(
            "result", f"must be a GenerationResult: {result!r} ({type(result).__name__})"
        )
    for index, sequence in enumerate(result.sequences):
        yield output_line(index, sequence, tokenizer=tokenizer)


def output_line(
    index: int, sequence: GeneratedSequence, *, tokenizer: TextCodec | None = None
) -> str:
    """Request ``index``'s output line (no newline): ``{"index", "token_ids" (the generated
    ids), "finish_reason"}``, ``"stop_reason"`` (the stop token id or string) when it
    stopped, ``"logprobs"`` when it asked for them, and ``"text"`` (:func:`generated_text`)
    with a ``tokenizer``. The same request gives the same bytes in every run."""
    ids = sequence.token_ids.tolist()
    line: dict[str, Any] = {
        "index": index,
        "token_ids": ids,
        "finish_reason": sequence.finish_reason,
    }
    if sequence.stop_reason is not None:
        line["stop_reason"] = sequence.stop_reason
    if sequence.logprobs is not None:
        line["logprobs"] = sequence.logprobs.tolist()
        top_ids, top = sequence.top_token_ids, sequence.top_logprobs
        if top_ids is not None and top is not None and top_ids.shape[1]:
            line["top_logprobs"] = [
                [[int(t), float(lp)] for t, lp in zip(ids_row, row, strict=True)]
                for ids_row, row in zip(top_ids, top, strict=True)
            ]
    if tokenizer is not None:
        line["text"] = generated_text(tokenizer, ids, sequence.stop_reason)
    return json.dumps(line, ensure_ascii=False)


def generated_text(codec: TextCodec, token_ids: Sequence[int], stop_reason: object) -> str:
    """The text of ``token_ids``; a stop string (``stop_reason`` a str) and what follows it
    left out, as vLLM leaves them out."""
    text = codec.decode(token_ids)
    if isinstance(stop_reason, str):
        cut = text.find(stop_reason)
        if cut >= 0:
            text = text[:cut]
    return text


@attrs.frozen
class _Context:
    """What every line is read with."""

    max_new_tokens: int
    vocab_size: int
    tokenizer: TextCodec | None
    sampling: SamplingParams
    chat_template: ChatRenderer | None


def _request(fields: object, where: str, context: _Context) -> PromptRequest:
    if not isinstance(fields, dict):
        raise InvalidInputError(f"{where}: expected a JSON object, got {type(fields).__name__}")
    unknown = sorted(set(fields) - _KEYS)
    if unknown:
        raise InvalidInputError(f"{where}: unknown keys {unknown}; known: {sorted(_KEYS)}")
    for alias, key in LINE_ALIASES.items():
        if alias in fields:
            if key in fields:
                raise InvalidInputError(f"{where}: give one of {key!r} and {alias!r}, not both")
            fields = {**fields, key: fields[alias]}
            del fields[alias]
    given = [key for key in _PROMPTS if key in fields]
    if len(given) != 1:
        raise InvalidInputError(
            f"{where}: give exactly one of 'token_ids', 'prompt' and 'messages'"
        )
    vocab_size, tokenizer = context.vocab_size, context.tokenizer
    if "prompt" in fields:
        text = fields["prompt"]
        ids = _encoded(text, where, vocab_size, tokenizer)
    elif "messages" in fields:
        text = _rendered(fields["messages"], where, context.chat_template)
        ids = _encoded(text, where, vocab_size, tokenizer, special=False)
    else:
        text = None
        ids = _token_ids(fields["token_ids"], f"{where}: 'token_ids'", vocab_size)
    if not ids:
        raise InvalidInputError(f"{where}: the prompt must hold at least one token: it is empty")
    new = fields.get("max_new_tokens", context.max_new_tokens)
    if not _is_int(new) or not 1 <= new <= MAX_TOKENS:
        raise InvalidInputError(
            f"{where}: 'max_new_tokens' must be an int in [1, {MAX_TOKENS}]: {new!r}"
        )
    stops = _token_ids(fields.get("stop_token_ids", []), f"{where}: 'stop_token_ids'", vocab_size)
    own = {key: fields[key] for key in LINE_SAMPLING if key in fields}
    if isinstance(own.get("stop"), list):
        own["stop"] = tuple(own["stop"])
    try:
        sampling = attrs.evolve(context.sampling, **own) if own else context.sampling
    except InvalidConfigError as error:
        raise InvalidInputError(f"{where}: {error}") from None
    return PromptRequest(
        token_ids=ids, max_new_tokens=new, stop_token_ids=stops, text=text, sampling=sampling
    )


def _rendered(messages: object, where: str, template: ChatRenderer | None) -> str:
    if template is None:
        raise InvalidInputError(
            f"{where}: 'messages' needs a chat template (chat_template.jinja, or "
            "'chat_template' in tokenizer_config.json, in the checkpoint directory)"
        )
    try:
        return template.render(messages, add_generation_prompt=True)
    except InvalidInputError as error:
        raise InvalidInputError(f"{where}: 'messages': {error}") from None


def _encoded(
    text: object,
    where: str,
    vocab_size: int,
    tokenizer: TextCodec | None,
    *,
    special: bool = True,
) -> tuple[int, ...]:
    key = "prompt" if special else "messages"
    if not isinstance(text, str):
        raise InvalidInputError(f"{where}: 'prompt' must be a string: {type(text).__name__}")
    if tokenizer is None:
        raise InvalidInputError(
            f"{where}: {key!r} needs a tokenizer ({TOKENIZER_FILE} in the checkpoint "
            "directory); give 'token_ids' instead"
        )
    try:
        # (A chat template writes its own special tokens: none are added, as transformers'
        # apply_chat_template adds none.)
        encoded = (
            tokenizer.encode(text) if special else tokenizer.encode(text, add_special_tokens=False)  # type: ignore[call-arg]
        )
    except Exception as error:  # tokenizers raises its own Exception and TypeError
        raise InvalidInputError(
            f"{where}: the tokenizer cannot encode 'prompt': {type(error).__name__}: {error}"
        ) from None
    return _token_ids(encoded, f"{where}: the tokenizer's ids", vocab_size)


def _token_ids(values: object, name: str, vocab_size: int) -> tuple[int, ...]:
    if not isinstance(values, list):
        raise InvalidInputError(f"{name} must be a list of token ids: {type(values).__name__}")
    for i, value in enumerate(values):
        if not _is_int(value):
            raise InvalidInputError(f"{name}[{i}] must be an int: {value!r}")
        if not 0 <= value < vocab_size:
            raise InvalidInputError(
                f"{name}[{i}] must be in [0, {vocab_size}), the model's vocabulary: {value}"
            )
    return tuple(values)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
