"""Run vLLM V1's scheduler and pypto_sched's planner on the same workloads, side by side.

    PYPTO_SCHED_VLLM_PYTHON=/work/vllm-env/bin/python python benchmarks/bench_vs_vllm.py
    PYTHONPATH=. /work/vllm-env/bin/python benchmarks/bench_vs_vllm.py --quick

vLLM is not a dependency of this project. Point ``PYPTO_SCHED_VLLM_PYTHON`` at the interpreter
of an environment where vLLM is installed (``docs/benchmarks.md`` shows how to build one on
the CPU); the script then runs itself under that interpreter, with this repository on its
path, so that both sides run in one process and every step of each is timed in the same run.
Without vLLM it prints how to point it at one and exits 0; if the variable names an
interpreter that cannot be run, or one without vLLM, it says so in one line and exits 2.

Only vLLM's ``Scheduler`` is used (``vllm.v1.core.sched.scheduler``): no model runs. It gets a
dummy local model config (a tiny Qwen3 ``config.json``), prefix caching off, and a KV cache
config built by hand. Each request asks for one new token, so a request leaves as soon as its
prefill is done: every step is a prefill step. After each ``schedule()`` the script calls
``update_from_output()`` with a fake sampled token for each request whose prefill is complete.

It prints two tables.

1. **Dispatches**: the steps vLLM takes to prefill a batch that arrives at once, against
   ``plan_prefill`` under ``packed`` and ``round_robin`` with the same knobs
   (``max_num_batched_tokens``, ``long_prefill_token_threshold``, ``max_num_seqs``), and
   ``Schedule.lower_bound``. vLLM does not align chunks to its KV blocks, so the planner gets
   no ``chunk_alignment`` here. Each side is checked to have scheduled every prompt token exactly
   once. Target: ``packed`` never takes more dispatches than vLLM.
2. **Per-step cost** with 100, 1,000 and 10,000 requests in flight (prompts of 64 to 4,096
   tokens; a new request arrives for every one that finishes): median microseconds of
   vLLM's ``schedule()`` (which allocates KV blocks) against ``plan_step`` with a
   ``PagePool`` of as many pages as vLLM has blocks, and ``plan_step`` without a pool, all
   fed the same arrivals. The sides take turns going first, the three cases are stepped in
   turn (so all see the same load on the machine), and the script checks that the three
   plans hold the same rows at every step. vLLM's ``update_from_output()`` is timed separately,
   beside its counterpart here, giving the finished requests' pages back
   (``PagePool.release``). Targets: at 1,000 and 10,000 in flight ``plan_step`` with the
   pool is at least 10x faster than ``schedule()``, and its cost at the most requests in
   flight is at most 1.5x its cost at the fewest (it does not grow with the waiting queue).

It exits 1 if a target is missed (``--no-check``: report only). Timings are wall-clock
medians on a possibly busy machine: the ratios matter, not the absolute times; the load
average is printed with them.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from _targets import growth_miss

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # (vllm_driver)

from pypto_sched import (
    POLICIES,
    PagePool,
    PlannerConfig,
    Policy,
    PrefillState,
    Schedule,
    StepPlan,
    plan_prefill,
    plan_step,
)
from pypto_sched.core._workloads import synthetic_lengths

#: The interpreter of an environment with vLLM installed.
VLLM_PYTHON = "PYPTO_SCHED_VLLM_PYTHON"
#: Set in the environment of the run under that interpreter (it must find vLLM).
_CHILD = "PYPTO_SCHED_BENCH_VS_VLLM_CHILD"
ROOT = Path(__file__).resolve().parent.parent

BLOCK_SIZE = 16
MIN_SPEEDUP = 10.0
SPEEDUP_AT = (1_000, 10_000)
IN_FLIGHT = (100, 1_000, 10_000)
STEP_PROMPTS = (64, 4_096)
STEP_NUM_BLOCKS = 16_384


class Knobs(NamedTuple):
    """The limits both sides get, in the planner's terms."""

    max_num_batched_tokens: int
    long_prefill_token_threshold: int
    max_num_seqs: int

    def config(self, policy: Policy) -> PlannerConfig:
        return PlannerConfig(
            max_num_batched_tokens=self.max_num_batched_tokens,
            long_prefill_token_threshold=self.long_prefill_token_threshold,
            max_num_seqs=self.max_num_seqs,
            policy=policy,
        )

    def describe(self) -> str:
        return (
            f"{self.max_num_batched_tokens:,} / {self.long_prefill_token_threshold:,} / "
            f"{self.max_num_seqs}"
        )


