"""``pypto-sched generate``: offline batch generation from a JSON Lines file of prompts.

The command parses, calls the library and renders: :func:`~pypto_sched.prompts.read_prompts`
reads and checks the prompts, :func:`~pypto_sched.generate` runs them (its ``on_step`` feeds
the progress bar), and
:func:`~pypto_sched.integrations.hf_verify.verify_greedy_generation` is ``--verify``. The
whole execution is the one call in :func:`execute`, so that another way of running the batch
(several replicas) replaces one function.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from .._config import PlannerConfig
from .._generate import GenerationResult, StepDone, generate
from .._sampling import SamplingParams
from ..backends import Backend, max_positions, relative_tolerance
from ..execute import DEFAULT_PAGE_SIZE
from ..integrations.hf_verify import (
    transformers_missing,
    verify_greedy_generation,
)
from ..prompts import (
    MissingDependencyError,
    PromptRequest,
    Tokenizer,
    eos_token_ids,
    load_tokenizer,
    output_lines,
    read_prompts,
)
from . import _render, _replicas
from ._errors import EXIT_FAILED, EXIT_OK, UsageError, check_counts, flags_named
from ._inputs import config as planner_config
from ._lengths import read_text
from ._options import Example, Once, Parser, add_command, add_config_options
from ._progress import generation_bar
from ._render import generation_summary
from ._specs import backend_options
from .run import _load

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
    "page_size": "--kv-page-size",
    "num_pages": "--num-kv-pages",
}
#: The field of :class:`SamplingParams` each sampling flag gives.
SAMPLING_FLAGS = {
    "temperature": "--temperature",
    "top_k": "--top-k",
    "top_p": "--top-p",
    "seed": "--sampling-seed",
}


def add_parser(commands: argparse._SubParsersAction[Parser]) -> None:
    parser = add_command(
        commands,
        "generate",
        summary="generate tokens for a file of prompts on an installed backend",
        description="Generate up to --max-new-tokens tokens for each prompt of a JSON Lines "
        'file, one request per line: {"token_ids": [...]}, or {"prompt": "text"} when the '
        "checkpoint directory has a tokenizer.json; optional per line: "
        '"max_new_tokens", "stop_token_ids". A request also stops on the EOS ids of the '
        "checkpoint unless --ignore-eos. Every dispatch mixes decode rows and prefill "
        "chunks as the planner decides, over a KV cache of --num-kv-pages pages; requests "
        "wait for pages and are preempted (and recomputed) when it is short. Prints one JSON "
        'line per request, in input order: {"index", "token_ids" (the generated ids), '
        '"finish_reason" ("length" or "stop"), and "text" with a tokenizer}; a summary goes '
        "to stderr. --verify (greedy only) recomputes every request with transformers' "
        "generate() on the same checkpoint; a mismatch exits with status 1.",
        examples=EXAMPLES,
    )
    parser.add_argument(
        "--backend", action=Once, required=True, metavar="NAME", help="an installed backend"
    )
    parser.add_argument(
        "--backend-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="passed to the backend's factory, as for 'run' (checkpoint=DIR loads a model)",
    )
    parser.add_argument(
        "--prompts",
        action=Once,
        required=True,
        metavar="FILE",
        help="JSON Lines of requests ('-': stdin)",
    )
    parser.add_argument(
        "--max-new-tokens",
        action=Once,
        type=int,
        required=True,
        metavar="N",
        help="tokens to generate per request, unless its line says otherwise",
    )
    add_config_options(parser)
    pool = parser.add_argument_group("KV cache")
    pool.add_argument(
        "--kv-page-size",
        action=Once,
        type=int,
        metavar="N",
        help=f"tokens per KV page (default: --page-size if set, else {DEFAULT_PAGE_SIZE})",
    )
    pool.add_argument(
        "--num-kv-pages",
        action=Once,
        type=int,
        metavar="N",
        help="pages in the pool (default: what a step's rows can use at once: "
        "--max-num-seqs, else the budget, times the largest request's pages)",
    )
    sampling = parser.add_argument_group("sampling (default: greedy)")
    sampling.add_argument(
        "--temperature",
        action=Once,
        type=float,
        default=0.0,
        metavar="T",
        help="0 is greedy (default)",
    )
    sampling.add_argument(
        "--top-k",
        action=Once,
        type=int,
        metavar="K",
        help="keep the K likeliest tokens (ignored at --temperature 0, as in vLLM)",
    )
    sampling.add_argument(
        "--top-p",
        action=Once,
        type=float,
        metavar="P",
        help="keep the likeliest tokens up to P, in (0, 1] (ignored at --temperature 0)",
    )
    sampling.add_argument(
        "--sampling-seed",
        action=Once,
        type=int,
        default=0,
        metavar="N",
        help="seeds each request's stream with its index and token index (default 0)",
    )
    parser.add_argument(
        "--output",
        action=Once,
        metavar="FILE",
        help="write the JSON lines here ('-' or default: stdout)",
    )
    parser.add_argument(
        "--ignore-eos",
        action="store_true",
        help="do not stop on the checkpoint's EOS ids (generation_config.json, else "
        "config.json); only on the lines' stop_token_ids and --max-new-tokens",
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
    sampling = _sampling(args)
    config = planner_config(args)
    if args.verify:
        _check_verify(args, sampling)
    check_counts(args, FLAGS)  # before the backend loads, which may take a while
    _check_output(args.output, prompts=args.prompts)  # before the run, whose tokens it'd lose
    page_size = next(
        size for size in (args.kv_page_size, args.page_size, DEFAULT_PAGE_SIZE) if size is not None
    )
    with _replicas.optional_replicas(args) as pool:
        backend = _load(args) if pool is None else pool
        return _generate(args, backend, config, sampling, page_size)


def _generate(
    args: argparse.Namespace,
    backend: Backend | RayReplicas,
    config: PlannerConfig,
    sampling: SamplingParams,
    page_size: int,
) -> int:
    tokenizer = _tokenizer(args)
    requests = read_prompts(
        read_text(args.prompts, name="--prompts"),
        max_new_tokens=args.max_new_tokens,
        vocab_size=backend.vocab_size,
        max_positions=max_positions(backend),
        tokenizer=tokenizer,
        what=f"--prompts {args.prompts!r}",
    )
    checkpoint = _checkpoint(args)
    eos = () if checkpoint is None or args.ignore_eos else eos_token_ids(checkpoint)
    # An EOS id outside the vocabulary (a small model that kept its family's EOS) can never be
    # generated: it stops nothing, and generate() refuses stop ids outside the vocabulary.
    eos = tuple(token for token in eos if token < backend.vocab_size)
    if isinstance(backend, Backend):
        with generation_bar(args, len(requests)) as on_step:
            result = execute(
                backend,
                requests,
                config=config,
                sampling=sampling,
                stop_token_ids=eos,
                num_pages=args.num_kv_pages,
                page_size=page_size,
                on_step=on_step,
            )
    else:
        with _replicas.progress_bar(args)("generate") as on_progress, flags_named(**FLAGS):
            result, replicas = _replicas.generate_on(
                backend, requests, config=config, sampling=sampling, stop_token_ids=eos,
                num_pages=args.num_kv_pages, page_size=page_size, on_progress=on_progress,
            )  # fmt: skip
    _write(args.output, "".join(f"{line}\n" for line in output_lines(result, tokenizer=tokenizer)))
    verification = None
    if args.verify:
        verification = verify_greedy_generation(
            str(checkpoint),
            [r.token_ids for r in requests],
            [s.token_ids.tolist() for s in result.sequences],
            max_new_tokens=[r.max_new_tokens for r in requests],
            stop_token_ids=eos,
            request_stop_token_ids=[r.stop_token_ids for r in requests],
            tolerance=backend.tolerance,
            relative_tolerance=relative_tolerance(backend),
        )
    summary = generation_summary(backend.name, config, result, verification)
    if not isinstance(backend, Backend):
        summary.append(f"replicas: {_replicas.describe(replicas)}")
    if sys.stderr is not None:  # not started with stderr closed
        sys.stderr.write("".join(f"{line}\n" for line in summary))
    if verification is not None and not verification.passed:
        return EXIT_FAILED
    return EXIT_OK


def execute(
    backend: Backend,
    requests: Sequence[PromptRequest],
    *,
    config: PlannerConfig,
    sampling: SamplingParams,
    stop_token_ids: Collection[int],
    num_pages: int | None,
    page_size: int,
    on_step: Callable[[StepDone], None],
) -> GenerationResult:
    """Run ``requests`` on ``backend``, each stopping on ``stop_token_ids`` and its own:
    the one call that does the work."""
    with flags_named(**FLAGS):
        return generate(
            backend,
            [r.token_ids for r in requests],
            config=config,
            max_new_tokens=[r.max_new_tokens for r in requests],
            sampling=sampling,
            stop_token_ids=stop_token_ids,
            request_stop_token_ids=[r.stop_token_ids for r in requests],
            num_pages=num_pages,
            page_size=page_size,
            on_step=on_step,
        )


def _sampling(args: argparse.Namespace) -> SamplingParams:
    with flags_named(**SAMPLING_FLAGS):
        return SamplingParams(
            temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
            seed=args.sampling_seed,
        )  # fmt: skip


def _check_verify(args: argparse.Namespace, sampling: SamplingParams) -> None:
    if not sampling.is_greedy:
        raise UsageError("--verify compares greedy tokens: leave --temperature at 0")
    missing = transformers_missing()
    if missing is not None:
        raise UsageError(f"--verify: {missing}")
    if _checkpoint(args) is None:
        raise UsageError("--verify needs the checkpoint: --backend-option checkpoint=DIR")


def _checkpoint(args: argparse.Namespace) -> str | None:
    """The backend's ``checkpoint`` option: the directory of the weights and tokenizer."""
    checkpoint = backend_options(args.backend_option).get("checkpoint")
    return None if checkpoint is None else str(checkpoint)


def _tokenizer(args: argparse.Namespace) -> Tokenizer | None:
    checkpoint = _checkpoint(args)
    if checkpoint is None:
        return None
    try:
        return load_tokenizer(checkpoint)
    except MissingDependencyError as error:
        raise UsageError(str(error)) from None


def _check_output(path: str | None, *, prompts: str) -> None:
    """Refuse an ``--output`` that cannot be written, or that is the ``--prompts`` file, before
    anything runs (without creating or truncating it: a failed run leaves an existing file as
    it was). ``-`` is stdout."""
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
        if not os.access(target if target.exists() else folder, os.W_OK)
        else None
    )
    if problem is not None:
        raise UsageError(f"--output: cannot write {path!r}: {problem}")


def _same_file(first: Path, second: Path) -> bool:
    try:
        return first.samefile(second)
    except OSError:  # one of them does not exist (yet)
        return False


def _write(path: str | None, text: str) -> None:
    if path is None or path == "-":
        _render.stream_of().write(text)
        return
    try:
        Path(path).write_text(text, encoding="utf-8")
    except OSError as error:
        raise UsageError(f"--output: cannot write {path!r}: {error.strerror or error}") from None
