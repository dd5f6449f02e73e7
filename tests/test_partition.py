"""partition_requests: longest processing time first, checked against a plain loop and the
optimum found by brute force."""

from __future__ import annotations

import heapq
import itertools
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pypto_sched import InvalidInputError, Partition, partition_requests

weights_lists = st.lists(st.integers(min_value=1, max_value=60), min_size=1, max_size=200)
part_counts = st.integers(min_value=1, max_value=20)


def lpt_loop(weights: list[int], num_parts: int) -> list[int]:
    """The rule of the module docstring as a plain loop with a heap."""
    heap = [(0, part) for part in range(num_parts)]
    assignment = [0] * len(weights)
    for request in sorted(range(len(weights)), key=lambda r: (-weights[r], r)):
        load, part = heapq.heappop(heap)
        assignment[request] = part
        heapq.heappush(heap, (load + weights[request], part))
    return assignment


def optimal_makespan(weights: list[int], num_parts: int) -> int:
    best = sum(weights)
    for assignment in itertools.product(range(num_parts), repeat=len(weights)):
        loads = [0] * num_parts
        for weight, part in zip(weights, assignment, strict=True):
            loads[part] += weight
        best = min(best, max(loads))
    return best


def long_tailed(seed: int, count: int) -> np.ndarray:
    """Lognormal prompt lengths, mean about 1,000, tail cut at 32k (as in the issue)."""
    rng = np.random.default_rng(seed)
    lengths = np.round(rng.lognormal(np.log(1000) - 0.5, 1.0, count)).astype(np.int64) + 1
    return np.minimum(lengths, 32768)


@given(weights_lists, part_counts)
def test_every_request_is_in_exactly_one_part_in_ascending_order(
    weights: list[int], num_parts: int
) -> None:
    partition = partition_requests(weights, num_parts)
    assert len(partition.parts) == num_parts
    joined = np.concatenate(partition.parts)
    assert sorted(joined.tolist()) == list(range(len(weights)))
    for part in partition.parts:
        assert np.all(np.diff(part) > 0)
        assert not part.flags.writeable


@given(weights_lists, part_counts)
def test_the_partition_equals_the_plain_loop(weights: list[int], num_parts: int) -> None:
    assert partition_requests(weights, num_parts).assignment.tolist() == lpt_loop(
        weights, num_parts
    )


@given(
    st.lists(st.integers(min_value=0, max_value=12), min_size=1, max_size=30).map(
        lambda w: [x * 50 for x in w]  # runs of equal weight long enough to be placed at once
    ),  # (zero weights too: a run of them takes the plain loop, a slot of width 0 being none)
    part_counts,
)
def test_runs_of_equal_weight_are_placed_as_the_plain_loop_would(
    weights: list[int], num_parts: int
) -> None:
    repeated = [w for w in weights for _ in range(40)]
    partition = partition_requests([1] * len(repeated), num_parts, weights=repeated)
    assert partition.assignment.tolist() == lpt_loop(repeated, num_parts)


@given(
    st.lists(st.integers(min_value=1, max_value=30), min_size=1, max_size=7),
    st.integers(min_value=1, max_value=3),
)
def test_makespan_is_within_grahams_bound_of_the_optimum(
    weights: list[int], num_parts: int
) -> None:
    partition = partition_requests(weights, num_parts)
    optimum = optimal_makespan(weights, num_parts)
    assert partition.lower_bound <= optimum <= partition.makespan
    assert partition.makespan <= (Fraction(4, 3) - Fraction(1, 3 * num_parts)) * optimum


