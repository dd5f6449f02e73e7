"""``pypto-sched generate``: offline batch generation from a JSON Lines file of prompts.

The command parses, calls the library and renders: :func:`~pypto_sched.prompts.read_prompts`
reads and checks the prompts (text and ``"messages"`` through the checkpoint's tokenizer and
chat template, :mod:`._model`), :func:`~pypto_sched.generate` runs them (its ``on_dispatch``
feeds the progress bar, its ``on_finish`` the output, :mod:`._job`), and
:func:`~pypto_sched.integrations.hf_verify.verify_greedy_generation` is ``--verify``. The
whole execution is the one call in :func:`execute`, so that another way of running the batch
(several replicas) replaces one function.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Collection, Sequence
from typing import TYPE_CHECKING, Any

from ..core._config import PlannerConfig
from ..core._sampling import SamplingParams
from ..integrations.hf_verify import verify_greedy_generation
from ..runtime._generate import GeneratedSequence, GenerationResult, generate
from ..runtime._llm import DEFAULT_MAX_NUM_BATCHED_TOKENS
from ..runtime.backends import Backend, max_positions, relative_tolerance
from ..runtime.execute import DEFAULT_PAGE_SIZE, DispatchDone
from ..runtime.output import PARTIAL_SUFFIX
from ..runtime.prompts import PromptRequest, eos_token_ids, read_prompts
from . import _job, _model, _replicas
from ._errors import EXIT_FAILED, EXIT_OK, UsageError, check_counts, flags_named
from ._inputs import config as planner_config
from ._lengths import read_text
from ._options import Example, Parser, add_command, add_config_options
from ._progress import generation_bar
from ._render import generation_summary
from ._specs import load_backend_from_args

if TYPE_CHECKING:
    from ..integrations.ray import RayReplicas

__all__ = ["EXAMPLES", "FLAGS", "add_parser", "execute", "handle"]

EXAMPLES: list[Example] = [
    (
        "greedy, prompts chunked by 16 tokens, on the NumPy reference backend",
        "generate --backend reference --prompts prompts.jsonl \\\n"
        "      --max-new-tokens 8 --max-num-batched-tokens 64 \\\n"
        "      --long-prefill-token-threshold 16",
    ),
    (
        "sampled, over a KV pool of 12 pages of 4 tokens, written to a file",
        "generate --backend reference --prompts prompts.jsonl \\\n"
        "      --max-new-tokens 8 --max-num-batched-tokens 64 \\\n"
        "      --kv-page-size 4 --num-kv-pages 12 --temperature 0.8 --top-p 0.95 \\\n"
        "      --sampling-seed 1 --output out.jsonl",
    ),
    (
        "a Hugging Face checkpoint, checked token for token against transformers",
        "generate --backend reference \\\n"
        "      --backend-option checkpoint=/models/qwen3 \\\n"
        "      --prompts prompts.jsonl --max-new-tokens 32 \\\n"
        "      --max-num-batched-tokens 512 --verify",
    ),
]


#: The library parameter each of the command's own flags gives (errors name the flag).
FLAGS = {
    "max_new_tokens": "--max-new-tokens",
    "kv_page_size": "--kv-page-size",
    "num_kv_pages": "--num-kv-pages",
}


def add_parser(commands: argparse._SubParsersAction[Parser]) -> None:
    parser = add_command(
        commands,
        "generate",
        summary="generate tokens for a file of prompts on an installed backend",
        description="Generate tokens for each prompt of a JSON Lines file, one request per "
        'line: {"token_ids": [...]}, {"prompt": "text"} (with a tokenizer.json in the '
        'checkpoint directory) or {"messages": [...]} (with its chat template too); optional '
        'per line: "max_new_tokens", "stop_token_ids" and SamplingParams fields '
        '("temperature", "top_k", "top_p", "seed", "min_tokens", "stop", "ignore_eos", '
        '"logprobs"). A request also stops on the checkpoint\'s EOS ids unless --ignore-eos. '
        "Sampling flags not given take the checkpoint's generation_config.json values, as "
        "vLLM does (--generation-config none: greedy). Every dispatch mixes decode rows and "
        "prefill chunks as the planner decides, over a KV cache of --num-kv-pages pages. "
        'Prints one JSON line per request, in input order: {"index", "token_ids" (the '
        'generated ids), "finish_reason" ("length" or "stop"), "stop_reason" when stopped, '
        '"text" with a tokenizer}; a summary goes to stderr. With --output FILE each line '
        "goes to FILE.partial as its request finishes, and FILE is written whole (atomically) "
        "when all have: a run killed or failed part-way continues with --resume. --verify "
        "(greedy only) recomputes every request with transformers' generate() on the same "
        "checkpoint; a mismatch exits with status 1.",
        examples=EXAMPLES,
    )
    parser.add_argument("--backend", required=True, metavar="NAME", help="an installed backend")
    parser.add_argument(
        "--backend-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="passed to the backend's factory, as for 'run' (checkpoint=DIR loads a model)",
    )
    parser.add_argument(
        "--prompts", required=True, metavar="FILE", help="JSON Lines of requests ('-': stdin)"
    )
    parser.add_argument(
        "--max-new-tokens",
        type=int,
        metavar="N",
        help="tokens to generate per request, unless its line says otherwise (default: the "
        "generation config's max_new_tokens, else 16, as vLLM's max_tokens)",
    )
    add_config_options(
        parser,
        budget=DEFAULT_MAX_NUM_BATCHED_TOKENS,  # LLM's: vLLM's offline default
        policy="packed",
        policy_help="packed (default): chunks of several prompts share a dispatch, so first "
        "tokens come sooner; round_robin: the seed's one prompt a dispatch",
    )
    pool = parser.add_argument_group("KV cache")
    pool.add_argument(
        "--kv-page-size",
        type=int,
        metavar="N",
        help=f"tokens per KV page (default: --chunk-alignment if set, else {DEFAULT_PAGE_SIZE})",
    )
    pool.add_argument(
        "--num-kv-pages",
        type=int,
        metavar="N",
        help="pages in the pool (default: what a step's rows can use at once: "
        "--max-num-seqs, else the budget, times the largest request's pages)",
    )
    sampling = parser.add_argument_group("sampling (default: the generation config's, else greedy)")
    sampling.add_argument("--temperature", type=float, metavar="T", help="0 is greedy")
    sampling.add_argument(
        "--top-k",
        type=int,
        metavar="K",
        help="keep the K likeliest tokens (ignored at --temperature 0, as in vLLM)",
    )
    sampling.add_argument(
        "--top-p",
        type=float,
        metavar="P",
        help="keep the likeliest tokens up to P, in (0, 1] (ignored at --temperature 0)",
    )
    sampling.add_argument(
        "--sampling-seed",
        type=int,
        metavar="N",
        help="seeds each request's stream with its index and token index (default 0)",
    )
    sampling.add_argument(
        "--generation-config",
        choices=("auto", "none"),
        default="auto",
        help="auto (default): sampling flags not given take generation_config.json's values",
    )
    parser.add_argument(
        "--output",
        metavar="FILE",
        help="write the JSON lines here ('-' or default: stdout); each as its request "
        "finishes to FILE.partial, then FILE whole (atomically) when every one has",
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue the run whose finished requests --output FILE's side file "
        "(FILE.partial) holds; refused when that run had other prompts or settings",
    )
    parser.add_argument(
        "--ignore-eos",
        action="store_true",
        help="do not stop on the checkpoint's EOS ids (generation_config.json, else "
        "config.json); only on the lines' stops and --max-new-tokens",
    )
    parser.add_argument(
        "--verify", action="store_true", help="compare with transformers' generate() (greedy)"
    )
    parser.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="show a progress bar on stderr (default: when stderr is a terminal)",
    )
    _replicas.add_replica_options(parser, runs=True)
    # Its output is JSON Lines and a summary of plain lines: it needs no rich ("plain").
    parser.set_defaults(handler=handle, format="plain")


def handle(args: argparse.Namespace) -> int:
    model = _model.model_files(args)
    sampling = _model.sampling(args, model.defaults)
    config = planner_config(args)
    if args.verify:
        _model.check_verify(args, model)
    check_counts(args, FLAGS)  # before the backend loads, which may take a while
    # Before the run, whose tokens it would lose.
    _job.check_output(args.output, prompts=args.prompts, resume=args.resume)
    if args.resume and args.replicas is not None:
        raise UsageError("--resume: not with --replicas (a replica run's results come at its end)")
    # (Both checked >= 1 by now: --kv-page-size above, the alignment by the config.)
    page_size = args.kv_page_size or config.chunk_alignment or DEFAULT_PAGE_SIZE
    started = time.perf_counter()
    with _replicas.optional_replicas(args) as pool:
        backend = load_backend_from_args(args) if pool is None else pool
        return _generate(args, backend, config, model, sampling, page_size, started)


def _generate(
    args: argparse.Namespace,
    backend: Backend | RayReplicas,
    config: PlannerConfig,
    model: _model.ModelFiles,
    sampling: SamplingParams,
    page_size: int,
    started: float,
) -> int:
    requests = read_prompts(
        read_text(args.prompts, name="--prompts"),
        max_new_tokens=_model.max_new_tokens(args, model.defaults),
        vocab_size=backend.vocab_size,
        max_positions=max_positions(backend),
        tokenizer=model.tokenizer,
        what=f"--prompts {args.prompts!r}",
        sampling=sampling,
        chat_template=model.chat_template,
    )
    if args.verify:
        _model.check_verify(args, model, requests)
    checkpoint = model.checkpoint
    eos = (
        ()
        if checkpoint is None or args.ignore_eos
        else eos_token_ids(checkpoint, vocab_size=backend.vocab_size)
    )
    params = [r.sampling for r in requests]
    if not isinstance(backend, Backend) and any(p.stop for p in params):
        raise UsageError("--replicas: lines with stop strings need one process (the replicas "
                         "hold no tokenizer to read them)")  # fmt: skip
    tokenizer = model.tokenizer
    sink = _job.open_sink(
        args, len(requests), _job.identity(args, requests, params, eos, tokenizer=tokenizer)
    )
    resumed = len(sink.finished)
    replicas: dict[str, Any] = {}

    def execute_part(
        todo: list[int], on_finish: Callable[[int, GeneratedSequence], None]
    ) -> GenerationResult:
        part = [requests[r] for r in todo]
        if isinstance(backend, Backend):
            with generation_bar(args, len(part)) as on_dispatch:
                return execute(
                    backend, part, config=config, stop_token_ids=eos,
                    num_kv_pages=args.num_kv_pages, kv_page_size=page_size,
                    on_dispatch=on_dispatch,
                    on_finish=on_finish, request_indices=todo,
                    detokenize=None if tokenizer is None else tokenizer.decode,
                )  # fmt: skip
        with _replicas.progress_bar(args)("generate") as on_progress, flags_named(**FLAGS):
            result, figures = _replicas.generate_on(
                backend, part, config=config, stop_token_ids=eos,
                num_kv_pages=args.num_kv_pages, kv_page_size=page_size, on_progress=on_progress,
            )  # fmt: skip
        replicas.update(figures)
        for place, sequence in enumerate(result.sequences):
            on_finish(place, sequence)
        return result

    result = _job.run_job(sink, execute_part, tokenizer=tokenizer, output=args.output)
    verification = None
    if args.verify:
        with _model.quiet_transformers():
            verification = verify_greedy_generation(
                str(checkpoint),
                [r.token_ids for r in requests],
                _job.sequences_of(sink),
                max_new_tokens=[r.max_new_tokens for r in requests],
                stop_token_ids=eos,
                request_stop_token_ids=[r.stop_token_ids for r in requests],
                tolerance=backend.tolerance,
                relative_tolerance=relative_tolerance(backend),
            )
    extra = []
    if resumed:
        extra.append(("resumed", f"{resumed} of {len(requests)} requests read back"))
    if replicas and result is not None:
        # The replicas' own time leaves out Ray's start-up, which the user waited for too.
        seconds = time.perf_counter() - started
        rate = result.stats.num_generated_tokens / seconds
        extra.append(("with start-up", f"{seconds:.2f} s ({rate:,.0f} tokens/s)"))
    summary = (
        [f"{len(requests)} requests: all had finished in {args.output!r}{PARTIAL_SUFFIX}"]
        if result is None
        else generation_summary(backend.name, config, result, verification, extra)
    )
    if replicas:
        summary.append(f"replicas: {_replicas.describe(replicas)}")
    _job.write_summary(summary)
    if verification is not None and not verification.passed:
        return EXIT_FAILED
    return EXIT_OK


def execute(
    backend: Backend,
    requests: Sequence[PromptRequest],
    *,
    config: PlannerConfig,
    stop_token_ids: Collection[int],
    num_kv_pages: int | None,
    kv_page_size: int,
    on_dispatch: Callable[[DispatchDone], None],
    on_finish: Callable[[int, GeneratedSequence], None] | None = None,
    request_indices: Sequence[int] | None = None,
    detokenize: Callable[[Sequence[int]], str] | None = None,
) -> GenerationResult:
    """Run ``requests`` on ``backend``, each with its own sampling and stopping on
    ``stop_token_ids`` and its own: the one call that does the work."""
    with flags_named(**FLAGS):
        return generate(
            backend,
            [r.token_ids for r in requests],
            config=config,
            max_new_tokens=[r.max_new_tokens for r in requests],
            sampling=[r.sampling for r in requests],
            stop_token_ids=stop_token_ids,
            request_stop_token_ids=[r.stop_token_ids for r in requests],
            num_kv_pages=num_kv_pages,
            kv_page_size=kv_page_size,
            on_dispatch=on_dispatch,
            on_finish=on_finish,
            request_indices=request_indices,
            detokenize=detokenize,
        )
