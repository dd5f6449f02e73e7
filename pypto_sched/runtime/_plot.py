"""A picture of a schedule, drawn with matplotlib (the optional ``plot`` extra).

The main panel has dispatches along x and requests down y; every chunk is a cell coloured by
its size, and each request's final chunk (the one whose logits are sampled) is marked. A thin
panel above it shows the tokens each dispatch carries against the budget.

Two styles, chosen by size unless asked for:

- ``chunks``: one rectangle per chunk, final chunks outlined and dotted; for schedules small
  enough that every cell is a few pixels wide, such as the seed's 224 dispatches;
- ``raster``: a requests x dispatches image (cells binned by their largest chunk when there
  are more than the image has pixels) and a dot per request where it finishes, so thousands
  of dispatches draw in about the time of a few.

matplotlib is imported inside :func:`render_schedule` and only its object-oriented API is
used (no ``pyplot``, no global backend switch), so importing this module costs nothing and
drawing leaves no state behind.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Colormap, Normalize

    from ..core._schedule import Schedule

__all__ = ["FORMATS", "STYLES", "Style", "choose_style", "render_schedule"]

Style = Literal["auto", "chunks", "raster"]
STYLES: tuple[Style, ...] = ("auto", "chunks", "raster")
#: Image formats by file suffix.
FORMATS = {".png": "png", ".svg": "svg"}

#: ``auto`` draws rectangles up to these sizes, an image beyond them.
_MAX_RECT_CHUNKS = 5_000
_MAX_RECT_DISPATCHES = 600
_MAX_RECT_REQUESTS = 200

_FINAL_COLOUR = "#d62728"
_BUDGET_COLOUR = "#555555"


def choose_style(schedule: Schedule, style: Style = "auto") -> Literal["chunks", "raster"]:
    """The style ``auto`` resolves to for ``schedule`` (other styles are returned as is)."""
    if style != "auto":
        return style
    small = (
        schedule.num_chunks <= _MAX_RECT_CHUNKS
        and schedule.num_dispatches <= _MAX_RECT_DISPATCHES
        and schedule.num_requests <= _MAX_RECT_REQUESTS
    )
    return "chunks" if small else "raster"


def render_schedule(
    schedule: Schedule,
    path: Path,
    *,
    width: int,
    height: int,
    dpi: int = 100,
    style: Style = "auto",
    title: str | None = None,
) -> Literal["chunks", "raster"]:
    """Draw ``schedule`` into ``path`` (PNG or SVG by suffix), ``width`` x ``height``
    pixels, and return the style used. Raises ``ImportError`` without matplotlib."""
    from matplotlib import rc_context
    from matplotlib.figure import Figure

    chosen = choose_style(schedule, style)
    figure = Figure(figsize=(width / dpi, height / dpi), dpi=dpi, layout="constrained")
    top, main = figure.subplots(
        2, 1, sharex=True, gridspec_kw={"height_ratios": (1, 4)}, squeeze=True
    )
    cmap, norm = _colour_scale(schedule)
    if chosen == "chunks":
        _draw_chunks(main, schedule, cmap, norm)
    else:
        _draw_raster(main, schedule, cmap, norm, width=width, height=height)
    _draw_tokens(top, schedule, width=width)
    _label(main, schedule)
    colourbar = figure.colorbar(_scalar_mappable(cmap, norm), ax=main, pad=0.01, aspect=30)
    colourbar.set_label("chunk size (tokens)")
    # A title is text, not mathtext: '$' in a user's title is drawn as written.
    figure.suptitle(title if title is not None else _title(schedule), parse_math=False)
    # One legend for both panels, under them, where it covers nothing.
    handles = [*top.get_legend_handles_labels()[0], *main.get_legend_handles_labels()[0]]
    figure.legend(handles=handles, loc="outside lower center", ncols=len(handles), fontsize="small")
    with warnings.catch_warnings():
        # Cosmetic: a character the font lacks is drawn as a box, and a figure too small for
        # its labels is drawn as it fits; saying so on stderr helps no one.
        warnings.filterwarnings("ignore", message="Glyph .* missing from", category=UserWarning)
        warnings.filterwarnings("ignore", message="constrained_layout not applied")
        image_format = FORMATS[path.suffix.lower()]
        # The same schedule gives the same bytes: an SVG gets no date and ids from a fixed salt.
        with rc_context({"svg.hashsalt": "pypto-sched"}):
            figure.savefig(
                path,
                format=image_format,
                dpi=dpi,
                metadata={"Date": None} if image_format == "svg" else None,
            )
    return chosen


def _colour_scale(schedule: Schedule) -> tuple[Colormap, Normalize]:
    from matplotlib import colormaps
    from matplotlib.colors import Normalize

    cap = max(int(schedule.lengths.max()), 1)
    return colormaps["viridis"], Normalize(vmin=0, vmax=cap)


def _scalar_mappable(cmap: Colormap, norm: Normalize) -> ScalarMappable:
    from matplotlib.cm import ScalarMappable

    return ScalarMappable(norm=norm, cmap=cmap)


def _draw_chunks(axes: Axes, schedule: Schedule, cmap: Colormap, norm: Normalize) -> None:
    from matplotlib.collections import PolyCollection

    x = schedule.row_dispatch.astype(np.float64)
    y = schedule.requests.astype(np.float64)
    half = 0.42
    corners = np.stack(
        [
            np.stack([x, y - half], axis=1),
            np.stack([x + 1, y - half], axis=1),
            np.stack([x + 1, y + half], axis=1),
            np.stack([x, y + half], axis=1),
        ],
        axis=1,
    )
    final = schedule.is_final
    edges = np.where(final[:, None], np.array([[0.84, 0.15, 0.16, 1.0]]), 0.0)
    cells = PolyCollection(
        list(corners),
        array=schedule.lengths.astype(np.float64),
        cmap=cmap,
        norm=norm,
        edgecolors=edges,
        linewidths=np.where(final, 1.2, 0.0),
    )
    axes.add_collection(cells)
    axes.scatter(
        x[final] + 0.5,
        y[final],
        s=8,
        c=_FINAL_COLOUR,
        marker="o",
        zorder=3,
        linewidths=0,
        label="final chunk (logits sampled)",
    )
    axes.set_xlim(0, schedule.num_dispatches)
    axes.set_ylim(schedule.num_requests - 0.5, -0.5)


def _draw_raster(
    axes: Axes, schedule: Schedule, cmap: Colormap, norm: Normalize, *, width: int, height: int
) -> None:
    # One cell per pixel at most: the main panel is narrower and shorter than the figure.
    image = _chunk_image(schedule, max_rows=height, max_cols=width)
    axes.imshow(
        np.ma.masked_equal(image, 0),
        cmap=cmap,
        norm=norm,
        aspect="auto",
        interpolation="nearest",
        extent=(0, schedule.num_dispatches, schedule.num_requests, 0),
        rasterized=True,
    )
    requests = np.arange(schedule.num_requests)
    axes.scatter(
        schedule.finish_dispatch + 0.5,
        requests + 0.5,
        s=2,
        c=_FINAL_COLOUR,
        marker="o",
        linewidths=0,
        rasterized=True,
        label="final chunk (logits sampled)",
    )
    axes.set_xlim(0, schedule.num_dispatches)
    axes.set_ylim(schedule.num_requests, 0)


def _chunk_image(schedule: Schedule, *, max_rows: int, max_cols: int) -> npt.NDArray[np.int32]:
    """Requests x dispatches, each cell the largest chunk it covers (0: none), binned to at
    most ``max_rows`` x ``max_cols`` cells so that no chunk falls between pixels."""
    rows = _bin_size(schedule.num_requests, max_rows)
    cols = _bin_size(schedule.num_dispatches, max_cols)
    image = np.zeros(
        (-(-schedule.num_requests // rows), -(-schedule.num_dispatches // cols)), dtype=np.int32
    )
    np.maximum.at(
        image, (schedule.requests // rows, schedule.row_dispatch // cols), schedule.lengths
    )
    return image


def _bin_size(count: int, most: int) -> int:
    return max(1, -(-count // max(most, 1)))


def _draw_tokens(axes: Axes, schedule: Schedule, *, width: int) -> None:
    """Tokens per dispatch against the budgets; beyond one dispatch per pixel, the mean and
    the largest of each run of dispatches (drawing every step would take seconds)."""
    config = schedule.config
    tokens = schedule.tokens_per_dispatch
    step = _bin_size(schedule.num_dispatches, width)
    if step == 1:
        edges = np.arange(schedule.num_dispatches + 1)
        axes.stairs(tokens, edges, fill=True, color="#4c72b0", alpha=0.8, label="tokens")
    else:
        starts = np.arange(0, schedule.num_dispatches, step)
        edges = np.append(starts, schedule.num_dispatches)
        counts = np.diff(edges)
        means = np.add.reduceat(tokens, starts) / counts
        axes.stairs(
            means,
            edges,
            fill=True,
            color="#4c72b0",
            alpha=0.8,
            label=f"tokens (mean of {step:,} dispatches)",
        )
        axes.stairs(
            np.maximum.reduceat(tokens, starts),
            edges,
            color="#1f3b70",
            linewidth=0.8,
            label="tokens (largest)",
        )
    axes.axhline(
        config.max_num_batched_tokens,
        color=_BUDGET_COLOUR,
        linestyle="--",
        linewidth=1,
        label=f"max_num_batched_tokens {config.max_num_batched_tokens:,}",
    )
    if config.effective_budget != config.max_num_batched_tokens:
        axes.axhline(
            config.effective_budget,
            color=_FINAL_COLOUR,
            linestyle=":",
            linewidth=1,
            label=f"effective budget {config.effective_budget:,}",
        )
    axes.set_ylim(0, config.max_num_batched_tokens * 1.15)
    axes.set_ylabel("tokens")


def _label(axes: Axes, schedule: Schedule) -> None:
    axes.set_xlabel("dispatch index")
    axes.set_ylabel("request")
    if schedule.num_requests <= 32:
        axes.set_yticks(np.arange(schedule.num_requests))


def _title(schedule: Schedule) -> str:
    config = schedule.config
    knobs = [f"policy {config.policy}", f"budget {config.max_num_batched_tokens:,}"]
    if config.long_prefill_token_threshold is not None:
        knobs.append(f"threshold {config.long_prefill_token_threshold:,}")
    if config.max_num_seqs is not None:
        knobs.append(f"max batch {config.max_num_seqs:,}")
    if config.chunk_alignment is not None:
        knobs.append(f"aligned to {config.chunk_alignment:,}")
    if config.max_num_partial_prefills is not None:
        knobs.append(f"partial prefills {config.max_num_partial_prefills:,}")
    return (
        f"{schedule.num_requests:,} requests, {schedule.num_tokens:,} tokens: "
        f"{schedule.num_dispatches:,} dispatches (lower bound {schedule.lower_bound:,})\n"
        + ", ".join(knobs)
    )
