"""Output that survives the job: one line per request, written as each finishes, and the
final file written whole or not at all.

A long batch job must not lose hours of finished requests to a crash, a kill or a full disk,
and a failed run must never truncate an output file from an earlier run. So the results of a
run writing ``out.jsonl`` go, as each request finishes, to the side file ``out.jsonl.partial``
(one line each, flushed at once, in the order they finish) after a header line that holds
a *fingerprint* of everything the results depend on (the prompts, the sampling settings, the
model). When every request has finished, :meth:`OutputFile.complete` writes ``out.jsonl``
atomically (:func:`write_atomically`: a temporary file in the same directory, fsynced, then
renamed over the target) in input order, and removes the side file.

A run started again with ``resume=True`` reads the side file back: its header must carry the
same fingerprint (a file from other prompts or settings is refused, never mixed in), a last
line cut short by the crash is dropped, and the finished requests are skipped. Sampling is
seeded by ``(seed, request, token)`` alone, so the requests run again draw the tokens an
uninterrupted run would have, and the final file is byte for byte the same.

Lines flushed reach the operating system at once, so they survive the process being killed;
the final file is also fsynced, so it survives the machine failing once the run is done.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from ..core._errors import InvalidInputError

__all__ = [
    "PARTIAL_SUFFIX",
    "OutputFile",
    "ResumeError",
    "fingerprint",
    "unfinished_requests",
    "write_atomically",
]

#: What the side file's name adds to the output's.
PARTIAL_SUFFIX = ".partial"
_FORMAT = "pypto-sched-partial"
_VERSION = 1


def unfinished_requests(missing: Sequence[int], total: int, *, where: str = "") -> str:
    """How many of ``total`` requests finished (then ``where``, when given), and the first of
    the ``missing`` ones: ``"3 of 5 requests finished; not finished: requests 1, 4"`` (the
    first 8, then ``...``)."""
    shown = ", ".join(map(str, missing[:8])) + (", ..." if len(missing) > 8 else "")
    done = f"{total - len(missing)} of {total} requests finished"
    return f"{done}{', ' + where if where else ''}; not finished: requests {shown}"


class ResumeError(InvalidInputError):
    """A side file that belongs to another run (other prompts or settings) or is not one."""


def fingerprint(data: object) -> str:
    """A SHA-256 of ``data`` (JSON: the prompts and settings the results depend on), in hex."""
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode("ascii")).hexdigest()


def write_atomically(path: str | Path, data: bytes) -> None:
    """Replace ``path`` with ``data``, or leave it as it was: the bytes go to a new file in
    the same directory, which is fsynced and then renamed over ``path`` (an existing file
    keeps its permissions). A failure removes the new file and raises."""
    target = Path(os.path.realpath(path))  # a symbolic link's target is what is replaced
    mode = stat.S_IMODE(target.stat().st_mode) if target.exists() else None
    temporary = target.with_name(f".{target.name}.{secrets.token_hex(6)}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as stream:
            stream.write(data)
            stream.flush()
            if mode is not None:
                os.fchmod(stream.fileno(), mode)
            os.fsync(stream.fileno())
        os.replace(temporary, target)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    _fsync_directory(target.parent)


def _fsync_directory(folder: Path) -> None:
    """Make a rename in ``folder`` durable (where the system allows opening a directory)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some file systems refuse to fsync a directory; the rename stands
    finally:
        os.close(fd)


