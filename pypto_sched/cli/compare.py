"""``pypto-sched compare``: one workload under several configurations, one table row each.

A configuration is the options as given, changed by one ``--config`` spec and one value of
each ``--vary``. Specs name settings by their option names or short names and are turned into
the arguments of :meth:`PlannerConfig.from_engine_args`, the one place where a threshold of 0
becomes "off".
"""

from __future__ import annotations

import argparse
import itertools
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..core._config import POLICIES, PlannerConfig
from ..core._errors import PyptoSchedError
from ..core._plan import plan_prefill
from ..core._schedule import Schedule
from . import _render
from ._errors import EXIT_OK, UsageError, flags_named
from ._inputs import check_size, engine_args, num_computed, workload, workload_flags
from ._options import (
    CONFIG_FLAGS,
    SEED,
    Example,
    Parser,
    add_command,
    add_config_options,
    add_format_option,
    add_workload_options,
    warn_retired,
)

if TYPE_CHECKING:
    from rich.console import RenderableType

__all__ = ["EXAMPLES", "add_parser", "configurations", "handle"]

EXAMPLES: list[Example] = [
    ("the seed's workload under both policies", f"compare {SEED} --max-num-seqs 16"),
    (
        "what the threshold does under packed",
        "compare --workload seed --max-num-batched-tokens 8192 \\\n"
        "      --policy packed --max-num-seqs 16 --vary threshold=0,256,1024",
    ),
    (
        "two hand-written configurations on 64 lognormal prompts",
        "compare --workload lognormal --num-requests 64 --seed 1 \\\n"
        "      --max-num-batched-tokens 8192 --config policy=round_robin,threshold=512 \\\n"
        "      --config policy=packed,max_num_seqs=32",
    ),
]

#: Short names accepted by ``--config`` and ``--vary``.
_KNOB_ALIASES = {
    "budget": "max_num_batched_tokens",
    "threshold": "long_prefill_token_threshold",
    "batch": "max_num_seqs",
    "align": "chunk_alignment",
    "partial": "max_num_partial_prefills",
}
#: Retired setting names, which still work (one line on stderr), and the names to use.
_RETIRED_KNOBS = {"page": "align", "page_size": "chunk-alignment"}
#: The settings, by their config names, and the table's column heads.
_KNOB_HEADS = {
    "policy": "policy",
    "max_num_batched_tokens": "budget",
    "long_prefill_token_threshold": "threshold",
    "max_num_seqs": "max batch",
    "chunk_alignment": "align",
    "max_num_partial_prefills": "partial",
}
#: "off" as the engine arguments spell it: a threshold of 0, no value for the others.
_OFF_WORDS = frozenset({"off", "none"})
_OFF = {"long_prefill_token_threshold": 0}

