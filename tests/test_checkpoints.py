"""pypto_sched.checkpoints: the one reader of Hugging Face Qwen3 checkpoints.

A hostile-input table (one test per case: every damaged or unsupported file is a
CheckpointError naming the file and, where there is one, the tensor), properties of the
safetensors reader (round trips; no mutation of a valid file escapes as anything but a
CheckpointError), agreement with the ``safetensors`` library, and parity with
``transformers.Qwen3Config`` over generated configs, in both layouts transformers has written.
"""

from __future__ import annotations

import ast
import json
import math
import os
import re
import struct
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pypto_sched import (
    CheckpointError,
    InvalidInputError,
    execute_schedule,
    load_backend,
    plan_one_shot,
)
from pypto_sched.checkpoints import (
    CONFIG_FILE,
    EMBED_TOKENS,
    FINAL_NORM,
    INDEX_FILE,
    LAYER_TENSORS,
    LM_HEAD,
    MAX_HEADER_BYTES,
    SAFETENSORS_DTYPES,
    WEIGHTS_FILE,
    ModelConfig,
    Tensor,
    encode_safetensors,
    expected_tensors,
    layer_tensor_names,
    load_checkpoint,
    read_config,
    read_safetensors,
    read_safetensors_header,
)

#: A tiny valid model: the base every hostile case damages in one place.
TINY = ModelConfig(
    vocab_size=8,
    hidden_size=8,
    intermediate_size=12,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=4,
    tie_word_embeddings=True,
)
NORM = "model.norm.weight"


def tensors_of(config: ModelConfig, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        name: rng.standard_normal(shape).astype(np.float32)
        for name, shape in expected_tensors(config).items()
    }


def config_bytes(**changes: Any) -> bytes:
    """TINY's config.json (transformers 5 layout), with keys changed (``None`` removes)."""
    data = TINY.to_hf_config()
    for key, value in changes.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    return json.dumps(data).encode()


def raw_file(header: Any, data: bytes = b"", *, length: int | None = None) -> bytes:
    """A safetensors file built byte by byte: ``header`` (an object, or bytes as they are)."""
    encoded = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(encoded) if length is None else length) + encoded + data


def single_file(**changes: bytes) -> dict[str, bytes]:
    """TINY as config.json + model.safetensors, with whole files replaced."""
    files = {CONFIG_FILE: config_bytes(), WEIGHTS_FILE: encode_safetensors(tensors_of(TINY))}
    return {**files, **changes}


