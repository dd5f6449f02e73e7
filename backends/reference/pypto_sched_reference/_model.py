"""The decoder's arithmetic, one dispatch at a time.

Per layer: RMSNorm -> q/k/v projections (plus biases when the config has ``attention_bias``)
-> per-head RMSNorm of q and k -> rotary embedding -> K/V written to the dispatch's slots
-> grouped-query attention of each row over its whole context, read through its block table
-> o projection (and bias) -> residual -> RMSNorm -> SwiGLU MLP -> residual. Then the final
RMSNorm and the lm_head, for the final rows' last tokens only.

Every intermediate array is ``[num_tokens, ...]`` for the dispatch's tokens, so a dispatch
never holds more activations than its token budget allows, except the attention scores of
one row at a time (``[heads, row tokens, context]``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from pypto_sched import DispatchArrays
from pypto_sched.checkpoints import ModelConfig

from ._cache import PagedKVCache
from ._weights import LayerWeights, Weights

__all__ = ["final_hidden", "logits_of"]

Array = npt.NDArray[np.floating[Any]]
I64 = npt.NDArray[np.int64]


def rms_norm(x: Array, weight: Array, eps: float) -> Array:
    scale = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    return x * scale * weight  # type: ignore[no-any-return]


def linear(x: Array, weight: Array, bias: Array | None = None) -> Array:
    """``x @ weight.T (+ bias)``, with ``weight`` in the checkpoint layout ``[out, in]``."""
    y = x @ weight.T
    return y if bias is None else y + bias


def silu(x: Array) -> Array:
    # x * sigmoid(x), with the sigmoid written through tanh so large |x| cannot overflow.
    return x * (0.5 + 0.5 * np.tanh(0.5 * x))  # type: ignore[no-any-return]


def rotary(
    positions: npt.NDArray[np.int32], config: ModelConfig, dtype: Any
) -> tuple[Array, Array]:
    """``cos`` and ``sin`` of every position's angles, ``[num_tokens, head_dim // 2]``."""
    half = config.head_dim // 2
    inverse_frequency = config.rope_theta ** (-np.arange(half, dtype=np.float64) / half)
    angles = positions.astype(np.float64)[:, None] * inverse_frequency[None, :]
    return np.cos(angles).astype(dtype), np.sin(angles).astype(dtype)


def apply_rotary(x: Array, cos: Array, sin: Array) -> Array:
    """Rotate ``x`` (``[tokens, heads, head_dim]``) by pairing each first-half feature with its
    second-half partner (the Hugging Face ``rotate_half`` convention)."""
    half = x.shape[-1] // 2
    first, second = x[..., :half], x[..., half:]
    cos, sin = cos[:, None, :], sin[:, None, :]
    return np.concatenate((first * cos - second * sin, second * cos + first * sin), axis=-1)


def attend(q: Array, keys: Array, values: Array, query_positions: npt.NDArray[np.int32]) -> Array:
    """Causal grouped-query attention of one row.

    ``q`` is ``[n, heads, head_dim]`` (already scaled), ``keys`` and ``values`` are the row's
    whole context ``[context, kv_heads, head_dim]`` in position order; query ``i`` sees the
    positions up to ``query_positions[i]``. Returns ``[n, heads * head_dim]``.
    """
    n, heads, dim = q.shape
    context, kv_heads, _ = keys.shape
    group = heads // kv_heads
    # Query head h reads kv head h // group: group the query heads under their kv head.
    grouped = q.reshape(n, kv_heads, group, dim).transpose(1, 2, 0, 3).reshape(kv_heads, -1, dim)
    scores = (grouped @ keys.transpose(1, 2, 0)).reshape(kv_heads, group, n, context)
    visible = np.arange(context)[None, :] <= query_positions[:, None]
    scores = np.where(visible, scores, -np.inf)
    scores -= scores.max(axis=-1, keepdims=True)
    np.exp(scores, out=scores)
    scores /= scores.sum(axis=-1, keepdims=True)
    mixed = scores.reshape(kv_heads, group * n, context) @ values.transpose(1, 0, 2)
    return mixed.reshape(kv_heads, group, n, dim).transpose(2, 0, 1, 3).reshape(n, heads * dim)


def decoder_layer(
    weights: LayerWeights,
    x: Array,
    *,
    config: ModelConfig,
    layer: int,
    cache: PagedKVCache,
    arrays: DispatchArrays,
    contexts: list[I64],
    rope: tuple[Array, Array],
) -> Array:
    tokens = x.shape[0]
    eps = config.rms_norm_eps
    heads, kv_heads, dim = config.num_attention_heads, config.num_key_value_heads, config.head_dim
    h = rms_norm(x, weights.input_norm, eps)
    q = linear(h, weights.q_proj, weights.q_bias).reshape(tokens, heads, dim)
    k = linear(h, weights.k_proj, weights.k_bias).reshape(tokens, kv_heads, dim)
    v = linear(h, weights.v_proj, weights.v_bias).reshape(tokens, kv_heads, dim)
    q, k = rms_norm(q, weights.q_norm, eps), rms_norm(k, weights.k_norm, eps)
    q = apply_rotary(q, *rope) * (1.0 / np.sqrt(dim))
    k = apply_rotary(k, *rope)
    cache.write(layer, arrays.slot_mapping, k, v)
    attended = np.empty((tokens, heads * dim), dtype=x.dtype)
    cu = arrays.cu_seqlens
    for row, slots in enumerate(contexts):
        rows = slice(int(cu[row]), int(cu[row + 1]))
        attended[rows] = attend(
            q[rows], cache.keys[layer, slots], cache.values[layer, slots], arrays.positions[rows]
        )
    x = x + linear(attended, weights.o_proj, weights.o_bias)
    h = rms_norm(x, weights.post_norm, eps)
    return x + (silu(h @ weights.gate_proj.T) * (h @ weights.up_proj.T)) @ weights.down_proj.T


def final_hidden(
    weights: Weights, x: Array, *, cache: PagedKVCache, arrays: DispatchArrays
) -> Array:
    """Run every layer over the dispatch's input embeddings ``x`` (writing the cache) and
    return the normed hidden states of the final rows' last tokens."""
    contexts = cache.context_slots(arrays)
    rope = rotary(arrays.positions, weights.config, x.dtype)
    for layer, layer_weights in enumerate(weights.layers):
        x = decoder_layer(
            layer_weights,
            x,
            config=weights.config,
            layer=layer,
            cache=cache,
            arrays=arrays,
            contexts=contexts,
            rope=rope,
        )
    cache.mark_written(arrays.slot_mapping)
    return rms_norm(x[arrays.logits_indices], weights.norm, weights.config.rms_norm_eps)


def logits_of(weights: Weights, hidden: Array) -> Array:
    """``[rows, vocab_size]`` logits of normed final hidden states."""
    return hidden @ weights.output_embedding.T
