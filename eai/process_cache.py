"""Per-process caches of what every call reads: values as last read, kept `ttl` seconds.

Used for API keys, resolved tools and a tenant's known secrets. Each owner clears its
cache when the value changes in the same process; other processes see the change at most
`ttl` late.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

V = TypeVar("V")


class ProcessCache(Generic[V]):
    """`get(key, load)` returns the cached value or `load(key)`'s, kept `ttl` seconds when
    `keep(value)` (by default: not None, so unknown ids do not fill memory). Past
    `max_entries` the cache starts over rather than grow."""

    def __init__(
        self,
        ttl: float,
        *,
        keep: Callable[[V], bool] = lambda value: value is not None,
        max_entries: int = 10_000,
    ) -> None:
        self.ttl = ttl
        self.keep = keep
        self.max_entries = max_entries
        self._entries: dict[Hashable, tuple[float, V]] = {}

    def get(self, key: Hashable, load: Callable[[Hashable], V]) -> V:
        now = time.monotonic()
        hit = self._entries.get(key)
        if hit is not None and hit[0] > now:
            return hit[1]
        value = load(key)
        if self.keep(value):
            if len(self._entries) >= self.max_entries:
                self._entries.clear()
            self._entries[key] = (now + self.ttl, value)
        return value

    def peek(self, key: Hashable) -> V | None:
        """The cached value if still fresh, else None; never loads."""
        hit = self._entries.get(key)
        if hit is not None and hit[0] > time.monotonic():
            return hit[1]
        return None

    def forget(self, key: Hashable) -> None:
        self._entries.pop(key, None)

    def clear(self) -> None:
        self._entries.clear()
