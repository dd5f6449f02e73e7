"""The portable ops: plain torch, on any device (the CPU path).

On the CPU the KV pages are stored KV heads first (:meth:`TorchOps.kv_heads_first`): each
(page, KV head) is one contiguous ``[page_size, head_dim]`` matrix, while every op indexes
the pages by their shape, ``[num_pages, page_size, kv_heads, head_dim]``, as on the other
paths. Attention writes the dispatch's K/V into the pages with one ``index_put_`` (by page
and offset) per layer, then attends in groups of rows, prepared once per dispatch and
shared by every layer:

* Rows of one query token (decode rows, a prompt's one-token chunk, and the last tokens the
  model's last layer keeps) form one :class:`OneTokenRows` group that reads each row's pages
  where they lie: one batched product of every (row, page, KV head) with the query heads
  of that KV head, and a softmax over each row's pages (see the class). No context is
  copied, and nothing is padded past a row's last page.
* Longer chunks go row group by row group (:class:`RowGroup`: rows of similar chunk and
  context lengths, so that padding costs at most twice a row's queries and keys): each
  row's whole context (cached prefix, earlier chunks and this chunk) is gathered through its
  block table into a ``[rows, kv_heads, longest context, head_dim]`` tensor for one
  ``scaled_dot_product_attention`` call. The gather copies whole pages (one ``index_select``
  over the page dimension, about twice as fast as gathering slot by slot, which also puts
  pages stored KV heads first slots first); a lone row whose context fills consecutive pages
  is read without a gather. A chunk's queries each meet every key of its context, so the
  copy costs little beside the products. The mask is causal with each
  row's offset: query ``i`` of a row with ``q`` new tokens and context ``c`` sees keys ``j <=
  c - q + i``. Rows shorter than the group's longest are padded; padded keys are masked out
  and padded queries are dropped, and no query row is ever fully masked (a padded query ``i
  >= q`` sees the whole context). When every row's chunk is its whole context, the kernel's
  own causal flag replaces the mask (and skips the blocks above the diagonal).

On a CPU without native kernels for a reduced-precision dtype (no AVX-512 BF16/FP16 or AMX:
oneDNN's check), a bfloat16 or float16 model keeps its projection weights and its KV pages in
float32 (:meth:`TorchOps.projection_weight`, :meth:`TorchOps.kv_cache_dtype`): torch's
fallback for such products is an order of magnitude slower than MKL's float32 ones. Attention
computes in the wider of the queries' and the pages' dtypes.
"""

from __future__ import annotations

from typing import ClassVar

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
        """The compute dtype, but float32 where the projections run in float32 (see
        :meth:`projection_weight`): attention then reads its pages as they are, where pages
        of bfloat16 cost a conversion at every read (3.3 of 13 CPU seconds of a generation
        of 64 x 64 tokens)."""
        return torch.float32 if _emulated_on_cpu(compute_dtype, device) else compute_dtype

    def kv_heads_first(self, device: torch.device) -> bool:
        """On the CPU: one-token rows read each (page, KV head) matrix in place there
        (:class:`OneTokenRows`). Elsewhere (CUDA) pages stay slots first, the layout
        measured on an H200."""
        return device.type in IN_PLACE_DEVICE_TYPES

    def projection_weight(self, weight: torch.Tensor) -> torch.Tensor:
        """Stored ``[in, out]`` (a transposed view of it is returned): ``F.linear`` then
        hands the BLAS a plain ``x @ W`` product, faster on the CPU for 256-token dispatches,
        whose weights come from memory at every dispatch (figures: the README's
        *Benchmark*).

        A bfloat16 or float16 weight on a CPU without native kernels for that dtype (oneDNN's
        check: AVX-512 with BF16/FP16, or AMX) is stored in float32: there torch multiplies
        reduced-precision matrices with a scalar fallback, 13x slower than converting the
        activations and running MKL's float32 product (a 64 x 512 by 512 x 2,048 product:
        30 ms against 2.3 ms, and 550 ms with the ``[in, out]`` layout; AVX2 EPYC). The
        values are the same, and so is the arithmetic: both multiply the dtype's values
        exactly and sum in float32. The model converts the activations to the weight's
        dtype and the product back (``_model.project``).
        """
        if _emulated_on_cpu(weight.dtype, weight.device):
            weight = weight.float()
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
        # Attention computes in the wider of the queries' and the pages' dtypes.
        compute = torch.promote_types(dtype, self.kv_cache_dtype(dtype, device))
        return TorchAttention.prepare(arrays, shape, device=device, dtype=compute)


