"""The RSM contract, run against every backend (the real SeaweedFS S3 server and the filesystem), with the
chunk cache off and on (small chunks, so that a segment spans many).

Each test states one behaviour Kafka's broker (or tierlog's own API) relies on.
"""

from __future__ import annotations

import hashlib
import random
import tracemalloc
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from rsm_testkit import SegmentFactory, SegmentFixture

from rsm import (
    IndexType,
    InvalidArgumentError,
    PackedIndexCorruptError,
    RemoteResourceNotFoundError,
    RemoteStorageManager,
)
from rsm.keys import keys_for

ALL_TYPES = list(IndexType)
CHUNK_SIZE = 16 << 10


@pytest.fixture(params=["uncached", "disk-cache"])
def rsm_config(request: pytest.FixtureRequest, backend_config: dict[str, Any], tmp_path: Path) -> dict[str, Any]:
    config = {**backend_config, "chunk.size": CHUNK_SIZE}
    if request.param == "disk-cache":
        config |= {"fetch.chunk.cache.class": "disk", "fetch.chunk.cache.path": str(tmp_path / "chunk-cache")}
    return config


@pytest.fixture
def manager(rsm_config: dict[str, Any]) -> Iterator[RemoteStorageManager]:
    with RemoteStorageManager(rsm_config) as rsm:
        yield rsm


# -- the backend interface ----------------------------------------------------------------------


def test_backend_get_range_returns_exactly_the_requested_inclusive_range(manager: RemoteStorageManager) -> None:
    manager.backend.put("a/obj", bytes(range(256)))
    with manager.backend.get_range("a/obj", 10, 19) as stream:
        assert stream.read() == bytes(range(10, 20))


def test_backend_put_overwrites_an_existing_object(manager: RemoteStorageManager) -> None:
    manager.backend.put("a/obj", b"first version")
    manager.backend.put("a/obj", b"second")
    with manager.backend.get_range("a/obj", 0) as stream:
        assert stream.read() == b"second"


def test_backend_list_returns_only_keys_under_the_prefix_in_order_with_sizes(
    manager: RemoteStorageManager,
) -> None:
    for key in ("p/2", "p/1", "p/sub/3", "q/1", "pp/1"):
        manager.backend.put(key, key.encode())
    listed = [(o.key, o.size) for o in manager.backend.list("p/")]
    assert listed == [("p/1", 3), ("p/2", 3), ("p/sub/3", 7)]


def test_backend_delete_of_missing_keys_is_not_an_error(manager: RemoteStorageManager) -> None:
    manager.backend.put("d/present", b"x")
    manager.backend.delete(["d/present", "d/absent"])
    assert list(manager.backend.list("d/")) == []


def test_backend_get_range_of_a_missing_object_raises_not_found(manager: RemoteStorageManager) -> None:
    with pytest.raises(RemoteResourceNotFoundError, match="no object at"):
        manager.backend.get_range("nothing/here", 0)


# -- copy -----------------------------------------------------------------------------------------


def test_copy_returns_custom_metadata_within_kafkas_128_byte_default(
    manager: RemoteStorageManager, make_segment: SegmentFactory
) -> None:
    segment = make_segment()
    custom = manager.copy_log_segment_data(segment.metadata, segment.data)
    assert custom is not None and 0 < len(custom) <= 128


def test_copy_writes_exactly_the_log_and_the_packed_index_objects(
    manager: RemoteStorageManager, copied: SegmentFixture
) -> None:
    keys = keys_for(copied.metadata, hashed=False)
    assert sorted(o.key for o in manager.backend.list("")) == sorted(keys.both())


def test_copy_is_idempotent_a_retry_overwrites(
    manager: RemoteStorageManager, make_segment: SegmentFactory
) -> None:
    segment = make_segment()
    first = manager.copy_log_segment_data(segment.metadata, segment.data)
    second = manager.copy_log_segment_data(segment.metadata, segment.data)
    assert first == second
    assert len(list(manager.backend.list(""))) == 2
    fetched = manager.fetch_indexes(segment.with_custom_metadata(second), ALL_TYPES)
    assert {t: s.read() for t, s in fetched.items()} == segment.index_bytes()


