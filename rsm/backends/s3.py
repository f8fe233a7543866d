"""The S3 backend, through botocore: any S3-compatible server (AWS, SeaweedFS, MinIO), path-style or virtual-hosted.

Single PUT below the multipart threshold, parallel multipart above it (aborted on failure); every
upload carries a checksum (CRC32 or Content-MD5) so the server rejects corrupted bytes, and the configured
storage class and server-side encryption (SSE-S3, SSE-KMS); bounded timeouts and retries. Credentials are
static keys, the AWS default chain, or an assumed role (AssumeRole or AssumeRoleWithWebIdentity) that botocore
refreshes before it expires.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import math
import struct
import threading
import zlib
from collections.abc import Iterator, Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any, BinaryIO, Literal

import botocore.session
from botocore.config import Config as BotoConfig
from botocore.credentials import (
    AssumeRoleCredentialFetcher,
    AssumeRoleWithWebIdentityCredentialFetcher,
    CredentialProvider,
    CredentialResolver,
    Credentials,
    DeferredRefreshableCredentials,
)
from botocore.exceptions import BotoCoreError, ClientError
from botocore.utils import FileWebIdentityTokenLoader

from rlmm.config import ConfigKey, parse_bool, parse_int, parse_str
from rlmm.errors import ConfigError, InvalidArgumentError, RemoteResourceNotFoundError, RemoteStorageError
from rsm.backend import ObjectInfo, PrefixedStore, RangeStream, Source, StorageBackend
from rsm.keys import normalize_prefix
from rsm.metrics import Metrics

log = logging.getLogger(__name__)

NAME = "s3"
_MIB = 1 << 20
# S3's own floor for every part but the last.
MIN_PART_SIZE = 5 * _MIB
MAX_PARTS = 10_000


# The classes S3 accepts on upload (Aiven's list for s3.storage.class).
STORAGE_CLASSES = (
    "STANDARD", "REDUCED_REDUNDANCY", "STANDARD_IA", "ONEZONE_IA", "INTELLIGENT_TIERING", "GLACIER",
    "DEEP_ARCHIVE", "OUTPOSTS", "GLACIER_IR", "SNOW", "EXPRESS_ONEZONE", "FSX_OPENZFS",
)
# SSE-S3 and SSE-KMS (and its dual-layer variant), as the x-amz-server-side-encryption header spells them.
SSE_ALGORITHMS = ("AES256", "aws:kms", "aws:kms:dsse")
# STS bounds a role session to 15 minutes .. 12 hours.
MIN_ROLE_SESSION_S, MAX_ROLE_SESSION_S = 900, 43_200


def _positive(value: int) -> bool:
    return value > 0


CONFIG_KEYS: tuple[ConfigKey, ...] = (
    ConfigKey("s3.bucket", parse_str, required=True, check=bool, requirement="a bucket name"),
    ConfigKey("s3.prefix", parse_str, default=""),
    ConfigKey("s3.endpoint.url", parse_str),
    ConfigKey("s3.region", parse_str, default="us-east-1", check=bool, requirement="a region name"),
    ConfigKey("s3.access.key.id", parse_str, secret=True),
    ConfigKey("s3.secret.access.key", parse_str, secret=True),
    # Local servers (SeaweedFS, MinIO) need path-style; unset means "path-style when an endpoint is set" (else
    # botocore's choice); false means virtual-hosted (the bucket in the host name, as AWS wants it).
    ConfigKey("s3.path.style.access", parse_bool),
    ConfigKey("s3.storage.class", parse_str, check=lambda v: v in STORAGE_CLASSES,
              requirement=f"one of {', '.join(STORAGE_CLASSES)}"),
    ConfigKey("s3.sse.algorithm", parse_str, check=lambda v: v in SSE_ALGORITHMS,
              requirement=f"one of {', '.join(SSE_ALGORITHMS)}"),
    ConfigKey("s3.sse.kms.key.id", parse_str, check=bool, requirement="a KMS key id, ARN or alias"),
    # Assume this role (Aiven's connector names): from the configured or default credentials, or with a web
    # identity token (Kubernetes service-account tokens, EKS IRSA).
    ConfigKey("aws.sts.role.arn", parse_str, check=lambda v: v.startswith("arn:"), requirement="a role ARN"),
    ConfigKey("aws.sts.role.external.id", parse_str, check=bool, requirement="a non-empty external id"),
    ConfigKey("aws.sts.role.session.name", parse_str, "tierlog", check=bool, requirement="a session name"),
    ConfigKey(
        "aws.sts.role.session.duration", parse_int, 3600,
        check=lambda v: MIN_ROLE_SESSION_S <= v <= MAX_ROLE_SESSION_S,
        requirement=f"between {MIN_ROLE_SESSION_S} and {MAX_ROLE_SESSION_S} seconds",
    ),
    ConfigKey("aws.sts.config.endpoint", parse_str, check=bool, requirement="an STS endpoint URL"),
    ConfigKey("aws.web.identity.token.file", parse_str, check=bool, requirement="a token file path"),
    ConfigKey("s3.multipart.threshold.bytes", parse_int, 32 * _MIB, check=_positive, requirement="> 0"),
    ConfigKey(
        "s3.multipart.part.size.bytes", parse_int, 16 * _MIB,
        check=lambda v: v >= MIN_PART_SIZE, requirement=f">= {MIN_PART_SIZE} (S3's minimum part size)",
    ),
    ConfigKey("s3.multipart.concurrency", parse_int, 4, check=_positive, requirement="> 0"),
    ConfigKey("s3.request.timeout.ms", parse_int, 30_000, check=_positive, requirement="> 0"),
    ConfigKey("s3.retries.max", parse_int, 3, check=lambda v: v >= 0, requirement=">= 0"),
    ConfigKey("s3.max.connections", parse_int, 16, check=_positive, requirement="> 0"),
    # CRC32 (x-amz-checksum-crc32) is cheap to compute; MD5 (Content-MD5) is for servers that predate it.
    ConfigKey(
        "s3.upload.checksum", lambda v: parse_str(v).upper(), "CRC32",
        check=lambda v: v in ("CRC32", "MD5"), requirement="CRC32 or MD5",
    ),
)


def create(config: dict[str, Any], metrics: Metrics) -> StorageBackend:
    _require_credentials(config)
    _require_consistent_options(config)
    return S3Backend(config, metrics)


def _require_consistent_options(config: dict[str, Any]) -> None:
    """Settings that only mean something together, refused by name when one comes without the other."""
    if config["s3.sse.kms.key.id"] is not None and not str(config["s3.sse.algorithm"]).startswith("aws:kms"):
        raise ConfigError("rsm: config key s3.sse.kms.key.id needs s3.sse.algorithm=aws:kms (or aws:kms:dsse); "
                          f"it is {config['s3.sse.algorithm'] or 'unset'}")
    role_keys = ("aws.sts.role.external.id", "aws.sts.config.endpoint", "aws.web.identity.token.file")
    if config["aws.sts.role.arn"] is None:
        orphans = [key for key in role_keys if config[key] is not None]
        if orphans:
            raise ConfigError(f"rsm: config key {orphans[0]} needs aws.sts.role.arn (the role to assume)")
    elif config["aws.web.identity.token.file"] is not None:
        if config["aws.sts.role.external.id"] is not None:
            raise ConfigError("rsm: config key aws.sts.role.external.id cannot be used with "
                              "aws.web.identity.token.file (AssumeRoleWithWebIdentity takes no external id)")
        if config["s3.access.key.id"] is not None:
            raise ConfigError("rsm: config keys s3.access.key.id and aws.web.identity.token.file cannot be set "
                              "together: the web identity token replaces the keys")


def _require_credentials(config: dict[str, Any]) -> None:
    """Refuse at configuration what would otherwise fail on the first upload, hours later."""
    access_key, secret = config["s3.access.key.id"], config["s3.secret.access.key"]
    for name, value in (("s3.access.key.id", access_key), ("s3.secret.access.key", secret)):
        if value is not None and not value.strip():
            raise ConfigError(f"rsm: config key {name} is empty; set it, or unset both S3 keys to use the "
                              "AWS default credential chain (environment, profile, instance role)")
    if (access_key is None) != (secret is None):
        missing = "s3.secret.access.key" if secret is None else "s3.access.key.id"
        raise ConfigError(f"rsm: config key {missing} is missing; s3.access.key.id and s3.secret.access.key "
                          "must be set together (or neither, for the AWS default credential chain)")


# One session for every client: building a session reloads botocore's service models (~0.25 s each time).
# Creating clients from a shared session is not thread-safe, hence the lock.
_SESSION_LOCK = threading.Lock()
_SESSION: botocore.session.Session | None = None


def _shared_session() -> botocore.session.Session:
    global _SESSION
    with _SESSION_LOCK:
        if _SESSION is None:
            _SESSION = botocore.session.Session()
        return _SESSION


def _new_client(service: str, credentials: Credentials | None = None, **kwargs: Any) -> Any:
    """A client of the shared session; with `credentials` (refreshable ones), of a session of its own that
    resolves to them and shares the shared session's loaded models."""
    shared = _shared_session()
    session = shared
    if credentials is not None:
        session = botocore.session.Session()
        session.register_component("data_loader", shared.get_component("data_loader"))
        session.register_component("credential_provider", CredentialResolver([_Given(credentials)]))
    with _SESSION_LOCK:
        return session.create_client(service, **kwargs)


