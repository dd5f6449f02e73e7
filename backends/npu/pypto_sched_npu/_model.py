"""The Qwen3 forward pass over one dispatch, written once against the op layer.

Per layer: RMSNorm -> fused q/k/v projection -> per-head RMSNorm of q and k -> rotary ->
write K/V to the pages -> paged causal attention (grouped-query) -> o projection ->
residual -> RMSNorm -> fused gate/up projection -> SwiGLU -> down projection -> residual.
The last layer writes every token's K/V but carries only the final rows' last tokens through
its attention, output and MLP, then the final RMSNorm and the LM head: intermediate chunks
produce no logits at all, and skip the rest of the last layer. Only those tokens get
queries there (the q rows of the fused weight), and they attend as one-token rows at their
contexts' ends (``DispatchArrays.last_tokens``), the shape of decode rows: a final chunk of
256 tokens projects and attends 1 query in the last layer, not 256. (The rotary kernel, which
takes the queries and keys of the same tokens, still runs over every token there.)

The gate and up weights are stored concatenated (gate first, as ``npu_swiglu`` expects), and
so are q, k and v: one matmul each instead of two and three.
"""

from __future__ import annotations

from typing import NamedTuple

import attrs
import numpy as np
import torch
import torch.nn.functional as F

from pypto_sched import DispatchArrays
from pypto_sched.checkpoints import (
    EMBED_TOKENS,
    FINAL_NORM,
    LM_HEAD,
    ModelConfig,
    layer_tensor_names,
)

from ._kv_cache import LayerKV, PagedKVCache
from ._loader import Checkpoint
from .ops import AttentionShape, DispatchAttention, Ops

__all__ = ["LayerWeights", "Qwen3Model", "project"]


