"""The Azure Blob Storage backend, through azure-storage-blob (the `tierlog[azure]` extra).

Uploads carry a Content-MD5 the service verifies: one Put Blob up to `azure.upload.block.size`, blocks staged
in parallel and committed above it. A ranged read is one streamed GET, resumed on the same
ETag if the body breaks. Retries are the SDK's exponential policy, from 1 s.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from rlmm.config import ConfigKey, parse_int, parse_str
from rlmm.errors import ConfigError, InvalidArgumentError, RemoteResourceNotFoundError, RemoteStorageError
from rsm.backend import ObjectInfo, PrefixedStore, RangeStream, Source, StorageBackend
from rsm.keys import normalize_prefix
from rsm.metrics import Metrics

log = logging.getLogger(__name__)

NAME = "azure"
EXTRA = "tierlog[azure]"
_KIB, _MIB = 1 << 10, 1 << 20
# Azure's limits: a block is at most 4000 MiB; Aiven's floor of 100 KiB keeps the block count sane.
MIN_BLOCK_SIZE, MAX_BLOCK_SIZE = 100 * _KIB, 4000 * _MIB
_SECRET_KEYS = ("azure.account.key", "azure.sas.token", "azure.connection.string")


def _positive(value: int) -> bool:
    return value > 0


CONFIG_KEYS: tuple[ConfigKey, ...] = (
    ConfigKey("azure.container.name", parse_str, required=True, check=bool, requirement="a container name"),
    ConfigKey("azure.prefix", parse_str, default=""),
    ConfigKey("azure.account.name", parse_str, check=bool, requirement="a storage account name"),
    ConfigKey("azure.account.key", parse_str, secret=True, check=bool, requirement="a non-empty key"),
    ConfigKey("azure.sas.token", parse_str, secret=True, check=bool, requirement="a non-empty token"),
    ConfigKey("azure.connection.string", parse_str, secret=True, check=bool, requirement="a non-empty string"),
    ConfigKey("azure.endpoint.url", parse_str),
    ConfigKey(
        "azure.upload.block.size", parse_int, 25 * _MIB, check=lambda v: MIN_BLOCK_SIZE <= v <= MAX_BLOCK_SIZE,
        requirement=f"between {MIN_BLOCK_SIZE} and {MAX_BLOCK_SIZE}",
    ),
    ConfigKey("azure.upload.concurrency", parse_int, 4, check=_positive, requirement="> 0"),
    ConfigKey("azure.request.timeout.ms", parse_int, 30_000, check=_positive, requirement="> 0"),
    ConfigKey("azure.retries.max", parse_int, 3, check=lambda v: v >= 0, requirement=">= 0"),
)


def create(config: dict[str, Any], metrics: Metrics) -> StorageBackend:
    try:
        import azure.storage.blob  # noqa: F401 - only to say which extra is missing
    except ImportError:
        raise ConfigError(
            f"rsm: storage.backend=azure needs azure-storage-blob: pip install '{EXTRA}'"
        ) from None
    _check_credentials(config)
    return AzureBackend(config, metrics)


def _check_credentials(config: dict[str, Any]) -> None:
    """A connection string alone, or an account name with its key or a SAS token (as Aiven's plugin takes them)."""
    if config["azure.connection.string"] is not None:
        clashing = [k for k in ("azure.account.name", "azure.account.key", "azure.sas.token", "azure.endpoint.url")
                    if config[k] is not None]
        if clashing:
            raise ConfigError(f"rsm: config key azure.connection.string cannot be used together with "
                              f"{', '.join(clashing)}; the connection string carries them")
        return
    if config["azure.account.name"] is None:
        raise ConfigError("rsm: config key azure.account.name is required (or azure.connection.string)")
    if (config["azure.account.key"] is None) == (config["azure.sas.token"] is None):
        raise ConfigError("rsm: exactly one of the config keys azure.account.key and azure.sas.token must be set "
                          "with azure.account.name (or use azure.connection.string)")


class AzureBackend(PrefixedStore, StorageBackend):
    def __init__(self, config: dict[str, Any], metrics: Metrics) -> None:
        from azure.core.credentials import AzureNamedKeyCredential, AzureSasCredential
        from azure.storage.blob import BlobServiceClient, ExponentialRetry

        self._container_name: str = config["azure.container.name"]
        self._prefix = normalize_prefix(config["azure.prefix"], "azure.prefix")
        self._block_size: int = config["azure.upload.block.size"]
        self._concurrency: int = config["azure.upload.concurrency"]
        self._retries: int = config["azure.retries.max"]
        self._metrics = metrics
        self._secrets = tuple(config[k] for k in _SECRET_KEYS if config[k])
        timeout = config["azure.request.timeout.ms"] / 1000.0
        options: dict[str, Any] = {
            # The SDK's default waits 15 s before its first retry; S3's and GCS's clients start near 1 s.
            "retry_policy": ExponentialRetry(initial_backoff=1, increment_base=2, retry_total=self._retries,
                                             random_jitter_range=1),
            "connection_timeout": timeout, "read_timeout": timeout,
            # Runs for every attempt: counts what goes on the wire, retries and blocks included.
            "raw_request_hook": self._count_attempt,
            "max_block_size": self._block_size, "max_single_put_size": self._block_size,
        }
        try:
            if config["azure.connection.string"] is not None:
                service = BlobServiceClient.from_connection_string(config["azure.connection.string"], **options)
            else:
                account = config["azure.account.name"]
                url = config["azure.endpoint.url"] or f"https://{account}.blob.core.windows.net"
                credential: Any = (
                    AzureNamedKeyCredential(account, config["azure.account.key"])
                    if config["azure.account.key"] is not None
                    else AzureSasCredential(config["azure.sas.token"])
                )
                service = BlobServiceClient(url, credential=credential, **options)
        except ValueError as exc:
            raise ConfigError(f"rsm: cannot create the Azure client: {self._scrub(str(exc))}") from None
        self._service = service
        self._container = service.get_container_client(self._container_name)
        self._account = service.account_name

    def _count_attempt(self, request: Any) -> None:
        self._metrics.increment(f"azure.http_attempts.{request.http_request.method}")

    def __repr__(self) -> str:
        return f"AzureBackend(account={self._account!r}, container={self._container_name!r}, prefix={self._prefix!r})"

    def describe(self, key: str) -> str:
        return f"container {self._container_name!r}, blob {self._key(key)!r}"

    def _error(self, operation: str, key: str, exc: BaseException) -> RemoteStorageError:
        return RemoteStorageError(f"Azure {operation} failed for {self.describe(key)}: {self._scrub(_summary(exc))}")

    # -- put ------------------------------------------------------------------------------------

    def put(self, key: str, source: Source) -> None:
        from azure.core.exceptions import AzureError

        size = len(source) if isinstance(source, bytes) else self._size(key, source)
        operation = "backend.put" if size <= self._block_size else "backend.put_blocks"
        with self._metrics.time(operation) as timer:
            try:
                if isinstance(source, bytes):
                    self._upload(key, source, size)
                else:
                    with open(source, "rb") as handle:
                        self._upload(key, handle, size)
            except (AzureError, OSError) as exc:
                raise self._error("upload", key, exc) from exc
            timer.bytes = size

    def _upload(self, key: str, data: Any, size: int) -> None:
        # validate_content: a Content-MD5 per request (whole blob or block), checked by the service.
        self._container.upload_blob(
            self._key(key), data, length=size, overwrite=True, validate_content=True,
            max_concurrency=self._concurrency,
        )

    def _size(self, key: str, path: Path) -> int:
        try:
            return path.stat().st_size
        except OSError as exc:
            raise RemoteStorageError(f"cannot upload {path} to {self.describe(key)}: {exc}") from exc

    # -- get ------------------------------------------------------------------------------------

    def get_range(self, key: str, start: int, end: int | None = None) -> RangeStream:
        with self._metrics.time("backend.get"):
            body, length, etag = self._download(key, start, end)

        def reopen(offset: int) -> Any:
            # The rest of the same range of the same blob version: a copy that replaced the blob meanwhile fails
            # the read rather than splicing two versions together.
            with self._metrics.time("backend.get"):
                return self._download(key, start + offset, start + length - 1, etag)[0]

        return RangeStream(
            body,
            length,
            self.describe(key),
            on_bytes=lambda n: self._metrics.add_bytes("backend.get", n),
            on_error=lambda: self._metrics.add_error("backend.get"),
            translate=lambda exc: self._error("read of the body", key, exc),
            reopen=reopen,
            resumes=self._retries,
        )

    def _download(self, key: str, start: int, end: int | None, etag: str | None = None) -> tuple[Any, int, str]:
        """One streamed Get Blob of the range: its body, length and ETag.

        The SDK's public downloader buffers each GET whole (about eight times its size at peak); the operation
        beneath it, with the same pipeline (auth, retries, timeouts), streams the body in small blocks.
        """
        from azure.core.exceptions import AzureError, HttpResponseError
        from azure.storage.blob._generated.models import ModifiedAccessConditions

        blob = self._container.get_blob_client(self._key(key))
        try:
            body, headers = blob._client.blob.download(
                range=f"bytes={start}-{'' if end is None else end}",
                modified_access_conditions=ModifiedAccessConditions(if_match=etag) if etag else None,
                decompress=False, cls=lambda _response, body, headers: (body, headers),
            )
        except HttpResponseError as exc:
            if exc.status_code == 412 or (exc.status_code == 404 and etag):
                raise RemoteStorageError(
                    f"Azure {self.describe(key)} was replaced or deleted while being read"
                ) from None
            if exc.status_code == 404:
                raise RemoteResourceNotFoundError(f"no object at {self.describe(key)}") from None
            if exc.status_code == 416:
                raise InvalidArgumentError(
                    f"start position {start} is at or past the end of {self.describe(key)}"
                ) from None
            raise self._error("GET", key, exc) from exc
        except AzureError as exc:
            raise self._error("GET", key, exc) from exc
        return _StreamedBody(body), int(headers["Content-Length"]), str(headers["ETag"])

    # -- delete and list ------------------------------------------------------------------------

    def delete(self, keys: Sequence[str]) -> None:
        from azure.core.exceptions import AzureError

        if not keys:
            return
        with self._metrics.time("backend.delete"):
            try:
                # One Blob Batch request; an answer per blob, 404 for those already gone.
                replies = list(self._container.delete_blobs(*(self._key(k) for k in keys),
                                                            raise_on_any_failure=False))
            except AzureError as exc:
                names = ", ".join(repr(self._key(k)) for k in keys)
                raise RemoteStorageError(f"Azure delete failed in container {self._container_name!r} for {names}: "
                                         f"{self._scrub(_summary(exc))}") from exc
            failed = [(k, r.status_code) for k, r in zip(keys, replies, strict=True)
                      if r.status_code not in (200, 202, 404)]
            if failed:
                detail = "; ".join(f"{self._key(k)!r}: HTTP {status}" for k, status in failed)
                raise RemoteStorageError(f"Azure delete failed in container {self._container_name!r} for {detail}")

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        from azure.core.exceptions import AzureError

        strip = len(self._prefix) + 1 if self._prefix else 0
        with self._metrics.time("backend.list"):
            try:
                found = [
                    ObjectInfo(blob.name[strip:], int(blob.size), int(blob.last_modified.timestamp() * 1000))
                    for blob in self._container.list_blobs(name_starts_with=self._key(prefix))
                ]
            except AzureError as exc:
                raise self._error("list", prefix, exc) from exc
        return iter(found)

    def check(self) -> None:
        """List at most one blob under the prefix: a wrong key or token, a missing container or an unreachable
        endpoint fail it."""
        from azure.core.exceptions import AzureError

        with self._metrics.time("backend.check"):
            try:
                next(iter(self._container.list_blobs(name_starts_with=self._key(""), results_per_page=1).by_page()),
                     None)
            except AzureError as exc:
                where = f"container {self._container_name!r} of account {self._account!r}" + (
                    f" (prefix {self._prefix!r})" if self._prefix else "")
                raise RemoteStorageError(
                    f"Azure {where} is not usable with this config: {self._scrub(_summary(exc))}"
                ) from exc

    def close(self) -> None:
        self._service.close()


def _summary(exc: BaseException) -> str:
    """The first line of an SDK error (its message then repeats the whole response)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


class _StreamedBody:
    """A streamed response body (an iterator of blocks) as a file-like body: read(n) hands out at most n bytes."""

    def __init__(self, blocks: Any) -> None:
        self._blocks = blocks
        self._pending = memoryview(b"")

    def read(self, size: int) -> bytes:
        if not self._pending:
            self._pending = memoryview(next(self._blocks, b""))
        piece, self._pending = self._pending[:size], self._pending[size:]
        return bytes(piece)

    def close(self) -> None:
        self._blocks.response.internal_response.close()


__all__ = ["CONFIG_KEYS", "EXTRA", "NAME", "AzureBackend", "create"]
