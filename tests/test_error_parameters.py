"""Errors carry the parameter they are about, so that no caller reads a message to find it.

An error about a parameter as a whole reads ``'<parameter>' <rule>`` and says both in
``error.parameter`` and ``error.rule``; one about an item of a parameter
(``'max_new_tokens[2]'``) names the parameter and keeps no rule; the command line maps
``parameter`` to its flag. Also here: the one config check (``check_config``), and the one
``prepare_generation`` step that ``generate`` and the Ray replicas share.

The rule for the whole tree is held by reading it: every error of the library's (a
``PyptoSchedError`` subclass, in ``pypto_sched/`` or a bundled backend) built with a message
that begins with a quoted name (``'max_num_seqs' must ...``, ``f"{name!r} must ..."``) is
built by ``XError.about(name, rule)`` or given ``parameter=``. The checker is tested on
snippets, so that a rule that stopped matching fails here rather than passing quietly.
"""

from __future__ import annotations

import ast
import functools
import inspect
import pickle
import re
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from pypto_sched import (
    LLM,
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
    dispatch_arrays,
    generate,
    load_backend,
    plan_generation_step,
    plan_pages,
    plan_prefill,
    plan_step,
    plan_warmup,
)
from pypto_sched.chat import ChatTemplate
from pypto_sched.checkpoints import ModelConfig
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


# -- the rule, over the whole tree ---------------------------------------------------------------


REPO = Path(__file__).resolve().parent.parent
#: The library's packages: ``pypto_sched`` and the bundled backends'.
PACKAGES = [
    REPO / "pypto_sched",
    *sorted(p.parent for p in (REPO / "backends").glob("*/pypto_sched_*/__init__.py")),
]
#: A message that begins with a quoted name (``'max_num_seqs'``, ``'sampling[3].stop'``,
#: ``'config.policy'``) and not a list of several (``'start' + 'length'``,
#: ``'requests', 'starts' ...``, ``'a' and 'b'``: about no one parameter).
QUOTED_NAME = re.compile(r"'[A-Za-z_][\w.\[\]]*'(?!\s*(?:[+*,]|and)\s*')")


def _class_name(node: ast.expr) -> str:
    """The name a call or a base class is spelled with: ``X`` of ``X`` and ``module.X``."""
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else ""


def _error_classes(trees: Iterable[ast.AST]) -> frozenset[str]:
    """``PyptoSchedError`` and the names of the classes ``trees`` define that derive from it
    (the backends' own, the runtime's ``ResumeError`` ...)."""
    classes = [
        (node.name, {_class_name(base) for base in node.bases})
        for tree in trees
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef)
    ]
    names = {"PyptoSchedError"}
    while more := {name for name, bases in classes if bases & names} - names:
        names |= more
    return frozenset(names)


def _leads_with_a_name(message: ast.expr) -> bool:
    """Whether ``message``, a str or f-string literal, begins with a quoted name: written out
    (``'max_num_seqs'``, ``f"'sampling[{i}].stop'"``), a variable's repr (``{name!r}``,
    ``{field.name!r}``) or a variable quoted by hand (``'{name}'``). A path's repr
    (``{str(path)!r}``) or a place (``{where}: 'max_new_tokens'``) is not one."""
    if isinstance(message, ast.Constant):
        return isinstance(message.value, str) and QUOTED_NAME.match(message.value) is not None
    if not isinstance(message, ast.JoinedStr):
        return False
    # The message's text with each placeholder that can be a name standing as one.
    text = ""
    for part in message.values:
        if isinstance(part, ast.Constant):
            text += str(part.value)
            continue
        assert isinstance(part, ast.FormattedValue)
        if part.conversion == ord("r") and isinstance(part.value, ast.Name | ast.Attribute):
            text += "'name'"
        elif part.conversion == -1 and isinstance(part.value, ast.Name):
            text += "name"
        else:
            break
    return QUOTED_NAME.match(text) is not None


def rule_breaches(tree: ast.AST, error_classes: frozenset[str]) -> Iterator[tuple[int, str]]:
    """``(line, call)`` for each error of ``error_classes`` that ``tree`` builds with a message
    about a parameter but neither by ``.about`` nor with ``parameter=``."""
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and _class_name(node.func) in error_classes
            and node.args
            and _leads_with_a_name(node.args[0])
            and not any(keyword.arg == "parameter" for keyword in node.keywords)
        ):
            yield node.lineno, ast.unparse(node)[:100]


