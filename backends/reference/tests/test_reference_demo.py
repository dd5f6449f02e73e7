"""The demo: plans, executes and verifies; exits 0 only when chunked matches one-shot."""

from __future__ import annotations

from pathlib import Path

import pytest

from pypto_sched_reference import TINY_MODEL, Weights, save_checkpoint
from pypto_sched_reference.demo import main


def test_the_demo_prints_the_schedule_and_a_passing_verification(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["--prompts", "3", "--prompt-length", "40", "--threshold", "16"]) == 0
    out = capsys.readouterr().out
    assert "dispatches           9 (lower bound 3)" in out
    assert "(policy packed: 3 dispatches under the same limits)" in out
    assert "equal greedy token ids        3/3  OK" in out


def test_the_demo_runs_a_checkpoint_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    save_checkpoint(Weights.random(TINY_MODEL, seed=0), tmp_path)
    args = ["--checkpoint", str(tmp_path), "--prompts", "2", "--prompt-length", "20"]
    assert main([*args, "--threshold", "8", "--policy", "packed", "--dtype", "float32"]) == 0
    assert f"checkpoint {tmp_path}" in capsys.readouterr().out
