"""The Ascend ops: torch_npu's fused kernels, called the way vllm-ascend calls them.

Per layer, attention is two kernel calls:

* ``npu_scatter_pa_kv_cache(key, value, key_cache, value_cache, slot_mapping,
  cache_mode="Norm")`` writes the dispatch's ``[T, kv_heads, head_dim]`` keys and values into
  the ``[num_pages, page_size, kv_heads, head_dim]`` pages at its slots (int32).
* ``npu_fused_infer_attention_score`` over the pages viewed as ``[num_pages, page_size,
  kv_heads * head_dim]``, with an int32 ``block_table``, ``block_size`` the page size and
  ``actual_seq_lengths_kv`` the *per-row* context lengths, in one of two layouts chosen per
  dispatch (:meth:`NpuOps.attention`):

  - **Prefill or mixed** (some row has more than one query token; decode rows may sit beside
    prefill chunks): ``input_layout="TND"`` (query ``[T, heads, head_dim]``),
    ``actual_seq_lengths`` the *cumulative* query ends (``cu_seqlens[1:]``), and
    ``sparse_mode=3`` (causal aligned to the bottom right, which is exactly chunked prefill
    over a cached prefix, and a decode row's one query seeing its whole context) with the
    shared 2048 x 2048 int8 upper-triangular mask: vllm-ascend's chunked-prefill call.
  - **Decode only** (every row is one query token at position ``context - 1``):
    ``input_layout="BSH"`` with query ``[rows, 1, heads * head_dim]``, ``actual_seq_lengths``
    the *per-row* query lengths (all 1), no mask and ``sparse_mode=0``: with one query token
    the kernel takes its incremental (IncreFlashAttention) branch, which attends to the
    row's whole context (torch_npu's documentation of the op: a query whose S is 1 takes
    that branch). This is the decode call of vllm-ascend's
    ``vllm_ascend/attention/attention_v1.py`` (``_forward_decode_only``, its
    ``npu_fused_infer_attention_score`` branch: query viewed ``[batch, 1, heads *
    head_size]``, caches flattened to ``[blocks, block_size, kv_heads * head_size]``,
    ``actual_seq_lengths=[1] * batch``); its mixed dispatches take the TND call above
    (``_forward_v1_style``).

  The kernel takes pages of 128 to 512 slots in steps of 128 when a query row has more than
  one token (16 to 512 in steps of 16 for decode only); generation mixes both kinds of
  dispatch over one cache, so :meth:`NpuOps.check_page_size` asks for the prefill rule when
  the cache is made. Block-table padding (-1 from the planner) becomes page 0: the kernel
  does not check block ids, and never reads past a row's context length.

RMSNorm, SwiGLU and rotary use ``npu_rms_norm`` (which returns ``(y, rstd)``), ``npu_swiglu``
(gate half first) and ``npu_apply_rotary_pos_emb`` (in place, ``BSND``, head_dim 64 or 128;
other head sizes use the portable rotary).

Precision: the attention kernels take float16 and bfloat16 only. A float32 model on an NPU
device keeps its pages in bfloat16 and casts the query in and the output back
(:meth:`NpuOps.kv_cache_dtype`). On a CPU tensor (the test harness with a fake torch_npu)
float32 stays float32, so the marshalling can be checked against transformers exactly.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import attrs
import numpy as np
import torch

from pypto_sched import DispatchArrays, InvalidInputError

from .._kv_cache import LayerKV
from ._protocol import AttentionShape
from ._torch_ops import rotate_half_embedding

__all__ = [
    "MASK_SIZE",
    "MAX_PAGE_SIZE",
    "PAGE_SIZE_STEP",
    "ROTARY_HEAD_DIMS",
    "NpuOps",
    "causal_mask",
]

#: Side of the compressed causal mask that sparse modes 2-4 require.
MASK_SIZE = 2048
#: Head sizes ``npu_apply_rotary_pos_emb`` accepts.
ROTARY_HEAD_DIMS = frozenset({64, 128})
#: KV block sizes the attention kernel takes when a query row has more than one token.
PAGE_SIZE_STEP = 128
MAX_PAGE_SIZE = 512


def causal_mask(device: torch.device) -> torch.Tensor:
    """The 2048 x 2048 int8 mask, 1 above the diagonal: the positions a query must not see."""
    return torch.triu(torch.ones(MASK_SIZE, MASK_SIZE, dtype=torch.int8, device=device), 1)


@attrs.frozen(eq=False)
class NpuOps:
    """Ops that call ``torch_npu`` (the real module, or the tests' fake)."""

    torch_npu: ModuleType
    _masks: dict[torch.device, torch.Tensor] = attrs.field(factory=dict, init=False)

    @property
    def name(self) -> str:
        return "npu"

    def kv_cache_dtype(self, compute_dtype: torch.dtype, device: torch.device) -> torch.dtype:
        if device.type == "npu" and compute_dtype == torch.float32:
            return torch.bfloat16
        return compute_dtype

    def projection_weight(self, weight: torch.Tensor) -> torch.Tensor:
        """As stored, ``[out, in]`` and contiguous."""
        return weight

    def check_page_size(self, page_size: int) -> None:
        """Prefill PageAttention takes blocks of 128 to 512 slots, in steps of 128."""
        if page_size % PAGE_SIZE_STEP or not PAGE_SIZE_STEP <= page_size <= MAX_PAGE_SIZE:
            raise InvalidInputError(
                f"'page_size' must be a multiple of {PAGE_SIZE_STEP} in [{PAGE_SIZE_STEP}, "
                f"{MAX_PAGE_SIZE}] for npu_fused_infer_attention_score: {page_size}"
            )

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        normed: torch.Tensor = self.torch_npu.npu_rms_norm(x, weight, epsilon=eps)[0]
        return normed

    def rotary(
        self, query: torch.Tensor, key: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        tokens, heads, dim = query.shape
        if dim not in ROTARY_HEAD_DIMS:
            return rotate_half_embedding(query, cos, sin), rotate_half_embedding(key, cos, sin)
        query = query.contiguous().view(1, tokens, heads, dim)
        key = key.contiguous().view(1, tokens, key.shape[1], dim)
        table_shape = (1, tokens, 1, dim)
        self.torch_npu.npu_apply_rotary_pos_emb(
            query, key, cos.reshape(table_shape), sin.reshape(table_shape), layout="BSND"
        )
        return query[0], key[0]

    def swiglu(self, gate_up: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.torch_npu.npu_swiglu(gate_up.contiguous(), dim=-1)
        return out

    def attention(
        self,
        arrays: DispatchArrays,
        shape: AttentionShape,
        *,
        device: torch.device,
        dtype: torch.dtype,
    ) -> NpuAttention | NpuDecodeAttention:
        """The decode-only call when every row has one query token, else the TND call."""
        tables = np.where(arrays.block_tables < 0, 0, arrays.block_tables).astype(np.int32)
        block_table = torch.from_numpy(tables).to(device)
        slots = torch.from_numpy(arrays.slot_mapping.astype(np.int32)).to(device)
        seq_lens = [int(length) for length in arrays.seq_lens]
        # A one-token row's query sits at its context's last position (decode rows, and
        # one-token prefill chunks alike), so it sees its whole context: no mask needed.
        if arrays.num_tokens == arrays.num_rows:
            return NpuDecodeAttention(
                torch_npu=self.torch_npu,
                shape=shape,
                slots=slots,
                block_table=block_table,
                seq_lens=seq_lens,
            )
        mask = self._masks.get(device)
        if mask is None:
            mask = self._masks.setdefault(device, causal_mask(device))
        return NpuAttention(
            torch_npu=self.torch_npu,
            shape=shape,
            slots=slots,
            block_table=block_table,
            query_ends=[int(end) for end in arrays.cu_seqlens[1:]],
            seq_lens=seq_lens,
            mask=mask,
        )


def _write_kv(
    torch_npu: ModuleType,
    key: torch.Tensor,
    value: torch.Tensor,
    cache: LayerKV,
    slots: torch.Tensor,
) -> None:
    torch_npu.npu_scatter_pa_kv_cache(
        key.to(cache.key.dtype).contiguous(),
        value.to(cache.value.dtype).contiguous(),
        cache.key,
        cache.value,
        slots,
        cache_mode="Norm",
    )


@attrs.frozen(eq=False, kw_only=True)
class NpuAttention:
    """One prefill (or mixed) dispatch's kernel arguments, shared by every layer: TND."""

    torch_npu: ModuleType
    shape: AttentionShape
    slots: torch.Tensor
    block_table: torch.Tensor
    #: Cumulative query lengths without the leading 0 (``actual_seq_lengths``).
    query_ends: list[int]
    #: Per-row context lengths (``actual_seq_lengths_kv``).
    seq_lens: list[int]
    mask: torch.Tensor

    def write_kv(self, key: torch.Tensor, value: torch.Tensor, cache: LayerKV) -> None:
        _write_kv(self.torch_npu, key, value, cache, self.slots)

    def attend(self, query: torch.Tensor, cache: LayerKV) -> torch.Tensor:
        pages, page_size = cache.num_pages, cache.page_size
        result: tuple[Any, ...] = self.torch_npu.npu_fused_infer_attention_score(
            query.to(cache.key.dtype).contiguous(),
            cache.key.view(pages, page_size, -1),
            cache.value.view(pages, page_size, -1),
            atten_mask=self.mask,
            block_table=self.block_table,
            input_layout="TND",
            block_size=page_size,
            actual_seq_lengths=self.query_ends,
            actual_seq_lengths_kv=self.seq_lens,
            num_heads=self.shape.num_heads,
            num_key_value_heads=self.shape.num_kv_heads,
            scale=self.shape.scale,
            sparse_mode=3,
        )
        out: torch.Tensor = result[0]
        return out.to(query.dtype)


@attrs.frozen(eq=False, kw_only=True)
class NpuDecodeAttention:
    """One decode-only dispatch's kernel arguments (one query token per row): BSH."""

    torch_npu: ModuleType
    shape: AttentionShape
    slots: torch.Tensor
    block_table: torch.Tensor
    #: Per-row context lengths (``actual_seq_lengths_kv``), this token included.
    seq_lens: list[int]

    def write_kv(self, key: torch.Tensor, value: torch.Tensor, cache: LayerKV) -> None:
        _write_kv(self.torch_npu, key, value, cache, self.slots)

    def attend(self, query: torch.Tensor, cache: LayerKV) -> torch.Tensor:
        rows, heads, dim = query.shape
        pages, page_size = cache.num_pages, cache.page_size
        result: tuple[Any, ...] = self.torch_npu.npu_fused_infer_attention_score(
            query.to(cache.key.dtype).reshape(rows, 1, heads * dim).contiguous(),
            cache.key.view(pages, page_size, -1),
            cache.value.view(pages, page_size, -1),
            block_table=self.block_table,
            input_layout="BSH",
            block_size=page_size,
            actual_seq_lengths=[1] * rows,
            actual_seq_lengths_kv=self.seq_lens,
            num_heads=self.shape.num_heads,
            num_key_value_heads=self.shape.num_kv_heads,
            scale=self.shape.scale,
        )
        out: torch.Tensor = result[0]
        return out.view(rows, heads, dim).to(query.dtype)
