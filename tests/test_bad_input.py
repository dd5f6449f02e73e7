"""Bad input raises the library's own error, naming the parameter, at every public entry point.

``pytest.raises`` with the library's error class also proves nothing else escaped: a
``TypeError`` or ``OverflowError`` from deep inside NumPy would fail these tests.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from pypto_sched import (
    POLICIES,
    BlockTables,
    CacheTooSmallError,
    GenerationState,
    InvalidConfigError,
    InvalidInputError,
    InvalidScheduleError,
    PagePool,
    PlannerConfig,
    PyptoSchedError,
    SamplingParams,
    dispatch_arrays,
    execute_schedule,
    generate,
    load_backend,
    plan_generation_step,
    plan_pages,
    plan_prefill,
    plan_warmup,
    sample_token,
)
from pypto_sched.core import _offline

CONFIG = PlannerConfig(max_num_batched_tokens=64)


def _cases(values: dict[str, Any]) -> list[Any]:
    return [pytest.param(value, id=name) for name, value in values.items()]


# Not a count >= 1 (for counts >= 0 the zero case is left out).
NOT_POSITIVE_COUNTS = {
    "zero": 0,
    "negative": -1,
    "True": True,
    "False": False,
    "numpy bool": np.bool_(True),
    "float": 8.0,
    "numpy float": np.float64(8),
    "nan": math.nan,
    "inf": math.inf,
    "str": "8",
    "list": [8],
    "dict": {"value": 8},
    "set": {8},
    "above int32": 2**31,
    "above uint64": 2**64,
    "huge negative": -(2**70),
}
NOT_COUNTS = {k: v for k, v in NOT_POSITIVE_COUNTS.items() if k != "zero"}

# Not a non-empty 1-D sequence of lengths >= 1 (or an integer array of them).
BAD_LENGTHS = {
    "empty list": [],
    "empty array": np.array([], dtype=np.int64),
    "zero": [4, 0],
    "negative": [4, -1],
    "bool": [4, True],
    "float": [4, 2.0],
    "nan": [4, math.nan],
    "None item": [4, None],
    "nested list": [[4, 4]],
    "above int32": [4, 2**31],
    "above int64": [4, 2**63],
    "above uint64": [4, 2**64],
    "huge numpy int": [np.int64(2**40)],
    "str": "44",
    "bytes": b"44",
    "dict": {0: 4, 1: 4},
    "set": {4, 5},
    "None": None,
    "int": 4,
    "generator": (n for n in [4, 4]),
    "2-D array": np.full((2, 2), 4),
    "0-D array": np.array(4),
    "float array": np.array([4.0, 4.0]),
    "bool array": np.array([True, True]),
    "str array": np.array(["4"]),
    "object array": np.array([4, 4], dtype=object),
    "zero in array": np.array([4, 0]),
    "negative in array": np.array([4, -4], dtype=np.int8),
    "above int32 in int64 array": np.array([4, 2**31]),
    "above int64 in uint64 array": np.array([4, 2**63], dtype=np.uint64),
}


@pytest.mark.parametrize("lengths", _cases(BAD_LENGTHS))
def test_plan_prefill_rejects_bad_prompt_lengths(lengths: Any) -> None:
    with pytest.raises(InvalidInputError, match="'prompt_lengths'"):
        plan_prefill(lengths, CONFIG)


@pytest.mark.parametrize(
    "lengths", [bytearray(b"ab"), memoryview(b"ab")], ids=["bytearray", "memoryview"]
)
def test_plan_prefill_rejects_bytes_like_prompt_lengths(lengths: Any) -> None:
    with pytest.raises(InvalidInputError, match="'prompt_lengths'"):
        plan_prefill(lengths, CONFIG)


BAD_COMPUTED = {
    "negative": [-1, 0],
    "bool": [True, 0],
    "float": [1.0, 0],
    "nan": [math.nan, 0],
    "above uint64": [2**64, 0],
    "str": "00",
    "dict": {0: 0, 1: 0},
    "set": {0, 1},
    "int": 0,
    "2-D array": np.zeros((2, 1), dtype=np.int64),
    "float array": np.zeros(2),
    "bool array": np.zeros(2, dtype=np.bool_),
    "too few": [0],
    "too many": [0, 0, 0],
    "empty": [],
    "equal to the length": [0, 4],
    "beyond the length": [5, 0],
    "equal to the length in an array": np.array([4, 0]),
}


@pytest.mark.parametrize("computed", _cases(BAD_COMPUTED))
def test_plan_prefill_rejects_bad_num_computed_tokens(computed: Any) -> None:
    with pytest.raises(InvalidInputError, match="'num_computed_tokens'"):
        plan_prefill([4, 4], CONFIG, num_computed_tokens=computed)


def test_computed_tokens_must_leave_one_token_naming_the_request() -> None:
    with pytest.raises(InvalidInputError, match="item 1 is 7 for length 7"):
        plan_prefill([4, 7], CONFIG, num_computed_tokens=[3, 7])


@pytest.mark.parametrize(
    "config", [None, {"max_num_batched_tokens": 64}, 64, "round_robin"], ids=repr
)
def test_plan_prefill_rejects_a_config_that_is_not_a_planner_config(config: Any) -> None:
    with pytest.raises(InvalidInputError, match="'config' must be a PlannerConfig"):
        plan_prefill([4], config)


# -- PlannerConfig -----------------------------------------------------------------------------

COUNT_FIELDS = [
    "max_num_batched_tokens",
    "long_prefill_token_threshold",
    "max_num_seqs",
    "chunk_alignment",
    "max_num_partial_prefills",
]


def _config(**changes: Any) -> PlannerConfig:
    fields: dict[str, Any] = {
        "max_num_batched_tokens": 64,
        "long_prefill_token_threshold": 32,
        "chunk_alignment": 16,
        "policy": "packed",
    }
    fields.update(changes)
    return PlannerConfig(**fields)


@pytest.mark.parametrize("field", COUNT_FIELDS)
@pytest.mark.parametrize("value", _cases(NOT_POSITIVE_COUNTS))
def test_config_rejects_a_count_field_that_is_not_an_int_of_at_least_1(
    field: str, value: Any
) -> None:
    with pytest.raises(InvalidConfigError, match=f"'{field}'"):
        _config(**{field: value})


def test_config_requires_max_num_batched_tokens() -> None:
    with pytest.raises(TypeError):
        PlannerConfig()  # type: ignore[call-arg]
    nothing: Any = None
    with pytest.raises(InvalidConfigError, match="'max_num_batched_tokens' must be an int"):
        PlannerConfig(max_num_batched_tokens=nothing)


def test_config_message_reads_name_rule_value() -> None:
    with pytest.raises(InvalidConfigError) as info:
        PlannerConfig(max_num_batched_tokens=0)
    assert str(info.value) == "'max_num_batched_tokens' must be >= 1: 0"


@pytest.mark.parametrize("policy", ["fifo", "Packed", "", None, 0, ["packed"]], ids=repr)
def test_config_rejects_an_unknown_policy(policy: Any) -> None:
    with pytest.raises(InvalidConfigError, match="'policy' must be one of"):
        PlannerConfig(max_num_batched_tokens=64, policy=policy)


@pytest.mark.parametrize(
    ("argument", "value"),
    [
        ("max_num_batched_tokens", 0),
        ("max_num_batched_tokens", True),
        ("max_num_batched_tokens", 2**64),
        ("long_prefill_token_threshold", -1),
        ("long_prefill_token_threshold", None),
        ("long_prefill_token_threshold", 1.5),
        ("long_prefill_token_threshold", True),
        ("max_num_seqs", 0),
        ("max_num_seqs", 4.0),
        ("chunk_alignment", 0),
        ("policy", "fifo"),
        ("max_num_partial_prefills", -2),
    ],
)
def test_from_engine_args_names_the_engine_argument(argument: str, value: Any) -> None:
    arguments: dict[str, Any] = {"max_num_batched_tokens": 64, "policy": "packed"}
    arguments[argument] = value
    with pytest.raises(InvalidConfigError, match=f"'{argument}'"):
        PlannerConfig.from_engine_args(**arguments)


# -- plan_pages --------------------------------------------------------------------------------


@pytest.mark.parametrize("lengths", _cases(BAD_LENGTHS))
def test_plan_pages_rejects_bad_prompt_lengths(lengths: Any) -> None:
    with pytest.raises(InvalidInputError, match="'prompt_lengths'"):
        plan_pages(lengths, page_size=16, num_pages=100)


@pytest.mark.parametrize("argument", ["page_size", "num_pages"])
@pytest.mark.parametrize("value", _cases(NOT_POSITIVE_COUNTS))
def test_plan_pages_rejects_bad_page_counts(argument: str, value: Any) -> None:
    arguments: dict[str, Any] = {"page_size": 16, "num_pages": 100}
    arguments[argument] = value
    with pytest.raises(InvalidInputError, match=f"'{argument}'"):
        plan_pages([4, 4], **arguments)


@pytest.mark.parametrize("value", _cases(NOT_COUNTS))
def test_plan_pages_rejects_bad_max_new_tokens(value: Any) -> None:
    with pytest.raises(InvalidInputError, match="'max_new_tokens'"):
        plan_pages([4, 4], page_size=16, num_pages=100, max_new_tokens=value)


def test_plan_pages_rejects_a_prompt_plus_new_tokens_beyond_int32() -> None:
    with pytest.raises(InvalidInputError, match="'max_new_tokens'"):
        plan_pages([2**31 - 1], page_size=2**20, num_pages=2**20, max_new_tokens=1)


def test_plan_pages_raises_cache_too_small_naming_num_pages() -> None:
    with pytest.raises(CacheTooSmallError, match="'num_pages' must be >= 2"):
        plan_pages([4, 4], page_size=16, num_pages=1)


@pytest.mark.parametrize("argument", ["page_size", "num_pages"])
@pytest.mark.parametrize("value", _cases(NOT_POSITIVE_COUNTS))
def test_block_tables_from_lists_rejects_bad_page_counts(argument: str, value: Any) -> None:
    arguments: dict[str, Any] = {"page_size": 16, "num_pages": 100}
    arguments[argument] = value
    with pytest.raises(InvalidInputError, match=f"'{argument}'"):
        BlockTables.from_lists([[0], [1]], **arguments)


# -- plan_warmup -------------------------------------------------------------------------------


@pytest.mark.parametrize("argument", ["batch_size", "max_seq_len"])
@pytest.mark.parametrize("value", _cases(NOT_POSITIVE_COUNTS))
def test_plan_warmup_rejects_bad_sizes(argument: str, value: Any) -> None:
    arguments: dict[str, Any] = {"batch_size": 4, "max_seq_len": 4096}
    arguments[argument] = value
    with pytest.raises(InvalidInputError, match=f"'{argument}'"):
        plan_warmup(CONFIG, **arguments)


@pytest.mark.parametrize("config", [None, {"max_num_batched_tokens": 64}, 64], ids=repr)
def test_plan_warmup_rejects_a_config_that_is_not_a_planner_config(config: Any) -> None:
    with pytest.raises(InvalidInputError, match="'config' must be a PlannerConfig"):
        plan_warmup(config, batch_size=4, max_seq_len=4096)


# -- dispatch_arrays ---------------------------------------------------------------------------

SCHEDULE = plan_prefill([4, 4], PlannerConfig(max_num_batched_tokens=4))
TABLES = plan_pages([4, 4], page_size=4, num_pages=2)


@pytest.mark.parametrize(
    "dispatch",
    [None, 0, SCHEDULE, SCHEDULE.dispatch(0).rows[0], SCHEDULE.dispatch(0).rows, [[0, 0, 4]]],
    ids=["None", "int", "Schedule", "Chunk", "tuple of Chunks", "list"],
)
def test_dispatch_arrays_rejects_what_is_not_a_dispatch(dispatch: Any) -> None:
    with pytest.raises(InvalidInputError, match="'dispatch' must be a Dispatch"):
        dispatch_arrays(dispatch, TABLES)


@pytest.mark.parametrize(
    "tables",
    [None, [[0], [1]], {0: [0]}, TABLES.padded(), SCHEDULE],
    ids=["None", "lists", "dict", "padded array", "Schedule"],
)
def test_dispatch_arrays_rejects_what_is_not_block_tables(tables: Any) -> None:
    with pytest.raises(InvalidInputError, match="'block_tables' must be BlockTables"):
        dispatch_arrays(SCHEDULE.dispatch(0), tables)


# -- the hierarchy -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "error",
    [InvalidConfigError, InvalidInputError, InvalidScheduleError, CacheTooSmallError],
)
def test_every_input_error_is_a_pypto_sched_error_and_a_value_error(
    error: type[Exception],
) -> None:
    assert issubclass(error, PyptoSchedError)
    assert issubclass(error, ValueError)


def test_cache_too_small_is_an_invalid_input() -> None:
    assert issubclass(CacheTooSmallError, InvalidInputError)


@pytest.mark.parametrize("dtype", [np.int64, np.uint32, np.uint64])
def test_an_array_value_out_of_range_is_named_by_its_item_whatever_its_dtype(dtype: Any) -> None:
    big = np.iinfo(dtype).max
    lengths = np.array([5, big, 3], dtype=dtype)
    with pytest.raises(InvalidInputError, match=rf"^'prompt_lengths' values must be <= "
                       rf"2147483647: item 1 is {big}$"):  # fmt: skip
        plan_prefill(lengths, CONFIG)


# -- found by fuzzing the public surface with what careless callers pass -----------------------

BACKEND = load_backend("reference", seed=0)


@pytest.mark.parametrize(
    ("prompt", "fragment"),
    [
        ([True, 2, 3], r"item 0 is True \(bool\)"),  # NumPy would read it as token 1
        ([1, [2], 3], r"item 1 is \[2\] \(list\)"),  # NumPy would fail on the ragged list
        ([1, 2.0, 3], r"item 1 is 2.0 \(float\)"),
    ],
    ids=["bool", "nested", "float"],
)
def test_a_token_id_that_is_not_an_int_is_named_with_its_request(
    prompt: list[Any], fragment: str
) -> None:
    config = PlannerConfig(max_num_batched_tokens=8)
    with pytest.raises(InvalidInputError, match=rf"^'prompts\[1\]' must hold ints: {fragment}"):
        generate(BACKEND, [[1, 2], prompt], config=config, max_new_tokens=1)
    with pytest.raises(InvalidInputError, match=rf"^'token_ids\[1\]' must hold ints: {fragment}"):
        execute_schedule(plan_prefill([2, 3], config), BACKEND, [[1, 2], prompt])


@pytest.mark.parametrize("flag", ["return_logits", "return_greedy"])
@pytest.mark.parametrize("value", ["no", 1, None], ids=repr)
def test_execute_schedules_flags_are_bools_not_truth_values(flag: str, value: Any) -> None:
    schedule = plan_prefill([3], PlannerConfig(max_num_batched_tokens=8))
    with pytest.raises(InvalidInputError, match=rf"^'{flag}' must be a bool: "):
        execute_schedule(schedule, BACKEND, [[1, 2, 3]], **{flag: value})


def test_non_finite_input_embeddings_are_the_callers_error_not_the_backends() -> None:
    schedule = plan_prefill([3, 2], PlannerConfig(max_num_batched_tokens=8))
    embeddings = [BACKEND.embed(np.array(ids)) for ids in ([1, 2, 3], [4, 5])]
    embeddings[1] = embeddings[1].copy()
    embeddings[1][1, 3] = np.inf
    with pytest.raises(
        InvalidInputError, match=r"^'input_embeddings\[1\]' must be finite: position 1 holds inf"
    ):
        execute_schedule(schedule, BACKEND, [[1, 2, 3], [4, 5]], input_embeddings=embeddings)


@pytest.mark.parametrize("value", [2**63, np.uint64(2**64 - 1)], ids=repr)
def test_a_huge_max_new_tokens_for_every_request_is_named(value: Any) -> None:
    with pytest.raises(InvalidInputError, match=r"^'max_new_tokens' must be <= 2147483647: "):
        GenerationState.from_prompt_lengths([5], max_new_tokens=value, num_pages=9, page_size=4)


@pytest.mark.parametrize(
    "query",
    [
        lambda pool: pool.pages(["a"]),
        lambda pool: pool.capacity(["a"]),
        lambda pool: pool.tokens_holdable(["a"]),
        lambda pool: pool.missing_pages(["a"], 3),
        lambda pool: pool.can_hold(["a"], 3),
        lambda pool: pool.slot(["a"], 0),
        lambda pool: pool.block_tables([["a"]]),
    ],
    ids=["pages", "capacity", "tokens_holdable", "missing_pages", "can_hold", "slot",
         "block_tables"],
)  # fmt: skip
def test_a_page_pool_query_names_an_unhashable_request_id(query: Any) -> None:
    pool = PagePool[Any](num_pages=8, page_size=4).hold("a", 5)
    with pytest.raises(InvalidInputError, match=r"^'request_id' must be hashable: \['a'\]"):
        query(pool)


@pytest.mark.parametrize("value", [3.7, True, -5, math.nan, None, np.uint64(2**64 - 1)], ids=repr)
def test_pages_for_takes_a_token_count(value: Any) -> None:
    with pytest.raises(InvalidInputError, match=r"^'num_tokens' must be "):
        PagePool(num_pages=8, page_size=4).pages_for(value)


def test_dispatch_arrays_checks_a_steps_rows_and_pool() -> None:
    state = GenerationState.from_prompt_lengths([5, 3], max_new_tokens=2, num_pages=4, page_size=4)
    step = plan_generation_step(state, PlannerConfig(max_num_batched_tokens=8))
    bad_rows = {"list": [0, 1], "tuples": {0: (0, 5, True)}, "None": None}
    for rows in bad_rows.values():
        with pytest.raises(InvalidInputError, match=r"^'rows' must (be a mapping|map each)"):
            dispatch_arrays(rows, step.pool)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match=r"^'pool' must be a PagePool: NoneType"):
        dispatch_arrays(step.rows, None)  # type: ignore[call-overload]
    with pytest.raises(InvalidInputError, match=r"^'pool' must be a PagePool: str"):
        dispatch_arrays(step, "pool")  # type: ignore[call-overload]
    checked, planned = dispatch_arrays(step.rows, step.pool), step.arrays()
    assert np.array_equal(checked.slot_mapping, planned.slot_mapping)


@pytest.mark.parametrize("policy", [np.array(["packed"]), ["packed"], b"packed"], ids=repr)
def test_a_policy_is_a_name_not_something_holding_one(policy: Any) -> None:
    with pytest.raises(InvalidConfigError, match=r"^'policy' must be one of "):
        PlannerConfig(max_num_batched_tokens=8, policy=policy)


def test_a_numpy_string_policy_is_kept_as_a_str() -> None:
    config = PlannerConfig(max_num_batched_tokens=8, policy=np.str_("packed"))  # type: ignore[arg-type]
    assert type(config.policy) is str
    assert config == PlannerConfig(max_num_batched_tokens=8, policy="packed")


@pytest.mark.parametrize(
    ("name", "value"),
    [("request_index", None), ("token_index", "x"), ("token_index", -1), ("request_index", True)],
)
def test_sample_token_checks_its_indices_under_greedy_decoding_too(name: str, value: Any) -> None:
    indices = {"request_index": 0, "token_index": 0, name: value}
    for params in (SamplingParams(), SamplingParams(temperature=1.0)):
        with pytest.raises(InvalidInputError, match=rf"^'{name}' must be"):
            sample_token(np.array([0.5, 1.5]), params, **indices)


@pytest.mark.parametrize("policy", POLICIES)
def test_a_schedule_beyond_the_chunk_limit_is_refused_before_it_is_built(policy: Any) -> None:
    # 2**31 - 1 one-token chunks: about 30 GB of arrays. The error comes at once, not from
    # the memory allocator (or the operating system's out-of-memory killer) part-way.
    config = PlannerConfig(max_num_batched_tokens=1, policy=policy)
    with pytest.raises(InvalidInputError, match=r"at least 2,147,483,647 chunks.*268,435,456"):
        plan_prefill([2**31 - 1], config)


@pytest.mark.parametrize("policy", POLICIES)
def test_the_chunk_limit_admits_a_schedule_of_exactly_the_limit(
    policy: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Budget 4 and threshold 2: chunks of at most 2 tokens, 5 + 2 + 3 = 10, under round_robin;
    # under packed the request left alone at the end may run all 4 tokens, which saves the
    # 9-token request 5 - 3 = 2 chunks: at least 8.
    config = PlannerConfig(max_num_batched_tokens=4, long_prefill_token_threshold=2, policy=policy)
    lengths = [9, 3, 5]
    fewest = _offline.fewest_chunks(np.array(lengths), config)
    assert fewest == {"packed": 8, "round_robin": 10}[policy]
    assert plan_prefill(lengths, config).num_chunks >= fewest
    monkeypatch.setattr(_offline, "MAX_CHUNKS", fewest)
    plan_prefill(lengths, config)
    monkeypatch.setattr(_offline, "MAX_CHUNKS", fewest - 1)
    with pytest.raises(InvalidInputError, match=f"at least {fewest} chunks"):
        plan_prefill(lengths, config)