def test_copy_with_hash_prefix_puts_keys_under_a_hash_component(
    rsm_config: dict[str, Any], make_segment: SegmentFactory
) -> None:
    segment = make_segment()
    with RemoteStorageManager({**rsm_config, "storage.hash.prefix": "true"}) as rsm:
        custom = rsm.copy_log_segment_data(segment.metadata, segment.data)
        assert sorted(o.key for o in rsm.backend.list("")) == sorted(keys_for(segment.metadata, True).both())
        with rsm.fetch_log_segment(segment.with_custom_metadata(custom), 0) as stream:
            assert stream.read() == segment.log_bytes


def test_copy_with_a_missing_index_file_uploads_nothing(
    manager: RemoteStorageManager, make_segment: SegmentFactory
) -> None:
    segment = make_segment()
    segment.data.time_index.unlink()
    with pytest.raises(Exception, match="TIMESTAMP index"):
        manager.copy_log_segment_data(segment.metadata, segment.data)
    assert list(manager.backend.list("")) == []


# -- fetch_indexes / fetch_index ----------------------------------------------------------------


def test_fetch_indexes_returns_all_five_indexes_byte_for_byte(
    manager: RemoteStorageManager, copied: SegmentFixture
) -> None:
    fetched = manager.fetch_indexes(copied.metadata, ALL_TYPES)
    assert {t: s.read() for t, s in fetched.items()} == copied.index_bytes()


def test_fetch_indexes_returns_only_the_requested_types(
    manager: RemoteStorageManager, copied: SegmentFixture
) -> None:
    wanted = [IndexType.LEADER_EPOCH, IndexType.OFFSET]
    fetched = manager.fetch_indexes(copied.metadata, wanted)
    assert {t: s.read() for t, s in fetched.items()} == {t: copied.index_bytes()[t] for t in wanted}


def test_fetch_indexes_leaves_out_an_absent_transaction_index(
    manager: RemoteStorageManager, make_segment: SegmentFactory
) -> None:
    segment = make_segment(with_txn=False)
    custom = manager.copy_log_segment_data(segment.metadata, segment.data)
    fetched = manager.fetch_indexes(segment.with_custom_metadata(custom), ALL_TYPES)
    assert set(fetched) == set(ALL_TYPES) - {IndexType.TRANSACTION}


def test_fetch_indexes_works_without_custom_metadata_by_reading_the_header(
    manager: RemoteStorageManager, copied: SegmentFixture
) -> None:
    fetched = manager.fetch_indexes(copied.with_custom_metadata(None), ALL_TYPES)
    assert {t: s.read() for t, s in fetched.items()} == copied.index_bytes()


@pytest.mark.parametrize("index_type", ALL_TYPES, ids=lambda t: t.name)
def test_fetch_index_returns_each_index_byte_for_byte(
    manager: RemoteStorageManager, copied: SegmentFixture, index_type: IndexType
) -> None:
    with manager.fetch_index(copied.metadata, index_type) as stream:
        assert stream.read() == copied.index_bytes()[index_type]


def test_fetch_index_of_a_missing_transaction_index_raises_not_found(
    manager: RemoteStorageManager, make_segment: SegmentFactory
) -> None:
    segment = make_segment(with_txn=False)
    custom = manager.copy_log_segment_data(segment.metadata, segment.data)
    with pytest.raises(RemoteResourceNotFoundError, match="no TRANSACTION index"):
        manager.fetch_index(segment.with_custom_metadata(custom), IndexType.TRANSACTION)


def test_fetch_index_after_a_re_copy_returns_the_new_bytes_not_the_cached_ones(
    manager: RemoteStorageManager, make_segment: SegmentFactory
) -> None:
    first = make_segment(seed=1)
    custom = manager.copy_log_segment_data(first.metadata, first.data)
    manager.fetch_index(first.with_custom_metadata(custom), IndexType.OFFSET).read()
    first.data.offset_index.write_bytes(b"rewritten offsets")
    custom = manager.copy_log_segment_data(first.metadata, first.data)
    with manager.fetch_index(first.with_custom_metadata(custom), IndexType.OFFSET) as stream:
        assert stream.read() == b"rewritten offsets"


def test_a_corrupted_packed_index_is_detected_by_its_checksum(
    manager: RemoteStorageManager, copied: SegmentFixture
) -> None:
    key = keys_for(copied.metadata, hashed=False).indexes
    with manager.backend.get_range(key, 0) as stream:
        damaged = bytearray(stream.read())
    damaged[-1] ^= 0x40
    manager.backend.put(key, bytes(damaged))
    with pytest.raises(PackedIndexCorruptError, match="fails its checksum"):
        manager.fetch_indexes(copied.metadata, ALL_TYPES)


