"""Request counts measured at the wire, by a counting proxy in front of the real S3 server.

These are the promises of the packed index: one GET for any set of indexes, one for the broker's three calls
(which brings the segment's chunk index along), and one for a segment's bytes however many chunks they span.
"""

from __future__ import annotations

from rsm_testkit import S3Server, SegmentFactory, SegmentFixture
from support.s3_proxy import CountingS3Proxy

from rsm import IndexType, RemoteStorageManager, custom_metadata
from rsm.packed_index import SegmentSection

BROKER_SEQUENCE = (IndexType.OFFSET, IndexType.TIMESTAMP, IndexType.TRANSACTION)


def _copy(rsm: RemoteStorageManager, segment: SegmentFixture) -> SegmentFixture:
    custom = rsm.copy_log_segment_data(segment.metadata, segment.data)
    return SegmentFixture(segment.with_custom_metadata(custom), segment.data)


def _broker_fetches(rsm: RemoteStorageManager, segment: SegmentFixture) -> None:
    """What Kafka's RemoteIndexCache does on a miss: three fetch_index calls in a row."""
    for index_type in BROKER_SEQUENCE:
        try:
            rsm.fetch_index(segment.metadata, index_type).read()
        except Exception as exc:
            if index_type is not IndexType.TRANSACTION:
                raise
            assert "no TRANSACTION index" in str(exc)


def test_fetch_indexes_of_all_five_types_is_one_ranged_get(
    proxied_manager: RemoteStorageManager, s3_proxy: CountingS3Proxy, make_segment: SegmentFactory
) -> None:
    segment = _copy(proxied_manager, make_segment())
    s3_proxy.reset()
    fetched = proxied_manager.fetch_indexes(segment.metadata, list(IndexType))
    assert len(fetched) == 5
    requests = s3_proxy.requests
    assert len(requests) == 1
    assert requests[0].is_get and requests[0].path.endswith(".indexes") and requests[0].range is not None


def test_the_brokers_three_fetch_index_calls_are_one_get(
    proxied_manager: RemoteStorageManager, s3_proxy: CountingS3Proxy, make_segment: SegmentFactory
) -> None:
    segment = _copy(proxied_manager, make_segment())
    s3_proxy.reset()
    _broker_fetches(proxied_manager, segment)
    assert [r.method for r in s3_proxy.requests] == ["GET"]


def test_the_brokers_three_calls_are_one_get_when_the_transaction_index_is_absent(
    proxied_manager: RemoteStorageManager, s3_proxy: CountingS3Proxy, make_segment: SegmentFactory
) -> None:
    segment = _copy(proxied_manager, make_segment(with_txn=False))
    s3_proxy.reset()
    _broker_fetches(proxied_manager, segment)
    assert [r.method for r in s3_proxy.requests] == ["GET"]


def test_the_brokers_calls_read_only_the_offset_timestamp_transaction_and_chunk_index_range(
    proxied_manager: RemoteStorageManager, s3_proxy: CountingS3Proxy, make_segment: SegmentFactory
) -> None:
    segment = _copy(proxied_manager, make_segment())
    s3_proxy.reset()
    _broker_fetches(proxied_manager, segment)
    first, last = (int(x) for x in str(s3_proxy.requests[0].range).removeprefix("bytes=").split("-"))
    sizes = segment.index_bytes()
    layout = custom_metadata.decode(segment.metadata.custom_metadata or b"", "s")
    assert layout is not None
    chunk_section = layout.layout.get(SegmentSection.CHUNK_INDEX)
    assert chunk_section is not None
    assert last - first + 1 == sum(len(sizes[t]) for t in BROKER_SEQUENCE) + chunk_section.length


def test_without_custom_metadata_fetch_indexes_costs_one_header_read_more(
    proxied_manager: RemoteStorageManager, s3_proxy: CountingS3Proxy, make_segment: SegmentFactory
) -> None:
    segment = _copy(proxied_manager, make_segment())
    s3_proxy.reset()
    proxied_manager.fetch_indexes(segment.with_custom_metadata(None), list(IndexType))
    assert [r.method for r in s3_proxy.requests] == ["GET", "GET"]


def test_after_the_brokers_index_calls_fetch_log_segment_is_one_get_of_the_chunks_holding_the_range(
    s3_server: S3Server, s3_proxy: CountingS3Proxy, key_prefix: str, make_segment: SegmentFactory
) -> None:
    config = s3_server.rsm_config(key_prefix, endpoint=s3_proxy.endpoint_url, **{"chunk.size": 16 << 10})
    with RemoteStorageManager(config) as rsm:
        segment = _copy(rsm, make_segment())
        _broker_fetches(rsm, segment)
        s3_proxy.reset()
        with rsm.fetch_log_segment(segment.metadata, 20_000, 40_000) as stream:
            assert stream.read() == segment.log_bytes[20_000:40_001]
    # Chunks 1 and 2 (16 KiB each), whole, so that each is checked before any of it is served.
    assert [(r.method, r.range) for r in s3_proxy.requests] == [("GET", f"bytes={16 << 10}-{(48 << 10) - 1}")]


