"""The ``pypto-sched`` command line.

Commands (``pypto-sched COMMAND --help`` explains each, with the seed's workload):

- ``plan``: plan one batch; a summary, or the schedule as JSON;
- ``compare``: the same workload under several configurations, one table row each;
- ``plot``: a picture of a schedule, PNG or SVG (needs the ``plot`` extra, matplotlib);
- ``run``: execute a schedule on an installed backend, with progress and a summary, and
  optionally verify it against a one-shot prefill on the same backend;
- ``backends``: the installed backends and whether each can run here.

Workloads are given as ``--lengths`` (a list, or ``@FILE``) or as ``--workload NAME``, a named
synthetic distribution drawn with ``--seed``. Text output is drawn with rich (the ``cli``
extra); ``--format json`` output needs nothing beyond the library.

Exit status: 0 on success; 1 when the work itself failed (a verification mismatch, a backend
error, a missing optional dependency); 2 for bad input. Failures print one line on stderr,
never a traceback.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import sys
import textwrap
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, NoReturn, cast

import numpy as np
import numpy.typing as npt

from ._config import POLICIES, PlannerConfig
from ._errors import PyptoSchedError
from ._policies import plan_prefill
from ._schedule import Schedule
from ._workloads import WORKLOADS, synthetic_lengths

if TYPE_CHECKING:
    from importlib.metadata import EntryPoint

    from rich.console import Console, RenderableType
    from rich.table import Table

    from .backends import Backend, BackendFactory, DispatchInput, DispatchOutput
    from .execute import ExecutionResult

__all__ = ["EXIT_FAILED", "EXIT_OK", "EXIT_USAGE", "main", "parse_lengths"]

#: Exit statuses.
EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2

#: Help text is filled to fit an 80-column terminal, as argparse fills its own.
_HELP_WIDTH = 78
_SEED = (
    "--lengths 3338x16 --max-num-batched-tokens 8192 \\\n      --long-prefill-token-threshold 256"
)
_EXAMPLES = {
    "plan": [
        ("the seed's workload, 16 prompts of 3,338 tokens: 224 dispatches", f"plan {_SEED}"),
        (
            "the same, several requests per dispatch: 14 dispatches",
            f"plan {_SEED} \\\n      --policy packed --max-num-seqs 16",
        ),
        ("the schedule itself, as JSON", f"plan {_SEED} --format json"),
    ],
    "compare": [
        ("the seed's workload under both policies", f"compare {_SEED} --max-num-seqs 16"),
        (
            "what the threshold does under packed",
            "compare --workload seed --max-num-batched-tokens 8192 --policy packed \\\n"
            "      --max-num-seqs 16 --vary threshold=0,256,1024",
        ),
        (
            "two hand-written configurations on 64 lognormal prompts",
            "compare --workload lognormal --num-requests 64 --seed 1 \\\n"
            "      --max-num-batched-tokens 8192 --config policy=round_robin,threshold=512 \\\n"
            "      --config policy=packed,max_num_seqs=32",
        ),
    ],
    "plot": [
        ("the seed's 224 dispatches as a PNG", f"plot {_SEED} -o seed.png"),
        (
            "10,000 dispatches drawn as an image, as SVG",
            "plot --workload uniform --num-requests 1000 --max-length 20000 \\\n"
            "      --max-num-batched-tokens 2048 --long-prefill-token-threshold 2048 -o big.svg",
        ),
    ],
    "run": [
        (
            "the seed's shape, a quarter as long, on the NumPy reference backend, verified",
            "run --backend reference --lengths 834x16 --max-num-batched-tokens 8192 \\\n"
            "      --long-prefill-token-threshold 256 --verify",
        ),
        (
            "a one-layer model (options go to the backend's factory), packed, as JSON",
            "run --backend reference --backend-option num_hidden_layers=1 --lengths 300x4 \\\n"
            "      --max-num-batched-tokens 512 --policy packed --verify --format json",
        ),
    ],
    "backends": [("what is installed, and whether it can run here", "backends")],
}

#: Short names accepted by ``compare --config`` and ``--vary``, and the table's column heads.
_KNOB_ALIASES = {
    "budget": "max_num_batched_tokens",
    "threshold": "long_prefill_token_threshold",
    "batch": "max_num_seqs",
    "max_num_seqs": "max_num_seqs",
    "page": "page_size",
    "partial": "max_num_partial_prefills",
}
_KNOB_HEADS = {
    "policy": "policy",
    "max_num_batched_tokens": "budget",
    "long_prefill_token_threshold": "threshold",
    "max_num_seqs": "max batch",
    "page_size": "page",
    "max_num_partial_prefills": "partial",
}
_OFF = frozenset({"0", "off", "none"})


class UsageError(Exception):
    """Bad command-line input; exit status 2, reported as one line."""


class CommandFailed(Exception):
    """The command could not do its work; exit status 1, reported as one line."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


# -- workloads -------------------------------------------------------------------------------


