"""The Schedule API, its JSON round trip, and tampered JSON that loading must reject."""

from __future__ import annotations

import ast
import copy
import json
import math
import pickle
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import pytest
from hypothesis import given
from test_planner import Case, cases, rows_of

import pypto_sched
from pypto_sched import (
    FORMAT_VERSION,
    Chunk,
    Dispatch,
    InvalidInputError,
    InvalidScheduleError,
    PlannerConfig,
    Schedule,
    ScheduleStats,
    plan_prefill,
)

# -- the API -----------------------------------------------------------------------------------


@pytest.fixture
def seed() -> Schedule:
    config = PlannerConfig(max_num_batched_tokens=8192, long_prefill_token_threshold=256)
    return plan_prefill([3338] * 16, config)


def test_sizes_of_the_seed_schedule(seed: Schedule) -> None:
    assert seed.num_requests == 16
    assert seed.num_dispatches == 224
    assert seed.num_chunks == 224
    assert seed.num_tokens == 16 * 3338
    assert seed.lower_bound == 14


def test_num_tokens_leaves_out_computed_tokens() -> None:
    schedule = plan_prefill(
        [10, 20], PlannerConfig(max_num_batched_tokens=8), num_computed_tokens=[3, 19]
    )
    assert schedule.num_tokens == 7 + 1


def test_dispatch_indexing_counts_negative_indices_from_the_end(seed: Schedule) -> None:
    assert seed.dispatch(-1).index == 223
    assert seed.dispatch(-224).index == 0
    assert seed.dispatch(-1).rows == (Chunk(request=15, start=3328, length=10, is_final=True),)
    for index in (224, -225, 10**6):
        with pytest.raises(IndexError, match=rf"^'index' must be in \[-224, 224\): {index}$"):
            seed.dispatch(index)


def test_dispatch_takes_numpy_ints_and_gives_a_python_int_index(seed: Schedule) -> None:
    for index in (np.int64(3), np.int32(3), np.uint8(3), np.int64(-221)):
        dispatch = seed.dispatch(index)
        assert type(dispatch.index) is int
        assert dispatch.index == 3
        assert json.dumps({"index": dispatch.index}) == '{"index": 3}'


@pytest.mark.parametrize(
    ("index", "message"),
    [
        (True, r"^'index' must be an int, not a bool: True$"),
        # (NumPy 2 shows np.False_, NumPy 1 False)
        (np.bool_(False), r"^'index' must be an int, not a bool: (np\.False_|False)$"),
        (1.0, r"^'index' must be an int: 1.0 \(float\)$"),
        ("1", r"^'index' must be an int: '1' \(str\)$"),
        (None, r"^'index' must be an int: None \(NoneType\)$"),
    ],
)
def test_dispatch_refuses_an_index_that_is_not_an_int(
    seed: Schedule, index: Any, message: str
) -> None:
    with pytest.raises(InvalidInputError, match=message):
        seed.dispatch(index)


def test_dispatches_is_a_sequence_of_every_dispatch_in_order(seed: Schedule) -> None:
    dispatches = seed.dispatches
    assert len(dispatches) == 224
    assert [d.index for d in dispatches] == list(range(224))
    assert [d.index for d in dispatches[220:]] == [220, 221, 222, 223]
    assert [d.index for d in dispatches[::100]] == [0, 100, 200]
    assert dispatches[-1].index == 223
    assert isinstance(dispatches[3], Dispatch)


def test_a_dispatch_is_a_read_only_view_of_its_rows() -> None:
    config = PlannerConfig(
        max_num_batched_tokens=10, long_prefill_token_threshold=6, policy="packed"
    )
    schedule = plan_prefill([8, 3, 9], config)
    first = schedule.dispatch(0)
    assert first.rows == (
        Chunk(request=0, start=0, length=6, is_final=False),
        Chunk(request=1, start=0, length=1, is_final=False),
        Chunk(request=2, start=0, length=3, is_final=False),
    )
    assert first.num_rows == 3
    assert first.num_tokens == 10
    assert [c.end for c in first.rows] == [6, 1, 3]
    for array in (first.requests, first.starts, first.lengths, first.is_final):
        assert not array.flags.writeable


@given(cases())
def test_derived_figures_agree_with_the_rows(case: Case) -> None:
    schedule = case.plan()
    dispatches = rows_of(schedule)
    assert schedule.tokens_per_dispatch.tolist() == [
        sum(length for _, _, length, _ in d) for d in dispatches
    ]
    assert schedule.rows_per_dispatch.tolist() == [len(d) for d in dispatches]
    assert schedule.row_dispatch.tolist() == [k for k, d in enumerate(dispatches) for _ in d]
    np.testing.assert_allclose(
        schedule.utilization,
        [sum(row[2] for row in d) / case.config.max_num_batched_tokens for d in dispatches],
    )
    finish = {r: k for k, d in enumerate(dispatches) for r, _, _, final in d if final}
    assert schedule.finish_dispatch.tolist() == [finish[r] for r in range(len(case.lengths))]
    assert [d.rows for d in schedule.dispatches] == [
        tuple(Chunk(request=r, start=s, length=n, is_final=f) for r, s, n, f in d)
        for d in dispatches
    ]


