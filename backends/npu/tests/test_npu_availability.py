"""NPU detection: absent, installed but broken (import raises), present with or without a
visible device, forced off by the environment; lazy and cached until refreshed."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("torch", reason="the npu backend runs on torch")

import torch

from pypto_sched import InvalidInputError
from pypto_sched_npu import (
    FORCE_CPU_ENV,
    NpuBackend,
    NpuUnavailableError,
    npu_availability,
    refresh_availability,
)
from pypto_sched_npu.ops import NpuOps, TorchOps, select_ops


class _BrokenTorchNpu(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``torch_npu`` and fails to import it, as an install without CANN does."""

    imports = 0

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != "torch_npu":
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return None

    def exec_module(self, module: ModuleType) -> None:
        type(self).imports += 1
        raise ImportError("libhccl.so: cannot open shared object file: No such file or directory")


@pytest.fixture
def no_torch_npu(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """torch_npu absent, whatever this machine has installed."""
    real_find_spec = importlib.util.find_spec

    def find_spec(name: str, package: str | None = None) -> Any:
        return None if name == "torch_npu" else real_find_spec(name, package)

    monkeypatch.delitem(sys.modules, "torch_npu", raising=False)
    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    monkeypatch.delenv(FORCE_CPU_ENV, raising=False)
    refresh_availability()
    yield
    refresh_availability()


@pytest.fixture
def broken_torch_npu(monkeypatch: pytest.MonkeyPatch) -> Iterator[type[_BrokenTorchNpu]]:
    monkeypatch.delitem(sys.modules, "torch_npu", raising=False)
    monkeypatch.setattr(sys, "meta_path", [_BrokenTorchNpu(), *sys.meta_path])
    monkeypatch.delenv(FORCE_CPU_ENV, raising=False)
    _BrokenTorchNpu.imports = 0
    refresh_availability()
    yield _BrokenTorchNpu
    refresh_availability()


@pytest.fixture
def visible_npu(
    fake_torch_npu: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> Iterator[ModuleType]:
    """The fake torch_npu installed and ``torch.npu.is_available()`` true."""
    monkeypatch.setattr(torch, "npu", SimpleNamespace(is_available=lambda: True), raising=False)
    monkeypatch.delenv(FORCE_CPU_ENV, raising=False)
    refresh_availability()
    yield fake_torch_npu
    refresh_availability()


def test_absent_torch_npu_means_cpu(no_torch_npu: None, checkpoints: dict[str, Path]) -> None:
    found = npu_availability()
    assert not found
    assert found.reason == "torch_npu is not installed"
    backend = NpuBackend.from_checkpoint(checkpoints["tied"])
    assert backend.device == torch.device("cpu")
    assert backend.ops_name == "torch"


def test_a_torch_npu_that_fails_to_import_means_cpu_with_the_reason(
    broken_torch_npu: type[_BrokenTorchNpu], checkpoints: dict[str, Path]
) -> None:
    found = npu_availability()
    assert not found.available
    assert "importing it failed: ImportError: libhccl.so" in found.reason
    assert NpuBackend.from_checkpoint(checkpoints["tied"]).ops_name == "torch"
    with pytest.raises(NpuUnavailableError, match=r"libhccl\.so"):
        NpuBackend.from_checkpoint(checkpoints["tied"], ops="npu")


def test_detection_is_cached_until_refreshed(broken_torch_npu: type[_BrokenTorchNpu]) -> None:
    npu_availability()
    npu_availability()
    assert broken_torch_npu.imports == 1
    refresh_availability()
    npu_availability()
    assert broken_torch_npu.imports == 2


def test_nothing_is_imported_until_asked(broken_torch_npu: type[_BrokenTorchNpu]) -> None:
    select_ops(torch.device("cpu"))
    assert broken_torch_npu.imports == 0


def test_present_torch_npu_with_a_device_is_available(visible_npu: ModuleType) -> None:
    found = npu_availability()
    assert found.available, found.reason
    assert isinstance(select_ops(torch.device("cpu"), choice="npu"), NpuOps)


def test_present_torch_npu_without_a_device_is_not_available(
    visible_npu: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torch, "npu", SimpleNamespace(is_available=lambda: False))
    refresh_availability()
    assert npu_availability().reason == "torch.npu.is_available() is False"
    monkeypatch.delattr(torch, "npu")
    refresh_availability()
    assert npu_availability().reason == "torch_npu imported but registered no torch.npu"


@pytest.mark.parametrize("value", ["1", "true", "YES", "on"])
def test_the_environment_forces_the_cpu_path_without_importing(
    value: str,
    broken_torch_npu: type[_BrokenTorchNpu],
    monkeypatch: pytest.MonkeyPatch,
    checkpoints: dict[str, Path],
) -> None:
    monkeypatch.setenv(FORCE_CPU_ENV, value)
    refresh_availability()
    found = npu_availability()
    assert not found.available
    assert found.reason.startswith(f"{FORCE_CPU_ENV}=")
    assert NpuBackend.from_checkpoint(checkpoints["tied"]).device.type == "cpu"
    assert broken_torch_npu.imports == 0


def test_the_environment_outranks_a_visible_npu(
    visible_npu: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(FORCE_CPU_ENV, "1")
    refresh_availability()
    assert not npu_availability().available


def test_ops_follow_the_device() -> None:
    assert isinstance(select_ops(torch.device("cpu")), TorchOps)
    assert isinstance(select_ops(torch.device("cpu"), choice="torch"), TorchOps)


def test_an_npu_device_selects_the_npu_ops(visible_npu: ModuleType) -> None:
    # Stock torch cannot name an "npu" device; torch_npu registers it. Only .type is read.
    npu_device: Any = SimpleNamespace(type="npu")
    ops = select_ops(npu_device)
    assert isinstance(ops, NpuOps)
    assert ops.torch_npu is visible_npu


@pytest.mark.parametrize("device", ["npu", "npu:0"])
def test_an_npu_device_without_torch_npu_says_why(
    device: str, no_torch_npu: None, checkpoints: dict[str, Path]
) -> None:
    # Stock torch cannot parse "npu" until torch_npu registers it: the reason must be torch_npu.
    with pytest.raises(NpuUnavailableError, match="torch_npu is not installed"):
        NpuBackend.from_checkpoint(checkpoints["tied"], device=device)


def test_an_npu_device_with_a_broken_torch_npu_says_why(
    broken_torch_npu: type[_BrokenTorchNpu],
) -> None:
    with pytest.raises(NpuUnavailableError, match=r"libhccl\.so"):
        NpuBackend.from_checkpoint(Path("unread"), device="npu:0")


def test_an_npu_device_is_parsed_once_torch_npu_is_imported() -> None:
    # torch_npu names torch's private-use device "npu" on import; the fake does it when
    # asked, in a process of its own (naming it is for good, and other libraries then take an
    # NPU to be present).
    code = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('torch_npu', {str(FAKE)!r})\n"
        "fake = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(fake)\n"
        "sys.modules['torch_npu'] = fake\n"
        "fake.register_npu_device()\n"
        "import torch\n"
        "from pypto_sched_npu.backend import _device\n"
        "assert _device('npu', ('npu', 'cpu')) == torch.device('npu')\n"
        "assert _device('npu:1', ('npu', 'cpu')) == torch.device('npu', 1)\n"
        "assert _device('cpu', ('npu', 'cpu')) == torch.device('cpu')\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


#: The fake torch_npu of these tests.
FAKE = Path(__file__).with_name("fake_torch_npu.py")


def test_npu_ops_on_a_cpu_device_need_a_torch_npu_that_takes_cpu_tensors(
    fake_torch_npu: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    cpu = torch.device("cpu")
    assert isinstance(select_ops(cpu, choice="npu"), NpuOps)  # the fake says it does
    monkeypatch.delattr(fake_torch_npu, "TAKES_CPU_TENSORS")  # as the real torch_npu
    with pytest.raises(InvalidInputError, match=r"'ops'='npu' needs an npu device.*: device cpu"):
        select_ops(cpu, choice="npu")
    npu_device: Any = SimpleNamespace(type="npu")
    assert isinstance(select_ops(npu_device, choice="npu"), NpuOps)