def parse_lengths(text: str, *, name: str = "--lengths") -> list[int]:
    """Parse ``"100,200,3338x16"``: a comma list in which ``LxN`` stands for N prompts of L
    tokens. Whitespace and newlines separate items too; ``#`` starts a comment."""
    items: list[int] = []
    lines = (line.split("#", 1)[0] for line in text.splitlines())
    for token in " ".join(lines).replace(",", " ").split():
        value, _, count = token.partition("x")
        try:
            length = int(value)
            repeat = int(count) if count else 1
        except ValueError:
            raise UsageError(f"{name}: expected LENGTH or LENGTHxCOUNT, got {token!r}") from None
        if repeat < 1:
            raise UsageError(f"{name}: the count in {token!r} must be >= 1")
        if repeat > 10_000_000:
            raise UsageError(f"{name}: the count in {token!r} must be <= 10000000")
        items.extend([length] * repeat)
    if not items:
        raise UsageError(f"{name}: no lengths given")
    return items


def _read_lengths(value: str, name: str) -> list[int]:
    """``@PATH`` reads the list from a file (``-`` for stdin); anything else is the list."""
    if not value.startswith("@"):
        return parse_lengths(value, name=name)
    path = value[1:]
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text()
    except OSError as error:
        raise UsageError(f"{name}: cannot read {path!r}: {error.strerror}") from None
    return parse_lengths(text, name=name)


_WORKLOAD_DEFAULTS = {"num_requests": 16, "seed": 0, "min_length": 16, "max_length": 4096}


def _workload(args: argparse.Namespace) -> tuple[list[int] | npt.NDArray[np.int64], str]:
    """The prompt lengths and a short description of where they came from."""
    if args.workload is None:
        for option in ("num_requests", "min_length", "max_length"):
            if getattr(args, option) is not None:
                flag = "--" + option.replace("_", "-")
                raise UsageError(f"{flag} applies only with --workload, not with a lengths list")
        if args.lengths_file is not None:
            return _read_lengths("@" + args.lengths_file, "--lengths-file"), "--lengths-file"
        return _read_lengths(args.lengths, "--lengths"), "--lengths"
    params = {
        key: default if getattr(args, key) is None else getattr(args, key)
        for key, default in _WORKLOAD_DEFAULTS.items()
    }
    lengths_array = synthetic_lengths(args.workload, **params)
    # The description is the options that draw the same lengths again.
    source = f"--workload {args.workload} --num-requests {params['num_requests']}"
    if args.workload != "seed":
        source += (
            f" --seed {params['seed']} --min-length {params['min_length']}"
            f" --max-length {params['max_length']}"
        )
    return lengths_array, source


def _num_computed(args: argparse.Namespace) -> list[int] | None:
    if args.num_computed is None:
        return None
    return _read_lengths(args.num_computed, "--num-computed")


# -- configurations --------------------------------------------------------------------------


def _optional(value: int) -> int | None:
    """0 on the command line means "off", as in vLLM's flags."""
    return value or None


def _config(args: argparse.Namespace) -> PlannerConfig:
    return PlannerConfig.from_engine_args(
        max_num_batched_tokens=args.max_num_batched_tokens,
        long_prefill_token_threshold=args.long_prefill_token_threshold,
        max_num_seqs=_optional(args.max_num_seqs),
        page_size=_optional(args.page_size),
        policy=args.policy,
        max_num_partial_prefills=_optional(args.max_num_partial_prefills),
    )


def _knob(key: str, option: str) -> str:
    name = key.strip().lower().replace("-", "_")
    name = _KNOB_ALIASES.get(name, name)
    if name not in _KNOB_HEADS:
        known = ", ".join([*_KNOB_HEADS, *_KNOB_ALIASES])
        raise UsageError(f"{option}: unknown setting {key!r}; known: {known}")
    return name


def _knob_value(name: str, text: str, option: str) -> object:
    text = text.strip()
    if name == "policy":
        return text
    if text.lower() in _OFF and name != "max_num_batched_tokens":
        return None
    try:
        return int(text)
    except ValueError:
        allowed = "an integer" if name == "max_num_batched_tokens" else "an integer or 'off'"
        raise UsageError(f"{option}: {name} must be {allowed}: {text!r}") from None


def _parse_config_spec(spec: str) -> dict[str, object]:
    """``"policy=packed,batch=16"`` -> ``{"policy": "packed", "max_num_seqs": 16}``."""
    overrides: dict[str, object] = {}
    for item in spec.split(","):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--config: expected KEY=VALUE[,KEY=VALUE...], got {spec!r}")
        name = _knob(key, "--config")
        overrides[name] = _knob_value(name, value, "--config")
    return overrides


def _parse_vary(spec: str) -> list[dict[str, object]]:
    """``"threshold=0,256"`` -> ``[{"long_prefill_token_threshold": None}, {...: 256}]``."""
    key, sep, values = spec.partition("=")
    if not sep or not key.strip() or not values.strip():
        raise UsageError(f"--vary: expected KEY=VALUE,VALUE..., got {spec!r}")
    name = _knob(key, "--vary")
    return [{name: _knob_value(name, value, "--vary")} for value in values.split(",")]


