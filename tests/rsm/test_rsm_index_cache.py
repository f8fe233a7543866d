"""The packed-index cache: bounded by bytes and by time, invalidated per segment."""

from __future__ import annotations

import uuid

from rsm.index_cache import ENTRY_OVERHEAD_BYTES, CachedIndex, IndexCache
from rsm.metrics import Metrics
from rsm.types import IndexType


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _cache(max_bytes: int = 10_000, ttl: float = 60.0) -> tuple[IndexCache, FakeClock]:
    clock = FakeClock()
    return IndexCache(max_bytes, ttl, Metrics(), clock), clock


def test_a_cached_index_is_returned() -> None:
    cache, _ = _cache()
    segment = uuid.uuid4()
    cache.put(segment, {IndexType.OFFSET: b"abc"})
    assert cache.get(segment, IndexType.OFFSET) == CachedIndex(b"abc")


def test_a_known_absent_index_is_a_hit_with_no_data() -> None:
    cache, _ = _cache()
    segment = uuid.uuid4()
    cache.put(segment, {IndexType.TRANSACTION: None})
    assert cache.get(segment, IndexType.TRANSACTION) == CachedIndex(None)


def test_an_entry_older_than_the_ttl_is_a_miss() -> None:
    cache, clock = _cache(ttl=5.0)
    segment = uuid.uuid4()
    cache.put(segment, {IndexType.OFFSET: b"abc"})
    clock.now += 5.0
    assert cache.get(segment, IndexType.OFFSET) is None
    assert cache.size_bytes == 0


def test_least_recently_used_entries_are_evicted_to_stay_within_the_byte_bound() -> None:
    cache, _ = _cache(max_bytes=3 * (ENTRY_OVERHEAD_BYTES + 100))
    first, second, third, fourth = (uuid.uuid4() for _ in range(4))
    for segment in (first, second, third):
        cache.put(segment, {IndexType.OFFSET: bytes(100)})
    cache.get(first, IndexType.OFFSET)
    cache.put(fourth, {IndexType.OFFSET: bytes(100)})
    assert cache.get(second, IndexType.OFFSET) is None
    assert cache.get(first, IndexType.OFFSET) is not None
    assert cache.size_bytes <= 3 * (ENTRY_OVERHEAD_BYTES + 100)


def test_an_entry_bigger_than_the_whole_cache_is_not_kept() -> None:
    cache, _ = _cache(max_bytes=1000)
    segment = uuid.uuid4()
    cache.put(segment, {IndexType.OFFSET: bytes(2000)})
    assert cache.get(segment, IndexType.OFFSET) is None
    assert cache.size_bytes == 0


def test_invalidate_drops_every_index_of_one_segment_only() -> None:
    cache, _ = _cache()
    gone, kept = uuid.uuid4(), uuid.uuid4()
    cache.put(gone, {IndexType.OFFSET: b"a", IndexType.TIMESTAMP: b"b"})
    cache.put(kept, {IndexType.OFFSET: b"c"})
    cache.invalidate(gone)
    assert cache.get(gone, IndexType.OFFSET) is None
    assert cache.get(gone, IndexType.TIMESTAMP) is None
    assert cache.get(kept, IndexType.OFFSET) == CachedIndex(b"c")


def test_a_zero_byte_cache_caches_nothing() -> None:
    cache, _ = _cache(max_bytes=0)
    segment = uuid.uuid4()
    cache.put(segment, {IndexType.OFFSET: b""})
    assert cache.get(segment, IndexType.OFFSET) is None