def test_fetch_indexes_of_a_deleted_segment_raises_not_found(
    manager: RemoteStorageManager, copied: SegmentFixture
) -> None:
    manager.delete_log_segment_data(copied.metadata)
    with pytest.raises(RemoteResourceNotFoundError):
        manager.fetch_indexes(copied.metadata, ALL_TYPES)


# -- fetch_log_segment ----------------------------------------------------------------------------


def test_fetch_log_segment_from_start_without_end_returns_the_whole_segment(
    manager: RemoteStorageManager, copied: SegmentFixture
) -> None:
    with manager.fetch_log_segment(copied.metadata, 0) as stream:
        assert stream.read() == copied.log_bytes


def test_fetch_log_segment_is_exact_at_random_positions(
    manager: RemoteStorageManager, copied: SegmentFixture
) -> None:
    expected = copied.log_bytes
    size = len(expected)
    rng = random.Random(42)
    for _ in range(25):
        start = rng.randrange(size)
        end = rng.choice([None, rng.randrange(start, size), size - 1, size + rng.randrange(1, 10_000)])
        with manager.fetch_log_segment(copied.metadata, start, end) as stream:
            stop = size if end is None else min(end + 1, size)
            assert stream.read() == expected[start:stop], (start, end)


def test_fetch_log_segment_with_start_equal_to_end_returns_one_byte(
    manager: RemoteStorageManager, copied: SegmentFixture
) -> None:
    with manager.fetch_log_segment(copied.metadata, 777, 777) as stream:
        assert stream.read() == copied.log_bytes[777:778]


def test_fetch_log_segment_of_the_last_byte_returns_it(
    manager: RemoteStorageManager, copied: SegmentFixture
) -> None:
    last = len(copied.log_bytes) - 1
    with manager.fetch_log_segment(copied.metadata, last) as stream:
        assert stream.read() == copied.log_bytes[-1:]


def test_fetch_log_segment_streams_in_chunks(manager: RemoteStorageManager, copied: SegmentFixture) -> None:
    chunks = []
    with manager.fetch_log_segment(copied.metadata, 0) as stream:
        while chunk := stream.read(8192):
            assert len(chunk) <= 8192
            chunks.append(chunk)
    assert b"".join(chunks) == copied.log_bytes


def test_fetch_log_segment_with_start_past_the_end_is_an_invalid_argument(
    manager: RemoteStorageManager, copied: SegmentFixture
) -> None:
    with pytest.raises(InvalidArgumentError, match="past the end"):
        manager.fetch_log_segment(copied.metadata, len(copied.log_bytes))


@pytest.mark.parametrize(("start", "end"), [(-1, None), (10, 9)])
def test_fetch_log_segment_refuses_a_negative_start_or_an_end_before_start(
    manager: RemoteStorageManager, copied: SegmentFixture, start: int, end: int | None
) -> None:
    with pytest.raises(InvalidArgumentError, match="position"):
        manager.fetch_log_segment(copied.metadata, start, end)


def test_fetch_log_segment_of_a_never_copied_segment_raises_not_found(
    manager: RemoteStorageManager, make_segment: SegmentFactory
) -> None:
    with pytest.raises(RemoteResourceNotFoundError):
        manager.fetch_log_segment(make_segment().metadata, 0)


# -- delete ---------------------------------------------------------------------------------------


def test_delete_removes_both_objects(manager: RemoteStorageManager, copied: SegmentFixture) -> None:
    manager.delete_log_segment_data(copied.metadata)
    assert list(manager.backend.list("")) == []


def test_delete_is_idempotent(manager: RemoteStorageManager, copied: SegmentFixture) -> None:
    manager.delete_log_segment_data(copied.metadata)
    manager.delete_log_segment_data(copied.metadata)
    assert list(manager.backend.list("")) == []


def test_delete_without_custom_metadata_removes_a_segment_whose_copy_failed(
    manager: RemoteStorageManager, copied: SegmentFixture
) -> None:
    manager.delete_log_segment_data(copied.with_custom_metadata(None))
    assert list(manager.backend.list("")) == []


