"""The loader reads tied, untied and sharded checkpoints in any float dtype, and every problem
is a CheckpointError naming the file (and, for weights, the tensor)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from pypto_sched_npu import (
    CheckpointError,
    NpuBackend,
    Qwen3Config,
    expected_tensors,
    load_checkpoint,
)

Edit = Callable[[Path], None]


@pytest.fixture
def copy_of(checkpoints: dict[str, Path], tmp_path: Path) -> Callable[[str], Path]:
    """A writable copy of one of the session's checkpoints."""

    def make(name: str) -> Path:
        target = tmp_path / name
        shutil.copytree(checkpoints[name], target)
        return target

    return make


def _edit_config(directory: Path, **changes: object) -> None:
    path = directory / "config.json"
    data = json.loads(path.read_text())
    for key, value in changes.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    path.write_text(json.dumps(data))


def _rewrite_weights(directory: Path, edit: Callable[[dict[str, torch.Tensor]], None]) -> None:
    path = directory / "model.safetensors"
    tensors = load_file(path)
    edit(tensors)
    save_file(tensors, path, metadata={"format": "pt"})


def test_loads_tied_untied_and_sharded_checkpoints(checkpoints: dict[str, Path]) -> None:
    tied = load_checkpoint(checkpoints["tied"])
    assert tied.config.tie_word_embeddings
    assert "lm_head.weight" not in tied.tensors
    untied = load_checkpoint(checkpoints["untied"])
    assert untied.config.attention_bias
    assert not untied.config.tie_word_embeddings
    assert set(untied.tensors) == set(expected_tensors(untied.config))
    assert (checkpoints["sharded"] / "model.safetensors.index.json").is_file()
    sharded = load_checkpoint(checkpoints["sharded"], dtype=torch.float16)
    assert {t.dtype for t in sharded.tensors.values()} == {torch.float16}
    assert sharded.config.head_dim == 32


def test_reads_the_config_fields_the_forward_needs(checkpoints: dict[str, Path]) -> None:
    config = Qwen3Config.from_file(checkpoints["untied"] / "config.json")
    assert (config.num_heads, config.num_kv_heads, config.head_dim) == (4, 1, 64)
    assert (config.hidden_size, config.intermediate_size, config.num_layers) == (96, 128, 2)
    assert config.rope_theta == 10000.0


def test_accepts_the_transformers_4_rope_spelling() -> None:
    data = {
        "architectures": ["Qwen3ForCausalLM"],
        "vocab_size": 8,
        "hidden_size": 8,
        "intermediate_size": 8,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "rope_theta": 500000.0,
        "rope_scaling": None,
    }
    config = Qwen3Config.from_dict(data)
    assert config.rope_theta == 500000.0
    assert (config.num_kv_heads, config.head_dim) == (2, 4)


@pytest.mark.parametrize("stored", [torch.float16, torch.bfloat16, torch.float32])
def test_weights_of_any_float_dtype_load_into_the_compute_dtype(
    stored: torch.dtype, copy_of: Callable[[str], Path]
) -> None:
    directory = copy_of("tied")
    original = load_file(directory / "model.safetensors")
    _rewrite_weights(directory, lambda t: t.update({k: v.to(stored) for k, v in t.items()}))
    loaded = load_checkpoint(directory, dtype=torch.float32)
    name = "model.layers.1.mlp.down_proj.weight"
    assert loaded.tensors[name].dtype == torch.float32
    assert torch.equal(loaded.tensors[name], original[name].to(stored).float())


def _missing_config(d: Path) -> None:
    (d / "config.json").unlink()


def _bad_json(d: Path) -> None:
    (d / "config.json").write_text("{not json")


def _llama(d: Path) -> None:
    _edit_config(d, architectures=["LlamaForCausalLM"], model_type="llama")


def _no_hidden_size(d: Path) -> None:
    _edit_config(d, hidden_size=None)


def _yarn(d: Path) -> None:
    _edit_config(d, rope_parameters={"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0})


def _sliding(d: Path) -> None:
    _edit_config(d, use_sliding_window=True)


def _no_weights(d: Path) -> None:
    (d / "model.safetensors").unlink()


def _missing_tensor(d: Path) -> None:
    def drop(tensors: dict[str, torch.Tensor]) -> None:
        del tensors["model.layers.1.self_attn.k_norm.weight"]

    _rewrite_weights(d, drop)


def _wrong_shape(d: Path) -> None:
    _rewrite_weights(d, lambda t: t.update({"model.norm.weight": torch.ones(63)}))


def _int_weights(d: Path) -> None:
    _rewrite_weights(
        d,
        lambda t: t.update(
            {"model.layers.0.mlp.up_proj.weight": torch.zeros(128, 64, dtype=torch.int8)}
        ),
    )


def _untied_without_head(d: Path) -> None:
    _edit_config(d, tie_word_embeddings=False)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (_missing_config, r"config\.json: the checkpoint has no config\.json"),
        (_bad_json, r"config\.json: not valid JSON"),
        (_llama, r"config\.json: 'architectures' must include 'Qwen3ForCausalLM'.*Llama"),
        (_no_hidden_size, r"config\.json: missing required key 'hidden_size'"),
        (_yarn, r"config\.json: only the default rotary embedding.*'yarn'"),
        (_sliding, r"config\.json: 'use_sliding_window' must be false"),
        (_no_weights, r"has neither model\.safetensors nor model\.safetensors\.index\.json"),
        (
            _missing_tensor,
            r"tensor 'model\.layers\.1\.self_attn\.k_norm\.weight' is in none of "
            r"\['model\.safetensors'\]",
        ),
        (
            _wrong_shape,
            r"model\.safetensors: tensor 'model\.norm\.weight' must have shape "
            r"\[64\] for this config: \[63\]",
        ),
        (
            _int_weights,
            r"model\.safetensors: tensor 'model\.layers\.0\.mlp\.up_proj\.weight' "
            r"must be float32, float16 or bfloat16: I8",
        ),
        (_untied_without_head, r"tensor 'lm_head\.weight' is in none of"),
    ],
    ids=lambda value: getattr(value, "__name__", "message").strip("_"),
)
def test_a_broken_checkpoint_names_the_file_and_the_tensor(
    edit: Edit, message: str, copy_of: Callable[[str], Path]
) -> None:
    directory = copy_of("tied")
    edit(directory)
    with pytest.raises(CheckpointError, match=message):
        NpuBackend.from_checkpoint(directory)


def test_a_missing_directory_is_named(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="the checkpoint directory does not exist"):
        load_checkpoint(tmp_path / "nowhere")


def test_a_missing_shard_names_the_shard_and_a_tensor_in_it(
    copy_of: Callable[[str], Path],
) -> None:
    directory = copy_of("sharded")
    index = json.loads((directory / "model.safetensors.index.json").read_text())
    name, shard = sorted(index["weight_map"].items())[0]
    (directory / shard).unlink()
    with pytest.raises(CheckpointError, match=rf"{shard}: shard listed in .* for '{name}'"):
        load_checkpoint(directory)


def test_a_tensor_the_index_misplaces_names_the_shard(copy_of: Callable[[str], Path]) -> None:
    directory = copy_of("sharded")
    path = directory / "model.safetensors.index.json"
    index = json.loads(path.read_text())
    shards = sorted(set(index["weight_map"].values()))
    name = next(n for n, s in index["weight_map"].items() if s == shards[0])
    index["weight_map"][name] = shards[1]
    path.write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match=rf"{shards[1]}: tensor '{name}' is listed here"):
        load_checkpoint(directory)
