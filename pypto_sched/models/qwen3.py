"""The one reader of Hugging Face Qwen3 checkpoints: ``config.json``, the shard index and
safetensors files, with NumPy alone (no torch, no ``safetensors`` package, never pickle).

Theory of operation
-------------------
A checkpoint directory holds ``config.json`` and the weights: either ``model.safetensors``
or the shards that ``model.safetensors.index.json`` lists in its ``weight_map``. Every file is
untrusted input. Parsing is pure functions over bytes and mappings
(:meth:`ModelConfig.from_hf_config`, :func:`parse_safetensors_header`,
:func:`parse_shard_index`); the functions that open files only read bounded byte counts and
hand them over. Every failure is a :class:`~pypto_sched.CheckpointError` whose message names
the file and, where there is one, the tensor.

* ``config.json`` is read as transformers' ``Qwen3Config`` reads it: both layouts it has
  written (``rope_theta`` at the top level, and transformers 5's ``rope_parameters`` holding
  ``rope_theta`` and ``rope_type``), and the same defaults for absent fields. Nothing is
  coerced (a boolean must be a JSON boolean, an int an int, a float finite), and every
  feature the backends do not implement is refused with an error naming the field: RoPE
  scaling, a layer with a sliding window (decided as ``Qwen3Config`` decides it, so a config
  whose window reaches no layer is full attention), attention types other than full,
  activations other than SiLU.
* A safetensors file is an 8-byte little-endian header length ``n``, ``n`` bytes of JSON
  mapping each tensor name to exactly ``dtype``, ``shape`` and ``data_offsets`` (an optional
  ``__metadata__`` maps strings to strings), then the tensor bytes. The header is at most
  :data:`MAX_HEADER_BYTES`; the tensors' byte ranges, sorted, must tile the data exactly (no
  gap, no overlap, nothing past the end), each as long as its dtype and shape say. Every
  dtype of the format is valid in a file; only a tensor that is read must have one NumPy
  holds (:data:`SAFETENSORS_DTYPES`), and a weight a float one (:data:`FLOAT_DTYPES`).
* The tensors a Qwen3 model reads, with their shapes, are data: :func:`expected_tensors`.
  Tying is decided as transformers 5 decides it, by what is stored as well as by the config:
  a stored ``lm_head.weight`` is the LM head even when ``tie_word_embeddings`` says tied (the
  loaded config then says untied), and a tied checkpoint may store its one matrix as
  ``lm_head.weight`` alone; see :func:`_tied_as_stored`.

bfloat16 has no NumPy dtype: a BF16 tensor is returned as its raw ``uint16`` bits with the
tag ``"BF16"``; :meth:`Tensor.widened` turns BF16 and F16 into float32 exactly, and torch
users reinterpret the bits as ``torch.bfloat16`` themselves.
"""

from __future__ import annotations

import json
import math
import os
import stat
import struct
from collections.abc import Container, Iterable, Iterator, Mapping
from pathlib import Path, PurePosixPath, PureWindowsPath
from types import MappingProxyType
from typing import Any, BinaryIO

import attrs
import numpy as np
import numpy.typing as npt

from ..core._errors import CheckpointError, InvalidInputError
from ..core._json import load_json

__all__ = [
    "CONFIG_FILE",
    "EMBED_TOKENS",
    "FINAL_NORM",
    "FLOAT_DTYPES",
    "INDEX_FILE",
    "LAYER_TENSORS",
    "LM_HEAD",
    "MAX_DIMENSION",
    "MAX_HEADER_BYTES",
    "MAX_JSON_BYTES",
    "SAFETENSORS_DTYPES",
    "WEIGHTS_FILE",
    "Checkpoint",
    "ModelConfig",
    "SafetensorsHeader",
    "Tensor",
    "TensorInfo",
    "encode_safetensors",
    "expected_tensors",
    "layer_tensor_names",
    "load_checkpoint",
    "parse_safetensors_header",
    "parse_shard_index",
    "read_config",
    "read_safetensors",
    "read_safetensors_header",
]

#: The config file of a checkpoint directory.
CONFIG_FILE = "config.json"
#: The weights file of an unsharded checkpoint.
WEIGHTS_FILE = "model.safetensors"
#: The shard index of a sharded checkpoint.
INDEX_FILE = "model.safetensors.index.json"
#: Largest safetensors header read, in bytes (the ``safetensors`` library's own limit).
MAX_HEADER_BYTES = 100_000_000
#: Largest ``config.json`` or shard index read, in bytes.
MAX_JSON_BYTES = 64 * 1024 * 1024
#: safetensors dtype tag -> NumPy dtype as stored (BF16 as its raw 16-bit words).
SAFETENSORS_DTYPES: Mapping[str, np.dtype[Any]] = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U64": np.dtype("<u8"),
    "U32": np.dtype("<u4"),
    "U16": np.dtype("<u2"),
    "U8": np.dtype("u1"),
}
#: The dtypes a weight may be stored in.
FLOAT_DTYPES = ("F64", "F32", "F16", "BF16")
#: Every dtype tag of the safetensors format -> bits per element. A file may hold tensors of
#: any of them (quantisation scales, masks); only those of SAFETENSORS_DTYPES can be read.
_DTYPE_BITS: Mapping[str, int] = {
    "BOOL": 8,
    "F4": 4,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
    "U8": 8,
    "I8": 8,
    "F8_E5M2": 8,
    "F8_E4M3": 8,
    "F8_E8M0": 8,
    "F8_E4M3FNUZ": 8,
    "F8_E5M2FNUZ": 8,
    "I16": 16,
    "U16": 16,
    "F16": 16,
    "BF16": 16,
    "I32": 32,
    "U32": 32,
    "F32": 32,
    "C64": 64,
    "F64": 64,
    "I64": 64,
    "U64": 64,
}
#: Largest model dimension accepted: kernels index with int32.
MAX_DIMENSION = 2**31 - 1