@functools.cache
def _package_trees() -> dict[Path, ast.AST]:
    """Every module of :data:`PACKAGES`, parsed."""
    return {
        path: ast.parse(path.read_text(), filename=str(path))
        for package in PACKAGES
        for path in sorted(package.rglob("*.py"))
    }


def test_every_error_whose_message_names_a_parameter_carries_it() -> None:
    trees = _package_trees()
    classes = _error_classes(trees.values())
    # The scan sees every package: the backends' errors and the runtime's own are known.
    assert {"InvalidModelError", "NpuUnavailableError", "ResumeError"} <= classes
    breaches = [
        f"{path.relative_to(REPO)}:{line}: {call}"
        for path, tree in trees.items()
        for line, call in rule_breaches(tree, classes)
    ]
    assert not breaches, (
        "errors whose message names a parameter but that do not carry it (build them with "
        "XError.about(name, rule), or pass parameter=):\n" + "\n".join(breaches)
    )


def _breaches(source: str) -> list[int]:
    """The lines of ``source`` (a snippet, which may define its own errors) that break the
    rule."""
    tree = ast.parse(source)
    classes = _error_classes([*_package_trees().values(), tree])
    return [line for line, _ in rule_breaches(tree, classes)]


@pytest.mark.parametrize(
    "source",
    [
        """raise InvalidInputError(f"'max_num_seqs' must be >= 1: {value}")""",
        """raise InvalidInputError("'policy' must be one of ...")""",
        """raise InvalidInputError(\n    f"'sampling[{i}].stop' needs text: "\n    "{stop!r}"\n)""",
        """raise InvalidInputError(f"'config.policy' must be {policy!r}")""",
        """raise InvalidInputError(f"{name!r} must be >= 1: {value}")""",
        """raise InvalidInputError(f"{field.name!r} must be an int: {value!r}")""",
        """raise InvalidInputError(f"'{name}' must have one entry per prompt")""",
        """raise InvalidInputError(f"{what!r}: the prompt must be a string")""",
        """error = errors.InvalidInputError("'data' must be a JSON object")""",
        """class SeedError(InvalidInputError): ...\nraise SeedError("'seed' must be >= 0")""",
    ],
    ids=["literal", "str", "multi-line", "field", "repr", "attribute", "quoted", "colon",
         "built", "subclass"],
)  # fmt: skip
def test_the_checker_finds_an_error_that_names_a_parameter_without_carrying_it(
    source: str,
) -> None:
    assert len(_breaches(source)) == 1


@pytest.mark.parametrize(
    "source",
    [
        """raise InvalidInputError.about("max_num_seqs", f"must be >= 1: {value}")""",
        """raise InvalidInputError(f"'ops'='npu' needs an npu device", parameter="ops")""",
        """raise InvalidInputError(f"'start' + 'length' must be <= {limit}: {end}")""",
        """raise InvalidInputError("'requests', 'starts' and 'lengths' must have one length")""",
        """raise InvalidInputError("'max_examples' and 'generation_examples' must not be 0")""",
        """raise InvalidInputError(f"{where}: 'max_new_tokens' must be >= 1: {new}")""",
        """raise InvalidInputError(f"{str(path)!r} is not a tokenizer: {error}")""",
        """raise InvalidInputError(f"'{self.path}' cannot be completed")""",
        """raise InvalidInputError(f"{name} must be a list of token ids")""",
        """raise InvalidInputError("the batch is empty")""",
        """raise InvalidInputError(message)""",
        """raise ValueError("'max_num_seqs' must be >= 1")""",
    ],
    ids=["about", "parameter", "sum", "list", "both", "where", "path", "path-quoted",
         "unquoted", "no-name", "variable", "not-ours"],
)  # fmt: skip
def test_the_checker_lets_an_error_that_carries_its_parameter_or_names_none_through(
    source: str,
) -> None:
    assert _breaches(source) == []


# -- errors that carry their parameter, through the public API ---------------------------------


