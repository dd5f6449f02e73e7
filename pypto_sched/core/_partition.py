"""Split an offline batch across replicas so that the slowest replica finishes early.

The rule
========

Each request carries a weight: by default the tokens it still has to prefill (its prompt
length less its cached prefix); a caller may pass its own, for example tokens plus expected
output tokens for generation. The partition is *longest processing time first* (LPT): requests
in order of decreasing weight (ties: lower index first) each go to the replica whose load is
then smallest (ties: lower replica index). Within a part, requests keep ascending index order.

Guarantees (``tests/test_partition.py`` checks each):

* every request is in exactly one part; the result depends only on the inputs;
* the makespan (the largest part's load) is at most ``4/3 - 1/(3N)`` times the optimum for
  ``N`` parts (Graham, 1969), and never below :attr:`Partition.lower_bound`, ``max(ceil(total /
  N), largest weight)``;
* on long-tailed batches of a thousand prompts or more it is within 1% of that bound, where
  splitting by count (vLLM's and vllm-ascend's data-parallel examples slice prompts into equal
  contiguous parts; SGLang deals them round-robin) is 1.1x to 2x off
  (``benchmarks/bench_partition.py``).

How it is computed fast
-----------------------
A plain loop with a heap costs about 0.6 s for a million prompts. Prompt lengths repeat, and
a run of ``k`` equal weights ``w`` is placed at once: LPT gives them, in turn, the ``k``
smallest of the slots ``load[p] + j * w`` (``j >= 0``), ordered by value and then replica,
so a binary search finds the threshold value and NumPy lays the slots out. Short runs take
the heap. ``tests/test_partition.py`` checks the result against the plain loop.
"""

from __future__ import annotations

import functools
import heapq
import itertools
from collections.abc import Sequence
from typing import Any

import attrs
import numpy as np
import numpy.typing as npt

from ._errors import InvalidInputError
from ._validate import arrays_stay_read_only, as_count_array, check_int, read_only

__all__ = ["Partition", "partition_requests"]

IntArray = npt.NDArray[np.int64]

#: Runs of equal weight at least this long are placed at once; shorter ones one by one.
_RUN_AT_ONCE = 32


