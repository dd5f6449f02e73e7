"""PlannerConfig: defaults, derived limits, the engine convention and the dict form."""

from __future__ import annotations

import copy
import pickle

import attrs
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pypto_sched import POLICIES, InvalidConfigError, PlannerConfig, Policy


def test_limits_default_to_none_meaning_off() -> None:
    config = PlannerConfig(max_num_batched_tokens=8192)
    assert config.long_prefill_token_threshold is None
    assert config.max_num_seqs is None
    assert config.chunk_alignment is None
    assert config.max_num_partial_prefills is None
    assert config.policy == "round_robin"
    assert config.chunk_cap == config.effective_budget == 8192


def test_policies_are_round_robin_then_packed() -> None:
    assert POLICIES == ("round_robin", "packed")


@pytest.mark.parametrize(
    ("budget", "threshold", "policy", "cap", "effective"),
    [
        (8192, None, "round_robin", 8192, 8192),
        (8192, 256, "round_robin", 256, 256),
        (8192, 256, "packed", 256, 8192),
        (100, 256, "round_robin", 100, 100),
        (100, 256, "packed", 100, 100),
    ],
)
def test_chunk_cap_and_effective_budget(
    budget: int, threshold: int | None, policy: Policy, cap: int, effective: int
) -> None:
    config = PlannerConfig(
        max_num_batched_tokens=budget, long_prefill_token_threshold=threshold, policy=policy
    )
    assert config.chunk_cap == cap
    assert config.effective_budget == effective


def test_config_is_frozen_and_keyword_only() -> None:
    config = PlannerConfig(max_num_batched_tokens=8)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        config.max_num_batched_tokens = 9  # type: ignore[misc]
    with pytest.raises(TypeError):
        PlannerConfig(8)  # type: ignore[call-arg]


def test_numpy_integers_are_stored_as_python_ints() -> None:
    config = PlannerConfig(
        max_num_batched_tokens=np.int64(64), long_prefill_token_threshold=np.uint16(16)
    )
    assert type(config.max_num_batched_tokens) is int
    assert type(config.long_prefill_token_threshold) is int
    assert config == PlannerConfig(max_num_batched_tokens=64, long_prefill_token_threshold=16)
    assert hash(config) == hash(
        PlannerConfig(max_num_batched_tokens=64, long_prefill_token_threshold=16)
    )


def test_chunk_alignment_up_to_the_chunk_cap_is_accepted_and_beyond_it_rejected() -> None:
    PlannerConfig(max_num_batched_tokens=64, long_prefill_token_threshold=16, chunk_alignment=16)
    with pytest.raises(InvalidConfigError, match=r"^'chunk_alignment' must be <= .* = 16.*: 17"):
        PlannerConfig(
            max_num_batched_tokens=64, long_prefill_token_threshold=16, chunk_alignment=17
        )
    with pytest.raises(InvalidConfigError, match=r"^'chunk_alignment'") as info:
        PlannerConfig(max_num_batched_tokens=8, chunk_alignment=9)
    assert info.value.parameter == "chunk_alignment"


# -- page_size, the retired name of chunk_alignment ---------------------------------------------


def test_page_size_is_chunk_alignment_by_its_retired_name() -> None:
    new = PlannerConfig(max_num_batched_tokens=8, chunk_alignment=4)
    with pytest.warns(DeprecationWarning, match=r"'page_size' is deprecated: use 'chunk_al"):
        old = PlannerConfig(max_num_batched_tokens=8, page_size=4)
    assert old == new
    assert hash(old) == hash(new)
    with pytest.warns(DeprecationWarning, match=r"page_size is deprecated: use chunk_alignment"):
        assert new.page_size == 4
    with (  # the rules still hold, and name the field
        pytest.warns(DeprecationWarning, match="'page_size'"),
        pytest.raises(InvalidConfigError, match=r"^'chunk_alignment' must be <="),
    ):
        PlannerConfig(max_num_batched_tokens=8, page_size=9)
    with pytest.warns(DeprecationWarning, match="'page_size'"):
        engine = PlannerConfig.from_engine_args(max_num_batched_tokens=8, page_size=4)
    assert (
        engine == new == PlannerConfig.from_engine_args(max_num_batched_tokens=8, chunk_alignment=4)
    )


def test_page_size_and_chunk_alignment_together_are_refused() -> None:
    with pytest.raises(InvalidConfigError, match=r"^'page_size' must not be given with 'chunk_a"):
        PlannerConfig(max_num_batched_tokens=8, chunk_alignment=4, page_size=4)


def test_a_config_has_no_field_named_page_size_and_no_page_size_to_set() -> None:
    assert "page_size" not in {field.name for field in attrs.fields(PlannerConfig)}
    config = PlannerConfig(max_num_batched_tokens=8, chunk_alignment=4)
    with pytest.raises(AttributeError):
        config.page_size = 2  # type: ignore[misc]


