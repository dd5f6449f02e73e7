"""Warmup shapes stay inside the budget, as in the seed."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pypto_sched import POLICIES, InvalidInputError, PlannerConfig, WarmupShape, plan_warmup


@st.composite
def configs(draw: st.DrawFn) -> PlannerConfig:
    budget = draw(st.integers(1, 20) | st.integers(1, 20000))
    return PlannerConfig(
        max_num_batched_tokens=budget,
        long_prefill_token_threshold=draw(st.none() | st.integers(1, 20000)),
        max_num_seqs=draw(st.none() | st.integers(1, 300)),
        policy=draw(st.sampled_from(POLICIES)),
    )


batch_sizes = st.integers(1, 300)
seq_lens = st.integers(1, 40000)


@given(configs(), batch_sizes, seq_lens)
def test_no_warmup_shape_exceeds_the_budget_the_batch_or_the_sequence_length(
    config: PlannerConfig, batch: int, seq_len: int
) -> None:
    shapes = plan_warmup(config, batch_size=batch, max_seq_len=seq_len)
    assert 1 <= len(shapes) <= 3
    for shape in shapes:
        assert shape.num_tokens == shape.num_rows * shape.tokens_per_row
        assert 1 <= shape.num_tokens <= config.effective_budget
        assert 1 <= shape.num_rows <= batch
        assert shape.num_rows <= (config.max_num_seqs or batch)
        assert 1 <= shape.tokens_per_row <= min(seq_len, config.chunk_cap) or (
            # packed's work-conserving tail: a request left alone runs the whole budget
            config.policy == "packed"
            and shape == shapes[-1]
            and shape.tokens_per_row == min(seq_len, config.max_num_batched_tokens)
        )


@given(configs(), batch_sizes, seq_lens)
def test_warmup_shapes_are_distinct_largest_row_count_first_ending_with_the_longest_row(
    config: PlannerConfig, batch: int, seq_len: int
) -> None:
    shapes = plan_warmup(config, batch_size=batch, max_seq_len=seq_len)
    assert len(set(shapes)) == len(shapes)
    assert [s.num_rows for s in shapes] == sorted((s.num_rows for s in shapes), reverse=True)
    longest = config.max_num_batched_tokens if config.policy == "packed" else config.chunk_cap
    assert shapes[-1] == WarmupShape(num_rows=1, tokens_per_row=min(longest, seq_len))
    capped = WarmupShape(num_rows=1, tokens_per_row=min(config.chunk_cap, seq_len))
    assert capped in shapes


@given(st.integers(1, 300), st.integers(1, 20000))
def test_seed_rule_batch_b_budget_e_warms_b_rows_of_e_div_b_or_e_rows_of_one(
    batch: int, budget: int
) -> None:
    config = PlannerConfig(max_num_batched_tokens=budget)
    batched = plan_warmup(config, batch_size=batch, max_seq_len=10**6)[0]
    if budget >= batch:
        assert batched == WarmupShape(num_rows=batch, tokens_per_row=budget // batch)
    else:
        assert batched == WarmupShape(num_rows=budget, tokens_per_row=1)


@pytest.mark.parametrize(
    ("config", "batch", "expected"),
    [
        (
            PlannerConfig(max_num_batched_tokens=8192, long_prefill_token_threshold=256),
            16,
            (
                WarmupShape(num_rows=16, tokens_per_row=16),
                WarmupShape(num_rows=1, tokens_per_row=256),
            ),
        ),
        (
            PlannerConfig(max_num_batched_tokens=8192, long_prefill_token_threshold=2),
            4,
            (WarmupShape(num_rows=2, tokens_per_row=1), WarmupShape(num_rows=1, tokens_per_row=2)),
        ),
        (
            PlannerConfig(max_num_batched_tokens=4),
            4,
            (WarmupShape(num_rows=4, tokens_per_row=1), WarmupShape(num_rows=1, tokens_per_row=4)),
        ),
        (
            PlannerConfig(max_num_batched_tokens=8192),
            16,
            (
                WarmupShape(num_rows=16, tokens_per_row=512),
                WarmupShape(num_rows=1, tokens_per_row=8192),
            ),
        ),
        (
            PlannerConfig(max_num_batched_tokens=8192, long_prefill_token_threshold=256),
            1,
            (WarmupShape(num_rows=1, tokens_per_row=256),),
        ),
        (
            PlannerConfig(
                max_num_batched_tokens=8192, long_prefill_token_threshold=256, policy="packed"
            ),
            16,
            (
                WarmupShape(num_rows=16, tokens_per_row=256),
                WarmupShape(num_rows=1, tokens_per_row=256),
                WarmupShape(num_rows=1, tokens_per_row=8192),  # a request left alone
            ),
        ),
        (
            PlannerConfig(max_num_batched_tokens=8192, max_num_seqs=8),
            16,
            (
                WarmupShape(num_rows=8, tokens_per_row=1024),
                WarmupShape(num_rows=1, tokens_per_row=8192),
            ),
        ),
    ],
    ids=[
        "seed threshold 256",
        "batch 4 threshold 2",
        "budget equals batch",
        "no threshold",
        "one row",
        "packed keeps the full budget",
        "row limit",
    ],
)
def test_warmup_shapes_of_known_configs(
    config: PlannerConfig, batch: int, expected: tuple[WarmupShape, ...]
) -> None:
    assert plan_warmup(config, batch_size=batch, max_seq_len=4096 * 4) == expected


def test_max_seq_len_caps_tokens_per_row() -> None:
    config = PlannerConfig(max_num_batched_tokens=8192)
    assert plan_warmup(config, batch_size=2, max_seq_len=100) == (
        WarmupShape(num_rows=2, tokens_per_row=100),
        WarmupShape(num_rows=1, tokens_per_row=100),
    )


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"num_rows": -1, "tokens_per_row": 4}, r"^'num_rows' must be >= 1: -1$"),
        ({"num_rows": 1, "tokens_per_row": "x"}, r"^'tokens_per_row' must be an int: 'x' \(str\)$"),
        ({"num_rows": True, "tokens_per_row": 4}, r"^'num_rows' must be an int: True \(bool\)$"),
        (
            {"num_rows": 2**16, "tokens_per_row": 2**16},
            r"^'num_rows' \* 'tokens_per_row' must be <= 2147483647: 4294967296$",
        ),
    ],
)
def test_a_warmup_shape_built_by_hand_is_checked(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidInputError, match=message):
        WarmupShape(**fields)
    shape = WarmupShape(num_rows=np.int64(3), tokens_per_row=np.int32(4))
    assert shape == WarmupShape(num_rows=3, tokens_per_row=4)
    assert type(shape.num_rows) is int


def test_a_shape_of_exactly_max_tokens_is_allowed() -> None:
    assert WarmupShape(num_rows=1, tokens_per_row=2**31 - 1).num_tokens == 2**31 - 1
    with pytest.raises(InvalidInputError, match=r"must be <= 2147483647: 2147483648"):
        WarmupShape(num_rows=2, tokens_per_row=2**30)


@pytest.mark.parametrize("tokens", [0, -1])
def test_a_warmup_shape_needs_at_least_one_token_per_row(tokens: int) -> None:
    with pytest.raises(InvalidInputError, match=rf"^'tokens_per_row' must be >= 1: {tokens}$"):
        WarmupShape(num_rows=2, tokens_per_row=tokens)
