"""The loader reads tied, untied and sharded checkpoints in any float dtype through the shared
reader (pypto_sched.checkpoints), and every problem is a CheckpointError naming the file (and,
for weights, the tensor). The reader's own hostile-input table is tests/test_checkpoints.py;
this file checks what reaches the npu backend."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from pypto_sched import CheckpointError, PlannerConfig, plan_prefill
from pypto_sched.checkpoints import expected_tensors, read_config
from pypto_sched.execute import execute_schedule

pytest.importorskip("torch", reason="the npu backend runs on torch")
pytest.importorskip("safetensors", reason="the tests write checkpoints with it")

import torch
from safetensors.torch import load_file, save_file

from pypto_sched_npu import NpuBackend, load_checkpoint

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


def test_the_model_is_described_with_hugging_face_field_names(
    checkpoints: dict[str, Path], backends: Callable[..., NpuBackend]
) -> None:
    config = read_config(checkpoints["untied"])
    assert backends("untied").model.config == config
    assert (config.num_attention_heads, config.num_key_value_heads, config.head_dim) == (4, 1, 128)
    assert (config.hidden_size, config.intermediate_size, config.num_hidden_layers) == (96, 128, 2)
    # transformers 5 writes the RoPE base inside rope_parameters only.
    data = json.loads((checkpoints["untied"] / "config.json").read_text())
    assert "rope_theta" not in data
    assert data["rope_parameters"]["rope_theta"] == config.rope_theta == 500.0


def test_bfloat16_weights_keep_their_bits(checkpoints: dict[str, Path]) -> None:
    shard = sorted(checkpoints["sharded"].glob("model-*.safetensors"))[0]
    stored = load_file(shard)
    loaded = load_checkpoint(checkpoints["sharded"], dtype=torch.bfloat16)
    assert stored
    for name, tensor in stored.items():
        assert tensor.dtype == torch.bfloat16
        assert torch.equal(loaded.tensors[name], tensor)


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


def _assert_runs_as_transformers(directory: Path) -> None:
    """The checkpoint's chunked logits on the CPU path equal transformers' on it."""
    transformers = pytest.importorskip("transformers", reason="the oracle")
    backend = NpuBackend.from_checkpoint(directory, device="cpu", ops="torch")
    prompt = np.arange(40, dtype=np.int64) * 5 % backend.vocab_size
    schedule = plan_prefill([40], PlannerConfig(max_num_batched_tokens=16))
    logits = execute_schedule(schedule, backend, [prompt], page_size=4).logits
    model = transformers.Qwen3ForCausalLM.from_pretrained(directory, dtype=torch.float32)
    with torch.inference_mode():
        expected = model.eval()(input_ids=torch.from_numpy(prompt)[None]).logits[0, -1]
    assert logits is not None
    assert np.abs(logits[0] - expected.numpy()).max() <= 1e-4


def test_a_tied_config_with_a_stored_lm_head_runs_as_transformers_runs_it(
    copy_of: Callable[[str], Path],
) -> None:
    # An untied model whose config says tied: transformers uses the stored lm_head.
    directory = copy_of("untied")
    _edit_config(directory, tie_word_embeddings=True)
    _assert_runs_as_transformers(directory)


def test_a_tied_checkpoint_storing_only_the_lm_head_runs_as_transformers_runs_it(
    copy_of: Callable[[str], Path],
) -> None:
    # transformers ties the embedding to a stored lm_head.weight when the embedding is absent.
    directory = copy_of("tied")
    _rewrite_weights(
        directory, lambda t: t.update({"lm_head.weight": t.pop("model.embed_tokens.weight")})
    )
    _assert_runs_as_transformers(directory)


def _missing_config(d: Path) -> None:
    (d / "config.json").unlink()


def _bad_json(d: Path) -> None:
    (d / "config.json").write_text("{not json")


def _llama(d: Path) -> None:
    _edit_config(d, architectures=["LlamaForCausalLM"], model_type="llama")


def _string_boolean(d: Path) -> None:
    _edit_config(d, tie_word_embeddings="false")


def _no_hidden_size(d: Path) -> None:
    _edit_config(d, hidden_size=None)  # transformers' default, 4096, is not this model's


def _yarn(d: Path) -> None:
    _edit_config(d, rope_parameters={"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0})


def _sliding(d: Path) -> None:
    # transformers writes layer_types; a window applies to the layers they call sliding.
    layer_types = ["full_attention", "sliding_attention"]
    _edit_config(d, use_sliding_window=True, sliding_window=8, layer_types=layer_types)


def _bad_header(d: Path) -> None:
    path = d / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[8] = ord("[")  # the header is no longer a JSON object
    path.write_bytes(bytes(data))


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
        (_missing_config, r"config\.json: cannot read config\.json"),
        (_bad_json, r"config\.json is not valid JSON"),
        (_llama, r"config\.json: 'model_type' must be 'qwen3': 'llama'"),
        (_string_boolean, r"config\.json: 'tie_word_embeddings' must be a bool: 'false'"),
        (
            _no_hidden_size,
            r"model\.safetensors: tensor 'model\.embed_tokens\.weight' must have shape "
            r"\[101, 4096\] for this config: \[101, 64\]",
        ),
        (_yarn, r"config\.json: 'rope_parameters': 'rope_type' must be 'default'.*'yarn'"),
        (_sliding, r"config\.json: 'layer_types' must list only \['full_attention'\] while"),
        (_no_weights, r"has neither model\.safetensors nor model\.safetensors\.index\.json"),
        (_bad_header, r"model\.safetensors: the safetensors header is not valid JSON"),
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
            r"must be one of \['F64', 'F32', 'F16', 'BF16'\]: I8",
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
    with pytest.raises(CheckpointError, match=rf"{shard}: the shard .* lists for tensor '{name}'"):
        load_checkpoint(directory)


def test_a_tensor_the_index_misplaces_names_the_shard(copy_of: Callable[[str], Path]) -> None:
    directory = copy_of("sharded")
    path = directory / "model.safetensors.index.json"
    index = json.loads(path.read_text())
    shards = sorted(set(index["weight_map"].values()))
    name = next(n for n, s in index["weight_map"].items() if s == shards[0])
    index["weight_map"][name] = shards[1]
    path.write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match=rf"{shards[1]}: tensor '{name}' is listed in"):
        load_checkpoint(directory)