def test_evolve_pickle_and_copy_keep_the_alignment_and_its_validators() -> None:
    config = PlannerConfig(max_num_batched_tokens=8, chunk_alignment=4, policy="packed")
    assert attrs.evolve(config, chunk_alignment=2).chunk_alignment == 2
    assert attrs.evolve(config, max_num_batched_tokens=16) == PlannerConfig(
        max_num_batched_tokens=16, chunk_alignment=4, policy="packed"
    )
    with pytest.raises(InvalidConfigError, match=r"^'chunk_alignment' must be <="):
        attrs.evolve(config, max_num_batched_tokens=2)
    with pytest.raises(InvalidConfigError, match=r"^'chunk_alignment' must be >= 1: 0"):
        attrs.evolve(config, chunk_alignment=0)
    assert pickle.loads(pickle.dumps(config)) == config
    assert copy.deepcopy(config) == config
    assert type(attrs.evolve(config, chunk_alignment=np.int64(2)).chunk_alignment) is int


def test_from_dict_reads_the_retired_key_with_a_warning() -> None:
    data = {"max_num_batched_tokens": 8, "page_size": 4}
    with pytest.warns(DeprecationWarning, match="'page_size' is deprecated"):
        assert PlannerConfig.from_dict(data) == PlannerConfig(
            max_num_batched_tokens=8, chunk_alignment=4
        )


def test_max_num_partial_prefills_needs_policy_packed() -> None:
    PlannerConfig(max_num_batched_tokens=8, policy="packed", max_num_partial_prefills=2)
    with pytest.raises(InvalidConfigError, match=r"'max_num_partial_prefills'.*'round_robin'"):
        PlannerConfig(max_num_batched_tokens=8, max_num_partial_prefills=2)


def test_from_engine_args_reads_threshold_0_as_off_and_max_num_seqs_as_rows() -> None:
    assert PlannerConfig.from_engine_args(max_num_batched_tokens=8192) == PlannerConfig(
        max_num_batched_tokens=8192
    )
    assert PlannerConfig.from_engine_args(
        max_num_batched_tokens=8192, long_prefill_token_threshold=0
    ) == PlannerConfig(max_num_batched_tokens=8192)
    assert PlannerConfig.from_engine_args(
        max_num_batched_tokens=8192,
        long_prefill_token_threshold=256,
        max_num_seqs=16,
        chunk_alignment=128,
        policy="packed",
        max_num_partial_prefills=4,
    ) == PlannerConfig(
        max_num_batched_tokens=8192,
        long_prefill_token_threshold=256,
        max_num_seqs=16,
        chunk_alignment=128,
        policy="packed",
        max_num_partial_prefills=4,
    )


@st.composite
def configs(draw: st.DrawFn) -> PlannerConfig:
    policy = draw(st.sampled_from(POLICIES))
    budget = draw(st.integers(1, 2**31 - 1))
    threshold = draw(st.none() | st.integers(1, 2**31 - 1))
    cap = min(budget, threshold or budget)
    return PlannerConfig(
        max_num_batched_tokens=budget,
        long_prefill_token_threshold=threshold,
        max_num_seqs=draw(st.none() | st.integers(1, 2**31 - 1)),
        chunk_alignment=draw(st.none() | st.integers(1, cap)),
        policy=policy,
        max_num_partial_prefills=draw(st.none() | st.integers(1, 1000))
        if policy == "packed"
        else None,
    )


@given(configs())
def test_dict_round_trip_gives_an_equal_config_with_an_equal_hash(config: PlannerConfig) -> None:
    data = config.to_dict()
    assert set(data) == {
        "max_num_batched_tokens",
        "long_prefill_token_threshold",
        "max_num_seqs",
        "chunk_alignment",
        "policy",
        "max_num_partial_prefills",
    }
    loaded = PlannerConfig.from_dict(data)
    assert loaded == config
    assert hash(loaded) == hash(config)


def test_from_dict_needs_only_the_budget() -> None:
    assert PlannerConfig.from_dict({"max_num_batched_tokens": 8}) == PlannerConfig(
        max_num_batched_tokens=8
    )


def test_from_dict_rejects_unknown_keys_naming_them() -> None:
    with pytest.raises(InvalidConfigError, match=r"unknown config keys \['max_batch_size'\]"):
        PlannerConfig.from_dict({"max_num_batched_tokens": 8, "max_batch_size": 4})
    # Keys of any type (a dict built in Python), listed by their reprs' order.
    with pytest.raises(InvalidConfigError, match=r"^unknown config keys \['foo', 1, None\];"):
        PlannerConfig.from_dict({"max_num_batched_tokens": 8, 1: 2, "foo": 3, None: 4})


def test_from_dict_rejects_a_missing_budget() -> None:
    with pytest.raises(InvalidConfigError, match="'max_num_batched_tokens'"):
        PlannerConfig.from_dict({"policy": "packed"})


@pytest.mark.parametrize("data", [None, [("max_num_batched_tokens", 8)], "8", 8])
def test_from_dict_rejects_anything_but_a_dict(data: object) -> None:
    with pytest.raises(InvalidConfigError, match="JSON object"):
        PlannerConfig.from_dict(data)
