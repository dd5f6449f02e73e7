"""``pypto-sched generate --output FILE``: a job that survives.

Each finished request's line reaches ``FILE.partial`` as it finishes; ``FILE`` appears, whole
and in input order, only when the run completes; ``--resume`` continues from the side file
and gives the bytes an uninterrupted run gives, sampled runs included. Checked with real
processes killed by real signals and a real write failure (``RLIMIT_FSIZE``: the kernel
refuses the write past the limit with ``EFBIG``, as a full disk refuses it with ``ENOSPC``).
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pypto_sched.cli import EXIT_FAILED, EXIT_OK, EXIT_TERMINATED, EXIT_USAGE, main
from pypto_sched.output import OutputFile
from pypto_sched_reference import TINY_MODEL, ReferenceBackend

VOCAB = TINY_MODEL.vocab_size
# Prompts of different lengths and new tokens, over a pool that makes them take turns: they
# finish one after another over some 60 dispatches.
PROMPTS = [
    {
        "token_ids": [int(t) for t in np.random.default_rng(r).integers(0, VOCAB, size=n)],
        "max_new_tokens": 3 + r % 5,
    }
    for r, n in enumerate([20, 3, 41, 1, 17, 9, 30, 5, 12, 2, 25, 7])
]
SETTINGS = ["--max-new-tokens", "8", "--max-num-batched-tokens", "16"]
POOL = ["--kv-page-size", "4", "--num-kv-pages", "14"]
SAMPLED = ["--temperature", "0.8", "--top-p", "0.95", "--sampling-seed", "3"]
# Runs the command in a child process, each dispatch slowed down so that a test can stop it
# part-way; DELAY_AFTER fails the backend at that dispatch instead.
CHILD = """
import os, sys, time
from pypto_sched_reference import ReferenceBackend
run_dispatch = ReferenceBackend.run_dispatch
calls = [0]
def slow(self, batch, cache):
    calls[0] += 1
    if calls[0] == int(os.environ.get("FAIL_AT", "0")):
        raise RuntimeError("the device went away")
    time.sleep(float(os.environ.get("DELAY", "0")))
    return run_dispatch(self, batch, cache)
ReferenceBackend.run_dispatch = slow
from pypto_sched.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.fixture
def prompts(tmp_path: Path) -> str:
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    return str(path)


def command(prompts: str, output: Path, *extra: str) -> list[str]:
    return ["generate", "--backend", "reference", "--prompts", prompts, "--output",
            str(output), *SETTINGS, *extra]  # fmt: skip


def uninterrupted(capsys: pytest.CaptureFixture[str], argv: Sequence[str]) -> bytes:
    """The bytes of the run ``argv`` made whole, in this process."""
    output = Path(argv[argv.index("--output") + 1])
    assert main(list(argv)) == EXIT_OK, capsys.readouterr().err
    capsys.readouterr()
    data = output.read_bytes()
    output.unlink()
    return data


def child(argv: Sequence[str], **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **env},
    )


def finished_lines(partial: Path) -> int:
    """Complete result lines in the side file (its header aside)."""
    if not partial.exists():
        return 0
    return max(partial.read_bytes().count(b"\n") - 1, 0)