class _Given(CredentialProvider):
    """Resolves a session's credentials to the ones it was given."""

    METHOD = "tierlog-config"

    def __init__(self, credentials: Credentials) -> None:
        super().__init__()
        self._credentials = credentials

    def load(self) -> Credentials:
        return self._credentials


def _role_credentials(config: dict[str, Any], boto_config: BotoConfig) -> Credentials:
    """Credentials of the role in aws.sts.role.arn, fetched from STS and fetched again by botocore before they
    expire (within 15 minutes of it), for as long as the backend lives."""
    def sts_client(service: str, config: BotoConfig | None = None, **kwargs: Any) -> Any:
        merged = boto_config.merge(config) if config is not None else boto_config
        return _new_client(service, endpoint_url=config_endpoint, config=merged, **kwargs)

    config_endpoint = config["aws.sts.config.endpoint"]
    extra: dict[str, Any] = {
        "RoleSessionName": config["aws.sts.role.session.name"],
        "DurationSeconds": config["aws.sts.role.session.duration"],
    }
    fetcher: AssumeRoleCredentialFetcher | AssumeRoleWithWebIdentityCredentialFetcher
    if config["aws.web.identity.token.file"] is not None:
        # The token file is read again at every refresh: Kubernetes rotates it in place.
        fetcher = AssumeRoleWithWebIdentityCredentialFetcher(
            sts_client, FileWebIdentityTokenLoader(config["aws.web.identity.token.file"]),
            config["aws.sts.role.arn"], extra_args=extra,
        )
        method = "assume-role-with-web-identity"
    else:
        if config["aws.sts.role.external.id"] is not None:
            extra["ExternalId"] = config["aws.sts.role.external.id"]
        source: Credentials | None
        if config["s3.access.key.id"] is not None:
            source = Credentials(config["s3.access.key.id"], config["s3.secret.access.key"])
        else:
            source = _shared_session().get_credentials()
            if source is None:
                raise ConfigError("rsm: aws.sts.role.arn is set but no credentials to assume it with were found "
                                  "(set s3.access.key.id/s3.secret.access.key, aws.web.identity.token.file, or "
                                  "the AWS default chain)")
        fetcher = AssumeRoleCredentialFetcher(sts_client, source, config["aws.sts.role.arn"], extra_args=extra)
        method = "assume-role"
    return DeferredRefreshableCredentials(fetcher.fetch_credentials, method)