@attrs.frozen(eq=False, kw_only=True)
class TorchAttention:
    """One dispatch's attention, prepared once and shared by every layer: its rows in groups
    of similar chunk and context lengths (:func:`_row_groups`), one SDPA call a group."""

    shape: AttentionShape
    #: Per token: the page of its KV slot, and the slot's offset in it.
    slot_pages: torch.Tensor
    slot_offsets: torch.Tensor
    groups: tuple[RowGroup | OneTokenRows, ...]

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
        in_place = query_lens == 1
        if device.type not in IN_PLACE_DEVICE_TYPES:
            in_place[:] = False
        single = np.flatnonzero(in_place)
        longer = np.flatnonzero(~in_place)
        members = _row_groups(query_lens[longer], arrays.seq_lens.astype(np.int64)[longer])
        groups: list[RowGroup | OneTokenRows] = [
            RowGroup.prepare(arrays, longer[rows], device=device, dtype=dtype) for rows in members
        ]
        if single.size:
            groups.append(OneTokenRows.prepare(arrays, single, device=device))
        page, offset = np.divmod(arrays.slot_mapping.astype(np.int64), arrays.page_size)
        return cls(
            shape=shape,
            slot_pages=_to_device(page, device),
            slot_offsets=_to_device(offset, device),
            groups=tuple(groups),
        )

    def write_kv(self, key: torch.Tensor, value: torch.Tensor, cache: LayerKV) -> None:
        # By page and offset: the slots' addresses in either memory order of the pages.
        slot = (self.slot_pages, self.slot_offsets)
        cache.key.index_put_(slot, key.to(cache.key.dtype))
        cache.value.index_put_(slot, value.to(cache.value.dtype))

    def attend(self, query: torch.Tensor, cache: LayerKV) -> torch.Tensor:
        if len(self.groups) == 1:
            return self.groups[0].attend(query, cache, self.shape)
        out = torch.empty_like(query)
        for group in self.groups:
            tokens = group.tokens
            assert tokens is not None  # only a lone group holds every row in order
            out.index_copy_(0, tokens, group.attend(query[tokens], cache, self.shape))
        return out