def _configurations(args: argparse.Namespace) -> list[PlannerConfig]:
    """The base config from the options, once per ``--config`` and ``--vary`` combination
    (both policies when neither is given)."""
    base = _config(args).to_dict()
    specs = [_parse_config_spec(spec) for spec in args.config] or [{}]
    sweeps = [_parse_vary(spec) for spec in args.vary]
    if not args.config and not args.vary:
        sweeps = [[{"policy": policy} for policy in POLICIES]]
    configs = []
    for spec in specs:
        for combination in itertools.product(*sweeps):
            overrides = _merge([spec, *combination])
            try:
                configs.append(PlannerConfig.from_dict({**base, **overrides}))
            except PyptoSchedError as error:
                label = _describe_overrides(overrides)
                raise UsageError(f"configuration {label}: {error}") from None
    return configs


def _merge(overrides: Sequence[dict[str, object]]) -> dict[str, object]:
    merged: dict[str, object] = {}
    for override in overrides:
        merged.update(override)
    return merged


def _describe_overrides(overrides: Mapping[str, object]) -> str:
    if not overrides:
        return "(the options as given)"
    return ",".join(f"{_KNOB_HEADS[k]}={_show(v)}" for k, v in overrides.items())


def _show(value: object) -> str:
    if value is None:
        return "off"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def _plan(args: argparse.Namespace) -> tuple[Schedule, str]:
    lengths, source = _workload(args)
    schedule = plan_prefill(lengths, _config(args), num_computed_tokens=_num_computed(args))
    return schedule, source


# -- output ----------------------------------------------------------------------------------


def _console(*, stderr: bool = False) -> Console:
    """A rich console on stdout (or stderr); a clear error when rich is missing."""
    try:
        from rich.console import Console
    except ImportError:
        raise CommandFailed(
            "text output needs rich: pip install 'pypto-sched[cli]' (or use --format json)"
        ) from None
    stream = sys.stderr if stderr else sys.stdout
    # Piped output is never wrapped to a terminal's width: tables keep their natural width.
    width = None if stream.isatty() or "COLUMNS" in os.environ else _PIPED_WIDTH
    return Console(file=stream, width=width, markup=False, highlight=False, emoji=False)


_PIPED_WIDTH = 200


def _emit(*items: RenderableType) -> None:
    """Print ``items`` on stdout; when piped, as plain text without trailing spaces."""
    console = _console()
    if console.is_terminal:
        for item in items:
            console.print(item)
        return
    with console.capture() as capture:
        for item in items:
            console.print(item, soft_wrap=isinstance(item, str))
    lines = capture.get().splitlines()
    sys.stdout.write("".join(line.rstrip() + "\n" for line in lines))


def _table(*columns: str) -> Table:
    from rich import box
    from rich.table import Table

    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    for column in columns:
        table.add_column(column, justify="left" if column in _TEXT_COLUMNS else "right")
    return table


def _grid() -> Table:
    from rich.table import Table

    grid = Table.grid(padding=(0, 3))
    grid.add_column()
    grid.add_column()
    return grid


_TEXT_COLUMNS = frozenset({"policy", "name", "version", "entry point", "runs here"})


def _print_json(data: object) -> None:
    print(json.dumps(data))


def _percent(value: float) -> str:
    return f"{value:.1%}"


# -- plan ------------------------------------------------------------------------------------


def _cmd_plan(args: argparse.Namespace) -> int:
    schedule, _ = _plan(args)
    if args.format == "json":
        data = schedule.to_dict()
        data["summary"] = schedule.stats.to_dict()
        _print_json(data)
        return EXIT_OK
    config, stats = schedule.config, schedule.stats
    heading = (
        f"policy {config.policy}: {stats.num_requests:,} requests, "
        f"{stats.num_tokens:,} tokens to prefill"
    )
    _emit(heading, _summary_grid(schedule), "", *_finish_table(schedule))
    return EXIT_OK


def _summary_grid(schedule: Schedule) -> Table:
    """Dispatches vs lower bound, tokens per dispatch, utilization, finishing."""
    config, stats = schedule.config, schedule.stats
    table = _grid()
    table.add_row(
        "dispatches",
        f"{stats.num_dispatches:,} (lower bound {stats.lower_bound:,}, "
        f"{stats.num_dispatches / stats.lower_bound:.2f}x)",
    )
    table.add_row(
        "tokens per dispatch",
        f"min {stats.min_tokens_per_dispatch:,}, mean {stats.mean_tokens_per_dispatch:,.1f}, "
        f"max {stats.max_tokens_per_dispatch:,} (effective budget {config.effective_budget:,})",
    )
    table.add_row(
        "utilization",
        f"mean {_percent(stats.mean_utilization)}, min {_percent(stats.min_utilization)} "
        f"of max_num_batched_tokens {config.max_num_batched_tokens:,}",
    )
    table.add_row(
        "requests finish at",
        f"dispatch {stats.mean_finish_dispatch:,.1f} on average, "
        f"{stats.worst_finish_dispatch:,} at worst (0-based)",
    )
    return table


