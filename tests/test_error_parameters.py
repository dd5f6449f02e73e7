"""Errors carry the parameter they are about, so that no caller reads a message to find it.

An error about a parameter as a whole reads ``'<parameter>' <rule>`` and says both in
``error.parameter`` and ``error.rule``; one about an item of a parameter
(``'max_new_tokens[2]'``) names the parameter and keeps no rule; the command line maps
``parameter`` to its flag. Also here: the one config check (``check_config``), and the one
``prepare_generation`` step that ``generate`` and the Ray replicas share.
"""

from __future__ import annotations

import inspect
import pickle
from collections.abc import Callable
from typing import Any

import attrs
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from pypto_sched import (
    POLICIES,
    GenerationState,
    InvalidConfigError,
    InvalidInputError,
    InvalidScheduleError,
    PlannerConfig,
    PrefillState,
    PyptoSchedError,
    SamplingParams,
    Schedule,
    generate,
    load_backend,
    plan_generation_step,
    plan_prefill,
    plan_step,
    plan_warmup,
)
from pypto_sched.cli._errors import UsageError, flags_named
from pypto_sched.core._config import check_config
from pypto_sched.core._validate import check_int
from pypto_sched.runtime._generate import prepare_generation, run_generation

BACKEND = load_backend("reference", seed=0)
CONFIG = PlannerConfig(max_num_batched_tokens=32, policy="packed")
PROMPTS = [[1, 2, 3, 4, 5], [7, 7, 7], [9, 8, 7, 6, 5, 4, 3]]


def _about(error: PyptoSchedError, parameter: str) -> None:
    """``error`` is about ``parameter`` as a whole: its message is the name and the rule."""
    assert error.parameter == parameter
    assert error.rule is not None
    assert str(error) == f"{parameter!r} {error.rule}"


# -- the errors themselves ---------------------------------------------------------------------


def test_an_error_about_an_item_names_its_parameter_and_keeps_no_rule() -> None:
    with pytest.raises(InvalidInputError) as info:
        check_int("max_new_tokens[2]", 0, min_value=1)
    assert str(info.value) == "'max_new_tokens[2]' must be >= 1: 0"
    assert info.value.parameter == "max_new_tokens"
    assert info.value.rule is None


def test_an_error_about_no_parameter_says_none() -> None:
    error = InvalidInputError("the batch is empty")
    assert error.parameter is None
    assert error.rule is None


def test_the_parameter_and_the_rule_survive_pickling() -> None:
    # (Errors come back from Ray actors pickled.)
    error = InvalidConfigError.about("num_pages", "must be >= 1: 0")
    again = pickle.loads(pickle.dumps(error))
    assert (type(again), str(again)) == (InvalidConfigError, str(error))
    assert (again.parameter, again.rule) == ("num_pages", "must be >= 1: 0")


# -- PlannerConfig: every field ------------------------------------------------------------


FIELDS = [field.name for field in attrs.fields(PlannerConfig)]
NOT_A_COUNT = st.one_of(
    st.integers(max_value=0), st.floats(), st.text(max_size=3), st.booleans(), st.just([1])
)


@given(field=st.sampled_from(FIELDS), value=NOT_A_COUNT)
def test_a_bad_config_field_is_the_errors_parameter(field: str, value: Any) -> None:
    assume(not (field == "policy" and value in POLICIES))
    fields: dict[str, Any] = {"max_num_batched_tokens": 64, "policy": "packed", field: value}
    with pytest.raises(InvalidConfigError) as info:
        PlannerConfig(**fields)
    _about(info.value, field)