@given(weights_lists, part_counts)
def test_loads_add_up_and_the_bound_holds(weights: list[int], num_parts: int) -> None:
    partition = partition_requests(weights, num_parts)
    assert int(partition.loads.sum()) == sum(weights)
    assert partition.lower_bound == max(-(-sum(weights) // num_parts), max(weights))
    assert partition.makespan >= partition.lower_bound
    assert partition.makespan == int(partition.loads.max())
    assert partition.imbalance >= 1.0


@given(st.lists(st.integers(min_value=0, max_value=9), min_size=1, max_size=12), st.data())
def test_more_parts_than_requests_equal_the_plain_loop_zero_weights_too(
    weights: list[int], data: st.DataObject
) -> None:
    num_parts = data.draw(st.integers(min_value=len(weights), max_value=3 * len(weights) + 2))
    lengths = [1] * len(weights)
    assert partition_requests(lengths, num_parts, weights=weights).assignment.tolist() == (
        lpt_loop(weights, num_parts)
    )


def test_far_more_parts_than_requests_cost_nothing_for_the_parts_left_empty() -> None:
    # LPT gives each request its own part, lowest first; the empty parts are not built.
    partition = partition_requests([5, 3, 9], 2**31 - 1)
    assert partition.assignment.tolist() == [1, 2, 0]
    assert (partition.num_parts, partition.makespan, partition.lower_bound) == (2**31 - 1, 9, 9)
    assert partition.imbalance == 1.0


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("num_parts", [2, 4, 8, 16])
def test_long_tailed_batches_are_within_one_percent_of_the_bound(seed: int, num_parts: int) -> None:
    assert partition_requests(long_tailed(seed, 1024), num_parts).imbalance <= 1.01


def test_a_million_prompts_equal_the_plain_loop() -> None:
    lengths = long_tailed(0, 1_000_000)
    partition = partition_requests(lengths, 16)
    assert partition.assignment.tolist() == lpt_loop(lengths.tolist(), 16)
    assert partition.imbalance <= 1.0001


def test_prefix_hits_lighten_a_request() -> None:
    partition = partition_requests([100, 100, 10], 2, num_computed_tokens=[90, 0, 0])
    assert partition.weights.tolist() == [10, 100, 10]
    assert [part.tolist() for part in partition.parts] == [[1], [0, 2]]


def test_weights_replace_the_prompt_lengths() -> None:
    # Generation: balance prompt plus expected output tokens.
    partition = partition_requests([10, 10, 10], 2, weights=[10, 500, 10])
    assert [part.tolist() for part in partition.parts] == [[1], [0, 2]]
    assert partition.loads.tolist() == [500, 20]


def test_zero_weights_are_allowed() -> None:
    partition = partition_requests([1, 1, 1], 2, weights=[0, 0, 5])
    assert partition.makespan == 5
    assert partition.assignment.tolist() == lpt_loop([0, 0, 5], 2)


def test_more_parts_than_requests_leaves_parts_empty() -> None:
    partition = partition_requests([3, 5], 4)
    assert [part.tolist() for part in partition.parts] == [[1], [0], [], []]
    assert partition.makespan == partition.lower_bound == 5


def test_inputs_are_not_mutated_and_equal_inputs_give_equal_partitions() -> None:
    lengths = np.array([5, 9, 2, 7])
    first = partition_requests(lengths, 2)
    assert lengths.tolist() == [5, 9, 2, 7]
    assert first.assignment.tolist() == partition_requests([5, 9, 2, 7], 2).assignment.tolist()
    assert isinstance(first, Partition)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"prompt_lengths": [], "num_parts": 2}, "'prompt_lengths'"),
        ({"prompt_lengths": [0, 3], "num_parts": 2}, "'prompt_lengths'"),
        ({"prompt_lengths": [3], "num_parts": 0}, "'num_parts' must be >= 1: 0"),
        ({"prompt_lengths": [3], "num_parts": 2.0}, "'num_parts' must be an int"),
        ({"prompt_lengths": [3], "num_parts": 2, "weights": [1, 2]}, "'weights' must have one"),
        ({"prompt_lengths": [3], "num_parts": 2, "weights": [-1]}, "'weights'"),
        (
            {"prompt_lengths": [3], "num_parts": 2, "num_computed_tokens": [3]},
            "'num_computed_tokens' must be < the prompt length: request 0 has 3 of 3",
        ),
        (
            {"prompt_lengths": [3], "num_parts": 2, "num_computed_tokens": [1, 1]},
            "'num_computed_tokens' must have one",
        ),
    ],
)
def test_bad_input_is_rejected_naming_the_argument(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(InvalidInputError, match=match):
        partition_requests(**kwargs)  # type: ignore[arg-type]
