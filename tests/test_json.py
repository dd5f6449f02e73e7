"""The JSON reader's fast paths against the plain rules they replace.

``load_json``'s nesting depth is computed without a Python loop over the characters, and a
schedule's rows in the JSON form are read column by column; each must give what the plain
character loop and the row-by-row reading give (the reading names the first bad row).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from pypto_sched import InvalidScheduleError, PlannerConfig, Schedule, plan_prefill
from pypto_sched.core._json import _depth
from pypto_sched.core._schedule import _checked_rows, _json_rows


def plain_depth(text: str) -> int:
    """Deepest nesting of ``[``/``{`` outside strings, one character at a time."""
    depth = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


@given(st.text(alphabet='[]{}"\\a1,é\n', max_size=60))
def test_the_depth_is_the_plain_loops(text: str) -> None:
    assert _depth(text) == plain_depth(text)


fields = st.integers(min_value=0, max_value=40) | st.sampled_from(
    [-1, 2**31 - 1, 2**31, 2**63, True, 1.0, None, "3"]
)
rows = st.lists(fields, min_size=3, max_size=3).flatmap(
    lambda three: st.sampled_from([True, False, 1, 0, None]).map(lambda last: [*three, last])
) | st.sampled_from([[0, 0, 1], "0001", (0, 0, 1, True), [0, 0, 1, True, 5]])


@given(st.lists(st.lists(rows, max_size=4), min_size=1, max_size=4))
@example([[[0, 0, 1, True]], [[1, 2, 3, False], [0, 1, 2, True]]])  # rows the fast path reads
def test_the_json_rows_read_at_once_are_the_rows_read_one_by_one(
    dispatches: list[list[Any]],
) -> None:
    fast = _json_rows(dispatches)
    try:
        offsets, columns = _checked_rows(dispatches)
    except InvalidScheduleError:
        assert fast is None  # the reading one by one names the bad row
        return
    if fast is None:  # (no rows at all, or only a form the fast path leaves to the reading)
        return
    assert np.array_equal(fast[0], offsets)
    for got, expected in zip(fast[1], columns, strict=True):
        assert np.array_equal(got, expected)
        assert got.dtype == expected.dtype


@pytest.mark.parametrize("policy", ["round_robin", "packed"])
def test_a_large_schedule_round_trips_through_json(policy: str) -> None:
    lengths = np.random.default_rng(0).integers(1, 2_000, 20_000)
    config = PlannerConfig(max_num_batched_tokens=1_024, long_prefill_token_threshold=64,
                           policy=policy)  # type: ignore[arg-type]  # fmt: skip
    schedule = plan_prefill(lengths, config)
    assert Schedule.from_json(schedule.to_json()) == schedule
