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

  Each form has its own documented limits, and a dispatch whose call would break one
  takes the portable torch attention instead (:meth:`NpuOps.prefill_problem`):

  - **The TND call needs CANN 8.3 or later.** Older releases reject TND queries over
    PagedAttention (torch_npu's documentation of the op lists "page attention" among what
    TND with head_dim != 512 does not support; vllm-ascend issue #4373), and vllm-ascend
    makes this call only when ``torch.version.cann`` (which importing torch_npu sets)
    starts with "8.3". An unknown version counts as too old.
  - **TND takes head_dim 64 or 128** here, query, key and value alike (ops-transformer's
    aclnnFusedInferAttentionScoreV4, TND section; the kernel's own message in vllm-ascend
    PR #9632; 192 only with a value head of 128, which Qwen3 does not have).
  - **TND takes bfloat16** (torch_npu's documentation of the op: data type bfloat16 only;
    aclnnFusedInferAttentionScoreV4 adds float16, but not every version does), so float16
    models attend prefill and mixed dispatches with the portable torch path and keep their
    precision; their decode-only dispatches still take the BSH call.
  - **Rows per call** (:meth:`NpuOps.rows_problem`): the TND call takes at most 4,096 rows
    (``actual_seq_lengths`` and ``actual_seq_lengths_kv`` hold at most 4,096 entries each:
    torch_npu's documentation of the op and aclnnFusedInferAttentionScoreV4, TND section),
    the decode call at most 65,536 rows (B) of at most 262,144 keys each (KV_S). A budget
    of more than 4,096 tokens can plan a mixed dispatch of more rows (many decode rows
    beside a prefill chunk); it takes the portable attention.

  Pages must be exactly :data:`PAGE_SIZE` (128) slots. The prefill call's documented block
  sizes differ by version: multiples of 128 in [128, 512] (torch_npu's documentation of
  the op, Q_S > 1), at most 128 and 16-aligned for a TND query over ``[blocks, block_size,
  H]`` pages (aclnnFusedInferAttentionScoreV4); 128 is the one size both allow, and the
  decode call takes it too (16 to 512 in steps of 16). Generation mixes both kinds of
  dispatch over one cache, so :meth:`NpuOps.check_page_size` asks for it when the cache is
  made. Block-table padding (-1 from the planner) becomes page 0: the kernel does not check
  block ids, and never reads past a row's context length.

RMSNorm, SwiGLU and rotary use ``npu_rms_norm`` (which returns ``(y, rstd)``), ``npu_swiglu``
(gate half first) and ``npu_apply_rotary_pos_emb`` (in place, ``BSND``, head_dim 128 only:
ops-transformer's aclnnApplyRotaryPosEmb requires the last dim D to equal 128 for query,
key, cos and sin; other head sizes use the portable rotary).

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
from ._torch_ops import TorchAttention, rotate_half_embedding

__all__ = [
    "MASK_SIZE",
    "MIN_CANN_FOR_PREFILL",
    "PAGE_SIZE",
    "PREFILL_HEAD_DIMS",
    "ROTARY_HEAD_DIMS",
    "NpuOps",
    "causal_mask",
    "installed_cann_version",
]

#: Side of the compressed causal mask that sparse modes 2-4 require.
MASK_SIZE = 2048
#: Head sizes ``npu_apply_rotary_pos_emb`` accepts.
ROTARY_HEAD_DIMS = frozenset({128})
#: Head sizes the TND prefill call takes over paged K/V (query, key and value alike).
PREFILL_HEAD_DIMS = frozenset({64, 128})
#: The first CANN release (major, minor) whose TND prefill call takes paged K/V.
MIN_CANN_FOR_PREFILL = (8, 3)
#: The KV block size every documented version of both attention calls takes.
PAGE_SIZE = 128
#: The most rows (entries of ``actual_seq_lengths``) the TND prefill call takes.
PREFILL_MAX_ROWS = 4096
#: The most rows (B) and keys per row (KV_S) the BSH decode call takes.
DECODE_MAX_ROWS = 65536
DECODE_MAX_KEYS = 262144


def causal_mask(device: torch.device) -> torch.Tensor:
    """The 2048 x 2048 int8 mask, 1 above the diagonal: the positions a query must not see."""
    return torch.triu(torch.ones(MASK_SIZE, MASK_SIZE, dtype=torch.int8, device=device), 1)


def installed_cann_version() -> str | None:
    """The CANN toolkit's version as torch_npu reports it (``torch.version.cann``, set when
    torch_npu is imported), or None when nothing says."""
    version = getattr(torch.version, "cann", None)
    return version if isinstance(version, str) and version else None


def _release(version: str | None) -> tuple[int, int] | None:
    """``(major, minor)`` of a CANN version such as ``"8.3.RC1"`` or ``"8.5.0"``."""
    parts = (version or "").split(".")
    if len(parts) < 2 or not (parts[0].isdigit() and parts[1].isdigit()):
        return None
    return int(parts[0]), int(parts[1])


@attrs.frozen(eq=False)
class NpuOps:
    """Ops that call ``torch_npu`` (the real module, or the tests' fake).

    ``cann_version`` is the installed CANN's (by default what torch_npu reports); it decides
    whether prefill dispatches may take the TND kernel (:meth:`prefill_problem`).
    """

    torch_npu: ModuleType
    cann_version: str | None = attrs.field(factory=installed_cann_version, kw_only=True)
    _masks: dict[torch.device, torch.Tensor] = attrs.field(factory=dict, init=False)

    @property
    def name(self) -> str:
        return "npu"

    def kv_cache_dtype(self, compute_dtype: torch.dtype, device: torch.device) -> torch.dtype:
        if device.type == "npu" and compute_dtype == torch.float32:
            return torch.bfloat16
        return compute_dtype

    def kv_heads_first(self, device: torch.device) -> bool:
        """No: ``npu_scatter_pa_kv_cache`` and the attention calls read the ``"Norm"``
        layout, slots first."""
        return False

    def projection_weight(self, weight: torch.Tensor) -> torch.Tensor:
        """As stored, ``[out, in]`` and contiguous."""
        return weight

    def check_page_size(self, page_size: int) -> None:
        """Both attention calls take pages of 128 slots (see the module docstring)."""
        if page_size != PAGE_SIZE:
            raise InvalidInputError.about(
                "page_size",
                f"must be {PAGE_SIZE} for npu_fused_infer_attention_score (the "
                f"one block size its prefill and decode calls take in every documented "
                f"version): {page_size}",
            )

    def prefill_problem(self, shape: AttentionShape, page_dtype: torch.dtype) -> str | None:
        """Why a dispatch with rows longer than one token cannot take the TND kernel over
        pages of ``page_dtype``, or None when it can (see the module docstring)."""
        release = _release(self.cann_version)
        if release is None or release < MIN_CANN_FOR_PREFILL:
            return f"CANN {self.cann_version} is older than 8.3 or unknown"
        if shape.head_dim not in PREFILL_HEAD_DIMS:
            return f"head_dim {shape.head_dim} is not one of {sorted(PREFILL_HEAD_DIMS)}"
        # float32 pages reach the kernel only off an NPU: the tests' fake (kv_cache_dtype).
        if page_dtype == torch.float16:
            return "the TND call takes bfloat16, not float16"
        return None

    def rows_problem(self, arrays: DispatchArrays, *, decode_only: bool) -> str | None:
        """Why a dispatch has too many rows (or too long ones) for its attention call, or
        None when it fits (see the module docstring)."""
        if not decode_only:
            if arrays.num_rows > PREFILL_MAX_ROWS:
                return f"{arrays.num_rows} rows, more than the TND call's {PREFILL_MAX_ROWS}"
            return None
        if arrays.num_rows > DECODE_MAX_ROWS:
            return f"{arrays.num_rows} rows, more than the decode call's {DECODE_MAX_ROWS}"
        longest = int(arrays.seq_lens.max(initial=0))
        if longest > DECODE_MAX_KEYS:
            return f"a row of {longest} keys, more than the decode call's {DECODE_MAX_KEYS}"
        return None

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
    ) -> NpuAttention | NpuDecodeAttention | TorchAttention:
        """The decode-only call when every row has one query token, else the TND call, or
        the portable attention where the call cannot run (:meth:`prefill_problem`,
        :meth:`rows_problem`)."""
        # A one-token row's query sits at its context's last position (decode rows, and
        # one-token prefill chunks alike), so it sees its whole context: no mask needed.
        decode_only = arrays.num_tokens == arrays.num_rows
        page_dtype = self.kv_cache_dtype(dtype, device)
        if (
            not decode_only and self.prefill_problem(shape, page_dtype) is not None
        ) or self.rows_problem(arrays, decode_only=decode_only) is not None:
            return TorchAttention.prepare(arrays, shape, device=device, dtype=dtype)
        tables = np.where(arrays.block_tables < 0, 0, arrays.block_tables).astype(np.int32)
        block_table = torch.from_numpy(tables).to(device)
        slots = torch.from_numpy(arrays.slot_mapping.astype(np.int32)).to(device)
        seq_lens = [int(length) for length in arrays.seq_lens]
        if decode_only:
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
