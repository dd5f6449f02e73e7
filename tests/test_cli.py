"""The `pypto-sched` command line: plan, compare, plot, run and backends.

Each command is called in-process through ``main(argv)``; output is what a pipe would get
(rich draws plain text when stdout is not a terminal).
"""

from __future__ import annotations

import importlib.util
import json
import signal
import struct
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from cli_helpers import run, run_json

from pypto_sched import InvalidInputError, Schedule
from pypto_sched.cli import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    compare,
    main,
    parse_lengths,
    plan,
    plot,
)
from pypto_sched.core._workloads import WORKLOADS, synthetic_lengths

SEED = ["--lengths", "3338x16", "--max-num-batched-tokens", "8192"]
SEED_256 = [*SEED, "--long-prefill-token-threshold", "256"]


# -- lengths and workloads -------------------------------------------------------------------


def test_lengths_syntax_expands_counts() -> None:
    assert parse_lengths("3338x2,5, 7\n# comment\n1x3").tolist() == [3338, 3338, 5, 7, 1, 1, 1]


@pytest.mark.parametrize("name", WORKLOADS)
def test_synthetic_workloads_are_reproducible_and_within_bounds(name: str) -> None:
    first = synthetic_lengths(name, num_requests=500, seed=7, min_length=32, max_length=2048)
    again = synthetic_lengths(name, num_requests=500, seed=7, min_length=32, max_length=2048)
    assert np.array_equal(first, again)
    assert not first.flags.writeable
    assert first.shape == (500,)
    if name == "seed":
        assert set(first.tolist()) == {3338}
    else:
        assert 32 <= first.min() <= first.max() <= 2048
        other = synthetic_lengths(name, num_requests=500, seed=8, min_length=32, max_length=2048)
        assert not np.array_equal(first, other)


def test_synthetic_workloads_have_their_shapes() -> None:
    lognormal = synthetic_lengths("lognormal", num_requests=4000, min_length=16, max_length=4096)
    assert 200 < np.median(lognormal) < 300  # the geometric middle of 16 and 4096 is 256
    bimodal = synthetic_lengths("bimodal", num_requests=4000, min_length=16, max_length=4096)
    assert 0.15 < np.mean(bimodal >= 2048) < 0.25
    assert 0.75 < np.mean(bimodal <= 512) < 0.85


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"name": "zipf"}, "'workload' must be one of"),
        ({"num_requests": 0}, "'num_requests' must be >= 1: 0"),
        ({"min_length": 0}, "'min_length' must be >= 1: 0"),
        ({"min_length": 10, "max_length": 5}, "'min_length' must be <= max_length = 5: 10"),
        ({"seed": -1}, "'seed' must be >= 0: -1"),
    ],
)
def test_synthetic_workloads_reject_bad_arguments(kwargs: dict[str, Any], message: str) -> None:
    arguments: dict[str, Any] = {"name": "uniform", "num_requests": 4, **kwargs}
    with pytest.raises(InvalidInputError, match=message):
        synthetic_lengths(**arguments)


# -- plan ------------------------------------------------------------------------------------