_COLUMNS = (
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


def add_parser(commands: argparse._SubParsersAction[Parser]) -> None:
    parser = add_command(
        commands,
        "compare",
        summary="the same workload under several configurations, side by side",
        description="Plan one workload under several configurations and tabulate, per "
        "configuration: dispatches, the lower bound and the ratio to it, mean and minimum "
        "utilization of max_num_batched_tokens, the largest dispatch in tokens, and the mean "
        "and worst dispatch index (0-based) at which requests finish. The configuration "
        "options give the base; each --config and each combination of --vary values changes "
        "it; a setting may appear once in a --config, in one --vary, and not in both a "
        "--config and a --vary. Without either (and without --policy), both policies are "
        "compared. Settings are "
        "named as the options "
        "are (e.g. long-prefill-token-threshold) or by their short names: budget, threshold, "
        "batch, align, partial, policy; 'off' switches a limit off (so does a threshold of 0).",
        examples=EXAMPLES,
    )
    add_workload_options(parser)
    add_config_options(parser)
    parser.set_defaults(policy=None)  # not given: both policies, without --config and --vary
    parser.add_argument(
        "--config",
        action="append",
        default=[],
        metavar="KEY=VALUE,...",
        help="one configuration: changes to the base, e.g. 'policy=packed,batch=16', each "
        "setting once (repeat for more rows)",
    )
    parser.add_argument(
        "--vary",
        action="append",
        default=[],
        metavar="KEY=V1,V2,...",
        help="one row per value, e.g. 'threshold=0,256,1024'; several --vary (of different "
        "settings) give every combination",
    )
    add_format_option(parser, "text: a table; json: the configurations and their figures")
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    lengths, source = workload(args)
    computed = num_computed(args)
    configs = configurations(args)
    for config in configs:
        check_size(lengths, computed, config)
    with flags_named(**workload_flags(args)):
        schedules = [plan_prefill(lengths, c, num_computed_tokens=computed) for c in configs]
    if args.format == "json":
        first = schedules[0]
        workload_data = {
            "source": source,
            "num_requests": first.num_requests,
            "num_tokens": first.num_tokens,
            "prompt_lengths": first.prompt_lengths.tolist(),
            "num_computed_tokens": first.num_computed_tokens.tolist(),
        }
        rows = [{"config": s.config.to_dict(), "summary": s.stats.to_dict()} for s in schedules]
        _render.print_json({"workload": workload_data, "configurations": rows})
        return EXIT_OK
    _render.emit(*_table(schedules, source))
    return EXIT_OK


# -- configuration specs ---------------------------------------------------------------------


def configurations(args: argparse.Namespace) -> list[PlannerConfig]:
    """The base configuration changed once per ``--config`` and ``--vary`` combination
    (both policies when neither is given)."""
    base = engine_args(args)
    if base["policy"] is None:  # not given: round_robin, as elsewhere
        base["policy"] = POLICIES[0]
    retired: set[str] = set()
    specs = [_parse_config_spec(spec, retired) for spec in args.config] or [{}]
    sweeps = [_parse_vary(spec, retired) for spec in args.vary]
    for old in sorted(retired):
        new = _RETIRED_KNOBS[old.lower().replace("-", "_")]
        warn_retired(f"the setting {old!r}", repr(new))
    _check_each_setting_once(specs, sweeps)
    if not args.config and not args.vary and args.policy is None:
        sweeps = [[{"policy": policy} for policy in POLICIES]]
    configs = []
    for spec in specs:
        for combination in itertools.product(*sweeps):
            # Each setting with the option that gave it: a --config, a --vary or its own flag.
            # (Without --config and --vary, the policies compared are not an option's.)
            sources = {k: f"--config {_setting(k)}" for k in spec}
            if args.vary:
                sources.update((k, f"--vary {_setting(k)}") for c in combination for k in c)
            overrides = {k: v for override in (spec, *combination) for k, v in override.items()}
            given = {k: flag for k, flag in CONFIG_FLAGS.items() if k not in overrides}
            try:
                with flags_named(**given, **sources):
                    configs.append(PlannerConfig.from_engine_args(**{**base, **overrides}))
            except UsageError as error:  # about one setting: a flag's, say in which row
                if not overrides or error.parameter in sources:  # --config's or --vary's
                    raise
                raise UsageError(f"{error} (in the row {_describe(overrides)})") from None
            except PyptoSchedError as error:  # about no one setting
                options = sorted({source.split()[0] for source in sources.values()})
                where = " and ".join([*options, f"configuration {_describe(overrides)}"])
                raise UsageError(f"{where}: {error}") from None
    return configs


def _setting(name: str) -> str:
    """A setting's name as its option spells it: ``max-num-batched-tokens``."""
    return CONFIG_FLAGS[name].removeprefix("--")


def _knob(key: str, option: str, retired: set[str]) -> str:
    """The config field a setting's ``key`` names (a retired name is added to ``retired``)."""
    name = key.strip().lower().replace("-", "_")
    if name in _RETIRED_KNOBS:
        retired.add(key.strip())  # (as the user wrote it)
        name = "chunk_alignment"
    name = _KNOB_ALIASES.get(name, name)
    if name not in _KNOB_HEADS:
        known = ", ".join([*map(_setting, _KNOB_HEADS), *_KNOB_ALIASES])
        raise UsageError(f"{option}: unknown setting {key!r}; known: {known}")
    return name


def _knob_value(name: str, text: str, option: str) -> object:
    text = text.strip()
    if name == "policy":
        return text
    if text.lower() in _OFF_WORDS and name != "max_num_batched_tokens":
        return _OFF.get(name)
    if text.isascii() and text.isdigit():
        return int(text)
    allowed = "an integer" if name == "max_num_batched_tokens" else "an integer or 'off'"
    raise UsageError(f"{option}: {_setting(name)} must be {allowed}: {text!r}")


def _parse_config_spec(spec: str, retired: set[str]) -> dict[str, object]:
    """``"policy=packed,batch=16"`` -> ``{"policy": "packed", "max_num_seqs": 16}``."""
    overrides: dict[str, object] = {}
    for item in spec.split(","):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--config: expected KEY=VALUE[,KEY=VALUE...], got {spec!r}")
        name = _knob(key, "--config", retired)
        if name in overrides:
            raise UsageError(f"--config: {_setting(name)} is given twice in {spec!r}")
        overrides[name] = _knob_value(name, value, "--config")
    return overrides


def _parse_vary(spec: str, retired: set[str]) -> list[dict[str, object]]:
    """``"threshold=0,256"`` -> ``[{"long_prefill_token_threshold": 0}, {...: 256}]``."""
    key, sep, values = spec.partition("=")
    if not sep or not key.strip() or not values.strip():
        raise UsageError(f"--vary: expected KEY=VALUE,VALUE..., got {spec!r}")
    name = _knob(key, "--vary", retired)
    sweep = [{name: _knob_value(name, value, "--vary")} for value in values.split(",")]
    for i, row in enumerate(sweep):
        if row in sweep[:i]:
            shown = _render.show(row[name])
            raise UsageError(f"--vary: {_setting(name)} {shown} is given twice in {spec!r}")
    return sweep


def _check_each_setting_once(
    specs: Sequence[Mapping[str, object]], sweeps: Sequence[Sequence[Mapping[str, object]]]
) -> None:
    """A row takes each setting from one place: two ``--vary`` of one setting, or a
    ``--config`` and a ``--vary`` of one, would leave all but the last value unused."""
    varied: set[str] = set()
    for sweep in sweeps:
        (name,) = sweep[0]
        if name in varied:
            raise UsageError(f"--vary: {_setting(name)} is varied twice; give its values once")
        varied.add(name)
    both = [name for name in _KNOB_HEADS if name in varied and any(name in s for s in specs)]
    if both:
        raise UsageError(
            f"--config and --vary both set {_setting(both[0])}: the --vary values would "
            "replace the --config ones; set it in one of them"
        )


def _describe(overrides: Mapping[str, object]) -> str:
    if not overrides:
        return "(the options as given)"
    return ",".join(f"{_KNOB_HEADS[k]}={_render.show(v)}" for k, v in overrides.items())


# -- the table -------------------------------------------------------------------------------


def _table(schedules: Sequence[Schedule], source: str) -> list[RenderableType]:
    """A heading (the workload and the settings all rows share), then one row per schedule:
    the settings that differ, then the figures that matter."""
    dicts: list[dict[str, Any]] = [s.config.to_dict() for s in schedules]
    varying = [k for k in _KNOB_HEADS if len({repr(d[k]) for d in dicts}) > 1] or ["policy"]
    shared = [
        f"{_KNOB_HEADS[k]} {_render.show(dicts[0][k])}"
        for k in _KNOB_HEADS
        if k not in varying and dicts[0][k] is not None
    ]
    first = schedules[0]
    heading = (
        f"{_render.counted(first.num_requests, 'request')}, "
        f"{_render.counted(first.num_tokens, 'token')} ({source})"
    )
    table = _render.table(*(_KNOB_HEADS[k] for k in varying), *_COLUMNS)
    for schedule, data in zip(schedules, dicts, strict=True):
        stats = schedule.stats
        table.add_row(
            *(_render.show(data[k]) for k in varying),
            f"{stats.num_dispatches:,}",
            f"{stats.lower_bound:,}",
            f"{stats.num_dispatches / stats.lower_bound:.2f}",
            _render.percent(stats.mean_utilization),
            _render.percent(stats.min_utilization),
            f"{stats.max_tokens_per_dispatch:,}",
            f"{stats.mean_finish_dispatch:,.1f}",
            f"{stats.worst_finish_dispatch:,}",
        )
    return [heading, "all rows: " + ", ".join(shared), table]
