"""The ``torch`` backend: the npu backend's model on PyTorch's own ops, under the name a GPU
user looks for, on CUDA where torch sees a GPU and on the CPU otherwise. CUDA itself is
checked by ``benchmarks/gpu_check.py`` on a GPU; here, everything a machine without one can
check: discovery, defaults, refusals, and the conformance check on the CPU."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="the torch backend needs torch")

from pypto_sched import InvalidInputError  # noqa: E402
from pypto_sched.backends import backend_statuses, list_backends, load_backend  # noqa: E402
from pypto_sched.testing import check_backend  # noqa: E402
from pypto_sched_npu import NpuBackend, TorchBackend  # noqa: E402

NO_CUDA = not torch.cuda.is_available()


def test_it_is_discovered_under_the_name_torch(checkpoints: dict[str, Path]) -> None:
    assert "torch" in list_backends()
    backend = load_backend("torch", checkpoint=checkpoints["tied"])
    assert isinstance(backend, TorchBackend)
    assert backend.name == "torch"
    assert backend.ops_name == "torch"


@pytest.mark.skipif(not NO_CUDA, reason="the default is the CPU only where torch sees no GPU")
def test_without_a_gpu_it_runs_on_the_cpu_and_says_so(checkpoints: dict[str, Path]) -> None:
    backend = TorchBackend.from_checkpoint(checkpoints["tied"])
    assert backend.device == torch.device("cpu")
    status = next(s for s in backend_statuses() if s.name == "torch")
    assert status.available
    assert status.reason == "on the CPU (torch sees no CUDA device)"
    assert set(status.options) == {"checkpoint", "dtype", "device"}


@pytest.mark.skipif(not NO_CUDA, reason="refusing CUDA needs a torch that sees no GPU")
def test_cuda_without_a_gpu_is_refused_before_loading(checkpoints: dict[str, Path]) -> None:
    for device in ("cuda", "cuda:0"):
        with pytest.raises(InvalidInputError, match=r"needs a CUDA device, and torch sees none"):
            load_backend("torch", checkpoint=checkpoints["tied"], device=device)


def test_devices_it_does_not_run_on_are_refused_naming_the_backend_that_does(
    checkpoints: dict[str, Path],
) -> None:
    with pytest.raises(InvalidInputError, match=r"^'device' must be a CUDA or CPU device") as e:
        load_backend("torch", checkpoint=checkpoints["tied"], device="meta")
    assert str(e.value).endswith(": 'meta'")
    # and the npu backend points a CUDA user to this one
    with pytest.raises(InvalidInputError, match=r"the 'torch' backend runs on CUDA\): 'cuda'$"):
        load_backend("npu", checkpoint=checkpoints["tied"], device="cuda")
    with pytest.raises(InvalidInputError, match="unknown options"):
        load_backend("torch", checkpoint=checkpoints["tied"], ops="npu")


def test_it_computes_what_the_npu_backends_torch_path_does(checkpoints: dict[str, Path]) -> None:
    ours = TorchBackend.from_checkpoint(checkpoints["untied"], device="cpu")
    npu = NpuBackend.from_checkpoint(checkpoints["untied"], device="cpu", ops="torch")
    assert repr(ours).replace("ops='torch'", "") == repr(npu).replace("ops='torch'", "")
    assert (ours.tolerance, ours.relative_tolerance) == (npu.tolerance, npu.relative_tolerance)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_it_passes_check_backend_on_the_cpu(dtype: str, checkpoints: dict[str, Path]) -> None:
    check_backend(TorchBackend.from_checkpoint(checkpoints["tied"], dtype=dtype), max_examples=4)
