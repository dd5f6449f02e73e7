"""docs/vllm.md names every test of vLLM's suite that pypto_sched's scheduler may fail.

``.ci/vllm/compare.py`` (``make test-vllm``) excuses a failure only for the tests of its
``EXCEPTIONS``; the docs must name each of them with the same reason. Runs without vLLM.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def load_compare() -> Any:
    spec = importlib.util.spec_from_file_location("vllm_compare", ROOT / ".ci/vllm/compare.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_docs_name_every_exception_of_vllms_tests() -> None:
    exceptions = load_compare().EXCEPTIONS
    docs = " ".join((ROOT / "docs/vllm.md").read_text().split())
    assert exceptions
    for name, (policies, reason) in exceptions.items():
        assert f"`{name}`" in docs, name
        assert reason in docs, reason
        assert all(policy in ("packed", "round_robin") for policy in policies)
