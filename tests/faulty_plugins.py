"""Backends that fail the way plugins fail in the field, installed for real processes.

:func:`install` writes a module and a ``dist-info`` directory that registers its backends
under the ``pypto_sched.backends`` entry point; a process started with :func:`env` (the
command line, and the Ray workers it starts) finds them by name as it finds any installed
backend. Each is the reference backend (same tokens) with one fault:

* ``dies-once``: its process is killed (``SIGKILL``) at its third dispatch, once per
  marker file (``FAULTY_MARKER``, created by the one process killed, which it names): the
  actor that replaces it runs to the end, and so does every other process that gets there;
* ``exits``: raises ``SystemExit(FAULTY_CODE)`` at its second dispatch;
* ``interrupts``: sends its own process ``SIGINT`` (Ctrl-C) at its second dispatch;
* ``unbuildable``: its factory raises ``RuntimeError``;
* ``refuses``: its factory refuses the option it is given, as ``load_backend`` refuses an
  unknown one (``InvalidInputError`` naming the option).
"""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

NAMES = ("dies-once", "exits", "interrupts", "unbuildable", "refuses")

_MODULE = """
import os
import signal

from pypto_sched import InvalidInputError
from pypto_sched_reference import ReferenceBackend, create_backend


def _faulty(name, fault):
    dispatches = [0]  # (in this process: the backend is a frozen value)

    class Faulty(ReferenceBackend):
        def run_dispatch(self, batch, cache):
            dispatches[0] += 1
            fault(dispatches[0])
            return super().run_dispatch(batch, cache)

    Faulty.name = name

    def factory(**options):
        backend = create_backend(**options)
        return Faulty(backend.weights)

    return factory


def _dies(count):
    if count != 3:
        return
    # Created or found in one step: two actors at their third dispatch together both saw
    # no marker when it was looked for and then written, and both died.
    try:
        marker = os.open(os.environ["FAULTY_MARKER"], os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return
    os.write(marker, str(os.getpid()).encode())
    os.close(marker)
    os.kill(os.getpid(), signal.SIGKILL)


def _exits(count):
    if count == 2:
        raise SystemExit(int(os.environ.get("FAULTY_CODE", "0")))


def _interrupts(count):
    if count == 2:
        os.kill(os.getpid(), signal.SIGINT)  # Python raises KeyboardInterrupt on its return


dies_once = _faulty("dies-once", _dies)
exits = _faulty("exits", _exits)
interrupts = _faulty("interrupts", _interrupts)


def unbuildable(**options):
    raise RuntimeError("no weights at /nowhere")


def refuses(**options):
    raise InvalidInputError(f"'checkpoint' must be a directory: {options.get('checkpoint')!r}")
"""


def install(directory: Path) -> Path:
    """Write the backends' module and its ``dist-info`` under ``directory``; return it."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "faulty_backends.py").write_text(textwrap.dedent(_MODULE))
    info = directory / "faulty_backends-0.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: faulty-backends\nVersion: 0\n")
    points = "".join(f"{name} = faulty_backends:{name.replace('-', '_')}\n" for name in NAMES)
    (info / "entry_points.txt").write_text(f"[pypto_sched.backends]\n{points}")
    return directory


def env(directory: Path, **extra: str) -> dict[str, str]:
    """The environment of a process that finds the backends installed under ``directory``."""
    path = os.pathsep.join(filter(None, [str(directory), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, **extra}


def command(*argv: str) -> list[str]:
    """``pypto-sched ARGV`` as a process of this interpreter."""
    return [sys.executable, "-m", "pypto_sched", *argv]