class _CredentialScrubber(logging.Filter):
    """Redacts configured credentials from botocore's and urllib3's debug logs.

    botocore logs each request's headers (the Authorization header names the access key id) and error
    bodies (which can echo it) at DEBUG; whoever turns that on must not get our credentials with it.
    """

    LOGGERS = (
        "botocore.endpoint", "botocore.parsers", "botocore.auth", "botocore.hooks",
        "botocore.retryhandler", "botocore.retries.standard", "urllib3.connectionpool",
    )

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._secrets: dict[str, int] = {}

    def add(self, secrets: tuple[str, ...]) -> None:
        with self._lock:
            for secret in secrets:
                self._secrets[secret] = self._secrets.get(secret, 0) + 1

    def remove(self, secrets: Sequence[str]) -> None:
        with self._lock:
            for secret in secrets:
                left = self._secrets.get(secret, 0) - 1
                if left > 0:
                    self._secrets[secret] = left
                else:
                    self._secrets.pop(secret, None)

    def scrub(self, text: str) -> str:
        with self._lock:
            secrets = list(self._secrets)
        for secret in secrets:
            text = text.replace(secret, "<redacted>")
        return text

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        scrubbed = self.scrub(message)
        if scrubbed != message:
            record.msg, record.args = scrubbed, None
        return True


