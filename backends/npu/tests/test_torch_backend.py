"""The ``torch`` backend: the npu backend's model on PyTorch's own ops, under the name a GPU
user looks for, on CUDA where torch sees a GPU and on the CPU otherwise. CUDA itself is
checked by ``benchmarks/gpu_check.py`` on a GPU; here, everything a machine without one can
check: discovery, defaults, refusals, and the conformance check on the CPU."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the torch backend needs torch")

from pypto_sched import POLICIES, InvalidInputError, PlannerConfig, plan_prefill  # noqa: E402
from pypto_sched.backends import backend_statuses, list_backends, load_backend  # noqa: E402
from pypto_sched.execute import execute_schedule  # noqa: E402
from pypto_sched.testing import check_backend  # noqa: E402
from pypto_sched_npu import TorchBackend  # noqa: E402

NO_CUDA = not torch.cuda.is_available()
#: As test_npu_logits: float32 logits within this of transformers'.
FLOAT32_TOLERANCE = 1e-4


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


@pytest.mark.parametrize("model", ["tied", "untied", "sharded"])
def test_its_final_logits_are_transformers(
    model: str, checkpoints: dict[str, Path], reference: Any
) -> None:
    """Chunked prefill on the torch backend gives transformers' Qwen3ForCausalLM logits at
    each prompt's last position (float32), whichever the policy."""
    backend = TorchBackend.from_checkpoint(checkpoints[model], device="cpu")
    rng = np.random.default_rng(7)
    prompts = [rng.integers(0, 101, size=n, dtype=np.int64) for n in (1, 13, 40, 57)]
    expected = reference.batch(model, prompts)
    for policy in POLICIES:
        config = PlannerConfig(
            max_num_batched_tokens=24, long_prefill_token_threshold=10, policy=policy
        )
        schedule = plan_prefill([p.size for p in prompts], config)
        result = execute_schedule(schedule, backend, prompts)
        assert result.logits is not None
        assert np.abs(result.logits - expected).max() <= FLOAT32_TOLERANCE


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_it_passes_check_backend_on_the_cpu(dtype: str, checkpoints: dict[str, Path]) -> None:
    check_backend(TorchBackend.from_checkpoint(checkpoints["tied"], dtype=dtype), max_examples=4)