_LENGTH = struct.Struct("<Q")
_ENTRY_KEYS = frozenset({"dtype", "shape", "data_offsets"})


# -- the model description -----------------------------------------------------------------


def _dimension(_self: object, field: attrs.Attribute[Any], value: object) -> None:
    if type(value) is not int:
        raise InvalidInputError.about(field.name, f"must be an int: {value!r}")
    if value < 1:
        raise InvalidInputError.about(field.name, f"must be >= 1: {value}")
    if value > MAX_DIMENSION:
        raise InvalidInputError.about(field.name, f"must be <= {MAX_DIMENSION}: {value}")


def _positive_finite(_self: object, field: attrs.Attribute[Any], value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidInputError.about(field.name, f"must be a number: {value!r}")
    try:
        finite = math.isfinite(value)
    except OverflowError:  # an int too large for a float
        finite = False
    if not finite:
        raise InvalidInputError.about(field.name, f"must be finite: {value!r}")
    if not value > 0:
        raise InvalidInputError.about(field.name, f"must be > 0: {value!r}")


def _boolean(_self: object, field: attrs.Attribute[Any], value: object) -> None:
    if type(value) is not bool:
        raise InvalidInputError.about(field.name, f"must be a bool: {value!r}")


@attrs.frozen(kw_only=True)
class ModelConfig:
    """The shape of a Qwen3 decoder, with Hugging Face's field names and
    ``transformers.Qwen3Config``'s defaults. Read one from a checkpoint with
    :meth:`from_hf_config` or :func:`read_config`."""

    vocab_size: int = attrs.field(default=151936, validator=_dimension)
    hidden_size: int = attrs.field(default=4096, validator=_dimension)
    intermediate_size: int = attrs.field(default=22016, validator=_dimension)
    num_hidden_layers: int = attrs.field(default=32, validator=_dimension)
    num_attention_heads: int = attrs.field(default=32, validator=_dimension)
    #: 32 when absent, as in transformers (which reads an explicit ``null`` as
    #: ``num_attention_heads``).
    num_key_value_heads: int = attrs.field(default=32, validator=_dimension)
    head_dim: int = attrs.field(default=128, validator=_dimension)
    rms_norm_eps: float = attrs.field(default=1e-6, validator=_positive_finite)
    #: The RoPE base.
    rope_theta: float = attrs.field(default=10_000.0, validator=_positive_finite)
    max_position_embeddings: int = attrs.field(default=32768, validator=_dimension)
    #: Whether the lm_head is the token embedding.
    tie_word_embeddings: bool = attrs.field(default=False, validator=_boolean)
    #: Whether the q, k, v and o projections have biases.
    attention_bias: bool = attrs.field(default=False, validator=_boolean)

    def __attrs_post_init__(self) -> None:
        if self.num_attention_heads % self.num_key_value_heads:
            raise InvalidInputError.about(
                "num_attention_heads",
                "must be a multiple of 'num_key_value_heads' "
                f"({self.num_key_value_heads}): {self.num_attention_heads}",
            )
        if self.head_dim % 2:
            raise InvalidInputError.about("head_dim", f"must be even for rotary: {self.head_dim}")

    @property
    def queries_per_kv_head(self) -> int:
        return self.num_attention_heads // self.num_key_value_heads

    @classmethod
    def from_hf_config(cls, data: Mapping[str, Any], *, source: str = CONFIG_FILE) -> ModelConfig:
        """Read a parsed Hugging Face Qwen3 ``config.json``; errors name ``source``.

        Absent fields take ``transformers.Qwen3Config``'s defaults; features the backends do
        not implement raise :class:`~pypto_sched.CheckpointError` naming the field.
        """
        if not isinstance(data, Mapping):
            raise CheckpointError(f"{source}: must hold a JSON object: {type(data).__name__}")
        _check_supported(data, source)
        fields = {name: data[name] for name in _HF_FIELDS if name in data}
        if "num_key_value_heads" in data and data["num_key_value_heads"] is None:
            fields["num_key_value_heads"] = data.get("num_attention_heads", 32)
        fields["rope_theta"] = _rope_theta(data, source)
        try:
            return cls(**fields)
        except InvalidInputError as error:
            raise CheckpointError(f"{source}: {error}") from None

    def to_hf_config(self) -> dict[str, Any]:
        """The config as transformers 5 writes it (``rope_parameters``, no top-level
        ``rope_theta``), for writing checkpoints."""
        fields = attrs.asdict(self)
        theta = fields.pop("rope_theta")
        return {
            "architectures": ["Qwen3ForCausalLM"],
            "model_type": "qwen3",
            "hidden_act": "silu",
            **fields,
            "rope_parameters": {"rope_type": "default", "rope_theta": theta},
            "use_sliding_window": False,
        }


#: The config.json fields read as they are (rope_theta has two layouts; see _rope_theta).
_HF_FIELDS = tuple(field.name for field in attrs.fields(ModelConfig) if field.name != "rope_theta")


#: ``hidden_act`` values that are SiLU in transformers (``ACT2FN``).
_SILU_NAMES = ("silu", "swish")


def _check_supported(data: Mapping[str, Any], source: str) -> None:
    """Raise unless ``data`` describes a model the backends compute exactly."""
    model_type = data.get("model_type")
    if model_type != "qwen3":
        raise CheckpointError(f"{source}: 'model_type' must be 'qwen3': {model_type!r}")
    activation = data.get("hidden_act", "silu")
    if activation not in _SILU_NAMES:
        raise CheckpointError(
            f"{source}: 'hidden_act' must be one of {list(_SILU_NAMES)} (SiLU): {activation!r}"
        )
    _check_full_attention(data, source)
    _check_full_rotary(data, source)


def _check_full_attention(data: Mapping[str, Any], source: str) -> None:
    """Every layer must attend to its whole context, decided as transformers' ``Qwen3Config``
    decides it: the window is ``sliding_window`` only with ``use_sliding_window`` (else
    none), and absent ``layer_types`` are sliding from layer ``max_window_layers`` on when
    there is a window."""
    use_window = data.get("use_sliding_window", False)
    if type(use_window) is not bool:
        raise CheckpointError(f"{source}: 'use_sliding_window' must be a bool: {use_window!r}")
    window = data.get("sliding_window", 4096) if use_window else None
    layers = data.get("num_hidden_layers", 32)
    layer_types = data.get("layer_types")
    if layer_types is not None:
        _check_layer_types(layer_types, layers=layers, window=window, source=source)
    elif window is not None and type(layers) is int:  # (ModelConfig checks num_hidden_layers)
        first = data.get("max_window_layers", 28)
        if type(first) is not int or first < layers:
            raise CheckpointError(
                f"{source}: 'max_window_layers' must be an int >= 'num_hidden_layers' "
                f"({layers}) while 'use_sliding_window' is true and 'sliding_window' is "
                f"{window!r} (sliding-window attention is not implemented): {first!r}"
            )


def _check_layer_types(layer_types: object, *, layers: object, window: object, source: str) -> None:
    # Without a window, a 'sliding_attention' layer attends to its whole context.
    allowed = ["full_attention"] if window is not None else ["full_attention", "sliding_attention"]
    if not isinstance(layer_types, list) or any(kind not in allowed for kind in layer_types):
        rule = f"only {allowed}"
        if window is not None:
            rule += f" while 'use_sliding_window' is true and 'sliding_window' is {window!r}"
        raise CheckpointError(
            f"{source}: 'layer_types' must list {rule} (sliding-window and other attention "
            f"types are not implemented): {layer_types!r}"
        )
    if len(layer_types) != layers:
        raise CheckpointError(
            f"{source}: 'layer_types' must have one entry per layer ({layers!r}): "
            f"{len(layer_types)}"
        )


def _check_full_rotary(parameters: Mapping[str, Any], where: str) -> None:
    """RoPE rotates the whole head: ``partial_rotary_factor``, if given, is 1. (transformers'
    Qwen3 ignores the field and rotates the whole head whatever it says, while engines that
    read it rotate part of it: a checkpoint that sets it means two different models.)"""
    factor = parameters.get("partial_rotary_factor", 1.0)
    if factor != 1.0 or type(factor) is bool:
        raise CheckpointError(
            f"{where}: 'partial_rotary_factor' must be 1.0: transformers' Qwen3 ignores it "
            f"(it rotates the whole head) while other engines rotate that part of the head, so "
            f"the checkpoint is ambiguous; set it to 1.0 for transformers' model: {factor!r}"
        )


def _rope_parameters(data: Mapping[str, Any], source: str) -> Mapping[str, Any]:
    """The RoPE parameters of either layout: transformers 5's ``rope_parameters`` or the
    older ``rope_scaling`` (at most one of them set); empty when neither is."""
    given = {key: data[key] for key in ("rope_parameters", "rope_scaling") if data.get(key)}
    if len(given) > 1:
        raise CheckpointError(
            f"{source}: at most one of 'rope_parameters' and 'rope_scaling' may be set: {given!r}"
        )
    if not given:
        return {}
    ((key, parameters),) = given.items()
    if not isinstance(parameters, Mapping):
        raise CheckpointError(f"{source}: {key!r} must be an object: {parameters!r}")
    kind = parameters.get("rope_type", parameters.get("type", "default"))
    if kind != "default":
        raise CheckpointError(
            f"{source}: {key!r}: 'rope_type' must be 'default' (RoPE scaling is not "
            f"implemented): {kind!r}"
        )
    nested = sorted(name for name, value in parameters.items() if isinstance(value, Mapping))
    if nested:
        raise CheckpointError(
            f"{source}: {key!r} must be one set of parameters, not one per layer type: {nested}"
        )
    _check_full_rotary(parameters, f"{source}: {key!r}")
    return parameters


def _rope_theta(data: Mapping[str, Any], source: str) -> Any:
    """The RoPE base where transformers looks for it: in the RoPE parameters, else at the
    top level, else 10,000. (The value is checked by :class:`ModelConfig`.)"""
    parameters = _rope_parameters(data, source)
    if "rope_theta" in parameters:
        return parameters["rope_theta"]
    return data.get("rope_theta", 10_000.0)


# -- the tensors a Qwen3 model reads -------------------------------------------------------


#: The token embedding, ``[vocab_size, hidden_size]``.
EMBED_TOKENS = "model.embed_tokens.weight"
#: The final RMSNorm's gain, ``[hidden_size]``.
FINAL_NORM = "model.norm.weight"
#: The LM head, ``[vocab_size, hidden_size]``; not read when the embeddings are tied.
LM_HEAD = "lm_head.weight"
#: The prefix of the base model's tensors in a causal LM's checkpoint.
_BASE_PREFIX = "model."
#: One decoder layer's tensors: role -> (name after the layer's prefix
#: ``model.layers.{layer}.``, shape in dimensions named by :func:`_dimensions`), in checkpoint
#: order. The ``*_bias`` roles exist only with ``attention_bias``.
_LAYER: Mapping[str, tuple[str, tuple[str, ...]]] = MappingProxyType(
    {
        "input_norm": ("input_layernorm.weight", ("hidden",)),
        "q_proj": ("self_attn.q_proj.weight", ("q", "hidden")),
        "k_proj": ("self_attn.k_proj.weight", ("kv", "hidden")),
        "v_proj": ("self_attn.v_proj.weight", ("kv", "hidden")),
        "o_proj": ("self_attn.o_proj.weight", ("hidden", "q")),
        "q_bias": ("self_attn.q_proj.bias", ("q",)),
        "k_bias": ("self_attn.k_proj.bias", ("kv",)),
        "v_bias": ("self_attn.v_proj.bias", ("kv",)),
        "o_bias": ("self_attn.o_proj.bias", ("hidden",)),
        "q_norm": ("self_attn.q_norm.weight", ("head",)),
        "k_norm": ("self_attn.k_norm.weight", ("head",)),
        "post_norm": ("post_attention_layernorm.weight", ("hidden",)),
        "gate_proj": ("mlp.gate_proj.weight", ("inner", "hidden")),
        "up_proj": ("mlp.up_proj.weight", ("inner", "hidden")),
        "down_proj": ("mlp.down_proj.weight", ("hidden", "inner")),
    }
)
#: One decoder layer's tensors: role -> name after the layer's prefix
#: ``model.layers.{layer}.``, in checkpoint order. The ``*_bias`` roles exist only with
#: ``attention_bias``. Both bundled backends name their weights by these roles.
LAYER_TENSORS: Mapping[str, str] = MappingProxyType(
    {role: name for role, (name, _) in _LAYER.items()}
)
_BIASES = ("q_bias", "k_bias", "v_bias", "o_bias")


def layer_tensor_names(config: ModelConfig, layer: int) -> dict[str, str]:
    """Layer ``layer``'s tensors in a model of ``config``: role (a key of
    :data:`LAYER_TENSORS`) -> checkpoint name, in checkpoint order; the bias roles only with
    ``attention_bias``."""
    prefix = f"{_BASE_PREFIX}layers.{layer}."
    return {
        role: prefix + name
        for role, name in LAYER_TENSORS.items()
        if config.attention_bias or role not in _BIASES
    }


def _dimensions(config: ModelConfig) -> dict[str, int]:
    """The sizes the shapes of :data:`_LAYER` are written in."""
    return {
        "hidden": config.hidden_size,
        "inner": config.intermediate_size,
        "head": config.head_dim,
        "q": config.num_attention_heads * config.head_dim,
        "kv": config.num_key_value_heads * config.head_dim,
    }


def _layer_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every layer's tensors' shapes, by role."""
    sizes = _dimensions(config)
    return {role: tuple(sizes[d] for d in dims) for role, (_, dims) in _LAYER.items()}


def _expected(config: ModelConfig) -> Iterator[tuple[str, tuple[int, ...]]]:
    yield EMBED_TOKENS, (config.vocab_size, config.hidden_size)
    yield FINAL_NORM, (config.hidden_size,)
    if not config.tie_word_embeddings:
        yield LM_HEAD, (config.vocab_size, config.hidden_size)
    shapes = _layer_shapes(config)
    for layer in range(config.num_hidden_layers):
        for role, name in layer_tensor_names(config, layer).items():
            yield name, shapes[role]


def expected_tensors(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor a Qwen3 model of ``config`` reads, checkpoint name -> shape: no
    ``lm_head.weight`` when the embeddings are tied, biases when ``attention_bias``."""
    return dict(_expected(config))


# -- safetensors ---------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class TensorInfo:
    """One header entry of a safetensors file: where a tensor's bytes are."""

    name: str
    #: The safetensors dtype tag: any of the format's, including those NumPy cannot hold
    #: (BOOL, F8_E4M3, ...), which are checked for size but not read.
    dtype: str
    shape: tuple[int, ...]
    #: Byte range ``[begin, end)`` relative to the start of the data (after the header).
    begin: int
    end: int


@attrs.frozen(kw_only=True)
class SafetensorsHeader:
    """A checked safetensors header: every tensor's entry, the metadata, where data starts."""

    tensors: Mapping[str, TensorInfo]
    metadata: Mapping[str, str]
    #: File offset of the first data byte: 8 plus the header length.
    data_start: int


@attrs.frozen(kw_only=True, eq=False)
class Tensor:
    """A tensor read from a safetensors file.

    ``array`` is read-only and in the stored dtype, except BF16, which NumPy lacks: its
    ``array`` holds the raw ``uint16`` bits (:meth:`widened` gives float32).
    """

    name: str
    #: The safetensors dtype tag, a key of :data:`SAFETENSORS_DTYPES`.
    dtype: str
    shape: tuple[int, ...]
    array: npt.NDArray[Any] = attrs.field(repr=False)

    def widened(self) -> npt.NDArray[Any]:
        """The values as NumPy numbers: BF16 and F16 widened to float32 exactly, every
        other dtype as stored."""
        if self.dtype == "BF16":
            # bfloat16 is the top half of a float32: shifting the bits up widens it exactly.
            bits = self.array.astype(np.uint32) << 16
            return bits.view(np.float32)
        if self.dtype == "F16":
            return self.array.astype(np.float32)
        return self.array


def _bad(source: str, problem: str) -> CheckpointError:
    return CheckpointError(f"{source}: not a valid safetensors file: {problem}")


def parse_safetensors_header(
    header: bytes, *, data_size: int, source: str = "safetensors file"
) -> SafetensorsHeader:
    """Check a safetensors header (the JSON bytes after the length) against ``data_size``,
    the number of bytes that follow it; errors name ``source`` and the tensor."""
    if len(header) > MAX_HEADER_BYTES:
        raise _bad(source, f"header of {len(header):,} bytes exceeds {MAX_HEADER_BYTES:,}")
    parsed = load_json(
        header, what=f"{source}: the safetensors header", error=CheckpointError,
        max_bytes=MAX_HEADER_BYTES,
    )  # fmt: skip
    if not isinstance(parsed, dict):
        raise _bad(source, f"the header must be a JSON object: {type(parsed).__name__}")
    metadata = parsed.pop("__metadata__", {})
    if not isinstance(metadata, dict) or not all(
        isinstance(key, str) and isinstance(value, str) for key, value in metadata.items()
    ):
        raise _bad(source, f"'__metadata__' must map strings to strings: {metadata!r}")
    for text in [*parsed, *metadata, *metadata.values()]:
        if not _is_unicode(text):  # JSON escapes can spell lone surrogates
            raise _bad(source, f"{text!r} is not valid Unicode (a lone surrogate)")
    tensors = {name: _entry(name, entry, source) for name, entry in parsed.items()}
    _check_tiling(tensors, data_size, source)
    return SafetensorsHeader(
        tensors=tensors, metadata=dict(metadata), data_start=_LENGTH.size + len(header)
    )


def _is_unicode(text: str) -> bool:
    """Whether ``text`` can be written as UTF-8 (no lone surrogates)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _entry(name: str, entry: object, source: str) -> TensorInfo:
    where = f"tensor {name!r}"
    if not isinstance(entry, dict) or set(entry) != _ENTRY_KEYS:
        keys = sorted(entry) if isinstance(entry, dict) else type(entry).__name__
        raise _bad(source, f"{where} must have exactly {sorted(_ENTRY_KEYS)}: {keys}")
    dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if not isinstance(dtype, str) or dtype not in _DTYPE_BITS:
        raise _bad(
            source,
            f"{where}: 'dtype' must be a safetensors dtype, one of {sorted(_DTYPE_BITS)}: "
            f"{dtype!r}",
        )
    if not isinstance(shape, list) or not all(type(n) is int and n >= 0 for n in shape):
        raise _bad(source, f"{where}: 'shape' must be a list of ints >= 0: {shape!r}")
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(type(n) is int and n >= 0 for n in offsets)
    ):
        raise _bad(source, f"{where}: 'data_offsets' must be two ints >= 0: {offsets!r}")
    begin, end = offsets
    nbytes, odd_bits = divmod(math.prod(shape) * _DTYPE_BITS[dtype], 8)
    if odd_bits:
        raise _bad(
            source,
            f"{where}: 'shape' must fill whole bytes at {_DTYPE_BITS[dtype]} bits per {dtype} "
            f"element: {shape}",
        )
    if end - begin != nbytes:
        raise _bad(
            source,
            f"{where}: 'data_offsets' {offsets} must span {nbytes} bytes for dtype {dtype} "
            f"and shape {shape}: {end - begin}",
        )
    return TensorInfo(name=name, dtype=dtype, shape=tuple(shape), begin=begin, end=end)


def _check_tiling(tensors: Mapping[str, TensorInfo], data_size: int, source: str) -> None:
    """The tensors' byte ranges, in order, must cover ``[0, data_size)`` exactly."""
    position, previous = 0, None
    for info in sorted(tensors.values(), key=lambda info: (info.begin, info.end)):
        if info.begin != position:
            after = "the start of the data" if previous is None else f"tensor {previous!r}"
            problem = "overlaps" if info.begin < position else "leaves a gap after"
            raise _bad(
                source,
                f"tensor {info.name!r}: data_offsets {[info.begin, info.end]} {problem} "
                f"{after} (expected to begin at {position})",
            )
        if info.end > data_size:
            raise _bad(
                source,
                f"tensor {info.name!r}: data_offsets {[info.begin, info.end]} run past the "
                f"{data_size} data bytes",
            )
        position, previous = info.end, info.name
    if position != data_size:
        raise _bad(source, f"the tensors cover {position} of the {data_size} data bytes")


def _open_regular(path: Path) -> BinaryIO:
    """``path`` opened for reading if it is a regular file. A FIFO or a device would block
    or never end; it is opened without blocking, to be refused (``OSError`` otherwise)."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise CheckpointError(f"{path}: not a regular file")
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _read_bounded(path: Path, limit: int, what: str) -> bytes:
    """At most ``limit`` bytes of ``path`` (an error naming it if there are more)."""
    try:
        with _open_regular(path) as file:
            data = file.read(limit + 1)
    except OSError as error:
        raise CheckpointError(f"{path}: cannot read {what}: {error.strerror or error}") from None
    if len(data) > limit:
        raise CheckpointError(f"{path}: {what} is larger than the limit of {limit:,} bytes")
    return data


def read_safetensors_header(path: str | Path) -> SafetensorsHeader:
    """Read and check the header of the safetensors file ``path``."""
    path = Path(path)
    try:
        with _open_regular(path) as file:
            size = os.fstat(file.fileno()).st_size
            prefix = file.read(_LENGTH.size)
            if len(prefix) != _LENGTH.size:
                raise _bad(str(path), f"{len(prefix)} bytes, shorter than the 8-byte length")
            (length,) = _LENGTH.unpack(prefix)
            if length > MAX_HEADER_BYTES:
                raise _bad(str(path), f"header length {length:,} exceeds {MAX_HEADER_BYTES:,}")
            if length > size - _LENGTH.size:
                raise _bad(
                    str(path),
                    f"header length {length:,} runs past the end of the {size:,}-byte file",
                )
            header = file.read(length)
    except OSError as error:
        raise CheckpointError(f"{path}: cannot read: {error.strerror or error}") from None
    return parse_safetensors_header(
        header, data_size=size - _LENGTH.size - length, source=str(path)
    )


def read_safetensors(path: str | Path, names: Iterable[str] | None = None) -> dict[str, Tensor]:
    """Tensors ``names`` (default: all) of the safetensors file ``path``, memory-mapped and
    read-only, each of a dtype in :data:`SAFETENSORS_DTYPES`. Nothing is unpickled."""
    if isinstance(names, str | bytes):
        raise InvalidInputError.about(
            "names", f"must be an iterable of tensor names ([name] for one): {names!r}"
        )
    path = Path(path)
    header = read_safetensors_header(path)
    wanted = sorted(header.tensors) if names is None else list(names)
    missing = [name for name in wanted if name not in header.tensors]
    if missing:
        raise CheckpointError(f"{path}: tensor {missing[0]!r} is not in the file")
    return _map_tensors(path, header, wanted)


def _map_tensors(path: Path, header: SafetensorsHeader, names: list[str]) -> dict[str, Tensor]:
    """Tensors ``names`` of ``path``, whose checked header is ``header``."""
    for name in names:
        dtype = header.tensors[name].dtype
        if dtype not in SAFETENSORS_DTYPES:
            raise CheckpointError(
                f"{path}: tensor {name!r} cannot be read: its dtype {dtype} has no NumPy "
                f"counterpart (readable: {sorted(SAFETENSORS_DTYPES)})"
            )
    if not names:
        return {}
    try:
        buffer = np.memmap(path, dtype=np.uint8, mode="r")
    except (OSError, ValueError) as error:
        raise CheckpointError(f"{path}: cannot map: {error}") from None
    size = header.data_start + max((info.end for info in header.tensors.values()), default=0)
    if buffer.size != size:
        raise CheckpointError(f"{path}: the file changed size while it was read")
    return {name: _tensor(path, buffer, header, header.tensors[name]) for name in names}


def _tensor(
    path: Path, buffer: npt.NDArray[np.uint8], header: SafetensorsHeader, info: TensorInfo
) -> Tensor:
    start = header.data_start
    raw = buffer[start + info.begin : start + info.end]
    try:
        array = np.frombuffer(raw, dtype=SAFETENSORS_DTYPES[info.dtype]).reshape(info.shape)
    except ValueError as error:  # valid in the format, beyond NumPy: 65 dimensions, say
        raise CheckpointError(
            f"{path}: tensor {info.name!r} cannot be read: its shape {list(info.shape)} is "
            f"beyond what NumPy holds ({error})"
        ) from None
    return Tensor(name=info.name, dtype=info.dtype, shape=info.shape, array=array)


def encode_safetensors(
    tensors: Mapping[str, npt.NDArray[Any] | Tensor], *, metadata: Mapping[str, str] | None = None
) -> bytes:
    """The safetensors file holding ``tensors`` (NumPy arrays of a dtype in
    :data:`SAFETENSORS_DTYPES`, or :class:`Tensor` objects, which keep their tag: the way to
    write BF16), in name order, the header padded to a multiple of 8 bytes.

    What :func:`read_safetensors` would refuse is an :class:`InvalidInputError` naming the
    tensor or metadata entry: a name that is not a str, is ``"__metadata__"`` or is not
    valid Unicode; metadata that does not map strings to strings; a dtype that cannot be
    written; a :class:`Tensor` whose tag is not one of :data:`SAFETENSORS_DTYPES`, or does
    not match its array's dtype or shape.
    """
    _check_header_metadata(metadata)
    tags = {dtype: tag for tag, dtype in SAFETENSORS_DTYPES.items() if tag != "BF16"}
    header: dict[str, Any] = {} if metadata is None else {"__metadata__": dict(metadata)}
    for name in tensors:
        if not isinstance(name, str) or name == "__metadata__" or not _is_unicode(name):
            raise InvalidInputError(
                f"tensor names must be strs of valid Unicode other than '__metadata__': {name!r}"
            )
    chunks = []
    offset = 0
    for name in sorted(tensors):
        given = tensors[name]
        array = np.asarray(given.array if isinstance(given, Tensor) else given)
        if isinstance(given, Tensor):
            _check_tagged(name, given, array)
        # (np.require keeps a 0-d array 0-d; np.ascontiguousarray would make it 1-d.)
        array = np.require(array.astype(array.dtype.newbyteorder("<"), copy=False), None, "C")
        tag = given.dtype if isinstance(given, Tensor) else tags.get(array.dtype)
        if tag is None:
            raise InvalidInputError(f"tensor {name!r}: dtype {array.dtype} cannot be written")
        header[name] = {
            "dtype": tag,
            "shape": list(array.shape),
            "data_offsets": [offset, offset + array.nbytes],
        }
        chunks.append(array.tobytes())
        offset += array.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # keep the tensor data 8-byte aligned
    return _LENGTH.pack(len(raw)) + raw + b"".join(chunks)


def _check_header_metadata(metadata: object) -> None:
    if metadata is None:
        return
    if not isinstance(metadata, Mapping):
        raise InvalidInputError.about(
            "metadata", f"must map strings to strings: {type(metadata).__name__}"
        )
    for key, value in metadata.items():
        if not (isinstance(key, str) and isinstance(value, str)):
            raise InvalidInputError.about(
                "metadata", f"must map strings to strings: {key!r} maps to {value!r}"
            )
        if not (_is_unicode(key) and _is_unicode(value)):
            raise InvalidInputError.about(
                "metadata", f"must hold valid Unicode: {key!r} maps to {value!r}"
            )


def _check_tagged(name: str, tensor: Tensor, array: npt.NDArray[Any]) -> None:
    """A :class:`Tensor` to write: its tag readable, and its array of that tag's dtype and
    of its own shape."""
    expected = SAFETENSORS_DTYPES.get(tensor.dtype)
    if expected is None:
        raise InvalidInputError(
            f"tensor {name!r}: dtype tag {tensor.dtype!r} cannot be written (writable: "
            f"{sorted(SAFETENSORS_DTYPES)})"
        )
    if (array.dtype.kind, array.dtype.itemsize) != (expected.kind, expected.itemsize):
        raise InvalidInputError(
            f"tensor {name!r}: a {tensor.dtype} tensor must hold a {expected.name} array "
            f"(BF16: its raw bits): {array.dtype}"
        )
    if tuple(tensor.shape) != array.shape:
        raise InvalidInputError(
            f"tensor {name!r}: its shape {tuple(tensor.shape)} is not its array's {array.shape}"
        )


# -- checkpoint directories ----------------------------------------------------------------


def read_config(directory: str | Path) -> ModelConfig:
    """The :class:`ModelConfig` of ``directory/config.json``."""
    path = Path(directory) / CONFIG_FILE
    data = load_json(
        _read_bounded(path, MAX_JSON_BYTES, CONFIG_FILE),
        what=str(path),
        error=CheckpointError,
        max_bytes=MAX_JSON_BYTES,
    )
    return ModelConfig.from_hf_config(data, source=str(path))


def parse_shard_index(data: object, *, source: str = INDEX_FILE) -> dict[str, str]:
    """The ``weight_map`` of a parsed shard index, tensor name -> shard file name, each a
    plain file name inside the checkpoint directory (no directories, no ``..``)."""
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict):
        raise CheckpointError(f"{source}: must hold a 'weight_map' object of tensor -> file")
    for name, file in weight_map.items():
        if not isinstance(file, str) or not _plain_file_name(file):
            raise CheckpointError(
                f"{source}: tensor {name!r}: the shard must be a file name in the checkpoint "
                f"directory: {file!r}"
            )
    return dict(weight_map)


def _plain_file_name(name: str) -> bool:
    return (
        name not in ("", ".", "..")
        and PurePosixPath(name).name == name
        and PureWindowsPath(name).name == name
        and "\0" not in name
    )


@attrs.frozen(kw_only=True, eq=False)
class Checkpoint:
    """A loaded checkpoint: its config (as transformers runs it: untied when the LM head is
    stored) and exactly the tensors :func:`expected_tensors` names for it, shape-checked, in
    their stored dtypes."""

    directory: Path
    config: ModelConfig
    tensors: Mapping[str, Tensor]


def _stored_tensors(root: Path) -> dict[str, tuple[Path, SafetensorsHeader]]:
    """Every stored tensor: its file and that file's header, from the single file or the
    shards."""
    single, index = root / WEIGHTS_FILE, root / INDEX_FILE
    if single.is_file():
        header = read_safetensors_header(single)
        return dict.fromkeys(header.tensors, (single, header))
    if not index.is_file():
        raise CheckpointError(f"{root}: the checkpoint has neither {WEIGHTS_FILE} nor {INDEX_FILE}")
    parsed = load_json(
        _read_bounded(index, MAX_JSON_BYTES, INDEX_FILE),
        what=str(index),
        error=CheckpointError,
        max_bytes=MAX_JSON_BYTES,
    )
    weight_map = parse_shard_index(parsed, source=str(index))
    stored: dict[str, tuple[Path, SafetensorsHeader]] = {}
    for file in sorted(set(weight_map.values())):
        shard = root / file
        if not shard.is_file():
            listed = min(name for name, where in weight_map.items() if where == file)
            raise CheckpointError(
                f"{shard}: the shard {INDEX_FILE} lists for tensor {listed!r} is missing"
            )
        header = read_safetensors_header(shard)
        for name in header.tensors:
            if name in stored:
                raise CheckpointError(
                    f"{shard}: tensor {name!r} is also stored in {stored[name][0].name}"
                )
            stored[name] = (shard, header)
    for name, file in weight_map.items():
        if stored.get(name, (None,))[0] != root / file:
            raise CheckpointError(
                f"{root / file}: tensor {name!r} is listed in {INDEX_FILE} for this shard but "
                "is not in it"
            )
    return stored


def _tied_as_stored(
    config: ModelConfig, stored: Container[str]
) -> tuple[ModelConfig, dict[str, str]]:
    """The config as transformers 5 runs the checkpoint, and the stored name of each tensor
    the model reads under another name.

    transformers ties the LM head and the embedding only when one of the two is not stored: a
    tied config whose checkpoint stores both describes an untied model (transformers warns and
    uses the stored head), and a tied checkpoint that stores only ``lm_head.weight`` has it as
    the embedding too.
    """
    if not config.tie_word_embeddings or LM_HEAD not in stored:
        return config, {}
    if EMBED_TOKENS in stored:
        return attrs.evolve(config, tie_word_embeddings=False), {}
    return config, {EMBED_TOKENS: LM_HEAD}


def load_checkpoint(directory: str | os.PathLike[str]) -> Checkpoint:
    """Read ``directory``'s config and every tensor the model reads, checking names, shapes
    and dtypes (float) against the config. Tensors are memory-mapped, in their stored dtype.

    The returned config is untied when both ``lm_head.weight`` and the embedding are stored,
    whatever ``tie_word_embeddings`` says, and a tied checkpoint's embedding may be stored as
    ``lm_head.weight`` alone, as transformers 5 loads them (:func:`_tied_as_stored`)."""
    if not isinstance(directory, str | os.PathLike):
        raise CheckpointError(
            f"the checkpoint directory must be a path (str or os.PathLike): {directory!r} "
            f"({type(directory).__name__})"
        )
    root = Path(directory)
    if not root.is_dir():
        raise CheckpointError(f"{root}: the checkpoint directory does not exist")
    config = read_config(root)
    stored = _stored_tensors(root)
    # The model's name of each stored tensor: a base model's checkpoint (Qwen3Model's
    # save_pretrained) stores its tensors without the "model." prefix, which transformers
    # adds when Qwen3ForCausalLM loads it.
    base = EMBED_TOKENS not in stored and EMBED_TOKENS.removeprefix(_BASE_PREFIX) in stored
    named = {(_BASE_PREFIX + n if base and n != LM_HEAD else n): n for n in stored}
    config, stored_as = _tied_as_stored(config, named)
    by_file: dict[Path, tuple[SafetensorsHeader, list[str]]] = {}
    # Lazily, so a config claiming billions of layers fails at the first missing tensor.
    for name, shape in _expected(config):
        source = named.get(stored_as.get(name, name))
        if source is None:
            files = sorted({path.name for path, _ in stored.values()}) or [WEIGHTS_FILE]
            hint = (
                " (the checkpoint of a base model, without an LM head: an untied config "
                "needs lm_head.weight)"
                if base and name == LM_HEAD
                else ""
            )
            raise CheckpointError(f"{root}: tensor {name!r} is in none of {files}{hint}")
        path, header = stored[source]
        info = header.tensors[source]
        if info.shape != shape:
            raise CheckpointError(
                f"{path}: tensor {source!r} must have shape {list(shape)} for this config: "
                f"{list(info.shape)}"
            )
        if info.dtype not in FLOAT_DTYPES:
            raise CheckpointError(
                f"{path}: tensor {source!r} must be one of {list(FLOAT_DTYPES)}: {info.dtype}"
            )
        by_file.setdefault(path, (header, []))[1].append(source)
    mapped: dict[str, Tensor] = {}
    for path, (header, names) in by_file.items():
        mapped |= _map_tensors(path, header, names)
    tensors = {name: mapped[named[stored_as.get(name, name)]] for name, _ in _expected(config)}
    return Checkpoint(directory=root, config=config, tensors=tensors)
