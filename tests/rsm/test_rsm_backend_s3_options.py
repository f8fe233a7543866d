"""The S3 backend's options: storage class, server-side encryption (SSE-S3, SSE-KMS), path-style and
virtual-hosted addressing, assumed-role and web-identity credentials that are fetched again before they expire,
and config errors that name the key.

SeaweedFS shows the storage class and SSE-S3 it stored; it has no KMS, so SSE-KMS and STS run against moto's
server on 127.0.0.1 (which accepts any credentials and echoes what it stored), and the headers on the wire are
read with botocore's event hooks.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import boto3
import pytest
from rsm_testkit import S3Server

from rlmm.config import parse_config
from rlmm.errors import ConfigError
from rsm.backends import s3
from rsm.metrics import Metrics

ROLE = "arn:aws:iam::123456789012:role/tierlog-tiered-storage"
_CREDENTIAL = re.compile(r"Credential=([A-Z0-9]+)/")


def backend(config: dict[str, Any]) -> s3.S3Backend:
    created = s3.create(parse_config(config, s3.CONFIG_KEYS, "rsm"), Metrics())
    assert isinstance(created, s3.S3Backend)
    return created


def record_requests(target: s3.S3Backend) -> list[Any]:
    """Every request the backend's client sends, as botocore prepared it (URL, headers), retries included."""
    sent: list[Any] = []
    target.events.register("before-send.s3", lambda request, **_: sent.append(request))
    return sent


@pytest.fixture(scope="module")
def moto_bucket(moto_endpoint: str) -> str:
    """moto's server (conftest.py) with the bucket these tests write to; its endpoint."""
    boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1", aws_access_key_id="moto",
                 aws_secret_access_key="moto").create_bucket(Bucket="tierlog")
    return moto_endpoint


def moto_config(endpoint: str, **extra: Any) -> dict[str, Any]:
    return {"s3.bucket": "tierlog", "s3.endpoint.url": endpoint, "s3.access.key.id": "source-key",
            "s3.secret.access.key": "source-secret", "s3.retries.max": 0, **extra}


def head(endpoint: str, key: str, access_key: str = "moto", secret_key: str = "moto") -> dict[str, Any]:
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id=access_key,
                          aws_secret_access_key=secret_key)
    return dict(client.head_object(Bucket="tierlog", Key=key))


# -- storage class and server-side encryption ---------------------------------------------------------


@pytest.mark.services
def test_storage_class_and_sse_s3_are_stored_with_single_and_multipart_uploads(
    s3_server: S3Server, key_prefix: str, tmp_path: Path
) -> None:
    options: dict[str, Any] = {
        "s3.storage.class": "STANDARD_IA", "s3.sse.algorithm": "AES256",
        "s3.multipart.threshold.bytes": 6 << 20, "s3.multipart.part.size.bytes": 5 << 20,
    }
    config = s3_server.rsm_config(key_prefix, **options)
    del config["storage.backend"]
    big = tmp_path / "segment.log"
    big.write_bytes(b"s" * (7 << 20))
    target = backend(config)
    try:
        target.put("small", b"index bytes")
        target.put("big", big)
    finally:
        target.close()
    for key in ("small", "big"):
        stored = head(s3_server.endpoint, f"{key_prefix}/{key}", s3_server.access_key, s3_server.secret_key)
        assert (stored["StorageClass"], stored["ServerSideEncryption"]) == ("STANDARD_IA", "AES256"), key


def test_sse_kms_sends_the_key_id_with_every_upload_and_the_store_keeps_it(
    moto_bucket: str, tmp_path: Path
) -> None:
    big = tmp_path / "segment.log"
    big.write_bytes(b"k" * (6 << 20))
    target = backend(moto_config(moto_bucket, **{
        "s3.prefix": "sse-kms", "s3.sse.algorithm": "aws:kms", "s3.sse.kms.key.id": "alias/tierlog",
        "s3.multipart.threshold.bytes": 6 << 20, "s3.multipart.part.size.bytes": 5 << 20,
    }))
    sent = record_requests(target)
    try:
        target.put("small", b"index bytes")
        target.put("big", big)
    finally:
        target.close()
    starts = [r for r in sent if r.method in ("PUT", "POST") and "partNumber" not in r.url and "uploadId" not in r.url]
    assert len(starts) == 2  # the PutObject and the CreateMultipartUpload
    for request in starts:
        assert request.headers["x-amz-server-side-encryption"] == b"aws:kms"
        assert request.headers["x-amz-server-side-encryption-aws-kms-key-id"] == b"alias/tierlog"
    for key in ("small", "big"):
        stored = head(moto_bucket, f"sse-kms/{key}")
        assert (stored["ServerSideEncryption"], stored["SSEKMSKeyId"]) == ("aws:kms", "alias/tierlog"), key


# -- addressing ---------------------------------------------------------------------------------------


class _Captured(Exception):
    """Stops a request once its URL is known (no name resolution for a bucket subdomain here)."""


