"""``--replicas N``: the partition of a batch (``plan``, no Ray needed) and running it on Ray
replicas (``run``, ``generate``), with one progress bar over all of them.

Everything but the options and the output is the library's:
:func:`~pypto_sched.partition_requests` and :mod:`pypto_sched.integrations.ray`.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from ..core._config import PlannerConfig
from ..core._partition import partition_requests
from ..core._plan import plan_prefill
from ..core._validate import check_int
from ..runtime._generate import GenerationResult
from . import _progress, _render
from ._errors import CommandFailed, UsageError, building_backend, flags_named
from ._options import Once
from ._render import console
from ._specs import backend_options

if TYPE_CHECKING:
    from rich.console import RenderableType

    from ..integrations.ray import BatchProgress, RayReplicas
    from ..runtime.prompts import PromptRequest

__all__ = [
    "MAX_REPLICAS",
    "add_replica_options",
    "check_replicas",
    "describe",
    "generate_on",
    "optional_replicas",
    "partition_summary",
    "partition_table",
    "progress_bar",
    "replicas",
    "resources",
]


#: Most replicas a command splits a batch over: ``plan`` partitions and plans 100,000 in
#: about a second; a Ray cluster of more actors, each holding a model, is not in sight.
MAX_REPLICAS = 100_000


def add_replica_options(parser: argparse.ArgumentParser, *, runs: bool) -> None:
    """``--replicas`` (and, for commands that run, ``--ray-address``)."""
    group = parser.add_argument_group("replicas")
    if runs:
        group.add_argument(
            "--replicas",
            action=Once,
            type=int,
            metavar="N",
            help=f"split the batch by tokens (longest first) over N Ray actors (N <= "
            f"{MAX_REPLICAS}), one backend each; starts a local Ray instance unless "
            "--ray-address is given (needs 'pypto-sched[ray]')",
        )
        group.add_argument(
            "--ray-address",
            action=Once,
            metavar="ADDRESS",
            help="with --replicas: join this Ray cluster ('auto': the one this machine is in)",
        )
        group.add_argument(
            "--replica-resource",
            action="append",
            default=[],
            metavar="NAME=AMOUNT",
            help="with --replicas: what each actor asks Ray for, e.g. NPU=1, GPU=1, CPU=2 "
            "(repeat for more; default NPU=1 for the npu backend where the cluster has NPUs "
            "and its device option is not cpu, else CPU=1)",
        )
    else:
        group.add_argument(
            "--replicas",
            action=Once,
            type=int,
            metavar="N",
            help=f"also show how the batch splits over N replicas (N <= {MAX_REPLICAS}), by "
            "tokens, longest first (nothing runs; no Ray needed); the text table shows the "
            "first 16 replicas, --format json all of them",
        )


def check_replicas(args: argparse.Namespace) -> int | None:
    """``--replicas`` as given (``None`` when left out); a usage error when outside
    ``[1, MAX_REPLICAS]`` or when ``--ray-address`` comes without it."""
    count: int | None = args.replicas
    if count is not None:
        with flags_named(num_replicas="--replicas"):
            check_int("num_replicas", count, min_value=1, max_value=MAX_REPLICAS)
    if count is None and getattr(args, "ray_address", None) is not None:
        raise UsageError("--ray-address: only with --replicas")
    if count is None and getattr(args, "replica_resource", None):
        raise UsageError("--replica-resource: only with --replicas")
    return count


def resources(specs: list[str]) -> dict[str, float] | None:
    """``--replica-resource NAME=AMOUNT`` options as a mapping (``None`` when none given)."""
    if not specs:
        return None
    parsed: dict[str, float] = {}
    for spec in specs:
        name, _, amount = spec.partition("=")
        try:
            value = float(amount)
        except ValueError:
            value = math.nan
        if not name.strip() or not math.isfinite(value) or value < 0:
            raise UsageError(
                f"--replica-resource: must be NAME=AMOUNT with an AMOUNT >= 0: {spec!r}"
            )
        parsed[name.strip()] = value
    return parsed


# -- plan --replicas ------------------------------------------------------------------------


def partition_summary(
    lengths: npt.NDArray[np.int64],
    computed: npt.NDArray[np.int64],
    num_replicas: int,
    config: PlannerConfig,
) -> dict[str, Any]:
    """The partition of a prefill batch as ``plan --replicas`` reports it (JSON-ready)."""
    partition = partition_requests(lengths, num_replicas, num_computed_tokens=computed)
    dispatches = [
        plan_prefill(lengths[part], config, num_computed_tokens=computed[part]).num_dispatches
        if part.size
        else 0
        for part in partition.parts
    ]
    return {
        "num_replicas": num_replicas,
        "makespan": partition.makespan,
        "lower_bound": partition.lower_bound,
        "imbalance": partition.imbalance,
        "replicas": [
            {"requests": part.tolist(), "tokens": int(load), "dispatches": count}
            for part, load, count in zip(partition.parts, partition.loads, dispatches, strict=True)
        ],
    }


def partition_table(summary: Mapping[str, Any], *, limit: int = 16) -> list[RenderableType]:
    """The partition as a table: per replica (the first ``limit``), its requests, tokens and
    dispatches, and a note if cut."""
    heading = (
        f"{summary['num_replicas']:,} replicas, longest first by tokens: makespan "
        f"{summary['makespan']:,} tokens, lower bound {summary['lower_bound']:,} "
        f"({summary['imbalance']:.2f}x)"
    )
    table = _render.table("replica", "requests", "tokens", "dispatches", "first requests")
    replicas = summary["replicas"]
    for i, replica in enumerate(replicas[:limit]):
        requests = replica["requests"]
        more = " ..." if len(requests) > 6 else ""
        table.add_row(
            f"{i:,}",
            f"{len(requests):,}",
            f"{replica['tokens']:,}",
            f"{replica['dispatches']:,}",
            " ".join(str(r) for r in requests[:6]) + more,
        )
    if len(replicas) > limit:
        return [heading, table, f"... and {len(replicas) - limit:,} more (see --format json)"]
    return [heading, table]


# -- run --replicas / generate --replicas ------------------------------------------------------


@contextmanager
def replicas(
    args: argparse.Namespace, backend: str, options: Mapping[str, Any], count: int
) -> Iterator[RayReplicas]:
    """Ray replicas of ``backend`` for the command: joins ``--ray-address``, else the running
    local instance, else starts one and stops it at the end."""
    asked = resources(args.replica_resource)
    try:
        from ..integrations.ray import RayReplicas, ray_session
    except ImportError as error:
        raise CommandFailed(
            f"--replicas needs Ray: pip install 'pypto-sched[ray]' ({error})"
        ) from None
    # Ray's own start-up lines (INFO, a note on token authentication) stay off stderr.
    init = {"include_dashboard": False, "log_to_driver": False, "logging_level": "ERROR"}
    with ray_session(args.ray_address, **init):
        # The actors build the backend: its failures read as they do in one process.
        with (
            flags_named(name="--backend"),
            building_backend(backend, options),
            flags_named(resources="--replica-resource"),
        ):
            pool = RayReplicas(backend, num_replicas=count, options=options, resources=asked)
        with pool:
            yield pool


@contextmanager
def optional_replicas(args: argparse.Namespace) -> Iterator[RayReplicas | None]:
    """The command's replicas with ``--replicas``, else ``None`` (it runs in this process)."""
    count = check_replicas(args)
    if count is None:
        yield None
        return
    with replicas(args, args.backend, backend_options(args.backend_option), count) as pool:
        yield pool


