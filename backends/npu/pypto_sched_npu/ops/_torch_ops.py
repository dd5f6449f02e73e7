"""The portable ops: plain torch, on any device (the CPU path).

Attention writes the dispatch's K/V into the pages with one ``index_copy_`` per layer, then
attends row group by row group (rows of similar chunk and context lengths, so that padding
costs at most twice a row's queries and keys): it gathers each row's whole context (cached
prefix, earlier chunks and this chunk) through its block table into a ``[rows, kv_heads,
longest context, head_dim]`` tensor and runs one ``scaled_dot_product_attention`` over the
group's rows. The gather copies whole pages (one ``index_select`` over the page dimension,
about twice as fast as gathering slot by slot); a lone row whose context fills consecutive
slots is read in place. The mask is causal with each row's offset: query ``i`` of a row with
``q`` new tokens and context ``c`` sees keys ``j <= c - q + i``. Rows shorter than the group's
longest are padded; padded keys are masked out and padded queries are dropped, and no query
row is ever fully masked (a padded query ``i >= q`` sees the whole context). When every row's
chunk is its whole context, the kernel's own causal flag replaces the mask (and skips the
blocks above the diagonal). The gather indices and the masks depend only on the dispatch, so
they are built once and shared by every layer. A decode row (one query token at its
context's last position) is a chunk of one: decode rows need no query padding, and their
mask only hides the keys past each row's context. A group of decode rows hands the kernel
each KV head's query heads as that head's queries (``[rows, kv_heads, heads per KV head,
head_dim]``, a view): the same products, each key read once for the query heads sharing it.
"""

from __future__ import annotations

import attrs
import numpy as np
import numpy.typing as npt
import torch
import torch.nn.functional as F

from pypto_sched import DispatchArrays

from .._kv_cache import LayerKV
from ._protocol import AttentionShape

__all__ = ["TorchOps", "rotate_half_embedding"]

#: ``scaled_dot_product_attention`` takes ``enable_gqa`` from torch 2.5 on.
_NATIVE_GQA = tuple(int(part) for part in torch.__version__.split(".")[:2]) >= (2, 5)


