"""Weights of a Qwen3 decoder: random from a seed, or a Hugging Face checkpoint read by
:mod:`pypto_sched.checkpoints` (the one reader of checkpoint files).

Projection matrices keep the checkpoint layout ``[out_features, in_features]``; the model
multiplies by their transpose. Every array is a read-only copy in the model's dtype. Which
tensors exist, their names and their shapes come from the tensor table of
:mod:`pypto_sched.checkpoints` (:func:`~pypto_sched.checkpoints.expected_tensors`,
:func:`~pypto_sched.checkpoints.layer_tensor_names`); a layer's fields are its roles there.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import numpy.typing as npt

from pypto_sched import CheckpointError
from pypto_sched import checkpoints as hf
from pypto_sched.checkpoints import (
    EMBED_TOKENS,
    FINAL_NORM,
    LM_HEAD,
    ModelConfig,
    layer_tensor_names,
)

from ._errors import InvalidModelError

__all__ = ["DTYPES", "TINY_MODEL", "LayerWeights", "Weights", "load_checkpoint", "save_checkpoint"]

Array = npt.NDArray[np.floating[Any]]

#: The float types the model computes in, by name.
DTYPES: dict[str, type[np.floating[Any]]] = {"float64": np.float64, "float32": np.float32}

#: The model of ``ReferenceBackend.from_seed()`` and of the ``reference`` entry point's
#: random weights: tiny, so tests run in milliseconds.
TINY_MODEL = ModelConfig(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    rope_theta=1_000_000.0,
)


@attrs.frozen(kw_only=True, eq=False)
class LayerWeights:
    """One decoder layer. The biases are ``None`` unless the config has ``attention_bias``.
    The fields are the roles of :data:`pypto_sched.checkpoints.LAYER_TENSORS`, which name
    their tensors."""

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
    q_bias: Array | None = None
    k_bias: Array | None = None
    v_bias: Array | None = None
    o_bias: Array | None = None


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
        """Weights drawn from ``seed`` (an int >= 0), scaled so activations stay of order one."""
        if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
            raise InvalidModelError.about(
                "seed", f"must be an int >= 0: {seed!r} ({type(seed).__name__})"
            )
        rng = np.random.default_rng(seed)

        def draw(role: str, shape: tuple[int, ...]) -> Array:
            if role == "embed":
                return rng.standard_normal(shape)
            if role.endswith("_bias"):
                return 0.1 * rng.standard_normal(shape)
            if len(shape) == 1:  # a norm's gain
                return 1.0 + 0.1 * rng.standard_normal(shape)
            return rng.standard_normal(shape) / np.sqrt(shape[1])  # type: ignore[no-any-return]

        shapes = hf.expected_tensors(config)
        # Drawn layer by layer in LayerWeights' field order, then the embedding, norm and
        # lm_head: the order seeds have always meant, so a seed keeps naming the same model.
        roles: dict[str, str] = {}  # checkpoint name -> role, in drawing order
        for i in range(config.num_hidden_layers):
            names = layer_tensor_names(config, i)
            roles.update({names[field]: field for field in _FIELDS if field in names})
        roles |= {EMBED_TOKENS: "embed", FINAL_NORM: "norm", LM_HEAD: "lm_head"}
        tensors = {name: draw(role, shapes[name]) for name, role in roles.items() if name in shapes}
        return cls.from_tensors(config, tensors, dtype=dtype)

    @classmethod
    def from_tensors(
        cls, config: ModelConfig, tensors: Mapping[str, npt.NDArray[Any]], *, dtype: str = "float64"
    ) -> Weights:
        """Weights from checkpoint-named tensors, checking every name and shape the model
        reads (:func:`pypto_sched.checkpoints.expected_tensors`)."""
        target = _dtype(dtype)
        for name, shape in hf.expected_tensors(config).items():
            if name not in tensors:
                raise CheckpointError(f"the weights lack tensor {name!r}")
            if tuple(tensors[name].shape) != shape:
                raise CheckpointError(
                    f"tensor {name!r} must have shape {list(shape)}: {list(tensors[name].shape)}"
                )

        def take(name: str) -> Array:
            return _frozen(tensors[name], target)

        layers = tuple(
            LayerWeights(
                **{field: take(name) for field, name in layer_tensor_names(config, i).items()}
            )
            for i in range(config.num_hidden_layers)
        )
        return cls(
            config=config,
            embed=take(EMBED_TOKENS),
            layers=layers,
            norm=take(FINAL_NORM),
            lm_head=None if config.tie_word_embeddings else take(LM_HEAD),
        )

    def to_tensors(self) -> dict[str, Array]:
        """The weights under their Hugging Face checkpoint names."""
        tensors = {EMBED_TOKENS: self.embed, FINAL_NORM: self.norm}
        if self.lm_head is not None:
            tensors[LM_HEAD] = self.lm_head
        for i, layer in enumerate(self.layers):
            for field, name in layer_tensor_names(self.config, i).items():
                tensors[name] = getattr(layer, field)
        return tensors


#: The roles of a layer's tensors in the order ``Weights.random`` draws them.
_FIELDS = tuple(field.name for field in attrs.fields(LayerWeights))


def _dtype(name: str) -> type[np.floating[Any]]:
    if not isinstance(name, str) or name not in DTYPES:
        raise InvalidModelError.about("dtype", f"must be one of {sorted(DTYPES)}: {name!r}")
    return DTYPES[name]


def _frozen(array: npt.NDArray[Any], dtype: type[np.floating[Any]]) -> Array:
    copy = np.array(array, dtype=dtype)
    copy.flags.writeable = False
    return copy


def load_checkpoint(directory: str | Path, *, dtype: str = "float64") -> Weights:
    """Load a Hugging Face Qwen3 checkpoint directory through
    :func:`pypto_sched.checkpoints.load_checkpoint`, widened to ``dtype``."""
    target = _dtype(dtype)  # before reading anything
    checkpoint = hf.load_checkpoint(directory)
    tensors = {name: tensor.widened() for name, tensor in checkpoint.tensors.items()}
    return Weights.from_tensors(checkpoint.config, tensors, dtype=np.dtype(target).name)


def save_checkpoint(
    weights: Weights, directory: str | Path, *, max_shard_tensors: int | None = None
) -> None:
    """Write ``weights`` as a Hugging Face checkpoint directory (created if needed), with the
    config in transformers 5's layout.

    With ``max_shard_tensors`` the tensors are split over shards of at most that many
    tensors each, listed in ``model.safetensors.index.json``.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    config = json.dumps(weights.config.to_hf_config(), indent=2)
    (directory / hf.CONFIG_FILE).write_text(config)
    tensors = weights.to_tensors()
    names = sorted(tensors)
    size = len(names) if max_shard_tensors is None else max_shard_tensors
    groups = [names[i : i + size] for i in range(0, len(names), size)]
    if max_shard_tensors is None:
        files = [hf.WEIGHTS_FILE]
    else:
        files = [f"model-{k + 1:05d}-of-{len(groups):05d}.safetensors" for k in range(len(groups))]
    weight_map = {}
    for file, group in zip(files, groups, strict=True):
        encoded = hf.encode_safetensors({n: tensors[n] for n in group}, metadata={"format": "pt"})
        (directory / file).write_bytes(encoded)
        weight_map.update(dict.fromkeys(group, file))
    if max_shard_tensors is not None:
        index = {"metadata": {}, "weight_map": weight_map}
        (directory / hf.INDEX_FILE).write_text(json.dumps(index))