@given(cases())
def test_lower_bound_is_the_largest_of_the_token_request_cap_and_row_bounds(case: Case) -> None:
    config = case.config
    remaining = [
        length - start for length, start in zip(case.lengths, case.start_positions, strict=True)
    ]
    cap, budget, rows = config.chunk_cap, config.max_num_batched_tokens, config.max_num_seqs
    per_dispatch = budget if rows is None else min(budget, rows * cap)
    longest, total = max(remaining), sum(remaining)
    if config.policy == "round_robin" or cap == budget:
        bounds = [-(-total // per_dispatch), -(-longest // cap)]
    else:  # packed's work-conserving tail: only the longest may run alone, the whole budget
        others = Fraction(total - longest, per_dispatch)
        bounds = [math.ceil(others + Fraction(longest, budget))]
        if len(remaining) == 1:
            bounds.append(-(-longest // budget))
        else:  # the longest runs at most the cap while the second longest is unfinished
            second = sorted(remaining)[-2]
            together = -(-second // cap)
            bounds.append(together + -(-max(longest - together * cap, 0) // budget))
    if config.max_num_seqs is not None:
        bounds.append(-(-len(remaining) // config.max_num_seqs))
    assert case.plan().lower_bound == max(bounds)


def test_equal_schedules_are_equal_and_hash_alike_and_differ_from_other_things() -> None:
    config = PlannerConfig(max_num_batched_tokens=4)
    first = plan_prefill([5, 6], config)
    second = plan_prefill(np.array([5, 6]), config)
    assert first == second
    assert hash(first) == hash(second)
    assert len({first, second}) == 1
    assert first != plan_prefill([5, 7], config)
    assert first != plan_prefill([5, 6], PlannerConfig(max_num_batched_tokens=5))
    assert first != plan_prefill([5, 6], config, num_computed_tokens=[1, 0])
    assert first != "a schedule"


def test_repr_names_policy_and_sizes(seed: Schedule) -> None:
    assert repr(seed) == (
        "Schedule(policy='round_robin', requests=16, dispatches=224, lower_bound=14, chunks=224)"
    )


def test_from_dispatches_takes_chunks_or_lists_and_validates() -> None:
    config = PlannerConfig(max_num_batched_tokens=4)
    from_lists = Schedule.from_dispatches(
        config, [5, 3], [[[0, 0, 4, False]], [[1, 0, 3, True]], [[0, 4, 1, True]]]
    )
    from_chunks = Schedule.from_dispatches(
        config,
        [5, 3],
        [
            [Chunk(request=0, start=0, length=4, is_final=False)],
            [Chunk(request=1, start=0, length=3, is_final=True)],
            [Chunk(request=0, start=4, length=1, is_final=True)],
        ],
    )
    assert from_lists == from_chunks == plan_prefill([5, 3], config)


def test_from_dispatches_takes_numpy_ints_and_bools_as_ints_and_bools() -> None:
    config = PlannerConfig(max_num_batched_tokens=4)
    rows = np.array([[0, 0, 4, 0], [1, 0, 3, 1], [0, 4, 1, 1]])
    as_numpy = [[[r, s, n, np.bool_(f)]] for r, s, n, f in rows]  # numpy ints and bools
    schedule = Schedule.from_dispatches(config, [5, 3], as_numpy)
    chunks = [[Chunk(request=r, start=s, length=n, is_final=np.bool_(f))] for r, s, n, f in rows]
    assert Schedule.from_dispatches(config, [np.int64(5), np.int64(3)], chunks) == schedule
    assert schedule == plan_prefill([5, 3], config)
    assert schedule.to_json() == plan_prefill([5, 3], config).to_json()


def test_from_dispatches_refuses_an_int_is_final_and_says_a_bool_is_expected() -> None:
    config = PlannerConfig(max_num_batched_tokens=4)
    with pytest.raises(
        InvalidScheduleError,
        match=r"^dispatch 1 row 0: 'is_final' must be a bool \(True or False, a NumPy bool too; "
        r"convert 0/1 with bool\(\)\): 1 \(int\)$",
    ):
        Schedule.from_dispatches(
            config, [5, 3], [[[0, 0, 4, False]], [[1, 0, 3, 1]], [[0, 4, 1, True]]]
        )


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"request": -1}, r"^'request' must be >= 0: -1$"),
        ({"start": -5}, r"^'start' must be >= 0: -5$"),
        ({"length": 0}, r"^'length' must be >= 1: 0$"),
        ({"length": True}, r"^'length' must be an int: True \(bool\)$"),
        ({"is_final": 1}, r"^'is_final' must be a bool \(True or False.*: 1 \(int\)$"),
    ],
)
def test_a_chunk_built_by_hand_is_checked(fields: dict[str, Any], match: str) -> None:
    values: dict[str, Any] = {"request": 0, "start": 0, "length": 1, "is_final": False}
    with pytest.raises(InvalidInputError, match=match):
        Chunk(**(values | fields))


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"index": True}, r"^'index' must be an int: True \(bool\)$"),
        ({"index": -1}, r"^'index' must be >= 0: -1$"),
        ({"requests": [-1]}, r"^'requests' values must be .*: item 0 is -1$"),
        ({"starts": [-4]}, r"^'starts' values must be .*: item 0 is -4$"),
        ({"lengths": [0]}, r"^'lengths' values must be .*: item 0 is 0$"),
        ({"lengths": [1.5]}, r"^'lengths' must hold ints: item 0 is 1.5 \(float\)$"),
        ({"is_final": [1]}, r"^'is_final' must hold bools: dtype int64$"),
        ({"is_final": [[True]]}, r"^'is_final' must be a sequence or 1-D array of bools"),
        (
            {"requests": [0, 1], "starts": [0], "lengths": [4], "is_final": [False]},
            r"must have one length: 2, 1, 1, 1$",
        ),
        (
            {"requests": [1, 1], "starts": [0, 4], "lengths": [4, 4], "is_final": [False] * 2},
            r"^'requests' must name each request at most once: \[1, 1\]$",
        ),
        ({"starts": [2**31 - 1], "lengths": [4]}, r"^'starts' \+ 'lengths' must be <= "),
    ],
)
def test_a_dispatch_built_by_hand_is_checked(fields: dict[str, Any], match: str) -> None:
    # Its arrays go to dispatch_arrays, where a negative request or start would index
    # another request's pages.
    values: dict[str, Any] = {
        "index": 0,
        "requests": [0],
        "starts": [0],
        "lengths": [4],
        "is_final": [False],
    }
    with pytest.raises(InvalidInputError, match=match):
        Dispatch(**(values | fields))


def test_a_dispatch_built_by_hand_holds_read_only_copies_and_equals_the_planned_one() -> None:
    schedule = plan_prefill([5, 3], PlannerConfig(max_num_batched_tokens=4, policy="packed"))
    requests = np.array([0, 1])
    built = Dispatch(
        index=1, requests=requests, starts=[4, 0], lengths=[1, 3], is_final=[True, True]
    )
    requests[0] = 1
    assert built == schedule.dispatch(1)
    assert built.requests.dtype == np.int32
    assert built.is_final.dtype == np.bool_
    for array in (built.requests, built.starts, built.lengths, built.is_final):
        assert not array.flags.writeable
        with pytest.raises(ValueError, match="WRITEABLE"):
            array.flags.writeable = True


def test_validate_rejects_a_schedule_built_directly_from_bad_arrays() -> None:
    good = plan_prefill([5, 3], PlannerConfig(max_num_batched_tokens=4))
    starts = good.starts.copy()
    starts[-1] += 1
    bad = Schedule(
        config=good.config,
        prompt_lengths=good.prompt_lengths,
        num_computed_tokens=good.num_computed_tokens,
        dispatch_offsets=good.dispatch_offsets,
        requests=good.requests,
        starts=starts,
        lengths=good.lengths,
        is_final=good.is_final,
    )
    good.validate()
    with pytest.raises(InvalidScheduleError):
        bad.validate()


# -- JSON round trip ---------------------------------------------------------------------------


@given(cases())
def test_json_round_trip_gives_an_equal_schedule_with_an_equal_hash(case: Case) -> None:
    schedule = case.plan()
    for text in (schedule.to_json(), schedule.to_json(indent=2), schedule.to_json().encode()):
        loaded = Schedule.from_json(text)
        assert loaded == schedule
        assert hash(loaded) == hash(schedule)
    from_dict = Schedule.from_dict(schedule.to_dict())
    assert from_dict == schedule
    assert hash(from_dict) == hash(schedule)


@given(cases())
def test_loaded_schedules_keep_dtypes_and_are_read_only(case: Case) -> None:
    schedule = case.plan()
    loaded = Schedule.from_json(schedule.to_json())
    for name in ("prompt_lengths", "num_computed_tokens", "dispatch_offsets", "requests"):
        assert getattr(loaded, name).dtype == getattr(schedule, name).dtype
        assert not getattr(loaded, name).flags.writeable


@given(cases())
def test_to_dict_holds_only_json_types_and_the_oracle_row_format(case: Case) -> None:
    schedule = case.plan()
    data = schedule.to_dict()
    assert json.loads(json.dumps(data)) == data
    assert data["format"] == "pypto-sched.schedule"
    assert data["version"] == FORMAT_VERSION
    # The format names the config's chunk_alignment "page_size", as it always has.
    config = case.config.to_dict()
    config["page_size"] = config.pop("chunk_alignment")
    assert data["config"] == config
    assert data["prompt_lengths"] == case.lengths
    assert data["num_computed_tokens"] == case.start_positions
    assert data["dispatches"] == [[list(row) for row in d] for d in rows_of(schedule)]


def test_num_computed_tokens_may_be_left_out_of_the_json() -> None:
    schedule = plan_prefill([5, 3], PlannerConfig(max_num_batched_tokens=4))
    data = schedule.to_dict()
    del data["num_computed_tokens"]
    assert Schedule.from_dict(data) == schedule
    data["summary"] = {"num_dispatches": 4}  # what pypto-sched plan adds
    assert Schedule.from_dict(data) == schedule


def test_from_dispatches_takes_a_schedules_own_arrays_and_refuses_a_config_dict() -> None:
    schedule = plan_prefill(
        [5, 3], PlannerConfig(max_num_batched_tokens=4), num_computed_tokens=[1, 0]
    )
    rows = [list(dispatch.rows) for dispatch in schedule.dispatches]
    again = Schedule.from_dispatches(
        schedule.config,
        schedule.prompt_lengths,
        rows,
        num_computed_tokens=schedule.num_computed_tokens,
    )
    assert again == schedule
    with pytest.raises(InvalidScheduleError, match=r"^'config' must be a PlannerConfig: dict"):
        Schedule.from_dispatches(schedule.config.to_dict(), [5, 3], rows)  # type: ignore[arg-type]


def test_dispatches_are_equal_by_index_and_rows() -> None:
    config = PlannerConfig(max_num_batched_tokens=4)
    schedule, other = plan_prefill([5, 3], config), plan_prefill([5, 3, 2], config)
    assert schedule.dispatch(0) == schedule.dispatch(0) == other.dispatch(0)
    assert hash(schedule.dispatch(0)) == hash(other.dispatch(0))
    assert schedule.dispatch(0) != schedule.dispatch(1)
    assert schedule.dispatch(0) != schedule.dispatch(0).rows


# -- tampered JSON -----------------------------------------------------------------------------

BASES = {
    # dispatches: [0,0,4,F] [1,0,4,F] [2,0,4,F] [0,4,4,T] [1,4,4,T] [2,4,1,T]
    "round_robin": plan_prefill([8, 8, 5], PlannerConfig(max_num_batched_tokens=4)),
    # dispatches: [0,0,3,F 1,0,3,F] [0,3,3,F 1,3,3,F] [0,6,3,F 1,6,3,F] [0,9,3,T 1,9,3,T]
    "packed": plan_prefill(
        [12, 12],
        PlannerConfig(max_num_batched_tokens=6, long_prefill_token_threshold=3, policy="packed"),
    ),
    # dispatches: [0,0,4,F] [0,4,4,T 1,0,4,F] [1,4,4,T]
    "partial": plan_prefill(
        [8, 8],
        PlannerConfig(
            max_num_batched_tokens=8,
            long_prefill_token_threshold=4,
            policy="packed",
            max_num_partial_prefills=1,
        ),
    ),
    # dispatches: [0,0,4,F] [0,4,2,T]
    "paged": plan_prefill([6], PlannerConfig(max_num_batched_tokens=4, chunk_alignment=2)),
}

Edit = Callable[[dict[str, Any]], object]


def _set(*path: str | int, value: object) -> Edit:
    def edit(data: dict[str, Any]) -> None:
        target: Any = data
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return edit


def _delete(*path: str | int) -> Edit:
    def edit(data: dict[str, Any]) -> None:
        target: Any = data
        for key in path[:-1]:
            target = target[key]
        del target[path[-1]]

    return edit


def _move_row(source: int, row: int, target: int) -> Edit:
    def edit(data: dict[str, Any]) -> None:
        data["dispatches"][target].append(data["dispatches"][source].pop(row))

    return edit


def _dispatches(*dispatches: list[list[object]]) -> Edit:
    return _set("dispatches", value=list(dispatches))


TAMPERED: list[tuple[str, str, Edit, str]] = [
    ("wrong format", "round_robin", _set("format", value="pypto-sched.plan"), "'format'"),
    ("no format", "round_robin", _delete("format"), "'format'"),
    ("newer version", "round_robin", _set("version", value=3), "'version'"),
    ("version as str", "round_robin", _set("version", value="2"), "'version'"),
    ("version as bool", "round_robin", _set("version", value=True), "'version'"),
    ("version as float", "round_robin", _set("version", value=2.0), "'version'"),
    ("no config", "round_robin", _delete("config"), "must hold the keys.*'config'"),
    (
        "no lengths",
        "round_robin",
        _delete("prompt_lengths"),
        "must hold the keys.*'prompt_lengths'",
    ),
    ("no dispatches", "round_robin", _delete("dispatches"), "must hold the keys.*'dispatches'"),
    (
        "unknown config key",
        "round_robin",
        _set("config", "max_batch_size", value=4),
        "unknown config keys.*'max_batch_size'",
    ),
    (
        "config budget 0",
        "round_robin",
        _set("config", "max_num_batched_tokens", value=0),
        "'max_num_batched_tokens' must be >= 1",
    ),
    (
        "config budget as bool",
        "round_robin",
        _set("config", "max_num_batched_tokens", value=True),
        "'max_num_batched_tokens' must be an int",
    ),
    ("config not an object", "round_robin", _set("config", value=[4]), "config"),
    ("unknown policy", "round_robin", _set("config", "policy", value="fifo"), "'policy'"),
    (
        "row moved to another dispatch breaks contiguity",
        "packed",
        _move_row(source=1, row=0, target=2),
        "contiguous",
    ),
    (
        "row moved to an earlier dispatch runs chunks out of order",
        "packed",
        _move_row(source=2, row=0, target=0),
        "contiguous",
    ),
    (
        "dispatch over the budget",
        "round_robin",
        _dispatches(
            [[0, 0, 4, False], [1, 0, 4, False]],
            [[2, 0, 4, False]],
            [[0, 4, 4, True]],
            [[1, 4, 4, True]],
            [[2, 4, 1, True]],
        ),
        "at most 4 tokens",
    ),
    (
        "chunk over the cap",
        "round_robin",
        _dispatches([[0, 0, 8, True]], [[1, 0, 4, False]], [[1, 4, 4, True]], [[2, 0, 5, True]]),
        "chunk cap",
    ),
    (
        "final flag on a non-final chunk",
        "round_robin",
        _set("dispatches", 0, 0, 3, value=True),
        "exactly one chunk per request",
    ),
    (
        "last chunk not final",
        "round_robin",
        _set("dispatches", 5, 0, 3, value=False),
        "exactly one chunk per request",
    ),
    (
        "empty dispatches",
        "round_robin",
        _dispatches(),
        r"^'dispatches' must hold at least one "
        r"dispatch \(every request has a token to prefill\): \[\] for 3 requests$",
    ),
    ("request as bool", "round_robin", _set("dispatches", 1, 0, 0, value=True), "request"),
    ("length as bool", "round_robin", _set("dispatches", 5, 0, 2, value=True), "length"),
    ("is_final as int", "round_robin", _set("dispatches", 5, 0, 3, value=1), "is_final"),
    ("is_final as 0", "round_robin", _set("dispatches", 0, 0, 3, value=0), "is_final"),
    ("prompt length as bool", "paged", _set("prompt_lengths", 0, value=True), "'prompt_lengths'"),
    (
        "computed as bool",
        "round_robin",
        _set("num_computed_tokens", 0, value=False),
        "'num_computed_tokens'",
    ),
    ("negative request", "round_robin", _set("dispatches", 0, 0, 0, value=-1), "request"),
    ("negative start", "round_robin", _set("dispatches", 0, 0, 1, value=-1), "start"),
    ("negative length", "round_robin", _set("dispatches", 0, 0, 2, value=-4), "length"),
    (
        "zero length",
        "round_robin",
        _set("dispatches", 0, 0, 2, value=0),
        r"'length' must be >= 1: 0",
    ),
    ("negative prompt length", "paged", _set("prompt_lengths", 0, value=-6), "'prompt_lengths'"),
    (
        "negative computed",
        "round_robin",
        _set("num_computed_tokens", 1, value=-1),
        "'num_computed_tokens'",
    ),
    ("float start", "round_robin", _set("dispatches", 3, 0, 1, value=4.0), "start"),
    ("start beyond int32", "round_robin", _set("dispatches", 3, 0, 1, value=2**31), "start"),
    ("length beyond uint64", "round_robin", _set("dispatches", 3, 0, 2, value=2**64), "length"),
    ("empty dispatch", "round_robin", _set("dispatches", 2, value=[]), "at least one row"),
    ("no dispatches at all", "round_robin", _set("dispatches", value=[]), "at least one"),
    (
        "request missing",
        "round_robin",
        _dispatches([[0, 0, 4, False]], [[1, 0, 4, False]], [[0, 4, 4, True]], [[1, 4, 4, True]]),
        "every request must have at least one chunk",
    ),
    (
        "request out of range",
        "round_robin",
        _set("dispatches", 5, 0, 0, value=3),
        r"row requests must be in \[0, 3\)",
    ),
    (
        "duplicate request in one dispatch",
        "packed",
        _set("dispatches", 0, value=[[0, 0, 1, False], [0, 1, 2, False], [1, 0, 3, False]]),
        "at most once per dispatch",
    ),
    (
        "rows out of request order",
        "packed",
        _set("dispatches", 0, value=[[1, 0, 3, False], [0, 0, 3, False]]),
        "a dispatch's rows must be in request order: first at row 0, which has request 1, "
        "then request 0 in dispatch 0",
    ),
    (
        "an unknown key (a typo)",
        "round_robin",
        _set("num_computed_token", value=[0, 0, 0]),
        r"only the keys of the format .*: \['num_computed_token'\] are not",
    ),
    (
        "unaligned non-final chunk",
        "paged",
        _dispatches([[0, 0, 3, False]], [[0, 3, 3, True]]),
        "multiple of chunk_alignment 2",
    ),
    (
        "partial limit broken",
        "partial",
        _dispatches(
            [[0, 0, 4, False], [1, 0, 4, False]],
            [[0, 4, 4, True], [1, 4, 4, True]],
        ),
        "part-way",
    ),
    (
        "chunk past the prompt",
        "paged",
        _dispatches([[0, 0, 4, False]], [[0, 4, 3, True]]),
        "within its prompt",
    ),
    (
        "computed at the prompt length",
        "paged",
        _set("num_computed_tokens", value=[6]),
        r"num_computed_tokens must be in \[0, prompt length\)",
    ),
    (
        "computed for too few requests",
        "round_robin",
        _set("num_computed_tokens", value=[0, 0]),
        "one entry per request",
    ),
    ("no requests", "paged", _set("prompt_lengths", value=[]), "at least one request"),
    ("short row", "round_robin", _set("dispatches", 0, 0, value=[0, 0, 4]), "row 0"),
    ("row as a string", "round_robin", _set("dispatches", 0, 0, value="0040"), "row 0"),
    ("dispatch as an object", "round_robin", _set("dispatches", 0, value={}), "dispatch 0"),
    ("dispatches as an object", "round_robin", _set("dispatches", value={}), "'dispatches'"),
    ("lengths as a string", "paged", _set("prompt_lengths", value="6"), "'prompt_lengths'"),
]


@pytest.mark.parametrize("base", sorted(BASES))
def test_each_base_schedule_loads_untampered(base: str) -> None:
    schedule = BASES[base]
    assert Schedule.from_json(schedule.to_json()) == schedule


@pytest.mark.parametrize(
    ("base", "edit", "message"),
    [pytest.param(base, edit, message, id=name) for name, base, edit, message in TAMPERED],
)
def test_tampered_json_is_rejected(base: str, edit: Edit, message: str) -> None:
    data = copy.deepcopy(BASES[base].to_dict())
    edit(data)
    text = json.dumps(data)
    with pytest.raises(InvalidScheduleError, match=message):
        Schedule.from_json(text)
    with pytest.raises(InvalidScheduleError, match=message):
        Schedule.from_dict(json.loads(text))


@pytest.mark.parametrize(
    "text",
    ["", "{", "[1, 2]", '"a schedule"', "null", b"\xff\xfe", None, 42, {"format": "x"}],
)
def test_text_that_is_not_a_schedule_object_is_rejected(text: Any) -> None:
    with pytest.raises(InvalidScheduleError):
        Schedule.from_json(text)


@pytest.mark.parametrize("data", [[], "schedule", None, 42])
def test_from_dict_rejects_anything_but_a_dict(data: object) -> None:
    with pytest.raises(InvalidScheduleError, match="JSON object"):
        Schedule.from_dict(data)


def test_errors_are_value_errors() -> None:
    data = BASES["paged"].to_dict()
    data["version"] = 0
    with pytest.raises(ValueError, match="'version'"):
        Schedule.from_dict(data)


def test_version_1_json_still_loads_with_its_old_knob_name() -> None:
    schedule = plan_prefill([5, 9], PlannerConfig(max_num_batched_tokens=8, max_num_seqs=2))
    data = schedule.to_dict()
    data["version"] = 1
    data["config"]["max_batch_size"] = data["config"].pop("max_num_seqs")
    assert Schedule.from_dict(data) == schedule
    # The version 2 name in a version 1 document is refused, alone or beside the old one.
    data["config"]["max_num_seqs"] = 2
    with pytest.raises(InvalidScheduleError, match="version 1 names the row limit"):
        Schedule.from_dict(data)
    del data["config"]["max_batch_size"]
    with pytest.raises(InvalidScheduleError, match="version 1 names the row limit"):
        Schedule.from_dict(data)


#: A schedule as this library wrote it before ``PlannerConfig.page_size`` was renamed
#: ``chunk_alignment`` (``plan_prefill([13, 6], ...).to_json()``): the file format kept the key.
WRITTEN_BEFORE_THE_RENAME = (
    '{"format": "pypto-sched.schedule", "version": 2, "config": {"max_num_batched_tokens": 8, '
    '"long_prefill_token_threshold": null, "max_num_seqs": 2, "page_size": 4, "policy": '
    '"packed", "max_num_partial_prefills": null}, "prompt_lengths": [13, 6], '
    '"num_computed_tokens": [0, 0], "dispatches": [[[0, 0, 8, false]], [[0, 8, 5, true]], '
    "[[1, 0, 6, true]]]}"
)


def test_a_file_written_before_the_rename_loads_and_is_written_back_unchanged() -> None:
    config = PlannerConfig(
        max_num_batched_tokens=8, max_num_seqs=2, chunk_alignment=4, policy="packed"
    )
    schedule = Schedule.from_json(WRITTEN_BEFORE_THE_RENAME)
    assert schedule == plan_prefill([13, 6], config)
    assert schedule.config.chunk_alignment == 4
    assert schedule.to_json() == WRITTEN_BEFORE_THE_RENAME
    # Version 1 names the same key the same way.
    data = json.loads(WRITTEN_BEFORE_THE_RENAME)
    data["version"] = 1
    data["config"]["max_batch_size"] = data["config"].pop("max_num_seqs")
    assert Schedule.from_dict(data) == schedule


@pytest.mark.parametrize("version", [1, 2])
def test_the_fields_own_name_in_a_file_is_refused_not_read_as_either(version: int) -> None:
    data = json.loads(WRITTEN_BEFORE_THE_RENAME)
    data["version"] = version
    if version == 1:
        data["config"]["max_batch_size"] = data["config"].pop("max_num_seqs")
    data["config"]["chunk_alignment"] = data["config"].pop("page_size")
    with pytest.raises(InvalidScheduleError, match="names the chunk alignment 'page_size'"):
        Schedule.from_dict(data)


# -- module structure ------------------------------------------------------------------------


def package_imports() -> dict[str, set[str]]:
    """Each module of ``pypto_sched`` and the package modules it imports, read from the
    source (imports under ``TYPE_CHECKING`` included). Imports of a module's own packages
    are left out (they run first anyway, and the root imports the public surface), and so is
    the root itself."""
    root = Path(pypto_sched.__file__).parent
    modules: dict[str, Path] = {}
    for path in root.rglob("*.py"):
        parts = path.with_suffix("").relative_to(root.parent).parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        modules[name] = path
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, *([node.module] if node.module else [])])
                names = {f"{base}.{alias.name}" for alias in node.names}
                found.update(names if names & modules.keys() else {base})
            elif isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
        # A module's own packages run before it whatever it imports: not edges.
        packages = {name.rsplit(".", k)[0] for k in range(name.count(".") + 1)}
        graph[name] = {m for m in found if m in modules and m not in packages}
    del graph["pypto_sched"]
    return graph