def sharded(weight_map: Callable[[dict[str, str]], Any] = lambda m: m) -> dict[str, bytes]:
    """TINY in two shards (names sorted, split in half) with the index's weight map edited."""
    tensors = tensors_of(TINY)
    names = sorted(tensors)
    halves = {"a.safetensors": names[: len(names) // 2], "b.safetensors": names[len(names) // 2 :]}
    files = {CONFIG_FILE: config_bytes()}
    mapping = {}
    for file, group in halves.items():
        files[file] = encode_safetensors({n: tensors[n] for n in group})
        mapping.update(dict.fromkeys(group, file))
    files[INDEX_FILE] = json.dumps({"metadata": {}, "weight_map": weight_map(mapping)}).encode()
    return files


def entry(dtype: str = "F32", shape: Any = (1,), offsets: Any = (0, 4)) -> dict[str, Any]:
    return {"dtype": dtype, "shape": list(shape), "data_offsets": list(offsets)}


def retagged(tensors: dict[str, np.ndarray], name: str, dtype: str) -> bytes:
    """The safetensors file of ``tensors`` with tensor ``name``, one byte an element, tagged
    ``dtype`` (a way to write dtypes NumPy lacks)."""
    raw = {**tensors, name: np.zeros(tensors[name].shape, np.uint8)}
    encoded = encode_safetensors(raw)
    (length,) = struct.unpack("<Q", encoded[:8])
    header = json.loads(encoded[8 : 8 + length])
    header[name]["dtype"] = dtype
    return raw_file(header, encoded[8 + length :])


@attrs.frozen
class Case:
    """Files of a checkpoint directory, the file the error must name, and the tensor (if
    any) it must name, and a pattern of the rule broken."""

    files: dict[str, bytes]
    file: str
    tensor: str | None
    match: str


def header_case(header: Any, data: bytes, match: str, tensor: str | None = NORM) -> Case:
    return Case(single_file(**{WEIGHTS_FILE: raw_file(header, data)}), WEIGHTS_FILE, tensor, match)


def config_case(match: str, **changes: Any) -> Case:
    return Case(single_file(**{CONFIG_FILE: config_bytes(**changes)}), CONFIG_FILE, None, match)


def _two(first: Any, second: Any, size: int) -> tuple[dict[str, Any], bytes]:
    return {NORM: entry(offsets=first), "x": entry(offsets=second)}, bytes(size)


def _deep(depth: int) -> bytes:
    return b'{"__metadata__": ' + b"[" * depth + b"]" * depth + b"}"


CASES: dict[str, Case] = {
    # -- safetensors headers and data -----------------------------------------------------
    "negative offset": header_case({NORM: entry(offsets=(-4, 0))}, b"", r"two ints >= 0"),
    "overlapping offsets": header_case(*_two((0, 4), (2, 6), 6), r"overlaps tensor"),
    "gap between tensors": header_case(*_two((0, 4), (8, 12), 12), r"leaves a gap after tensor"),
    "gap before the first tensor": header_case(
        {NORM: entry(offsets=(4, 8))}, bytes(8), r"leaves a gap"
    ),
    "string offsets": header_case({NORM: entry(offsets=("0", "4"))}, bytes(4), r"two ints"),
    "bool offsets": header_case({NORM: entry("U8", (1,), (False, True))}, bytes(1), r"two ints"),
    "float offsets": header_case({NORM: entry(offsets=(0.0, 4.0))}, bytes(4), r"two ints"),
    "three offsets": header_case({NORM: entry(offsets=(0, 4, 8))}, bytes(4), r"two ints"),
    "offsets past the data": header_case(
        {NORM: entry(shape=(100,), offsets=(0, 400))}, bytes(4), r"run past the 4 data bytes"
    ),
    "data after the last tensor": header_case(
        {NORM: entry()}, bytes(8), r"cover 4 of the 8 data bytes", tensor=None
    ),
    "truncated file": header_case(
        {NORM: entry(shape=(4,), offsets=(0, 16))}, bytes(10), r"run past the 10 data bytes"
    ),
    "shape and offsets disagree": header_case(
        {NORM: entry(shape=(2,), offsets=(0, 4))}, bytes(4), r"must span 8 bytes"
    ),
    "negative shape": header_case({NORM: entry(shape=(-1,))}, bytes(4), r"list of ints >= 0"),
    "bool shape": header_case({NORM: entry(shape=(True,))}, bytes(4), r"list of ints >= 0"),
    "float shape": header_case({NORM: entry(shape=(1.0,))}, bytes(4), r"list of ints >= 0"),
    "dtype unknown to safetensors": header_case(
        {NORM: entry(dtype="F9")}, bytes(4), r"'dtype' must be a safetensors dtype, .*: 'F9'"
    ),
    "sub-byte elements not filling whole bytes": header_case(
        {NORM: entry(dtype="F6_E2M3", shape=(2,), offsets=(0, 2))},
        bytes(2),
        r"'shape' must fill whole bytes at 6 bits per F6_E2M3 element: \[2\]",
    ),
    "sub-byte dtype of the wrong span": header_case(
        {NORM: entry(dtype="F4", shape=(4,), offsets=(0, 4))}, bytes(4), r"must span 2 bytes"
    ),
    "extra entry key": header_case(
        {NORM: {**entry(), "extra": 1}}, bytes(4), r"exactly \['data_offsets', 'dtype', 'shape'\]"
    ),
    "missing entry key": header_case({NORM: {"dtype": "F32", "shape": [1]}}, bytes(4), r"exactly"),
    "entry not an object": header_case({NORM: [1, 2]}, bytes(4), r"exactly"),
    "metadata not str to str": header_case(
        {"__metadata__": {"format": 1}, NORM: entry()}, bytes(4), r"'__metadata__'", tensor=None
    ),
    "header not an object": header_case(b"[1, 2]", b"", r"must be a JSON object", tensor=None),
    "header not UTF-8": header_case(b'{"\xff": 1}', b"", r"not UTF-8", tensor=None),
    "lone surrogate in a name": header_case(
        b'{"\\ud800": ' + json.dumps(entry()).encode() + b"}",
        bytes(4),
        r"'\\ud800' is not valid Unicode",
        tensor=None,
    ),
    "lone surrogate in the metadata": header_case(
        b'{"__metadata__": {"a": "\\udfff"}}', b"", r"is not valid Unicode", tensor=None
    ),
    "header not JSON": header_case(b"{not json", b"", r"not valid JSON", tensor=None),
    "duplicate tensor": header_case(
        f'{{"{NORM}": {json.dumps(entry())}, "{NORM}": {json.dumps(entry())}}}'.encode(),
        bytes(4),
        r"duplicate key",
    ),
    "deep nesting": header_case(_deep(10_000), b"", r"nests .* more than", tensor=None),
    "huge integer": header_case(
        b'{"x": {"dtype": "F32", "shape": [1], "data_offsets": [0, ' + b"9" * 5000 + b"]}}",
        bytes(4),
        r"not valid JSON",
        tensor=None,
    ),
    "NaN in the header": header_case(
        b'{"__metadata__": {"x": NaN}}', b"", r"NaN is not JSON", tensor=None
    ),
    "header length huge": Case(
        single_file(**{WEIGHTS_FILE: raw_file({}, length=2**63)}),
        WEIGHTS_FILE,
        None,
        rf"header length 9,223,372,036,854,775,808 exceeds {MAX_HEADER_BYTES:,}",
    ),
    "header length past the file": Case(
        single_file(**{WEIGHTS_FILE: raw_file({}, length=1000)}),
        WEIGHTS_FILE,
        None,
        r"header length 1,000 runs past the end of the 10-byte file",
    ),
    "file shorter than the length": Case(
        single_file(**{WEIGHTS_FILE: b"\x01\x00"}), WEIGHTS_FILE, None, r"2 bytes, shorter"
    ),
    "weights not floats": Case(
        single_file(
            **{WEIGHTS_FILE: encode_safetensors({**tensors_of(TINY), NORM: np.zeros(8, np.int32)})}
        ),
        WEIGHTS_FILE,
        NORM,
        r"must be one of \['F64', 'F32', 'F16', 'BF16'\]: I32",
    ),
    "weight in a dtype NumPy lacks": Case(
        single_file(**{WEIGHTS_FILE: retagged(tensors_of(TINY), NORM, "F8_E4M3")}),
        WEIGHTS_FILE,
        NORM,
        r"must be one of \['F64', 'F32', 'F16', 'BF16'\]: F8_E4M3",
    ),
    "tensor of the wrong shape": Case(
        single_file(**{WEIGHTS_FILE: encode_safetensors({**tensors_of(TINY), NORM: np.zeros(7)})}),
        WEIGHTS_FILE,
        NORM,
        r"must have shape \[8\] for this config: \[7\]",
    ),
    # -- the shard index ------------------------------------------------------------------
    "shard path with ..": Case(
        sharded(lambda m: {**m, NORM: "../b.safetensors"}), INDEX_FILE, NORM, r"a file name in"
    ),
    "absolute shard path": Case(
        sharded(lambda m: {**m, NORM: "/etc/passwd"}), INDEX_FILE, NORM, r"a file name in"
    ),
    "shard in a subdirectory": Case(
        sharded(lambda m: {**m, NORM: "sub/b.safetensors"}), INDEX_FILE, NORM, r"a file name in"
    ),
    "shard not a string": Case(
        sharded(lambda m: {**m, NORM: 3}), INDEX_FILE, NORM, r"a file name in"
    ),
    "weight map not an object": Case(
        sharded(lambda m: list(m)), INDEX_FILE, None, r"must hold a 'weight_map' object"
    ),
    "missing shard": Case(
        {k: v for k, v in sharded().items() if k != "b.safetensors"},
        "b.safetensors",
        "model.layers.1.input_layernorm.weight",
        r"the shard .* lists for tensor .* is missing",
    ),
    "tensor missing from its shard": Case(
        sharded(lambda m: {**m, "model.layers.0.mlp.up_proj.weight": "b.safetensors"}),
        "b.safetensors",
        "model.layers.0.mlp.up_proj.weight",
        r"is listed in .* for this shard but is not in it",
    ),
    "tensor in two shards": Case(
        {
            **sharded(),
            "b.safetensors": encode_safetensors(tensors_of(TINY)),  # every tensor, again
        },
        "b.safetensors",
        "model.embed_tokens.weight",
        r"is also stored in a\.safetensors",
    ),
    "index not JSON": Case({**sharded(), INDEX_FILE: b"\xff\xfe"}, INDEX_FILE, None, r"not UTF-8"),
    # -- config.json ----------------------------------------------------------------------
    "config not JSON": Case(
        single_file(**{CONFIG_FILE: b"{not json"}), CONFIG_FILE, None, r"not valid JSON"
    ),
    "config not an object": Case(
        single_file(**{CONFIG_FILE: b"[1]"}), CONFIG_FILE, None, r"must hold a JSON object"
    ),
    "config not UTF-8": Case(
        single_file(**{CONFIG_FILE: b'{"model_type": "\xff"}'}), CONFIG_FILE, None, r"not UTF-8"
    ),
    "config with a duplicate key": Case(
        single_file(**{CONFIG_FILE: b'{"model_type": "qwen3", "model_type": "llama"}'}),
        CONFIG_FILE,
        None,
        r"duplicate key 'model_type'",
    ),
    "no model_type": config_case(r"'model_type' must be 'qwen3': None", model_type=None),
    "another model_type": config_case(r"'model_type' must be 'qwen3': 'llama'", model_type="llama"),
    "string boolean false": config_case(
        r"'tie_word_embeddings' must be a bool: 'false'", tie_word_embeddings="false"
    ),
    "int boolean": config_case(r"'tie_word_embeddings' must be a bool: 1", tie_word_embeddings=1),
    "string attention_bias": config_case(
        r"'attention_bias' must be a bool: 'true'", attention_bias="true"
    ),
    "attention_bias without the biases": Case(
        single_file(**{CONFIG_FILE: config_bytes(attention_bias=True)}),
        ".",
        "model.layers.0.self_attn.q_proj.bias",
        r"is in none of",
    ),
    "NaN eps": Case(
        single_file(
            **{
                CONFIG_FILE: config_bytes().replace(
                    b'"rms_norm_eps": 1e-06', b'"rms_norm_eps": NaN'
                )
            }
        ),
        CONFIG_FILE,
        None,
        r"NaN is not JSON",
    ),
    "infinite eps": Case(
        single_file(
            **{
                CONFIG_FILE: config_bytes().replace(
                    b'"rms_norm_eps": 1e-06', b'"rms_norm_eps": 1e999'
                )
            }
        ),
        CONFIG_FILE,
        None,
        r"'rms_norm_eps' must be finite: inf",
    ),
    "zero eps": config_case(r"'rms_norm_eps' must be > 0: 0", rms_norm_eps=0),
    "string eps": config_case(r"'rms_norm_eps' must be a number: '1e-6'", rms_norm_eps="1e-6"),
    "huge int": config_case(r"'vocab_size' must be <= 2147483647: 10{30}", vocab_size=10**30),
    "huge int RoPE base": config_case(
        r"'rope_theta' must be finite",
        rope_parameters={"rope_type": "default", "rope_theta": 10**400},
    ),
    "int of 5,000 digits": Case(
        single_file(
            **{
                CONFIG_FILE: config_bytes().replace(
                    b'"vocab_size": 8', b'"vocab_size": ' + b"9" * 5000
                )
            }
        ),
        CONFIG_FILE,
        None,
        r"not valid JSON",
    ),
    "float where an int belongs": config_case(
        r"'hidden_size' must be an int: 8\.0", hidden_size=8.0
    ),
    "bool where an int belongs": config_case(
        r"'num_hidden_layers' must be an int: True", num_hidden_layers=True
    ),
    "zero heads": config_case(r"'num_attention_heads' must be >= 1: 0", num_attention_heads=0),
    "heads not a multiple of kv heads": config_case(
        r"'num_attention_heads' must be a multiple of 'num_key_value_heads' \(2\): 3",
        num_attention_heads=3,
        num_key_value_heads=2,
    ),
    "odd head_dim": config_case(r"'head_dim' must be even", head_dim=5),
    "yarn RoPE": config_case(
        r"'rope_parameters': 'rope_type' must be 'default'.*'yarn'",
        rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e6},
    ),
    "linear RoPE, transformers 4 layout": config_case(
        r"'rope_scaling': 'rope_type' must be 'default'.*'linear'",
        rope_parameters=None,
        rope_theta=1e6,
        rope_scaling={"type": "linear", "factor": 2.0},
    ),
    "llama3 RoPE": config_case(
        r"'rope_type' must be 'default'.*'llama3'", rope_parameters={"rope_type": "llama3"}
    ),
    "dynamic RoPE": config_case(
        r"'rope_type' must be 'default'.*'dynamic'", rope_parameters={"rope_type": "dynamic"}
    ),
    "RoPE parameters per layer type": config_case(
        r"one set of parameters, not one per layer type: \['full_attention'\]",
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e6}},
    ),
    "both RoPE layouts set": config_case(
        r"at most one of 'rope_parameters' and 'rope_scaling'",
        rope_scaling={"rope_type": "default", "rope_theta": 5.0},
    ),
    "partial rotary": config_case(
        r"'partial_rotary_factor' must be 1\.0", partial_rotary_factor=0.5
    ),
    "sliding window from a layer": config_case(
        r"'max_window_layers' must be an int >= 'num_hidden_layers' \(2\) while "
        r"'use_sliding_window' is true and 'sliding_window' is 4096 .*: 1",
        use_sliding_window=True,
        max_window_layers=1,
    ),
    "string sliding window": config_case(
        r"'use_sliding_window' must be a bool: 'false'", use_sliding_window="false"
    ),
    "sliding layer types": config_case(
        r"'layer_types' must list only \['full_attention'\] while 'use_sliding_window' is "
        r"true and 'sliding_window' is 8 .*'sliding_attention'\]",
        layer_types=["full_attention", "sliding_attention"],
        use_sliding_window=True,
        sliding_window=8,
    ),
    "another layer type": config_case(
        r"'layer_types' must list only \['full_attention', 'sliding_attention'\] .*chunked",
        layer_types=["full_attention", "chunked_attention"],
    ),
    "layer types of the wrong length": config_case(
        r"'layer_types' must have one entry per layer \(2\): 1", layer_types=["full_attention"]
    ),
    "another activation": config_case(
        r"'hidden_act' must be one of \['silu', 'swish'\] \(SiLU\): 'gelu'", hidden_act="gelu"
    ),
    "missing config": Case(
        {WEIGHTS_FILE: encode_safetensors(tensors_of(TINY))}, CONFIG_FILE, None, r"cannot read"
    ),
    "no weights": Case({CONFIG_FILE: config_bytes()}, ".", None, r"has neither"),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_a_hostile_checkpoint_is_a_checkpoint_error_naming_file_and_tensor(
    case: Case, tmp_path: Path
) -> None:
    for name, data in case.files.items():
        (tmp_path / name).write_bytes(data)
    with pytest.raises(CheckpointError, match=case.match) as info:
        load_checkpoint(tmp_path)
    message = str(info.value)
    named = tmp_path if case.file == "." else tmp_path / case.file
    assert str(named) in message
    if case.tensor is not None:
        assert repr(case.tensor) in message
    assert isinstance(info.value, InvalidInputError)
    assert info.value.__cause__ is None  # the parser's own exception does not leak through


