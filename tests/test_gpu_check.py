"""``benchmarks/gpu_check.py --smoke``: the GPU check runs end to end at toy sizes on the CPU,
so that the script a person runs on a GPU machine cannot rot between the sessions that
have one. Its figures mean nothing at these sizes; its verdicts on correctness do."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="the GPU check runs the torch backend")
pytest.importorskip("transformers", reason="the GPU check compares with transformers")
pytest.importorskip("pypto_sched_npu", reason="the GPU check runs the torch backend")

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "gpu_check.py"
SECTIONS = ("checkpoint", "logits", "greedy", "throughput", "seed", "transformers_cb", "profile")


@pytest.mark.slow
def test_the_smoke_run_writes_every_section_and_its_checks_pass(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(tmp_path), "--smoke", "--no-check"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert report["smoke"] is True
    assert report["environment"]["device"] == "cpu"
    assert set(report["sections"]) == set(SECTIONS)
    for name, data in report["sections"].items():
        assert "error" not in data, f"{name}: {data.get('error')}"
    sections = report["sections"]
    # correctness holds at any size: logits within the backend's tolerance of transformers'
    for policy in ("round_robin", "packed"):
        assert sections["logits"][policy]["passed"]
        assert sections["logits"][policy]["max_abs_logit_diff"] <= sections["logits"]["tolerance"]
    assert sections["greedy"]["passed"]
    cb = sections["transformers_cb"]
    assert cb["fifo"]["requests_with_fifo_tokens"] == cb["prompts"]
    for side in ("packed", "round_robin"):
        assert 0 <= cb[side]["requests_with_fifo_tokens"] <= cb["prompts"]
        assert cb[side]["seconds_over_fifo"] > 0
    assert sections["profile"]["dispatches"] >= 1
    seed = sections["seed"]
    assert seed["round_robin"]["dispatches"] > seed["packed"]["dispatches"] > 1
    assert seed["one_shot"]["dispatches"] == 1
    throughput = sections["throughput"]
    assert throughput["ours"]["output_tokens"] == throughput["prompts"] * throughput["new_tokens"]
    assert 0 <= throughput["planning_share"] < 1
    # the table a person reads holds every section's figures, and stdout is that table
    table = (tmp_path / "gpu_check.md").read_text()
    for name in SECTIONS:
        assert f"| {name} |" in table
    assert done.stdout.strip() == table.strip()
