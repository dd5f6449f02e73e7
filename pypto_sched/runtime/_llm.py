"""``LLM``: offline generation as a vLLM or transformers user expects it, a thin layer over
:func:`~pypto_sched.generate`.

Built from a model directory (the weights a backend loads, ``tokenizer.json``,
``generation_config.json``, the chat template), it takes text, token ids or chat messages
and gives back, per request, the prompt and its ids, the generated text and ids, the finish
reason and the stop that fired. Everything it adds is at the edges: text in (the tokenizer,
the chat template), the model's defaults (the sampling settings of its generation config, as
vLLM applies them, and its EOS ids), and text out. Every dispatch is still planned by the
pure planner and every token chosen by :func:`~pypto_sched.sample_token`.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import attrs
import numpy as np
import numpy.typing as npt

from ..core._config import PlannerConfig, Policy, check_config
from ..core._errors import BackendError, ExecutionError, InvalidInputError
from ..core._sampling import SamplingParams
from ._generate import FinishReason, GeneratedSequence, generate
from .backends import Backend, check_is_backend, load_backend
from .chat import ChatTemplate, check_messages
from .execute import DEFAULT_PAGE_SIZE
from .output import unfinished_requests
from .prompts import Tokenizer, eos_token_ids, generated_text, load_tokenizer, read_config

__all__ = [
    "DEFAULT_MAX_NUM_BATCHED_TOKENS",
    "GENERATION_CONFIG_FILE",
    "LLM",
    "CompletionOutput",
    "IncompleteGenerationError",
    "RequestOutput",
    "generation_defaults",
]

#: The token budget of an :class:`LLM` built without a ``config``: vLLM's offline default.
DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192
#: Where a checkpoint keeps its generation defaults.
GENERATION_CONFIG_FILE = "generation_config.json"
#: The generation config's fields vLLM takes as sampling defaults, and the field of
#: :class:`SamplingParams` each gives (``do_sample`` is not read, as vLLM does not read it).
_DEFAULTS = {
    "temperature": "temperature",
    "top_k": "top_k",
    "top_p": "top_p",
    "max_new_tokens": "max_tokens",
}
#: Fields vLLM would apply that pypto_sched does not implement, and their neutral values.
_NOT_APPLIED = {"repetition_penalty": 1.0, "min_p": 0.0}

Prompt = (
    str
    | Sequence[int]
    | npt.NDArray[np.integer[Any]]
    | Mapping[str, Any]
    | Sequence[Mapping[str, Any]]
)


@attrs.frozen(kw_only=True)
class CompletionOutput:
    """One completion of a prompt, as vLLM's ``CompletionOutput``."""

    #: Its place among the prompt's ``n`` completions.
    index: int
    #: The generated text, a stop string and what follows it left out; ``None`` without a
    #: tokenizer.
    text: str | None
    token_ids: tuple[int, ...]
    finish_reason: FinishReason
    #: The stop token id or stop string that ended it; ``None`` for ``"length"``.
    stop_reason: int | str | None
    #: With ``SamplingParams.logprobs``: each generated token's log-probability, and for
    #: each the likeliest tokens' ``{id: log-probability}``.
    logprobs: tuple[float, ...] | None = None
    top_logprobs: tuple[dict[int, float], ...] | None = None
    #: The sum of ``logprobs`` (``None`` without them).
    cumulative_logprob: float | None = None
    #: Times the scheduler preempted it (its KV pages taken back, its prefill redone).
    num_preemptions: int = 0


