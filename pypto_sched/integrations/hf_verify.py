"""Greedy generation checked against transformers' own ``generate()`` on the same checkpoint.

:func:`verify_greedy_generation` runs every prompt alone through transformers'
``AutoModelForCausalLM.generate`` (greedy, with an all-ones ``attention_mask``) and compares
its tokens with the ones :func:`~pypto_sched.generate` gave, token for token. transformers
is asked for the full ``max_new_tokens`` with its own EOS switched off (``eos_token_id=None``:
neither stopping on it nor masking it), and its tokens are cut after the first of the
request's stop tokens, which is the rule :func:`~pypto_sched.generate` stops by. Nothing else
of the checkpoint's ``generation_config.json`` is used either (no repetition penalty, no
banned n-grams or tokens...): the comparison is with plain greedy decoding, which is what
:func:`~pypto_sched.generate` does without sampling.

transformers (and torch) are imported only when a verification runs
(``pip install 'pypto-sched[transformers]'``); :func:`transformers_missing` says beforehand
whether they are there. Run it in float64 against a float64 backend: in a lower precision a
near-tie between two logits can flip a greedy token without either side being wrong.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Collection, Sequence, Sized
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import numpy.typing as npt

from .._errors import CheckpointError, InvalidInputError
from .._generate import per_request_counts, stop_sets, token_lists
from ..checkpoints import read_config
from ..execute import TokenIds
from ..prompts import MissingDependencyError

__all__ = ["INSTALL", "Mismatch", "TransformersVerification", "transformers_missing",
           "verify_greedy_generation"]  # fmt: skip

#: The dtypes transformers may run in, by name (float64 by default: see above).
_DTYPES = ("float64", "float32", "bfloat16", "float16")
#: What to install for a verification.
INSTALL = "pip install 'pypto-sched[transformers]' torch"


@attrs.frozen(kw_only=True)
class Mismatch:
    """The first token where one request's generation differs from transformers'."""

    #: The request, counted from 0 in input order.
    index: int
    #: The generated token (counted from 0) that differs; the shorter length when one
    #: output is a prefix of the other.
    position: int
    #: Our token there, or ``None`` when ours ended first.
    ours: int | None
    #: transformers' token there, or ``None`` when transformers' ended first.
    theirs: int | None

    def describe(self) -> str:
        return (
            f"request {self.index}: generated token {self.position} is {self.ours}, "
            f"transformers' is {self.theirs}"
        )


@attrs.frozen(kw_only=True)
class TransformersVerification:
    """The outcome of :func:`verify_greedy_generation`."""

    num_requests: int
    #: One per request that differs, in input order.
    mismatches: tuple[Mismatch, ...]

    @property
    def passed(self) -> bool:
        return not self.mismatches

    def describe(self) -> str:
        if self.passed:
            return f"PASS vs transformers generate(): {self.num_requests}/{self.num_requests} equal"
        agree = self.num_requests - len(self.mismatches)
        return (
            f"FAIL vs transformers generate(): {agree}/{self.num_requests} equal; first "
            f"difference: {self.mismatches[0].describe()}"
        )


def transformers_missing() -> str | None:
    """``None`` when transformers and torch can be imported, else what to install."""
    for module in ("torch", "transformers"):
        if importlib.util.find_spec(module) is None:
            return f"verifying with transformers needs {module}: {INSTALL}"
    return None


def verify_greedy_generation(
    checkpoint: str | os.PathLike[str],
    prompts: TokenIds,
    generated: TokenIds,
    *,
    max_new_tokens: int | Sequence[int] | npt.NDArray[np.integer[Any]],
    stop_token_ids: Collection[int] = (),
    request_stop_token_ids: Sequence[Collection[int]] | None = None,
    dtype: str = "float64",
) -> TransformersVerification:
    """Compare ``generated[r]`` with transformers' greedy generation of ``prompts[r]`` alone
    on the Qwen3 ``checkpoint`` directory: at most ``max_new_tokens`` tokens (one int, or one
    per prompt), up to and including the first of ``stop_token_ids`` (every request) or of
    ``request_stop_token_ids[r]`` (its own) -- the arguments :func:`~pypto_sched.generate`
    took, in the forms it takes them.

    Every argument is checked before transformers runs: a bad one raises
    :class:`~pypto_sched.InvalidInputError` naming it (a checkpoint that is missing or
    unreadable, :class:`~pypto_sched.CheckpointError`). Raises
    :class:`~pypto_sched.prompts.MissingDependencyError` without transformers or torch."""
    missing = transformers_missing()
    if missing is not None:
        raise MissingDependencyError(missing)
    if not isinstance(checkpoint, str | os.PathLike):
        raise InvalidInputError(
            f"'checkpoint' must be a checkpoint directory: {checkpoint!r} "
            f"({type(checkpoint).__name__})"
        )
    if not Path(checkpoint).is_dir():
        raise CheckpointError(f"'checkpoint' must be a checkpoint directory: {str(checkpoint)!r}")
    vocab_size = read_config(Path(checkpoint)).vocab_size
    ours = token_lists("prompts", prompts, vocab_size=vocab_size)
    count = len(ours)
    if not isinstance(generated, Sequence) or len(generated) != count:
        raise InvalidInputError(
            f"'generated' must be a sequence of one token id array per prompt ({count}): "
            f"{type(generated).__name__} of {_length(generated)}"
        )
    outputs = token_lists("generated", generated, vocab_size=vocab_size, allow_empty=True)
    news = per_request_counts(max_new_tokens, count)
    stops = stop_sets(stop_token_ids, request_stop_token_ids, count, vocab_size=vocab_size)
    if dtype not in _DTYPES:
        raise InvalidInputError(f"'dtype' must be one of {list(_DTYPES)}: {dtype!r}")
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    model = AutoModelForCausalLM.from_pretrained(str(checkpoint), dtype=getattr(torch, dtype))
    model.eval()  # type: ignore[no-untyped-call]  # torch's Module.eval is untyped here
    # generate() fills every setting left unset from the model's generation config, which
    # from_pretrained read from the checkpoint's generation_config.json (a repetition_penalty,
    # no_repeat_ngram_size, suppress_tokens... there would change the greedy tokens): replace
    # it with a fresh one, so transformers runs plain greedy decoding and nothing else.
    model.generation_config = GenerationConfig()  # type: ignore[no-untyped-call]
    mismatches = []
    for index, (prompt, new, stop, mine) in enumerate(zip(ours, news, stops, outputs, strict=True)):
        ids = torch.tensor([prompt], dtype=torch.long)
        with torch.inference_mode():
            output = model.generate(
                ids, attention_mask=torch.ones_like(ids), generation_config=_greedy(new)
            )
        theirs = _until_stop(output[0, len(prompt) :].tolist(), stop)
        mismatch = _first_difference(index, mine, theirs)
        if mismatch is not None:
            mismatches.append(mismatch)
    return TransformersVerification(num_requests=count, mismatches=tuple(mismatches))


def _greedy(max_new_tokens: int) -> Any:
    """The only settings a verification means: greedy decoding for ``max_new_tokens`` tokens,
    no EOS (the tokens are cut by the run's stop tokens instead), a pad id for the rule that
    needs one (a single unpadded prompt never uses it)."""
    from transformers import GenerationConfig

    return GenerationConfig(  # type: ignore[no-untyped-call]  # transformers' __init__ is untyped
        do_sample=False, num_beams=1, max_new_tokens=max_new_tokens, eos_token_id=None,
        pad_token_id=0,
    )  # fmt: skip


def _length(values: object) -> str:
    return f"{len(values)} entries" if isinstance(values, Sized) else "no length"


def _until_stop(tokens: list[int], stops: Collection[int]) -> list[int]:
    for position, token in enumerate(tokens):
        if token in stops:
            return tokens[: position + 1]
    return tokens


def _first_difference(index: int, ours: list[int], theirs: list[int]) -> Mismatch | None:
    for position, (a, b) in enumerate(zip(ours, theirs, strict=False)):
        if a != b:
            return Mismatch(index=index, position=position, ours=a, theirs=b)
    if len(ours) == len(theirs):
        return None
    shorter = min(len(ours), len(theirs))
    return Mismatch(
        index=index,
        position=shorter,
        ours=ours[shorter] if shorter < len(ours) else None,
        theirs=theirs[shorter] if shorter < len(theirs) else None,
    )