def test_the_package_modules_import_each_other_without_a_cycle() -> None:
    graph = package_imports()
    assert graph["pypto_sched.core._schedule"] >= {
        "pypto_sched.core._check",
        "pypto_sched.core._stats",
    }
    done: set[str] = set()

    def visit(module: str, path: tuple[str, ...]) -> None:
        assert module not in path, "import cycle: " + " -> ".join((*path, module))
        if module in done:
            return
        for target in sorted(graph[module]):
            visit(target, (*path, module))
        done.add(module)

    for module in sorted(graph):
        visit(module, ())


def test_the_checker_and_the_stats_do_not_import_the_schedule() -> None:
    graph = package_imports()
    for module in ("pypto_sched.core._check", "pypto_sched.core._stats"):
        assert "pypto_sched.core._schedule" not in graph[module]


def test_stats_from_arrays_are_the_schedule_figures(seed: Schedule) -> None:
    stats = ScheduleStats.from_arrays(
        tokens_per_dispatch=np.array([4, 8, 2]),
        finish_dispatch=np.array([2, 0]),
        max_num_batched_tokens=8,
        lower_bound=2,
    )
    assert stats == ScheduleStats(
        num_requests=2,
        num_tokens=14,
        num_dispatches=3,
        lower_bound=2,
        min_tokens_per_dispatch=2,
        mean_tokens_per_dispatch=14 / 3,
        max_tokens_per_dispatch=8,
        mean_utilization=14 / 24,
        min_utilization=0.25,
        mean_finish_dispatch=1.0,
        worst_finish_dispatch=2,
    )
    assert seed.stats.num_dispatches == 224
    assert seed.stats.num_tokens == 16 * 3338
    assert seed.stats.worst_finish_dispatch == 223