@pytest.mark.parametrize(
    ("fields", "parameter"),
    [
        ({"max_num_partial_prefills": 2}, "max_num_partial_prefills"),  # round_robin's
        ({"chunk_alignment": 128}, "chunk_alignment"),  # above the chunk cap
        ({"long_prefill_token_threshold": 8, "chunk_alignment": 16}, "chunk_alignment"),
    ],
)
def test_a_rule_between_config_fields_names_the_field_it_refuses(
    fields: dict[str, Any], parameter: str
) -> None:
    with pytest.raises(InvalidConfigError) as info:
        PlannerConfig(max_num_batched_tokens=64, **fields)
    _about(info.value, parameter)


@pytest.mark.parametrize("field", ["long_prefill_token_threshold", "max_num_seqs"])
def test_from_engine_args_names_the_engine_argument_in_the_attribute(field: str) -> None:
    arguments: dict[str, Any] = {field: -1}
    with pytest.raises(InvalidConfigError) as info:
        PlannerConfig.from_engine_args(max_num_batched_tokens=64, **arguments)
    _about(info.value, field)


# -- the one config check ------------------------------------------------------------------


ENTRY_POINTS: dict[str, Callable[[Any], object]] = {
    "plan_prefill": lambda config: plan_prefill([4], config),
    "plan_warmup": lambda config: plan_warmup(config, batch_size=1, max_seq_len=8),
    "plan_step": lambda config: plan_step(PrefillState.from_prompt_lengths([4]), config),
    "plan_generation_step": lambda config: plan_generation_step(
        GenerationState.from_prompt_lengths([4], max_new_tokens=1, num_pages=4, page_size=4),
        config,
    ),
    "generate": lambda config: generate(BACKEND, PROMPTS, config=config),
}


@pytest.mark.parametrize("entry", ENTRY_POINTS)
@pytest.mark.parametrize("config", [None, 64, {"max_num_batched_tokens": 64}], ids=repr)
def test_every_entry_point_checks_its_config_with_one_message(entry: str, config: Any) -> None:
    with pytest.raises(InvalidInputError) as info:
        ENTRY_POINTS[entry](config)
    _about(info.value, "config")
    with pytest.raises(InvalidInputError) as alone:
        check_config(config)
    assert str(info.value) == str(alone.value)


def test_a_dict_given_as_a_config_is_pointed_to_from_dict() -> None:
    with pytest.raises(InvalidInputError, match=r"dict \(load a dict with PlannerConfig"):
        check_config({"max_num_batched_tokens": 64})
    with pytest.raises(InvalidScheduleError, match=r"^'config' must be a PlannerConfig: int$"):
        check_config(64, error=InvalidScheduleError)
    with pytest.raises(InvalidScheduleError) as info:
        Schedule.from_dispatches({}, [4], [[[0, 0, 4, True]]])  # type: ignore[arg-type]
    _about(info.value, "config")


def test_check_config_returns_the_config_and_names_the_argument() -> None:
    assert check_config(CONFIG) is CONFIG
    with pytest.raises(InvalidInputError) as info:
        check_config("packed", name="configs")
    _about(info.value, "configs")


# -- generate: every parameter -------------------------------------------------------------


#: A bad value for each of generate's parameters (with the others good).
BAD_ARGUMENTS: dict[str, Any] = {
    "backend": object(),
    "prompts": [[1, 2], [-1]],
    "config": {"max_num_batched_tokens": 32},
    "max_new_tokens": 0,
    "sampling": "greedy",
    "stop_token_ids": [-3],
    "request_stop_token_ids": [[1]],
    "num_kv_pages": 0,
    "kv_page_size": 0,
    "on_dispatch": 3,
    "request_indices": [0, 0, 1],
    "on_finish": "print",
    "detokenize": 1.5,
}


#: generate's retired argument names (tests/test_vocabulary.py checks them).
RETIRED_ARGUMENTS = {"on_step", "num_pages", "page_size"}


def test_the_table_of_bad_arguments_covers_every_parameter_of_generate() -> None:
    assert set(BAD_ARGUMENTS) | RETIRED_ARGUMENTS == set(inspect.signature(generate).parameters)