_SCRUBBER = _CredentialScrubber()
for _name in _CredentialScrubber.LOGGERS:
    logging.getLogger(_name).addFilter(_SCRUBBER)


def _checksum_headers(algorithm: str, data: bytes) -> dict[str, str]:
    """The request parameter that makes the server verify `data` (it refuses the upload on mismatch)."""
    if algorithm == "CRC32":
        return {"ChecksumCRC32": base64.b64encode(struct.pack(">I", zlib.crc32(data))).decode("ascii")}
    return {"ContentMD5": base64.b64encode(hashlib.md5(data, usedforsecurity=False).digest()).decode("ascii")}


def _error_code(exc: BaseException) -> str:
    if isinstance(exc, ClientError):
        return str(exc.response.get("Error", {}).get("Code", ""))
    return ""


def _status(exc: BaseException) -> int:
    if isinstance(exc, ClientError):
        return int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))
    return 0


class S3Backend(PrefixedStore, StorageBackend):
    def __init__(self, config: dict[str, Any], metrics: Metrics) -> None:
        self._bucket: str = config["s3.bucket"]
        self._prefix = normalize_prefix(config["s3.prefix"], "s3.prefix")
        self._threshold: int = config["s3.multipart.threshold.bytes"]
        self._part_size: int = config["s3.multipart.part.size.bytes"]
        self._concurrency: int = config["s3.multipart.concurrency"]
        self._retries: int = config["s3.retries.max"]
        self._checksum: str = config["s3.upload.checksum"]
        self._metrics = metrics
        # Sent with every PutObject and CreateMultipartUpload (parts inherit them).
        self._object_args: dict[str, str] = {}
        if config["s3.storage.class"] is not None:
            self._object_args["StorageClass"] = config["s3.storage.class"]
        if config["s3.sse.algorithm"] is not None:
            self._object_args["ServerSideEncryption"] = config["s3.sse.algorithm"]
        if config["s3.sse.kms.key.id"] is not None:
            self._object_args["SSEKMSKeyId"] = config["s3.sse.kms.key.id"]
        # Kept only to scrub them from any message that might echo them; never logged.
        self._secrets = tuple(
            s for s in (config["s3.access.key.id"], config["s3.secret.access.key"]) if s
        )
        _SCRUBBER.add(self._secrets)
        endpoint = config["s3.endpoint.url"]
        path_style = config["s3.path.style.access"]
        # Unset on AWS: botocore's choice (virtual-hosted, but path-style for bucket names TLS cannot put in a host).
        addressing: Literal["path", "virtual", "auto"] = (
            "path" if path_style or (path_style is None and endpoint is not None)
            else "virtual" if path_style is False else "auto"
        )
        timeout = config["s3.request.timeout.ms"] / 1000.0
        boto_config = BotoConfig(
            region_name=config["s3.region"],
            connect_timeout=timeout,
            read_timeout=timeout,
            retries={"max_attempts": config["s3.retries.max"] + 1, "mode": "standard"},
            max_pool_connections=max(config["s3.max.connections"], self._concurrency),
            s3={"addressing_style": addressing},
            # We send a checksum header on every upload ourselves; the streaming CRC trailers botocore would
            # add by default are not understood by every S3-compatible server.
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
        )
        try:
            if config["aws.sts.role.arn"] is not None:
                self._client = _new_client(
                    "s3", _role_credentials(config, boto_config), endpoint_url=endpoint, config=boto_config
                )
            else:
                self._client = _new_client(
                    "s3",
                    endpoint_url=endpoint,
                    aws_access_key_id=config["s3.access.key.id"],
                    aws_secret_access_key=config["s3.secret.access.key"],
                    config=boto_config,
                )
        except (BotoCoreError, ValueError) as exc:
            _SCRUBBER.remove(self._secrets)
            raise RemoteStorageError(f"cannot create the S3 client: {self._scrub(str(exc))}") from None
        # Count what actually goes on the wire, retries included (our per-call counters see one request).
        self._client.meta.events.register("before-send.s3", self._count_attempt)

    @property
    def events(self) -> Any:
        """botocore's event system of this backend's client: where diagnostics (and tests) hook its requests."""
        return self._client.meta.events

    def _count_attempt(self, event_name: str = "", **_: Any) -> None:
        self._metrics.increment(f"s3.http_attempts.{event_name.rsplit('.', 1)[-1]}")

    def __repr__(self) -> str:
        return f"S3Backend(bucket={self._bucket!r}, prefix={self._prefix!r})"

    def describe(self, key: str) -> str:
        return f"bucket {self._bucket!r}, key {self._key(key)!r}"

    def _error(self, operation: str, key: str, exc: BaseException) -> RemoteStorageError:
        return RemoteStorageError(
            f"S3 {operation} failed for {self.describe(key)}: {self._scrub(str(exc))}"
        )

    # -- put ------------------------------------------------------------------------------------

    def put(self, key: str, source: Source) -> None:
        size = len(source) if isinstance(source, bytes) else self._size(key, source)
        if size >= self._threshold and not isinstance(source, bytes):
            self._put_multipart(key, source, size)
            return
        with self._metrics.time("backend.put") as timer:
            try:
                # Below the threshold the body is read into memory (bounded by the threshold): sending
                # a file object goes through http.client's small blocks and costs a third of the speed.
                body = source if isinstance(source, bytes) else source.read_bytes()
                self._client.put_object(
                    Bucket=self._bucket, Key=self._key(key), Body=body, **_checksum_headers(self._checksum, body),
                    **self._object_args,
                )
            except (BotoCoreError, ClientError, OSError) as exc:
                raise self._error("PutObject", key, exc) from exc
            timer.bytes = size

    def _size(self, key: str, path: Path) -> int:
        try:
            return path.stat().st_size
        except OSError as exc:
            raise RemoteStorageError(f"cannot upload {path} to {self.describe(key)}: {exc}") from exc

    def _put_multipart(self, key: str, path: Path, size: int) -> None:
        part_size = max(self._part_size, math.ceil(size / MAX_PARTS))
        count = math.ceil(size / part_size)
        with self._metrics.time("backend.put_multipart") as timer:
            try:
                algorithm = {"ChecksumAlgorithm": "CRC32"} if self._checksum == "CRC32" else {}
                created = self._client.create_multipart_upload(
                    Bucket=self._bucket, Key=self._key(key), **algorithm, **self._object_args
                )
            except (BotoCoreError, ClientError) as exc:
                raise self._error("CreateMultipartUpload", key, exc) from exc
            upload_id = created["UploadId"]
            try:
                parts = self._upload_parts(key, path, upload_id, part_size, count)
                self._client.complete_multipart_upload(
                    Bucket=self._bucket, Key=self._key(key), UploadId=upload_id,
                    MultipartUpload={"Parts": parts},
                )
            except BaseException as exc:
                self._abort(key, upload_id)
                if isinstance(exc, RemoteStorageError):
                    raise
                if isinstance(exc, (BotoCoreError, ClientError, OSError)):
                    raise self._error("multipart upload", key, exc) from exc
                raise
            timer.bytes = size

    def _upload_parts(
        self, key: str, path: Path, upload_id: str, part_size: int, count: int
    ) -> list[dict[str, Any]]:
        def upload(number: int) -> dict[str, Any]:
            with open(path, "rb") as handle:
                handle.seek((number - 1) * part_size)
                data = handle.read(part_size)
            checksum = _checksum_headers(self._checksum, data)
            with self._metrics.time("backend.upload_part") as timer:
                try:
                    reply = self._client.upload_part(
                        Bucket=self._bucket, Key=self._key(key), UploadId=upload_id, PartNumber=number,
                        Body=data, **checksum,
                    )
                except (BotoCoreError, ClientError) as exc:
                    raise self._error(f"UploadPart {number}/{count}", key, exc) from exc
                timer.bytes = len(data)
            # S3 wants each part's checksum repeated in the complete request when one was declared.
            declared = {k: v for k, v in checksum.items() if k.startswith("Checksum")}
            return {"PartNumber": number, "ETag": str(reply["ETag"]), **declared}

        # Memory stays at concurrency x part size: each worker reads only its own part.
        with ThreadPoolExecutor(self._concurrency, thread_name_prefix="rsm-upload") as pool:
            futures: list[Future[dict[str, Any]]] = [pool.submit(upload, n) for n in range(1, count + 1)]
            done, pending = wait(futures, return_when=FIRST_EXCEPTION)
            for future in pending:
                future.cancel()
            for future in done:
                error = future.exception()
                if error is not None:
                    raise error
        return [f.result() for f in futures]

    def _abort(self, key: str, upload_id: str) -> None:
        try:
            self._client.abort_multipart_upload(Bucket=self._bucket, Key=self._key(key), UploadId=upload_id)
        except (BotoCoreError, ClientError) as exc:
            # The bucket's lifecycle rule for incomplete uploads is the backstop; the object is not visible.
            log.warning(
                "aborting multipart upload of %s failed: %s", self.describe(key), self._scrub(str(exc))
            )

    # -- get ------------------------------------------------------------------------------------

    def get_range(self, key: str, start: int, end: int | None = None) -> RangeStream:
        with self._metrics.time("backend.get"):
            reply = self._get_object(key, start, end)
        body: BinaryIO = reply["Body"]
        length = int(reply["ContentLength"])
        etag = reply.get("ETag")

        def reopen(offset: int) -> Any:
            # The rest of the same range of the same object version: a retried copy that replaced the
            # object in between must fail the read, not splice two versions together.
            with self._metrics.time("backend.get"):
                return self._get_object(key, start + offset, start + length - 1, if_match=etag)["Body"]

        return RangeStream(
            body,
            length,
            self.describe(key),
            on_bytes=lambda n: self._metrics.add_bytes("backend.get", n),
            on_error=lambda: self._metrics.add_error("backend.get"),
            translate=lambda exc: self._error("GetObject body read", key, exc),
            reopen=reopen,
            resumes=self._retries,
        )

    def _get_object(self, key: str, start: int, end: int | None, if_match: str | None = None) -> Any:
        extra = {"IfMatch": if_match} if if_match else {}
        byte_range = f"bytes={start}-{'' if end is None else end}"
        try:
            return self._client.get_object(Bucket=self._bucket, Key=self._key(key), Range=byte_range, **extra)
        except ClientError as exc:
            if _error_code(exc) in ("NoSuchKey", "404", "NotFound") or _status(exc) == 404:
                raise RemoteResourceNotFoundError(f"no object at {self.describe(key)}") from None
            if _error_code(exc) == "InvalidRange" or _status(exc) == 416:
                content_range = exc.response.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get(
                    "content-range", ""
                )
                size = content_range.rpartition("/")[2] or "unknown"
                raise InvalidArgumentError(
                    f"start position {start} is at or past the end of {self.describe(key)} ({size} bytes)"
                ) from None
            raise self._error("GetObject", key, exc) from exc
        except BotoCoreError as exc:
            raise self._error("GetObject", key, exc) from exc

    # -- delete and list ------------------------------------------------------------------------

    def delete(self, keys: Sequence[str]) -> None:
        if not keys:
            return
        with self._metrics.time("backend.delete"):
            try:
                reply = self._client.delete_objects(
                    Bucket=self._bucket,
                    Delete={"Objects": [{"Key": self._key(k)} for k in keys], "Quiet": True},
                )
            except (BotoCoreError, ClientError) as exc:
                full_keys = ", ".join(repr(self._key(k)) for k in keys)
                raise RemoteStorageError(
                    f"S3 DeleteObjects failed for bucket {self._bucket!r}, keys {full_keys}: {self._scrub(str(exc))}"
                ) from exc
            failed = [e for e in reply.get("Errors", []) if e.get("Code") != "NoSuchKey"]
            if failed:
                detail = "; ".join(f"{e.get('Key')}: {e.get('Code')} {e.get('Message', '')}" for e in failed)
                raise RemoteStorageError(
                    f"S3 DeleteObjects failed in bucket {self._bucket!r} for {self._scrub(detail)}"
                )

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        strip = len(self._prefix) + 1 if self._prefix else 0
        with self._metrics.time("backend.list"):
            found: list[ObjectInfo] = []
            try:
                pages = self._client.get_paginator("list_objects_v2").paginate(
                    Bucket=self._bucket, Prefix=self._key(prefix)
                )
                for page in pages:
                    contents = page.get("Contents", [])
                    found.extend(
                        ObjectInfo(o["Key"][strip:], int(o["Size"]), int(o["LastModified"].timestamp() * 1000))
                        for o in contents
                    )
            except (BotoCoreError, ClientError) as exc:
                raise self._error("ListObjectsV2", prefix, exc) from exc
        return iter(found)

    def check(self) -> None:
        """List at most one key under the prefix (s3:ListBucket, which the archiver needs too): wrong credentials,
        a missing bucket or an unreachable endpoint fail it."""
        with self._metrics.time("backend.check"):
            try:
                self._client.list_objects_v2(Bucket=self._bucket, Prefix=self._key(""), MaxKeys=1)
            except (BotoCoreError, ClientError) as exc:
                where = f"bucket {self._bucket!r}" + (f" (prefix {self._prefix!r})" if self._prefix else "")
                raise RemoteStorageError(
                    f"S3 {where} is not usable with this config: {self._scrub(str(exc))}"
                ) from exc

    def close(self) -> None:
        self._client.close()
        _SCRUBBER.remove(self._secrets)


__all__ = ["CONFIG_KEYS", "MIN_PART_SIZE", "NAME", "SSE_ALGORITHMS", "STORAGE_CLASSES", "S3Backend", "create"]