#: The knobs of the per-step cases.
STEP_KNOBS = Knobs(max_num_batched_tokens=2_048, long_prefill_token_threshold=512, max_num_seqs=64)


class Workload(NamedTuple):
    name: str
    lengths: list[int]
    knobs: Knobs


def make_workloads(*, quick: bool) -> list[Workload]:
    many = 300 if quick else 1_000
    rng = np.random.default_rng(0)
    short = synthetic_lengths("uniform", num_requests=many, min_length=16, max_length=512, seed=3)
    mixed = short.tolist()
    for position in sorted(rng.choice(many, size=12, replace=False).tolist(), reverse=True):
        mixed.insert(position, 32_768)

    def drawn(name: str, count: int, low: int, high: int, seed: int) -> list[int]:
        lengths = synthetic_lengths(
            name, num_requests=count, min_length=low, max_length=high, seed=seed
        )
        return [int(length) for length in lengths]

    return [
        Workload("seed 16 x 3,338", [3_338] * 16, Knobs(8_192, 256, 16)),
        Workload(
            f"lognormal {many:,} (16-16,384)",
            drawn("lognormal", many, 16, 16_384, 1),
            Knobs(8_192, 1_024, 256),
        ),
        Workload(
            "lognormal 100 (64-32,768)",
            drawn("lognormal", 100, 64, 32_768, 2),
            Knobs(4_096, 512, 64),
        ),
        Workload(
            f"uniform {many:,} (1-8,192)",
            drawn("uniform", many, 1, 8_192, 4),
            Knobs(8_192, 2_048, 256),
        ),
        Workload(
            f"bimodal {many:,} (16-8,192)",
            drawn("bimodal", many, 16, 8_192, 5),
            Knobs(8_192, 1_024, 128),
        ),
        Workload(f"12 x 32,768 among {many:,} short", mixed, Knobs(2_048, 512, 64)),
    ]


# -- vLLM's side ----------------------------------------------------------------------------


class Vllm(NamedTuple):
    """The vLLM modules the benchmark uses (untyped: vLLM is not installed for mypy)."""

    torch: Any
    config: Any
    sampling: Any
    scheduler: Any
    kv: Any
    outputs: Any
    request: Any
    structured: Any

    @classmethod
    def load(cls) -> Vllm:
        os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        # vLLM leaves its loggers unconfigured outside its engine, so its notes on what the
        # CPU lacks (Triton, its CUDA kernels: the scheduler needs neither) would reach
        # standard error through logging's last resort.
        logging.getLogger("vllm").setLevel(logging.ERROR)
        names = (
            "torch",
            "vllm.config",
            "vllm.sampling_params",
            "vllm.v1.core.sched.scheduler",
            "vllm.v1.kv_cache_interface",
            "vllm.v1.outputs",
            "vllm.v1.request",
            "vllm.v1.structured_output",
        )
        return cls(*(importlib.import_module(name) for name in names))