def stop_part_way(argv: Sequence[str], output: Path, sig: signal.Signals) -> str:
    """Run ``argv`` in a child and send it ``sig`` once three requests have finished; its
    stderr."""
    partial = output.with_name(output.name + ".partial")
    process = child(argv, DELAY="0.05")
    deadline = time.monotonic() + 120
    while finished_lines(partial) < 3:
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.01)
    process.send_signal(sig)
    out, err = process.communicate(timeout=60)
    # SIGKILL cannot be caught; SIGTERM ends the run as Ctrl-C does, with 128 + 15.
    assert process.returncode == (-sig if sig == signal.SIGKILL else EXIT_TERMINATED), err
    assert out == ""  # stdout carries data only, and the data goes to the file
    return err


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
@pytest.mark.parametrize("sampling", [[], SAMPLED], ids=["greedy", "sampled"])
def test_a_killed_run_resumes_to_the_bytes_of_an_uninterrupted_one(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    prompts: str,
    sig: signal.Signals,
    sampling: list[str],
) -> None:
    output = tmp_path / "out.jsonl"
    expected = uninterrupted(capsys, command(prompts, output, *sampling))
    output.write_text("an earlier run's results\n")
    err = stop_part_way(command(prompts, output, *POOL, *sampling), output, sig)
    partial = output.with_name("out.jsonl.partial")
    kept = finished_lines(partial)
    assert 3 <= kept < len(PROMPTS)
    if sig == signal.SIGTERM:  # one line: what was kept, where, and how to finish
        assert err.count("\n") == 1, err
        assert err.startswith(
            f"pypto-sched: error: terminated by SIGTERM; {kept} of {len(PROMPTS)} requests "
            f"finished, kept in {str(partial)!r} (rerun with --resume to finish); not finished"
        ), err
    assert output.read_text() == "an earlier run's results\n"  # untouched until the end
    # Another budget and pool on the way back: they change when tokens come, not which.
    resumed = command(prompts, output, "--policy", "round_robin", *sampling, "--resume")
    status = main(resumed)
    _, err = capsys.readouterr()
    assert status == EXIT_OK, err
    assert f"{kept} of {len(PROMPTS)} requests read back" in err
    assert output.read_bytes() == expected
    assert not partial.exists()


def test_a_run_past_the_file_size_limit_keeps_its_lines_and_the_old_output(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, prompts: str
) -> None:
    output = tmp_path / "out.jsonl"
    argv = command(prompts, output, *POOL, *SAMPLED)
    expected = uninterrupted(capsys, argv)
    output.write_text("an earlier run's results\n")
    limit = 600  # the header and a few lines

    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    process = subprocess.run(
        [sys.executable, "-c", CHILD, *argv],
        capture_output=True,
        text=True,
        preexec_fn=limited,
        check=False,
    )
    assert process.returncode == EXIT_USAGE, process.stderr
    assert process.stdout == ""
    (line,) = process.stderr.splitlines()
    assert "--output: cannot write" in line
    assert "File too large" in line
    assert "kept in" in line
    assert "--resume" in line
    assert "not finished: requests" in line
    partial = output.with_name("out.jsonl.partial")
    assert 0 < partial.stat().st_size <= limit
    assert output.read_text() == "an earlier run's results\n"
    assert main([*argv, "--resume"]) == EXIT_OK, capsys.readouterr().err
    assert output.read_bytes() == expected


def test_a_backend_failure_keeps_the_finished_requests_and_names_the_others(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, prompts: str
) -> None:
    output = tmp_path / "out.jsonl"
    argv = command(prompts, output, *POOL)
    expected = uninterrupted(capsys, argv)
    process = subprocess.run(
        [sys.executable, "-c", CHILD, *argv],
        capture_output=True,
        text=True,
        env={**os.environ, "FAIL_AT": "30"},
        check=False,
    )
    assert process.returncode == EXIT_FAILED
    (line,) = process.stderr.splitlines()
    assert "the device went away" in line
    partial = output.with_name("out.jsonl.partial")
    kept = finished_lines(partial)
    assert 0 < kept < len(PROMPTS)
    assert f"{kept} of {len(PROMPTS)} requests finished, kept in" in line
    done = {json.loads(x)["index"] for x in partial.read_text().splitlines()[1:]}
    named = line.split("not finished: requests ")[1].split(", ")
    assert sorted(done | {int(r) for r in named if r != "..."}) == list(range(len(PROMPTS)))
    assert not output.exists()
    assert main([*argv, "--resume"]) == EXIT_OK
    assert output.read_bytes() == expected


