"""A small LRU cache of plans, keyed by layout digest and planning options."""
from __future__ import annotations

from collections import OrderedDict
from typing import Any, Callable, Hashable


class PlanCache:
    """Least-recently-used cache (plain data); an SP group holds one (``SPGroup.plan_cache``), offline planning none."""

    def __init__(self, maxsize: int = 64) -> None:
        if maxsize < 1:
            raise ValueError("PlanCache maxsize must be >= 1")
        self.maxsize = maxsize
        self._data: OrderedDict[Hashable, Any] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def get_or_build(self, key: Hashable, build: Callable[[], Any]) -> Any:
        """Return the cached value for ``key``, building (and caching) it on a miss."""
        if key in self._data:
            self._data.move_to_end(key)
            self.hits += 1
            return self._data[key]
        self.misses += 1
        value = build()
        self._data[key] = value
        if len(self._data) > self.maxsize:
            self._data.popitem(last=False)
        return value

    def clear(self) -> None:
        """Drop every cached plan (the hit and miss counters stay)."""
        self._data.clear()

    def __len__(self) -> int:
        return len(self._data)