@pytest.mark.parametrize(
    ("endpoint", "bucket", "path_style", "expected"),
    [
        ("http://localhost:9", "tierlog", None, "http://localhost:9/tierlog/p/"),
        ("http://localhost:9", "tierlog", "true", "http://localhost:9/tierlog/p/"),
        ("http://localhost:9", "tierlog", "false", "http://tierlog.localhost:9/p/"),
        (None, "tierlog", None, "https://tierlog.s3.amazonaws.com/p/"),
        (None, "tier.log", None, "https://s3.amazonaws.com/tier.log/p/"),
    ],
    ids=["endpoint-default", "path-style", "virtual-hosted", "aws-default", "aws-default-dotted-bucket"],
)
def test_addressing_puts_the_bucket_in_the_path_or_in_the_host_name(
    endpoint: str | None, bucket: str, path_style: str | None, expected: str
) -> None:
    config = moto_config("unused", **{"s3.prefix": "p", "s3.bucket": bucket})
    del config["s3.endpoint.url"]
    if endpoint is not None:
        config["s3.endpoint.url"] = endpoint
    if path_style is not None:
        config["s3.path.style.access"] = path_style
    target = backend(config)

    def capture(request: Any, **_: Any) -> None:
        raise _Captured(request.url)

    target.events.register("before-send.s3", capture)
    try:
        with pytest.raises(_Captured) as captured:
            target.put("x", b"x")
    finally:
        target.close()
    assert str(captured.value).startswith(expected)


# -- assumed roles --------------------------------------------------------------------------------------


def signing_keys(sent: list[Any]) -> list[str]:
    return [_CREDENTIAL.search(r.headers["Authorization"].decode()).group(1) for r in sent]  # type: ignore[union-attr]


def test_an_assumed_role_signs_every_request_and_is_fetched_again_before_it_expires(moto_bucket: str) -> None:
    # A 15-minute session is inside botocore's 15-minute refresh window from the start: every request refreshes.
    target = backend(moto_config(moto_bucket, **{
        "s3.prefix": "assume-role", "aws.sts.role.arn": ROLE, "aws.sts.role.external.id": "tierlog-cluster",
        "aws.sts.role.session.duration": 900, "aws.sts.config.endpoint": moto_bucket,
    }))
    sent = record_requests(target)
    try:
        target.put("a", b"first")
        target.put("b", b"second")
        with target.get_range("a", 0) as stream:
            assert stream.read() == b"first"
    finally:
        target.close()
    keys = signing_keys(sent)
    assert len(keys) == 3 and all(k.startswith("ASIA") for k in keys), keys  # STS session keys, never the source key
    assert len(set(keys)) == 3, keys


def test_a_web_identity_token_file_is_read_again_at_each_refresh_and_a_failed_refresh_keeps_valid_keys(
    moto_bucket: str, tmp_path: Path
) -> None:
    token = tmp_path / "token"
    token.write_text("first-service-account-token")
    config = moto_config(moto_bucket, **{
        "s3.prefix": "web-identity", "aws.sts.role.arn": ROLE, "aws.web.identity.token.file": str(token),
        "aws.sts.role.session.duration": 900, "aws.sts.config.endpoint": moto_bucket,
    })
    del config["s3.access.key.id"], config["s3.secret.access.key"]
    target = backend(config)
    sent = record_requests(target)
    try:
        target.put("a", b"first")
        token.unlink()  # being rotated: the refresh cannot read it, the unexpired keys still sign
        target.put("b", b"second")
        token.write_text("rotated-service-account-token")
        target.put("c", b"third")
    finally:
        target.close()
    first, during, after = signing_keys(sent)
    assert first.startswith("ASIA") and during == first and after != first, (first, during, after)


# -- config errors name the key ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"s3.storage.class": "COLD"}, r"s3\.storage\.class must be one of STANDARD"),
        ({"s3.sse.algorithm": "aes256"}, r"s3\.sse\.algorithm must be one of AES256, aws:kms"),
        ({"s3.sse.kms.key.id": "alias/k"}, r"s3\.sse\.kms\.key\.id needs s3\.sse\.algorithm=aws:kms.*unset"),
        ({"s3.sse.algorithm": "AES256", "s3.sse.kms.key.id": "alias/k"}, r"s3\.sse\.kms\.key\.id needs .*AES256"),
        ({"aws.sts.role.arn": "tierlog-role"}, r"aws\.sts\.role\.arn must be a role ARN"),
        ({"aws.sts.role.external.id": "x"}, r"aws\.sts\.role\.external\.id needs aws\.sts\.role\.arn"),
        ({"aws.web.identity.token.file": "/t"}, r"aws\.web\.identity\.token\.file needs aws\.sts\.role\.arn"),
        ({"aws.sts.role.arn": ROLE, "aws.sts.role.session.duration": 60},
         r"aws\.sts\.role\.session\.duration must be between 900 and 43200"),
        ({"aws.sts.role.arn": ROLE, "aws.web.identity.token.file": "/t"},
         r"s3\.access\.key\.id and aws\.web\.identity\.token\.file cannot be set together"),
    ],
    ids=["storage-class", "sse-algorithm", "kms-key-alone", "kms-key-with-sse-s3", "role-not-an-arn",
         "external-id-alone", "token-file-alone", "session-too-short", "token-file-with-keys"],
)
def test_an_invalid_s3_option_is_refused_naming_its_key(extra: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        backend(moto_config("http://127.0.0.1:9", **extra))