def test_delete_leaves_other_segments_of_the_partition_alone(
    manager: RemoteStorageManager, make_segment: SegmentFactory
) -> None:
    doomed, kept = make_segment(seed=1), make_segment(seed=2)
    for segment in (doomed, kept):
        manager.copy_log_segment_data(segment.metadata, segment.data)
    manager.delete_log_segment_data(doomed.metadata)
    assert sorted(o.key for o in manager.backend.list("")) == sorted(keys_for(kept.metadata, False).both())


# -- metrics and lifecycle ------------------------------------------------------------------------


def test_metrics_count_requests_bytes_and_errors_per_operation(
    manager: RemoteStorageManager, copied: SegmentFixture
) -> None:
    with manager.fetch_log_segment(copied.metadata, 0) as stream:
        stream.read()
    with pytest.raises(InvalidArgumentError):
        manager.fetch_log_segment(copied.metadata, 10**9)
    ops = manager.metrics()["operations"]
    assert ops["rsm.copy_log_segment_data"]["requests"] == 1
    assert ops["rsm.fetch_log_segment"] == ops["rsm.fetch_log_segment"] | {
        "requests": 2, "errors": 1, "bytes": len(copied.log_bytes)
    }
    # The segment's bytes, and the packed index's sections holding its chunk index.
    assert ops["backend.get"]["bytes"] > len(copied.log_bytes)
    assert ops["backend.get"]["latency_ms_total"] > 0


def test_a_closed_manager_refuses_calls(manager: RemoteStorageManager, copied: SegmentFixture) -> None:
    manager.close()
    with pytest.raises(Exception, match="closed"):
        manager.fetch_index(copied.metadata, IndexType.OFFSET)


def test_one_manager_serves_concurrent_copies_and_fetches_from_many_threads(
    manager: RemoteStorageManager, make_segment: SegmentFactory
) -> None:
    segments = [make_segment(log_size=50_000, seed=seed) for seed in range(8)]

    def round_trip(segment: SegmentFixture) -> bool:
        custom = manager.copy_log_segment_data(segment.metadata, segment.data)
        metadata = segment.with_custom_metadata(custom)
        indexes = {t: manager.fetch_index(metadata, t).read() for t in (IndexType.OFFSET, IndexType.TIMESTAMP)}
        with manager.fetch_log_segment(metadata, 0) as stream:
            log = stream.read()
        expected = segment.index_bytes()
        return log == segment.log_bytes and all(indexes[t] == expected[t] for t in indexes)

    with ThreadPoolExecutor(4) as pool:
        assert all(pool.map(round_trip, segments))


def test_fetch_log_segment_never_holds_the_whole_segment_in_memory(
    rsm_config: dict[str, Any], make_segment: SegmentFactory
) -> None:
    # It holds one chunk at a time (each is checked whole before any of its bytes are served).
    segment = make_segment(log_size=24 << 20)
    manager = RemoteStorageManager({**rsm_config, "chunk.size": 1 << 20, "fetch.chunk.cache.prefetch.max.size": 0})
    custom = manager.copy_log_segment_data(segment.metadata, segment.data)
    digest = hashlib.sha256()
    tracemalloc.start()
    try:
        with manager.fetch_log_segment(segment.with_custom_metadata(custom), 0) as stream:
            while chunk := stream.read(256 << 10):
                digest.update(chunk)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        manager.close()
    assert digest.digest() == hashlib.sha256(segment.log_bytes).digest()
    assert peak < 4 << 20, f"peak {peak} bytes while streaming a {24 << 20}-byte segment"


def test_a_segment_written_with_the_hash_prefix_is_found_after_the_setting_is_turned_off(
    rsm_config: dict[str, Any], make_segment: SegmentFactory
) -> None:
    segment = make_segment()
    with RemoteStorageManager({**rsm_config, "storage.hash.prefix": True}) as before:
        custom = before.copy_log_segment_data(segment.metadata, segment.data)
    metadata = segment.with_custom_metadata(custom)
    with RemoteStorageManager({**rsm_config, "storage.hash.prefix": False}) as after:
        with after.fetch_index(metadata, IndexType.OFFSET) as stream:
            assert stream.read() == segment.index_bytes()[IndexType.OFFSET]
        after.delete_log_segment_data(metadata)
        assert list(after.backend.list("")) == []