@attrs.frozen(kw_only=True)
class RequestOutput:
    """What one prompt gave: vLLM's ``RequestOutput``. ``outputs`` holds its ``n``
    completions; the fields from ``text`` on are the first one's, for the common ``n == 1``
    (``output.text`` is ``output.outputs[0].text``)."""

    #: Its place in the batch.
    index: int
    #: The prompt text (a conversation's rendered by the chat template); ``None`` for ids.
    prompt: str | None
    prompt_token_ids: tuple[int, ...]
    #: The prompt's completions, ``SamplingParams.n`` of them, in order.
    outputs: tuple[CompletionOutput, ...]
    text: str | None
    token_ids: tuple[int, ...]
    finish_reason: FinishReason
    stop_reason: int | str | None
    logprobs: tuple[float, ...] | None = None
    top_logprobs: tuple[dict[int, float], ...] | None = None
    num_preemptions: int = 0

    @property
    def request_id(self) -> str:
        """vLLM's name for the request: its index, as text."""
        return str(self.index)

    @property
    def finished(self) -> bool:
        """Always ``True``: an output is handed over when every completion has finished."""
        return True


class IncompleteGenerationError(BackendError):
    """The backend failed part-way: ``outputs`` holds each finished request's
    :class:`RequestOutput` (``None`` for the others), ``unfinished`` the others' indices."""

    def __init__(
        self, message: str, *, outputs: Sequence[RequestOutput | None], unfinished: Sequence[int]
    ) -> None:
        super().__init__(message)
        self.outputs = tuple(outputs)
        self.unfinished = tuple(unfinished)


def generation_defaults(directory: str | Path) -> dict[str, Any]:
    """The :class:`SamplingParams` fields the checkpoint ``directory``'s
    ``generation_config.json`` gives, as vLLM reads them (``{}`` without the file); a
    ``repetition_penalty`` or ``min_p`` it sets, which pypto_sched does not apply, is a
    warning."""
    path = Path(directory) / GENERATION_CONFIG_FILE
    if not path.is_file():
        return {}
    where = repr(str(path))
    fields = read_config(path)
    defaults = {ours: fields[theirs] for theirs, ours in _DEFAULTS.items() if theirs in fields}
    if defaults.get("top_k") in (0, -1):  # transformers' and vLLM's "all tokens"
        defaults["top_k"] = None
    for name, neutral in _NOT_APPLIED.items():
        if fields.get(name) not in (None, neutral):
            warnings.warn(
                f"{where} sets {name} {fields[name]!r}, which pypto_sched does not apply",
                UserWarning,
                stacklevel=3,
            )
    try:
        SamplingParams(**defaults)
    except InvalidInputError as error:
        raise InvalidInputError(f"{where}: {error}") from None
    return defaults


