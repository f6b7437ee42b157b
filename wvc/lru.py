"""The one bounded cache: a map that drops its least recently used entries once their total
weight passes a limit.

Every cache of the process is one of these, bounded either by a count (each entry weighs 1:
trees, merged indexes, prune estimates) or by bytes (``weight=len`` for decoded chunks, a
parsed catalog's held bytes). Entries are immutable things named by their content (a chunk
id, a catalog's hash) or results that are only ever replaced whole, so a hit never needs
checking. Safe to share between threads: each call holds the cache's lock only for the map
itself, never while a value is computed.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Callable, Generic, Hashable, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")
_MISSING = object()


def _one(_value) -> int:
    return 1


class LRUCache(Generic[K, V]):
    """At most ``limit`` of total ``weight`` (default: 1 an entry, so ``limit`` entries). An
    entry heavier than the whole limit is not kept."""

    def __init__(self, limit: int, weight: Callable[[V], int] = _one):
        self.limit, self.weight = limit, weight
        self.size = 0  # the entries' total weight
        self.made = 0  # values get_or_make had to make (tests count them)
        self._items: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key) -> bool:
        return key in self._items

    def get(self, key: K, default=None):
        """The value (now the most recently used), else ``default``."""
        with self._lock:
            hit = self._items.get(key, _MISSING)
            if hit is _MISSING:
                return default
            self._items.move_to_end(key)
            return hit[0]

    def __getitem__(self, key: K) -> V:
        value = self.get(key, _MISSING)
        if value is _MISSING:
            raise KeyError(key)
        return value

    def put(self, key: K, value: V) -> None:
        """Keep ``value`` as the most recently used, dropping the least recently used ones
        until the total weight is within the limit."""
        w = self.weight(value)
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self.size -= old[1]
            if w > self.limit:
                return
            self._items[key] = (value, w)
            self.size += w
            while self.size > self.limit:
                self.size -= self._items.popitem(last=False)[1][1]

    __setitem__ = put

    def get_or_make(self, key: K, make: Callable[[], V]) -> V:
        """The cached value, else ``make()`` kept and returned (two threads missing at once
        may both make it: the values are equal)."""
        value = self.get(key, _MISSING)
        if value is _MISSING:
            value = make()
            self.made += 1
            self.put(key, value)
        return value

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self.size = 0
