"""The command line keeps its promise on hostile input: every failure that is not a bug of
ours exits 2 with exactly one line on stderr, never a traceback.

One test per kind of input; the ``--lengths`` grammar is fuzzed against an oracle written
independently of the parser (one regular expression over the whole text).
"""

from __future__ import annotations

import errno
import importlib.util
import io
import os
import re
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pypto_sched.cli import EXIT_OK, EXIT_USAGE, _inputs, _lengths, _specs, main, parse_lengths
from pypto_sched.cli._errors import UsageError

PLAN = ["plan", "--max-num-batched-tokens", "64", "--format", "json"]

needs_matplotlib = pytest.mark.skipif(
    importlib.util.find_spec("matplotlib") is None,
    reason="plotting needs matplotlib (pip install 'pypto-sched[plot]')",
)


def fails_with_one_line(capsys: pytest.CaptureFixture[str], argv: list[str], message: str) -> None:
    """``argv`` exits 2, prints nothing on stdout and one line naming ``message``."""
    status = main(argv)
    out, err = capsys.readouterr()
    assert (status, out) == (EXIT_USAGE, "")
    assert err.startswith("pypto-sched: error: ")
    assert err.count("\n") == 1, err
    assert message in err


# -- the --lengths grammar, fuzzed -------------------------------------------------------------

# The oracle: the grammar of ``pypto-sched --help`` as one regular expression, applied to the
# whole text once comments are gone.
_N = r"(?:0|[1-9][0-9]*)"
_ITEM = rf"{_N}(?:x[1-9][0-9]*)?"
_SEP = r"(?:[ \t\r\n]*,[ \t\r\n]*|[ \t\r\n]+)"
ORACLE = re.compile(rf"[ \t\r\n]*{_ITEM}(?:{_SEP}{_ITEM})*[ \t\r\n]*")
ORACLE_ITEMS = re.compile(r"([0-9]+)(?:x([0-9]+))?")


def oracle(text: str) -> list[int] | None:
    """The lengths ``text`` spells, or ``None`` when the parser must refuse it."""
    body = "\n".join(line.split("#", 1)[0] for line in text.split("\n"))
    if ORACLE.fullmatch(body) is None:
        return None
    lengths: list[int] = []
    for length, count in ORACLE_ITEMS.findall(body):
        if len(length) > 10 or int(length) > 2**31 - 1:
            return None
        repeat = int(count) if count else 1
        if len(count) > 8 or repeat > 10_000_000 or len(lengths) + repeat > 10_000_000:
            return None
        lengths.extend([int(length)] * repeat)
    return lengths


_ALPHABET = [*"0123456789", "x", "X", ",", " ", "\t", "\n", "\r", "#", "+", "-", "_", "."]
# Non-ASCII digits and blanks, a vertical tab, NUL, an exponent and a multiplication sign.
_ALPHABET += ["\u0663", "\uff11", "\u00a0", "\x0b", "\x00", "e", "\u00d7"]


@st.composite
def near_valid(draw: st.DrawFn) -> str:
    """A valid list, sometimes with one character changed, inserted or removed."""
    numbers = st.integers(min_value=0, max_value=3000) | st.sampled_from([2**31 - 1, 2**31])
    items = draw(
        st.lists(
            st.tuples(numbers, st.none() | st.integers(min_value=1, max_value=12)),
            min_size=1,
            max_size=6,
        )
    )
    separators = st.sampled_from([",", ", ", " ", "\n", " ,\t", "\n# note\n"])
    text = draw(st.sampled_from(["", " ", "\n"]))
    for i, (length, count) in enumerate(items):
        if i:
            text += draw(separators)
        text += str(length) if count is None else f"{length}x{count}"
    if draw(st.booleans()):
        at = draw(st.integers(min_value=0, max_value=len(text)))
        change = draw(st.sampled_from(["insert", "replace", "delete"]))
        char = draw(st.sampled_from(_ALPHABET))
        text = text[:at] + (char if change != "delete" else "") + text[at + (change != "insert") :]
    return text


@settings(max_examples=400, deadline=None)
@given(st.text(alphabet=st.sampled_from(_ALPHABET), max_size=24) | near_valid())
def test_lengths_are_accepted_exactly_when_they_match_the_grammar(text: str) -> None:
    expected = oracle(text)
    if expected is None:
        with pytest.raises(UsageError, match=r"^--lengths: [^\n]*$"):
            parse_lengths(text)
    else:
        assert parse_lengths(text).tolist() == expected