def test_a_broken_invariant_names_the_value_found() -> None:
    good = plan_prefill([6, 6], PlannerConfig(max_num_batched_tokens=4))
    lengths, starts = good.lengths.copy(), good.starts.copy()
    lengths[0], lengths[2], starts[2] = 5, 1, 5  # request 0 runs 5 + 1: tiled, over the cap
    bad = copy.copy(good)
    object.__setattr__(bad, "lengths", lengths)
    object.__setattr__(bad, "starts", starts)
    with pytest.raises(
        InvalidScheduleError, match=r"chunk cap \(4\) tokens: first at row 0, which has length 5"
    ):
        bad.validate()


def _read_only_values() -> list[Any]:
    schedule = plan_prefill([5, 3, 9], PlannerConfig(max_num_batched_tokens=4, policy="packed"))
    tables = pypto_sched.plan_pages([5, 3, 9], page_size=2, num_pages=16)
    return [
        schedule,
        schedule.dispatch(1),
        tables,
        pypto_sched.partition_requests([5, 3, 9], 2),
        pypto_sched.dispatch_arrays(schedule.dispatch(1), tables),
    ]


@pytest.mark.parametrize("value", _read_only_values(), ids=lambda value: type(value).__name__)
@pytest.mark.parametrize("how", ["pickle", "deepcopy"])
def test_arrays_stay_read_only_and_cannot_be_made_writeable_after_a_copy(
    value: Any, how: str
) -> None:
    # NumPy restores arrays writeable, and lets an array that owns its memory be made
    # writeable again: neither may open a value's arrays to writes.
    copied = pickle.loads(pickle.dumps(value)) if how == "pickle" else copy.deepcopy(value)
    fields = attrs.asdict(copied, recurse=False)
    for name, original in attrs.asdict(value, recurse=False).items():
        assert np.array_equal(fields[name], original), name
    arrays = [v for v in fields.values() if isinstance(v, np.ndarray)]
    assert arrays
    for array in arrays:
        assert not array.flags.writeable
        with pytest.raises(ValueError, match="WRITEABLE"):
            array.flags.writeable = True


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"tokens_per_dispatch": []}, r"^'tokens_per_dispatch' must hold at least one value"),
        ({"tokens_per_dispatch": [1.5]}, r"^'tokens_per_dispatch' must hold ints"),
        ({"tokens_per_dispatch": [0]}, r"^'tokens_per_dispatch' values must be in \[1, 8\]"),
        ({"tokens_per_dispatch": [9]}, r"^'tokens_per_dispatch' values must be in \[1, 8\]"),
        ({"finish_dispatch": []}, r"^'finish_dispatch' must hold at least one value"),
        ({"finish_dispatch": [1]}, r"^'finish_dispatch' values must be in \[0, 0\]"),
        ({"max_num_batched_tokens": 0}, r"^'max_num_batched_tokens' must be >= 1: 0$"),
        ({"lower_bound": True}, r"^'lower_bound' must be an int: True \(bool\)$"),
        ({"tokens_per_dispatch": np.ones((1, 1), dtype=np.int64)}, r"must be 1-D"),
    ],
)
def test_stats_from_arrays_checks_its_arguments(fields: dict[str, Any], match: str) -> None:
    values: dict[str, Any] = {
        "tokens_per_dispatch": [5],
        "finish_dispatch": [0],
        "max_num_batched_tokens": 8,
        "lower_bound": 1,
    }
    with pytest.raises(InvalidInputError, match=match):
        ScheduleStats.from_arrays(**(values | fields))


