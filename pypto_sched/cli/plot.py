"""``pypto-sched plot``: a picture of a schedule, PNG or SVG (the ``plot`` extra)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from ..runtime._plot import FORMATS, render_schedule
from . import _render
from ._errors import EXIT_OK, CommandFailed, UsageError
from ._inputs import plan
from ._options import (
    SEED,
    Example,
    Once,
    Parser,
    add_command,
    add_config_options,
    add_format_option,
    add_workload_options,
)

__all__ = ["EXAMPLES", "add_parser", "handle"]

EXAMPLES: list[Example] = [
    ("the seed's 224 dispatches as a PNG", f"plot {SEED} -o seed.png"),
    (
        "10,000 dispatches drawn as an image, as SVG",
        "plot --workload uniform --num-requests 1000 --max-length 20000 \\\n"
        "      --max-num-batched-tokens 2048 --long-prefill-token-threshold 2048 \\\n"
        "      -o big.svg",
    ),
]

_PIXELS = (100, 20_000)
_DPI = (10, 1000)
_MAX_TITLE = 300


def add_parser(commands: argparse._SubParsersAction[Parser]) -> None:
    parser = add_command(
        commands,
        "plot",
        summary="draw a schedule as PNG or SVG (needs pypto-sched[plot])",
        description="Draw a schedule: dispatches along x, requests down y, each chunk "
        "coloured by its size, final chunks (whose logits are sampled) marked in red, and the "
        "tokens per dispatch against the budget above. Small schedules are drawn chunk by "
        "chunk; large ones (thousands of dispatches) as an image.",
        examples=EXAMPLES,
    )
    add_workload_options(parser)
    add_config_options(parser)
    parser.add_argument(
        "-o",
        "--output",
        action=Once,
        required=True,
        metavar="FILE",
        help="the image to write; its suffix (.png or .svg) picks the format",
    )
    parser.add_argument(
        "--width", action=Once, type=int, default=1600, metavar="PX", help="default 1600"
    )
    parser.add_argument(
        "--height", action=Once, type=int, default=900, metavar="PX", help="default 900"
    )
    parser.add_argument(
        "--dpi", action=Once, type=int, default=100, help="text scale (default 100)"
    )
    parser.add_argument(
        "--style",
        action=Once,
        choices=("auto", "chunks", "raster"),
        default="auto",
        help="chunks: one rectangle per chunk; raster: an image, fast for thousands of "
        "dispatches; auto (default) picks by size",
    )
    parser.add_argument(
        "--title",
        action=Once,
        help=f"replace the default title (drawn as written, at most {_MAX_TITLE} characters)",
    )
    add_format_option(parser, "text: one line; json: the file, its size and the style used")
    parser.set_defaults(handler=handle)


def _check(args: argparse.Namespace) -> str:
    """The image format, once every drawing option is known to be in range."""
    if args.output.endswith(("/", os.sep)):  # Path() would drop the slash
        raise UsageError(f"--output: names a directory, not an image file: {args.output!r}")
    image_format = FORMATS.get(Path(args.output).suffix.lower())
    if image_format is None:
        raise UsageError(f"--output: the file name must end in .png or .svg: {args.output!r}")
    low, high = _PIXELS
    for option in ("width", "height"):
        if not low <= getattr(args, option) <= high:
            raise UsageError(
                f"--{option}: must be in [{low}, {high}] pixels: {getattr(args, option)}"
            )
    if not _DPI[0] <= args.dpi <= _DPI[1]:
        raise UsageError(f"--dpi: must be in [{_DPI[0]}, {_DPI[1]}]: {args.dpi}")
    if args.title is not None and len(args.title) > _MAX_TITLE:
        raise UsageError(f"--title: at most {_MAX_TITLE} characters: {len(args.title)}")
    return image_format


def handle(args: argparse.Namespace) -> int:
    image_format = _check(args)
    schedule, _ = plan(args)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise CommandFailed("plot needs matplotlib: pip install 'pypto-sched[plot]'") from None
    path = Path(args.output)
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
        raise UsageError(
            f"--output: cannot write {str(path)!r}: {error.strerror or error}"
        ) from None
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
        _render.print_json(result)
    else:
        _render.emit(
            f"wrote {path}: {args.width}x{args.height} {image_format.upper()}, {style} style, "
            f"{schedule.num_dispatches:,} dispatches of {schedule.num_requests:,} requests"
        )
    return EXIT_OK