def test_the_base_of_the_hostile_cases_is_valid(tmp_path: Path) -> None:
    for files in (single_file(), sharded()):
        for name, data in files.items():
            (tmp_path / name).write_bytes(data)
        loaded = load_checkpoint(tmp_path)
        assert loaded.config == TINY
        for name, array in tensors_of(TINY).items():
            np.testing.assert_array_equal(loaded.tensors[name].array, array)
        for name in files:
            (tmp_path / name).unlink()


def write(directory: Path, files: dict[str, bytes]) -> Path:
    for name, data in files.items():
        (directory / name).write_bytes(data)
    return directory


def test_a_stored_lm_head_is_used_even_when_the_config_ties_it_as_in_transformers(
    tmp_path: Path,
) -> None:
    # transformers 5 ties only when lm_head.weight is absent: a stored one is the LM head.
    tensors = tensors_of(TINY) | {"lm_head.weight": np.full((8, 8), 0.5, np.float32)}
    write(tmp_path, single_file(**{WEIGHTS_FILE: encode_safetensors(tensors)}))
    loaded = load_checkpoint(tmp_path)
    assert read_config(tmp_path).tie_word_embeddings
    assert loaded.config == attrs.evolve(TINY, tie_word_embeddings=False)
    assert set(loaded.tensors) == set(expected_tensors(loaded.config))
    np.testing.assert_array_equal(loaded.tensors["lm_head.weight"].array, tensors["lm_head.weight"])


