"""A Hugging Face Qwen3 checkpoint on torch, read by :mod:`pypto_sched.checkpoints`.

The shared reader checks everything (the config, the shard index, the safetensors headers,
the names, shapes and dtypes of the tensors :func:`~pypto_sched.checkpoints.expected_tensors`
lists) and raises :class:`~pypto_sched.CheckpointError` naming the file and the tensor. This
module only turns its NumPy arrays into torch tensors of the compute dtype: bfloat16, which
NumPy lacks, arrives as raw 16-bit words and is reinterpreted, not converted.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import attrs
import numpy as np
import torch

from pypto_sched import CheckpointError, checkpoints
from pypto_sched.checkpoints import ModelConfig, Tensor

__all__ = ["Checkpoint", "load_checkpoint", "to_torch"]


@attrs.frozen(eq=False)
class Checkpoint:
    """A loaded checkpoint: its config and every expected tensor, in checkpoint naming."""

    directory: Path
    config: ModelConfig
    tensors: Mapping[str, torch.Tensor]


def to_torch(tensor: Tensor) -> torch.Tensor:
    """A torch copy of ``tensor`` in its stored dtype (BF16 bits become ``torch.bfloat16``)."""
    array = np.array(tensor.array)  # writable: torch must not alias the read-only file map
    if tensor.dtype == "BF16":
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(array)


def load_checkpoint(
    directory: str | os.PathLike[str], *, dtype: torch.dtype = torch.float32
) -> Checkpoint:
    """Load ``directory``'s config and weights, converting the weights to ``dtype``.

    Tensors the forward pass does not read (rotary buffers of old exports) are ignored; a
    stored ``lm_head.weight`` is read even when the config says tied, as transformers does.
    """
    loaded = checkpoints.load_checkpoint(directory)
    tensors = {}
    for name, tensor in loaded.tensors.items():
        stored = to_torch(tensor)
        converted = stored.to(dtype)
        if not bool(converted.isfinite().all()):
            _refuse_overflow(loaded.directory, name, stored, converted, dtype)
        tensors[name] = converted
    return Checkpoint(directory=loaded.directory, config=loaded.config, tensors=tensors)


def _refuse_overflow(
    directory: Path, name: str, stored: torch.Tensor, converted: torch.Tensor, dtype: torch.dtype
) -> None:
    """Raise :class:`~pypto_sched.CheckpointError` when converting to ``dtype`` made a finite
    stored value infinite (float16 holds at most 65504): every run would give NaN logits."""
    lost = converted.isinf() & stored.isfinite()
    if bool(lost.any()):
        index = tuple(int(i) for i in lost.nonzero()[0])
        raise CheckpointError(
            f"{directory}: tensor {name!r} holds {float(stored[index]):g} at {list(index)}, "
            f"beyond {dtype}'s range (at most {torch.finfo(dtype).max:g}): load it in a wider "
            f"dtype (bfloat16 or float32)"
        )
