"""Running ``pypto-sched`` in-process, as the command-line tests do."""

from __future__ import annotations

import json
from typing import Any

import pytest

from pypto_sched.cli import EXIT_OK, main


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """``pypto-sched ARGV...``: the exit status, stdout and stderr."""
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> Any:
    """``pypto-sched ARGV... --format json``, which must succeed silently; its parsed output."""
    status, out, err = run(capsys, *argv, "--format", "json")
    assert (status, err) == (EXIT_OK, "")
    return json.loads(out)
