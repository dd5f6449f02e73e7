"""Greedy generation checked against transformers' own ``generate()`` on the same checkpoint.

:func:`verify_greedy_generation` runs every prompt alone through transformers'
``AutoModelForCausalLM.generate`` (greedy, with an all-ones ``attention_mask``) and compares
its tokens with the ones :func:`~pypto_sched.generate` gave, token for token. transformers
is asked for the full ``max_new_tokens`` with its own EOS switched off (``eos_token_id=None``:
neither stopping on it nor masking it), and its tokens are cut after the first of the
request's stop tokens, which is the rule :func:`~pypto_sched.generate` stops by; so the
checkpoint's generation config cannot make the two disagree on when to stop.

transformers (and torch) are imported only when a verification runs
(``pip install 'pypto-sched[transformers]'``); :func:`transformers_missing` says beforehand
whether they are there. Run it in float64 against a float64 backend: in a lower precision a
near-tie between two logits can flip a greedy token without either side being wrong.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Collection, Sequence
from pathlib import Path

import attrs

from ..prompts import MissingDependencyError

__all__ = ["INSTALL", "Mismatch", "TransformersVerification", "transformers_missing",
           "verify_greedy_generation"]  # fmt: skip

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
    checkpoint: str | Path,
    prompts: Sequence[Sequence[int]],
    generated: Sequence[Sequence[int]],
    *,
    max_new_tokens: Sequence[int],
    stop_token_ids: Sequence[Collection[int]],
    dtype: str = "float64",
) -> TransformersVerification:
    """Compare ``generated[r]`` with transformers' greedy generation of ``prompts[r]`` alone
    on ``checkpoint``: at most ``max_new_tokens[r]`` tokens, up to and including the first of
    ``stop_token_ids[r]``. Raises :class:`~pypto_sched.prompts.MissingDependencyError`
    without transformers or torch."""
    missing = transformers_missing()
    if missing is not None:
        raise MissingDependencyError(missing)
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(checkpoint), dtype=getattr(torch, dtype))
    model.eval()  # type: ignore[no-untyped-call]  # torch's Module.eval is untyped here
    mismatches = []
    for index, (prompt, ours) in enumerate(zip(prompts, generated, strict=True)):
        ids = torch.tensor([list(prompt)], dtype=torch.long)
        count = max_new_tokens[index]
        with torch.inference_mode():
            output = model.generate(
                ids, attention_mask=torch.ones_like(ids), max_new_tokens=count,
                eos_token_id=None, do_sample=False, pad_token_id=0,
            )  # fmt: skip
        theirs = _until_stop(output[0, len(prompt) :].tolist(), stop_token_ids[index])
        mismatch = _first_difference(index, list(ours), theirs)
        if mismatch is not None:
            mismatches.append(mismatch)
    return TransformersVerification(num_requests=len(prompts), mismatches=tuple(mismatches))


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