def test_stats_from_arrays_takes_lists_as_a_schedule_takes_arrays() -> None:
    schedule = plan_prefill([5, 3, 9], PlannerConfig(max_num_batched_tokens=4, policy="packed"))
    stats = ScheduleStats.from_arrays(
        tokens_per_dispatch=schedule.tokens_per_dispatch.tolist(),
        finish_dispatch=schedule.finish_dispatch.tolist(),
        max_num_batched_tokens=4,
        lower_bound=schedule.lower_bound,
    )
    assert stats == schedule.stats


def test_a_dispatch_built_by_hand_may_hold_its_rows_in_any_order() -> None:
    tables = pypto_sched.plan_pages([4, 6, 3], page_size=2, num_pages=8)
    final = [True, True]
    forward = Dispatch(index=0, requests=[0, 2], starts=[2, 0], lengths=[2, 3], is_final=final)
    backward = Dispatch(index=0, requests=[2, 0], starts=[0, 2], lengths=[3, 2], is_final=final)
    ahead, behind = (pypto_sched.dispatch_arrays(d, tables) for d in (forward, backward))
    assert ahead.slot_mapping.tolist() == [*behind.slot_mapping[3:], *behind.slot_mapping[:3]]


def test_dispatches_with_the_same_rows_at_different_indices_differ() -> None:
    """Equality and hashing cover the index: two one-row dispatches of equal prompts under
    round_robin must not collapse in a set."""
    schedule = plan_prefill([8, 8], PlannerConfig(max_num_batched_tokens=4))
    first, second = schedule.dispatch(0), schedule.dispatch(2)
    assert first.rows[0].length == second.rows[0].length
    moved = Dispatch(index=1, requests=first.requests, starts=first.starts,
                     lengths=first.lengths, is_final=first.is_final)  # fmt: skip
    assert moved != first
    assert len({first, moved}) == 2
    edge = Dispatch(index=0, requests=np.array([0], np.int32),
                    starts=np.array([2**31 - 2], np.int32), lengths=np.array([1], np.int32),
                    is_final=np.array([True]))  # fmt: skip
    assert int(edge.starts[0] + edge.lengths[0]) == 2**31 - 1  # a row may end at the limit