class OutputFile:
    """The output ``path`` of a run of ``num_requests`` requests whose results depend on what
    ``fingerprint`` summarises, as the module docstring states.

    Opening it creates ``path + PARTIAL_SUFFIX``; with ``resume``, an existing one is read
    back into :attr:`finished` (:class:`ResumeError` when it belongs to another run). An
    existing side file without ``resume`` is an :class:`~pypto_sched.InvalidInputError`:
    it holds an earlier run's finished requests, which starting over would lose.
    """

    def __init__(
        self, path: str | Path, *, num_requests: int, fingerprint: str, resume: bool
    ) -> None:
        self.path = Path(path)
        self.partial_path = self.path.with_name(self.path.name + PARTIAL_SUFFIX)
        self.num_requests = num_requests
        self.fingerprint = fingerprint
        #: The line of each finished request, by its index.
        self.finished: dict[int, str] = {}
        kept = self._read_back(resume)
        self._stream: IO[bytes] = self.partial_path.open("r+b" if kept else "wb")
        if kept:
            self._stream.truncate(kept)  # a line cut short by the crash
            self._stream.seek(kept)
        else:
            header = {
                "format": _FORMAT,
                "version": _VERSION,
                "fingerprint": fingerprint,
                "num_requests": num_requests,
            }
            self._write(json.dumps(header))

    @property
    def missing(self) -> list[int]:
        """The requests not finished yet, in input order."""
        return [r for r in range(self.num_requests) if r not in self.finished]

    def add(self, index: int, line: str) -> None:
        """Record request ``index``'s output ``line`` (one JSON line, no newline): on disk at
        once."""
        self._write(line)
        self.finished[index] = line

    def complete(self) -> None:
        """Write the output file, every request's line in input order, atomically, and remove
        the side file. Every request must have finished."""
        missing = self.missing
        if missing:
            raise InvalidInputError(
                f"'{self.path}' cannot be completed: {len(missing)} requests have not "
                f"finished, the first {missing[0]}"
            )
        text = "".join(f"{self.finished[r]}\n" for r in range(self.num_requests))
        write_atomically(self.path, text.encode("utf-8"))
        self.close()
        self.partial_path.unlink(missing_ok=True)
        _fsync_directory(self.path.parent)

    def discard_if_empty(self) -> bool:
        """Remove the side file when it holds no finished request (a run that failed before
        any finished leaves nothing that a later run must resume); whether it did."""
        if self.finished:
            return False
        self.close()
        self.partial_path.unlink(missing_ok=True)
        return True

    def close(self) -> None:
        """Close the side file, keeping it (a write that failed is not retried)."""
        # (An error here is the buffered tail of a failed write: the side file ends before it.)
        with contextlib.suppress(OSError):
            self._stream.close()

    def __enter__(self) -> OutputFile:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def _write(self, line: str) -> None:
        self._stream.write(f"{line}\n".encode())
        self._stream.flush()

    def _read_back(self, resume: bool) -> int:
        """The side file's finished lines into :attr:`finished`; the number of bytes to keep
        (``0``: start it anew)."""
        if not self.partial_path.exists():
            return 0
        where = f"'{self.partial_path}'"
        data = self.partial_path.read_bytes()
        end = data.rfind(b"\n") + 1  # a last line without its newline was cut short
        lines = data[:end].decode("utf-8", errors="replace").splitlines()
        if not resume:
            raise InvalidInputError(
                f"{where} holds {max(len(lines) - 1, 0)} finished requests of an unfinished "
                "run: resume it, or delete it to start over"
            )
        if not lines:
            return 0  # killed before its header was written
        header = _json_object(lines[0])
        if header.get("format") != _FORMAT or header.get("version") != _VERSION:
            raise ResumeError(f"{where} is not a partial output of pypto-sched: {lines[0][:80]}")
        if header.get("fingerprint") != self.fingerprint:
            raise ResumeError(
                f"{where} belongs to another run (other prompts or settings): refusing to mix "
                "its results in; delete it to start over"
            )
        for number, line in enumerate(lines[1:], start=2):
            index = _json_object(line).get("index")
            if not isinstance(index, int) or not 0 <= index < self.num_requests:
                raise ResumeError(f"{where} line {number}: no request index: {line[:80]}")
            if index in self.finished:
                raise ResumeError(f"{where} line {number}: request {index} again")
            self.finished[index] = line
        return end


def _json_object(line: str) -> Mapping[str, Any]:
    try:
        value = json.loads(line)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
