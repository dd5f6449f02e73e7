"""The paged KV cache: per layer, one key and one value tensor of pages on the device.

Layout per layer: ``[num_pages, page_size, num_kv_heads, head_dim]`` (what
``npu_scatter_pa_kv_cache`` calls the ``"Norm"`` cache mode). That is the shape every op
path indexes; in memory the KV heads may come first instead (``heads_first``: each page holds
one ``[page_size, head_dim]`` matrix a KV head, which the torch path's attention on the CPU
reads in place, see :meth:`PagedKVCache.allocate`). Slot ``s`` is page ``s // page_size``,
offset ``s % page_size``; a dispatch writes only its own slots
(``DispatchArrays.slot_mapping``) and reads a row's context through its block table.
:meth:`PagedKVCache.check_fits` enforces the first rule before any kernel runs, on every op
path: a token's slot must be the one its row's block table gives its position, so a
planning or allocation bug cannot write into another request's page.

The cache object is fixed (frozen) but its tensors are device memory the dispatches write to.
"""

from __future__ import annotations

import attrs
import numpy as np
import numpy.typing as npt
import torch

from pypto_sched import DispatchArrays, InvalidInputError

__all__ = ["LayerKV", "PagedKVCache"]


@attrs.frozen(eq=False)
class LayerKV:
    """One layer's key and value pages."""

    key: torch.Tensor
    value: torch.Tensor

    @property
    def num_pages(self) -> int:
        return int(self.key.shape[0])

    @property
    def page_size(self) -> int:
        return int(self.key.shape[1])