def test_a_tied_checkpoint_may_store_its_one_matrix_as_the_lm_head_as_in_transformers(
    tmp_path: Path,
) -> None:
    tensors = tensors_of(TINY)
    tensors["lm_head.weight"] = tensors.pop("model.embed_tokens.weight")
    write(tmp_path, single_file(**{WEIGHTS_FILE: encode_safetensors(tensors)}))
    loaded = load_checkpoint(tmp_path)
    assert loaded.config == TINY
    assert set(loaded.tensors) == set(expected_tensors(TINY))
    embedding = loaded.tensors["model.embed_tokens.weight"].array
    np.testing.assert_array_equal(embedding, tensors["lm_head.weight"])


def test_a_base_models_checkpoint_loads_as_transformers_loads_it_into_a_causal_lm(
    tmp_path: Path,
) -> None:
    # Qwen3Model.save_pretrained stores the tensors without "model."; Qwen3ForCausalLM adds
    # it, and a tied config takes the LM head from the embedding.
    tensors = tensors_of(TINY)
    base = {name.removeprefix("model."): array for name, array in tensors.items()}
    write(tmp_path, single_file(**{WEIGHTS_FILE: encode_safetensors(base)}))
    loaded = load_checkpoint(tmp_path)
    assert loaded.config == TINY
    assert set(loaded.tensors) == set(expected_tensors(TINY))
    for name, array in tensors.items():
        np.testing.assert_array_equal(loaded.tensors[name].array, array)
    # Untied, it has no LM head: refused, saying why.
    untied = tmp_path / "untied"
    untied.mkdir()
    config = json.dumps(attrs.evolve(TINY, tie_word_embeddings=False).to_hf_config()).encode()
    write(untied, {CONFIG_FILE: config, WEIGHTS_FILE: encode_safetensors(base)})
    with pytest.raises(CheckpointError, match=r"'lm_head\.weight' .*checkpoint of a base model"):
        load_checkpoint(untied)


def test_a_base_model_transformers_saved_gives_its_causal_lms_logits(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers", reason="the parity oracle")
    torch = pytest.importorskip("torch", reason="transformers runs on torch")
    config = transformers.Qwen3Config(**TINY.to_hf_config())  # tied
    torch.manual_seed(0)
    model = transformers.Qwen3ForCausalLM(config).eval()
    model.model.save_pretrained(tmp_path)
    ids = [3, 1, 7, 0, 5]
    with torch.no_grad():
        expected = model(torch.tensor([ids])).logits[0, -1].numpy()
    backend = load_backend("reference", checkpoint=str(tmp_path))
    result = execute_schedule(plan_one_shot([len(ids)]), backend, [np.array(ids)])
    assert result.logits is not None
    np.testing.assert_allclose(result.logits[0], expected, atol=1e-5)


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("bias", [False, True])
def test_the_tensor_table_is_what_transformers_saves(tied: bool, bias: bool) -> None:
    transformers = pytest.importorskip("transformers", reason="the oracle of the names")
    pytest.importorskip("torch", reason="transformers runs on torch")
    config = attrs.evolve(TINY, tie_word_embeddings=tied, attention_bias=bias)
    model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**config.to_hf_config()))
    saved = {name: tuple(tensor.shape) for name, tensor in model.state_dict().items()}
    if tied:  # the state dict lists the tied head; the checkpoint need not store it
        del saved[LM_HEAD]
    assert expected_tensors(config) == saved


