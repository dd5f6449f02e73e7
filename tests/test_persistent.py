"""The persistent containers behind ``PrefillState`` agree with a dict and a list, and no
update changes a map or queue that already exists."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pypto_sched import GenerationState, PagePool, PrefillState
from pypto_sched.core._persistent import Frozen, PersistentMap, PersistentQueue


class Collides:
    """A key whose hash is chosen, to force collisions and shared hash prefixes."""

    def __init__(self, name: int, hash_value: int) -> None:
        self.name = name
        self.hash_value = hash_value

    def __hash__(self) -> int:
        return self.hash_value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Collides) and other.name == self.name

    def __repr__(self) -> str:
        return f"Collides({self.name}, {self.hash_value})"


KEYS = st.one_of(
    st.integers(min_value=-40, max_value=40),
    st.builds(Collides, st.integers(0, 20), st.sampled_from([0, 1, 32, 1024, -1, 2**40])),
    st.text(max_size=2),
)
MAP_ACTIONS = st.lists(st.tuples(st.booleans(), KEYS, st.integers()), max_size=60)


@given(MAP_ACTIONS)
def test_a_persistent_map_agrees_with_a_dict_and_never_changes(
    actions: list[tuple[bool, Any, int]],
) -> None:
    model: dict[Any, int] = {}
    pmap: PersistentMap[Any, int] = PersistentMap()
    history = [(pmap, dict(model))]
    for is_set, key, value in actions:
        if is_set:
            pmap, model[key] = pmap.set(key, value), value
        elif key in model:
            pmap = pmap.delete(key)
            del model[key]
        else:
            try:
                pmap.delete(key)
            except KeyError:
                pass
            else:
                raise AssertionError(f"deleting absent {key!r} did not raise")
        history.append((pmap, dict(model)))
    for old, seen in history:
        assert len(old) == len(seen)
        assert dict(old.items()) == seen
        assert all(old.get(key) == value for key, value in seen.items())


QUEUE_ACTIONS = st.lists(st.one_of(st.integers(), st.none()), max_size=60)  # None: pop


@given(QUEUE_ACTIONS)
def test_a_persistent_queue_is_a_fifo_whose_front_is_never_empty_while_it_is_not(
    actions: list[int | None],
) -> None:
    model: list[int] = []
    queue: PersistentQueue[int] = PersistentQueue()
    history = [(queue, list(model))]
    for action in actions:
        if action is not None:
            queue = queue.push(action)
            model.append(action)
        elif model:
            assert queue.peek() == model[0]
            queue = queue.pop()
            model.pop(0)
        history.append((queue, list(model)))
        # peek never has to reverse the back list: the front holds an item when any is held
        assert bool(queue) == bool(model) == (queue._front is not None)
    for old, seen in history:
        assert list(old) == seen


@given(MAP_ACTIONS, st.lists(st.tuples(KEYS, st.integers()), max_size=40))
def test_a_map_updated_at_once_equals_one_set_after_another_and_leaves_the_old_map(
    actions: list[tuple[bool, Any, int]], items: list[tuple[Any, int]]
) -> None:
    pmap: PersistentMap[Any, int] = PersistentMap()
    for is_set, key, value in actions:  # a map of any shape, collisions included
        pmap = pmap.set(key, value) if is_set else pmap
    before = dict(pmap.items())
    one_by_one = pmap
    for key, value in items:
        one_by_one = one_by_one.set(key, value)
    updated = pmap.update(items)
    assert dict(updated.items()) == dict(one_by_one.items()) == {**before, **dict(items)}
    assert len(updated) == len(one_by_one)
    assert all(updated.get(key) == value for key, value in dict(items).items())
    assert dict(pmap.items()) == before  # unchanged
    # The updated map's nodes are its own: changing it further leaves `pmap` alone too.
    for key, _ in items:
        updated = updated.delete(key) if updated.get(key) is not None else updated
    assert dict(pmap.items()) == before


@given(
    st.lists(KEYS, min_size=20, max_size=90, unique_by=repr),
    st.randoms(use_true_random=False),
)
def test_a_map_growing_past_a_flat_dict_and_shrinking_back_agrees_with_a_dict(
    keys: list[Any], rng: Any
) -> None:
    # Small maps are one dict and bigger ones a trie (_FLAT_MAX): every size on the way up
    # and down, and a map from each side of the switch, must read the same.
    model: dict[Any, int] = {}
    pmap: PersistentMap[Any, int] = PersistentMap()
    seen = []
    for value, key in enumerate(keys):
        pmap, model[key] = pmap.set(key, value), value
        seen.append((pmap, dict(model)))
    pmap = pmap.update((key, -value) for value, key in enumerate(keys[:10]))
    model.update((key, -value) for value, key in enumerate(keys[:10]))
    seen.append((pmap, dict(model)))
    rng.shuffle(keys)
    for key in keys:
        if key in model:
            pmap = pmap.delete(key)
            del model[key]
            seen.append((pmap, dict(model)))
    for old, expected in seen:
        assert len(old) == len(expected)
        assert dict(old.items()) == expected
        assert all(old.get(key) == value for key, value in expected.items())
        assert old.get(object()) is None


@given(
    st.lists(
        st.tuples(st.sampled_from(["push", "push_front", "pop", "extend"]), st.integers(0, 20)),
        max_size=60,
    )
)
def test_a_ranked_queue_knows_its_length_and_two_highest_ranks_after_any_change(
    operations: list[tuple[str, int]],
) -> None:
    queue: PersistentQueue[tuple[int, int]] = PersistentQueue(lambda item: item[0])
    model: list[tuple[int, int]] = []
    for serial, (operation, rank) in enumerate(operations):
        before, saved = queue, list(model)
        item = (rank, serial)
        if operation == "push":
            queue, model = queue.push(item), [*model, item]
        elif operation == "push_front":
            queue, model = queue.push_front(item), [item, *model]
        elif operation == "extend":  # several at once (onto an empty queue: linked at once)
            items = [item, (rank // 2, -serial - 1)][: rank % 3]
            queue, model = queue.extend(items), [*model, *items]
        elif model:
            queue, model = queue.pop(), model[1:]
        assert list(queue) == model
        assert len(queue) == len(model)
        assert list(before) == saved  # the old queue is unchanged
        assert len(before) == len(saved)
        rank1, item1, rank2, item2 = queue.best()
        ranks = [*sorted((r for r, _ in model), reverse=True), -1, -1]
        assert (rank1, rank2) == (ranks[0], ranks[1])
        assert item1 is None or item1[0] == rank1
        assert item2 is None or item2[0] == rank2
        assert item1 is None or item1 is not item2


@given(st.integers(min_value=2, max_value=50), st.integers(min_value=2, max_value=3))
def test_popping_one_queue_again_reverses_its_back_once(size: int, pops: int) -> None:
    # Planning twice from one state pops one queue twice: the second pop must not reverse
    # the back list again (it cost O(n) a call), and both pops give the same queue.
    queue: PersistentQueue[int] = PersistentQueue(lambda item: item)
    for item in range(size):
        queue = queue.push(item)
    popped = [queue.pop() for _ in range(pops)]
    assert all(p is popped[0] for p in popped)
    assert list(popped[0]) == list(range(1, size))
    assert popped[0].best()[:3:2] == (size - 1, size - 2 if size > 2 else -1)
    assert list(queue) == list(range(size))  # the queue popped is unchanged


class _Point(Frozen):
    __slots__ = ("_x", "_y")

    _x: int
    _y: int


def test_a_frozen_value_is_built_with_every_field_and_never_changed() -> None:
    point = _Point._build(x=1, y=2)
    assert (point._x, point._y) == (1, 2)
    moved = point._replace(y=5)
    assert (moved._x, moved._y, point._y) == (1, 5, 2)
    with pytest.raises(TypeError, match=r"_Point needs every field: missing \['y'\]"):
        _Point._build(x=1)
    with pytest.raises(AttributeError, match="_Point is immutable: cannot set '_x'"):
        point._x = 3
    with pytest.raises(AttributeError, match="cannot delete"):
        del point._y


STATES: list[tuple[Frozen, set[str]]] = [
    (PrefillState(), {"requests", "queue", "started", "num_tokens", "policy"}),
    (
        PagePool(num_pages=2, page_size=4),
        {"num_pages", "page_size", "owned", "freed", "num_freed", "unused"},
    ),
    (
        GenerationState(num_pages=2, page_size=4),
        {"sequences", "prefill", "decoding", "pool", "next_arrival"},
    ),
]


@pytest.mark.parametrize(("value", "fields"), STATES)
def test_the_three_states_are_built_by_the_one_mechanism(value: Frozen, fields: set[str]) -> None:
    assert set(type(value)._setters) == fields
    assert value._replace() is not value
    with pytest.raises(AttributeError, match="immutable"):
        value._anything = 1
