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
whether they are there.

Near-ties
---------
A backend that computes in low precision may break a near-tie between two logits the other
way without being wrong, and from there generate other tokens. Given the backend's
``tolerance`` and ``relative_tolerance`` (its promise, see :func:`~pypto_sched.compare_results`),
a request that differs from transformers' tokens is checked again *on its own tokens*: one
forward pass of transformers over the prompt and the generated tokens gives, for each
generated token, the logits transformers computes after the same tokens, and the request
passes when every generated token agrees with them by the verification rule's greedy-id
rule (its logit within twice the allowed difference of the row's maximum) and the tokens end
where :func:`~pypto_sched.generate` stops (at the first stop token, else after
``max_new_tokens``). Such a request is reported as a :class:`NearTie`, not a mismatch.

A tolerance can be wide against a model's logits (a small model in bfloat16: a few tenths,
when its best logits lie within hundredths of each other), wide enough that a backend which
always took the second choice would keep to it. Near-ties are rare, though: a correct
low-precision backend takes another token than transformers after the same tokens for about
1 in 100 of the tokens it generates. So a run passes only if at most one in
:data:`NEAR_TIE_SHARE` of its generated tokens (one at least) differ from transformers'
choice; more is reported as a failure of the run. With both tolerances 0 (the defaults) the
comparison is exact. transformers runs in float64 by default, so its logits stand for the
exact ones.
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

from ..core._errors import CheckpointError, InvalidInputError
from ..models.qwen3 import read_config
from ..runtime._generate import per_request_counts, stop_sets, token_lists
from ..runtime._verify import greedy_ids_agree, is_tolerance
from ..runtime.execute import TokenIds
from ..runtime.prompts import MissingDependencyError

__all__ = ["INSTALL", "NEAR_TIE_SHARE", "Mismatch", "NearTie", "TransformersVerification",
           "transformers_missing", "verify_greedy_generation"]  # fmt: skip

#: The dtypes transformers may run in, by name (float64 by default: see above).
_DTYPES = ("float64", "float32", "bfloat16", "float16")
#: What to install for a verification.
INSTALL = "pip install 'pypto-sched[transformers]' torch"
#: At most one generated token in this many may differ from transformers' choice after the
#: same tokens (near-ties are rare; see the module docstring).
NEAR_TIE_SHARE = 20


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
    #: Set when the request was checked on its own tokens (see *Near-ties*): ``theirs`` is
    #: then transformers' choice after the same tokens, and ``gap`` how far its logit is
    #: above ours ...
    gap: float | None = None
    #: ... when the most the rule allows is ``slack``.
    slack: float | None = None
    #: Set when the tokens end where greedy generation would not (too many, past a stop
    #: token, or too few without one), whatever the logits: that, in words.
    ending: str | None = None

    def describe(self) -> str:
        if self.ending is not None:
            return f"request {self.index}: {self.ending}"
        where = f"request {self.index}: generated token {self.position} is {self.ours}"
        if self.gap is None or self.slack is None:
            return f"{where}, transformers' is {self.theirs}"
        return (
            f"{where}, transformers' after the same tokens is {self.theirs}, its logit "
            f"{self.gap:.3g} above ours (more than the {self.slack:.3g} the backend's "
            f"tolerance allows)"
        )


@attrs.frozen(kw_only=True)
class NearTie:
    """A request whose tokens differ from transformers' ``generate()`` from ``position`` on
    but agree, token by token, with transformers' logits after the same tokens within the
    backend's tolerance (see *Near-ties* in the module docstring)."""

    #: The request, counted from 0 in input order.
    index: int
    #: The first generated token that differs from transformers' ``generate()``.
    position: int
    #: Our token there and transformers'.
    ours: int
    theirs: int
    #: The largest, over the request's generated tokens, of how far transformers' best
    #: logit is above the logit of our token, as a fraction of the slack allowed there.
    worst_fraction: float
    #: How many of its generated tokens differ from transformers' choice after the same
    #: tokens (at least 1).
    num_differing: int


