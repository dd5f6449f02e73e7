"""The ``pypto-sched`` command line: a thin shell over the library.

Commands (``pypto-sched COMMAND --help`` explains each, with the seed's workload):

- ``plan``: plan one batch; a summary, or the schedule as JSON;
- ``compare``: the same workload under several configurations, one table row each;
- ``plot``: a picture of a schedule, PNG or SVG (needs the ``plot`` extra, matplotlib);
- ``run``: execute a schedule on an installed backend, with progress and a summary, and
  optionally verify it against a one-shot prefill on the same backend;
- ``generate``: generate tokens for a JSON Lines file of prompts on an installed backend,
  decode mixed with chunked prefill over a bounded KV pool, optionally verified against
  transformers' ``generate()``;
- ``backends``: the installed backends, whether each can run here, and their options.

Layout: :mod:`._parser` builds the parser from one module per command (:mod:`.plan`,
:mod:`.compare`, :mod:`.plot`, :mod:`.run`, :mod:`.generate`, :mod:`.backends`), each
holding its options, its examples and its handler; :mod:`._options` the option groups they
share; :mod:`._lengths` the ``--lengths`` grammar and bounded file reading; :mod:`._inputs`
the step from options to the library's inputs; :mod:`._specs` ``--backend-option``;
:mod:`._render` and :mod:`._progress` the output; :mod:`._main` the entry point and its exit
statuses. What a server or a test would also need (backend status, progress hooks,
verification, one-shot plans, "0 means off") is the library's, not this package's.

Exit status: 0 on success; 1 when the work itself failed (a verification mismatch, a backend
error, a missing optional dependency); 2 for bad input, input too large for the machine, and
Ctrl-C; 143 for SIGTERM. Failures print one line on stderr, never a traceback.
"""

from ._errors import EXIT_FAILED, EXIT_OK, EXIT_TERMINATED, EXIT_USAGE
from ._lengths import parse_lengths
from ._main import main
from ._parser import build_parser

__all__ = [
    "EXIT_FAILED",
    "EXIT_OK",
    "EXIT_TERMINATED",
    "EXIT_USAGE",
    "build_parser",
    "main",
    "parse_lengths",
]