class LLM:
    """A model ready to generate: the checkpoint directory ``model`` run on ``backend`` (an
    installed backend's name, built with ``checkpoint=model`` and ``backend_options``, or a
    :class:`~pypto_sched.Backend` already built), every dispatch planned under ``config``
    (default: ``packed``, :data:`DEFAULT_MAX_NUM_BATCHED_TOKENS`), over a KV pool of
    ``num_kv_pages`` pages (default: room for every request) of ``kv_page_size`` tokens
    (default: 16).

    ``generation_config="auto"`` takes the sampling defaults of the model's
    ``generation_config.json`` for calls that pass no :class:`SamplingParams`, as vLLM does;
    ``None`` uses :class:`SamplingParams`' own (greedy). Requests stop on the model's EOS ids
    either way, unless their ``ignore_eos``.
    """

    def __init__(
        self,
        model: str | Path,
        *,
        backend: str | Backend = "reference",
        backend_options: Mapping[str, Any] | None = None,
        config: PlannerConfig | None = None,
        num_kv_pages: int | None = None,
        kv_page_size: int | None = None,
        generation_config: Literal["auto"] | None = "auto",
        max_num_batched_tokens: int | None = None,
        max_num_seqs: int | None = None,
        long_prefill_token_threshold: int | None = None,
        max_num_partial_prefills: int | None = None,
        policy: Policy | None = None,
        block_size: int | None = None,
        num_gpu_blocks_override: int | None = None,
    ) -> None:
        self.model = Path(model)
        if not self.model.is_dir():
            raise InvalidInputError.about(
                "model", f"must be a checkpoint directory: {str(model)!r}"
            )
        if generation_config not in ("auto", None):
            raise InvalidInputError.about(
                "generation_config", f"must be 'auto' or None: {generation_config!r}"
            )
        knobs = {
            "max_num_batched_tokens": max_num_batched_tokens,
            "max_num_seqs": max_num_seqs,
            "long_prefill_token_threshold": long_prefill_token_threshold,
            "max_num_partial_prefills": max_num_partial_prefills,
            "policy": policy,
        }
        self.config = _vllm_config(knobs) if config is None else check_config(config)
        given = [name for name, value in knobs.items() if value is not None]
        if config is not None and given:
            raise InvalidInputError(f"give 'config' or {given[0]!r}, not both")
        self.num_kv_pages = _one_of("num_kv_pages", num_kv_pages, num_gpu_blocks_override)
        size = _one_of("kv_page_size", kv_page_size, block_size)
        self.kv_page_size: int = DEFAULT_PAGE_SIZE if size is None else size
        self.tokenizer: Tokenizer | None = load_tokenizer(self.model)
        self.chat_template = ChatTemplate.from_directory(self.model)
        self._defaults = generation_defaults(self.model) if generation_config == "auto" else {}
        if isinstance(backend, str):
            backend = load_backend(backend, checkpoint=str(self.model), **(backend_options or {}))
        elif backend_options:
            raise InvalidInputError.about("backend_options", "are for a backend given by name")
        check_is_backend(backend)
        self.backend: Backend = backend
        self.eos_token_ids = eos_token_ids(self.model, vocab_size=backend.vocab_size)

    def get_default_sampling_params(self) -> SamplingParams:
        """The settings of a call without :class:`SamplingParams`: the generation config's
        (with ``generation_config="auto"``), else greedy."""
        return SamplingParams(**self._defaults)

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        on_finish: Callable[[RequestOutput], None] | None = None,
    ) -> list[RequestOutput]:
        """Generate for one prompt or a list: text, token ids, ``{"prompt": text}``,
        ``{"prompt_token_ids": ids}``, or a conversation (a list of messages, or
        ``{"messages": [...]}``, rendered by the chat template). ``sampling_params`` is one
        for every prompt or one each (default :meth:`get_default_sampling_params`).
        ``on_finish`` hears of each request as it finishes. Outputs in input order.

        A backend failure part-way raises :class:`IncompleteGenerationError` holding the
        finished requests' outputs and naming the others."""
        items = _prompt_list(prompts)
        encoded = [self._encode(item, f"prompts[{r}]") for r, item in enumerate(items)]
        return self._run(encoded, sampling_params, on_finish)

    def _run(
        self,
        encoded: list[tuple[str | None, list[int]]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None,
        on_finish: Callable[[RequestOutput], None] | None,
    ) -> list[RequestOutput]:
        params = self._sampling(sampling_params, len(encoded))
        # Completion 0 of prompt r is request r, as without n; the others follow the batch,
        # so that asking for more completions of one prompt changes no other's tokens.
        owners = [(r, 0) for r in range(len(encoded))]
        owners += [(r, j) for r, p in enumerate(params) for j in range(1, p.n)]
        completions: list[list[CompletionOutput | None]] = [[None] * p.n for p in params]
        single = [p if p.n == 1 else attrs.evolve(p, n=1) for p in params]  # one each
        outputs: list[RequestOutput | None] = [None] * len(encoded)

        def finished(request: int, sequence: GeneratedSequence) -> None:
            r, j = owners[request]
            completions[r][j] = self._completion(j, sequence)
            if all(c is not None for c in completions[r]):
                done = tuple(c for c in completions[r] if c is not None)
                outputs[r] = _request_output(r, encoded[r], done)
                if on_finish is not None:
                    on_finish(outputs[r])  # type: ignore[arg-type]

        try:
            generate(
                self.backend,
                [encoded[r][1] for r, _ in owners],
                config=self.config,
                sampling=[single[r] for r, _ in owners],
                stop_token_ids=self.eos_token_ids,
                num_kv_pages=self.num_kv_pages,
                kv_page_size=self.kv_page_size,
                on_finish=finished,
                detokenize=None if self.tokenizer is None else self.tokenizer.decode,
            )
        except ExecutionError as error:
            missing = [r for r, output in enumerate(outputs) if output is None]
            raise IncompleteGenerationError(
                f"{error}; {unfinished_requests(missing, len(encoded))}",
                outputs=outputs,
                unfinished=missing,
            ) from error
        return [output for output in outputs if output is not None]

    def chat(
        self,
        messages: Sequence[Mapping[str, Any]] | Sequence[Sequence[Mapping[str, Any]]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        add_generation_prompt: bool = True,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> list[RequestOutput]:
        """Generate the assistant's reply to one conversation or a list of them (as vLLM's
        ``LLM.chat``)."""
        single = bool(messages) and isinstance(messages[0], Mapping)
        conversations = [messages] if single else list(messages)
        texts = [
            self.render_chat(
                c, add_generation_prompt=add_generation_prompt, what=f"messages[{r}]",
                **(chat_template_kwargs or {}),
            )
            for r, c in enumerate(conversations)
        ]  # fmt: skip
        encoded: list[tuple[str | None, list[int]]] = [
            (text, self._tokens(text, f"messages[{r}]", special=False))
            for r, text in enumerate(texts)
        ]
        return self._run(encoded, sampling_params, None)

    def render_chat(
        self,
        messages: object,
        *,
        add_generation_prompt: bool = True,
        what: str = "messages",
        **variables: Any,
    ) -> str:
        """The prompt text of a conversation, by the model's chat template."""
        if self.chat_template is None:
            raise InvalidInputError.about(
                what,
                f"needs a chat template: the model has none ({str(self.model)!r} has "
                "neither chat_template.jinja nor a 'chat_template' in tokenizer_config.json)",
            )
        check_messages(messages, what=what)
        return self.chat_template.render(
            messages,  # type: ignore[arg-type]
            add_generation_prompt=add_generation_prompt,
            **variables,
        )

    def _encode(self, item: Prompt, what: str) -> tuple[str | None, list[int]]:
        """A prompt's text (``None`` for ids) and ids."""
        if isinstance(item, Mapping) and "messages" in item:
            text = self.render_chat(item["messages"], what=f"{what}['messages']")
            return text, self._tokens(text, what, special=False)
        if isinstance(item, Mapping) and "prompt" in item:
            text = item["prompt"]
            return text, self._tokens(text, what, special=True)
        if isinstance(item, Mapping) and "prompt_token_ids" in item:
            return None, list(item["prompt_token_ids"])
        if isinstance(item, str):
            return item, self._tokens(item, what, special=True)
        if _is_conversation(item):
            text = self.render_chat(item, what=what)
            return text, self._tokens(text, what, special=False)
        if _is_ids(item):
            return None, [int(t) for t in item]  # type: ignore[arg-type]
        raise InvalidInputError.about(
            what,
            f"must be text, token ids, a conversation, or a mapping with 'prompt', "
            f"'prompt_token_ids' or 'messages': {type(item).__name__}",
        )

    def _tokens(self, text: object, what: str, *, special: bool) -> list[int]:
        if not isinstance(text, str):
            raise InvalidInputError.about(f"{what}['prompt']", f"must be a string: {text!r}")
        if self.tokenizer is None:
            raise InvalidInputError.about(
                what,
                f"needs a tokenizer for its text (tokenizer.json in {str(self.model)!r}); "
                "give token ids instead",
            )
        return self.tokenizer.encode(text, add_special_tokens=special)

    def _sampling(
        self, sampling_params: SamplingParams | Sequence[SamplingParams] | None, count: int
    ) -> list[SamplingParams]:
        if sampling_params is None:
            return [self.get_default_sampling_params()] * count
        if isinstance(sampling_params, SamplingParams):
            return [sampling_params] * count
        params = list(sampling_params)
        if len(params) != count or not all(isinstance(p, SamplingParams) for p in params):
            raise InvalidInputError.about(
                "sampling_params",
                f"must be SamplingParams, one per prompt ({count}), or None: {sampling_params!r}",
            )
        return params

    def _completion(self, index: int, sequence: GeneratedSequence) -> CompletionOutput:
        ids = sequence.token_ids.tolist()
        top = None
        if sequence.top_token_ids is not None and sequence.top_logprobs is not None:
            top = tuple(
                dict(zip(row.tolist(), values.tolist(), strict=True))
                for row, values in zip(sequence.top_token_ids, sequence.top_logprobs, strict=True)
            )
        logprobs = None if sequence.logprobs is None else tuple(sequence.logprobs.tolist())
        return CompletionOutput(
            index=index,
            text=None
            if self.tokenizer is None
            else generated_text(self.tokenizer, ids, sequence.stop_reason),
            token_ids=tuple(ids),
            finish_reason=sequence.finish_reason,
            stop_reason=sequence.stop_reason,
            logprobs=logprobs,
            top_logprobs=top,
            cumulative_logprob=None if logprobs is None else math.fsum(logprobs),
            num_preemptions=sequence.num_preemptions,
        )

    def __repr__(self) -> str:
        return f"LLM({str(self.model)!r}, backend={self.backend.name!r})"


def _request_output(
    index: int, encoded: tuple[str | None, list[int]], completions: tuple[CompletionOutput, ...]
) -> RequestOutput:
    first = completions[0]
    return RequestOutput(
        index=index,
        prompt=encoded[0],
        prompt_token_ids=tuple(encoded[1]),
        outputs=completions,
        text=first.text,
        token_ids=first.token_ids,
        finish_reason=first.finish_reason,
        stop_reason=first.stop_reason,
        logprobs=first.logprobs,
        top_logprobs=first.top_logprobs,
        num_preemptions=sum(c.num_preemptions for c in completions),
    )


def _vllm_config(knobs: Mapping[str, Any]) -> PlannerConfig:
    """The config of vLLM's scheduler knobs, named and valued as vLLM takes them (a
    threshold of 0 is off); unset, ``packed`` with :data:`DEFAULT_MAX_NUM_BATCHED_TOKENS`."""
    budget = knobs["max_num_batched_tokens"]
    return PlannerConfig.from_engine_args(
        max_num_batched_tokens=DEFAULT_MAX_NUM_BATCHED_TOKENS if budget is None else budget,
        max_num_seqs=knobs["max_num_seqs"],
        long_prefill_token_threshold=knobs["long_prefill_token_threshold"] or 0,
        max_num_partial_prefills=knobs["max_num_partial_prefills"],
        policy=knobs["policy"] or "packed",
    )


def _one_of(name: str, ours: Any, vllms: Any) -> Any:
    """``name``'s value, given by our name or vLLM's (both only when they agree; ``None``:
    neither given)."""
    if vllms is None:
        return ours
    if ours not in (None, vllms):
        raise InvalidInputError(f"give {name!r} or vLLM's name for it, not both: {ours}, {vllms}")
    return vllms


def _is_conversation(item: object) -> bool:
    return (
        isinstance(item, Sequence)
        and not isinstance(item, str | bytes)
        and bool(item)
        and all(isinstance(m, Mapping) for m in item)
    )


def _prompt_list(prompts: object) -> list[Prompt]:
    """One prompt as a list of one; a list of prompts as it is."""
    if isinstance(prompts, str | Mapping) or _is_conversation(prompts):
        return [prompts]  # type: ignore[list-item]
    if _is_ids(prompts):
        return [prompts]  # type: ignore[list-item]
    if not isinstance(prompts, Sequence) or not prompts:
        raise InvalidInputError.about(
            "prompts", f"must be a prompt or a non-empty list of prompts: {prompts!r}"
        )
    return list(prompts)


def _is_ids(item: object) -> bool:
    """Token ids: a 1-D integer array, or a non-empty sequence of ints."""
    if isinstance(item, np.ndarray):
        return item.ndim == 1 and item.dtype.kind in "iu"
    return (
        isinstance(item, Sequence)
        and not isinstance(item, str | bytes)
        and bool(item)
        and all(isinstance(t, int | np.integer) and not isinstance(t, bool) for t in item)
    )