@pytest.mark.parametrize("value", [2**31, 2**63 + 5])
@pytest.mark.parametrize("field", ["prompt_lengths", "num_computed_tokens"])
def test_a_loaded_count_beyond_the_token_limit_is_named(field: str, value: int) -> None:
    config = PlannerConfig(max_num_batched_tokens=8, policy="packed")
    lengths, computed = ([value], None) if field == "prompt_lengths" else ([1], [value])
    with pytest.raises(InvalidScheduleError, match=rf"^'{field}' must hold ints in \["):
        Schedule.from_dispatches(config, lengths, [[[0, 0, 1, True]]], num_computed_tokens=computed)


# -- each invariant at its edge (from a mutation review: each case fails a checker that drops
# or loosens the rule) ------------------------------------------------------------------------

# (config, prompt lengths, computed tokens, dispatches, the rule named)
BROKEN_INVARIANTS = {
    "a first chunk re-running the cached prefix": (
        PlannerConfig(max_num_batched_tokens=8), [4], [2], [[[0, 0, 4, True]]],
        "first chunk must start at its computed-token count",
    ),
    "a first chunk skipping the first tokens": (
        PlannerConfig(max_num_batched_tokens=8), [4], None, [[[0, 2, 2, True]]],
        "first chunk must start at its computed-token count",
    ),
    "a last chunk short of the prompt": (
        PlannerConfig(max_num_batched_tokens=8), [4], None, [[[0, 0, 3, True]]],
        "last chunk must end at its prompt length",
    ),
    "a gap between two chunks": (
        PlannerConfig(max_num_batched_tokens=4), [8], None,
        [[[0, 0, 2, False]], [[0, 4, 4, True]]],
        "chunks must be contiguous",
    ),
    "one token over the budget": (
        PlannerConfig(max_num_batched_tokens=4), [4, 1], None,
        [[[0, 0, 4, True], [1, 0, 1, True]]],
        "at most 4 tokens",
    ),
    "one row over max_num_seqs": (
        PlannerConfig(max_num_batched_tokens=8, max_num_seqs=1), [1, 1], None,
        [[[0, 0, 1, True], [1, 0, 1, True]]],
        "at most 1 rows",
    ),
    "round_robin beyond its threshold in one dispatch": (
        PlannerConfig(max_num_batched_tokens=8, long_prefill_token_threshold=4), [2, 3], None,
        [[[0, 0, 2, True], [1, 0, 3, True]]],
        "at most 4 tokens",
    ),
    "packed's whole budget while two requests are unfinished": (
        PlannerConfig(max_num_batched_tokens=8, long_prefill_token_threshold=2, policy="packed"),
        [4, 4], None, [[[0, 0, 4, True], [1, 0, 4, True]]],
        "chunk cap",
    ),
}  # fmt: skip


