"""The demo generates, chunked over a small KV pool and with one-shot prefill, and exits 0
only when both give the same tokens."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import attrs
import pytest

import pypto_sched
from pypto_sched_reference import TINY_MODEL, Weights, save_checkpoint
from pypto_sched_reference.demo import main

SMALL = ["--prompts", "4", "--prompt-length", "40", "--threshold", "16", "--max-new-tokens", "6"]
POOL = ["--num-kv-pages", "12", "--page-size", "8"]


def _row(out: str, label: str) -> list[str]:
    match = re.search(rf"^{label} +(\S+) +(\S+)$", out, re.MULTILINE)
    assert match is not None, out
    return [match[1], match[2]]


def test_the_demo_mixes_decode_with_prefill_preempts_and_verifies(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main([*SMALL, *POOL]) == 0
    out = capsys.readouterr().out
    assert "Workload: 4 prompts x 40 tokens (the seed's 16 x 3,338, scaled), 6 new tokens" in out
    assert _row(out, "dispatches") == ["24", "6"]
    assert _row(out, "mixed prefill and decode") == ["3", "0"]
    assert _row(out, "preemptions") == ["2", "0"]
    assert _row(out, "generated tokens") == ["24", "24"]
    assert "token for token: 4/4 requests (24 tokens)  OK" in out


def test_the_demo_fails_when_the_chunked_tokens_differ(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    real = pypto_sched.generate

    def one_token_off(*args: Any, **kwargs: Any) -> Any:
        result = real(*args, **kwargs)
        if kwargs["num_kv_pages"] is None:  # the one-shot run
            return result
        last = result.sequences[-1]
        ids = last.token_ids.copy()
        ids[-1] = (ids[-1] + 1) % 1024
        changed = attrs.evolve(last, token_ids=ids)
        return attrs.evolve(result, sequences=(*result.sequences[:-1], changed))

    monkeypatch.setattr("pypto_sched_reference.demo.generate", one_token_off)
    assert main([*SMALL, *POOL]) == 1
    assert "3/4 requests (24 tokens)  FAILED" in capsys.readouterr().out


def test_the_demo_runs_a_checkpoint_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    save_checkpoint(Weights.random(TINY_MODEL, seed=0), tmp_path)
    args = ["--checkpoint", str(tmp_path), "--prompts", "2", "--prompt-length", "20"]
    assert main([*args, "--threshold", "8", "--policy", "packed", "--dtype", "float32"]) == 0
    assert f"checkpoint {tmp_path}" in capsys.readouterr().out