def _finish_table(schedule: Schedule, *, limit: int = 16) -> list[RenderableType]:
    """When each request finishes (the first ``limit`` requests), and a note if cut."""
    shown = min(schedule.num_requests, limit)
    table = _table("request", "tokens", "chunks", "finishes at dispatch")
    chunks = np.bincount(schedule.requests, minlength=schedule.num_requests)
    todo = schedule.prompt_lengths - schedule.num_computed_tokens
    for r in range(shown):
        table.add_row(
            f"{r:,}",
            f"{int(todo[r]):,}",
            f"{int(chunks[r]):,}",
            f"{int(schedule.finish_dispatch[r]):,}",
        )
    if shown < schedule.num_requests:
        return [table, f"... and {schedule.num_requests - shown:,} more (see --format json)"]
    return [table]


# -- compare ---------------------------------------------------------------------------------


_COMPARE_COLUMNS = (
    "dispatches",
    "lower bound",
    "x bound",
    "mean util",
    "min util",
    "largest dispatch",
    "mean finish",
    "worst finish",
)
"""The figures per configuration: utilization is of ``max_num_batched_tokens``; "largest
dispatch" is in tokens; "finish" is the 0-based dispatch index of a request's final chunk."""


def _cmd_compare(args: argparse.Namespace) -> int:
    lengths, source = _workload(args)
    computed = _num_computed(args)
    configs = _configurations(args)
    schedules = [plan_prefill(lengths, c, num_computed_tokens=computed) for c in configs]
    if args.format == "json":
        first = schedules[0]
        _print_json(
            {
                "workload": {
                    "source": source,
                    "num_requests": first.num_requests,
                    "num_tokens": first.num_tokens,
                    "prompt_lengths": first.prompt_lengths.tolist(),
                    "num_computed_tokens": first.num_computed_tokens.tolist(),
                },
                "configurations": [
                    {"config": s.config.to_dict(), "summary": s.stats.to_dict()} for s in schedules
                ],
            }
        )
        return EXIT_OK
    _emit(*_compare_table(schedules, source))
    return EXIT_OK


def _compare_table(schedules: Sequence[Schedule], source: str) -> list[RenderableType]:
    """A heading (the workload and the settings all rows share), then one row per schedule:
    the settings that differ, then the figures that matter."""
    dicts = [s.config.to_dict() for s in schedules]
    varying = [k for k in _KNOB_HEADS if len({repr(d[k]) for d in dicts}) > 1] or ["policy"]
    shared = [
        f"{_KNOB_HEADS[k]} {_show(dicts[0][k])}"
        for k in _KNOB_HEADS
        if k not in varying and dicts[0][k] is not None
    ]
    first = schedules[0]
    heading = f"{first.num_requests:,} requests, {first.num_tokens:,} tokens ({source})"
    table = _table(*(_KNOB_HEADS[k] for k in varying), *_COMPARE_COLUMNS)
    for schedule, data in zip(schedules, dicts, strict=True):
        stats = schedule.stats
        table.add_row(
            *(_show(data[k]) for k in varying),
            f"{stats.num_dispatches:,}",
            f"{stats.lower_bound:,}",
            f"{stats.num_dispatches / stats.lower_bound:.2f}",
            _percent(stats.mean_utilization),
            _percent(stats.min_utilization),
            f"{stats.max_tokens_per_dispatch:,}",
            f"{stats.mean_finish_dispatch:,.1f}",
            f"{stats.worst_finish_dispatch:,}",
        )
    return [heading, "all rows: " + ", ".join(shared), table]


# -- plot ------------------------------------------------------------------------------------


def _cmd_plot(args: argparse.Namespace) -> int:
    from ._plot import FORMATS, render_schedule

    path = Path(args.output)
    image_format = FORMATS.get(path.suffix.lower())
    if image_format is None:
        raise UsageError(f"--output: the file name must end in .png or .svg: {args.output!r}")
    for option in ("width", "height"):
        if not 100 <= getattr(args, option) <= 20_000:
            raise UsageError(f"--{option}: must be in [100, 20000] pixels: {getattr(args, option)}")
    if not 10 <= args.dpi <= 1000:
        raise UsageError(f"--dpi: must be in [10, 1000]: {args.dpi}")
    schedule, _ = _plan(args)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise CommandFailed("plot needs matplotlib: pip install 'pypto-sched[plot]'") from None
    try:
        style = render_schedule(
            schedule,
            path,
            width=args.width,
            height=args.height,
            dpi=args.dpi,
            style=args.style,
            title=args.title,
        )
    except OSError as error:
        raise CommandFailed(f"cannot write {str(path)!r}: {error.strerror}") from None
    result = {
        "path": str(path),
        "format": image_format,
        "width": args.width,
        "height": args.height,
        "style": style,
        "num_dispatches": schedule.num_dispatches,
        "num_requests": schedule.num_requests,
    }
    if args.format == "json":
        _print_json(result)
    else:
        _emit(
            f"wrote {path}: {args.width}x{args.height} {image_format.upper()}, {style} style, "
            f"{schedule.num_dispatches:,} dispatches of {schedule.num_requests:,} requests"
        )
    return EXIT_OK


# -- backends and run ------------------------------------------------------------------------


