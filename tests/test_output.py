"""``pypto_sched.output``: the side file a run writes as requests finish, read back on
resume, and the final file replaced atomically or not at all."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from pypto_sched import InvalidInputError
from pypto_sched.output import OutputFile, ResumeError, fingerprint, write_atomically


def line(index: int) -> str:
    return json.dumps({"index": index, "token_ids": [index]})


def test_lines_come_back_in_input_order_and_the_side_file_goes(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    with OutputFile(path, num_requests=3, fingerprint="f", resume=False) as out:
        for index in (2, 0, 1):
            out.add(index, line(index))
        assert out.partial_path.exists()
        out.complete()
    assert path.read_text() == "".join(f"{line(r)}\n" for r in range(3))
    assert not out.partial_path.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.jsonl"]  # no temporary file


def test_a_line_is_on_disk_as_soon_as_it_is_added(tmp_path: Path) -> None:
    out = OutputFile(tmp_path / "out.jsonl", num_requests=2, fingerprint="f", resume=False)
    out.add(1, line(1))
    assert out.partial_path.read_text().splitlines()[1] == line(1)
    out.close()


def test_completing_before_every_request_finished_is_refused(tmp_path: Path) -> None:
    with OutputFile(tmp_path / "o", num_requests=2, fingerprint="f", resume=False) as out:
        out.add(0, line(0))
        with pytest.raises(InvalidInputError, match="1 requests have not finished, the first 1"):
            out.complete()


def test_resume_reads_back_the_lines_and_drops_a_cut_last_one(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    out = OutputFile(path, num_requests=3, fingerprint="f", resume=False)
    out.add(1, line(1))
    out.close()
    with out.partial_path.open("ab") as stream:
        stream.write(line(0).encode()[:7])  # killed mid-line
    again = OutputFile(path, num_requests=3, fingerprint="f", resume=True)
    assert again.finished == {1: line(1)}
    assert again.missing == [0, 2]
    again.add(0, line(0))
    again.add(2, line(2))
    again.complete()
    assert path.read_text() == "".join(f"{line(r)}\n" for r in range(3))


def test_resume_refuses_another_runs_side_file_and_leaves_it(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    OutputFile(path, num_requests=3, fingerprint=fingerprint([1, 2]), resume=False).close()
    partial = path.with_name("out.jsonl.partial")
    before = partial.read_bytes()
    with pytest.raises(ResumeError, match="belongs to another run"):
        OutputFile(path, num_requests=3, fingerprint=fingerprint([1, 3]), resume=True)
    partial.write_text("not ours\n")
    with pytest.raises(ResumeError, match="is not a partial output"):
        OutputFile(path, num_requests=3, fingerprint="f", resume=True)
    partial.write_bytes(before)
    assert partial.read_bytes() == before


def test_without_resume_an_existing_side_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    out = OutputFile(path, num_requests=2, fingerprint="f", resume=False)
    out.add(0, line(0))
    out.close()
    with pytest.raises(InvalidInputError, match="holds 1 finished requests"):
        OutputFile(path, num_requests=2, fingerprint="f", resume=False)


def test_fingerprints_differ_with_what_they_summarise() -> None:
    assert fingerprint({"a": [1, 2]}) == fingerprint({"a": [1, 2]})
    assert fingerprint({"a": [1, 2]}) != fingerprint({"a": [2, 1]})


def test_an_atomic_write_keeps_the_files_permissions(tmp_path: Path) -> None:
    path = tmp_path / "out"
    path.write_text("old")
    path.chmod(0o640)
    write_atomically(path, b"new")
    assert path.read_bytes() == b"new"
    assert path.stat().st_mode & 0o777 == 0o640


WRITE = (
    "import sys; from pypto_sched.output import write_atomically; "
    "write_atomically(sys.argv[1], b'x' * int(sys.argv[2]))"
)


def test_an_atomic_write_that_fails_leaves_the_old_file_whole(tmp_path: Path) -> None:
    """A real write failure: past ``RLIMIT_FSIZE`` the kernel refuses the write (EFBIG)."""
    path = tmp_path / "out"
    path.write_text("the old results\n")

    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))

    failed = subprocess.run(
        [sys.executable, "-c", WRITE, str(path), "100000"],
        capture_output=True, text=True, preexec_fn=limited, check=False,
    )  # fmt: skip
    assert failed.returncode != 0
    assert "File too large" in failed.stderr
    assert path.read_text() == "the old results\n"
    assert os.listdir(tmp_path) == ["out"]  # the temporary file is gone
