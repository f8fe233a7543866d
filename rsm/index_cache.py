"""A cache of verified packed-index sections (Kafka's indexes and the chunk index), bounded in bytes and in time,
keyed by segment id and section type.

It lets the broker's three consecutive fetch_index calls (OFFSET, TIMESTAMP, TRANSACTION) cost one request.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from rsm.metrics import Metrics
from rsm.packed_index import SectionType

# Charged per entry on top of its bytes, so that many tiny or absent entries are bounded too.
ENTRY_OVERHEAD_BYTES = 64


@dataclass(frozen=True, slots=True)
class CachedIndex:
    """A cache hit: the index bytes, or None when the segment is known to have no such index."""

    data: bytes | None


class IndexCache:
    def __init__(
        self,
        max_bytes: int,
        ttl_seconds: float,
        metrics: Metrics,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._max_bytes = max_bytes
        self._ttl = ttl_seconds
        self._metrics = metrics
        self._clock = clock
        self._lock = threading.Lock()
        self._entries: OrderedDict[tuple[uuid.UUID, SectionType], tuple[CachedIndex, float]] = OrderedDict()
        self._bytes = 0

    @staticmethod
    def _cost(entry: CachedIndex) -> int:
        return ENTRY_OVERHEAD_BYTES + (len(entry.data) if entry.data is not None else 0)

    def get(self, segment: uuid.UUID, index_type: SectionType, counted: bool = True) -> CachedIndex | None:
        """The cached entry, or None on a miss (never cached, evicted, or older than the TTL). `counted`: in the
        hit and miss counters, which tell how the broker's index calls are served (a segment read's chunk-index
        lookup is not one)."""
        key = (segment, index_type)
        with self._lock:
            found = self._entries.get(key)
            if found is not None and found[1] <= self._clock():
                self._remove(key)
                self._metrics.increment("index_cache.expirations")
                found = None
            if found is None:
                if counted:
                    self._metrics.increment("index_cache.misses")
                return None
            self._entries.move_to_end(key)
            if counted:
                self._metrics.increment("index_cache.hits")
            return found[0]

    def put(self, segment: uuid.UUID, indexes: Mapping[SectionType, bytes | None]) -> None:
        """Cache `indexes` of one segment; a None value records that the segment has no such index."""
        expires = self._clock() + self._ttl
        with self._lock:
            for index_type, data in indexes.items():
                entry = CachedIndex(data)
                cost = self._cost(entry)
                key = (segment, index_type)
                self._remove(key)
                if cost > self._max_bytes:
                    continue
                self._entries[key] = (entry, expires)
                self._bytes += cost
            while self._bytes > self._max_bytes:
                oldest = next(iter(self._entries))
                self._remove(oldest)
                self._metrics.increment("index_cache.evictions")

    def invalidate(self, segment: uuid.UUID) -> None:
        with self._lock:
            for key in [k for k in self._entries if k[0] == segment]:
                self._remove(key)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0

    @property
    def size_bytes(self) -> int:
        with self._lock:
            return self._bytes

    def _remove(self, key: tuple[uuid.UUID, SectionType]) -> None:
        found = self._entries.pop(key, None)
        if found is not None:
            self._bytes -= self._cost(found[0])


__all__ = ["ENTRY_OVERHEAD_BYTES", "CachedIndex", "IndexCache"]