def _cmd_backends(args: argparse.Namespace) -> int:
    rows = _backend_rows(_installed_entry_points())
    if args.format == "json":
        _print_json(rows)
        return EXIT_OK
    if not rows:
        _emit("no backends installed; try: pip install -e backends/reference")
        return EXIT_OK
    table = _table("name", "version", "entry point", "runs here")
    for row in rows:
        runs = "yes" if row["available"] else f"no: {row['reason']}"
        table.add_row(row["name"], row["version"], row["entry_point"], runs)
    _emit(table)
    return EXIT_OK


def _installed_entry_points() -> list[EntryPoint]:
    from importlib.metadata import entry_points

    from .backends import ENTRY_POINT_GROUP

    return list(entry_points(group=ENTRY_POINT_GROUP))


def _backend_rows(entry_points: Sequence[EntryPoint]) -> list[dict[str, Any]]:
    """One row per backend name: its distribution, entry point and whether it runs here.

    Each entry point is loaded on its own through the discovery function, so that one that
    fails to load is listed with the reason instead of being left out.
    """
    from .backends import _first_per_name, build_backends

    rows = []
    for entry_point in sorted(_first_per_name(entry_points), key=lambda ep: ep.name):
        name = entry_point.name
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            factory = build_backends([entry_point]).get(name)
        if factory is None:
            reason = str(caught[0].message) if caught else "it failed to load"
            available = False
        else:
            available, reason = _availability(factory)
        dist = entry_point.dist
        rows.append(
            {
                "name": name,
                "version": "?" if dist is None else f"{dist.name} {dist.version}",
                "entry_point": entry_point.value,
                "available": available,
                "reason": reason,
            }
        )
    return rows


def _availability(factory: BackendFactory) -> tuple[bool, str]:
    """Whether a backend that loaded can run here. A factory (or the class whose
    classmethod it is) may say so with an ``is_available()`` returning a bool or a
    ``(bool, reason)`` pair; without one, a backend that loads can run."""
    owner = getattr(factory, "__self__", None)
    check = getattr(factory, "is_available", None) or getattr(owner, "is_available", None)
    if check is None:
        return True, ""
    try:
        answer = check()
    except Exception as error:  # a broken check means "cannot run", not a crash
        return False, f"its availability check failed: {type(error).__name__}: {error}"
    if isinstance(answer, tuple):
        ok, reason = answer
        return bool(ok), str(reason)
    return bool(answer), "" if answer else "its availability check said no"