def rotate_half_embedding(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x * cos + rotate_half(x) * sin`` for ``x`` ``[T, heads, D]`` and ``cos`` ``[T, D]``.

    ``rotate_half(x)`` is ``[-x2, x1]`` for halves ``x1, x2``; it is applied half by half in
    place rather than materialised.
    """
    half = x.shape[-1] // 2
    cos, sin = cos[:, None, :], sin[:, None, :]
    out = x * cos
    out[..., :half].addcmul_(x[..., half:], sin[..., :half], value=-1)
    out[..., half:].addcmul_(x[..., :half], sin[..., half:])
    return out


@attrs.frozen
class TorchOps:
    """Ops written with portable torch."""

    @property
    def name(self) -> str:
        return "torch"

    def kv_cache_dtype(self, compute_dtype: torch.dtype, device: torch.device) -> torch.dtype:
        return compute_dtype

    def projection_weight(self, weight: torch.Tensor) -> torch.Tensor:
        """Stored ``[in, out]`` (a transposed view of it is returned): ``F.linear`` then
        hands the BLAS a plain ``x @ W`` product, faster on the CPU for 256-token dispatches,
        whose weights come from memory at every dispatch (figures: the README's
        *Benchmark*)."""
        return weight.t().contiguous().t()

    def check_page_size(self, page_size: int) -> None:
        """Any page size works: pages are gathered by index."""

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        # In float32 whatever the compute dtype, as transformers' Qwen3RMSNorm does.
        x32 = x.float()
        # mean(x^2) as |x|^2 / D: one reduction, no squared copy of x.
        norm: torch.Tensor = torch.linalg.vector_norm(x32, dim=-1, keepdim=True)
        scale = norm.square_().div_(x.shape[-1]).add_(eps).rsqrt_()
        return (x32 * scale).to(x.dtype).mul_(weight)

    def rotary(
        self, query: torch.Tensor, key: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return rotate_half_embedding(query, cos, sin), rotate_half_embedding(key, cos, sin)

    def swiglu(self, gate_up: torch.Tensor) -> torch.Tensor:
        # In place in the gate half (the result is a view of ``gate_up`` with its row
        # stride, which the down projection reads as it is): no new tensor of
        # ``[T, intermediate]``, whose allocation a 2,048-token dispatch paid for in page faults.
        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(gate, inplace=True).mul_(up)

    def attention(
        self,
        arrays: DispatchArrays,
        shape: AttentionShape,
        *,
        device: torch.device,
        dtype: torch.dtype,
    ) -> TorchAttention:
        return TorchAttention.prepare(arrays, shape, device=device, dtype=dtype)


@attrs.frozen(eq=False, kw_only=True)
class TorchAttention:
    """One dispatch's attention, prepared once and shared by every layer: its rows in groups
    of similar chunk and context lengths (:func:`_row_groups`), one SDPA call a group."""

    shape: AttentionShape
    #: Per token: its KV slot.
    slots: torch.Tensor
    groups: tuple[RowGroup, ...]

    @classmethod
    def prepare(
        cls,
        arrays: DispatchArrays,
        shape: AttentionShape,
        *,
        device: torch.device,
        dtype: torch.dtype,
    ) -> TorchAttention:
        query_lens = np.diff(arrays.cu_seqlens).astype(np.int64)
        members = _row_groups(query_lens, arrays.seq_lens.astype(np.int64))
        return cls(
            shape=shape,
            slots=_to_device(arrays.slot_mapping, device),
            groups=tuple(
                RowGroup.prepare(arrays, rows, device=device, dtype=dtype) for rows in members
            ),
        )

    def write_kv(self, key: torch.Tensor, value: torch.Tensor, cache: LayerKV) -> None:
        heads, dim = self.shape.num_kv_heads, self.shape.head_dim
        cache.key.view(-1, heads, dim).index_copy_(0, self.slots, key.to(cache.key.dtype))
        cache.value.view(-1, heads, dim).index_copy_(0, self.slots, value.to(cache.value.dtype))

    def attend(self, query: torch.Tensor, cache: LayerKV) -> torch.Tensor:
        if len(self.groups) == 1:
            return self.groups[0].attend(query, cache, self.shape)
        out = torch.empty_like(query)
        for group in self.groups:
            tokens = group.tokens
            assert tokens is not None  # only a lone group holds every row in order
            out.index_copy_(0, tokens, group.attend(query[tokens], cache, self.shape))
        return out


@attrs.frozen(eq=False, kw_only=True)
class RowGroup:
    """Rows attended together: their contexts gathered into one padded
    ``[rows, kv_heads, longest context, head_dim]`` tensor, their queries into
    ``[rows, heads, longest chunk, head_dim]``.

    Grouped-query attention is the kernel's own (``enable_gqa``), so keys and values are not
    copied per query head (torch < 2.5 repeats them instead).
    """

    #: The dispatch's tokens of these rows, in row order; ``None`` for every token in
    #: dispatch order (one group of all the rows).
    tokens: torch.Tensor | None
    #: ``[rows, pages]``: the pages holding each row's context, in order (page 0 past the
    #: end of a row's table: those keys are masked out).
    context_pages: torch.Tensor
    longest_context: int
    #: The first slot of a single row whose context fills consecutive slots (pages in order,
    #: the usual layout), read as a view instead of gathered; else ``None``.
    context_start: int | None
    #: ``[rows, 1, longest chunk, longest context]`` additive mask (0 where a query sees a
    #: key, -inf elsewhere), or ``None`` when none is needed (see ``causal``).
    mask: torch.Tensor | None
    #: Plain causal attention is exact: every row's chunk is its whole context.
    causal: bool
    #: Per token: its place in the ``[rows * longest chunk]`` padded layout, or ``None`` when
    #: every row has the longest chunk's length (no padding: one row, or decode rows).
    padded_index: torch.Tensor | None
    num_rows: int
    longest_chunk: int

    @classmethod
    def prepare(
        cls,
        arrays: DispatchArrays,
        rows: npt.NDArray[np.int64],
        *,
        device: torch.device,
        dtype: torch.dtype,
    ) -> RowGroup:
        cu = arrays.cu_seqlens.astype(np.int64)
        query_lens = (cu[1:] - cu[:-1])[rows]
        seq_lens = arrays.seq_lens.astype(np.int64)[rows]
        count, longest_chunk = rows.size, int(query_lens.max())
        longest_context = int(seq_lens.max())
        position = np.arange(longest_context)
        in_context = position[None, :] < seq_lens[:, None]
        num_pages = -(-longest_context // arrays.page_size)
        tables = arrays.block_tables[rows][:, :num_pages].astype(np.int64)
        used = np.arange(num_pages)[None, :] * arrays.page_size < seq_lens[:, None]
        pages = np.where(used & (tables >= 0), tables, 0)
        first = int(pages[0, 0]) * arrays.page_size
        consecutive = count == 1 and bool((pages[0] == pages[0, 0] + np.arange(num_pages)).all())
        # Top-left causal is exact when each row's chunk is its whole context: a row's query
        # i sees its keys up to i, and padding lies past its last query and key.
        causal = longest_chunk > 1 and bool((seq_lens == query_lens).all())
        mask = None
        visible = _visible(query_lens, seq_lens, in_context)
        if not causal and not visible.all():
            additive = torch.zeros(visible.shape, dtype=dtype)
            additive.masked_fill_(torch.from_numpy(~visible), float("-inf"))
            mask = additive[:, None].to(device)
        local_cu = np.concatenate(([0], np.cumsum(query_lens)))
        everything = count == arrays.num_rows
        return cls(
            tokens=None
            if everything
            else _to_device(np.concatenate([np.arange(cu[r], cu[r + 1]) for r in rows]), device),
            context_pages=_to_device(pages, device),
            longest_context=longest_context,
            context_start=first if consecutive else None,
            mask=mask,
            causal=causal,
            padded_index=None
            if int(local_cu[-1]) == count * longest_chunk
            else _to_device(_padded_index(local_cu, longest_chunk), device),
            num_rows=count,
            longest_chunk=longest_chunk,
        )

    def attend(self, query: torch.Tensor, cache: LayerKV, shape: AttentionShape) -> torch.Tensor:
        """Attention of these rows' queries (``[tokens, heads, head_dim]``, row order)."""
        heads, dim = shape.num_heads, shape.head_dim
        rows, width = self.num_rows, self.longest_chunk
        key, value = (
            self._context(pages, query.dtype, shape) for pages in (cache.key, cache.value)
        )
        if width == 1:  # decode rows: query heads sharing a KV head become its queries
            grouped = query.reshape(rows, shape.num_kv_heads, heads // shape.num_kv_heads, dim)
            out = F.scaled_dot_product_attention(grouped, key, value, self.mask, scale=shape.scale)
            return out.reshape(rows, heads, dim)  # a view when the kernel's output is contiguous
        if self.padded_index is None:
            padded = query
        else:
            padded = query.new_zeros(rows * width, heads, dim)
            padded.index_copy_(0, self.padded_index, query)
        out = self._sdpa(padded.view(rows, width, heads, dim).transpose(1, 2), key, value, shape)
        out = out.transpose(1, 2).reshape(rows * width, heads, dim)
        return out if self.padded_index is None else out[self.padded_index]

    def _sdpa(
        self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, shape: AttentionShape
    ) -> torch.Tensor:
        """``[rows, heads, width, dim]`` queries over ``[rows, kv_heads, context, dim]``."""
        grouped = shape.num_heads != shape.num_kv_heads
        if _NATIVE_GQA:
            return F.scaled_dot_product_attention(
                query, key, value, self.mask, is_causal=self.causal, scale=shape.scale,
                enable_gqa=grouped,
            )  # fmt: skip
        if grouped:
            groups = shape.num_heads // shape.num_kv_heads
            key = key.repeat_interleave(groups, dim=1)
            value = value.repeat_interleave(groups, dim=1)
        return F.scaled_dot_product_attention(
            query, key, value, self.mask, is_causal=self.causal, scale=shape.scale
        )

    def _context(
        self, pages: torch.Tensor, dtype: torch.dtype, shape: AttentionShape
    ) -> torch.Tensor:
        """Each row's whole context from ``pages``: ``[rows, kv_heads, context, dim]``."""
        heads, dim, length = shape.num_kv_heads, shape.head_dim, self.longest_context
        if self.context_start is not None:
            flat = pages.view(-1, heads, dim)
            gathered = flat.narrow(0, self.context_start, length).unsqueeze(0)
        else:
            whole = pages.index_select(0, self.context_pages.view(-1))
            gathered = whole.view(self.num_rows, -1, heads, dim)[:, :length]
        return gathered.transpose(1, 2).to(dtype)


def _row_groups(
    query_lens: npt.NDArray[np.int64], seq_lens: npt.NDArray[np.int64]
) -> list[npt.NDArray[np.int64]]:
    """The dispatch's rows (indices, ascending in each group) in groups that pad little.

    Padding every row to the dispatch's longest chunk and context costs what the longest
    row costs, times the rows: a decode row beside a prefill chunk of 2,000 tokens would
    attend 2,000 padded queries, a decode row of 20 tokens of context would gather 2,000.
    A group holds rows of one power-of-two class of chunk length whose contexts are at least
    half the group's longest, so padding at most doubles a row's queries and its keys.
    """
    chunk_class = np.frexp(query_lens.astype(np.float64))[1]
    order = np.lexsort((-seq_lens, chunk_class))
    groups: list[npt.NDArray[np.int64]] = []
    start = 0
    for i in range(1, order.size + 1):
        if i < order.size:
            row, lead = order[i], order[start]
            if chunk_class[row] == chunk_class[lead] and 2 * seq_lens[row] >= seq_lens[lead]:
                continue
        groups.append(np.sort(order[start:i]).astype(np.int64))
        start = i
    return groups


def _visible(
    query_lens: npt.NDArray[np.int64],
    seq_lens: npt.NDArray[np.int64],
    in_context: npt.NDArray[np.bool_],
) -> npt.NDArray[np.bool_]:
    """``[rows, longest chunk, longest context]``: key ``j`` is visible to query ``i``."""
    query = np.arange(int(query_lens.max()))
    key = np.arange(in_context.shape[1])
    offset = (seq_lens - query_lens)[:, None, None]
    visible = key[None, None, :] <= query[None, :, None] + offset
    return visible & in_context[:, None, :]


def _padded_index(cu_seqlens: npt.NDArray[np.int32], width: int) -> npt.NDArray[np.int64]:
    """Per token: ``row * width + offset in row``."""
    cu = cu_seqlens.astype(np.int64)
    lengths = np.diff(cu)
    row = np.repeat(np.arange(lengths.size), lengths)
    return row * width + np.arange(int(cu[-1])) - cu[row]


def _to_device(array: npt.NDArray[np.generic], device: torch.device) -> torch.Tensor:
    # A copy: the planner's arrays are read-only, and torch wants to own writable memory.
    return torch.from_numpy(np.array(array, copy=True)).to(device)