def test_on_stdout_a_backend_failure_prints_the_finished_lines(
    capsys: pytest.CaptureFixture[str], prompts: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = ReferenceBackend.run_dispatch
    calls = []

    def failing(self: ReferenceBackend, batch: object, cache: object) -> object:
        calls.append(1)
        if len(calls) == 30:
            raise RuntimeError("the device went away")
        return original(self, batch, cache)  # type: ignore[arg-type]

    monkeypatch.setattr(ReferenceBackend, "run_dispatch", failing)
    argv = ["generate", "--backend", "reference", "--prompts", prompts, *SETTINGS, *POOL]
    status = main(argv)
    out, err = capsys.readouterr()
    assert status == EXIT_FAILED
    indices = [json.loads(line)["index"] for line in out.splitlines()]
    assert indices == sorted(indices)
    assert 0 < len(indices) < len(PROMPTS)
    assert f"{len(indices)} of {len(PROMPTS)} requests finished, written" in err
    missing = sorted(set(range(len(PROMPTS))) - set(indices))
    assert f"not finished: requests {', '.join(map(str, missing))}" in err


def test_resume_refuses_a_side_file_of_other_prompts_or_settings(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, prompts: str
) -> None:
    output = tmp_path / "out.jsonl"
    stop_part_way(command(prompts, output, *POOL), output, signal.SIGKILL)
    partial = output.with_name("out.jsonl.partial")
    before = partial.read_bytes()
    for other in (SAMPLED, ["--backend-option", "seed=1"]):
        status = main([*command(prompts, output, *POOL), *other, "--resume"])
        _, err = capsys.readouterr()
        assert status == EXIT_USAGE
        assert err.startswith("pypto-sched: error: --resume: ")
        assert "belongs to another run" in err
    assert partial.read_bytes() == before  # nothing mixed in


def test_a_side_file_without_resume_is_refused_not_overwritten(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, prompts: str
) -> None:
    output = tmp_path / "out.jsonl"
    partial = output.with_name("out.jsonl.partial")
    partial.write_text("hours of work\n")
    status = main(command(prompts, output))
    _, err = capsys.readouterr()
    assert status == EXIT_USAGE
    assert "add --resume to continue it" in err
    assert partial.read_text() == "hours of work\n"


def test_resume_needs_an_output_file(capsys: pytest.CaptureFixture[str], prompts: str) -> None:
    status = main(["generate", "--backend", "reference", "--prompts", prompts, *SETTINGS,
                   "--resume"])  # fmt: skip
    _, err = capsys.readouterr()
    assert status == EXIT_USAGE
    assert "--resume: " in err
    assert "--output FILE" in err


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, bytes, list[bytes]]:
    """A sampled run's prompts, its final bytes, and its side file's lines (header first),
    as a run interrupted just before completing leaves them."""
    folder = tmp_path_factory.mktemp("whole")
    path = folder / "prompts.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    output = folder / "out.jsonl"
    argv = command(str(path), output, *SAMPLED)
    assert main(argv) == EXIT_OK
    expected = output.read_bytes()
    output.unlink()
    with pytest.MonkeyPatch.context() as patch:

        def crash(self: object) -> None:
            raise KeyboardInterrupt

        patch.setattr(OutputFile, "complete", crash)
        assert main(argv) == EXIT_USAGE  # "interrupted", every line kept
    partial = output.with_name("out.jsonl.partial")
    lines = partial.read_bytes().splitlines(keepends=True)
    partial.unlink()
    return str(path), expected, lines


@settings(max_examples=20, deadline=None)
@given(data=st.data())
def test_resuming_from_any_lines_in_any_order_gives_the_same_bytes(
    finished_run: tuple[str, bytes, list[bytes]], data: st.DataObject
) -> None:
    """Whatever a crash left (any finished requests, in any order, a line cut anywhere),
    --resume completes the file an uninterrupted run writes."""
    prompts, expected, (header, *lines) = finished_run
    kept = data.draw(st.permutations(lines))[: data.draw(st.integers(0, len(lines)))]
    cut = data.draw(st.sampled_from(lines))
    torn = cut[: data.draw(st.integers(0, len(cut) - 1))]
    with tempfile.TemporaryDirectory() as folder:
        output = Path(folder) / "out.jsonl"
        output.with_name("out.jsonl.partial").write_bytes(header + b"".join(kept) + torn)
        assert main([*command(prompts, output, *SAMPLED, *POOL), "--resume"]) == EXIT_OK
        assert output.read_bytes() == expected