def progress_bar(
    args: argparse.Namespace,
) -> Callable[[str], Any]:
    """``progress(label)``: a context whose value is an ``on_progress`` callback, drawn as
    :func:`pypto_sched.cli._progress.wanted` says."""
    if not _progress.wanted(args):
        return _no_batch_bar
    return lambda label: _batch_bar(label, forced=args.progress is not None)


@contextmanager
def _no_batch_bar(_label: str) -> Iterator[Callable[[BatchProgress], None]]:
    yield lambda _progress: None


@contextmanager
def _batch_bar(label: str, *, forced: bool) -> Iterator[Callable[[BatchProgress], None]]:
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    err = console(stderr=True)
    if forced:
        err = type(err)(file=sys.stderr, force_terminal=True, width=err.width, markup=False)
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.fields[status]}"),
        TimeElapsedColumn(),
        console=err,
        transient=True,
    ) as progress:
        task = progress.add_task(label, total=None, status="starting")

        def update(done: BatchProgress) -> None:
            status = (
                f"{done.num_requests_done:,}/{done.num_requests:,} requests, "
                f"{done.num_tokens_done:,}/{done.num_tokens:,} tokens, "
                f"{len(done.replicas)} replicas (spread {done.spread:.0%})"
            )
            progress.update(
                task, completed=done.num_tokens_done, total=done.num_tokens, status=status
            )

        yield update


def describe(replicas: Mapping[str, Any]) -> str:
    """One line on how the batch was split (a summary's ``"replicas"``)."""
    loads = ", ".join(f"{load:,}" for load in replicas["tokens"])
    restarts = replicas["num_restarts"]
    replaced = f"; {restarts} actors replaced" if restarts else ""
    return (
        f"{replicas['num_replicas']} (tokens {loads}; {replicas['imbalance']:.2f}x the lower "
        f"bound{replaced})"
    )


def generate_on(
    pool: RayReplicas,
    requests: Sequence[PromptRequest],
    *,
    config: PlannerConfig,
    stop_token_ids: Collection[int],
    num_kv_pages: int | None,
    kv_page_size: int,
    on_progress: Callable[[BatchProgress], None],
) -> tuple[GenerationResult, dict[str, Any]]:
    """``generate``'s execution on Ray replicas (``--replicas``), each request with its own
    sampling; ``num_kv_pages`` is each replica's. Returns the result and the replicas'
    figures for the summary."""
    result = pool.generate(
        [r.token_ids for r in requests],
        config=config,
        max_new_tokens=[r.max_new_tokens for r in requests],
        sampling=[r.sampling for r in requests],
        stop_token_ids=stop_token_ids,
        request_stop_token_ids=[r.stop_token_ids for r in requests],
        num_kv_pages=num_kv_pages,
        kv_page_size=kv_page_size,
        on_progress=on_progress,
    )
    replicas = {
        "num_replicas": pool.num_replicas,
        "tokens": [int(load) for load in result.partition.loads],
        "imbalance": result.partition.imbalance,
        "num_restarts": result.num_restarts,
    }
    return GenerationResult(sequences=result.sequences, stats=result.total_stats), replicas