@pytest.mark.parametrize(
    ("config", "lengths", "computed", "dispatches", "rule"),
    [pytest.param(*case, id=name) for name, case in BROKEN_INVARIANTS.items()],
)
def test_each_invariant_is_checked_at_its_edge(
    config: PlannerConfig,
    lengths: list[int],
    computed: list[int] | None,
    dispatches: list[list[list[object]]],
    rule: str,
) -> None:
    with pytest.raises(InvalidScheduleError, match=rule):
        Schedule.from_dispatches(config, lengths, dispatches, num_computed_tokens=computed)


def test_a_request_left_alone_under_packed_may_run_the_whole_budget() -> None:
    config = PlannerConfig(
        max_num_batched_tokens=8, long_prefill_token_threshold=2, policy="packed"
    )
    Schedule.from_dispatches(config, [8], [[[0, 0, 8, True]]]).validate()


def test_validate_names_offsets_that_end_short_of_the_rows() -> None:
    schedule = Schedule(
        config=PlannerConfig(max_num_batched_tokens=8),
        prompt_lengths=np.array([1, 1, 1]),
        num_computed_tokens=np.zeros(3, np.int64),
        dispatch_offsets=np.array([0, 2], np.int64),
        requests=np.arange(3, dtype=np.int32),
        starts=np.zeros(3, np.int32),
        lengths=np.ones(3, np.int32),
        is_final=np.ones(3, bool),
    )
    with pytest.raises(InvalidScheduleError, match="dispatch offsets must run from 0"):
        schedule.validate()


