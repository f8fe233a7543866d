"""Prefetch: a sequential reader's next chunks are fetched ahead into the chunk cache, into the next segment
of the partition when the caller named it (hint_next_segment).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from rsm_testkit import SegmentFactory, SegmentFixture

from rlmm.types import RemoteLogSegmentMetadata
from rsm import RemoteStorageManager

CHUNK = 16 << 10
SEGMENT = 200_000
CHUNKS = -(-SEGMENT // CHUNK)
WAIT_S = 30.0


@pytest.fixture
def rsm(backend_config: dict[str, Any], tmp_path: Path) -> Any:
    config = {
        **backend_config, "chunk.size": CHUNK, "fetch.chunk.cache.class": "disk",
        "fetch.chunk.cache.path": str(tmp_path / "cache"), "fetch.chunk.cache.prefetch.max.size": 2 * CHUNK,
    }
    with RemoteStorageManager(config) as manager:
        yield manager


def _copy(rsm: RemoteStorageManager, segment: SegmentFixture) -> RemoteLogSegmentMetadata:
    return segment.with_custom_metadata(rsm.copy_log_segment_data(segment.metadata, segment.data))


def _counter(rsm: RemoteStorageManager, name: str) -> int:
    return int(rsm.metrics()["counters"].get(name, 0))


def test_a_sequential_reader_finds_its_next_chunks_prefetched(
    rsm: RemoteStorageManager, make_segment: SegmentFactory
) -> None:
    segment = make_segment(log_size=SEGMENT)
    metadata = _copy(rsm, segment)
    # As the broker reads: a call per fetch, from the next position to the end, closed after a few KiB.
    position, step = 0, 6000
    while position < SEGMENT:
        with rsm.fetch_log_segment(metadata, position) as stream:
            got = b""
            while len(got) < step and (piece := stream.read(step - len(got))):
                got += piece
            assert got == segment.log_bytes[position : position + step]
        position += step
        assert rsm.prefetch_idle(WAIT_S)
    # Only the very first chunk was a miss; every later one was fetched ahead of the reader.
    assert _counter(rsm, "chunk_cache.misses") == 1
    assert _counter(rsm, "chunk_cache.prefetched_chunks") == CHUNKS - 1


def test_prefetch_crosses_into_the_next_segment_the_caller_named(
    rsm: RemoteStorageManager, make_segment: SegmentFactory
) -> None:
    first, second = make_segment(log_size=SEGMENT, seed=1), make_segment(log_size=SEGMENT, seed=2)
    first_md, second_md = _copy(rsm, first), _copy(rsm, second)
    rsm.hint_next_segment(first_md, second_md)
    # Its last two chunks, read in turn: the read-ahead grows to the whole prefetch size.
    tail = (CHUNKS - 2) * CHUNK
    with rsm.fetch_log_segment(first_md, tail) as stream:
        assert stream.read() == first.log_bytes[tail:]
    assert rsm.prefetch_idle(WAIT_S)
    before = {name: _counter(rsm, name) for name in ("chunk_cache.misses", "chunk_cache.hits", "index_cache.misses")}
    # The reader crosses the boundary: the next segment's first two chunks are already here, index and all.
    with rsm.fetch_log_segment(second_md, 0, 2 * CHUNK - 1) as stream:
        assert stream.read() == second.log_bytes[: 2 * CHUNK]
    after = {name: _counter(rsm, name) for name in before}
    assert after == before | {"chunk_cache.hits": before["chunk_cache.hits"] + 2}


def test_without_a_hint_nothing_of_another_segment_is_prefetched(
    rsm: RemoteStorageManager, make_segment: SegmentFactory
) -> None:
    first, second = make_segment(log_size=SEGMENT, seed=1), make_segment(log_size=SEGMENT, seed=2)
    first_md, second_md = _copy(rsm, first), _copy(rsm, second)
    with rsm.fetch_log_segment(first_md, (CHUNKS - 1) * CHUNK) as stream:
        stream.read()
    assert rsm.prefetch_idle(WAIT_S)
    misses = _counter(rsm, "chunk_cache.misses")
    with rsm.fetch_log_segment(second_md, 0, 100) as stream:
        stream.read()
    assert _counter(rsm, "chunk_cache.misses") == misses + 1


def test_a_whole_segment_read_prefetches_nothing_of_it_its_own_get_brings_every_chunk(
    rsm: RemoteStorageManager, make_segment: SegmentFactory
) -> None:
    segment = make_segment(log_size=SEGMENT)
    metadata = _copy(rsm, segment)
    with rsm.fetch_log_segment(metadata, 0) as stream:
        assert stream.read() == segment.log_bytes
    assert rsm.prefetch_idle(WAIT_S)
    assert _counter(rsm, "chunk_cache.prefetched_chunks") == 0


# --- how far ahead: half the prefetch size for a reader new to a segment, all of it once it reads on ----------------

WIDE = 8  # chunks of prefetch
LONG = 40 * CHUNK


@pytest.fixture
def wide_rsm(backend_config: dict[str, Any], tmp_path: Path) -> Any:
    config = {
        **backend_config, "chunk.size": CHUNK, "fetch.chunk.cache.class": "disk",
        "fetch.chunk.cache.path": str(tmp_path / "cache"), "fetch.chunk.cache.prefetch.max.size": WIDE * CHUNK,
    }
    with RemoteStorageManager(config) as manager:
        yield manager


def _gets(rsm: RemoteStorageManager) -> int:
    return int(rsm.metrics()["operations"].get("backend.get", {}).get("requests", 0))


def _read_as_the_broker(rsm: RemoteStorageManager, metadata: RemoteLogSegmentMetadata, data: bytes, end: int,
                        step: int) -> None:
    """A call per fetch from the next position until `end`, closed after `step` bytes, each prefetch finished
    before the next."""
    position = 0
    while position < end:
        with rsm.fetch_log_segment(metadata, position) as stream:
            got = b""
            while len(got) < step and (piece := stream.read(step - len(got))):
                got += piece
            assert got == data[position : position + step]
        position += step
        assert rsm.prefetch_idle(WAIT_S)


def test_a_reader_that_reads_once_costs_half_the_prefetch_size(
    wide_rsm: RemoteStorageManager, make_segment: SegmentFactory
) -> None:
    segment = make_segment(log_size=LONG)
    metadata = _copy(wide_rsm, segment)
    position = 10 * CHUNK + 5
    with wide_rsm.fetch_log_segment(metadata, position, position + 99) as stream:
        assert stream.read() == segment.log_bytes[position : position + 100]
    assert wide_rsm.prefetch_idle(WAIT_S)
    assert _counter(wide_rsm, "chunk_cache.prefetched_chunks") == WIDE // 2


def test_a_sequential_reader_is_read_ahead_in_large_gets(
    wide_rsm: RemoteStorageManager, make_segment: SegmentFactory
) -> None:
    segment = make_segment(log_size=LONG)
    metadata = _copy(wide_rsm, segment)
    _copy_gets = _gets(wide_rsm)
    _read_as_the_broker(wide_rsm, metadata, segment.log_bytes, LONG, 5000)
    chunks = LONG // CHUNK
    # Every chunk after the first was there before the reader asked for it.
    assert _counter(wide_rsm, "chunk_cache.misses") == 1
    assert _counter(wide_rsm, "chunk_cache.prefetched_chunks") == chunks - 1
    # The first read's own GET (and the chunk index's), then prefetches that each waited until half of the read-ahead
    # was missing: at least WIDE / 2 chunks each, but for the first and the segment's tail. A prefetch of the chunks
    # the reader lacks at each step would take about one GET per chunk.
    assert _gets(wide_rsm) - _copy_gets <= 2 + 2 + (chunks - 1) // (WIDE // 2)


def test_a_reader_that_jumps_is_read_ahead_as_a_new_one(
    wide_rsm: RemoteStorageManager, make_segment: SegmentFactory
) -> None:
    segment = make_segment(log_size=LONG)
    metadata = _copy(wide_rsm, segment)
    _read_as_the_broker(wide_rsm, metadata, segment.log_bytes, 6 * CHUNK, 5000)
    prefetched = _counter(wide_rsm, "chunk_cache.prefetched_chunks")
    # Far past what was read ahead: its next chunks are half the prefetch size, as for a reader new to the segment.
    position = 30 * CHUNK
    with wide_rsm.fetch_log_segment(metadata, position, position + 99) as stream:
        assert stream.read() == segment.log_bytes[position : position + 100]
    assert wide_rsm.prefetch_idle(WAIT_S)
    assert _counter(wide_rsm, "chunk_cache.prefetched_chunks") - prefetched == WIDE // 2


def test_the_read_ahead_stays_within_a_quarter_of_the_cache(
    backend_config: dict[str, Any], tmp_path: Path, make_segment: SegmentFactory
) -> None:
    config = {
        **backend_config, "chunk.size": CHUNK, "fetch.chunk.cache.class": "disk",
        "fetch.chunk.cache.path": str(tmp_path / "cache"), "fetch.chunk.cache.size": 16 * CHUNK,
        "fetch.chunk.cache.prefetch.max.size": WIDE * CHUNK,
    }
    with RemoteStorageManager(config) as rsm:
        segment = make_segment(log_size=LONG)
        metadata = _copy(rsm, segment)
        _read_as_the_broker(rsm, metadata, segment.log_bytes, 8 * CHUNK, CHUNK // 4)
        assert rsm.prefetch_idle(WAIT_S)
        # Read ahead 4 chunks (16 / 4), not WIDE (8): the last step, in chunk 7, has chunks 8 to 11 fetched, no more.
        assert _counter(rsm, "chunk_cache.prefetched_chunks") == 11
        assert _counter(rsm, "chunk_cache.misses") == 1
