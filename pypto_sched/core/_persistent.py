"""Persistent (immutable, structure-sharing) containers for ``PrefillState``.

``PrefillState`` must hand back a new state from every add, remove and planned step while
the old state stays valid, and a step must cost the same with ten waiting requests as with
ten thousand. Copying a dict or tuple of every request per step would make each step linear
in the number of requests, so the state is built from these two containers instead.

:class:`PersistentQueue` is a FIFO made of two immutable linked lists (Okasaki's banker's
queue): items are taken from the front list and pushed onto the back list, newest first; when
the front runs out, the back list reversed becomes the new front. Each item is moved once, so
a push or a pop costs O(1) amortized, and nothing is copied.

:class:`PersistentMap` is a hash array mapped trie whose nodes are small dicts keyed by 5-bit
slices of the key's hash. An update copies only the nodes on one root-to-leaf path (about
``log32(n)`` dicts of at most 32 entries); every other node is shared with the old map. A map
of at most 32 keys is instead one plain dict, copied on every update: copying it costs about
what copying a trie node does, and reading it is a dict's own lookup (a small state's
requests are such a map, read and updated on every step). A :class:`WideMap` stays one dict
up to 256 keys: a page pool's owners, read for every row of a planned step and many of them
updated at once, for which one dict copy beats a trie's update of each key.

Nodes are plain ``dict[int, node | leaf]``. A leaf is ``(hash, ((key, value), ...))``: all
its keys share the full hash, so a leaf holds more than one pair only on a hash collision.
Python hashes fit in 64 bits, so two different hashes differ in some 5-bit slice within 13
levels and inserting always terminates.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from typing import Any, ClassVar, Generic, NoReturn, Self, TypeVar, cast

# No ``__all__``: these containers are internal to ``PrefillState``, not public API.

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")
T = TypeVar("T")


class Frozen:
    """Base of the hand-built immutable values (``PrefillState``, ``PagePool``,
    ``GenerationState``), the one way they are made and changed.

    A subclass names its fields in ``__slots__`` (each with a leading ``_``: ``_pool`` is the
    field ``pool``). :meth:`_build` makes a value of every field, :meth:`_fill` sets them on
    a value being constructed (from ``__init__``), and :meth:`_replace` copies a value with
    some fields changed. They set the slots through their descriptors, about a third of the
    time of ``object.__setattr__`` (a state is built on every planned step, and
    ``attrs.frozen`` would pay ``object.__setattr__``); setting or deleting an attribute
    afterwards is an ``AttributeError``. A field left out is a ``TypeError``, never a value
    with an unset slot.
    """

    __slots__ = ()

    #: Each field's setter and getter (its slot's descriptor), in ``__slots__`` order.
    _setters: ClassVar[dict[str, Callable[[Any, Any], None]]] = {}
    _getters: ClassVar[dict[str, Callable[[Any], Any]]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        slots = cls.__dict__.get("__slots__", ())
        if slots:
            descriptors = {name.removeprefix("_"): cls.__dict__[name] for name in slots}
            # (Set on the class: the instances' __setattr__ below does not apply.)
            type.__setattr__(
                cls, "_setters", {n: d.__set__ for n, d in descriptors.items()} | cls._setters
            )
            type.__setattr__(
                cls, "_getters", {n: d.__get__ for n, d in descriptors.items()} | cls._getters
            )

    def _fill(self, **fields: Any) -> None:
        self._set_fields(fields)

    def _set_fields(self, fields: dict[str, Any]) -> None:
        setters = self._setters
        # (As many fields as slots, each a slot: every slot set. Cheaper than comparing the
        # names as sets, and a value is built on every planned step.)
        if len(fields) == len(setters):
            try:
                for name, value in fields.items():
                    setters[name](self, value)
                return
            except KeyError:
                pass
        missing = sorted(setters.keys() - fields.keys())
        unknown = sorted(fields.keys() - setters.keys())
        raise TypeError(
            f"{type(self).__name__} needs every field: missing {missing}, unknown {unknown}"
        )

    @classmethod
    def _build(cls, **fields: Any) -> Self:
        """A new value of ``fields`` (every one)."""
        new = object.__new__(cls)
        new._set_fields(fields)
        return new

    def _replace(self, **changes: Any) -> Self:
        """A copy of this value with ``changes``; this one is not changed."""
        fields = {name: get(self) for name, get in self._getters.items()}
        fields.update(changes)
        return self._build(**fields)

    def __setattr__(self, name: str, value: object) -> NoReturn:
        raise AttributeError(f"{type(self).__name__} is immutable: cannot set {name!r}")

    def __delattr__(self, name: str) -> NoReturn:
        raise AttributeError(f"{type(self).__name__} is immutable: cannot delete {name!r}")


# A linked list: ``(first item, rest of the list, best)``, or ``None`` when empty; ``best`` is
# the two highest-ranked items of the node and the rest (see PersistentQueue), or ``None``.
_Link = tuple[Any, Any, Any] | None
# The two highest ranks and their items, highest first: ``(rank, item, rank, item)``; a rank
# of -1 (and item None) where there are fewer than two items.
Best = tuple[int, Any, int, Any]
NO_BEST: Best = (-1, None, -1, None)


def merge_best(a: Best, b: Best) -> Best:
    """The two highest of two ``Best`` (of equal ranks, either)."""
    if a[0] >= b[0]:
        return a if a[2] >= b[0] else (a[0], a[1], b[0], b[1])
    return b if b[2] > a[0] else (b[0], b[1], a[0], a[1])


class PersistentQueue(Generic[T]):
    """An immutable FIFO whose push and pop return a new queue and cost O(1) amortized.

    Invariant: the front list is empty only when the whole queue is, so :meth:`peek` never
    has to reverse anything; the reversal happens in the :meth:`pop` that takes the last item
    of the front, and the queue it returns keeps the result. So does the queue popped: its
    :meth:`pop` returns that queue again, so popping one queue twice (planning again from the
    same state) reverses once, not once a call. (A cache of a value that never changes: the
    queue stays immutable.)

    Built with a ``rank`` (an int >= 0 per item), it also keeps the two highest-ranked items
    (:meth:`best`): each front node holds those of itself and the nodes after it, each back
    node those of itself and the older back nodes (a max-queue), at O(1) amortized a push or
    pop still.
    """

    __slots__ = ("_back", "_front", "_length", "_popped", "_rank")

    _front: _Link  # oldest item first
    _back: _Link  # newest item first
    _length: int
    _rank: Callable[[T], int] | None
    _popped: PersistentQueue[T] | None  # pop()'s result, kept when it reversed the back

    def __init__(self, rank: Callable[[T], int] | None = None) -> None:
        self._front = None
        self._back = None
        self._length = 0
        self._rank = rank
        self._popped = None

    def _make(self, front: _Link, back: _Link, length: int) -> PersistentQueue[T]:
        new: PersistentQueue[T] = object.__new__(PersistentQueue)
        new._front = front
        new._back = back
        new._length = length
        new._rank = self._rank
        new._popped = None
        return new

    def _link(self, item: T, rest: _Link) -> _Link:
        """A node of ``item`` before ``rest``, with the best of both."""
        rank = self._rank
        if rank is None:
            return (item, rest, None)
        own: Best = (rank(item), item, -1, None)
        return (item, rest, own if rest is None else merge_best(own, rest[2]))

    def __bool__(self) -> bool:
        return self._front is not None

    def __len__(self) -> int:
        return self._length

    def push(self, item: T) -> PersistentQueue[T]:
        """A queue with ``item`` added at the back."""
        if self._front is None:
            return self._make(self._link(item, None), None, 1)
        return self._make(self._front, self._link(item, self._back), self._length + 1)

    def extend(self, items: Sequence[T]) -> PersistentQueue[T]:
        """A queue with ``items`` added at the back, in order: equal to a :meth:`push` of
        each (onto an empty queue, its items are linked in one pass and the queue built
        once)."""
        if not items:
            return self
        if self._front is not None:
            queue = self
            for item in items:
                queue = queue.push(item)
            return queue
        link: _Link = None
        for item in reversed(items):  # (the front list holds the oldest first)
            link = self._link(item, link)
        return self._make(link, None, len(items))

    def push_front(self, item: T) -> PersistentQueue[T]:
        """A queue with ``item`` added at the front (it is the next :meth:`peek`)."""
        return self._make(self._link(item, self._front), self._back, self._length + 1)

    def peek(self) -> T:
        """The item at the front; ``IndexError`` if the queue is empty."""
        if self._front is None:
            raise IndexError("peek at an empty PersistentQueue")
        return cast(T, self._front[0])

    def pop(self) -> PersistentQueue[T]:
        """The queue without its front item; ``IndexError`` if it is empty."""
        if self._front is None:
            raise IndexError("pop from an empty PersistentQueue")
        front, back = self._front[1], self._back
        if front is None and back is not None:  # the back list, reversed, becomes the front
            if self._popped is not None:
                return self._popped
            while back is not None:
                front = self._link(back[0], front)
                back = back[1]
            self._popped = self._make(front, back, self._length - 1)
            return self._popped
        return self._make(front, back, self._length - 1)

    def best(self) -> Best:
        """The two highest-ranked items (of equal ranks, any), as ``(rank, item, rank,
        item)``; ``NO_BEST``'s entries where there are fewer. Only for a queue built with a
        ``rank``."""
        front, back = self._front, self._back
        if front is None:
            return NO_BEST
        return front[2] if back is None else merge_best(front[2], back[2])

    def __iter__(self) -> Iterator[T]:
        """The items, oldest first."""
        link = self._front
        while link is not None:
            yield link[0]
            link = link[1]
        newest_first = []
        link = self._back
        while link is not None:
            newest_first.append(link[0])
            link = link[1]
        yield from reversed(newest_first)


_BITS = 5
_MASK = (1 << _BITS) - 1

# A node maps a hash slice to a child node or a leaf; typed loosely to stay readable.
_Node = dict[int, Any]
_Leaf = tuple[int, tuple[tuple[Any, Any], ...]]


class PersistentMap(Generic[K, V]):
    """An immutable mapping whose updates return a new map sharing most of the old one."""

    __slots__ = ("_flat", "_root", "_size")

    #: The most keys a map holds as one plain dict; a trie that shrinks to half of it becomes
    #: one again. (Class-wide: every map built from this one is of its class.)
    _FLAT_MAX = 32

    _flat: dict[K, V] | None  # the whole map while small; then None and the trie in _root
    _root: _Node
    _size: int

    def __init__(self) -> None:
        self._flat = {}
        self._root = {}
        self._size = 0

    def _make(self, root: _Node, size: int) -> PersistentMap[K, V]:
        """A map of this one's class, of the trie ``root`` holding ``size`` keys (a flat one
        if that is small)."""
        new: PersistentMap[K, V] = object.__new__(type(self))
        new._flat = None
        new._root = root
        new._size = size
        if size <= self._FLAT_MAX // 2:
            new._flat = dict(new._trie_items())
            new._root = {}
        return new

    def _make_flat(self, flat: dict[K, V]) -> PersistentMap[K, V]:
        """A map of this one's class, of the dict ``flat`` (which it keeps), a trie if
        ``flat`` is too big."""
        if len(flat) > self._FLAT_MAX:
            root: _Node = {}
            _bind_in_place(root, {id(root)}, flat.items())
            return self._make(root, len(flat))
        new: PersistentMap[K, V] = object.__new__(type(self))
        new._flat = flat
        new._root = {}
        new._size = len(flat)
        return new

    def __len__(self) -> int:
        return self._size

    def get(self, key: K, default: V | None = None) -> V | None:
        """The value of ``key``, or ``default`` if it is absent."""
        flat = self._flat
        if flat is not None:
            return flat.get(key, default)
        h = hash(key)
        node = self._root
        shift = 0
        while True:
            child = node.get((h >> shift) & _MASK)
            if child is None:
                return default
            if type(child) is dict:
                node = child
                shift += _BITS
                continue
            if child[0] == h:
                for k, v in child[1]:
                    if k is key or k == key:
                        return cast(V, v)
            return default

    def set(self, key: K, value: V) -> PersistentMap[K, V]:
        """A map equal to this one with ``key`` bound to ``value``."""
        if self._flat is not None:
            flat = self._flat.copy()
            flat[key] = value
            return self._make_flat(flat)
        h = hash(key)
        root, added = _assoc(self._root, 0, h, key, value)
        return self._make(root, self._size + added)

    def update(self, items: Iterable[tuple[K, V]]) -> PersistentMap[K, V]:
        """A map equal to this one with each ``(key, value)`` of ``items`` bound, in order.

        The same map as a chain of :meth:`set` calls, built with each node on the updated
        paths copied once rather than once per key (a step updates many keys at once)."""
        if self._flat is not None:
            flat = self._flat.copy()
            flat.update(items)
            return self._make_flat(flat)
        root = self._root.copy()
        return self._make(root, self._size + _bind_in_place(root, {id(root)}, items))

    def delete(self, key: K) -> PersistentMap[K, V]:
        """A map equal to this one without ``key``; ``KeyError`` if it is absent."""
        if self._flat is not None:
            flat = self._flat.copy()
            del flat[key]  # KeyError if absent
            return self._make_flat(flat)
        h = hash(key)
        root = _dissoc(self._root, 0, h, key)
        if root is _ABSENT:
            raise KeyError(key)
        if root is None:
            return self._make({}, 0)
        if type(root) is not dict:  # the trie collapsed to a lone leaf
            leaf = cast(_Leaf, root)
            return self._make({leaf[0] & _MASK: leaf}, self._size - 1)
        return self._make(root, self._size - 1)

    def items(self) -> Iterator[tuple[K, V]]:
        """Every ``(key, value)`` pair, in no particular order."""
        if self._flat is not None:
            return iter(self._flat.items())
        return self._trie_items()

    def _trie_items(self) -> Iterator[tuple[K, V]]:
        stack = [self._root]
        while stack:
            for child in stack.pop().values():
                if type(child) is dict:
                    stack.append(child)
                else:
                    yield from child[1]


class WideMap(PersistentMap[K, V]):
    """A :class:`PersistentMap` that stays one plain dict up to 256 keys: for a map whose
    updates change many of its keys at once and which is read on every step (a page pool's
    owners: each planned step grows every running request's table). Copying a dict of 256
    keys costs about what a trie update of one key does, and reading it is a dict's own."""

    __slots__ = ()

    _FLAT_MAX = 256


def _bind_in_place(root: _Node, copied: set[int], items: Iterable[tuple[Any, Any]]) -> int:
    """Bind each ``(key, value)`` of ``items`` in the trie ``root``, changing in place the
    nodes whose ids are in ``copied`` (the new map's own) and copying any other node on a
    path before changing it (once: the copy joins ``copied``). Returns how many keys were
    new."""
    added = 0
    for key, value in items:
        h = hash(key)
        node, shift = root, 0
        while True:
            fragment = (h >> shift) & _MASK
            child = node.get(fragment)
            if type(child) is dict:
                if id(child) not in copied:
                    child = node[fragment] = child.copy()
                    copied.add(id(child))
                node, shift = child, shift + _BITS
                continue
            if child is None:
                node[fragment] = (h, ((key, value),))
                added += 1
            elif child[0] == h:
                kept = _without_key(child[1], key)
                node[fragment] = (h, (*kept, (key, value)))
                added += len(kept) == len(child[1])
            else:  # (the new nodes of a split are not in `copied`: changing them copies)
                node[fragment] = _split(child, (h, ((key, value),)), shift + _BITS)
                added += 1
            break
    return added


def _assoc(node: _Node, shift: int, h: int, key: Any, value: Any) -> tuple[_Node, bool]:
    """``node`` with ``key`` bound; also whether the key was new."""
    fragment = (h >> shift) & _MASK
    child = node.get(fragment)
    new = node.copy()
    if child is None:
        new[fragment] = (h, ((key, value),))
        return new, True
    if type(child) is dict:
        new[fragment], added = _assoc(child, shift + _BITS, h, key, value)
        return new, added
    if child[0] == h:
        kept = _without_key(child[1], key)
        new[fragment] = (h, (*kept, (key, value)))
        return new, len(kept) == len(child[1])
    new[fragment] = _split(child, (h, ((key, value),)), shift + _BITS)
    return new, True


def _split(a: _Leaf, b: _Leaf, shift: int) -> _Node:
    """The smallest subtrie holding two leaves of different hashes."""
    fa, fb = (a[0] >> shift) & _MASK, (b[0] >> shift) & _MASK
    if fa == fb:
        return {fa: _split(a, b, shift + _BITS)}
    return {fa: a, fb: b}


def _without_key(pairs: tuple[tuple[Any, Any], ...], key: Any) -> tuple[tuple[Any, Any], ...]:
    if len(pairs) == 1:  # the usual leaf: no hash collision
        k = pairs[0][0]
        return () if k is key or k == key else pairs
    return tuple(pair for pair in pairs if not (pair[0] is key or pair[0] == key))


class _Absent:
    """Returned by ``_dissoc`` when the key is not in the subtrie."""


_ABSENT = _Absent()


def _dissoc(node: _Node, shift: int, h: int, key: Any) -> _Node | _Leaf | _Absent | None:
    """``node`` without ``key``: a node, a lone leaf that may replace it, ``None`` if nothing
    is left, or ``_ABSENT`` if the key is not there."""
    fragment = (h >> shift) & _MASK
    child = node.get(fragment)
    if child is None:
        return _ABSENT
    replacement: _Node | _Leaf | _Absent | None
    if type(child) is dict:
        replacement = _dissoc(child, shift + _BITS, h, key)
    elif child[0] != h:
        return _ABSENT
    else:
        pairs = _without_key(child[1], key)
        if len(pairs) == len(child[1]):
            return _ABSENT
        replacement = (h, pairs) if pairs else None
    if replacement is _ABSENT:
        return _ABSENT
    new = node.copy()
    if replacement is None:
        del new[fragment]
    else:
        new[fragment] = replacement
    if not new:
        return None
    if len(new) == 1:
        (only,) = new.values()
        if type(only) is not dict:
            return cast(_Leaf, only)  # a lone leaf moves up; lookups compare full hashes
    return new
