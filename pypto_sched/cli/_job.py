"""``pypto-sched generate``'s job: the requests run, each result written as it finishes, and
the output completed (atomically, for a file) only when every request has finished.

With ``--output FILE``, results go through :class:`~pypto_sched.output.OutputFile`: a side
file ``FILE.partial`` written as requests finish, ``FILE`` written whole at the end, and
``--resume`` continuing from the side file. On stdout, the lines are printed in input order
at the end, or, when the run fails part-way, the finished ones. Either way a failed run says
which requests did not finish.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import attrs

from ..core._errors import InvalidInputError, PyptoSchedError
from ..core._sampling import SamplingParams
from ..runtime._generate import GeneratedSequence, GenerationResult
from ..runtime.output import (
    PARTIAL_SUFFIX,
    OutputFile,
    ResumeError,
    fingerprint,
    unfinished_requests,
)
from ..runtime.prompts import PromptRequest, TextCodec, output_line
from . import _render
from ._errors import CommandFailed, Terminated, UsageError

__all__ = [
    "Sink",
    "check_output",
    "identity",
    "open_sink",
    "run_job",
    "sequences_of",
    "write_summary",
]

#: Changes when the output lines change, so that a side file of older lines is refused.
_LINE_FORMAT = 2


class Sink(Protocol):
    """Where the lines go: a file (:class:`~pypto_sched.output.OutputFile`) or stdout."""

    finished: dict[int, str]

    @property
    def missing(self) -> list[int]: ...

    def add(self, index: int, line: str) -> None: ...

    def complete(self) -> None: ...

    def close(self) -> None: ...


class _Stream:
    """The lines of a run shown on a stream (stdout, or a file that is not a regular one),
    in input order, when it ends."""

    def __init__(self, num_requests: int, path: str | None) -> None:
        self.num_requests = num_requests
        self.path = path
        self.finished: dict[int, str] = {}

    @property
    def missing(self) -> list[int]:
        return [r for r in range(self.num_requests) if r not in self.finished]

    def add(self, index: int, line: str) -> None:
        self.finished[index] = line

    def complete(self) -> None:
        text = "".join(f"{self.finished[r]}\n" for r in sorted(self.finished))
        if self.path is None:
            _render.stream_of().write(text)
            return
        with open(self.path, "w", encoding="utf-8") as stream:
            stream.write(text)

    def close(self) -> None:
        pass


def check_output(path: str | None, *, prompts: str, resume: bool) -> None:
    """Refuse an ``--output`` that cannot be written, or that is the ``--prompts`` file, and
    an unfinished run's side file without ``--resume``, before anything runs (without
    creating or truncating anything). ``-`` is stdout."""
    if resume and (path is None or path == "-"):
        raise UsageError("--resume: continues an --output FILE's side file; give --output FILE")
    if path is None or path == "-":
        _render.stream_of()  # not closed
        return
    target = Path(path)
    folder = target.parent
    problem = (
        "an empty file name"
        if not path
        else "it is the --prompts file, which it would overwrite"
        if prompts != "-" and _same_file(target, Path(prompts))
        else "it is a directory"
        if target.is_dir()
        else f"no directory {str(folder)!r}"
        if not folder.is_dir()
        else "permission denied"
        if not os.access(folder, os.W_OK) or (target.exists() and not os.access(target, os.W_OK))
        else None
    )
    if problem is not None:
        raise UsageError(f"--output: cannot write {path!r}: {problem}")
    partial = target.with_name(target.name + PARTIAL_SUFFIX)
    if partial.exists() and not resume:
        raise UsageError(
            f"--output: {str(partial)!r} holds the finished requests of an unfinished run: "
            "add --resume to continue it, or delete it to start over"
        )


def _same_file(first: Path, second: Path) -> bool:
    try:
        return first.samefile(second)
    except OSError:  # one of them does not exist (yet)
        return False


def identity(
    args: argparse.Namespace,
    requests: Sequence[PromptRequest],
    sampling: Sequence[SamplingParams],
    eos: Sequence[int],
    *,
    tokenizer: TextCodec | None,
) -> dict[str, Any]:
    """What a run's lines depend on, for the side file's fingerprint: the prompts, each
    request's settings, the stop ids, the model and the line format. Not the planner's
    budget, policy or pool, which change when tokens are computed, never which."""
    return {
        "lines": _LINE_FORMAT,
        "backend": args.backend,
        "backend_options": sorted(args.backend_option),
        "text": tokenizer is not None,
        "eos": list(eos),
        "requests": [
            [list(r.token_ids), r.max_new_tokens, list(r.stop_token_ids), attrs.asdict(p)]
            for r, p in zip(requests, sampling, strict=True)
        ],
    }


def open_sink(args: argparse.Namespace, num_requests: int, identity: dict[str, Any]) -> Sink:
    path = args.output
    if path is None or path == "-":
        return _Stream(num_requests, None)
    if os.path.exists(path) and not os.path.isfile(path):  # /dev/null, a pipe: no renaming
        return _Stream(num_requests, path)
    try:
        return OutputFile(
            path, num_requests=num_requests, fingerprint=fingerprint(identity), resume=args.resume
        )
    except ResumeError as error:
        raise UsageError(f"--resume: {error}") from None
    except InvalidInputError as error:
        raise UsageError(f"--output: {error}") from None
    except OSError as error:
        raise UsageError(f"--output: cannot write {path!r}: {error.strerror or error}") from None


def run_job(
    sink: Sink,
    execute: Callable[[list[int], Callable[[int, GeneratedSequence], None]], GenerationResult],
    *,
    tokenizer: TextCodec | None,
    output: str | None,
) -> GenerationResult | None:
    """Run the requests ``sink`` is missing through ``execute(indices, on_finish)``, each
    line into ``sink`` as it finishes, then complete it. A failure keeps the finished lines
    and says which requests did not finish. ``None`` when nothing was left to run."""
    todo = sink.missing

    def on_finish(place: int, sequence: GeneratedSequence) -> None:
        index = todo[place]
        sink.add(index, output_line(index, sequence, tokenizer=tokenizer))

    result = None
    try:
        if todo:
            result = execute(todo, on_finish)
        sink.complete()
    except (KeyboardInterrupt, OSError, PyptoSchedError, UsageError) as error:
        raise _failure(error, sink, output) from None
    finally:
        sink.close()
    return result


def _failure(error: BaseException, sink: Sink, output: str | None) -> BaseException:
    """The error a run that failed part-way ends with: ``error``'s message, what was kept
    and which requests did not finish (the lines finished go to stdout first, when that is
    the output)."""
    to_stdout = output is None or output == "-"
    if isinstance(sink, OutputFile):
        sink.discard_if_empty()  # nothing to resume: a rerun needs no --resume
    if isinstance(error, UsageError) or (
        isinstance(error, PyptoSchedError) and isinstance(error, ValueError)
    ):
        return error  # bad input found before any request ran
    if isinstance(error, OSError) and error.filename is not None and not to_stdout:
        return error  # not the output's: a bug of ours, with its traceback
    if isinstance(sink, OutputFile):
        where = (
            f"kept in {str(sink.partial_path)!r} (rerun with --resume to finish)"
            if sink.finished
            else "nothing to keep"
        )
    elif to_stdout and not isinstance(error, OSError):
        sink.complete()  # the finished lines, in input order
        where = "written"
    else:
        where = "lost"
    missing = sink.missing
    total = len(sink.finished) + len(missing)
    kept = (
        unfinished_requests(missing, total, where=where)
        if missing
        else f"all {total} requests finished, {where}"
    )
    if Terminated.caused(error):
        return Terminated(f"terminated by SIGTERM; {kept}")
    if isinstance(error, KeyboardInterrupt):
        return UsageError(f"interrupted; {kept}")
    if isinstance(error, OSError):
        what = "stdout" if to_stdout else repr(output)
        return UsageError(f"--output: cannot write {what}: {error.strerror or error}; {kept}")
    return CommandFailed(f"{error}; {kept}")


def sequences_of(sink: Sink) -> list[list[int]]:
    """Every request's generated ids, read back from its line (for ``--verify``)."""
    return [json.loads(sink.finished[r])["token_ids"] for r in sorted(sink.finished)]


def write_summary(lines: Sequence[str]) -> None:
    if sys.stderr is not None:  # not started with stderr closed
        sys.stderr.write("".join(f"{line}\n" for line in lines))