def _backend_options(items: Sequence[str]) -> dict[str, object]:
    """``key=value`` pairs; values are read as JSON when they parse (numbers, true, null),
    else kept as strings."""
    options: dict[str, object] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip().isidentifier():
            raise UsageError(f"--backend-option: expected KEY=VALUE, got {item!r}")
        try:
            options[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            options[key.strip()] = value
    return options


def _load_backend(args: argparse.Namespace) -> Backend:
    from .backends import load_backend

    options = _backend_options(args.backend_option)
    try:
        return load_backend(args.backend, **options)
    except PyptoSchedError:
        raise
    except (TypeError, ValueError) as error:
        # An option the factory does not take, or a value it refuses.
        raise UsageError(f"--backend-option: backend {args.backend!r}: {error}") from None
    except Exception as error:
        raise CommandFailed(
            f"backend {args.backend!r} could not be created: {type(error).__name__}: {error}"
        ) from None


def _token_ids(schedule: Schedule, vocab_size: int, seed: int) -> list[npt.NDArray[np.int64]]:
    """Random prompts of the schedule's lengths, the same for the same seed."""
    rng = np.random.default_rng(seed)
    return [
        rng.integers(0, vocab_size, size=int(length), dtype=np.int64)
        for length in schedule.prompt_lengths
    ]


class _Counting:
    """A backend that reports every dispatch it runs to ``on_dispatch`` (for the progress
    bar), and otherwise is the backend it wraps. Build one with :func:`_counting`, which
    copies the wrapped backend's class-level ``name``."""

    name: ClassVar[str] = "counting"

    def __init__(self, backend: Backend, on_dispatch: Callable[[DispatchInput], None]) -> None:
        self._backend = backend
        self._on_dispatch = on_dispatch

    @property
    def tolerance(self) -> float:
        return self._backend.tolerance

    @property
    def vocab_size(self) -> int:
        return self._backend.vocab_size

    @property
    def hidden_size(self) -> int:
        return self._backend.hidden_size

    def new_cache(self, *, num_pages: int, page_size: int) -> Any:
        return self._backend.new_cache(num_pages=num_pages, page_size=page_size)

    def embed(self, token_ids: npt.NDArray[np.int64]) -> npt.NDArray[np.floating[Any]]:
        return self._backend.embed(token_ids)

    def run_dispatch(self, batch: DispatchInput, cache: Any) -> DispatchOutput:
        output = self._backend.run_dispatch(batch, cache)
        self._on_dispatch(batch)
        return output


def _counting(backend: Backend, on_dispatch: Callable[[DispatchInput], None]) -> _Counting:
    # The driver names the backend in its errors, so the wrapper carries the same name.
    named = cast(type[_Counting], type("Counting", (_Counting,), {"name": backend.name}))
    return named(backend, on_dispatch)


@contextmanager
def _progress(
    schedule: Schedule, *, label: str, show: bool, explicit: bool
) -> Iterator[Callable[[DispatchInput], None]]:
    """A rich progress bar on stderr, advanced once per dispatch; a no-op when hidden."""
    if not show:
        yield lambda _batch: None
        return
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    console = _console(stderr=True)
    if explicit:
        # Asked for by name: drawn even when stderr is not a terminal (a log, a test).
        console = type(console)(
            file=sys.stderr, force_terminal=True, width=console.width, markup=False
        )
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("dispatches"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
        transient=True,
    ) as progress:
        task = progress.add_task(label, total=schedule.num_dispatches)
        yield lambda _batch: progress.advance(task)


def _execute(
    schedule: Schedule,
    backend: Backend,
    prompts: Sequence[npt.NDArray[np.int64]],
    args: argparse.Namespace,
    *,
    label: str,
) -> tuple[ExecutionResult, float]:
    from .execute import execute_schedule

    show, explicit = _show_progress(args), args.progress is not None
    with _progress(schedule, label=label, show=show, explicit=explicit) as advance:
        started = time.perf_counter()
        result = execute_schedule(
            schedule,
            _counting(backend, advance),
            prompts,
            return_greedy=True,
            page_size=_optional(args.kv_page_size),
        )
        seconds = time.perf_counter() - started
    return result, seconds


def _show_progress(args: argparse.Namespace) -> bool:
    if args.progress is not None:
        return bool(args.progress)
    return sys.stderr.isatty() and args.format == "text"


def _one_shot(schedule: Schedule) -> Schedule:
    """The whole batch in one dispatch: every prompt whole, one normal batched prefill."""
    total = max(schedule.num_tokens, 1)
    config = PlannerConfig(max_num_batched_tokens=total)
    return plan_prefill(
        schedule.prompt_lengths, config, num_computed_tokens=schedule.num_computed_tokens
    )


def _cmd_run(args: argparse.Namespace) -> int:
    schedule, source = _plan(args)
    if int(schedule.num_computed_tokens.sum()):
        raise UsageError("--num-computed: run starts from an empty KV cache; leave it out")
    backend = _load_backend(args)
    prompts = _token_ids(schedule, backend.vocab_size, args.seed or 0)
    result, seconds = _execute(schedule, backend, prompts, args, label="prefill")
    summary: dict[str, Any] = {
        "backend": backend.name,
        "source": source,
        "config": schedule.config.to_dict(),
        "num_requests": schedule.num_requests,
        "num_tokens": schedule.num_tokens,
        "num_dispatches": schedule.num_dispatches,
        "seconds": seconds,
        "tokens_per_second": schedule.num_tokens / seconds if seconds > 0 else math.inf,
        "greedy_token_ids": _ints(result.greedy_token_ids),
        "verify": None,
    }
    if args.verify:
        summary["verify"] = _verify(schedule, backend, prompts, result, args)
    if args.format == "json":
        _print_json(summary)
    else:
        _emit(*_run_table(summary))
    if args.verify and not summary["verify"]["passed"]:
        return EXIT_FAILED
    return EXIT_OK


def _ints(values: npt.NDArray[Any] | None) -> list[int] | None:
    return None if values is None else [int(v) for v in values]


def _verify(
    schedule: Schedule,
    backend: Backend,
    prompts: Sequence[npt.NDArray[np.int64]],
    chunked: ExecutionResult,
    args: argparse.Namespace,
) -> dict[str, Any]:
    """Run the same prompts as one dispatch on the same backend and compare the results."""
    reference = _one_shot(schedule)
    one_shot, seconds = _execute(reference, backend, prompts, args, label="one-shot")
    assert chunked.logits is not None
    assert one_shot.logits is not None
    diff = np.abs(
        np.asarray(chunked.logits, dtype=np.float64) - np.asarray(one_shot.logits, np.float64)
    )
    worst = float(diff.max()) if diff.size else 0.0
    greedy_equal = np.asarray(chunked.greedy_token_ids) == np.asarray(one_shot.greedy_token_ids)
    tolerance = float(backend.tolerance)
    return {
        "one_shot_seconds": seconds,
        "max_abs_logit_diff": worst,
        "tolerance": tolerance,
        "greedy_agree": int(greedy_equal.sum()),
        "passed": bool(worst <= tolerance and greedy_equal.all()),
    }


def _run_table(summary: Mapping[str, Any]) -> list[RenderableType]:
    heading = (
        f"{summary['num_requests']:,} requests, {summary['num_tokens']:,} tokens on backend "
        f"{summary['backend']!r} ({summary['config']['policy']})"
    )
    table = _grid()
    table.add_row("dispatches", f"{summary['num_dispatches']:,}")
    table.add_row(
        "time",
        f"{summary['seconds']:.2f} s ({summary['tokens_per_second']:,.0f} tokens/s)",
    )
    greedy = summary["greedy_token_ids"] or []
    more = f" ... ({len(greedy):,} in all)" if len(greedy) > 8 else ""
    table.add_row("greedy next tokens", " ".join(str(t) for t in greedy[:8]) + more)
    check = summary["verify"]
    if check is not None:
        verdict = "PASS" if check["passed"] else "FAIL"
        table.add_row(
            "verify vs one-shot",
            f"{verdict}: max |logit diff| {check['max_abs_logit_diff']:.3g} "
            f"(tolerance {check['tolerance']:.3g}), greedy tokens agree for "
            f"{check['greedy_agree']:,} of {summary['num_requests']:,} requests; one-shot "
            f"run {check['one_shot_seconds']:.2f} s",
        )
    return [heading, table]


# -- the parser ------------------------------------------------------------------------------


def _epilog(*commands: str, first_only: bool = False) -> str:
    lines = ["examples:"]
    for command in commands:
        for what, example in _EXAMPLES[command][: 1 if first_only else None]:
            lines.append(f"  # {what}")
            lines.append(f"  pypto-sched {example}")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="pypto-sched",
        description=textwrap.fill(
            "Plan chunked prefill: split prompts into dispatches within a token budget, "
            "compare settings, draw schedules and run them on a backend.",
            width=_HELP_WIDTH,
        ),
        epilog="Run 'pypto-sched COMMAND --help' for each command's options and examples.\n"
        "exit status: 0 success, 1 the work failed (e.g. --verify mismatch), 2 bad input\n\n"
        + _epilog(*_EXAMPLES, first_only=True),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(
        dest="command", required=True, parser_class=_Parser, metavar="COMMAND"
    )

    def command(name: str, summary: str, description: str) -> argparse.ArgumentParser:
        return commands.add_parser(
            name,
            help=summary,
            description=textwrap.fill(description, width=_HELP_WIDTH),
            epilog=_epilog(name),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )

    plan = command(
        "plan",
        "plan a batch and print a summary or the schedule",
        "Plan the prefill of a batch of prompts and print a summary, or the schedule as JSON.",
    )
    _add_workload_options(plan)
    _add_config_options(plan)
    _add_format_option(
        plan, 'text: a readable summary; json: the schedule in its JSON format with a "summary" key'
    )
    plan.set_defaults(handler=_cmd_plan)

    compare = command(
        "compare",
        "the same workload under several configurations, side by side",
        "Plan one workload under several configurations and tabulate, per configuration: "
        "dispatches, the lower bound and the ratio to it, mean and minimum utilization of "
        "max_num_batched_tokens, the largest dispatch in tokens, and the mean and worst "
        "dispatch index (0-based) at which requests finish. The configuration options give "
        "the base; each --config and each combination of --vary values changes it. Without "
        "either, both policies are compared. Settings are named as the options are (e.g. "
        "long-prefill-token-threshold) or by their short names: budget, threshold, batch, "
        "page, partial, policy; 0 or 'off' switches a limit off.",
    )
    _add_workload_options(compare)
    _add_config_options(compare)
    compare.add_argument(
        "--config",
        action="append",
        default=[],
        metavar="KEY=VALUE,...",
        help="one configuration: changes to the base, e.g. 'policy=packed,batch=16' "
        "(repeat for more rows)",
    )
    compare.add_argument(
        "--vary",
        action="append",
        default=[],
        metavar="KEY=V1,V2,...",
        help="one row per value, e.g. 'threshold=0,256,1024'; several --vary give every "
        "combination",
    )
    _add_format_option(compare, "text: a table; json: the configurations and their figures")
    compare.set_defaults(handler=_cmd_compare)

    plot = command(
        "plot",
        "draw a schedule as PNG or SVG (needs pypto-sched[plot])",
        "Draw a schedule: dispatches along x, requests down y, each chunk coloured by its "
        "size, final chunks (whose logits are sampled) marked in red, and the tokens per "
        "dispatch against the budget above. Small schedules are drawn chunk by chunk; large "
        "ones (thousands of dispatches) as an image.",
    )
    _add_workload_options(plot)
    _add_config_options(plot)
    plot.add_argument(
        "-o",
        "--output",
        required=True,
        metavar="FILE",
        help="the image to write; its suffix (.png or .svg) picks the format",
    )
    plot.add_argument("--width", type=int, default=1600, metavar="PX", help="default 1600")
    plot.add_argument("--height", type=int, default=900, metavar="PX", help="default 900")
    plot.add_argument("--dpi", type=int, default=100, help="text scale (default 100)")
    plot.add_argument(
        "--style",
        choices=("auto", "chunks", "raster"),
        default="auto",
        help="chunks: one rectangle per chunk; raster: an image, fast for thousands of "
        "dispatches; auto (default) picks by size",
    )
    plot.add_argument("--title", help="replace the default title")
    _add_format_option(plot, "text: one line; json: the file, its size and the style used")
    plot.set_defaults(handler=_cmd_plot)

    run = command(
        "run",
        "execute a schedule on an installed backend",
        "Plan a workload, run it dispatch by dispatch on an installed backend with random "
        "prompts (token ids drawn with --seed), and summarise: time, tokens per second, "
        "each request's greedy next token. --verify runs the same prompts as one dispatch "
        "(one-shot prefill) on the same backend and compares the final logits within the "
        "backend's tolerance; a mismatch exits with status 1.",
    )
    run.add_argument(
        "--backend",
        required=True,
        metavar="NAME",
        help="an installed backend (see 'pypto-sched backends')",
    )
    run.add_argument(
        "--backend-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="passed to the backend's factory; VALUE is read as JSON when it parses "
        "(numbers, true, null), else as a string (repeat for more)",
    )
    _add_workload_options(run)
    _add_config_options(run)
    run.add_argument(
        "--kv-page-size",
        type=int,
        default=0,
        metavar="N",
        help="KV cache page size (default: --page-size if set, else 16)",
    )
    run.add_argument("--verify", action="store_true", help="compare with one-shot prefill")
    run.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="show a progress bar on stderr (default: when stderr is a terminal)",
    )
    _add_format_option(run, "text: a summary; json: the summary as an object")
    run.set_defaults(handler=_cmd_run)

    backends = command(
        "backends",
        "list the installed backends",
        "List the backends installed under the 'pypto_sched.backends' entry point, and "
        "whether each can run on this machine.",
    )
    _add_format_option(backends, "text: a table; json: a list of objects")
    backends.set_defaults(handler=_cmd_backends)
    return parser