@pytest.mark.parametrize("parameter", BAD_ARGUMENTS)
def test_each_bad_argument_of_generate_is_the_errors_parameter(parameter: str) -> None:
    arguments: dict[str, Any] = {"backend": BACKEND, "prompts": PROMPTS, "config": CONFIG}
    arguments[parameter] = BAD_ARGUMENTS[parameter]
    with pytest.raises(PyptoSchedError) as info:
        generate(**arguments)
    assert info.value.parameter == parameter, str(info.value)


@pytest.mark.parametrize(
    ("arguments", "parameter", "message"),
    [
        ({"max_new_tokens": [2, 0, 2]}, "max_new_tokens", "'max_new_tokens[1]' must be >= 1: 0"),
        ({"sampling": [SamplingParams()] * 2 + [1]}, "sampling", "'sampling[2]' must be"),
        ({"sampling": SamplingParams(stop=["x"])}, "sampling", "'sampling[0].stop' needs text"),
        ({"prompts": [[1], [1, 99999]]}, "prompts", "'prompts[1]' values must be in [0, "),
    ],
)
def test_an_item_of_a_generate_argument_names_the_argument(
    arguments: dict[str, Any], parameter: str, message: str
) -> None:
    with pytest.raises(InvalidInputError) as info:
        generate(BACKEND, **{"prompts": PROMPTS, **arguments}, config=CONFIG)
    assert info.value.parameter == parameter
    assert str(info.value).startswith(message)


# -- the command line: flags from the attribute ---------------------------------------------


def test_the_command_line_maps_the_parameter_not_the_message() -> None:
    # A message that does not begin with the parameter's name is still the flag's ...
    error = InvalidInputError("whatever the library wrote", parameter="num_pages")
    error.rule = "must be >= 1: 0"
    flags = flags_named(num_pages="--num-kv-pages")
    with pytest.raises(UsageError, match=r"^--num-kv-pages: must be >= 1: 0$"), flags:
        raise error
    # ... and one that begins with it, but says it is about no parameter, is not.
    plain = InvalidInputError("'num_pages' must be >= 1: 0")
    with pytest.raises(InvalidInputError) as info, flags_named(num_pages="--num-kv-pages"):
        raise plain
    assert info.value is plain


def test_the_command_line_leaves_an_error_about_an_item_unchanged() -> None:
    message = r"^'max_new_tokens\[1\]' must be >= 1: 0$"
    with (
        pytest.raises(InvalidInputError, match=message),
        flags_named(max_new_tokens="--max-new-tokens"),
    ):
        check_int("max_new_tokens[1]", 0, min_value=1)


# -- prepare_generation: the step generate and the Ray replicas share --------------------------


def test_a_part_of_a_prepared_batch_generates_what_the_whole_batch_does() -> None:
    hot = SamplingParams(temperature=1.0, seed=7)
    inputs = prepare_generation(
        PROMPTS,
        vocab_size=BACKEND.vocab_size,
        max_positions=None,
        config=CONFIG,
        max_new_tokens=[3, 5, 4],
        sampling=hot,
    )
    whole = run_generation(BACKEND, inputs).sequences
    part = run_generation(BACKEND, inputs.part([2, 0])).sequences
    assert [s.token_ids.tolist() for s in part] == [whole[2].token_ids.tolist(),
                                                    whole[0].token_ids.tolist()]  # fmt: skip
    assert inputs.part([2, 0]).request_indices == (2, 0)


def test_prepare_checks_every_request_against_the_pool_before_any_runs() -> None:
    with pytest.raises(InvalidConfigError) as info:
        prepare_generation(
            PROMPTS,
            vocab_size=BACKEND.vocab_size,
            max_positions=None,
            config=CONFIG,
            max_new_tokens=[1, 1, 30],
            num_kv_pages=2,
            kv_page_size=4,
        )
    _about(info.value, "num_kv_pages")
    assert "request 2 needs" in str(info.value)
