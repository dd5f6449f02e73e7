"""What ``pypto-sched generate`` reads of the checkpoint directory before the backend loads
(the tokenizer, the chat template, the EOS ids, the generation config's defaults), and the
settings it gives with the flags: the sampling flags given win, then the generation
config's (``--generation-config auto``), then :class:`~pypto_sched.SamplingParams`' own."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import sys
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import attrs

from ..core._errors import InvalidInputError
from ..core._sampling import DEFAULT_MAX_TOKENS, SamplingParams
from ..integrations.hf_verify import transformers_missing
from ..runtime._llm import generation_defaults
from ..runtime.chat import ChatTemplate
from ..runtime.prompts import MissingDependencyError, PromptRequest, Tokenizer, load_tokenizer
from ._errors import UsageError, flags_named
from ._specs import backend_options

__all__ = [
    "SAMPLING_FLAGS",
    "ModelFiles",
    "check_verify",
    "max_new_tokens",
    "model_files",
    "quiet_transformers",
    "sampling",
]

#: The field of :class:`SamplingParams` each sampling flag gives.
SAMPLING_FLAGS = {
    "temperature": "--temperature",
    "top_k": "--top-k",
    "top_p": "--top-p",
    "seed": "--sampling-seed",
}


@attrs.frozen
class ModelFiles:
    """The checkpoint directory's files besides the weights (``None`` without one)."""

    checkpoint: str | None
    tokenizer: Tokenizer | None
    chat_template: ChatTemplate | None
    #: The generation config's sampling defaults (``{}`` with ``--generation-config none``).
    defaults: dict[str, Any]


def model_files(args: argparse.Namespace) -> ModelFiles:
    checkpoint = backend_options(args.backend_option).get("checkpoint")
    if checkpoint is None:
        return ModelFiles(None, None, None, {})
    checkpoint = str(checkpoint)
    where = "--backend-option checkpoint"
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            defaults = generation_defaults(checkpoint) if args.generation_config == "auto" else {}
        for warning in caught:
            print(f"pypto-sched: warning: {warning.message}", file=sys.stderr)
        return ModelFiles(
            checkpoint, load_tokenizer(checkpoint), ChatTemplate.from_directory(checkpoint),
            defaults,
        )  # fmt: skip
    except MissingDependencyError as error:
        raise UsageError(str(error)) from None
    except InvalidInputError as error:
        raise UsageError(f"{where}: {error}") from None


def sampling(args: argparse.Namespace, defaults: dict[str, Any]) -> SamplingParams:
    """The sampling flags given, over the generation config's ``defaults``."""
    fields = {name: value for name, value in defaults.items() if name != "max_tokens"}
    for name in SAMPLING_FLAGS:
        value = getattr(args, _dest(SAMPLING_FLAGS[name]))
        if value is not None:
            fields[name] = value
    with flags_named(**SAMPLING_FLAGS):
        return SamplingParams(**fields)


def max_new_tokens(args: argparse.Namespace, defaults: dict[str, Any]) -> int:
    """``--max-new-tokens``, else the generation config's ``max_new_tokens``, else 16."""
    given = args.max_new_tokens
    return int(given if given is not None else defaults.get("max_tokens", DEFAULT_MAX_TOKENS))


def check_verify(
    args: argparse.Namespace, model: ModelFiles, requests: Sequence[PromptRequest] = ()
) -> None:
    """``--verify`` compares greedy tokens with transformers' plain greedy generate():
    refuse settings it cannot compare."""
    common = sampling(args, model.defaults)
    if not common.is_greedy:
        source = "" if args.temperature is not None else " (the generation config's)"
        raise UsageError(
            f"--verify compares greedy tokens: leave --temperature at 0, not "
            f"{common.temperature}{source}"
        )
    missing = transformers_missing()
    if missing is not None:
        raise UsageError(f"--verify: {missing}")
    if model.checkpoint is None:
        raise UsageError("--verify needs the checkpoint: --backend-option checkpoint=DIR")
    for r, request in enumerate(requests):
        p = request.sampling
        if not p.is_greedy or p.stop or p.min_tokens:
            raise UsageError(
                f"--verify compares plain greedy tokens: request {r} sets "
                f"{'temperature' if not p.is_greedy else 'stop' if p.stop else 'min_tokens'}"
            )


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """transformers' progress bars ("Loading weights") and its info and warning logs kept
    off stderr while ``--verify`` runs it: the summary is what the user reads there."""
    logging: Any = importlib.import_module("transformers.utils.logging")
    shown = logging.is_progress_bar_enabled()
    verbosity = logging.get_verbosity()
    logging.disable_progress_bar()
    logging.set_verbosity_error()
    try:
        yield
    finally:
        logging.set_verbosity(verbosity)
        if shown:
            logging.enable_progress_bar()


def _dest(flag: str) -> str:
    return flag.removeprefix("--").replace("-", "_")