@attrs.frozen(kw_only=True)
class TransformersVerification:
    """The outcome of :func:`verify_greedy_generation`."""

    num_requests: int
    #: One per request that differs beyond its near-ties, in input order.
    mismatches: tuple[Mismatch, ...]
    #: One per request that differs only at near-ties, in input order.
    near_ties: tuple[NearTie, ...] = ()
    #: The tokens the run generated, every request's.
    num_tokens: int = 0

    @property
    def num_differing(self) -> int:
        """Generated tokens, over the near-tie requests, that differ from transformers'
        choice after the same tokens."""
        return sum(tie.num_differing for tie in self.near_ties)

    @property
    def too_many_near_ties(self) -> bool:
        """Whether more than one in :data:`NEAR_TIE_SHARE` of the run's tokens (and more
        than one) differ from transformers' choice: too many to be near-ties."""
        return self.num_differing > max(1, self.num_tokens // NEAR_TIE_SHARE)

    @property
    def passed(self) -> bool:
        return not self.mismatches and not self.too_many_near_ties

    def describe(self) -> str:
        equal = self.num_requests - len(self.mismatches) - len(self.near_ties)
        text = (
            f"{'PASS' if self.passed else 'FAIL'} vs transformers generate(): "
            f"{equal}/{self.num_requests} equal"
        )
        if self.near_ties:
            worst = max(tie.worst_fraction for tie in self.near_ties)
            text += (
                f", {len(self.near_ties)} more break a near-tie the other way ("
                f"{self.num_differing:,} of {self.num_tokens:,} generated tokens not "
                f"transformers' choice after the same tokens, each within {_percent(worst)} "
                f"of the slack the backend's tolerance allows)"
            )
        if self.mismatches:
            text += f"; first difference: {self.mismatches[0].describe()}"
        elif self.too_many_near_ties:
            text += (
                f"; more than 1 in {NEAR_TIE_SHARE} of the tokens differ: too many to be "
                f"near-ties (a tolerance wide against this model's logits; compare in float32)"
            )
        return text


def _percent(fraction: float) -> str:
    """A fraction as a percentage that never rounds a difference away: ``"0.23%"``."""
    return f"{fraction * 100:.2g}%"


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
    tolerance: float = 0.0,
    relative_tolerance: float = 0.0,
    device: str = "cpu",
) -> TransformersVerification:
    """Compare ``generated[r]`` with transformers' greedy generation of ``prompts[r]`` alone
    on the Qwen3 ``checkpoint`` directory: at most ``max_new_tokens`` tokens (one int, or one
    per prompt), up to and including the first of ``stop_token_ids`` (every request) or of
    ``request_stop_token_ids[r]`` (its own) -- the arguments :func:`~pypto_sched.generate`
    took, in the forms it takes them; transformers runs in ``dtype`` on the torch
    ``device`` (``"cpu"``, the default, or ``"cuda"``, say). ``tolerance`` and
    ``relative_tolerance``, the backend's
    (:attr:`~pypto_sched.backends.Backend.tolerance` and
    :func:`~pypto_sched.backends.relative_tolerance`), let a request that differs pass at
    near-ties (see the module docstring); at 0, the default, tokens must be equal.

    Every argument is checked before transformers runs: a bad one raises
    :class:`~pypto_sched.InvalidInputError` naming it (a checkpoint that is missing or
    unreadable, :class:`~pypto_sched.CheckpointError`). Raises
    :class:`~pypto_sched.prompts.MissingDependencyError` without transformers or torch."""
    missing = transformers_missing()
    if missing is not None:
        raise MissingDependencyError(missing)
    if not isinstance(checkpoint, str | os.PathLike):
        raise InvalidInputError.about(
            "checkpoint",
            f"must be a checkpoint directory: {checkpoint!r} ({type(checkpoint).__name__})",
        )
    if not Path(checkpoint).is_dir():
        raise CheckpointError.about(
            "checkpoint", f"must be a checkpoint directory: {str(checkpoint)!r}"
        )
    vocab_size = read_config(Path(checkpoint)).vocab_size
    ours = token_lists("prompts", prompts, vocab_size=vocab_size)
    count = len(ours)
    if not isinstance(generated, Sequence) or len(generated) != count:
        raise InvalidInputError.about(
            "generated",
            f"must be a sequence of one token id array per prompt ({count}): "
            f"{type(generated).__name__} of {_length(generated)}",
        )
    outputs = token_lists("generated", generated, vocab_size=vocab_size, allow_empty=True)
    news = per_request_counts(max_new_tokens, count)
    stops = stop_sets(stop_token_ids, request_stop_token_ids, count, vocab_size=vocab_size)
    if dtype not in _DTYPES:
        raise InvalidInputError.about("dtype", f"must be one of {list(_DTYPES)}: {dtype!r}")
    for name, value in (("tolerance", tolerance), ("relative_tolerance", relative_tolerance)):
        if not is_tolerance(value):
            raise InvalidInputError.about(name, f"must be a finite real number >= 0: {value!r}")
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    try:
        target = torch.device(device)
    except (RuntimeError, TypeError):
        raise InvalidInputError.about(
            "device", f"must be a torch device such as 'cpu' or 'cuda:0': {device!r}"
        ) from None
    model: Any = AutoModelForCausalLM.from_pretrained(str(checkpoint), dtype=getattr(torch, dtype))
    model.to(target)
    model.eval()
    # generate() fills every setting left unset from the model's generation config, which
    # from_pretrained read from the checkpoint's generation_config.json (a repetition_penalty,
    # no_repeat_ngram_size, suppress_tokens... there would change the greedy tokens): replace
    # it with a fresh one, so transformers runs plain greedy decoding and nothing else.
    model.generation_config = GenerationConfig()  # type: ignore[no-untyped-call]
    near_ties_allowed = bool(tolerance or relative_tolerance)
    num_tokens = sum(len(tokens) for tokens in outputs)
    mismatches: list[Mismatch] = []
    near_ties: list[NearTie] = []
    for index, (prompt, new, stop, mine) in enumerate(zip(ours, news, stops, outputs, strict=True)):
        ids = torch.tensor([prompt], dtype=torch.long, device=target)
        with torch.inference_mode():
            output = model.generate(
                ids, attention_mask=torch.ones_like(ids), generation_config=_greedy(new)
            )
        theirs = _until_stop(output[0, len(prompt) :].tolist(), stop)
        mismatch = _first_difference(index, mine, theirs)
        if mismatch is None:
            continue
        if near_ties_allowed and mismatch.ours is not None and mismatch.theirs is not None:
            # A token differs (rather than one side ending first): check ours on our tokens.
            logits = _logits_after(model, prompt, mine)
            outcome = _on_own_tokens(
                mismatch, mine, logits, new=new, stop=stop,
                tolerance=float(tolerance), relative_tolerance=float(relative_tolerance),
            )  # fmt: skip
            if isinstance(outcome, NearTie):
                near_ties.append(outcome)
                continue
            mismatch = outcome
        mismatches.append(mismatch)
    return TransformersVerification(
        num_requests=count,
        mismatches=tuple(mismatches),
        near_ties=tuple(near_ties),
        num_tokens=num_tokens,
    )