class VllmScheduler:
    """vLLM V1's ``Scheduler`` over a dummy model, fed prefill-only requests."""

    def __init__(self, vllm: Vllm, knobs: Knobs, *, num_blocks: int, max_model_len: int):
        # (Imported here: vllm_driver imports vLLM, which only the rerun under its Python has.)
        from vllm_driver import write_model_config

        self.vllm = vllm
        with tempfile.TemporaryDirectory() as model_dir:
            write_model_config(Path(model_dir), max_model_len=max_model_len)
            config = self.make_config(knobs, Path(model_dir), num_blocks, max_model_len)
        group = vllm.kv.KVCacheGroupSpec(
            ["layer"],
            vllm.kv.FullAttentionSpec(
                block_size=BLOCK_SIZE, num_kv_heads=1, head_size=1, dtype=vllm.torch.float32
            ),
        )
        kv_cache = vllm.kv.KVCacheConfig(
            num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=[group]
        )
        self.scheduler = vllm.scheduler.Scheduler(
            vllm_config=config,
            kv_cache_config=kv_cache,
            structured_output_manager=vllm.structured.StructuredOutputManager(config),
            block_size=BLOCK_SIZE,
        )
        self.one_token = vllm.sampling.SamplingParams(max_tokens=1, ignore_eos=True)

    def make_config(
        self, knobs: Knobs, model_dir: Path, num_blocks: int, max_model_len: int
    ) -> Any:
        config = self.vllm.config
        scheduler = config.SchedulerConfig(
            max_num_batched_tokens=knobs.max_num_batched_tokens,
            long_prefill_token_threshold=knobs.long_prefill_token_threshold,
            max_num_seqs=knobs.max_num_seqs,
            max_model_len=max_model_len,
            enable_chunked_prefill=True,
            is_encoder_decoder=False,
        )
        model = config.ModelConfig(
            model=str(model_dir),
            skip_tokenizer_init=True,
            dtype="float32",
            max_model_len=max_model_len,
        )
        cache = config.CacheConfig(block_size=BLOCK_SIZE, enable_prefix_caching=False)
        cache.num_gpu_blocks = num_blocks
        vllm_config = config.VllmConfig(
            scheduler_config=scheduler, model_config=model, cache_config=cache
        )
        # The platform may adjust a config: the comparison holds only if it kept the knobs.
        got = vllm_config.scheduler_config
        kept = (
            got.max_num_batched_tokens,
            got.long_prefill_token_threshold,
            got.max_num_seqs,
            got.enable_chunked_prefill,
            vllm_config.cache_config.block_size,
            vllm_config.cache_config.enable_prefix_caching,
        )
        if kept != (*knobs, True, BLOCK_SIZE, False):
            raise SystemExit(f"vLLM changed the scheduler's knobs {knobs}: {kept}")
        return vllm_config

    def add(self, request_id: int, length: int) -> None:
        request = self.vllm.request.Request(
            request_id=str(request_id),
            prompt_token_ids=[0] * length,
            sampling_params=self.one_token,
            pooling_params=None,
        )
        self.scheduler.add_request(request)

    def schedule(self) -> Any:
        return self.scheduler.schedule()

    def update(self, output: Any) -> None:
        """Feed back one sampled token for each request whose prefill is now complete."""
        requests = self.scheduler.requests
        ids = list(output.num_scheduled_tokens)
        sampled = [
            [1] if requests[i].num_computed_tokens >= requests[i].num_prompt_tokens else []
            for i in ids
        ]
        runner_output = self.vllm.outputs.ModelRunnerOutput(
            req_ids=ids,
            req_id_to_index={request_id: index for index, request_id in enumerate(ids)},
            sampled_token_ids=sampled,
        )
        self.scheduler.update_from_output(output, runner_output)

    def has_requests(self) -> bool:
        return bool(self.scheduler.has_requests())


# -- dispatches -----------------------------------------------------------------------------


class Dispatches(NamedTuple):
    workload: Workload
    vllm: int
    packed: int
    round_robin: int
    lower_bound: int

    @property
    def ratio(self) -> float:
        return self.packed / self.vllm


