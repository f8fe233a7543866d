"""Failures against the real S3 server: faults injected by a proxy in front of it where the server
cannot produce them on demand (a failing part upload, a stall, a server that vanishes mid-stream).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import pytest
from rsm_testkit import S3Server, SegmentFactory, SegmentFixture
from support.s3_proxy import CountingS3Proxy

from rsm import ConfigError, IndexType, RemoteStorageError, RemoteStorageManager
from rsm.keys import keys_for

# Request timeout 1 s and one retry: every failing call must give up within a few seconds. Small chunks, so that a
# read holds little of the body (a chunk is read whole before any of it is served).
FAST_FAIL = {"s3.request.timeout.ms": "1000", "s3.retries.max": "1", "chunk.size": str(64 << 10)}
DEADLINE_SECONDS = 15.0


def _fast_manager(server: S3Server, prefix: str, endpoint: str, **extra: Any) -> RemoteStorageManager:
    return RemoteStorageManager(server.rsm_config(prefix, endpoint=endpoint, **FAST_FAIL, **extra))


def _copy(rsm: RemoteStorageManager, segment: SegmentFixture) -> SegmentFixture:
    custom = rsm.copy_log_segment_data(segment.metadata, segment.data)
    return SegmentFixture(segment.with_custom_metadata(custom), segment.data)


def test_a_failed_multipart_upload_is_aborted_and_leaves_no_object_visible(
    s3_server: S3Server, s3_proxy: CountingS3Proxy, key_prefix: str, make_segment: SegmentFactory
) -> None:
    segment = make_segment(log_size=12 << 20)
    s3_proxy.fail_when(lambda r: r.query.get("partNumber") == "2", status=500)
    multipart = {"s3.multipart.threshold.bytes": 6 << 20, "s3.multipart.part.size.bytes": 5 << 20}
    with _fast_manager(s3_server, key_prefix, s3_proxy.endpoint_url, **multipart) as rsm:
        with pytest.raises(RemoteStorageError, match="UploadPart 2/3"):
            rsm.copy_log_segment_data(segment.metadata, segment.data)
        assert list(rsm.backend.list("")) == []
    assert any(r.method == "DELETE" and r.has_param("uploadId") for r in s3_proxy.requests)
    client = _client(s3_server)
    pending = client.list_multipart_uploads(Bucket=s3_server.bucket, Prefix=key_prefix).get("Uploads", [])
    assert pending == []


def _client(server: S3Server) -> Any:
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3", endpoint_url=server.endpoint, aws_access_key_id=server.access_key,
        aws_secret_access_key=server.secret_key, region_name="us-east-1",
        config=Config(s3={"addressing_style": "path"}),
    )


def test_s3_vanishing_mid_stream_fails_the_read_naming_bucket_and_key(
    s3_server: S3Server, s3_proxy: CountingS3Proxy, key_prefix: str, make_segment: SegmentFactory
) -> None:
    with _fast_manager(s3_server, key_prefix, s3_proxy.endpoint_url) as rsm:
        segment = _copy(rsm, make_segment(log_size=8 << 20))
        stream = rsm.fetch_log_segment(segment.metadata, 0)
        assert len(stream.read(4096)) == 4096
        s3_proxy.close()
        started = time.monotonic()
        with pytest.raises(RemoteStorageError) as caught:
            while stream.read(1 << 20):
                pass
        assert time.monotonic() - started < DEADLINE_SECONDS
    message = str(caught.value)
    assert s3_server.bucket in message and keys_for(segment.metadata, False).log in message


def test_s3_down_before_a_call_fails_it_within_the_deadline(
    s3_server: S3Server, s3_proxy: CountingS3Proxy, key_prefix: str, make_segment: SegmentFactory
) -> None:
    with _fast_manager(s3_server, key_prefix, s3_proxy.endpoint_url) as rsm:
        segment = _copy(rsm, make_segment())
        s3_proxy.close()
        started = time.monotonic()
        with pytest.raises(RemoteStorageError, match="S3 GetObject failed for bucket"):
            rsm.fetch_index(segment.metadata, IndexType.OFFSET)
        assert time.monotonic() - started < DEADLINE_SECONDS


def test_a_stalled_s3_server_fails_the_call_within_the_deadline(
    s3_server: S3Server, s3_proxy: CountingS3Proxy, key_prefix: str, make_segment: SegmentFactory
) -> None:
    with _fast_manager(s3_server, key_prefix, s3_proxy.endpoint_url) as rsm:
        segment = _copy(rsm, make_segment())
        s3_proxy.stall_when(lambda r: r.is_get)
        started = time.monotonic()
        with pytest.raises(RemoteStorageError, match=r"timeout|timed out"):
            rsm.fetch_indexes(segment.metadata, list(IndexType))
        assert time.monotonic() - started < DEADLINE_SECONDS


def test_a_server_error_names_bucket_key_and_cause(
    s3_server: S3Server, s3_proxy: CountingS3Proxy, key_prefix: str, make_segment: SegmentFactory
) -> None:
    s3_proxy.fail_when(lambda r: r.method == "PUT", status=503)
    segment = make_segment()
    with _fast_manager(s3_server, key_prefix, s3_proxy.endpoint_url) as rsm, pytest.raises(
        RemoteStorageError
    ) as caught:
        rsm.copy_log_segment_data(segment.metadata, segment.data)
    message = str(caught.value)
    assert f"bucket {s3_server.bucket!r}" in message
    assert keys_for(segment.metadata, False).log in message
    assert "InjectedFault" in message


def test_credentials_never_appear_in_errors_or_logs(
    s3_server: S3Server, key_prefix: str, make_segment: SegmentFactory, caplog: pytest.LogCaptureFixture
) -> None:
    secret = "wrong-secret-d0n7-l34k-m3"
    config = s3_server.rsm_config(key_prefix, **FAST_FAIL, **{"s3.secret.access.key": secret})
    segment = make_segment()
    # Whoever debugs with botocore's DEBUG logs on (request headers, error bodies) gets no credentials.
    for logger in ("rsm", "botocore", "urllib3"):
        caplog.set_level(logging.DEBUG, logger=logger)
    with RemoteStorageManager(config) as rsm:
        with pytest.raises(RemoteStorageError) as caught:
            rsm.copy_log_segment_data(segment.metadata, segment.data)
        shown = str(caught.value) + repr(caught.value) + caplog.text + repr(rsm) + repr(rsm.backend)
    assert "SignatureDoesNotMatch" in shown
    assert secret not in shown and s3_server.access_key not in shown


def test_an_invalid_secret_value_is_redacted_in_the_config_error() -> None:
    with pytest.raises(ConfigError) as caught:
        RemoteStorageManager({"storage.backend": "s3", "s3.bucket": "b", "s3.secret.access.key": ["hunter2"]})
    assert "s3.secret.access.key" in str(caught.value) and "hunter2" not in str(caught.value)


def test_a_stream_cut_mid_read_resumes_where_it_stopped(
    s3_server: S3Server, s3_proxy: CountingS3Proxy, key_prefix: str, make_segment: SegmentFactory
) -> None:
    with _fast_manager(s3_server, key_prefix, s3_proxy.endpoint_url) as rsm:
        segment = _copy(rsm, make_segment(log_size=16 << 20))
        s3_proxy.reset()
        with rsm.fetch_log_segment(segment.metadata, 10) as stream:
            head = stream.read(4096)
            s3_proxy.sever_connections()
            rest = stream.read()
    assert head + rest == segment.log_bytes[10:]
    ranges = [r.range for r in s3_proxy.requests if r.is_get and r.path.endswith(".log")]
    # From the start of the chunk holding byte 10, so that the chunk can be checked whole.
    assert ranges[0] == f"bytes=0-{(16 << 20) - 1}" and len(ranges) == 2
    assert int(str(ranges[1]).removeprefix("bytes=").split("-")[0]) > 10 + 4096


@pytest.mark.parametrize("checksum", ["CRC32", "MD5"])
@pytest.mark.parametrize("log_size", [200_000, 12 << 20], ids=["single-put", "multipart"])
def test_a_body_corrupted_in_transit_is_rejected_and_nothing_is_written(
    s3_server: S3Server,
    s3_proxy: CountingS3Proxy,
    key_prefix: str,
    make_segment: SegmentFactory,
    checksum: str,
    log_size: int,
) -> None:
    s3_proxy.corrupt_when(lambda r: r.method == "PUT")
    segment = make_segment(log_size=log_size)
    settings = {
        "s3.upload.checksum": checksum,
        "s3.multipart.threshold.bytes": 6 << 20,
        "s3.multipart.part.size.bytes": 5 << 20,
    }
    with _fast_manager(s3_server, key_prefix, s3_proxy.endpoint_url, **settings) as rsm:
        with pytest.raises(RemoteStorageError, match="BadDigest"):
            rsm.copy_log_segment_data(segment.metadata, segment.data)
        s3_proxy.clear_faults()
        assert list(rsm.backend.list("")) == []


def test_a_failed_delete_names_the_bucket_and_both_keys(
    s3_server: S3Server, s3_proxy: CountingS3Proxy, key_prefix: str, make_segment: SegmentFactory
) -> None:
    with _fast_manager(s3_server, key_prefix, s3_proxy.endpoint_url) as rsm:
        segment = _copy(rsm, make_segment())
        s3_proxy.fail_when(lambda r: r.has_param("delete"), status=503)
        with pytest.raises(RemoteStorageError) as caught:
            rsm.delete_log_segment_data(segment.metadata)
    message = str(caught.value)
    keys = keys_for(segment.metadata, False)
    assert f"bucket {s3_server.bucket!r}" in message
    assert f"{key_prefix}/{keys.log}" in message and f"{key_prefix}/{keys.indexes}" in message


def test_s3_vanishing_mid_upload_fails_the_copy_within_the_deadline_with_no_object_visible(
    s3_server: S3Server, s3_proxy: CountingS3Proxy, key_prefix: str, make_segment: SegmentFactory
) -> None:
    segment = make_segment(log_size=12 << 20)
    s3_proxy.stall_when(lambda r: r.query.get("partNumber") == "2")

    def close_once_a_part_is_stalled() -> None:
        deadline = time.monotonic() + DEADLINE_SECONDS
        while time.monotonic() < deadline:
            if any(r.query.get("partNumber") == "2" for r in s3_proxy.requests):
                s3_proxy.close()
                return
            time.sleep(0.01)

    closer = threading.Thread(target=close_once_a_part_is_stalled)
    multipart = {"s3.multipart.threshold.bytes": 6 << 20, "s3.multipart.part.size.bytes": 5 << 20}
    with _fast_manager(s3_server, key_prefix, s3_proxy.endpoint_url, **multipart) as rsm:
        closer.start()
        started = time.monotonic()
        with pytest.raises(RemoteStorageError, match=r"S3 .* failed for bucket"):
            rsm.copy_log_segment_data(segment.metadata, segment.data)
        assert time.monotonic() - started < DEADLINE_SECONDS
        closer.join()
    with RemoteStorageManager(s3_server.rsm_config(key_prefix)) as direct:
        assert list(direct.backend.list("")) == []
    # The abort could not reach the server either; clean up what a bucket lifecycle rule would.
    client = _client(s3_server)
    for upload in client.list_multipart_uploads(Bucket=s3_server.bucket, Prefix=key_prefix).get("Uploads", []):
        client.abort_multipart_upload(Bucket=s3_server.bucket, Key=upload["Key"], UploadId=upload["UploadId"])