@pytest.mark.parametrize("bias", [False, True])
def test_the_layers_tensors_and_the_three_others_are_every_expected_tensor(bias: bool) -> None:
    config = attrs.evolve(TINY, tie_word_embeddings=False, attention_bias=bias)
    layers = [layer_tensor_names(config, i) for i in range(config.num_hidden_layers)]
    for i, names in enumerate(layers):
        assert list(names) == [r for r in LAYER_TENSORS if bias or not r.endswith("_bias")]
        assert all(name.startswith(f"model.layers.{i}.") for name in names.values())
    named = [EMBED_TOKENS, FINAL_NORM, LM_HEAD, *(n for names in layers for n in names.values())]
    assert named == list(expected_tensors(config))


#: Where a Qwen3 tensor name may be spelled: the tensor table, and nowhere else.
TABLE = Path(__file__).resolve().parent.parent / "pypto_sched" / "models" / "qwen3.py"
#: What only a tensor name contains (a role such as ``"q_proj"`` is not a name).
TENSOR_NAME_PART = re.compile(r"\.weight\b|\.bias\b|model\.layers|embed_tokens\.|lm_head\.|"
                              r"layernorm|_proj\.|_norm\.")  # fmt: skip


def _spelled_tensor_names(source: str) -> list[str]:
    """The string literals of ``source`` (f-string parts included, docstrings not) that spell
    part of a tensor name, as ``line: literal``."""
    tree = ast.parse(source)
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
    }
    return [
        f"{node.lineno}: {node.value!r}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in docstrings
        and TENSOR_NAME_PART.search(node.value)
    ]


def test_only_the_tensor_table_spells_a_tensor_name() -> None:
    repo = TABLE.parents[2]
    sources = [
        *(repo / "pypto_sched").rglob("*.py"),
        *repo.glob("backends/*/pypto_sched_*/**/*.py"),
    ]
    assert len(sources) > 40
    assert TABLE in sources
    spelled = {
        str(path.relative_to(repo)): found
        for path in sources
        if path != TABLE and (found := _spelled_tensor_names(path.read_text()))
    }
    assert not spelled, f"tensor names outside {TABLE.name}'s table: {spelled}"


def test_the_tensor_name_checker_sees_names_and_passes_roles_and_docstrings() -> None:
    assert _spelled_tensor_names(TABLE.read_text())
    built = 'def f(i):\n    return f"model.layers.{i}.input_layernorm.weight"\n'
    assert _spelled_tensor_names(built) == ["2: 'model.layers.'", "2: '.input_layernorm.weight'"]
    assert _spelled_tensor_names('x = attn + "q_norm.weight"\n') == ["1: 'q_norm.weight'"]
    documented = 'def f(names):\n    """Reads ``lm_head.weight``."""\n    return names["q_proj"]\n'
    assert _spelled_tensor_names(documented) == []


def test_an_untied_checkpoint_without_the_embedding_is_refused(tmp_path: Path) -> None:
    untied = attrs.evolve(TINY, tie_word_embeddings=False)
    tensors = tensors_of(untied)
    del tensors["model.embed_tokens.weight"]
    config = json.dumps(untied.to_hf_config()).encode()
    write(tmp_path, {CONFIG_FILE: config, WEIGHTS_FILE: encode_safetensors(tensors)})
    with pytest.raises(CheckpointError, match=r"tensor 'model\.embed_tokens\.weight' is in none"):
        load_checkpoint(tmp_path)


def test_a_directory_that_does_not_exist_is_named(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match=rf"{tmp_path / 'nowhere'}: .* does not exist"):
        load_checkpoint(tmp_path / "nowhere")


def test_a_tensor_asked_for_that_a_file_lacks_is_named(tmp_path: Path) -> None:
    path = tmp_path / "x.safetensors"
    path.write_bytes(encode_safetensors({"a": np.zeros(2)}))
    with pytest.raises(CheckpointError, match=rf"{path}: tensor 'b' is not in the file"):
        read_safetensors(path, ["b"])


# -- config.json: both layouts, defaults, what is accepted -----------------------------------


def test_both_rope_layouts_give_the_same_base() -> None:
    v5 = TINY.to_hf_config() | {"rope_parameters": {"rope_type": "default", "rope_theta": 5e5}}
    v4 = {k: v for k, v in v5.items() if k != "rope_parameters"} | {
        "rope_theta": 5e5,
        "rope_scaling": None,
    }
    assert ModelConfig.from_hf_config(v5).rope_theta == 5e5
    assert ModelConfig.from_hf_config(v4) == ModelConfig.from_hf_config(v5)


def test_the_rope_parameters_base_wins_over_a_top_level_one_as_in_transformers() -> None:
    data = TINY.to_hf_config() | {"rope_theta": 7.0}
    data["rope_parameters"] = {"rope_type": "default", "rope_theta": 9.0}
    assert ModelConfig.from_hf_config(data).rope_theta == 9.0
    data["rope_parameters"] = {"rope_type": "default"}
    assert ModelConfig.from_hf_config(data).rope_theta == 7.0


def test_absent_fields_take_transformers_defaults() -> None:
    config = ModelConfig.from_hf_config({"model_type": "qwen3"})
    assert config == ModelConfig()
    assert (config.num_key_value_heads, config.head_dim, config.rope_theta) == (32, 128, 10_000.0)


def test_null_kv_heads_means_one_per_attention_head_as_in_transformers() -> None:
    data = {"model_type": "qwen3", "num_attention_heads": 8, "num_key_value_heads": None}
    assert ModelConfig.from_hf_config(data).num_key_value_heads == 8


def test_to_hf_config_round_trips() -> None:
    config = attrs.evolve(TINY, rope_theta=123.0, attention_bias=True)
    assert ModelConfig.from_hf_config(config.to_hf_config()) == config