@arrays_stay_read_only
@attrs.frozen(kw_only=True, eq=False)
class Partition:
    """Which replica runs which request: the result of :func:`partition_requests`."""

    #: ``[num_requests]``: the part (replica) of each request.
    assignment: npt.NDArray[np.int32] = attrs.field(repr=False)
    #: ``[num_requests]``: the weight each request was balanced by.
    weights: IntArray = attrs.field(repr=False)
    #: How many parts (replicas); some may be empty when there are fewer requests.
    num_parts: int

    @functools.cached_property
    def parts(self) -> tuple[npt.NDArray[np.int64], ...]:
        """Per part, its requests' indices in ascending order (read-only arrays)."""
        order = np.argsort(self.assignment, kind="stable")
        ends = np.cumsum(np.bincount(self.assignment, minlength=self.num_parts))
        return tuple(read_only(part.astype(np.int64)) for part in np.split(order, ends[:-1]))

    @functools.cached_property
    def loads(self) -> IntArray:
        """``[num_parts]``: the total weight of each part."""
        loads = np.zeros(self.num_parts, dtype=np.int64)
        used = self._used_loads()
        loads[: used.size] = used
        return read_only(loads)

    @property
    def makespan(self) -> int:
        """The largest part's load: what decides the batch's wall time."""
        return int(self._used_loads().max(initial=0))

    def _used_loads(self) -> IntArray:
        """The loads of parts 0 up to the last that holds a request; the parts after it hold
        none (with far more parts than requests, building them costs memory for nothing)."""
        return np.rint(np.bincount(self.assignment, weights=self.weights)).astype(np.int64)

    @property
    def lower_bound(self) -> int:
        """No partition does better: ``max(ceil(total / num_parts), largest weight)``."""
        total = int(self.weights.sum())
        return max(-(-total // self.num_parts), int(self.weights.max(initial=0)))

    @property
    def imbalance(self) -> float:
        """``makespan / lower_bound`` (1.0 is optimal; 1.0 for a batch of no weight)."""
        bound = self.lower_bound
        return self.makespan / bound if bound else 1.0


def partition_requests(
    prompt_lengths: Sequence[int] | npt.NDArray[np.integer[Any]],
    num_parts: int,
    *,
    num_computed_tokens: Sequence[int] | npt.NDArray[np.integer[Any]] | None = None,
    weights: Sequence[int] | npt.NDArray[np.integer[Any]] | None = None,
) -> Partition:
    """Split requests into ``num_parts`` parts of balanced weight, longest first.

    The weight of request ``r`` is ``weights[r]`` when given (any ints ``>= 0``), else the
    tokens it has to prefill, ``prompt_lengths[r] - num_computed_tokens[r]``. The inputs are
    not mutated; equal inputs give equal partitions.
    """
    lengths = as_count_array("prompt_lengths", prompt_lengths, min_value=1)
    parts = check_int("num_parts", num_parts, min_value=1)
    if weights is not None:
        balanced = as_count_array("weights", weights, min_value=0, allow_empty=True)
        _same_size("weights", balanced, lengths)
    elif num_computed_tokens is not None:
        computed = as_count_array(
            "num_computed_tokens", num_computed_tokens, min_value=0, allow_empty=True
        )
        _same_size("num_computed_tokens", computed, lengths)
        over = np.flatnonzero(computed >= lengths)
        if over.size:
            r = int(over[0])
            raise InvalidInputError.about(
                "num_computed_tokens",
                f"must be < the prompt length: request {r} has "
                f"{int(computed[r])} of {int(lengths[r])}",
            )
        balanced = lengths - computed
    else:
        balanced = lengths
    # Beyond one part a request, LPT never reaches the extra parts (each request finds an
    # empty part of lower index), so they are left out of the work: its cost does not grow
    # with num_parts.
    return Partition(
        assignment=read_only(_longest_first(balanced, min(parts, lengths.size))),
        weights=read_only(balanced.copy()),
        num_parts=parts,
    )


def _same_size(name: str, values: IntArray, lengths: IntArray) -> None:
    if values.size != lengths.size:
        raise InvalidInputError.about(
            name, f"must have one entry per prompt ({lengths.size}): {values.size} entries"
        )


def _longest_first(weights: IntArray, num_parts: int) -> npt.NDArray[np.int32]:
    """LPT as stated in the module docstring; runs of equal weight are placed at once."""
    order = np.argsort(-weights, kind="stable")
    ordered = weights[order]
    starts = np.flatnonzero(np.diff(ordered, prepend=-1))  # where each run of equal weight starts
    bounds: list[int] = [*starts.tolist(), int(ordered.size)]
    assignment = np.empty(weights.size, dtype=np.int32)
    loads = [0] * num_parts
    heap = [(0, p) for p in range(num_parts)]
    for lo, hi in itertools.pairwise(bounds):
        weight, count = int(ordered[lo]), hi - lo
        if count < _RUN_AT_ONCE or weight == 0:
            for i in range(lo, hi):
                load, p = heap[0]
                heapq.heapreplace(heap, (load + weight, p))
                loads[p] = load + weight
                assignment[order[i]] = p
        else:
            slots = _smallest_slots(np.array(loads, dtype=np.int64), weight, count)
            assignment[order[lo:hi]] = slots
            for p, taken in enumerate(np.bincount(slots, minlength=num_parts).tolist()):
                loads[p] += taken * weight
            heap = sorted((load, p) for p, load in enumerate(loads))
    return assignment


def _smallest_slots(loads: IntArray, weight: int, count: int) -> npt.NDArray[np.int32]:
    """The parts of the ``count`` smallest slots ``loads[p] + j * weight``, in LPT order.

    Write ``loads[p] = q[p] * weight + r[p]``: slot ``j`` of part ``p`` is on *level*
    ``q[p] + j`` at offset ``r[p]``, so slots order by (level, offset, part). The lowest
    ``level`` holding the ``count``-th slot follows from the sorted ``q`` in one pass.
    """
    q, r = np.divmod(loads, weight)
    level = _level_of_slot(sorted(q.tolist()), count)
    taken = np.maximum(level - q, 0)  # every slot on a level below ``level``
    on_level = np.flatnonzero(q <= level)
    on_level = on_level[np.lexsort((on_level, r[on_level]))]
    taken[on_level[: count - int(taken.sum())]] += 1
    parts = np.repeat(np.arange(loads.size, dtype=np.int32), taken)
    first = np.cumsum(taken) - taken
    levels = q[parts] + np.arange(parts.size) - np.repeat(first, taken)
    return parts[np.lexsort((parts, r[parts], levels))]


def _level_of_slot(q: list[int], count: int) -> int:
    """The level of the ``count``-th smallest slot, parts starting at sorted levels ``q``.

    With the lowest ``m`` parts below level ``l`` (and no others), levels ``<= l`` hold
    ``m * (l + 1) - sum(q[:m])`` slots; the answer is in the first span where that reaches
    ``count``.
    """
    total = 0
    for m, start in enumerate(q, start=1):
        total += start
        level = max(start, -(-(count + total) // m) - 1)
        if m == len(q) or level < q[m]:
            return level
    raise AssertionError("unreachable: the last span is unbounded")