def vllm_steps(vllm: Vllm, workload: Workload) -> int:
    """Steps vLLM's scheduler takes to prefill the workload, after checking it ran every
    prompt token exactly once."""
    lengths = workload.lengths
    blocks = sum(-(-length // BLOCK_SIZE) for length in lengths) + len(lengths)
    side = VllmScheduler(
        vllm, workload.knobs, num_blocks=blocks, max_model_len=max(lengths) + BLOCK_SIZE
    )
    for request_id, length in enumerate(lengths):
        side.add(request_id, length)
    ran = [0] * len(lengths)
    steps = 0
    while side.has_requests():
        output = side.schedule()
        for request_id, tokens in output.num_scheduled_tokens.items():
            ran[int(request_id)] += tokens
        steps += output.total_num_scheduled_tokens > 0
        side.update(output)
    if ran != lengths:
        raise SystemExit(f"{workload.name}: vLLM did not prefill every prompt token once")
    return steps


def check_tiles(schedule: Schedule, workload: Workload) -> None:
    ran = np.bincount(schedule.requests, weights=schedule.lengths, minlength=len(workload.lengths))
    if ran.astype(np.int64).tolist() != workload.lengths:
        raise SystemExit(f"{workload.name}: the planner did not prefill every prompt token once")


def compare_dispatches(vllm: Vllm, workload: Workload) -> Dispatches:
    schedules: dict[Policy, Schedule] = {}
    for policy in POLICIES:
        schedule = plan_prefill(workload.lengths, workload.knobs.config(policy))
        check_tiles(schedule, workload)
        schedules[policy] = schedule
    return Dispatches(
        workload=workload,
        vllm=vllm_steps(vllm, workload),
        packed=schedules["packed"].num_dispatches,
        round_robin=schedules["round_robin"].num_dispatches,
        lower_bound=schedules["packed"].lower_bound,
    )


def format_dispatches(results: Sequence[Dispatches]) -> str:
    header = (
        "workload",
        "budget / threshold / seqs",
        "vLLM",
        "packed",
        "bound",
        "round_robin",
        "packed/vLLM",
        "",
    )
    rows = [header]
    for result in results:
        rows.append(
            (
                result.workload.name,
                result.workload.knobs.describe(),
                f"{result.vllm:,}",
                f"{result.packed:,}",
                f"{result.lower_bound:,}",
                f"{result.round_robin:,}",
                f"{result.ratio:.3f}",
                "ok" if result.packed <= result.vllm else "MISSED: more than vLLM",
            )
        )
    return format_table(rows, text_columns=(0, 1, len(header) - 1))


# -- per-step cost --------------------------------------------------------------------------


class StepCost(NamedTuple):
    in_flight: int
    rows_per_step: float
    schedule_us: float
    update_us: float
    pool_us: float
    release_us: float
    plain_us: float

    @property
    def speedup(self) -> float:
        """vLLM's ``schedule()`` over ``plan_step`` with the pool."""
        return self.schedule_us / self.pool_us


def median_us(samples: list[int]) -> float:
    return statistics.median(samples) / 1e3


class StepCase:
    """One number of requests in flight, kept on both sides: vLLM's scheduler, a state
    stepped with a page pool and a state stepped without one, fed the same arrivals."""

    def __init__(self, vllm: Vllm, in_flight: int, steps: int) -> None:
        self.config = STEP_KNOBS.config("packed")
        self.in_flight = in_flight
        self.vllm = VllmScheduler(
            vllm, STEP_KNOBS, num_blocks=STEP_NUM_BLOCKS, max_model_len=STEP_PROMPTS[1] + BLOCK_SIZE
        )
        self.state: PrefillState[int] = PrefillState()
        self.plain: PrefillState[int] = PrefillState()
        self.pool: PagePool[int] = PagePool(num_pages=STEP_NUM_BLOCKS, page_size=BLOCK_SIZE)
        rng = np.random.default_rng(in_flight)
        size = in_flight + STEP_KNOBS.max_num_seqs * steps  # a step finishes at most that many
        self.arrivals = iter(rng.integers(*STEP_PROMPTS, endpoint=True, size=size).tolist())
        self.next_id = 0
        self.times: dict[str, list[int]] = {key: [] for key in StepCost._fields[2:]}
        self.rows = 0
        for _ in range(in_flight):
            self.arrive()

    def arrive(self) -> None:
        length = next(self.arrivals)
        self.vllm.add(self.next_id, length)
        self.state = self.state.add(self.next_id, length)
        self.plain = self.plain.add(self.next_id, length)
        self.next_id += 1

    def step(self, *, vllm_first: bool) -> None:
        """One step of each side, timed, after checking that they plan the same rows."""
        if vllm_first:
            theirs = self.vllm_step()
            plan, plain_plan = self.our_step()
        else:
            plan, plain_plan = self.our_step()
            theirs = self.vllm_step()
        ours = {request_id: chunk.length for request_id, chunk in plan.rows.items()}
        plain_rows = {request_id: chunk.length for request_id, chunk in plain_plan.rows.items()}
        if not ours == theirs == plain_rows:
            raise SystemExit(f"{self.in_flight:,} in flight: vLLM and plan_step planned other rows")
        self.rows += len(ours)
        self.state, self.plain = plan.state, plain_plan.state
        for _ in plan.finished:  # keep the number in flight
            self.arrive()

    def vllm_step(self) -> dict[int, int]:
        clock = time.perf_counter_ns
        start = clock()
        output = self.vllm.schedule()
        scheduled = clock()
        self.vllm.update(output)
        self.times["update_us"].append(clock() - scheduled)
        self.times["schedule_us"].append(scheduled - start)
        return {int(request_id): n for request_id, n in output.num_scheduled_tokens.items()}

    def our_step(self) -> tuple[StepPlan[int], StepPlan[int]]:
        clock = time.perf_counter_ns
        start = clock()
        plan = plan_step(self.state, self.config, pool=self.pool)
        planned = clock()
        assert plan.pool is not None
        pool = plan.pool
        for request_id in plan.finished:
            pool = pool.release(request_id)
        released = clock()
        plain_plan = plan_step(self.plain, self.config)
        self.times["plain_us"].append(clock() - released)
        self.times["pool_us"].append(planned - start)
        self.times["release_us"].append(released - planned)
        self.pool = pool
        return plan, plain_plan

    def result(self) -> StepCost:
        steps = len(self.times["pool_us"])
        medians = (median_us(self.times[key]) for key in StepCost._fields[2:])
        return StepCost(self.in_flight, self.rows / steps, *medians)


def measure_steps(vllm: Vllm, steps: int) -> list[StepCost]:
    """Step every case of ``IN_FLIGHT`` in turn, so that all see the same load on the
    machine; in every other step vLLM goes first (neither side always finds the caches the
    other left)."""
    cases = [StepCase(vllm, in_flight, steps) for in_flight in IN_FLIGHT]
    for step in range(steps):
        for case in cases:
            case.step(vllm_first=step % 2 == 0)
    return [case.result() for case in cases]


def format_steps(results: Sequence[StepCost]) -> str:
    header = (
        "in flight",
        "rows/step",
        "vLLM schedule us",
        "plan_step+pool us",
        "plan_step us",
        "schedule/plan_step+pool",
        "schedule/plan_step",
        "vLLM update us",
        "release us",
    )
    rows = [header]
    for result in results:
        rows.append(
            (
                f"{result.in_flight:,}",
                f"{result.rows_per_step:.1f}",
                f"{result.schedule_us:.1f}",
                f"{result.pool_us:.1f}",
                f"{result.plain_us:.1f}",
                f"{result.speedup:.1f}x",
                f"{result.schedule_us / result.plain_us:.1f}x",
                f"{result.update_us:.1f}",
                f"{result.release_us:.1f}",
            )
        )
    return format_table(rows, text_columns=())


# -- report ---------------------------------------------------------------------------------


def format_table(rows: Sequence[Sequence[str]], *, text_columns: Sequence[int]) -> str:
    """Columns aligned: text left, numbers right; a rule under the header."""
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    lines = [
        "  ".join(
            cell.ljust(width) if column in text_columns else cell.rjust(width)
            for column, (cell, width) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in rows
    ]
    lines.insert(1, "-" * max(len(line) for line in lines))
    return "\n".join(lines)


def load_average() -> str:
    return "load average " + " ".join(f"{load:.2f}" for load in os.getloadavg())


def misses(dispatches: Sequence[Dispatches], costs: Sequence[StepCost]) -> list[str]:
    found = [
        f"{result.workload.name}: packed takes {result.packed:,} dispatches, vLLM {result.vllm:,}"
        for result in dispatches
        if result.packed > result.vllm
    ]
    found += [
        f"{cost.in_flight:,} in flight: plan_step with the pool is {cost.speedup:.1f}x faster "
        f"than vLLM's schedule(), not {MIN_SPEEDUP:g}x"
        for cost in costs
        if cost.in_flight in SPEEDUP_AT and cost.speedup < MIN_SPEEDUP
    ]
    fewest, most = costs[0], costs[-1]
    grew = growth_miss(
        "plan_step with the pool",
        (f"{fewest.in_flight:,} in flight", fewest.pool_us),
        (f"{most.in_flight:,} in flight", most.pool_us),
    )
    return found if grew is None else [*found, grew]


def run(args: argparse.Namespace) -> int:
    vllm = Vllm.load()
    version = importlib.import_module("vllm").__version__
    print(f"vLLM {version} V1 scheduler vs pypto_sched; {load_average()}\n")
    dispatches = [compare_dispatches(vllm, w) for w in make_workloads(quick=args.quick)]
    print("Dispatches to prefill a batch (every request asks for 1 new token)")
    print(format_dispatches(dispatches))
    met = sum(result.packed == result.lower_bound for result in dispatches)
    print(f"packed meets the lower bound on {met} of {len(dispatches)} workloads\n")
    steps = args.steps or (200 if args.quick else 2_000)
    costs = measure_steps(vllm, steps)
    print(
        f"Per-step cost, median of {steps:,} steps (prompts {STEP_PROMPTS[0]}-"
        f"{STEP_PROMPTS[1]:,}, budget / threshold / seqs {STEP_KNOBS.describe()}, "
        f"{STEP_NUM_BLOCKS:,} KV blocks of {BLOCK_SIZE}); same rows checked every step"
    )
    print(format_steps(costs))
    print(load_average())
    found = misses(dispatches, costs)
    for miss in found:
        print(f"MISSED: {miss}")
    return 1 if found and not args.no_check else 0


def rerun_under(python: str, argv: Sequence[str]) -> int:
    """Run this script under ``python`` (an environment with vLLM) and return its status
    (2, with one line, if ``python`` cannot be run)."""
    env = dict(os.environ)
    env[_CHILD] = "1"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    try:
        return subprocess.run([python, __file__, *argv], env=env, check=False).returncode
    except OSError as error:
        print(f"error: {VLLM_PYTHON}={python} cannot be run: {error.strerror}", file=sys.stderr)
        return 2


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="smaller batches, 200 steps")
    parser.add_argument("--steps", type=int, help="steps timed per case (default 2,000)")
    parser.add_argument(
        "--no-check", action="store_true", help="report only: exit 0 even if a target is missed"
    )
    args = parser.parse_args(argv)
    if args.steps is not None and args.steps < 1:
        parser.error(f"--steps must be >= 1: {args.steps}")
    if importlib.util.find_spec("vllm") is not None:
        return run(args)
    if os.environ.get(_CHILD):
        print(f"error: vLLM is not importable by {sys.executable}", file=sys.stderr)
        return 2
    python = os.environ.get(VLLM_PYTHON)
    if python:
        return rerun_under(python, sys.argv[1:] if argv is None else argv)
    print(
        f"vLLM not found: set {VLLM_PYTHON} to the python of an environment with vLLM "
        "(docs/benchmarks.md); skipped"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