def test_model_config_validators_name_field_rule_and_value() -> None:
    with pytest.raises(InvalidInputError, match="'hidden_size' must be >= 1: 0"):
        ModelConfig(hidden_size=0)
    with pytest.raises(InvalidInputError, match="'rms_norm_eps' must be finite: nan"):
        ModelConfig(rms_norm_eps=math.nan)
    with pytest.raises(InvalidInputError, match="'tie_word_embeddings' must be a bool: 0"):
        ModelConfig(tie_word_embeddings=0)  # type: ignore[arg-type]


# -- safetensors: properties and agreement with the safetensors library ----------------------

_NUMPY_TAGS = sorted(tag for tag in SAFETENSORS_DTYPES if tag != "BF16")


@st.composite
def tensor_sets(draw: st.DrawFn) -> dict[str, np.ndarray]:
    names = draw(st.lists(st.text(min_size=1, max_size=8), min_size=0, max_size=4, unique=True))
    result = {}
    for name in names:
        if name == "__metadata__":
            continue
        dtype = SAFETENSORS_DTYPES[draw(st.sampled_from(_NUMPY_TAGS))]
        shape = tuple(draw(st.lists(st.integers(0, 3), max_size=3)))
        raw = draw(st.binary(min_size=math.prod(shape) * dtype.itemsize,
                             max_size=math.prod(shape) * dtype.itemsize))  # fmt: skip
        result[name] = np.frombuffer(raw, dtype=dtype).reshape(shape)
    return result


@settings(max_examples=40)
@given(tensors=tensor_sets(), metadata=st.dictionaries(st.text(max_size=4), st.text(max_size=4)))
def test_encoding_then_reading_returns_every_tensor_bit_for_bit(
    tensors: dict[str, np.ndarray], metadata: dict[str, str], tmp_path_factory: Any
) -> None:
    path = tmp_path_factory.mktemp("roundtrip") / "x.safetensors"
    path.write_bytes(encode_safetensors(tensors, metadata=metadata))
    read = read_safetensors(path)
    assert read.keys() == tensors.keys()
    for name, array in tensors.items():
        assert read[name].array.dtype == array.dtype.newbyteorder("<")
        assert read[name].array.tobytes() == array.tobytes()
        assert not read[name].array.flags.writeable


@settings(max_examples=150)
@given(
    position=st.integers(0, 10**6),
    value=st.integers(0, 255),
    cut=st.none() | st.integers(0, 10**6),
)
def test_no_damage_to_a_valid_file_escapes_as_anything_but_a_checkpoint_error(
    position: int, value: int, cut: int | None, tmp_path_factory: Any
) -> None:
    valid = encode_safetensors(
        {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.zeros(0, np.int8)},
        metadata={"format": "pt"},
    )
    damaged = bytearray(valid)
    damaged[position % len(damaged)] = value
    if cut is not None:
        damaged = damaged[: cut % (len(damaged) + 1)]
    path = tmp_path_factory.mktemp("damaged") / "x.safetensors"
    path.write_bytes(bytes(damaged))
    try:
        tensors = read_safetensors(path)
    except CheckpointError as error:
        message: str | None = str(error)
    else:  # the damage left a valid file: it reads back as what the header now says
        message = None
        assert all(t.array.shape == t.shape for t in tensors.values())
    assert message is None or str(path) in message


def test_a_0d_array_round_trips_0d_as_the_safetensors_library_writes_it(tmp_path: Path) -> None:
    path = tmp_path / "x.safetensors"
    path.write_bytes(encode_safetensors({"s": np.array(3.5, np.float32)}))
    read = read_safetensors(path)["s"]
    assert (read.shape, read.array.shape, float(read.array)) == ((), (), 3.5)
    library = pytest.importorskip("safetensors.numpy", reason="safetensors is a test extra")
    assert library.load_file(str(path))["s"].shape == ()
    assert library.save({"s": np.array(3.5, np.float32)}) == path.read_bytes()


@pytest.mark.parametrize(
    ("tensors", "metadata", "match"),
    [
        ({"w": np.zeros(2, np.float32)}, {"a": 1}, r"^'metadata' must map strings to strings: "
         r"'a' maps to 1$"),
        ({"w": np.zeros(2, np.float32)}, ["a"], r"^'metadata' must map strings to strings: list$"),
        ({"w": np.zeros(2, np.float32)}, {"a": "\ud800"}, r"^'metadata' must hold valid Unicode"),
        ({"__metadata__": np.zeros(2, np.float32)}, None, r"other than '__metadata__': "
         r"'__metadata__'$"),
        ({"\udc80": np.zeros(2, np.float32)}, None, r"strs of valid Unicode"),
        ({1: np.zeros(2, np.float32)}, None, r"strs of valid Unicode .*: 1$"),
        ({"w": Tensor(name="w", dtype="BF16", shape=(2,), array=np.zeros(2, np.float32))},
         None, r"^tensor 'w': a BF16 tensor must hold a uint16 array \(BF16: its raw bits\): "
         r"float32$"),
        ({"w": Tensor(name="w", dtype="XX", shape=(2,), array=np.zeros(2, np.uint8))},
         None, r"^tensor 'w': dtype tag 'XX' cannot be written \(writable: \['BF16'"),
        ({"w": Tensor(name="w", dtype="F8_E4M3", shape=(2,), array=np.zeros(2, np.uint8))},
         None, r"^tensor 'w': dtype tag 'F8_E4M3' cannot be written"),
        ({"w": Tensor(name="w", dtype="U8", shape=(7,), array=np.zeros(2, np.uint8))},
         None, r"^tensor 'w': its shape \(7,\) is not its array's \(2,\)$"),
        ({"w": np.zeros(2, np.complex64)}, None, r"^tensor 'w': dtype complex64 cannot be "),
    ],
)  # fmt: skip
def test_encoding_refuses_what_the_reader_would_naming_the_entry(
    tensors: dict[Any, Any], metadata: Any, match: str
) -> None:
    with pytest.raises(InvalidInputError, match=match):
        encode_safetensors(tensors, metadata=metadata)