def project(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """``F.linear`` of ``x`` by a projection weight in the ops' layout, in ``x``'s dtype.

    A weight the ops keep in another dtype (float32 for a reduced-precision model on a CPU
    without native kernels for it: :meth:`Ops.projection_weight`) multiplies ``x``
    converted to that dtype, and the product comes back in ``x``'s.
    """
    if weight.dtype == x.dtype:
        return F.linear(x, weight, bias)
    bias = None if bias is None else bias.to(weight.dtype)
    return F.linear(x.to(weight.dtype), weight, bias).to(x.dtype)


class _Pass(NamedTuple):
    """What every layer of one dispatch shares: its arrays, its tokens' rotary tables, its
    attention, and the buffer of the MLP's gate/up projection."""

    arrays: DispatchArrays
    cos: torch.Tensor
    sin: torch.Tensor
    attention: DispatchAttention
    gate_up: torch.Tensor


@attrs.frozen(eq=False, kw_only=True)
class LayerWeights:
    """One decoder layer's weights, on the device, in the compute dtype; the projections
    ``[out, in]`` in the ops' layout (:meth:`Ops.projection_weight`)."""

    input_norm: torch.Tensor
    qkv: torch.Tensor
    qkv_bias: torch.Tensor | None
    q_norm: torch.Tensor
    k_norm: torch.Tensor
    o_proj: torch.Tensor
    o_bias: torch.Tensor | None
    post_norm: torch.Tensor
    gate_up: torch.Tensor
    down: torch.Tensor


@attrs.frozen(eq=False, kw_only=True)
class Qwen3Model:
    """Weights and ops; :meth:`forward` runs one dispatch."""

    config: ModelConfig
    ops: Ops
    embed_tokens: torch.Tensor
    layers: tuple[LayerWeights, ...]
    norm: torch.Tensor
    #: ``[vocab, hidden]`` in the ops' layout (:meth:`Ops.projection_weight`).
    lm_head: torch.Tensor
    #: Rotary inverse frequencies, float32 ``[head_dim // 2]``.
    inv_freq: torch.Tensor

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.dtype

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.device

    @property
    def attention_shape(self) -> AttentionShape:
        return AttentionShape(
            num_heads=self.config.num_attention_heads,
            num_kv_heads=self.config.num_key_value_heads,
            head_dim=self.config.head_dim,
        )

    @classmethod
    def from_checkpoint(
        cls, checkpoint: Checkpoint, *, ops: Ops, device: torch.device
    ) -> Qwen3Model:
        """Move ``checkpoint``'s tensors to ``device`` and fuse the projections."""
        config, tensors = checkpoint.config, checkpoint.tensors

        def get(name: str) -> torch.Tensor:
            return tensors[name].to(device)

        def cat(*names: str) -> torch.Tensor:
            return torch.cat([tensors[name] for name in names]).to(device)

        def projection(*names: str) -> torch.Tensor:
            return ops.projection_weight(cat(*names))

        layers = []
        for i in range(config.num_hidden_layers):
            name = layer_tensor_names(config, i)  # role -> checkpoint name
            bias = config.attention_bias
            layers.append(
                LayerWeights(
                    input_norm=get(name["input_norm"]),
                    qkv=projection(name["q_proj"], name["k_proj"], name["v_proj"]),
                    qkv_bias=cat(name["q_bias"], name["k_bias"], name["v_bias"]) if bias else None,
                    q_norm=get(name["q_norm"]),
                    k_norm=get(name["k_norm"]),
                    o_proj=projection(name["o_proj"]),
                    o_bias=get(name["o_bias"]) if bias else None,
                    post_norm=get(name["post_norm"]),
                    gate_up=projection(name["gate_proj"], name["up_proj"]),
                    down=projection(name["down_proj"]),
                )
            )
        embed = get(EMBED_TOKENS)
        half = torch.arange(0, config.head_dim, 2, dtype=torch.float32, device=device)
        return cls(
            config=config,
            ops=ops,
            embed_tokens=embed,
            layers=tuple(layers),
            norm=get(FINAL_NORM),
            lm_head=ops.projection_weight(embed if config.tie_word_embeddings else get(LM_HEAD)),
            inv_freq=1.0 / (config.rope_theta ** (half / config.head_dim)),
        )

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        """Device-side embedding lookup: ``[n]`` ids -> ``[n, hidden]``."""
        return F.embedding(token_ids, self.embed_tokens)

    def forward(
        self, hidden: torch.Tensor, arrays: DispatchArrays, cache: PagedKVCache
    ) -> torch.Tensor:
        """Run one dispatch from its input embeddings ``[T, hidden]``, writing its K/V to
        ``cache``; return the last hidden states of its final rows (their last tokens),
        ``[num_final_rows, hidden]``."""
        positions = torch.from_numpy(arrays.positions.astype(np.int64)).to(self.device)
        cos, sin = self._rotary_tables(positions)
        attention = self.ops.attention(
            arrays, self.attention_shape, device=self.device, dtype=self.dtype
        )
        # Every layer's gate/up projection writes into one buffer: a fresh [T, 2 x
        # intermediate] tensor a layer costs a 2,048-token dispatch its pages again (the
        # allocator returns such blocks to the system when they are freed).
        gate_up = hidden.new_empty(
            hidden.shape[0], 2 * self.config.intermediate_size, dtype=self.layers[0].gate_up.dtype
        )
        run = _Pass(arrays, cos, sin, attention, gate_up)
        *early, (last_weights, last_kv) = zip(self.layers, cache.layers, strict=True)
        for weights, kv in early:
            hidden = self._layer(hidden, weights, kv, run)
        if arrays.logits_indices.size == arrays.num_tokens:  # every token is kept (decode)
            return self._layer(hidden, last_weights, last_kv, run)
        return self._last_layer(hidden, last_weights, last_kv, run)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Final RMSNorm and LM head: ``[n, hidden]`` -> ``[n, vocab]``."""
        normed = self.ops.rms_norm(hidden, self.norm, self.config.rms_norm_eps)
        return project(normed, self.lm_head)

    def _rotary_tables(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per token ``cos`` and ``sin`` ``[T, head_dim]`` (angles in float32)."""
        angles = positions[:, None].float() * self.inv_freq[None, :]
        angles = torch.cat((angles, angles), dim=-1)
        return angles.cos().to(self.dtype), angles.sin().to(self.dtype)

    def _layer(
        self, hidden: torch.Tensor, weights: LayerWeights, kv: LayerKV, run: _Pass
    ) -> torch.Tensor:
        """One decoder layer over every token."""
        query = self._attention_inputs(hidden, weights, kv, run)
        attended = run.attention.attend(query, kv).flatten(1)
        return self._output(attended, hidden, weights, run.gate_up)

    def _last_layer(
        self, hidden: torch.Tensor, weights: LayerWeights, kv: LayerKV, run: _Pass
    ) -> torch.Tensor:
        """The last layer: every token's K/V written, then only the final rows' last tokens
        (``arrays.logits_indices``, none for intermediate chunks) carried to the output: past
        the K/V nothing else matters. They attend as one-token rows at their contexts' ends
        (``arrays.last_tokens()``)."""
        arrays = run.arrays
        keep = torch.from_numpy(arrays.logits_indices.astype(np.int64)).to(self.device)
        query = self._attention_inputs(hidden, weights, kv, run, keep=keep)
        if not keep.numel():
            return hidden[keep]
        kept = self.ops.attention(
            arrays.last_tokens(), self.attention_shape, device=self.device, dtype=self.dtype
        )
        attended = kept.attend(query[keep], kv).flatten(1)
        return self._output(attended, hidden[keep], weights, run.gate_up)

    def _attention_inputs(
        self,
        hidden: torch.Tensor,
        weights: LayerWeights,
        kv: LayerKV,
        run: _Pass,
        *,
        keep: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """A layer's attention inputs: write every token's K/V, return the rotated queries
        ``[T, heads, head_dim]``; with ``keep``, the queries of only those tokens are
        computed (the others are zero)."""
        config, ops = self.config, self.ops
        tokens, eps, dim = hidden.shape[0], config.rms_norm_eps, config.head_dim
        heads, q_size = config.num_attention_heads, config.num_attention_heads * dim
        kv_size = config.num_key_value_heads * dim
        x = ops.rms_norm(hidden, weights.input_norm, eps)
        if keep is None:
            qkv = project(x, weights.qkv, weights.qkv_bias)
            query, key = qkv[:, :q_size], qkv[:, q_size : q_size + kv_size]
            value = qkv[:, q_size + kv_size :]
            query = ops.rms_norm(query.reshape(tokens, heads, dim), weights.q_norm, eps)
        else:
            # The q rows of the fused weight for the kept tokens, its k/v rows for every
            # token. The rotary kernel takes queries and keys of the same tokens, so the
            # kept queries ride in a zero tensor of every token's.
            bias = weights.qkv_bias
            kv_out = project(x, weights.qkv[q_size:], None if bias is None else bias[q_size:])
            key, value = kv_out[:, :kv_size], kv_out[:, kv_size:]
            query = x.new_zeros(tokens, heads, dim)
            if keep.numel():
                q_bias = None if bias is None else bias[:q_size]
                kept = project(x[keep], weights.qkv[:q_size], q_bias)
                kept = ops.rms_norm(kept.reshape(keep.numel(), heads, dim), weights.q_norm, eps)
                query.index_copy_(0, keep, kept)
        key = ops.rms_norm(
            key.reshape(tokens, config.num_key_value_heads, dim), weights.k_norm, eps
        )
        query, key = ops.rotary(query, key, run.cos, run.sin)
        run.attention.write_kv(key, value.reshape(tokens, config.num_key_value_heads, dim), kv)
        return query

    def _output(
        self,
        attended: torch.Tensor,
        hidden: torch.Tensor,
        weights: LayerWeights,
        gate_up: torch.Tensor,
    ) -> torch.Tensor:
        """The o projection, residual, RMSNorm, MLP and residual of ``attended`` tokens; the
        gate/up projection goes to the first rows of ``gate_up``."""
        ops = self.ops
        hidden = project(attended, weights.o_proj, weights.o_bias).add_(hidden)
        x = ops.rms_norm(hidden, weights.post_norm, self.config.rms_norm_eps)
        # In the weights' dtype through the SwiGLU to the down projection's output.
        x = x.to(gate_up.dtype)
        projected = torch.mm(x, weights.gate_up.t(), out=gate_up[: x.shape[0]])
        return project(ops.swiglu(projected), weights.down).to(hidden.dtype).add_(hidden)
