"""The ``npu`` backend: a Qwen3 checkpoint run dispatch by dispatch over a paged KV cache.

Build one with :meth:`NpuBackend.from_checkpoint` (the ``pypto_sched.backends`` entry point).
The device defaults to an NPU when torch_npu is usable (:func:`npu_availability`) and to the
CPU otherwise; the ops follow the device unless ``ops`` names them.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, ClassVar, Self

import numpy as np
import numpy.typing as npt
import torch

from pypto_sched import (
    BackendError,
    InvalidInputError,
    PlannerConfig,
    Schedule,
    WarmupShape,
    dispatch_arrays,
    plan_pages,
    plan_warmup,
)
from pypto_sched.backends import DispatchInput, DispatchOutput

from ._availability import npu_availability, torch_npu_module
from ._kv_cache import PagedKVCache
from ._loader import load_checkpoint
from ._model import Qwen3Model
from .ops import OpsChoice, select_ops

__all__ = ["DTYPES", "NpuBackend", "TorchBackend"]

#: Compute dtypes by name.
DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}

# Chunked and one-shot prefill differ only by summation order; these bound the difference
# for small models at each compute dtype.
_TOLERANCE = {torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 1e-1}
#: Per unit of a request's largest |logit|: 4 machine epsilons of the dtype
#: (``torch.finfo(dtype).eps``: 2**-10 for float16, 2**-7 for bfloat16). Rounding errs in
#: proportion to the logits' size: chunked and one-shot runs of 8- to 32-layer models with
#: logits of about 10 differed by 1.9 to 2.7 epsilons of it, in both dtypes.
_RELATIVE_TOLERANCE = {
    torch.float32: 0.0,
    torch.float16: 4 * torch.finfo(torch.float16).eps,
    torch.bfloat16: 4 * torch.finfo(torch.bfloat16).eps,
}


class NpuBackend:
    """Runs Qwen3 prefill dispatches; see :class:`pypto_sched.backends.Backend`."""

    name: ClassVar[str] = "npu"
    #: The keywords of :meth:`from_checkpoint`, as ``pypto-sched backends`` lists them.
    options: ClassVar[Mapping[str, str]] = MappingProxyType(
        {
            "checkpoint": "a Hugging Face Qwen3 checkpoint directory (required)",
            "dtype": "compute dtype: float32 (default), float16 or bfloat16",
            "device": "npu or cpu (default: npu when an NPU is usable, else cpu)",
            "ops": "kernels: auto (by device, the default), torch or npu",
        }
    )

    @staticmethod
    def is_available() -> tuple[bool, str]:
        """It runs wherever torch does: on an NPU when one is usable, else on the CPU."""
        npu = npu_availability()
        return True, "on the NPU" if npu else f"on the CPU ({npu.reason})"

    def __init__(self, model: Qwen3Model) -> None:
        self._model = model

    @classmethod
    def from_checkpoint(
        cls,
        checkpoint: str | os.PathLike[str],
        *,
        dtype: str | torch.dtype = "float32",
        device: str | torch.device | None = None,
        ops: OpsChoice = "auto",
    ) -> NpuBackend:
        """Load a Hugging Face Qwen3 checkpoint directory.

        ``dtype`` is the compute dtype (``"float32"``, ``"float16"``, ``"bfloat16"``);
        the weights are converted to it whatever they are stored in. ``device`` defaults to
        ``"npu"`` when an NPU is usable, else ``"cpu"``. ``ops`` picks the kernels:
        ``"auto"`` by device, ``"torch"`` or ``"npu"`` explicitly.
        """
        compute = _dtype(dtype)
        target = _device(device, _NPU_DEVICE_TYPES) if device is not None else _default_device()
        return cls._load(checkpoint, dtype=compute, device=target, ops=ops)

    @classmethod
    def _load(
        cls,
        checkpoint: str | os.PathLike[str],
        *,
        dtype: torch.dtype,
        device: torch.device,
        ops: OpsChoice,
    ) -> Self:
        kernels = select_ops(device, choice=ops)
        loaded = load_checkpoint(checkpoint, dtype=dtype)
        return cls(Qwen3Model.from_checkpoint(loaded, ops=kernels, device=device))

    # -- metadata ------------------------------------------------------------------------

    @property
    def tolerance(self) -> float:
        return _TOLERANCE[self._model.dtype]

    @property
    def relative_tolerance(self) -> float:
        """The backend contract's optional relative term (see
        :func:`pypto_sched.backends.relative_tolerance`): 0 in float32."""
        return _RELATIVE_TOLERANCE[self._model.dtype]

    @property
    def vocab_size(self) -> int:
        return self._model.config.vocab_size

    @property
    def hidden_size(self) -> int:
        return self._model.config.hidden_size

    @property
    def max_position_embeddings(self) -> int:
        """The model's positions (the optional attribute of the backend contract)."""
        return self._model.config.max_position_embeddings

    @property
    def model(self) -> Qwen3Model:
        return self._model

    @property
    def device(self) -> torch.device:
        return self._model.device

    @property
    def dtype(self) -> torch.dtype:
        return self._model.dtype

    @property
    def ops_name(self) -> str:
        return self._model.ops.name

    def __repr__(self) -> str:
        config = self._model.config
        return (
            f"NpuBackend(layers={config.num_hidden_layers}, hidden={config.hidden_size}, "
            f"dtype={self.dtype}, device={self.device}, ops={self.ops_name!r})"
        )

    # -- the Backend protocol ------------------------------------------------------------

    def new_cache(self, *, num_pages: int, page_size: int) -> PagedKVCache:
        for name, value in (("num_pages", num_pages), ("page_size", page_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidInputError.about(name, f"must be an int >= 1: {value!r}")
        self._model.ops.check_page_size(page_size)
        return PagedKVCache.allocate(
            num_pages=num_pages, page_size=page_size, **self._cache_layout()
        )

    def _cache_layout(self) -> dict[str, Any]:
        """The layout of this backend's caches, but for the page count and size."""
        config = self._model.config
        return {
            "num_layers": config.num_hidden_layers,
            "num_kv_heads": config.num_key_value_heads,
            "head_dim": config.head_dim,
            "dtype": self._model.ops.kv_cache_dtype(self.dtype, self.device),
            "device": self.device,
            "heads_first": self._model.ops.kv_heads_first(self.device),
        }

    def embed(self, token_ids: npt.NDArray[np.int64]) -> npt.NDArray[np.floating[Any]]:
        ids = np.asarray(token_ids)
        ids = self._checked_ids(ids, ids.size)
        with torch.inference_mode():
            return _host(self._model.embed(torch.from_numpy(ids).to(self.device)))

    def _checked_ids(self, token_ids: npt.NDArray[Any], count: int) -> npt.NDArray[np.int64]:
        """``token_ids`` as a fresh int64 array, or an error naming what is wrong."""
        ids = np.asarray(token_ids)
        bad_shape = ids.shape != (count,) or (ids.size and ids.dtype.kind not in "iu")
        if bad_shape or (ids.size and not 0 <= int(ids.min()) <= int(ids.max()) < self.vocab_size):
            raise InvalidInputError.about(
                "token_ids",
                f"must be {count} ids in [0, {self.vocab_size}): shape "
                f"{list(ids.shape)}, dtype {ids.dtype}, values "
                f"{ids.min() if ids.size else None}..{ids.max() if ids.size else None}",
            )
        return ids.astype(np.int64)

    def run_dispatch(self, batch: DispatchInput, cache: Any) -> DispatchOutput:
        if not isinstance(cache, PagedKVCache):
            raise InvalidInputError.about(
                "cache", f"must come from this backend's new_cache: {type(cache).__name__}"
            )
        # Another backend's cache may hold another model's pages (layers, KV heads, head_dim),
        # in another dtype or on another device, or pages these ops cannot take.
        cache.check_layout(**self._cache_layout())
        self._model.ops.check_page_size(cache.page_size)
        arrays = batch.arrays
        cache.check_fits(arrays)
        with torch.inference_mode(), _attention_kernels(self.device):
            final_hidden = self._model.forward(self._inputs(batch), arrays, cache)
            cache.mark_written(arrays.slot_mapping)
            if not (batch.return_logits or batch.return_greedy):
                return DispatchOutput()
            logits = self._model.logits(final_hidden)  # final rows only
            return DispatchOutput(
                logits=_host(logits) if batch.return_logits else None,
                greedy_token_ids=_greedy(logits, arrays.final_requests)
                if batch.return_greedy
                else None,
            )

    def _inputs(self, batch: DispatchInput) -> torch.Tensor:
        tokens = batch.arrays.num_tokens
        if batch.input_embeddings is None:
            ids = self._checked_ids(batch.token_ids, tokens)
            return self._model.embed(torch.from_numpy(ids).to(self.device))
        given = np.asarray(batch.input_embeddings)
        if given.shape != (tokens, self.hidden_size):
            raise InvalidInputError.about(
                "input_embeddings", f"must be [{tokens}, {self.hidden_size}]: {list(given.shape)}"
            )
        return torch.from_numpy(np.array(given, copy=True)).to(self.device, self.dtype)

    # -- warmup --------------------------------------------------------------------------

    def warmup(
        self,
        config: PlannerConfig,
        *,
        batch_size: int,
        max_seq_len: int,
        page_size: int = 128,
    ) -> tuple[WarmupShape, ...]:
        """Run one dispatch of each of the planner's warmup shapes (:func:`plan_warmup`),
        so kernels compile before serving; return the shapes run.

        Each shape is built as a one-dispatch schedule under ``config`` and validated, so no
        warmup dispatch carries more than ``config.effective_budget`` tokens.
        """
        shapes = plan_warmup(config, batch_size=batch_size, max_seq_len=max_seq_len)
        for shape in shapes:
            lengths = [shape.tokens_per_row] * shape.num_rows
            rows = [[r, 0, shape.tokens_per_row, True] for r in range(shape.num_rows)]
            schedule = Schedule.from_dispatches(config, lengths, [rows])
            pages = shape.num_rows * -(-shape.tokens_per_row // page_size)
            tables = plan_pages(lengths, page_size=page_size, num_pages=pages)
            arrays = dispatch_arrays(schedule.dispatch(0), tables)
            batch = DispatchInput(
                arrays=arrays,
                token_ids=np.zeros(arrays.num_tokens, dtype=np.int64),
                input_embeddings=None,
                return_logits=False,
                return_greedy=True,
            )
            self.run_dispatch(batch, self.new_cache(num_pages=pages, page_size=page_size))
        return shapes


class TorchBackend(NpuBackend):
    """The same Qwen3 model on plain torch ops: on an NVIDIA GPU when torch sees one, else on
    the CPU. The ``npu`` backend's torch path under a name a GPU user finds; the kernels are
    PyTorch's own (the attention is :class:`~pypto_sched_npu.ops.TorchOps`'), no torch_npu."""

    name: ClassVar[str] = "torch"
    options: ClassVar[Mapping[str, str]] = MappingProxyType(
        {
            "checkpoint": "a Hugging Face Qwen3 checkpoint directory (required)",
            "dtype": "compute dtype: float32 (default), float16 or bfloat16",
            "device": "cuda (or cuda:N) or cpu (default: cuda when torch sees a GPU, else cpu)",
        }
    )

    @staticmethod
    def is_available() -> tuple[bool, str]:
        """It runs wherever torch does: on CUDA when torch sees a GPU, else on the CPU."""
        if torch.cuda.is_available():
            return True, f"on CUDA ({torch.cuda.get_device_name()})"
        return True, "on the CPU (torch sees no CUDA device)"

    @classmethod
    def from_checkpoint(  # type: ignore[override]  # no 'ops': always torch's
        cls,
        checkpoint: str | os.PathLike[str],
        *,
        dtype: str | torch.dtype = "float32",
        device: str | torch.device | None = None,
    ) -> TorchBackend:
        """Load a Hugging Face Qwen3 checkpoint directory.

        ``dtype`` is the compute dtype, as :meth:`NpuBackend.from_checkpoint` takes it;
        ``device`` is ``"cuda"`` (``"cuda:N"``) or ``"cpu"``, by default ``"cuda"`` when
        ``torch.cuda.is_available()``, else ``"cpu"``.
        """
        compute = _dtype(dtype)
        if device is None:
            target = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        else:
            target = _device(device, _TORCH_DEVICE_TYPES)
        return cls._load(checkpoint, dtype=compute, device=target, ops="torch")


def _attention_kernels(device: torch.device) -> contextlib.AbstractContextManager[None]:
    """The ``scaled_dot_product_attention`` kernels a dispatch on ``device`` may use.

    On CUDA, not cuDNN's: it builds an execution plan on the host for every new shape, and a
    dispatch's row groups have new shapes step after step. On an H200 (torch 2.11, cuDNN
    SDPA chosen by default) it took 3.2 ms of host time a call against 44 us on the device,
    89% of a generation run's time (``benchmarks/gpu_check.py``'s ``profile`` section).
    Flash, memory-efficient and math kernels have no such set-up.
    """
    if device.type != "cuda":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel(
        [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
    )


def _dtype(value: str | torch.dtype) -> torch.dtype:
    if isinstance(value, torch.dtype) and value in DTYPES.values():
        return value
    if isinstance(value, str) and value in DTYPES:
        return DTYPES[value]
    raise InvalidInputError.about("dtype", f"must be one of {sorted(DTYPES)}: {value!r}")


#: The device types each backend runs on: the NPU (the CPU as the fallback), and CUDA.
_NPU_DEVICE_TYPES = ("npu", "cpu")
_TORCH_DEVICE_TYPES = ("cuda", "cpu")
#: What each set of device types is called in messages.
_DEVICE_NAMES: dict[tuple[str, ...], str] = {
    _NPU_DEVICE_TYPES: "an NPU or CPU",
    _TORCH_DEVICE_TYPES: "a CUDA or CPU",
}


def _device(value: str | torch.device, allowed: tuple[str, ...]) -> torch.device:
    device = _parsed_device(value)
    if device.type not in allowed:
        # xpu, meta, ...: the backends are neither built nor tested for them, and torch fails on
        # them only when allocating (an AssertionError where unbuilt); meta holds no data.
        hint = ""
        if device.type == "cuda":
            hint = " (the 'torch' backend runs on CUDA)"
        elif device.type == "npu":
            hint = " (the 'npu' backend runs on NPUs)"
        raise InvalidInputError.about(
            "device",
            f"must be {_DEVICE_NAMES[allowed]} device (type "
            f"{' or '.join(map(repr, allowed))}){hint}: {value!r}",
        )
    if device.type == "cuda" and not torch.cuda.is_available():
        raise InvalidInputError.about(
            "device",
            f"{value!r} needs a CUDA device, and torch sees none "
            f"(torch {torch.__version__}, built with CUDA {torch.version.cuda}): {value!r}",
        )
    return device


def _parsed_device(value: str | torch.device) -> torch.device:
    if isinstance(value, torch.device):
        return value
    if isinstance(value, str):
        if value.partition(":")[0].strip() == "npu":
            # Stock torch parses "npu" only once torch_npu has registered the device type;
            # without torch_npu this raises NpuUnavailableError with the reason.
            torch_npu_module()
        try:
            return torch.device(value)
        except RuntimeError:  # torch's message lists every device type it knows
            pass
    raise InvalidInputError.about(
        "device", f"must be a torch device such as 'cpu', 'cuda:0' or 'npu:0': {value!r}"
    )


def _default_device() -> torch.device:
    return torch.device("npu" if npu_availability().available else "cpu")


def _greedy(logits: torch.Tensor, requests: npt.NDArray[Any]) -> npt.NDArray[np.int64]:
    """Argmax ids, computed on the device; a dispatch without final rows samples nothing.

    Non-finite logits are refused with :class:`~pypto_sched.BackendError`: the argmax of a
    NaN row is a valid-looking id, and the driver, handed only the ids, could not tell (it
    checks the logits it gets). The check is one reduction on the device.
    """
    if logits.shape[0] == 0:
        return np.zeros(0, dtype=np.int64)
    finite = torch.isfinite(logits)
    if not bool(finite.all()):
        row, column = (int(i) for i in torch.nonzero(~finite)[0])
        raise BackendError(
            f"logits must be finite to give greedy ids: final row {row} (request "
            f"{int(requests[row])}) has {float(logits[row, column])} at vocabulary column "
            f"{column}"
        )
    ids: npt.NDArray[np.int64] = logits.argmax(dim=-1).cpu().numpy().astype(np.int64)
    return ids


def _host(tensor: torch.Tensor) -> npt.NDArray[np.floating[Any]]:
    """A host copy; bfloat16 (which NumPy lacks) and float16 come back as float32."""
    array: npt.NDArray[np.floating[Any]] = tensor.float().cpu().numpy()
    return array
