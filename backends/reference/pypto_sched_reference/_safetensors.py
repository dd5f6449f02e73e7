"""Read and write the safetensors format with NumPy alone.

A safetensors file is an 8-byte little-endian header length ``n``, ``n`` bytes of JSON
mapping each tensor name to its ``dtype``, ``shape`` and ``data_offsets`` (begin and end,
relative to the end of the header; an optional ``__metadata__`` entry maps strings to
strings), then the raw little-endian tensor bytes. Tensors are read through a memory map, so
opening a large checkpoint costs only the tensors asked for.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ._errors import CheckpointError

__all__ = ["read_safetensors", "safetensors_names", "write_safetensors"]

#: safetensors dtype name -> NumPy dtype as stored (BF16 is stored as raw 16-bit words).
_STORED: dict[str, np.dtype[Any]] = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),
}
_NAMES: dict[np.dtype[Any], str] = {
    np.dtype("<f8"): "F64",
    np.dtype("<f4"): "F32",
    np.dtype("<f2"): "F16",
}
_LENGTH = struct.Struct("<Q")


def _header(path: Path) -> tuple[dict[str, Any], int]:
    """The JSON header of ``path`` and the file offset where tensor data starts."""
    try:
        with path.open("rb") as file:
            prefix = file.read(_LENGTH.size)
            if len(prefix) != _LENGTH.size:
                raise CheckpointError(f"{str(path)!r} is not a safetensors file: too short")
            (length,) = _LENGTH.unpack(prefix)
            raw = file.read(length)
    except OSError as error:
        raise CheckpointError(f"cannot read {str(path)!r}: {error}") from error
    try:
        header = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise CheckpointError(
            f"{str(path)!r} has a malformed safetensors header: {error}"
        ) from error
    if len(raw) != length or not isinstance(header, dict):
        raise CheckpointError(f"{str(path)!r} has a malformed safetensors header")
    header.pop("__metadata__", None)
    return header, _LENGTH.size + length


def safetensors_names(path: str | Path) -> list[str]:
    """The tensor names stored in the safetensors file ``path``."""
    header, _ = _header(Path(path))
    return sorted(header)


def read_safetensors(
    path: str | Path, names: Iterable[str] | None = None
) -> dict[str, npt.NDArray[np.floating[Any]]]:
    """Load tensors ``names`` (default: all) from ``path`` as float arrays.

    BF16 tensors are widened to float32 exactly; other float types keep their dtype.
    """
    path = Path(path)
    header, data_start = _header(path)
    wanted = sorted(header) if names is None else list(names)
    missing = [name for name in wanted if name not in header]
    if missing:
        raise CheckpointError(f"{str(path)!r} lacks tensors {missing}")
    buffer = np.memmap(path, dtype=np.uint8, mode="r")
    return {name: _tensor(buffer, data_start, name, header[name], path) for name in wanted}


def _tensor(
    buffer: npt.NDArray[np.uint8], data_start: int, name: str, info: Any, path: Path
) -> npt.NDArray[np.floating[Any]]:
    try:
        kind, shape, (begin, end) = info["dtype"], tuple(info["shape"]), info["data_offsets"]
    except (TypeError, KeyError, ValueError) as error:
        raise CheckpointError(f"{str(path)!r}: bad header entry for {name!r}: {info!r}") from error
    stored = _STORED.get(kind)
    if stored is None:
        raise CheckpointError(
            f"{str(path)!r}: tensor {name!r} has dtype {kind!r}; supported: {sorted(_STORED)}"
        )
    count = int(np.prod(shape, dtype=np.int64))
    if end - begin != count * stored.itemsize or data_start + end > buffer.size:
        raise CheckpointError(
            f"{str(path)!r}: tensor {name!r} of shape {list(shape)} and dtype {kind} does not "
            f"match its data offsets {[begin, end]}"
        )
    raw = buffer[data_start + begin : data_start + end].view(stored).reshape(shape)
    if kind == "BF16":
        # bfloat16 is the top half of a float32: shifting the bits up widens it exactly.
        return (raw.astype(np.uint32) << 16).view(np.float32)
    return np.array(raw)


def write_safetensors(
    path: str | Path,
    tensors: Mapping[str, npt.NDArray[np.floating[Any]]],
    *,
    metadata: Mapping[str, str] | None = None,
) -> None:
    """Write float64, float32 or float16 ``tensors`` to ``path`` in the safetensors format."""
    header: dict[str, Any] = {} if metadata is None else {"__metadata__": dict(metadata)}
    arrays = []
    offset = 0
    for name in sorted(tensors):
        array = np.ascontiguousarray(tensors[name])
        array = array.astype(array.dtype.newbyteorder("<"), copy=False)
        if array.dtype not in _NAMES:
            raise CheckpointError(f"tensor {name!r}: dtype {array.dtype} cannot be written")
        header[name] = {
            "dtype": _NAMES[array.dtype],
            "shape": list(array.shape),
            "data_offsets": [offset, offset + array.nbytes],
        }
        arrays.append(array)
        offset += array.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # keep the tensor data 8-byte aligned
    with Path(path).open("wb") as file:
        file.write(_LENGTH.pack(len(raw)))
        file.write(raw)
        for array in arrays:
            file.write(array.tobytes())