@attrs.frozen(eq=False)
class PagedKVCache:
    """Every layer's pages. Build one with :meth:`allocate` (the backend's ``new_cache``)."""

    num_pages: int
    page_size: int
    layers: tuple[LayerKV, ...]
    #: Per page: how many of its leading slots a dispatch has written (host memory). A
    #: dispatch may read only positions written before it (see :meth:`check_fits`); pages
    #: filled by other means are declared with :meth:`mark_written`.
    filled: npt.NDArray[np.int64] = attrs.field(
        default=attrs.Factory(lambda cache: np.zeros(cache.num_pages, np.int64), takes_self=True),
        repr=False,
    )

    @property
    def num_slots(self) -> int:
        return self.num_pages * self.page_size

    @property
    def dtype(self) -> torch.dtype:
        return self.layers[0].key.dtype

    @property
    def device(self) -> torch.device:
        return self.layers[0].key.device

    @classmethod
    def allocate(
        cls,
        *,
        num_layers: int,
        num_pages: int,
        page_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
        heads_first: bool = False,
    ) -> PagedKVCache:
        """Zeroed pages for every layer, ``[num_pages, page_size, num_kv_heads, head_dim]``.

        With ``heads_first`` each tensor is a transposed view of ``[num_pages, num_kv_heads,
        page_size, head_dim]`` memory: the same shape and values, with each (page, KV head)
        one contiguous matrix (``Ops.kv_heads_first`` says which the ops read fastest).
        """
        # Ordinary tensors (not inference tensors), so callers may read and edit the pages
        # outside inference mode; the dispatches write them from inside it.
        shape = (num_pages, page_size, num_kv_heads, head_dim)

        def pages() -> torch.Tensor:
            if not heads_first:
                return torch.zeros(shape, dtype=dtype, device=device)
            stored = (num_pages, num_kv_heads, page_size, head_dim)
            return torch.zeros(stored, dtype=dtype, device=device).transpose(1, 2)

        layers = tuple(LayerKV(key=pages(), value=pages()) for _ in range(num_layers))
        return cls(num_pages=num_pages, page_size=page_size, layers=layers)

    def check_layout(
        self,
        *,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
        heads_first: bool = False,
    ) -> None:
        """Raise :class:`InvalidInputError` unless every layer's key and value pages are
        ``[num_pages, page_size, num_kv_heads, head_dim]`` of ``dtype`` on ``device``, stored
        in the order ``heads_first`` says (the arguments :meth:`allocate` took): another
        model's cache would fail inside torch, of another dtype it would run and silently
        lose precision, and in the other order the NPU kernels would misread it."""
        shape = (self.num_pages, self.page_size, num_kv_heads, head_dim)
        order = "KV heads first" if heads_first else "slots first"
        expected = f"{num_layers} layers of {list(shape)} {dtype} on {device}, {order}"
        if len(self.layers) != num_layers:
            raise InvalidInputError.about(
                "cache", f"must have this backend's layout ({expected}): {len(self.layers)} layers"
            )
        for index, layer in enumerate(self.layers):
            for name, pages in (("key", layer.key), ("value", layer.value)):
                if (tuple(pages.shape), pages.dtype, pages.device) != (shape, dtype, device):
                    found = f"{list(pages.shape)} {pages.dtype} on {pages.device}"
                elif not _stored_in_order(pages, heads_first=heads_first):
                    found = f"strides {list(pages.stride())}"
                else:
                    continue
                raise InvalidInputError.about(
                    "cache",
                    f"must have this backend's layout ({expected}): layer {index} "
                    f"{name} pages {found}",
                )

    def check_fits(self, arrays: DispatchArrays) -> None:
        """Raise :class:`InvalidInputError` unless ``arrays`` addresses pages of this cache,
        writes each token only to the slot of its position in its row's pages, and reads
        only context positions some dispatch has written (a prefix not cached would be read
        as zeros: silently wrong logits)."""
        if arrays.page_size != self.page_size:
            raise InvalidInputError(
                f"the dispatch's page_size must match the cache's {self.page_size}: "
                f"{arrays.page_size}"
            )
        if arrays.block_tables.size and int(arrays.block_tables.max()) >= self.num_pages:
            raise InvalidInputError(
                f"the dispatch's block tables must address pages in [0, {self.num_pages}): "
                f"page {int(arrays.block_tables.max())}"
            )
        self._check_writes(arrays)
        self._check_reads(arrays)

    def mark_written(self, slots: npt.ArrayLike) -> None:
        """Record that ``slots`` hold K/V for every layer, each with the slots before it in
        its page: what a dispatch does once it has written them, and what a caller that
        fills pages by hand (an external prefix cache) does before dispatches read them."""
        given = np.asarray(slots, dtype=np.int64).ravel()
        if given.size and not 0 <= int(given.min()) <= int(given.max()) < self.num_slots:
            raise InvalidInputError.about(
                "slots", f"must be in [0, {self.num_slots}): {int(given.min())}..{int(given.max())}"
            )
        np.maximum.at(self.filled, given // self.page_size, given % self.page_size + 1)

    def _check_reads(self, arrays: DispatchArrays) -> None:
        # Row r reads positions 0 .. token_starts[r] - 1 before its own: the pages before
        # the one holding its first position whole, and that one up to its offset.
        starts = arrays.token_starts.astype(np.int64)
        full, part = np.divmod(starts, self.page_size)
        columns = np.arange(arrays.block_tables.shape[1])
        tables = arrays.block_tables.astype(np.int64)
        filled = np.where(tables >= 0, self.filled[np.maximum(tables, 0)], 0)
        need = np.where(
            columns < full[:, None],
            self.page_size,
            np.where(columns == full[:, None], part[:, None], 0),
        )
        short = filled < need
        if short.any():
            row, column = (int(i) for i in np.argwhere(short)[0])
            position = column * self.page_size + int(filled[row, column])
            raise InvalidInputError(
                f"row {row} reads position {position} of request {int(arrays.requests[row])}, "
                f"which no dispatch has written (its prefix is not cached: fill it with "
                f"write_prefixes, or declare pages filled by hand with mark_written)"
            )

    def _check_writes(self, arrays: DispatchArrays) -> None:
        rows = np.repeat(np.arange(arrays.num_rows), np.diff(arrays.cu_seqlens))
        positions = arrays.positions.astype(np.int64)
        # One extra column of -1 stands for every page index past the end of a table.
        tables = np.pad(arrays.block_tables.astype(np.int64), ((0, 0), (0, 1)), constant_values=-1)
        page_index = np.minimum(positions // self.page_size, tables.shape[1] - 1)
        pages = tables[rows, page_index]
        own_slots = pages * self.page_size + positions % self.page_size
        wrong = (pages < 0) | (own_slots != arrays.slot_mapping)
        if wrong.any():
            token = int(np.flatnonzero(wrong)[0])
            row = int(rows[token])
            slot = int(arrays.slot_mapping[token])
            table = [int(page) for page in arrays.block_tables[row] if page >= 0]
            raise InvalidInputError(
                f"row {row} would write position {int(positions[token])} of request "
                f"{int(arrays.requests[row])} to slot {slot} (page {slot // self.page_size}), "
                f"outside its pages {table}"
            )


def _stored_in_order(pages: torch.Tensor, *, heads_first: bool) -> bool:
    """Whether ``pages`` (``[num_pages, page_size, kv_heads, head_dim]``) are one block of
    memory, KV heads first or slots first."""
    return (pages.transpose(1, 2) if heads_first else pages).is_contiguous()
