"""What the model asks of an op implementation.

The forward pass is written once, against :class:`Ops`; :mod:`._torch_ops` implements it with
portable torch (any device), :mod:`._npu_ops` with torch_npu's fused kernels. Attention needs
per-dispatch preparation (index tensors, lengths, block tables) that every layer shares, so
:meth:`Ops.attention` builds a :class:`DispatchAttention` once per dispatch.

Shapes: token-level tensors are flat over the dispatch, rows concatenated (``T`` tokens);
``query`` is ``[T, num_heads, head_dim]``, ``key``/``value`` ``[T, num_kv_heads, head_dim]``,
``cos``/``sin`` ``[T, head_dim]``.
"""

from __future__ import annotations

import math
from typing import Protocol

import attrs
import torch

from pypto_sched import DispatchArrays

from .._kv_cache import LayerKV

__all__ = ["AttentionShape", "DispatchAttention", "Ops"]


@attrs.frozen(kw_only=True)
class AttentionShape:
    """The head layout of the model's attention."""

    num_heads: int
    num_kv_heads: int
    head_dim: int

    @property
    def scale(self) -> float:
        return 1.0 / math.sqrt(self.head_dim)


class DispatchAttention(Protocol):
    """Paged attention for one dispatch, prepared once and used by every layer."""

    def write_kv(self, key: torch.Tensor, value: torch.Tensor, cache: LayerKV) -> None:
        """Store the dispatch's keys and values at its slots, and nowhere else."""
        ...

    def attend(self, query: torch.Tensor, cache: LayerKV) -> torch.Tensor:
        """Causal attention of each row's queries over its whole cached context
        (``[T, num_heads, head_dim]`` in the query's dtype)."""
        ...


class Ops(Protocol):
    """The kernels of a Qwen3 forward pass."""

    @property
    def name(self) -> str: ...

    def kv_cache_dtype(self, compute_dtype: torch.dtype, device: torch.device) -> torch.dtype:
        """The dtype the KV pages are stored in when the model computes in ``compute_dtype``."""
        ...

    def kv_heads_first(self, device: torch.device) -> bool:
        """Whether the KV pages on ``device`` are stored KV heads first (see
        :meth:`PagedKVCache.allocate <pypto_sched_npu._kv_cache.PagedKVCache.allocate>`)."""
        ...

    def projection_weight(self, weight: torch.Tensor) -> torch.Tensor:
        """``weight`` (``[out, in]``) in the memory layout the projections read fastest:
        the same shape and values, possibly other strides."""
        ...

    def check_page_size(self, page_size: int) -> None:
        """Raise :class:`~pypto_sched.InvalidInputError` if the kernels cannot use pages of
        ``page_size`` slots."""
        ...

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """RMS-normalise ``x`` over its last dimension and scale by ``weight``."""
        ...

    def rotary(
        self, query: torch.Tensor, key: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotate ``query`` and ``key`` (rotate-half convention) by each token's position."""
        ...

    def swiglu(self, gate_up: torch.Tensor) -> torch.Tensor:
        """``silu(gate) * up`` where ``gate_up`` holds the gate half first; ``gate_up`` may
        be overwritten (the model never reads it again)."""
        ...

    def attention(
        self,
        arrays: DispatchArrays,
        shape: AttentionShape,
        *,
        device: torch.device,
        dtype: torch.dtype,
    ) -> DispatchAttention:
        """Prepare the paged attention of one dispatch whose queries are ``dtype``."""
        ...