@pytest.mark.parametrize(
    "shape", [[0, 10**30], [1] * 65], ids=["a dimension beyond NumPy's", "65 dimensions"]
)
def test_a_shape_valid_in_the_format_but_beyond_numpy_is_a_checkpoint_error(
    shape: list[int], tmp_path: Path
) -> None:
    path = tmp_path / "x.safetensors"
    size = 0 if 0 in shape else 4
    path.write_bytes(raw_file({"w": entry(shape=shape, offsets=(0, size))}, bytes(size)))
    assert read_safetensors_header(path).tensors["w"].shape == tuple(shape)  # the format's
    with pytest.raises(CheckpointError, match=r"tensor 'w' cannot be read: its shape .* is "
                       r"beyond what NumPy holds") as info:  # fmt: skip
        read_safetensors(path)
    assert str(path) in str(info.value)


def test_names_given_as_one_str_are_refused_not_read_letter_by_letter(tmp_path: Path) -> None:
    path = tmp_path / "x.safetensors"
    path.write_bytes(encode_safetensors({"weight": np.zeros(2, np.float32)}))
    assert list(read_safetensors(path, names=["weight"])) == ["weight"]
    with pytest.raises(InvalidInputError, match=r"^'names' must be an iterable of tensor names "
                       r"\(\[name\] for one\): 'weight'$"):  # fmt: skip
        read_safetensors(path, names="weight")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes are POSIX")
@pytest.mark.parametrize(
    ("name", "call"),
    [
        (WEIGHTS_FILE, "read_safetensors({file!r})"),
        (WEIGHTS_FILE, "read_safetensors_header({file!r})"),
        (CONFIG_FILE, "load_checkpoint({directory!r})"),
    ],
)
def test_a_named_pipe_is_refused_not_waited_on(name: str, call: str, tmp_path: Path) -> None:
    # In a child process: were the pipe opened to be read, it would wait for a writer forever.
    write(tmp_path, single_file())
    (tmp_path / name).unlink()
    os.mkfifo(tmp_path / name)
    run = call.format(file=str(tmp_path / name), directory=str(tmp_path))
    code = (
        "from pypto_sched import CheckpointError\n"
        "from pypto_sched.checkpoints import *\n"
        f"try:\n    {run}\n"
        "except CheckpointError as error:\n    print(error)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.strip() == f"{tmp_path / name}: not a regular file"


def test_bfloat16_is_returned_as_bits_and_widened_exactly(tmp_path: Path) -> None:
    values = np.array([[1.0, -2.5], [0.15625, 2.0**120]], dtype=np.float32)  # exact in bf16
    bits = (values.view("<u4") >> 16).astype("<u2")
    path = tmp_path / "x.safetensors"
    path.write_bytes(
        encode_safetensors({"x": Tensor(name="x", dtype="BF16", shape=(2, 2), array=bits)})
    )
    tensor = read_safetensors(path)["x"]
    assert (tensor.dtype, tensor.array.dtype) == ("BF16", np.dtype("<u2"))
    np.testing.assert_array_equal(tensor.array, bits)
    widened = tensor.widened()
    assert widened.dtype == np.float32
    np.testing.assert_array_equal(widened, values)


def test_tensors_of_dtypes_numpy_lacks_are_valid_in_a_file_and_refused_only_when_read(
    tmp_path: Path,
) -> None:
    # Masks, float8 scales and the like that the model never reads must not spoil the file.
    tensors = tensors_of(TINY) | {"extra.mask": np.zeros(4, np.float32)}
    weights = retagged(tensors, "extra.mask", "BOOL")
    write(tmp_path, single_file(**{WEIGHTS_FILE: weights}))
    loaded = load_checkpoint(tmp_path)
    assert "extra.mask" not in loaded.tensors
    path = tmp_path / WEIGHTS_FILE
    assert read_safetensors(path, [NORM])[NORM].shape == (8,)
    with pytest.raises(CheckpointError, match=r"tensor 'extra\.mask' cannot be read: .* BOOL"):
        read_safetensors(path, ["extra.mask"])


def test_files_the_safetensors_library_writes_with_dtypes_numpy_lacks_are_valid(
    tmp_path: Path,
) -> None:
    torch = pytest.importorskip("torch", reason="the library writes float8 from torch")
    library = pytest.importorskip("safetensors.torch", reason="safetensors is a test extra")
    path = tmp_path / "x.safetensors"
    tensors = {
        "w": torch.arange(6, dtype=torch.float32).reshape(2, 3),
        "mask": torch.ones(5, dtype=torch.bool),
        "scale": torch.ones(3).to(torch.float8_e4m3fn),
    }
    library.save_file(tensors, str(path))
    header = read_safetensors_header(path)
    assert {name: info.dtype for name, info in header.tensors.items()} == {
        "w": "F32",
        "mask": "BOOL",
        "scale": "F8_E4M3",
    }
    np.testing.assert_array_equal(read_safetensors(path, ["w"])["w"].array, tensors["w"].numpy())


def test_float16_is_widened_to_float32() -> None:
    half = np.array([1.5, -0.25], dtype=np.float16)
    tensor = Tensor(name="h", dtype="F16", shape=(2,), array=half)
    assert tensor.widened().dtype == np.float32
    np.testing.assert_array_equal(tensor.widened(), half.astype(np.float32))


def test_files_agree_with_the_safetensors_library(tmp_path: Path) -> None:
    library = pytest.importorskip("safetensors.numpy", reason="safetensors is a test extra")
    arrays: dict[str, np.ndarray] = {
        "w": np.arange(12, dtype=np.float32).reshape(3, 4),
        "b": np.arange(5, dtype=np.int64),
        "h": np.linspace(0, 1, 7).astype(np.float16),
        "empty": np.zeros((0, 2), dtype=np.float64),
    }
    theirs, ours = tmp_path / "theirs.safetensors", tmp_path / "ours.safetensors"
    library.save_file(arrays, str(theirs), metadata={"format": "np"})
    ours.write_bytes(encode_safetensors(arrays, metadata={"format": "np"}))
    for name, tensor in read_safetensors(theirs).items():
        np.testing.assert_array_equal(tensor.array, arrays[name])
    for name, array in library.load_file(str(ours)).items():
        np.testing.assert_array_equal(array, arrays[name])


@pytest.mark.parametrize(
    "header",
    [
        {"a": entry(offsets=(-4, 0))},
        {"a": entry(offsets=(0, 4)), "b": entry(offsets=(2, 6))},
        {"a": entry(offsets=(0, 4)), "b": entry(offsets=(8, 12))},
    ],
    ids=["negative", "overlapping", "gap"],
)
def test_what_the_safetensors_library_rejects_we_reject(header: Any, tmp_path: Path) -> None:
    library = pytest.importorskip("safetensors.numpy", reason="safetensors is a test extra")
    path = tmp_path / "x.safetensors"
    path.write_bytes(raw_file(header, bytes(12)))
    with pytest.raises(Exception):  # noqa: B017, PT011 -- the library's own error types vary
        library.load_file(str(path))
    with pytest.raises(CheckpointError, match=str(path)):
        read_safetensors(path)


# -- parity with transformers.Qwen3Config ----------------------------------------------------

#: Values under which any subset of fields is a valid config: absent kv heads are 32, null
#: ones num_attention_heads, and 32 divides every num_attention_heads drawn.
FIELD_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "vocab_size": st.integers(1, 300_000),
    "hidden_size": st.integers(1, 10_000),
    "intermediate_size": st.integers(1, 40_000),
    "num_hidden_layers": st.integers(1, 100),
    "num_attention_heads": st.sampled_from([32, 64, 96, 128]),
    "num_key_value_heads": st.none() | st.sampled_from([1, 2, 4, 8, 16, 32]),
    "head_dim": st.integers(1, 256).map(lambda n: 2 * n),
    "rms_norm_eps": st.floats(1e-12, 1e-2),
    "rope_theta": st.floats(1.0, 1e7) | st.integers(1, 10**7),
    "max_position_embeddings": st.integers(1, 10**6),
    "tie_word_embeddings": st.booleans(),
    "attention_bias": st.booleans(),
}