@settings(max_examples=40, deadline=None)
@given(st.text(alphabet=st.sampled_from(_ALPHABET), max_size=16) | near_valid())
def test_any_lengths_text_through_the_command_line_is_a_plan_or_one_line(text: str) -> None:
    stdout, stderr = io.StringIO(), io.StringIO()
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = stdout, stderr
    try:
        status = main([*PLAN, f"--lengths={text}"])
    finally:
        sys.stdout, sys.stderr = saved
    assert status in (EXIT_OK, EXIT_USAGE)
    if status == EXIT_OK:
        assert oracle(text) is not None
        assert stderr.getvalue() == ""
    else:
        assert stdout.getvalue() == ""
        assert stderr.getvalue().count("\n") == 1


@pytest.mark.parametrize(
    "text",
    [
        "1,,2",
        "1,2,",
        ",1",
        "+3",
        "-3",
        "1_000",
        "012",
        "3X2",
        "3x0",
        "3x",
        "x3",
        "3x2x2",
        "1.5",
        "\u0663",
        "\uff11",
        "1\u00a02",
        "1\x0b2",
        "3 x2",
        "3x 2",
        "\u00d73",
    ],
)
def test_malformed_lengths_are_refused(text: str) -> None:
    assert oracle(text) is None
    with pytest.raises(UsageError, match="expected N or NxCOUNT"):
        parse_lengths(text)


def test_the_grammar_is_stated_in_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["plan", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert " ".join(_lengths.GRAMMAR.split()) in help_text


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("2147483648", "N must be <= 2147483647"),
        ("9" * 5000, "N must be <= 2147483647"),
        ("1x10000001", "COUNT must be <= 10000000"),
        ("1x" + "9" * 5000, "COUNT must be <= 10000000"),
        ("1x6000000,1x6000000", "more than 10000000 prompts in all"),
        ("# only a comment\n", "no lengths given"),
    ],
)
def test_lengths_beyond_the_bounds_are_refused(text: str, message: str) -> None:
    with pytest.raises(UsageError, match=re.escape(message)):
        parse_lengths(text)


# -- files: undecodable, endless, huge -------------------------------------------------------


@pytest.mark.parametrize("option", ["--lengths=@{}", "--lengths-file={}", "--num-computed=@{}"])
def test_a_lengths_file_that_is_not_utf8_is_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, option: str
) -> None:
    path = tmp_path / "lengths.txt"
    path.write_bytes(b"100,\n50,\n\n\xff\xfe200\n")
    argv = [*PLAN, option.format(path)]
    if option.startswith("--num-computed"):
        argv.append("--lengths=100x2")
    fails_with_one_line(capsys, argv, "is not UTF-8 text: invalid start byte on line 4 (byte 10)")


def test_dev_zero_as_lengths_file_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    if not Path("/dev/zero").exists():
        pytest.skip("no /dev/zero on this system")
    fails_with_one_line(
        capsys, [*PLAN, "--lengths-file", "/dev/zero"], "is larger than the limit of"
    )


def test_a_huge_lengths_file_is_refused_without_reading_it_all(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "huge.txt"
    with path.open("wb") as stream:  # sparse: 4 GiB on paper, nothing on disk
        stream.truncate(4 * 1024**3)
    fails_with_one_line(capsys, [*PLAN, f"--lengths=@{path}"], "larger than the limit of")


@pytest.fixture
def endless_fifo(tmp_path: Path) -> Iterator[Path]:
    """A FIFO a writer keeps filling with valid items until the reader goes away."""
    if not hasattr(os, "mkfifo"):
        pytest.skip("no FIFOs on this system")
    path = tmp_path / "endless"
    os.mkfifo(path)
    stop = threading.Event()

    def write() -> None:
        try:
            with path.open("wb") as stream:
                while not stop.is_set():
                    stream.write(b"1," * 4096)
        except BrokenPipeError:
            pass  # the reader had enough

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    yield path
    stop.set()
    writer.join(timeout=10)


def test_an_endless_fifo_is_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, endless_fifo: Path
) -> None:
    monkeypatch.setattr(_lengths, "MAX_FILE_BYTES", 100_000)  # the same rule, sooner
    fails_with_one_line(
        capsys, [*PLAN, "--lengths-file", str(endless_fifo)], "larger than the limit of 100,000"
    )


def test_a_directory_as_lengths_file_is_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    fails_with_one_line(capsys, [*PLAN, f"--lengths=@{tmp_path}"], "cannot read")


def test_undecodable_stdin_is_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"12,\x80\n")))
    fails_with_one_line(capsys, [*PLAN, "--lengths=@-"], "stdin is not UTF-8 text")


