"""The op layer: one forward pass, two kernel sets, chosen by the tensors' device.

:func:`select_ops` returns :class:`TorchOps` for CPU (or any non-NPU) devices and
:class:`NpuOps` for ``npu`` devices. ``choice="npu"`` forces the NPU kernels on any device:
with the tests' fake ``torch_npu`` installed, that runs the NPU path's marshalling on CPU.
"""

from __future__ import annotations

from typing import Literal, get_args

import torch

from pypto_sched import InvalidInputError

from .._availability import torch_npu_module
from ._npu_ops import NpuOps
from ._protocol import AttentionShape, DispatchAttention, Ops
from ._torch_ops import TorchOps

__all__ = [
    "OPS_CHOICES",
    "TAKES_CPU_TENSORS",
    "AttentionShape",
    "DispatchAttention",
    "NpuOps",
    "Ops",
    "OpsChoice",
    "TorchOps",
    "select_ops",
]

OpsChoice = Literal["auto", "torch", "npu"]
#: The accepted values of ``choice``.
OPS_CHOICES: tuple[OpsChoice, ...] = get_args(OpsChoice)
#: The attribute a stand-in torch_npu sets to a true value when its ops take CPU tensors
#: (the real module has no such attribute).
TAKES_CPU_TENSORS = "TAKES_CPU_TENSORS"


def select_ops(device: torch.device, *, choice: OpsChoice = "auto") -> Ops:
    """The ops for tensors on ``device``: ``"auto"`` picks by device type."""
    if choice not in OPS_CHOICES:
        raise InvalidInputError.about("ops", f"must be one of {OPS_CHOICES}: {choice!r}")
    if choice == "torch" or (choice == "auto" and device.type != "npu"):
        return TorchOps()
    module = torch_npu_module()
    if device.type != "npu" and not getattr(module, TAKES_CPU_TENSORS, False):
        raise InvalidInputError(
            f"'ops'='npu' needs an npu device: torch_npu's kernels take NPU tensors, so "
            f"pass device='npu' (or ops='torch' to run on {device.type}): device {device}",
            parameter="ops",
        )
    return NpuOps(module)