def _hf_fields(config: Any) -> dict[str, Any]:
    """Every ModelConfig field as transformers' Qwen3Config holds it."""
    fields = {
        f.name: getattr(config, f.name) for f in attrs.fields(ModelConfig) if f.name != "rope_theta"
    }
    return fields | {"rope_theta": config.rope_parameters["rope_theta"]}


@settings(max_examples=30)
@given(values=st.fixed_dictionaries({}, optional=FIELD_VALUES))
def test_configs_transformers_saves_read_as_transformers_reads_them(
    values: dict[str, Any], tmp_path_factory: Any
) -> None:
    transformers = pytest.importorskip("transformers", reason="the parity oracle")
    directory = tmp_path_factory.mktemp("config")
    transformers.Qwen3Config(**values).save_pretrained(directory)
    ours = read_config(directory)
    theirs = transformers.Qwen3Config.from_pretrained(directory)
    assert attrs.asdict(ours) == _hf_fields(theirs)


@settings(max_examples=30)
@given(
    st.fixed_dictionaries({}, optional=FIELD_VALUES),
    st.sampled_from(["transformers 5", "transformers 4", "no rope"]),
)
def test_partial_configs_in_either_layout_read_as_transformers_reads_them(
    values: dict[str, Any], layout: str
) -> None:
    transformers = pytest.importorskip("transformers", reason="the parity oracle")
    data: dict[str, Any] = {k: v for k, v in values.items() if k != "rope_theta"}
    data["model_type"] = "qwen3"
    theta = values.get("rope_theta")
    if layout == "transformers 5" and theta is not None:
        data["rope_parameters"] = {"rope_type": "default", "rope_theta": theta}
    elif layout == "transformers 4" and theta is not None:
        data |= {"rope_theta": theta, "rope_scaling": None}
    ours = ModelConfig.from_hf_config(json.loads(json.dumps(data)))
    theirs = transformers.Qwen3Config.from_dict(json.loads(json.dumps(data)))
    assert attrs.asdict(ours) == _hf_fields(theirs)


@st.composite
def attention_fields(draw: st.DrawFn) -> dict[str, Any]:
    """The fields transformers decides sliding-window attention by, any of them absent."""
    layers = draw(st.integers(1, 4))
    kinds = st.sampled_from(["full_attention", "sliding_attention"])
    optional = {
        "use_sliding_window": st.booleans(),
        "sliding_window": st.none() | st.integers(1, 64),
        "max_window_layers": st.integers(0, 5),
        "layer_types": st.lists(kinds, min_size=layers, max_size=layers),
    }
    return {"num_hidden_layers": layers} | draw(st.fixed_dictionaries({}, optional=optional))


def _some_layer_slides(config: Any) -> bool:
    """Whether transformers' Qwen3 gives some layer a window (its attention layers take
    ``config.sliding_window`` where ``layer_types`` says sliding)."""
    return config.sliding_window is not None and "sliding_attention" in config.layer_types


@settings(max_examples=40)
@given(values=attention_fields(), saved=st.booleans())
def test_a_config_is_refused_exactly_when_transformers_gives_some_layer_a_sliding_window(
    values: dict[str, Any], saved: bool, tmp_path_factory: Any
) -> None:
    transformers = pytest.importorskip("transformers", reason="the parity oracle")
    if saved:  # as transformers writes it: layer_types always, the window only when used
        directory = tmp_path_factory.mktemp("config")
        transformers.Qwen3Config(**values).save_pretrained(directory)
        data = json.loads((directory / CONFIG_FILE).read_text())
    else:
        data = {"model_type": "qwen3", **values}
    theirs = transformers.Qwen3Config.from_dict(json.loads(json.dumps(data)))
    if _some_layer_slides(theirs):
        with pytest.raises(CheckpointError, match=r"\(sliding-window .*not implemented\)"):
            ModelConfig.from_hf_config(data)
    else:
        assert ModelConfig.from_hf_config(data).num_hidden_layers == theirs.num_hidden_layers


def test_swish_is_silu_as_in_transformers() -> None:
    # transformers' ACT2FN maps "swish" to torch's SiLU; the logits tests run such a model.
    transformers = pytest.importorskip("transformers", reason="the parity oracle")
    data = transformers.Qwen3Config(hidden_act="swish").to_dict()
    assert ModelConfig.from_hf_config(data) == ModelConfig()