def _logits_after(model: Any, prompt: list[int], generated: list[int]) -> npt.NDArray[np.float64]:
    """transformers' logits for each of ``generated`` after the prompt and the generated
    tokens before it (one forward pass), as ``[len(generated), vocab_size]`` float64."""
    import torch

    ids = torch.tensor([prompt + generated[:-1]], dtype=torch.long, device=model.device)
    with torch.inference_mode():
        logits = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
    rows: npt.NDArray[np.float64] = (
        logits[0, len(prompt) - 1 :].to(torch.float64).cpu().numpy().astype(np.float64)
    )
    return rows


def _on_own_tokens(
    mismatch: Mismatch,
    generated: list[int],
    logits: npt.NDArray[np.float64],
    *,
    new: int,
    stop: Collection[int],
    tolerance: float,
    relative_tolerance: float,
) -> NearTie | Mismatch:
    """A near-tie if every generated token agrees with transformers' ``logits`` after the
    same tokens (the greedy-id rule) and the tokens end where generation stops; otherwise
    the first token that disagrees (with its gap), or how the tokens end wrongly."""
    ending = _wrong_ending(generated, new, stop)
    if ending is not None:
        position, text = ending
        return attrs.evolve(
            mismatch,
            position=position,
            ours=generated[position] if position < len(generated) else None,
            theirs=None,
            ending=text,
        )
    chosen = np.array(generated, dtype=np.int64)
    agree, slack = greedy_ids_agree(
        logits, chosen, tolerance=tolerance, relative_tolerance=relative_tolerance
    )
    gaps = logits.max(axis=1) - logits[np.arange(chosen.size), chosen]
    if agree.all():
        assert mismatch.ours is not None, "the caller checks tokens that differ"
        assert mismatch.theirs is not None, "the caller checks tokens that differ"
        return NearTie(
            index=mismatch.index, position=mismatch.position, ours=mismatch.ours,
            theirs=mismatch.theirs,
            worst_fraction=float(np.max(gaps / np.maximum(slack, np.finfo(np.float64).tiny))),
            num_differing=int(np.count_nonzero(gaps > 0)),
        )  # fmt: skip
    position = int(np.argmin(agree))
    return Mismatch(
        index=mismatch.index, position=position, ours=generated[position],
        theirs=int(np.argmax(logits[position])), gap=float(gaps[position]),
        slack=float(slack[position]),
    )  # fmt: skip


def _greedy(max_new_tokens: int) -> Any:
    """The only settings a verification means: greedy decoding for ``max_new_tokens`` tokens,
    no EOS (the tokens are cut by the run's stop tokens instead), a pad id for the rule that
    needs one (a single unpadded prompt never uses it)."""
    from transformers import GenerationConfig

    return GenerationConfig(  # type: ignore[no-untyped-call]  # transformers' __init__ is untyped
        do_sample=False, num_beams=1, max_new_tokens=max_new_tokens, eos_token_id=None,
        pad_token_id=0,
    )  # fmt: skip


def _wrong_ending(generated: list[int], new: int, stop: Collection[int]) -> tuple[int, str] | None:
    """Where and how ``generated`` ends where greedy generation would not (``None`` if it
    ends right): past ``new`` tokens, past a stop token, or short of ``new`` without one."""
    if len(generated) > new:
        return new, f"generated {len(generated)} tokens, more than max_new_tokens {new}"
    stopped = len(_until_stop(generated, stop))
    if stopped < len(generated):
        token = generated[stopped - 1]
        return stopped, f"goes on after stop token {token} (generated token {stopped - 1})"
    if len(generated) < new and (not generated or generated[-1] not in stop):
        return len(generated), (f"ends after {len(generated)} of {new} tokens without a stop token")
    return None


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