@pytest.mark.parametrize(
    ("call", "parameter", "message"),
    [
        (lambda: plan_step(None, CONFIG), "state", "'state' must be a PrefillState"),  # type: ignore[arg-type]
        (lambda: PrefillState.from_prompt_lengths([4])[9], "request_id", "'request_id' must be"),
        (lambda: Schedule.from_dict({"format": "x"}), "format", "'format' must be"),
        (lambda: dispatch_arrays("x", None), "dispatch", "'dispatch' must be a Dispatch"),  # type: ignore[call-overload]
        (lambda: load_backend("reference", seed=-1), "seed", "'seed' must be an int >= 0: -1"),
        (lambda: BACKEND.new_cache(num_pages=0, page_size=4), "num_pages", "'num_pages' must"),
    ],
    ids=["plan_step", "PrefillState", "Schedule.from_dict", "dispatch_arrays", "seed",
         "new_cache"],
)  # fmt: skip
def test_an_error_about_an_argument_carries_it(
    call: Callable[[], object], parameter: str, message: str
) -> None:
    with pytest.raises(PyptoSchedError) as info:
        call()
    assert str(info.value).startswith(message)
    _about(info.value, parameter)


@pytest.mark.parametrize(
    "dispatches",
    [[[[0, 0, 4]]], [[[0, -1, 4, True]]], [3]],
    ids=["a row of three", "a row Chunk refuses", "a dispatch not a list"],
)
def test_a_bad_row_of_from_dispatches_is_about_the_dispatches(dispatches: Any) -> None:
    with pytest.raises(InvalidScheduleError) as info:
        Schedule.from_dispatches(CONFIG, [4], dispatches)
    assert info.value.parameter == "dispatches"
    assert str(info.value).startswith("dispatch 0")


def test_a_row_out_of_range_is_about_the_row() -> None:
    schedule = plan_prefill([4, 6], CONFIG)
    arrays = dispatch_arrays(schedule.dispatch(0), plan_pages([4, 6], page_size=4, num_pages=3))
    with pytest.raises(InvalidInputError) as info:
        arrays.row_tokens(arrays.num_rows)
    assert info.value.parameter == "row"
    assert str(info.value) == f"'row' must be in [0, {arrays.num_rows}): {arrays.num_rows}"


NOT_A_DIMENSION = st.one_of(
    st.integers(max_value=0),
    st.floats(max_value=0) | st.just(float("nan")),
    st.text(max_size=3),
    st.none(),
)


@given(field=st.sampled_from([f.name for f in attrs.fields(ModelConfig)]), value=NOT_A_DIMENSION)
def test_a_bad_model_config_field_is_the_errors_parameter(field: str, value: object) -> None:
    fields: dict[str, Any] = {field: value}
    with pytest.raises(InvalidInputError) as info:
        ModelConfig(**fields)
    _about(info.value, field)


NOT_A_MESSAGE = st.one_of(st.integers(), st.text(max_size=3), st.none(), st.just({"content": "x"}))


@given(
    good=st.integers(min_value=0, max_value=3),
    bad=NOT_A_MESSAGE,
)
def test_a_bad_message_of_a_conversation_is_about_the_messages(good: int, bad: object) -> None:
    messages: list[Any] = [{"role": "user", "content": "x"}] * good + [bad]
    with pytest.raises(InvalidInputError) as info:
        ChatTemplate("{{ messages }}").render(messages)
    assert info.value.parameter == "messages"
    assert str(info.value).startswith(f"'messages[{good}]' must ")


@pytest.mark.parametrize(
    ("prompts", "message"),
    [
        ({"prompt": 5}, "\"prompts[0]['prompt']\" must be a string: 5"),
        ([[1, 2], "text"], "'prompts[1]' needs a tokenizer for its text"),
        ([[1, 2], [{"role": "user", "content": "x"}]], "'prompts[1]' needs a chat template"),
    ],
    ids=["prompt", "text", "conversation"],
)
def test_a_bad_prompt_of_llm_generate_is_about_the_prompts(
    tmp_path: Path, prompts: Any, message: str
) -> None:
    llm = LLM(tmp_path, backend=BACKEND)  # a model directory with no tokenizer or template
    with pytest.raises(InvalidInputError) as info:
        llm.generate(prompts)
    assert info.value.parameter == "prompts"
    assert str(info.value).startswith(message)
