"""Loading a Hugging Face Qwen3 checkpoint directory.

A checkpoint is ``config.json`` plus the weights, either one ``model.safetensors`` or the
shards that ``model.safetensors.index.json`` lists in its ``weight_map``. Every problem is a
:class:`CheckpointError` that names the file and, for weights, the tensor: a missing file, a
config of another architecture or with a missing or unsupported setting, a tensor missing,
of the wrong shape or of a dtype other than float32, float16 and bfloat16.

The expected tensors are data (:func:`expected_tensors`), derived from the config, so the
rules for names and shapes live in one table.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import torch
from safetensors import safe_open

from ._errors import CheckpointError

__all__ = [
    "CONFIG_FILE",
    "INDEX_FILE",
    "WEIGHTS_FILE",
    "Checkpoint",
    "Qwen3Config",
    "expected_tensors",
    "load_checkpoint",
]

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"

_ARCHITECTURE = "Qwen3ForCausalLM"
_WEIGHT_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


@attrs.frozen(kw_only=True)
class Qwen3Config:
    """The parts of a Qwen3 ``config.json`` the forward pass needs."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    tie_word_embeddings: bool
    attention_bias: bool

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, source: str = CONFIG_FILE) -> Qwen3Config:
        """Read and check a parsed ``config.json``; errors name ``source`` and the key."""
        architectures = data.get("architectures") or []
        if data.get("model_type") != "qwen3" and _ARCHITECTURE not in architectures:
            raise CheckpointError(
                f"{source}: 'architectures' must include {_ARCHITECTURE!r} (or 'model_type' "
                f"be 'qwen3'): architectures={architectures!r}, "
                f"model_type={data.get('model_type')!r}"
            )
        heads = _positive_int(data, "num_attention_heads", source)
        hidden = _positive_int(data, "hidden_size", source)
        kv_heads = _positive_int(data, "num_key_value_heads", source, default=heads)
        head_dim = _positive_int(data, "head_dim", source, default=hidden // heads)
        if heads % kv_heads:
            raise CheckpointError(
                f"{source}: 'num_attention_heads' must be a multiple of 'num_key_value_heads' "
                f"({kv_heads}): {heads}"
            )
        if head_dim % 2:
            raise CheckpointError(f"{source}: 'head_dim' must be even for rotary: {head_dim}")
        if data.get("hidden_act", "silu") != "silu":
            raise CheckpointError(
                f"{source}: 'hidden_act' must be 'silu': {data.get('hidden_act')!r}"
            )
        if data.get("use_sliding_window", False):
            raise CheckpointError(
                f"{source}: 'use_sliding_window' must be false (sliding-window attention is "
                f"not supported): {data.get('use_sliding_window')!r}"
            )
        return cls(
            vocab_size=_positive_int(data, "vocab_size", source),
            hidden_size=hidden,
            intermediate_size=_positive_int(data, "intermediate_size", source),
            num_layers=_positive_int(data, "num_hidden_layers", source),
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            rms_norm_eps=_positive_float(data, "rms_norm_eps", source, default=1e-6),
            rope_theta=_rope_theta(data, source),
            tie_word_embeddings=bool(data.get("tie_word_embeddings", False)),
            attention_bias=bool(data.get("attention_bias", False)),
        )

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> Qwen3Config:
        """Read and check a ``config.json`` file."""
        path = Path(path)
        if not path.is_file():
            raise CheckpointError(f"{path}: the checkpoint has no {path.name}")
        data = _read_json(path)
        if not isinstance(data, dict):
            raise CheckpointError(f"{path}: must hold a JSON object: {type(data).__name__}")
        return cls.from_dict(data, source=str(path))


def _positive_int(
    data: Mapping[str, Any], key: str, source: str, *, default: int | None = None
) -> int:
    value = data.get(key, default)
    if value is None and default is not None:
        value = default
    if value is None:
        raise CheckpointError(f"{source}: missing required key {key!r}")
    if type(value) is not int or value < 1:
        raise CheckpointError(f"{source}: {key!r} must be an int >= 1: {value!r}")
    return value


def _positive_float(data: Mapping[str, Any], key: str, source: str, *, default: float) -> float:
    value = data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise CheckpointError(f"{source}: {key!r} must be a number > 0: {value!r}")
    return float(value)


def _rope_theta(data: Mapping[str, Any], source: str) -> float:
    """The rotary base, from ``rope_parameters`` (transformers 5) or ``rope_theta`` (4.x)."""
    parameters = data.get("rope_parameters") or data.get("rope_scaling")
    if parameters is not None:
        if not isinstance(parameters, Mapping):
            raise CheckpointError(f"{source}: 'rope_parameters' must be an object: {parameters!r}")
        kind = parameters.get("rope_type", parameters.get("type", "default"))
        if kind != "default":
            raise CheckpointError(
                f"{source}: only the default rotary embedding is supported, 'rope_type' "
                f"must be 'default': {kind!r}"
            )
        if "rope_theta" in parameters:
            return _positive_float(parameters, "rope_theta", source, default=10000.0)
    return _positive_float(data, "rope_theta", source, default=10000.0)


def expected_tensors(config: Qwen3Config) -> dict[str, tuple[int, ...]]:
    """Every tensor the forward pass reads, name -> shape, in checkpoint naming."""
    hidden, inter = config.hidden_size, config.intermediate_size
    q_size = config.num_heads * config.head_dim
    kv_size = config.num_kv_heads * config.head_dim
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (config.vocab_size, hidden),
        "model.norm.weight": (hidden,),
    }
    if not config.tie_word_embeddings:
        shapes["lm_head.weight"] = (config.vocab_size, hidden)
    for i in range(config.num_layers):
        layer = f"model.layers.{i}."
        shapes |= {
            layer + "input_layernorm.weight": (hidden,),
            layer + "post_attention_layernorm.weight": (hidden,),
            layer + "self_attn.q_proj.weight": (q_size, hidden),
            layer + "self_attn.k_proj.weight": (kv_size, hidden),
            layer + "self_attn.v_proj.weight": (kv_size, hidden),
            layer + "self_attn.o_proj.weight": (hidden, q_size),
            layer + "self_attn.q_norm.weight": (config.head_dim,),
            layer + "self_attn.k_norm.weight": (config.head_dim,),
            layer + "mlp.gate_proj.weight": (inter, hidden),
            layer + "mlp.up_proj.weight": (inter, hidden),
            layer + "mlp.down_proj.weight": (hidden, inter),
        }
        if config.attention_bias:
            shapes |= {
                layer + "self_attn.q_proj.bias": (q_size,),
                layer + "self_attn.k_proj.bias": (kv_size,),
                layer + "self_attn.v_proj.bias": (kv_size,),
                layer + "self_attn.o_proj.bias": (hidden,),
            }
    return shapes