def _add_format_option(parser: argparse.ArgumentParser, help: str) -> None:
    parser.add_argument("--format", choices=("text", "json"), default="text", help=help)


def _add_workload_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("workload (one of --lengths, --workload)")
    source = group.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--lengths",
        metavar="LIST",
        help="prompt lengths, e.g. '3338x16' (16 prompts of 3338 tokens) or '100,200,50x3'; "
        "'@FILE' reads them from a file ('@-' from stdin)",
    )
    source.add_argument(
        "--lengths-file",
        metavar="PATH",
        help="read the prompt lengths from a file, in the --lengths syntax (same as "
        "--lengths @PATH)",
    )
    source.add_argument(
        "--workload",
        choices=WORKLOADS,
        help="a named synthetic workload: seed (prompts of 3338 tokens), uniform, lognormal "
        "(long-tailed), bimodal (4 in 5 short, 1 in 5 long)",
    )
    group.add_argument(
        "--num-requests", type=int, metavar="N", help="--workload: prompts (default 16)"
    )
    group.add_argument(
        "--min-length", type=int, metavar="N", help="--workload: shortest prompt (default 16)"
    )
    group.add_argument(
        "--max-length", type=int, metavar="N", help="--workload: longest prompt (default 4096)"
    )
    group.add_argument(
        "--seed",
        type=int,
        metavar="N",
        help="random seed of --workload (and of run's token ids); default 0",
    )
    group.add_argument(
        "--num-computed",
        metavar="LIST",
        help="tokens already cached per prompt (prefix hits), same syntax as --lengths",
    )