def test_plan_summary_of_the_seed_reports_dispatches_and_bound(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status, out, err = run(capsys, "plan", *SEED_256)
    assert (status, err) == (EXIT_OK, "")
    assert "policy round_robin: 16 requests, 53,408 tokens to prefill" in out
    assert "224 (lower bound 14, 16.00x)" in out
    assert "     9    3,338       14                    217" in out
    assert all(line == line.rstrip() for line in out.splitlines())


@pytest.mark.parametrize(
    ("command", "lengths", "heading"),
    [
        ("plan", "1", "policy round_robin: 1 request, 1 token to prefill\n"),
        ("plan", "10", "policy round_robin: 1 request, 10 tokens to prefill\n"),
        ("compare", "1", "1 request, 1 token (--lengths)\n"),
    ],
)
def test_a_heading_counts_one_request_in_the_singular(
    capsys: pytest.CaptureFixture[str], command: str, lengths: str, heading: str
) -> None:
    status, out, err = run(capsys, command, "--lengths", lengths, "--max-num-batched-tokens", "16")
    assert (status, err) == (EXIT_OK, "")
    assert out.startswith(heading)


def test_plan_json_has_dispatch_rows_and_round_trips(capsys: pytest.CaptureFixture[str]) -> None:
    data = run_json(capsys, "plan", *SEED_256)
    assert len(data["dispatches"]) == 224
    assert data["dispatches"][41] == [[9, 512, 256, False]]
    assert data["summary"]["num_dispatches"] == 224
    assert Schedule.from_dict(data).num_dispatches == 224


def test_plan_packed_options_reach_the_config(capsys: pytest.CaptureFixture[str]) -> None:
    data = run_json(capsys, "plan", *SEED_256, "--policy", "packed", "--max-num-seqs", "16")
    assert data["config"]["policy"] == "packed"
    assert data["config"]["max_num_seqs"] == 16
    assert len(data["dispatches"]) == 14


def test_plan_of_a_named_workload_draws_its_lengths(capsys: pytest.CaptureFixture[str]) -> None:
    data = run_json(
        capsys,
        "plan",
        "--workload",
        "uniform",
        "--num-requests",
        "40",
        "--seed",
        "3",
        "--min-length",
        "10",
        "--max-length",
        "90",
        "--max-num-batched-tokens",
        "64",
    )
    expected = synthetic_lengths("uniform", num_requests=40, seed=3, min_length=10, max_length=90)
    assert data["prompt_lengths"] == expected.tolist()


def test_plan_text_lists_only_the_first_requests(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(capsys, "plan", "--lengths", "5x40", "--max-num-batched-tokens", "64")
    assert status == EXIT_OK
    assert out.rstrip().endswith("... and 24 more (see --format json)")


def test_lengths_and_computed_tokens_from_files(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    (tmp_path / "lengths.txt").write_text("10\n20 # a comment\n30x2\n")
    (tmp_path / "computed.txt").write_text("0,5,0,29")
    data = run_json(
        capsys,
        "plan",
        "--lengths",
        f"@{tmp_path / 'lengths.txt'}",
        "--num-computed",
        f"@{tmp_path / 'computed.txt'}",
        "--max-num-batched-tokens",
        "8",
    )
    assert data["prompt_lengths"] == [10, 20, 30, 30]
    assert data["num_computed_tokens"] == [0, 5, 0, 29]


# -- compare ---------------------------------------------------------------------------------


def test_compare_without_configs_puts_both_policies_side_by_side(
    capsys: pytest.CaptureFixture[str],
) -> None:
    data = run_json(capsys, "compare", *SEED_256, "--max-num-seqs", "16")
    assert data["workload"]["num_requests"] == 16
    assert data["workload"]["num_tokens"] == 53408
    rows = data["configurations"]
    assert [r["config"]["policy"] for r in rows] == ["round_robin", "packed"]
    assert [r["summary"]["num_dispatches"] for r in rows] == [224, 14]
    assert [r["summary"]["lower_bound"] for r in rows] == [14, 14]


def test_compare_table_shows_the_varied_setting_and_every_figure(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status, out, err = run(capsys, "compare", *SEED_256, "--max-num-seqs", "16")
    assert (status, err) == (EXIT_OK, "")
    lines = out.splitlines()
    assert lines[0] == "16 requests, 53,408 tokens (--lengths)"
    assert lines[1] == "all rows: budget 8,192, threshold 256, max batch 16"
    assert lines[2].split() == [
        "policy",
        "dispatches",
        "lower",
        "bound",
        "x",
        "bound",
        "mean",
        "util",
        "min",
        "util",
        "largest",
        "dispatch",
        "mean",
        "finish",
        "worst",
        "finish",
    ]
    assert lines[4].split() == [
        "round_robin",
        "224",
        "14",
        "16.00",
        "2.9%",
        "0.1%",
        "256",
        "215.5",
        "223",
    ]
    assert lines[5].split() == [
        "packed",
        "14",
        "14",
        "1.00",
        "46.6%",
        "2.0%",
        "4,096",
        "13.0",
        "13",
    ]


def test_compare_vary_gives_one_row_per_value_of_every_combination(
    capsys: pytest.CaptureFixture[str],
) -> None:
    data = run_json(
        capsys,
        "compare",
        "--workload",
        "seed",
        "--max-num-batched-tokens",
        "8192",
        "--vary",
        "policy=round_robin,packed",
        "--vary",
        "long-prefill-token-threshold=off,256",
    )
    configs = [
        (r["config"]["policy"], r["config"]["long_prefill_token_threshold"])
        for r in data["configurations"]
    ]
    assert configs == [
        ("round_robin", None),
        ("round_robin", 256),
        ("packed", None),
        ("packed", 256),
    ]


def test_compare_config_specs_change_the_base(capsys: pytest.CaptureFixture[str]) -> None:
    data = run_json(
        capsys,
        "compare",
        *SEED_256,
        "--config",
        "policy=packed,batch=8",
        "--config",
        "align=128",
        "--vary",
        "budget=4096,8192",
    )
    configs = [r["config"] for r in data["configurations"]]
    assert len(configs) == 4
    assert [(c["policy"], c["max_num_seqs"], c["chunk_alignment"]) for c in configs] == [
        ("packed", 8, None),
        ("packed", 8, None),
        ("round_robin", None, 128),
        ("round_robin", None, 128),
    ]
    assert [c["max_num_batched_tokens"] for c in configs] == [4096, 8192, 4096, 8192]


def test_compare_text_has_a_column_per_varying_setting(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status, out, _ = run(
        capsys,
        "compare",
        "--workload",
        "seed",
        "--max-num-batched-tokens",
        "8192",
        "--policy",
        "packed",
        "--vary",
        "threshold=0,256",
        "--vary",
        "batch=4,16",
    )
    assert status == EXIT_OK
    lines = out.splitlines()
    assert lines[0] == "16 requests, 53,408 tokens (--workload seed --num-requests 16)"
    assert lines[1] == "all rows: policy packed, budget 8,192"
    assert lines[2].split()[:4] == ["threshold", "max", "batch", "dispatches"]
    assert [line.split()[:2] for line in lines[4:]] == [
        ["off", "4"],
        ["off", "16"],
        ["256", "4"],
        ["256", "16"],
    ]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            ["--config", "speed=3"],
            "--config: unknown setting 'speed'; known: policy, max-num-batched-tokens, "
            "long-prefill-token-threshold, max-num-seqs, chunk-alignment, "
            "max-num-partial-prefills, budget, threshold, batch, align, partial\n",
        ),
        (["--config", "policy"], "--config: expected KEY=VALUE"),
        (["--vary", "threshold=big"], "--vary: long-prefill-token-threshold must be an integer"),
        (["--vary", "threshold="], "--vary: expected KEY=VALUE,VALUE"),
        (
            ["--vary", "partial=2"],
            "error: --vary max-num-partial-prefills: applies only to policy 'packed'",
        ),
        (["--vary", "budget=0"], "error: --vary max-num-batched-tokens: must be >= 1: 0\n"),
        (
            ["--config", "policy=bogus"],
            "error: --config policy: must be one of 'round_robin', 'packed': 'bogus'\n",
        ),
        (
            ["--config", "threshold=512", "--vary", "budget=16,0"],
            "error: --vary max-num-batched-tokens: must be >= 1: 0\n",
        ),
        (
            ["--config", "max-num-batched-tokens=0"],
            "error: --config max-num-batched-tokens: must be >= 1: 0\n",
        ),
        (
            ["--vary", "threshold=8", "--vary", "threshold=4"],
            "--vary: long-prefill-token-threshold is varied twice",
        ),
        (
            ["--config", "threshold=4", "--config", "threshold=8", "--vary", "threshold=2,16"],
            "--config and --vary both set long-prefill-token-threshold",
        ),
        (
            ["--config", "long-prefill-token-threshold=4", "--vary", "threshold=2"],
            "--config and --vary both set long-prefill-token-threshold",
        ),
        (
            ["--config", "policy=packed,policy=round_robin"],
            "--config: policy is given twice in 'policy=packed,policy=round_robin'",
        ),
        (["--config", "batch=2,max_num_seqs=4"], "--config: max-num-seqs is given twice"),
        (
            ["--vary", "threshold=256,256"],
            "--vary: long-prefill-token-threshold 256 is given twice",
        ),
    ],
)
def test_compare_bad_configs_exit_2_with_one_line(
    capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    status, out, err = run(capsys, "compare", *SEED_256, *extra)
    assert (status, out) == (EXIT_USAGE, "")
    assert err.count("\n") == 1
    assert message in err


# -- plot ------------------------------------------------------------------------------------


needs_matplotlib = pytest.mark.skipif(
    importlib.util.find_spec("matplotlib") is None,
    reason="plotting needs matplotlib (pip install 'pypto-sched[plot]')",
)


def png_size(path: Path) -> tuple[int, int]:
    """Width and height from a PNG's IHDR chunk, after checking the signature and the end."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert data[12:16] == b"IHDR"
    assert data[-8:-4] == b"IEND"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


@needs_matplotlib
def test_plot_of_the_seed_is_a_png_of_the_asked_size(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "seed.png"
    data = run_json(
        capsys, "plot", *SEED_256, "-o", str(path), "--width", "1200", "--height", "700"
    )
    assert data == {
        "path": str(path),
        "format": "png",
        "width": 1200,
        "height": 700,
        "style": "chunks",
        "num_dispatches": 224,
        "num_requests": 16,
    }
    assert png_size(path) == (1200, 700)
    from matplotlib.image import imread

    pixels = imread(path)
    assert pixels.shape[:2] == (700, 1200)
    assert len(np.unique(pixels.reshape(-1, pixels.shape[2]), axis=0)) > 10  # not blank


@needs_matplotlib
def test_plot_of_thousands_of_dispatches_is_drawn_as_an_image(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "big.png"
    data = run_json(
        capsys,
        "plot",
        "--workload",
        "uniform",
        "--num-requests",
        "300",
        "--max-length",
        "20000",
        "--max-num-batched-tokens",
        "1024",
        "-o",
        str(path),
        "--width",
        "800",
        "--height",
        "500",
    )
    assert data["style"] == "raster"
    assert data["num_dispatches"] > 2000
    assert png_size(path) == (800, 500)


@needs_matplotlib
def test_plot_svg_is_an_svg_document(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "seed.svg"
    status, out, err = run(
        capsys,
        "plot",
        *SEED_256,
        "--policy",
        "packed",
        "-o",
        str(path),
        "--width",
        "800",
        "--height",
        "450",
    )
    assert (status, err) == (EXIT_OK, "")
    assert out == f"wrote {path}: 800x450 SVG, chunks style, 14 dispatches of 16 requests\n"
    root = ET.parse(path).getroot()
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    assert root.attrib["viewBox"] == "0 0 576 324"  # 8 x 4.5 inches in points
    # The same schedule, the same bytes (no date; clip-path ids from a fixed salt).
    again = tmp_path / "again.svg"
    assert main(["plot", *SEED_256, "--policy", "packed", "-o", str(again), "--width", "800",
                 "--height", "450"]) == EXIT_OK  # fmt: skip
    assert again.read_bytes() == path.read_bytes()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["-o", "seed.jpg"], "--output: the file name must end in .png or .svg"),
        (["-o", "seed.png/"], "--output: names a directory, not an image file: 'seed.png/'"),
        (["-o", "seed.png", "--width", "5"], "--width: must be in [100, 20000] pixels: 5"),
        pytest.param(["-o", "/no/such/dir/seed.png"], "cannot write", marks=needs_matplotlib),
    ],
)
def test_plot_bad_output_exits_with_one_line(
    capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    status, _, err = run(capsys, "plot", *SEED_256, *extra)
    assert status == EXIT_USAGE
    assert err.count("\n") == 1
    assert message in err


def test_plot_without_matplotlib_says_which_extra_to_install(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    status, _, err = run(capsys, "plot", *SEED_256, "-o", str(tmp_path / "x.png"))
    assert status == EXIT_FAILED
    assert err == "pypto-sched: error: plot needs matplotlib: pip install 'pypto-sched[plot]'\n"


def test_text_output_without_rich_says_which_extra_to_install(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "rich", None)
    monkeypatch.setitem(sys.modules, "rich.console", None)
    status, out, err = run(capsys, "compare", *SEED_256)
    assert (status, out) == (EXIT_FAILED, "")
    assert err.count("\n") == 1
    assert "pip install 'pypto-sched[cli]'" in err
    # JSON needs nothing beyond the library.
    assert run_json(capsys, "compare", *SEED_256)["configurations"]


def test_python_dash_m_runs_the_same_command_line() -> None:
    import subprocess

    argv = ["plan", "--lengths", "5x2", "--max-num-batched-tokens", "8", "--format", "json"]
    result = subprocess.run(
        [sys.executable, "-m", "pypto_sched.cli", *argv], capture_output=True, text=True
    )
    assert (result.returncode, result.stderr) == (EXIT_OK, "")
    assert json.loads(result.stdout)["prompt_lengths"] == [5, 5]


def test_the_library_imports_neither_rich_nor_matplotlib() -> None:
    import subprocess

    code = (
        "import sys, pypto_sched, pypto_sched.cli, pypto_sched.runtime._plot; "
        "print(sorted(m for m in ('rich', 'matplotlib') if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"


# -- errors and help -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["plan", "--lengths", "12,abc", "--max-num-batched-tokens", "8"], "'abc'"),
        (["plan", "--lengths", "12x0", "--max-num-batched-tokens", "8"], "got '12x0'"),
        (
            ["plan", "--lengths", "0", "--max-num-batched-tokens", "8"],
            "--lengths: values must be >= 1: item 0 is 0",
        ),
        (
            ["plan", "--lengths", "12", "--max-num-batched-tokens", "0"],
            "--max-num-batched-tokens: must be >= 1: 0",
        ),
        (
            ["compare", "--lengths", "12", "--max-num-batched-tokens", "0"],
            "--max-num-batched-tokens: must be >= 1: 0",
        ),
        (
            ["compare", "--lengths", "0", "--max-num-batched-tokens", "8"],
            "--lengths: values must be >= 1: item 0 is 0",
        ),
        (
            [
                "plan",
                "--workload",
                "uniform",
                "--num-requests",
                "0",
                "--max-num-batched-tokens",
                "8",
            ],
            "--num-requests: must be >= 1: 0",
        ),
        (
            [
                "plan",
                "--workload",
                "uniform",
                "--num-requests",
                "10000001",
                "--max-num-batched-tokens",
                "8",
            ],
            "--num-requests: must be <= 10000000: 10000001",
        ),
        (
            ["plan", "--workload", "uniform", "--max-length", "5", "--max-num-batched-tokens", "8"],
            "--max-length: must be >= the default --min-length 16 (or give --min-length): 5",
        ),
        (
            [
                "plan",
                "--workload",
                "uniform",
                "--min-length",
                "100",
                "--max-length",
                "50",
                "--max-num-batched-tokens",
                "8",
            ],
            "--min-length: must be <= --max-length 50: 100",
        ),
        (
            ["plan", "--workload", "uniform", "--seed", "-1", "--max-num-batched-tokens", "8"],
            "--seed: must be >= 0: -1",
        ),
        (
            ["plan", "--workload", "seed", "--min-length", "50", "--max-num-batched-tokens", "8"],
            "--min-length does not apply to --workload seed (every prompt 3,338 tokens)",
        ),
        (
            ["plan", "--workload", "seed", "--max-length", "5", "--max-num-batched-tokens", "8"],
            "--max-length does not apply to --workload seed",
        ),
        (
            ["plan", "--workload", "seed", "--seed", "3", "--max-num-batched-tokens", "8"],
            "--seed does not apply to --workload seed",
        ),
        (
            ["plan", "--lengths", "5", "--seed", "3", "--max-num-batched-tokens", "8"],
            "--seed applies only with --workload, not with a lengths list",
        ),
        (
            ["compare", "--lengths", "5", "--seed", "3", "--max-num-batched-tokens", "8"],
            "--seed applies only with --workload, not with a lengths list",
        ),
        (
            ["plan", "--lengths", "@", "--max-num-batched-tokens", "8"],
            "--lengths: no file name after '@'",
        ),
        (
            ["plan", "--lengths-file", "", "--max-num-batched-tokens", "8"],
            "--lengths-file: an empty file name",
        ),
        (["plan", "--lengths", "12", "--max-num-batched-tokens", "x"], "invalid int value"),
        (["plan", "--lengths", "12"], "--max-num-batched-tokens"),
        (
            ["plan", "--max-num-batched-tokens", "8"],
            "one of the arguments --lengths --lengths-file --workload",
        ),
        (
            ["plan", "--lengths", "12", "--workload", "seed", "--max-num-batched-tokens", "8"],
            "not allowed with argument",
        ),
        (
            ["plan", "--lengths", "12", "--num-requests", "3", "--max-num-batched-tokens", "8"],
            "--num-requests applies only with --workload",
        ),
        (
            [
                "plan",
                "--workload",
                "uniform",
                "--min-length",
                "9",
                "--max-length",
                "3",
                "--max-num-batched-tokens",
                "8",
            ],
            "--min-length: must be <= --max-length 3: 9",
        ),
        (
            ["plan", "--lengths", "12", "--max-num-batched-tokens", "8", "--chunk-alignment", "9"],
            "--chunk-alignment: must be <= the largest chunk",
        ),
        (
            ["plan", "--lengths", "12", "--max-num-batched-tokens", "8", "--num-computed", "12"],
            "--num-computed: must be < the prompt length",
        ),
        (["plan", "--lengths", "@/no/such/file", "--max-num-batched-tokens", "8"], "cannot read"),
        (
            ["plan", "--lengths", "12", "--max-num-batched-tokens", "8", "--policy", "fifo"],
            "invalid choice",
        ),
        ([], "COMMAND"),
        (["frobnicate"], "invalid choice"),
    ],
)
def test_bad_input_exits_2_with_one_line(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    status, out, err = run(capsys, *argv)
    assert status == EXIT_USAGE
    assert out == ""
    assert err.count("\n") == 1
    assert err.startswith("pypto-sched: error:")
    assert message in err


def test_a_flag_given_twice_keeps_its_last_value_as_argparse_does(
    capsys: pytest.CaptureFixture[str],
) -> None:
    once = run_json(capsys, "plan", "--lengths", "6", "--max-num-batched-tokens", "4")
    twice = run_json(
        capsys, "plan", "--lengths", "5", "--max-num-batched-tokens", "8", "--lengths", "6",
        "--max-num-batched-tokens", "4",
    )  # fmt: skip
    assert twice == once


@pytest.mark.parametrize("command", ["plan", "compare", "plot", "run", "backends"])
def test_help_teaches_each_command_with_an_example(
    capsys: pytest.CaptureFixture[str], command: str
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "examples:" in out
    assert f"pypto-sched {command}" in out
    if command != "backends":
        assert "3338" in out


@pytest.mark.parametrize("command", [[], ["plan"], ["compare"], ["plot"], ["run"], ["backends"]])
def test_help_fits_80_columns(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, command: list[str]
) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    with pytest.raises(SystemExit):
        main([*command, "--help"])
    out = capsys.readouterr().out
    # The usage block is argparse's own layout, which cannot break a group of options.
    body = out[out.index("\n\n") :]
    assert [line for line in body.splitlines() if len(line) > 80] == []


@needs_matplotlib
def test_help_examples_run(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Every example in a --help text that needs no backend is a working command."""
    import shlex

    for module in (plan, compare, plot):
        command = module.__name__.rsplit(".", 1)[1]
        for _, example in module.EXAMPLES:
            argv = shlex.split(example.replace("\\\n", " "))
            if command == "plot":
                argv[argv.index("-o") + 1] = str(tmp_path / argv[argv.index("-o") + 1])
            status, _, err = run(capsys, *argv)
            assert (status, err) == (EXIT_OK, ""), example


def test_lengths_file_option_reads_the_same_syntax(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "lengths.txt"
    path.write_text("3338x2\n# comment\n5\n")
    status, out, _ = run(
        capsys,
        "plan",
        "--lengths-file",
        str(path),
        "--max-num-batched-tokens",
        "8",
        "--format",
        "json",
    )
    assert status == 0
    assert json.loads(out)["prompt_lengths"] == [3338, 3338, 5]


@pytest.mark.parametrize(
    "argv",
    [
        ["compare", "--workload", "seed", "--max-num-batched-tokens", "8192",
         "--vary", "threshold=256,1024,off"],
        ["plan", "--workload", "seed", "--max-num-batched-tokens", "8192"],
        ["backends"],
    ],
)  # fmt: skip
def test_a_narrow_console_never_cuts_a_table(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, argv: list[str]
) -> None:
    """Rich fits a table to the console's width by cutting cells to "…"; the figures must
    stay whole however narrow the terminal (the lines are longer than it instead)."""
    monkeypatch.setenv("COLUMNS", "40")
    status, out, err = run(capsys, *argv)
    assert (status, err) == (EXIT_OK, "")
    assert "…" not in out
    if argv[0] == "compare":
        assert "worst finish" in out
        assert "3,338" in out


def test_compare_honours_a_policy_given_without_config_or_vary(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Without --config and --vary both policies are compared, unless --policy names one
    (it was ignored, and its --max-num-partial-prefills refused for the other policy)."""
    seed = ["--workload", "seed", "--max-num-batched-tokens", "8192"]
    both = run_json(capsys, "compare", *seed)
    assert [c["config"]["policy"] for c in both["configurations"]] == ["round_robin", "packed"]
    for extra in ([], ["--max-num-partial-prefills", "2"]):
        one = run_json(capsys, "compare", *seed, "--policy", "packed", *extra)
        assert [c["config"]["policy"] for c in one["configurations"]] == ["packed"]
    status, out, err = run(capsys, "compare", *seed, "--max-num-partial-prefills", "2")
    assert (status, out) == (EXIT_USAGE, "")
    assert err.rstrip().endswith("(in the row policy=round_robin)")


def test_python_dash_m_pypto_sched_is_the_command() -> None:
    import subprocess

    for module in ("pypto_sched", "pypto_sched.cli"):
        out = subprocess.run(
            [sys.executable, "-m", module, "plan", "--lengths", "5", "--max-num-batched-tokens",
             "4", "--format", "json"],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        assert json.loads(out.stdout)["config"]["max_num_batched_tokens"] == 4


@pytest.mark.parametrize(
    ("stream", "argv", "message"),
    [
        ("stdout", ["plan", "--lengths", "5"], "error: stdout is closed: nowhere to write"),
        (
            "stdout",
            ["plan", "--lengths", "5", "--format", "json"],
            "error: stdout is closed: nowhere to write",
        ),
        ("stdin", ["plan", "--lengths", "@-"], "error: --lengths: cannot read stdin: it is closed"),
    ],
)
def test_a_closed_standard_stream_is_one_line_not_a_traceback(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    stream: str,
    argv: list[str],
    message: str,
) -> None:
    """Python sets sys.stdin or sys.stdout to None when it starts with that descriptor closed
    (``pypto-sched plan ... >&-``)."""
    monkeypatch.setattr(sys, stream, None)
    status, out, err = run(capsys, *argv, "--max-num-batched-tokens", "8")
    assert (status, out) == (EXIT_USAGE, "")
    assert err == f"pypto-sched: {message}\n"


def test_the_command_takes_sigterm_only_while_it_runs(capsys: pytest.CaptureFixture[str]) -> None:
    before = signal.getsignal(signal.SIGTERM)
    seen: list[object] = []

    def plan_and_look(args: Any) -> int:
        seen.append(signal.getsignal(signal.SIGTERM))
        return 0

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("pypto_sched.cli.plan.handle", plan_and_look)
        assert main(["plan", "--lengths", "8", "--max-num-batched-tokens", "8"]) == 0
    assert len(seen) == 1
    assert seen[0] is not before  # raising Terminated while the command ran
    assert signal.getsignal(signal.SIGTERM) is before  # and given back after


# -- --page-size, the retired name of --chunk-alignment -----------------------------------------

RETIRED_FLAG = "pypto-sched: warning: --page-size is deprecated: use --chunk-alignment\n"


@pytest.mark.parametrize("command", ["plan", "compare"])
def test_page_size_still_aligns_chunks_with_one_line_on_stderr(
    capsys: pytest.CaptureFixture[str], command: str
) -> None:
    base = [command, "--lengths", "13,22,2", "--max-num-batched-tokens", "8", "--format", "json"]
    status, expected, err = run(capsys, *base, "--chunk-alignment", "4")
    assert (status, err) == (EXIT_OK, "")
    status, out, err = run(capsys, *base, "--page-size", "4")
    assert status == EXIT_OK
    assert out == expected  # stdout untouched: the output of --chunk-alignment 4
    assert err == RETIRED_FLAG


def test_page_size_and_chunk_alignment_together_are_a_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status, out, err = run(
        capsys,
        *["plan", "--lengths", "12", "--max-num-batched-tokens", "8"],
        *["--page-size", "4", "--chunk-alignment", "4"],
    )
    assert (status, out) == (EXIT_USAGE, "")
    assert err == RETIRED_FLAG + (
        "pypto-sched: error: --page-size is the retired name of --chunk-alignment: give one "
        "(--page-size 4, --chunk-alignment 4)\n"
    )


def test_page_size_is_left_out_of_the_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["plan", "--help"])
    out = capsys.readouterr().out
    assert "--chunk-alignment" in out
    assert "--page-size" not in out


@pytest.mark.parametrize(("old", "new"), [("page", "align"), ("page-size", "chunk-alignment")])
def test_compares_retired_setting_names_still_work_with_one_line_on_stderr(
    capsys: pytest.CaptureFixture[str], old: str, new: str
) -> None:
    base = ["compare", *SEED_256, "--format", "json"]
    status, expected, err = run(capsys, *base, "--config", f"{new}=128", "--config", f"{new}=64")
    assert (status, err) == (EXIT_OK, "")
    status, out, err = run(capsys, *base, "--config", f"{old}=128", "--config", f"{old}=64")
    assert status == EXIT_OK
    assert out == expected
    # One line, for the two settings that use it, naming the setting as written.
    assert err == f"pypto-sched: warning: the setting {old!r} is deprecated: use {new!r}\n"
    assert [r["config"]["chunk_alignment"] for r in json.loads(out)["configurations"]] == [128, 64]