#: The devices whose one-token rows read their pages in place (:class:`OneTokenRows`): the
#: CPU, where it was measured against the gather. Elsewhere (CUDA) they attend as a row group,
#: the path measured on an H200 (docs/benchmarks.md) until the other is measured there.
IN_PLACE_DEVICE_TYPES = ("cpu",)


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
    #: The first page of a single row whose context fills consecutive pages (the usual
    #: layout), read without a gather (a view of pages stored slots first); else ``None``.
    first_page: int | None
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
        first = int(pages[0, 0])
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
        return cls(
            tokens=_row_tokens(arrays, rows, device),
            context_pages=_to_device(pages, device),
            longest_context=longest_context,
            first_page=first if consecutive else None,
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
        # In the wider of the two dtypes: float32 pages of a bfloat16 model (TorchOps'
        # kv_cache_dtype) are read as they are; bfloat16 pages of a float32 model (an NPU's)
        # are widened.
        given = query.dtype
        query = query.to(torch.promote_types(given, cache.key.dtype))
        key, value = (
            self._context(pages, query.dtype, shape) for pages in (cache.key, cache.value)
        )
        if width == 1:  # one-token rows: the query heads sharing a KV head become its queries
            grouped = query.reshape(rows, shape.num_kv_heads, heads // shape.num_kv_heads, dim)
            out = F.scaled_dot_product_attention(grouped, key, value, self.mask, scale=shape.scale)
            return out.reshape(rows, heads, dim).to(given)
        if self.padded_index is None:
            padded = query
        else:
            padded = query.new_zeros(rows * width, heads, dim)
            padded.index_copy_(0, self.padded_index, query)
        out = self._sdpa(padded.view(rows, width, heads, dim).transpose(1, 2), key, value, shape)
        out = out.transpose(1, 2).reshape(rows * width, heads, dim)
        return (out if self.padded_index is None else out[self.padded_index]).to(given)

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
        """Each row's whole context from ``pages``: ``[rows, kv_heads, context, dim]``.

        ``index_select`` writes the pages slots first whichever order they are stored in;
        a view of consecutive pages stored KV heads first is copied slots first here.
        """
        heads, dim, length = shape.num_kv_heads, shape.head_dim, self.longest_context
        if self.first_page is not None:
            chosen = pages.narrow(0, self.first_page, self.context_pages.shape[1])
        else:
            chosen = pages.index_select(0, self.context_pages.view(-1))
        gathered = chosen.reshape(self.num_rows, -1, heads, dim)[:, :length]
        return gathered.transpose(1, 2).to(dtype)


@attrs.frozen(eq=False, kw_only=True)
class OneTokenRows:
    """Rows of one query token (decode rows, and the last tokens the model's last layer
    keeps), attended page by page over the pages where they lie.

    Each (row, page) pair is an *entry*. Pages stored KV heads first (``TorchOps``' layout
    on the CPU, :meth:`TorchOps.kv_heads_first`) hold one contiguous ``[page_size,
    head_dim]`` key matrix per KV head, and the query heads that share that KV head meet it
    in one batched product over every (entry, KV head): ``[groups, head_dim]`` by
    ``[head_dim, page_size]``, read in place. The softmax runs over each row's entries:
    scores past a row's context are -inf, the row's maximum comes from its entries' (a
    scatter), and the exponentials' sums and the products with the value matrices are summed
    into the row (an index_add). Products and softmax run in float32; pages of another dtype
    are converted a few at a time into one reused buffer (a whole float32 copy of them cost
    page faults). Pages stored slots first (the NPU path's portable fallback) are gathered
    into that order first.

    When the entries' pages are distinct and lie close together (at most twice as many
    pages from the first to the last as there are entries, as a generation's cache does
    once its requests decode), the range of pages is read as one view, and the pages of
    that range no row reads belong to a row that is dropped (finite scores, so its sums stay
    finite too). Otherwise the entries' pages are gathered (one ``index_select``).

    Against the rows' contexts gathered into a padded tensor for one SDPA call, this reads
    each key once, in place, with no padding past the last page: 64 decode rows of 162 to
    1,532 keys (22,567 in all), one layer, float32, the two products: 6.3 ms, against 11 ms
    for the products of the earlier form of this class, which read pages stored slots
    first as ``[page_size, kv_heads x head_dim]`` matrices against block-diagonal queries
    (four times the multiplications, three quarters of them by zero), and 40 ms for the
    whole gather and SDPA path (CPU seconds on a 2-core AVX2 machine).
    """

    #: The dispatch's tokens of these rows, in row order; ``None`` for every row in order.
    tokens: torch.Tensor | None
    num_rows: int
    #: The first page of the range read in place, or ``None`` when ``pages`` are gathered.
    first_page: int | None
    #: ``[entries]``: the pages to gather (``None`` when read in place).
    pages: torch.Tensor | None
    #: ``[entries]``: each entry's row; ``num_rows`` for a page of the range no row reads.
    owner: torch.Tensor
    #: ``[entries, 1, page_size]`` float32: 0 where a slot is in its row's context, else -inf.
    mask: torch.Tensor

    #: Matrices (one page's keys or values of one KV head) converted to float32 at a time:
    #: 128 of 128 x 64 floats, 4 MiB.
    CONVERT_MATRICES: ClassVar[int] = 128

    @classmethod
    def prepare(
        cls, arrays: DispatchArrays, rows: npt.NDArray[np.int64], *, device: torch.device
    ) -> OneTokenRows:
        page_size = arrays.page_size
        seq_lens = arrays.seq_lens.astype(np.int64)[rows]
        num_pages = -(-seq_lens // page_size)
        column = np.arange(int(num_pages.max()))
        used = column[None, :] < num_pages[:, None]
        pages = arrays.block_tables[rows][:, : column.size].astype(np.int64)[used]
        owner = np.repeat(np.arange(rows.size), num_pages)
        valid = np.minimum(seq_lens[owner] - column[np.nonzero(used)[1]] * page_size, page_size)
        first, last = int(pages.min()), int(pages.max())
        in_place = last - first + 1 <= 2 * pages.size and np.unique(pages).size == pages.size
        if in_place:
            span_owner = np.full(last - first + 1, rows.size)
            span_valid = np.full(last - first + 1, page_size)
            span_owner[pages - first], span_valid[pages - first] = owner, valid
            owner, valid = span_owner, span_valid
        mask = torch.zeros(owner.size, 1, page_size)
        mask.masked_fill_(
            torch.arange(page_size) >= torch.from_numpy(valid)[:, None, None], -torch.inf
        )
        return cls(
            tokens=_row_tokens(arrays, rows, device),
            num_rows=rows.size,
            first_page=first if in_place else None,
            pages=None if in_place else _to_device(pages, device),
            owner=_to_device(owner, device),
            mask=mask.to(device),
        )

    def attend(self, query: torch.Tensor, cache: LayerKV, shape: AttentionShape) -> torch.Tensor:
        """Attention of these rows' queries (``[rows, heads, head_dim]``, row order)."""
        heads, kv_heads, dim = shape.num_heads, shape.num_kv_heads, shape.head_dim
        entries, groups = self.owner.numel(), heads // kv_heads
        keys, values = (self._matrices(pages) for pages in (cache.key, cache.value))
        # Each entry's queries, scaled, as [groups, head_dim] per KV head.
        padded = torch.cat((query.float() * shape.scale, query.new_zeros(1, heads, dim).float()))
        queries = padded[self.owner].view(entries * kv_heads, groups, dim)
        scores = self._products(queries, keys, transpose=True).view(entries, heads, -1)
        scores.add_(self.mask)
        rows = self.num_rows + 1
        index = self.owner[:, None].expand(entries, heads)
        best = scores.new_full((rows, heads), -torch.inf)
        best.scatter_reduce_(0, index, scores.amax(dim=-1), "amax")
        weights = scores.sub_(best[self.owner].unsqueeze(-1)).exp_()
        total = scores.new_zeros(rows, heads).index_add_(0, self.owner, weights.sum(dim=-1))
        products = self._products(
            weights.view(entries * kv_heads, groups, -1), values, transpose=False
        )
        out = scores.new_zeros(rows, heads, dim)
        out.index_add_(0, self.owner, products.view(entries, heads, dim))
        return out[:-1].div_(total[:-1, :, None]).to(query.dtype)

    def _matrices(self, pages: torch.Tensor) -> torch.Tensor:
        """The entries' pages as ``[entries x kv_heads, page_size, head_dim]`` matrices: a
        view of pages stored KV heads first and read in place, else a gathered copy."""
        by_head = pages.transpose(1, 2)  # [pages, kv_heads, page_size, head_dim]
        if self.first_page is not None:
            chosen = by_head.narrow(0, self.first_page, self.owner.numel())
        else:
            assert self.pages is not None
            chosen = by_head.index_select(0, self.pages)
        return chosen.reshape(-1, pages.shape[1], pages.shape[3])

    def _products(
        self, left: torch.Tensor, matrices: torch.Tensor, *, transpose: bool
    ) -> torch.Tensor:
        """``left[i] @ matrices[i]`` (``matrices[i].T`` with ``transpose``) for every ``i``,
        in float32, converting matrices of another dtype a few at a time."""
        count = left.shape[0]
        columns = matrices.shape[1] if transpose else matrices.shape[2]
        out = left.new_empty(count, left.shape[1], columns)
        if matrices.dtype == torch.float32:
            step, buffer = count, None
        else:
            step = self.CONVERT_MATRICES
            buffer = left.new_empty(min(step, count), *matrices.shape[1:])
        for start in range(0, count, step):
            part = matrices[start : start + step]
            if buffer is not None:
                part = buffer[: part.shape[0]].copy_(part)
            torch.bmm(
                left[start : start + step],
                part.transpose(1, 2) if transpose else part,
                out=out[start : start + step],
            )
        return out


def _row_tokens(
    arrays: DispatchArrays, rows: npt.NDArray[np.int64], device: torch.device
) -> torch.Tensor | None:
    """The dispatch's tokens of ``rows`` in row order, or ``None`` when they are every row
    (in order: the rows of a group are ascending)."""
    if rows.size == arrays.num_rows:
        return None
    cu = arrays.cu_seqlens.astype(np.int64)
    return _to_device(np.concatenate([np.arange(cu[r], cu[r + 1]) for r in rows]), device)


def _emulated_on_cpu(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether ``dtype`` is a reduced-precision dtype that ``device``, a CPU, has no native
    matrix kernels for (see :meth:`TorchOps.projection_weight`)."""
    if device.type != "cpu" or dtype not in _NATIVE_CPU_CHECKS:
        return False
    return not _NATIVE_CPU_CHECKS[dtype]()


#: oneDNN's own checks, which torch consults to send a reduced-precision product to oneDNN
#: rather than to its scalar fallback.
_NATIVE_CPU_CHECKS = {
    torch.bfloat16: lambda: bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()),
    torch.float16: lambda: bool(torch.ops.mkldnn._is_mkldnn_fp16_supported()),
}


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
