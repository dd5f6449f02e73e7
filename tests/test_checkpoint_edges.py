"""pypto_sched.checkpoints at its edges: each rule pinned where a looser or dropped one would
still pass the table and properties of ``test_checkpoints.py`` (from a mutation review)."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import pytest
from test_checkpoints import TINY, tensors_of

from pypto_sched import CheckpointError, InvalidInputError
from pypto_sched.checkpoints import (
    CONFIG_FILE,
    INDEX_FILE,
    WEIGHTS_FILE,
    ModelConfig,
    encode_safetensors,
    load_checkpoint,
    parse_shard_index,
    read_config,
    read_safetensors_header,
)
from pypto_sched.models import qwen3 as checkpoints


def hf_config(**changes: object) -> dict[str, Any]:
    return TINY.to_hf_config() | changes


# A dimension may be 2**31 - 1 and no more.
def test_dimension_limit_is_exactly_int32_max() -> None:
    assert ModelConfig(vocab_size=2**31 - 1).vocab_size == 2**31 - 1
    with pytest.raises(InvalidInputError, match=r"'vocab_size' must be <= 2147483647: 2147483648"):
        ModelConfig(vocab_size=2**31)


# Nothing is coerced: a JSON true is not a number.
@pytest.mark.parametrize("field", ["rms_norm_eps", "rope_theta"])
def test_a_json_boolean_is_not_a_number(field: str) -> None:
    data = hf_config(**{field: True})
    if field == "rope_theta":
        data = hf_config(rope_parameters={"rope_type": "default", "rope_theta": True})
    with pytest.raises(CheckpointError, match=rf"'{field}' must be a number: True"):
        ModelConfig.from_hf_config(data)


# transformers 5 keeps partial_rotary_factor inside rope_parameters: a partial rotation
# there is refused as at the top level (a config read wrongly gives wrong logits silently).
def test_partial_rotary_inside_rope_parameters_is_refused() -> None:
    data = hf_config(
        rope_parameters={"rope_type": "default", "rope_theta": 1e6, "partial_rotary_factor": 0.5}
    )
    with pytest.raises(
        CheckpointError, match=r"'rope_parameters'.*'partial_rotary_factor' must be 1\.0"
    ):
        ModelConfig.from_hf_config(data)


def test_partial_rotary_factor_true_is_refused() -> None:
    with pytest.raises(CheckpointError, match=r"'partial_rotary_factor' must be 1\.0.*: True"):
        ModelConfig.from_hf_config(hf_config(partial_rotary_factor=True))


# Without max_window_layers transformers slides the window from layer 28 on.
def test_absent_max_window_layers_is_28_as_in_transformers() -> None:
    data = {
        "model_type": "qwen3",
        "num_hidden_layers": 30,
        "use_sliding_window": True,
        "sliding_window": 4096,
    }
    with pytest.raises(CheckpointError, match=r"'max_window_layers' must be an int >= .*: 28"):
        ModelConfig.from_hf_config(data)
    # 28 layers: no layer reaches the window.
    assert ModelConfig.from_hf_config(data | {"num_hidden_layers": 28}).num_hidden_layers == 28


def test_to_hf_config_writes_the_transformers_5_rope_layout() -> None:
    data = attrs.evolve(TINY, rope_theta=123.0).to_hf_config()
    assert "rope_theta" not in data
    assert data["rope_parameters"] == {"rope_type": "default", "rope_theta": 123.0}


def test_a_base_model_checkpoint_with_a_stored_lm_head_keeps_it(tmp_path: Path) -> None:
    untied = attrs.evolve(TINY, tie_word_embeddings=False)
    tensors = tensors_of(untied)
    stored = {
        (name if name == "lm_head.weight" else name.removeprefix("model.")): array
        for name, array in tensors.items()
    }
    (tmp_path / CONFIG_FILE).write_text(json.dumps(untied.to_hf_config()))
    (tmp_path / WEIGHTS_FILE).write_bytes(encode_safetensors(stored))
    loaded = load_checkpoint(tmp_path)
    assert loaded.config == untied
    np.testing.assert_array_equal(loaded.tensors["lm_head.weight"].array, tensors["lm_head.weight"])


def test_a_header_length_just_past_the_file_is_named_as_such(tmp_path: Path) -> None:
    path = tmp_path / "x.safetensors"
    path.write_bytes(struct.pack("<Q", 5) + b"{}")  # 10-byte file, 5 > 10 - 8
    with pytest.raises(CheckpointError, match=r"header length 5 runs past the end of the 10-byte"):
        read_safetensors_header(path)


def test_a_windows_path_in_the_shard_index_is_refused() -> None:
    with pytest.raises(CheckpointError, match=r"a file name in the checkpoint directory"):
        parse_shard_index({"weight_map": {"w": "..\\evil.safetensors"}})


def test_a_nul_in_a_shard_name_is_refused() -> None:
    with pytest.raises(CheckpointError, match=r"a file name in the checkpoint directory"):
        parse_shard_index({"weight_map": {"w": "a\0.safetensors"}})


def test_model_safetensors_wins_over_an_index_as_in_transformers(tmp_path: Path) -> None:
    (tmp_path / CONFIG_FILE).write_text(json.dumps(TINY.to_hf_config()))
    (tmp_path / WEIGHTS_FILE).write_bytes(encode_safetensors(tensors_of(TINY)))
    (tmp_path / INDEX_FILE).write_text(json.dumps({"weight_map": {"x": "gone.safetensors"}}))
    assert load_checkpoint(tmp_path).config == TINY


# A config one byte over the limit is refused, not read cut short.
def test_a_config_over_the_limit_is_refused_as_too_large(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / CONFIG_FILE).write_text(json.dumps(TINY.to_hf_config()) + " " * 10)
    monkeypatch.setattr(checkpoints, "MAX_JSON_BYTES", len(json.dumps(TINY.to_hf_config())) + 5)
    with pytest.raises(CheckpointError, match=r"config\.json is larger than the limit"):
        read_config(tmp_path)


@pytest.mark.parametrize("value", [[1, 2], "default", 5])
def test_rope_parameters_not_an_object_is_a_checkpoint_error(value: object) -> None:
    with pytest.raises(CheckpointError, match=r"'rope_parameters' must be an object"):
        ModelConfig.from_hf_config(hf_config(rope_parameters=value))


# A window starting past the last layer reaches no layer: transformers runs full attention.
def test_max_window_layers_equal_to_the_layer_count_is_full_attention() -> None:
    data = {
        "model_type": "qwen3",
        "num_hidden_layers": 2,
        "use_sliding_window": True,
        "sliding_window": 16,
        "max_window_layers": 2,
    }
    assert ModelConfig.from_hf_config(data).num_hidden_layers == 2


@pytest.mark.parametrize(
    "name", ["a", "ab", "abc", "abcd", "abcde", "abcdef", "abcdefg", "abcdefgh"]
)
def test_encoded_tensor_data_starts_8_byte_aligned(name: str, tmp_path: Path) -> None:
    path = tmp_path / "x.safetensors"
    path.write_bytes(encode_safetensors({name: np.zeros(1, np.float64)}))
    assert read_safetensors_header(path).data_start % 8 == 0


def test_a_file_that_grows_between_header_and_mapping_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "x.safetensors"
    path.write_bytes(encode_safetensors({"w": np.arange(4, dtype=np.float32)}))
    original = checkpoints.read_safetensors_header

    def read_then_grow(p: Path) -> Any:
        header = original(p)
        with open(path, "ab") as file:
            file.write(b"\0" * 8)
        return header

    monkeypatch.setattr(checkpoints, "read_safetensors_header", read_then_grow)
    with pytest.raises(CheckpointError, match=r"changed size while it was read"):
        checkpoints.read_safetensors(path)