def _add_config_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("planner configuration (0 switches a limit off)")
    group.add_argument(
        "--max-num-batched-tokens",
        type=int,
        required=True,
        metavar="N",
        help="most tokens one dispatch may carry (required)",
    )
    group.add_argument(
        "--long-prefill-token-threshold",
        type=int,
        default=0,
        metavar="N",
        help="per-request chunk cap; round_robin also lowers the budget to it (0: off)",
    )
    group.add_argument(
        "--max-num-seqs",
        type=int,
        default=0,
        metavar="N",
        help="most rows per dispatch (0: no limit)",
    )
    group.add_argument(
        "--page-size",
        type=int,
        default=0,
        metavar="N",
        help="non-final chunks end on multiples of N (0: off)",
    )
    group.add_argument(
        "--policy",
        choices=POLICIES,
        default="round_robin",
        help="round_robin: the seed's behaviour (default); packed: co-scheduled chunks",
    )
    group.add_argument(
        "--max-num-partial-prefills",
        type=int,
        default=0,
        metavar="N",
        help="packed only: most requests part-way through prefill at once (0: no limit)",
    )


# -- entry point -----------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``pypto-sched``; returns the exit status."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        if _needs_rich(args):
            _console()  # fail now, with the fix, rather than after the work is done
        handler: Callable[[argparse.Namespace], int] = args.handler
        return handler(args)
    except UsageError as error:
        return _fail(error, EXIT_USAGE)
    except PyptoSchedError as error:
        # The library's input errors (lengths, configs, schedules, unknown backends) are
        # ValueErrors; the others (a backend failing mid-run) are failures of the work.
        return _fail(error, EXIT_USAGE if isinstance(error, ValueError) else EXIT_FAILED)
    except CommandFailed as error:
        return _fail(error, EXIT_FAILED)
    except BrokenPipeError:
        # The reader (e.g. `head`) went away: not an error of ours, and no traceback.
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - replaces the closed stream
        return EXIT_OK
    except KeyboardInterrupt:
        return _fail("interrupted", 130)


def _needs_rich(args: argparse.Namespace) -> bool:
    return bool(args.format == "text" or getattr(args, "progress", None))


def _fail(error: object, status: int) -> int:
    message = " ".join(str(error).split())  # one line, whatever the error held
    print(f"pypto-sched: error: {message}", file=sys.stderr)
    return status


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
