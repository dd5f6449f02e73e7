"""Warmup shapes: the dispatch shapes an engine should compile before serving."""

from __future__ import annotations

import attrs

from ._config import PlannerConfig, check_config
from ._errors import InvalidInputError
from ._policies import request_cap
from ._validate import MAX_TOKENS, check_int

__all__ = ["WarmupShape", "plan_warmup"]


def _check_num_rows(value: object) -> int:
    return check_int("num_rows", value, min_value=1)


def _tokens(value: object) -> int:
    return check_int("tokens_per_row", value, min_value=1)


@attrs.frozen(kw_only=True)
class WarmupShape:
    """A dispatch of ``num_rows`` rows of ``tokens_per_row`` tokens each (each an int at
    least 1, checked when built by hand, as :class:`~pypto_sched.Chunk`'s fields are)."""

    num_rows: int = attrs.field(converter=_check_num_rows)
    tokens_per_row: int = attrs.field(converter=_tokens)

    def __attrs_post_init__(self) -> None:
        if self.num_tokens > MAX_TOKENS:
            raise InvalidInputError(
                f"'num_rows' * 'tokens_per_row' must be <= {MAX_TOKENS}: {self.num_tokens}"
            )

    @property
    def num_tokens(self) -> int:
        return self.num_rows * self.tokens_per_row


def plan_warmup(
    config: PlannerConfig, *, batch_size: int, max_seq_len: int
) -> tuple[WarmupShape, ...]:
    """The shapes to warm up for batches of up to ``batch_size`` prompts of up to
    ``max_seq_len`` tokens, largest row count first.

    No shape carries more than ``config.effective_budget`` tokens. The batched shape spreads
    that budget over ``batch_size`` rows (``budget // rows`` tokens each); when the budget is
    smaller than the batch, it warms up fewer rows (one token each) rather than exceeding the
    budget, as the seed does. The single-row shape is a long prompt's chunk; under
    ``packed`` a last one-row shape is the chunk of a request left alone (the work-conserving
    tail of :func:`~pypto_sched.core._policies.request_cap`), when it is longer.
    """
    check_config(config)
    batch_size = check_int("batch_size", batch_size, min_value=1)
    max_seq_len = check_int("max_seq_len", max_seq_len, min_value=1)
    budget = config.effective_budget
    rows = min(batch_size, budget, config.max_num_seqs or batch_size)
    batched = WarmupShape(
        num_rows=rows, tokens_per_row=min(budget // rows, config.chunk_cap, max_seq_len)
    )
    singles = [
        WarmupShape(num_rows=1, tokens_per_row=min(cap, max_seq_len))
        for cap in (config.chunk_cap, request_cap(config, 1, 0, 0))
    ]
    return tuple(dict.fromkeys((batched, *singles)))  # distinct, in order