def test_stdin_lengths_are_read(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"12,5x2 # comment\n")))
    assert main([*PLAN, "--lengths=@-"]) == EXIT_OK
    assert '"prompt_lengths": [12, 5, 5]' in capsys.readouterr().out


# -- workloads too large for the machine ----------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--lengths", "2000000000x2000000000"], "COUNT must be <= 10000000"),
        (
            ["--lengths", "2147483647x10000000"],
            "need at least 335,544,320,000,000 chunks of at most 64 tokens; the command line "
            "plans at most 10,000,000",
        ),
        (["--workload", "uniform", "--num-requests", "1000000000000"], "--num-requests"),
    ],
)
def test_a_huge_workload_is_refused_before_planning(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    fails_with_one_line(capsys, [*PLAN, *argv], message)


def test_compare_refuses_a_huge_workload_per_configuration(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["compare", "--lengths", "100000x200", "--max-num-batched-tokens", "64"]
    fails_with_one_line(capsys, [*argv, "--vary", "threshold=0,1"], "at most 1 tokens")


def test_memory_exhaustion_is_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def exhausted(*args: object, **kwargs: object) -> None:
        raise MemoryError

    monkeypatch.setattr(_inputs, "plan_prefill", exhausted)
    fails_with_one_line(capsys, [*PLAN, "--lengths", "100"], "out of memory")


def test_an_interrupt_is_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def interrupted(*args: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(_inputs, "plan_prefill", interrupted)
    fails_with_one_line(capsys, [*PLAN, "--lengths", "100"], "interrupted")


# -- output ----------------------------------------------------------------------------------


class _FullDisk(io.StringIO):
    def write(self, text: str) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_a_full_disk_on_stdout_is_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "stdout", _FullDisk())
    status = main([*PLAN, "--lengths", "100"])
    err = capsys.readouterr().err
    assert status == EXIT_USAGE
    assert err == "pypto-sched: error: cannot write the output: No space left on device\n"


@needs_matplotlib
@pytest.mark.parametrize("name", ["is-a-directory.png", "no/such/dir/seed.png"])
def test_an_unwritable_plot_file_is_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, name: str
) -> None:
    (tmp_path / "is-a-directory.png").mkdir()
    argv = ["plot", "--lengths", "100x3", "--max-num-batched-tokens", "64"]
    fails_with_one_line(capsys, [*argv, "-o", str(tmp_path / name)], "--output: cannot write")


@needs_matplotlib
@pytest.mark.parametrize("title", [r"$\frac", "$x^2$ costs $5", "\x00\U0001f600 \\"])
def test_any_plot_title_is_drawn_as_written(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, title: str
) -> None:
    path = tmp_path / "titled.svg"
    argv = ["plot", "--lengths", "100x3", "--max-num-batched-tokens", "64", "-o", str(path)]
    assert main([*argv, "--title", title, "--format", "json"]) == EXIT_OK
    assert capsys.readouterr().err == ""
    assert path.stat().st_size > 0


@needs_matplotlib
@pytest.mark.parametrize("dpi", ["10", "1000"])
def test_the_smallest_plot_at_any_dpi_draws_without_a_word_on_stderr(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, dpi: str
) -> None:
    argv = ["plot", "--lengths", "100x3", "--max-num-batched-tokens", "64"]
    size = ["--width", "100", "--height", "100", "--dpi", dpi]
    assert main([*argv, *size, "-o", str(tmp_path / "tiny.png")]) == EXIT_OK
    assert capsys.readouterr().err == ""


def test_a_plot_title_too_long_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["plot", "--lengths", "100", "--max-num-batched-tokens", "64", "-o", "x.png"]
    fails_with_one_line(capsys, [*argv, "--title", "t" * 301], "--title: at most 300")


# -- backend options go through the strict JSON reader -----------------------------------------


@pytest.mark.parametrize(
    ("item", "value"),
    [
        ("seed=3", 3),
        ("dtype=float32", "float32"),
        ("flag=true", True),
        ("device=null", None),
        ('name="quoted"', "quoted"),
        ("sizes=[1, 2]", [1, 2]),
        ("eps=NaN", "NaN"),
        ("big=" + "9" * 5000, "9" * 5000),
        ("deep=" + "[" * 100_000, "[" * 100_000),
        ('twice={"a": 1, "a": 2}', '{"a": 1, "a": 2}'),
    ],
)
def test_backend_option_values_are_strict_json_or_strings(item: str, value: object) -> None:
    key = item.partition("=")[0]
    assert _specs.backend_options([item]) == {key: value}
