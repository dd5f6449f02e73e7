"""The `pypto-sched plan` command: summary, JSON output and one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pypto_sched import Schedule
from pypto_sched.cli import main, parse_lengths

SEED = ["--lengths", "3338x16", "--max-num-batched-tokens", "8192"]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def test_lengths_syntax_expands_counts() -> None:
    assert parse_lengths("3338x2,5, 7\n# comment\n1x3") == [3338, 3338, 5, 7, 1, 1, 1]


def test_plan_summary_of_the_seed_reports_dispatches_and_bound(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status, out, err = run(capsys, "plan", *SEED, "--long-prefill-token-threshold", "256")
    assert status == 0
    assert err == ""
    assert "224 (lower bound 14" in out
    assert "request    9: 217" in out


def test_plan_json_has_dispatch_rows_and_round_trips(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(
        capsys, "plan", *SEED, "--long-prefill-token-threshold", "256", "--format", "json"
    )
    assert status == 0
    data = json.loads(out)
    assert len(data["dispatches"]) == 224
    assert data["dispatches"][41] == [[9, 512, 256, False]]
    assert data["summary"]["num_dispatches"] == 224
    assert Schedule.from_dict(data).num_dispatches == 224


def test_plan_packed_options_reach_the_config(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(
        capsys, "plan", *SEED, "--long-prefill-token-threshold", "256", "--policy", "packed",
        "--max-batch-size", "16", "--format", "json",
    )
    assert status == 0
    data = json.loads(out)
    assert data["config"]["policy"] == "packed"
    assert data["config"]["max_batch_size"] == 16
    assert len(data["dispatches"]) == 14


def test_lengths_and_computed_tokens_from_files(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    (tmp_path / "lengths.txt").write_text("10\n20 # a comment\n30x2\n")
    (tmp_path / "computed.txt").write_text("0,5,0,29")
    status, out, _ = run(
        capsys, "plan", "--lengths", f"@{tmp_path / 'lengths.txt'}",
        "--num-computed", f"@{tmp_path / 'computed.txt'}",
        "--max-num-batched-tokens", "8", "--format", "json",
    )
    assert status == 0
    data = json.loads(out)
    assert data["prompt_lengths"] == [10, 20, 30, 30]
    assert data["num_computed_tokens"] == [0, 5, 0, 29]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["plan", "--lengths", "12,abc", "--max-num-batched-tokens", "8"], "'abc'"),
        (["plan", "--lengths", "12x0", "--max-num-batched-tokens", "8"], "must be >= 1"),
        (["plan", "--lengths", "0", "--max-num-batched-tokens", "8"], "'prompt_lengths'"),
        (["plan", "--lengths", "12", "--max-num-batched-tokens", "0"], "'max_num_batched_tokens'"),
        (["plan", "--lengths", "12", "--max-num-batched-tokens", "x"], "invalid int value"),
        (["plan", "--lengths", "12"], "--max-num-batched-tokens"),
        (["plan", "--lengths", "12", "--max-num-batched-tokens", "8", "--page-size", "9"],
         "'page_size'"),
        (["plan", "--lengths", "12", "--max-num-batched-tokens", "8", "--num-computed", "12"],
         "'num_computed_tokens'"),
        (["plan", "--lengths", "@/no/such/file", "--max-num-batched-tokens", "8"],
         "cannot read"),
        (["plan", "--lengths", "12", "--max-num-batched-tokens", "8", "--policy", "fifo"],
         "invalid choice"),
        ([], "command"),
    ],
)
def test_bad_input_exits_2_with_one_line(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    status, out, err = run(capsys, *argv)
    assert status == 2
    assert out == ""
    assert err.count("\n") == 1
    assert err.startswith("pypto-sched: error:")
    assert message in err