def test_a_cold_whole_segment_read_is_two_gets_as_before_chunks_index_and_log(
    s3_server: S3Server, s3_proxy: CountingS3Proxy, key_prefix: str, make_segment: SegmentFactory
) -> None:
    config = s3_server.rsm_config(key_prefix, endpoint=s3_proxy.endpoint_url, **{"chunk.size": 16 << 10})
    with RemoteStorageManager(config) as rsm:
        segment = _copy(rsm, make_segment())
    with RemoteStorageManager(config) as rsm:  # a fresh process: nothing cached
        s3_proxy.reset()
        _broker_fetches(rsm, segment)
        with rsm.fetch_log_segment(segment.metadata, 0) as stream:
            assert stream.read() == segment.log_bytes
    assert [(r.method, r.path.rsplit(".", 1)[1]) for r in s3_proxy.requests] == [("GET", "indexes"), ("GET", "log")]


def test_delete_removes_both_objects_in_one_request(
    proxied_manager: RemoteStorageManager, s3_proxy: CountingS3Proxy, make_segment: SegmentFactory
) -> None:
    segment = _copy(proxied_manager, make_segment())
    s3_proxy.reset()
    proxied_manager.delete_log_segment_data(segment.metadata)
    requests = s3_proxy.requests
    assert len(requests) == 1 and requests[0].method == "POST" and requests[0].has_param("delete")


def test_a_small_copy_is_two_puts_with_the_packed_index_last(
    proxied_manager: RemoteStorageManager, s3_proxy: CountingS3Proxy, make_segment: SegmentFactory
) -> None:
    s3_proxy.reset()
    _copy(proxied_manager, make_segment())
    requests = s3_proxy.requests
    assert [r.method for r in requests] == ["PUT", "PUT"]
    assert requests[0].path.endswith(".log") and requests[1].path.endswith(".indexes")


def test_a_large_copy_uploads_parts_in_parallel_and_writes_the_packed_index_last(
    proxied_manager: RemoteStorageManager, s3_proxy: CountingS3Proxy, make_segment: SegmentFactory
) -> None:
    s3_proxy.reset()
    segment = _copy(proxied_manager, make_segment(log_size=12 << 20))
    requests = s3_proxy.requests
    parts = sorted(r.query["partNumber"] for r in requests if r.has_param("partNumber"))
    assert parts == ["1", "2", "3"]
    assert requests[0].has_param("uploads")
    assert requests[-2].has_param("uploadId") and requests[-2].method == "POST"
    assert requests[-1].method == "PUT" and requests[-1].path.endswith(".indexes")
    with proxied_manager.fetch_log_segment(segment.metadata, 0) as stream:
        assert stream.read() == segment.log_bytes


def test_uploads_with_md5_checksums_send_content_md5_and_round_trip(
    s3_server: S3Server, s3_proxy: CountingS3Proxy, key_prefix: str, make_segment: SegmentFactory
) -> None:
    """For S3-compatible servers that predate x-amz-checksum-*: `s3.upload.checksum=MD5`."""
    settings = {
        "s3.upload.checksum": "md5",
        "s3.multipart.threshold.bytes": 6 << 20,
        "s3.multipart.part.size.bytes": 5 << 20,
    }
    config = s3_server.rsm_config(key_prefix, endpoint=s3_proxy.endpoint_url, **settings)
    with RemoteStorageManager(config) as rsm:
        segment = _copy(rsm, make_segment(log_size=12 << 20))
        assert all(r.has_header("content-md5") for r in s3_proxy.requests if r.method == "PUT")
        with rsm.fetch_log_segment(segment.metadata, 0) as stream:
            assert stream.read() == segment.log_bytes


def test_a_followers_leader_epoch_and_producer_snapshot_calls_are_one_get(
    proxied_manager: RemoteStorageManager, s3_proxy: CountingS3Proxy, make_segment: SegmentFactory
) -> None:
    segment = _copy(proxied_manager, make_segment())
    s3_proxy.reset()
    for index_type in (IndexType.LEADER_EPOCH, IndexType.PRODUCER_SNAPSHOT):
        proxied_manager.fetch_index(segment.metadata, index_type).read()
    assert [r.method for r in s3_proxy.requests] == ["GET"]