@contextlib.contextmanager
def small_disk(folder: Path, size: int) -> Iterator[Callable[[int], None]]:
    """A tmpfs of ``size`` bytes mounted on ``folder`` (root only), and a function that
    resizes it; skips the test where mounting is not allowed."""
    folder.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)],
                             capture_output=True, check=False)  # fmt: skip
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")

    def resize(new: int) -> None:
        subprocess.run(["mount", "-o", f"remount,size={new}", str(folder)], check=True)

    try:
        yield resize
    finally:
        subprocess.run(["umount", str(folder)], check=False)


PAGE = 4096


def pages(size: int) -> int:
    return -(-size // PAGE)


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small tmpfs needs root")
def test_a_full_disk_mid_run_and_at_the_end_loses_nothing(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A real ENOSPC: first while requests finish, then while the final file is written
    (the side file fits, the final file beside it does not); the earlier output survives
    both, and --resume once there is room gives the bytes of an uninterrupted run."""
    rng = np.random.default_rng(9)
    lines = [{"token_ids": rng.integers(0, VOCAB, size=int(n)).tolist(), "max_new_tokens": 40}
             for n in rng.integers(1, 30, size=40)]  # fmt: skip
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(line) + "\n" for line in lines))
    argv = ["generate", "--backend", "reference", "--prompts", str(prompts), *SAMPLED]
    expected = uninterrupted(capsys, [*argv, "--output", str(tmp_path / "whole.jsonl")])
    assert len(expected) > 2 * PAGE
    disk = tmp_path / "disk"
    old = b"an earlier run's results\n"
    output = disk / "out.jsonl"
    partial = disk / "out.jsonl.partial"
    with small_disk(disk, 2 * PAGE) as resize:
        output.write_bytes(old)
        status = main([*argv, "--output", str(output)])
        _, err = capsys.readouterr()
        assert status == EXIT_USAGE
        assert "No space left on device" in err
        assert "kept in" in err
        assert output.read_bytes() == old
        kept = finished_lines(partial)
        assert 0 < kept < len(lines)
        # Room for the side file and the old output, not for the final file beside them.
        resize((1 + pages(len(expected) + 200) + pages(len(expected)) - 1) * PAGE)
        status = main([*argv, "--output", str(output), "--resume"])
        _, err = capsys.readouterr()
        assert status == EXIT_USAGE
        assert f"all {len(lines)} requests finished, kept in" in err
        assert output.read_bytes() == old
        assert sorted(p.name for p in disk.iterdir()) == ["out.jsonl", "out.jsonl.partial"]
        resize(64 * PAGE)
        assert main([*argv, "--output", str(output), "--resume"]) == EXIT_OK
        assert output.read_bytes() == expected
        assert sorted(p.name for p in disk.iterdir()) == ["out.jsonl"]


def test_bad_input_found_by_the_run_leaves_no_side_file(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, prompts: str
) -> None:
    """A pool too small for a request is found when the run starts, after the side file is
    opened: with nothing finished there is nothing to resume, and a rerun needs no --resume."""
    output = tmp_path / "out.jsonl"
    status = main(command(prompts, output, "--kv-page-size", "4", "--num-kv-pages", "2"))
    _, err = capsys.readouterr()
    assert status == EXIT_USAGE
    assert "--num-kv-pages: must hold every request alone" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["prompts.jsonl"]
    assert main(command(prompts, output)) == EXIT_OK


def test_an_output_that_is_not_a_regular_file_gets_the_lines_at_the_end(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, prompts: str
) -> None:
    """/dev/null, a pipe: nothing to rename over, so no side file and no atomic write."""
    status = main(command(prompts, Path(os.devnull)))
    out, err = capsys.readouterr()
    assert (status, out) == (EXIT_OK, "")
    assert not Path(os.devnull + ".partial").exists()
    assert err.startswith(f"{len(PROMPTS)} requests, ")
