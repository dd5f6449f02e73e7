"""The paged KV cache: per layer, one key and one value tensor of pages on the device.

Layout per layer: ``[num_pages, page_size, num_kv_heads, head_dim]`` (what
``npu_scatter_pa_kv_cache`` calls the ``"Norm"`` cache mode). Slot ``s`` is page
``s // page_size``, offset ``s % page_size``; a dispatch writes only its own slots
(``DispatchArrays.slot_mapping``) and reads a row's context through its block table.

The cache object is fixed (frozen) but its tensors are device memory the dispatches write to.
"""

from __future__ import annotations

import attrs
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
    ) -> PagedKVCache:
        """Zeroed pages for every layer."""
        # Ordinary tensors (not inference tensors), so callers may read and edit the pages
        # outside inference mode; the dispatches write them from inside it.
        shape = (num_pages, page_size, num_kv_heads, head_dim)
        layers = tuple(
            LayerKV(
                key=torch.zeros(shape, dtype=dtype, device=device),
                value=torch.zeros(shape, dtype=dtype, device=device),
            )
            for _ in range(num_layers)
        )
        return cls(num_pages=num_pages, page_size=page_size, layers=layers)

    def check_fits(self, arrays: DispatchArrays) -> None:
        """Raise :class:`InvalidInputError` unless ``arrays`` addresses pages of this cache."""
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