def test_a_chunk_or_dispatch_may_end_at_the_token_limit_and_not_past_it() -> None:
    limit = 2**31 - 1
    Chunk(request=0, start=limit - 1, length=1, is_final=True)
    with pytest.raises(InvalidInputError, match="'start' \\+ 'length' must be <="):
        Chunk(request=0, start=limit, length=1, is_final=True)
    Dispatch(index=0, requests=[0], starts=[limit - 1], lengths=[1], is_final=[True])
    with pytest.raises(InvalidInputError, match="'starts' \\+ 'lengths' must be <="):
        Dispatch(index=0, requests=[0], starts=[limit], lengths=[1], is_final=[True])


def test_schedules_differing_only_in_their_config_differ() -> None:
    rows = [[[0, 0, 4, True]]]
    one = Schedule.from_dispatches(PlannerConfig(max_num_batched_tokens=8), [4], rows)
    other = Schedule.from_dispatches(PlannerConfig(max_num_batched_tokens=9), [4], rows)
    assert one != other
    assert len({one, other}) == 2


@pytest.mark.parametrize("request_id", [2**31, 2**32])
def test_a_json_row_naming_a_request_beyond_int32_is_refused_not_wrapped(request_id: int) -> None:
    # 2**32 wraps to request 0 in an int32 array.
    data = plan_prefill([4], PlannerConfig(max_num_batched_tokens=8)).to_dict()
    data["dispatches"][0][0][0] = request_id
    with pytest.raises(InvalidScheduleError, match="dispatch 0 row 0"):
        Schedule.from_dict(data)