@attrs.frozen(eq=False)
class Checkpoint:
    """A loaded checkpoint: its config and every expected tensor, in checkpoint naming."""

    directory: Path
    config: Qwen3Config
    tensors: Mapping[str, torch.Tensor]


def load_checkpoint(
    directory: str | os.PathLike[str], *, dtype: torch.dtype = torch.float32
) -> Checkpoint:
    """Load ``directory``'s config and weights, converting the weights to ``dtype``.

    Tensors the forward pass does not read (an untied ``lm_head.weight`` in a tied
    checkpoint, rotary buffers of old exports) are ignored.
    """
    root = Path(directory)
    if not root.is_dir():
        raise CheckpointError(f"{root}: the checkpoint directory does not exist")
    config = Qwen3Config.from_file(root / CONFIG_FILE)
    locations = _tensor_files(root)
    expected = expected_tensors(config)
    by_file: dict[Path, list[str]] = {}
    for name in expected:
        where = locations.get(name)
        if where is None:
            files = sorted({path.name for path in locations.values()}) or [WEIGHTS_FILE]
            raise CheckpointError(f"{root}: tensor {name!r} is in none of {files}")
        by_file.setdefault(where, []).append(name)
    tensors: dict[str, torch.Tensor] = {}
    for path, names in by_file.items():
        tensors |= _read(path, {name: expected[name] for name in names}, dtype)
    return Checkpoint(directory=root, config=config, tensors=tensors)


def _read_json(path: Path) -> object:
    """The JSON value in ``path``; a :class:`CheckpointError` naming the file if it is not JSON."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise CheckpointError(f"{path}: not valid JSON: {error}") from error


def _tensor_files(root: Path) -> dict[str, Path]:
    """Where each stored tensor lives: the single file, or the shards of the index."""
    single, index = root / WEIGHTS_FILE, root / INDEX_FILE
    if single.is_file():
        with safe_open(str(single), framework="pt") as handle:
            return dict.fromkeys(handle.keys(), single)
    if not index.is_file():
        raise CheckpointError(f"{root}: the checkpoint has neither {WEIGHTS_FILE} nor {INDEX_FILE}")
    data = _read_json(index)
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise CheckpointError(f"{index}: must hold a 'weight_map' of tensor name -> shard file")
    locations = {name: root / shard for name, shard in weight_map.items()}
    for name, path in locations.items():
        if not path.is_file():
            raise CheckpointError(f"{path}: shard listed in {INDEX_FILE} for {name!r} is missing")
    return locations


def _read(
    path: Path, shapes: Mapping[str, tuple[int, ...]], dtype: torch.dtype
) -> dict[str, torch.Tensor]:
    tensors = {}
    with safe_open(str(path), framework="pt") as handle:
        stored = set(handle.keys())
        for name, shape in shapes.items():
            if name not in stored:
                raise CheckpointError(f"{path}: tensor {name!r} is listed here but missing")
            view = handle.get_slice(name)
            found, kind = tuple(view.get_shape()), view.get_dtype()
            if found != shape:
                raise CheckpointError(
                    f"{path}: tensor {name!r} must have shape {list(shape)} for this config: "
                    f"{list(found)}"
                )
            if kind not in _WEIGHT_DTYPES:
                raise CheckpointError(
                    f"{path}: tensor {name!r} must be float32, float16 or bfloat16: {kind}"
                )
            tensors[name] = handle.get_tensor(name).to(dtype)
    return tensors
