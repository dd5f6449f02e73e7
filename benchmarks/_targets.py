"""Targets that more than one benchmark checks, stated once.

The scripts in this folder run as scripts (``python benchmarks/bench_online.py``), which puts
this folder on ``sys.path``: they import this module by its bare name.
"""

from __future__ import annotations

#: "A step's cost does not grow" (with the requests in flight, waiting, or their context):
#: the step at the largest size of a sweep costs at most this many times the step at the
#: smallest, both timed in the same run.
MAX_GROWTH = 1.5


def growth_miss(what: str, smallest: tuple[str, float], largest: tuple[str, float]) -> str | None:
    """Why a sweep's cost grew too much, or ``None`` if it kept to :data:`MAX_GROWTH`.

    ``smallest`` and ``largest`` are each the sweep's size, as printed, and its cost.
    """
    (small, small_cost), (large, large_cost) = smallest, largest
    if large_cost <= MAX_GROWTH * small_cost:
        return None
    return (
        f"{what} costs {large_cost / small_cost:.2f}x more at {large} than at {small} "
        f"(at most {MAX_GROWTH:g}x)"
    )
