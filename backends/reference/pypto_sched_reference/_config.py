"""ModelConfig: the shape of a Qwen3-style decoder."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs

from ._errors import CheckpointError, InvalidModelError

__all__ = ["ModelConfig"]


def _positive(_self: object, field: attrs.Attribute[Any], value: object) -> None:
    if type(value) is not int or value < 1:
        raise InvalidModelError(f"{field.name!r} must be an int >= 1: {value!r}")


def _positive_float(_self: object, field: attrs.Attribute[Any], value: object) -> None:
    if not isinstance(value, int | float) or isinstance(value, bool) or not value > 0:
        raise InvalidModelError(f"{field.name!r} must be a number > 0: {value!r}")


def _bool(_self: object, field: attrs.Attribute[Any], value: object) -> None:
    if type(value) is not bool:
        raise InvalidModelError(f"{field.name!r} must be a bool: {value!r}")


@attrs.frozen(kw_only=True)
class ModelConfig:
    """The sizes of a Qwen3-style decoder; the defaults are a tiny test model."""

    vocab_size: int = attrs.field(default=64, validator=_positive)
    hidden_size: int = attrs.field(default=32, validator=_positive)
    intermediate_size: int = attrs.field(default=64, validator=_positive)
    num_hidden_layers: int = attrs.field(default=2, validator=_positive)
    num_attention_heads: int = attrs.field(default=4, validator=_positive)
    num_key_value_heads: int = attrs.field(default=2, validator=_positive)
    head_dim: int = attrs.field(default=8, validator=_positive)
    rms_norm_eps: float = attrs.field(default=1e-6, validator=_positive_float)
    rope_theta: float = attrs.field(default=1_000_000.0, validator=_positive_float)
    #: Whether the lm_head is the token embedding.
    tie_word_embeddings: bool = attrs.field(default=False, validator=_bool)

    def __attrs_post_init__(self) -> None:
        if self.num_attention_heads % self.num_key_value_heads:
            raise InvalidModelError(
                "'num_attention_heads' must be a multiple of 'num_key_value_heads' "
                f"({self.num_key_value_heads}): {self.num_attention_heads}"
            )
        if self.head_dim % 2:
            raise InvalidModelError(
                f"'head_dim' must be even for rotary embedding: {self.head_dim}"
            )

    @property
    def queries_per_kv_head(self) -> int:
        return self.num_attention_heads // self.num_key_value_heads

    @classmethod
    def from_hf_config(cls, data: dict[str, Any]) -> ModelConfig:
        """Read a Hugging Face Qwen3 ``config.json`` dict, rejecting features this model
        does not implement rather than computing something else."""
        model_type = data.get("model_type", "qwen3")
        if model_type != "qwen3":
            raise CheckpointError(f"'model_type' must be 'qwen3': {model_type!r}")
        unsupported = {
            "rope_scaling": data.get("rope_scaling") is not None,
            "attention_bias": bool(data.get("attention_bias", False)),
            "use_sliding_window": bool(data.get("use_sliding_window", False)),
        }
        for key, present in unsupported.items():
            if present:
                raise CheckpointError(
                    f"{key!r} is not supported by the reference model: {data[key]!r}"
                )
        heads = data.get("num_attention_heads")
        fields = {
            "vocab_size": data.get("vocab_size"),
            "hidden_size": data.get("hidden_size"),
            "intermediate_size": data.get("intermediate_size"),
            "num_hidden_layers": data.get("num_hidden_layers"),
            "num_attention_heads": heads,
            "num_key_value_heads": data.get("num_key_value_heads", heads),
            "rms_norm_eps": data.get("rms_norm_eps", 1e-6),
            "rope_theta": data.get("rope_theta", 10_000.0),
            "tie_word_embeddings": data.get("tie_word_embeddings", False),
        }
        if "head_dim" in data:
            fields["head_dim"] = data["head_dim"]
        elif isinstance(heads, int) and isinstance(fields["hidden_size"], int) and heads:
            fields["head_dim"] = fields["hidden_size"] // heads
        try:
            return cls(**fields)
        except InvalidModelError as error:
            raise CheckpointError(f"bad config.json: {error}") from error

    @classmethod
    def from_json_file(cls, path: str | Path) -> ModelConfig:
        """Read a Hugging Face ``config.json`` file."""
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as error:
            raise CheckpointError(f"cannot read {str(path)!r}: {error}") from error
        if not isinstance(data, dict):
            raise CheckpointError(f"{str(path)!r} must hold a JSON object")
        return cls.from_hf_config(data)

    def to_hf_config(self) -> dict[str, Any]:
        """The config as a Hugging Face Qwen3 ``config.json`` dict."""
        return {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", **attrs.asdict(self)}
