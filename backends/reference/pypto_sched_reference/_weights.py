"""Weights of a Qwen3-style decoder: random from a seed, or a Hugging Face checkpoint.

Projection matrices keep the checkpoint layout ``[out_features, in_features]``; the model
multiplies by their transpose. Every array is a read-only copy in the model's dtype.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import numpy.typing as npt

from ._config import ModelConfig
from ._errors import CheckpointError, InvalidModelError
from ._safetensors import read_safetensors, safetensors_names, write_safetensors

__all__ = ["DTYPES", "LayerWeights", "Weights", "load_checkpoint", "save_checkpoint"]

Array = npt.NDArray[np.floating[Any]]

#: The float types the model computes in, by name.
DTYPES: dict[str, type[np.floating[Any]]] = {"float64": np.float64, "float32": np.float32}

#: Per-layer tensors: field name -> checkpoint name after ``model.layers.{i}.``.
_LAYER_NAMES = {
    "input_norm": "input_layernorm.weight",
    "q_proj": "self_attn.q_proj.weight",
    "k_proj": "self_attn.k_proj.weight",
    "v_proj": "self_attn.v_proj.weight",
    "q_norm": "self_attn.q_norm.weight",
    "k_norm": "self_attn.k_norm.weight",
    "o_proj": "self_attn.o_proj.weight",
    "post_norm": "post_attention_layernorm.weight",
    "gate_proj": "mlp.gate_proj.weight",
    "up_proj": "mlp.up_proj.weight",
    "down_proj": "mlp.down_proj.weight",
}
_EMBED, _NORM, _LM_HEAD = "model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"
_SINGLE_FILE, _INDEX = "model.safetensors", "model.safetensors.index.json"


def _layer_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    hidden, head = config.hidden_size, config.head_dim
    q, kv = config.num_attention_heads * head, config.num_key_value_heads * head
    inner = config.intermediate_size
    return {
        "input_norm": (hidden,),
        "q_proj": (q, hidden),
        "k_proj": (kv, hidden),
        "v_proj": (kv, hidden),
        "q_norm": (head,),
        "k_norm": (head,),
        "o_proj": (hidden, q),
        "post_norm": (hidden,),
        "gate_proj": (inner, hidden),
        "up_proj": (inner, hidden),
        "down_proj": (hidden, inner),
    }


@attrs.frozen(kw_only=True, eq=False)
class LayerWeights:
    """One decoder layer."""

    input_norm: Array
    q_proj: Array
    k_proj: Array
    v_proj: Array
    q_norm: Array
    k_norm: Array
    o_proj: Array
    post_norm: Array
    gate_proj: Array
    up_proj: Array
    down_proj: Array


@attrs.frozen(kw_only=True, eq=False)
class Weights:
    """A whole model. Build one with :meth:`random` or :func:`load_checkpoint`."""

    config: ModelConfig
    embed: Array
    layers: tuple[LayerWeights, ...]
    norm: Array
    #: ``None`` when the lm_head is tied to the embedding.
    lm_head: Array | None

    @property
    def dtype(self) -> np.dtype[Any]:
        return self.embed.dtype

    @property
    def output_embedding(self) -> Array:
        """The lm_head matrix ``[vocab_size, hidden_size]``."""
        return self.embed if self.lm_head is None else self.lm_head

    @classmethod
    def random(cls, config: ModelConfig, *, seed: int, dtype: str = "float64") -> Weights:
        """Weights drawn from ``seed``, scaled so activations stay of order one."""
        target = _dtype(dtype)
        rng = np.random.default_rng(seed)

        def draw(shape: tuple[int, ...]) -> Array:
            if len(shape) == 1:  # a norm's gain
                return _frozen(1.0 + 0.1 * rng.standard_normal(shape), target)
            return _frozen(rng.standard_normal(shape) / np.sqrt(shape[1]), target)

        shapes = _layer_shapes(config)
        layers = tuple(
            LayerWeights(**{field: draw(shape) for field, shape in shapes.items()})
            for _ in range(config.num_hidden_layers)
        )
        vocab, hidden = config.vocab_size, config.hidden_size
        return cls(
            config=config,
            embed=_frozen(rng.standard_normal((vocab, hidden)), target),
            layers=layers,
            norm=draw((hidden,)),
            lm_head=None if config.tie_word_embeddings else draw((vocab, hidden)),
        )

    @classmethod
    def from_tensors(
        cls, config: ModelConfig, tensors: Mapping[str, Array], *, dtype: str = "float64"
    ) -> Weights:
        """Weights from checkpoint-named tensors, checking every name and shape."""
        target = _dtype(dtype)

        def take(name: str, shape: tuple[int, ...]) -> Array:
            if name not in tensors:
                raise CheckpointError(f"the checkpoint lacks tensor {name!r}")
            array = tensors[name]
            if array.shape != shape:
                raise CheckpointError(
                    f"tensor {name!r} must have shape {list(shape)}: {list(array.shape)}"
                )
            return _frozen(array, target)

        shapes = _layer_shapes(config)
        vocab, hidden = config.vocab_size, config.hidden_size
        layers = tuple(
            LayerWeights(
                **{
                    field: take(f"model.layers.{i}.{_LAYER_NAMES[field]}", shape)
                    for field, shape in shapes.items()
                }
            )
            for i in range(config.num_hidden_layers)
        )
        return cls(
            config=config,
            embed=take(_EMBED, (vocab, hidden)),
            layers=layers,
            norm=take(_NORM, (hidden,)),
            lm_head=None if config.tie_word_embeddings else take(_LM_HEAD, (vocab, hidden)),
        )

    def to_tensors(self) -> dict[str, Array]:
        """The weights under their Hugging Face checkpoint names."""
        tensors = {_EMBED: self.embed, _NORM: self.norm}
        if self.lm_head is not None:
            tensors[_LM_HEAD] = self.lm_head
        for i, layer in enumerate(self.layers):
            for field, name in _LAYER_NAMES.items():
                tensors[f"model.layers.{i}.{name}"] = getattr(layer, field)
        return tensors


def _dtype(name: str) -> type[np.floating[Any]]:
    if name not in DTYPES:
        raise InvalidModelError(f"'dtype' must be one of {sorted(DTYPES)}: {name!r}")
    return DTYPES[name]


def _frozen(array: npt.NDArray[Any], dtype: type[np.floating[Any]]) -> Array:
    copy = np.array(array, dtype=dtype)
    copy.flags.writeable = False
    return copy


def load_checkpoint(directory: str | Path, *, dtype: str = "float64") -> Weights:
    """Load a Hugging Face Qwen3 checkpoint directory: ``config.json`` plus
    ``model.safetensors`` or the shards listed in ``model.safetensors.index.json``."""
    directory = Path(directory)
    config = ModelConfig.from_json_file(directory / "config.json")
    tensors: dict[str, Array] = {}
    for file in _shards(directory):
        wanted = [name for name in safetensors_names(file) if _wanted(name, config)]
        tensors.update(read_safetensors(file, wanted))
    return Weights.from_tensors(config, tensors, dtype=dtype)


def _wanted(name: str, config: ModelConfig) -> bool:
    # A tied checkpoint may still store lm_head; the embedding is used instead.
    return not (config.tie_word_embeddings and name == _LM_HEAD)


def _shards(directory: Path) -> list[Path]:
    if (directory / _SINGLE_FILE).is_file():
        return [directory / _SINGLE_FILE]
    index = directory / _INDEX
    if not index.is_file():
        raise CheckpointError(
            f"{str(directory)!r} must hold {_SINGLE_FILE!r} or {_INDEX!r}: neither found"
        )
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
        files = sorted(set(weight_map.values()))
    except (OSError, json.JSONDecodeError, KeyError, TypeError, AttributeError) as error:
        raise CheckpointError(f"{str(index)!r} is not a safetensors index: {error}") from error
    return [directory / file for file in files]


def save_checkpoint(
    weights: Weights, directory: str | Path, *, max_shard_tensors: int | None = None
) -> None:
    """Write ``weights`` as a Hugging Face checkpoint directory (created if needed).

    With ``max_shard_tensors`` the tensors are split over shards of at most that many
    tensors each, listed in ``model.safetensors.index.json``.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(weights.config.to_hf_config(), indent=2))
    tensors = weights.to_tensors()
    names = sorted(tensors)
    if max_shard_tensors is None:
        write_safetensors(directory / _SINGLE_FILE, tensors, metadata={"format": "pt"})
        return
    groups = [names[i : i + max_shard_tensors] for i in range(0, len(names), max_shard_tensors)]
    weight_map = {}
    for k, group in enumerate(groups):
        file = f"model-{k + 1:05d}-of-{len(groups):05d}.safetensors"
        write_safetensors(
            directory / file, {n: tensors[n] for n in group}, metadata={"format": "pt"}
        )
        weight_map.update(dict.fromkeys(group, file))
    (directory / _INDEX).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
