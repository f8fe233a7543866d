"""The Google Cloud Storage backend, through google-cloud-storage (the `tierlog[gcs]` extra).

Uploads carry a CRC32C the server verifies: one request up to 8 MiB, a resumable upload in
`gcs.resumable.upload.chunk.size` pieces above (a failed piece is retried from where the server stopped).
Ranged reads are one streamed GET each, resumed on the same object generation if the body breaks.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

from rlmm.config import ConfigKey, parse_bool, parse_int, parse_str
from rlmm.errors import ConfigError, InvalidArgumentError, RemoteResourceNotFoundError, RemoteStorageError
from rsm.backend import ObjectInfo, PrefixedStore, RangeStream, Source, StorageBackend
from rsm.keys import normalize_prefix
from rsm.metrics import Metrics

log = logging.getLogger(__name__)

NAME = "gcs"
EXTRA = "tierlog[gcs]"
DEFAULT_ENDPOINT = "https://storage.googleapis.com"
SCOPES = ("https://www.googleapis.com/auth/devstorage.read_write",)
_KIB = 1 << 10
# GCS wants every resumable piece but the last to be a multiple of 256 KiB.
RESUMABLE_CHUNK_UNIT = 256 * _KIB
_CREDENTIAL_KEYS = ("gcs.credentials.json", "gcs.credentials.path", "gcs.credentials.default")


def _positive(value: int) -> bool:
    return value > 0


CONFIG_KEYS: tuple[ConfigKey, ...] = (
    ConfigKey("gcs.bucket.name", parse_str, required=True, check=bool, requirement="a bucket name"),
    ConfigKey("gcs.prefix", parse_str, default=""),
    ConfigKey("gcs.endpoint.url", parse_str),
    ConfigKey("gcs.credentials.json", parse_str, secret=True, check=bool, requirement="a non-empty JSON document"),
    ConfigKey("gcs.credentials.path", parse_str, check=bool, requirement="a non-empty file path"),
    ConfigKey("gcs.credentials.default", parse_bool),
    ConfigKey(
        "gcs.resumable.upload.chunk.size", parse_int, 100 * RESUMABLE_CHUNK_UNIT,
        check=lambda v: v > 0 and v % RESUMABLE_CHUNK_UNIT == 0,
        requirement=f"a positive multiple of {RESUMABLE_CHUNK_UNIT} (256 KiB)",
    ),
    ConfigKey("gcs.request.timeout.ms", parse_int, 30_000, check=_positive, requirement="> 0"),
    ConfigKey("gcs.retries.max", parse_int, 3, check=lambda v: v >= 0, requirement=">= 0"),
    ConfigKey("gcs.max.connections", parse_int, 16, check=_positive, requirement="> 0"),
)


def create(config: dict[str, Any], metrics: Metrics) -> StorageBackend:
    try:
        import google.cloud.storage  # noqa: F401 - only to say which extra is missing
    except ImportError:
        raise ConfigError(
            f"rsm: storage.backend=gcs needs google-cloud-storage: pip install '{EXTRA}'"
        ) from None
    return GcsBackend(config, metrics, _credentials(config))


def _credentials(config: dict[str, Any]) -> Any:
    """The credentials the config names: a key (a service account's or a user's) as JSON or a file, the default
    chain, or (for an emulator at gcs.endpoint.url, with none set) anonymous."""
    import google.auth
    from google.auth.credentials import AnonymousCredentials
    from google.auth.exceptions import GoogleAuthError

    chosen = [key for key in _CREDENTIAL_KEYS if config[key] not in (None, False)]
    if len(chosen) > 1:
        raise ConfigError(f"rsm: config keys {' and '.join(chosen)} cannot be set together; choose one")
    source = chosen[0] if chosen else None
    try:
        if source == "gcs.credentials.json":
            try:
                info = json.loads(config["gcs.credentials.json"])
            except ValueError:
                raise ConfigError("rsm: config key gcs.credentials.json is not valid JSON") from None
            return _key_credentials(info, source)
        if source == "gcs.credentials.path":
            with open(config["gcs.credentials.path"], encoding="utf-8") as handle:
                return _key_credentials(json.load(handle), source)
        if source is None and config["gcs.endpoint.url"] is not None:
            return AnonymousCredentials()
        return google.auth.default(scopes=SCOPES)[0]
    except (GoogleAuthError, OSError, ValueError) as exc:
        # The message of a bad key names its fields, never the private key.
        where = source or "the default credential chain (gcs.credentials.default)"
        raise ConfigError(f"rsm: cannot load GCS credentials from {where}: {exc}") from None


def _key_credentials(info: Any, source: str) -> Any:
    """A key of the types operators hand out, loaded by its own loader (never a generic one, which would also run
    the commands an external-account config names)."""
    from google.oauth2 import credentials as user
    from google.oauth2 import service_account

    kind = info.get("type") if isinstance(info, dict) else None
    if kind == "service_account":
        return service_account.Credentials.from_service_account_info(info, scopes=SCOPES)
    if kind == "authorized_user":
        return user.Credentials.from_authorized_user_info(info, scopes=SCOPES)
    raise ConfigError(f"rsm: config key {source} holds credentials of type {kind!r}; it takes 'service_account' "
                      "or 'authorized_user' keys (others, such as workload identity federation, through "
                      "gcs.credentials.default and GOOGLE_APPLICATION_CREDENTIALS)")


def _client_errors(*more: type[BaseException]) -> tuple[type[BaseException], ...]:
    """What the client library raises for a failed call, after its retries (API answers, transport failures,
    credential refreshes, broken uploads), and `more`."""
    import requests
    from google.api_core.exceptions import GoogleAPIError
    from google.auth.exceptions import GoogleAuthError
    from google.cloud.storage.exceptions import DataCorruption, InvalidResponse

    return GoogleAPIError, GoogleAuthError, InvalidResponse, DataCorruption, requests.RequestException, *more


class GcsBackend(PrefixedStore, StorageBackend):
    def __init__(self, config: dict[str, Any], metrics: Metrics, credentials: Any) -> None:
        import requests
        from google.api_core.client_options import ClientOptions
        from google.auth.transport.requests import AuthorizedSession
        from google.cloud import storage
        from google.cloud.storage.retry import DEFAULT_RETRY

        self._bucket_name: str = config["gcs.bucket.name"]
        self._prefix = normalize_prefix(config["gcs.prefix"], "gcs.prefix")
        self._endpoint = (config["gcs.endpoint.url"] or DEFAULT_ENDPOINT).rstrip("/")
        self._chunk_size: int = config["gcs.resumable.upload.chunk.size"]
        self._retries: int = config["gcs.retries.max"]
        self._timeout = config["gcs.request.timeout.ms"] / 1000.0
        self._metrics = metrics
        # The library retries by time: give each request its attempts' worth of timeouts.
        self._retry = DEFAULT_RETRY.with_timeout(self._timeout * (self._retries + 1))
        pool = requests.adapters.HTTPAdapter(
            pool_connections=1, pool_maxsize=config["gcs.max.connections"], max_retries=0
        )
        # One authorized session for the client's calls and for the streamed ranged GETs the client lacks.
        self._session = AuthorizedSession(credentials)
        self._session.mount("https://", pool)
        self._session.mount("http://", pool)
        # Count what goes on the wire, retries and resumable pieces included (our timers see one call each).
        self._session.hooks["response"].append(self._count_attempt)
        self._client = storage.Client(
            project=None, credentials=credentials, _http=self._session,
            client_options=ClientOptions(api_endpoint=self._endpoint),
        )
        self._bucket = self._client.bucket(self._bucket_name)

    def _count_attempt(self, response: Any, *args: Any, **kwargs: Any) -> None:
        self._metrics.increment(f"gcs.http_attempts.{response.request.method}")

    def __repr__(self) -> str:
        return f"GcsBackend(bucket={self._bucket_name!r}, prefix={self._prefix!r})"

    def describe(self, key: str) -> str:
        return f"bucket {self._bucket_name!r}, key {self._key(key)!r}"

    def _error(self, operation: str, key: str, exc: BaseException) -> RemoteStorageError:
        return RemoteStorageError(f"GCS {operation} failed for {self.describe(key)}: {exc}")

    # -- put ------------------------------------------------------------------------------------

    def put(self, key: str, source: Source) -> None:
        blob = self._bucket.blob(self._key(key), chunk_size=self._chunk_size)
        size = len(source) if isinstance(source, bytes) else self._size(key, source)
        # The library switches to a resumable upload above 8 MiB.
        operation = "backend.put" if size <= 8 << 20 else "backend.put_resumable"
        with self._metrics.time(operation) as timer:
            try:
                if isinstance(source, bytes):
                    blob.upload_from_string(
                        source, content_type="application/octet-stream", checksum="crc32c",
                        retry=self._retry, timeout=self._timeout,
                    )
                else:
                    blob.upload_from_filename(
                        str(source), content_type="application/octet-stream", checksum="crc32c",
                        retry=self._retry, timeout=self._timeout,
                    )
            except _client_errors(OSError) as exc:
                raise self._error("upload", key, exc) from exc
            timer.bytes = size

    def _size(self, key: str, path: Path) -> int:
        try:
            return path.stat().st_size
        except OSError as exc:
            raise RemoteStorageError(f"cannot upload {path} to {self.describe(key)}: {exc}") from exc

    # -- get ------------------------------------------------------------------------------------

    def get_range(self, key: str, start: int, end: int | None = None) -> RangeStream:
        with self._metrics.time("backend.get"):
            response = self._get(key, start, end)
        length = int(response.headers["Content-Length"])
        generation = response.headers.get("x-goog-generation")
        if length == 0:
            # Real GCS answers 416 here; an emulator may answer an empty range instead.
            response.close()
            raise InvalidArgumentError(f"start position {start} is at or past the end of {self.describe(key)}")

        def reopen(offset: int) -> Any:
            # The rest of the same range of the same generation: a copy that replaced the object meanwhile
            # fails the read rather than splicing two versions together.
            with self._metrics.time("backend.get"):
                return _ClosingBody(self._get(key, start + offset, start + length - 1, generation, resuming=True))

        return RangeStream(
            _ClosingBody(response),
            length,
            self.describe(key),
            on_bytes=lambda n: self._metrics.add_bytes("backend.get", n),
            on_error=lambda: self._metrics.add_error("backend.get"),
            translate=lambda exc: self._error("read of the body", key, exc),
            reopen=reopen,
            resumes=self._retries,
        )

    def _get(self, key: str, start: int, end: int | None, generation: str | None = None,
             resuming: bool = False) -> Any:
        """The streamed response of one ranged GET, retried as the library retries its own calls."""
        from google.api_core import exceptions as api

        url = f"{self._endpoint}/download/storage/v1/b/{quote(self._bucket_name, safe='')}/o/" \
              f"{quote(self._key(key), safe='')}?alt=media"
        if generation is not None:
            url += f"&generation={generation}"
        headers = {"Range": f"bytes={start}-{'' if end is None else end}", "Accept-Encoding": "identity"}

        def attempt() -> Any:
            response = self._session.get(url, headers=headers, stream=True, timeout=self._timeout)
            if response.status_code in (200, 206):
                response.raw.decode_content = False
                return response
            try:
                raise api.from_http_response(response)
            finally:
                response.close()

        try:
            return self._retry(attempt)()
        except api.NotFound:
            if resuming:
                raise RemoteStorageError(f"GCS {self.describe(key)} was replaced or deleted while being read") from None
            raise RemoteResourceNotFoundError(f"no object at {self.describe(key)}") from None
        except api.RequestRangeNotSatisfiable:
            raise InvalidArgumentError(
                f"start position {start} is at or past the end of {self.describe(key)}"
            ) from None
        except _client_errors() as exc:
            raise self._error("GET", key, exc) from exc

    # -- delete and list ------------------------------------------------------------------------

    def delete(self, keys: Sequence[str]) -> None:
        if not keys:
            return
        with self._metrics.time("backend.delete"):
            try:
                # on_error is called for objects already gone (404) only; other failures raise.
                self._bucket.delete_blobs(
                    [self._key(k) for k in keys], on_error=lambda _blob: None, retry=self._retry,
                    timeout=self._timeout,
                )
            except _client_errors() as exc:
                names = ", ".join(repr(self._key(k)) for k in keys)
                raise RemoteStorageError(
                    f"GCS delete failed in bucket {self._bucket_name!r} for {names}: {exc}"
                ) from exc

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        strip = len(self._prefix) + 1 if self._prefix else 0
        with self._metrics.time("backend.list"):
            try:
                found = [
                    ObjectInfo(blob.name[strip:], int(blob.size),
                               int(blob.updated.timestamp() * 1000) if blob.updated else None)
                    for blob in self._client.list_blobs(
                        self._bucket_name, prefix=self._key(prefix), retry=self._retry, timeout=self._timeout
                    )
                ]
            except _client_errors() as exc:
                raise self._error("list", prefix, exc) from exc
        return iter(found)

    def check(self) -> None:
        """List at most one object under the prefix (storage.objects.list, which deletes and the archiver need
        too): wrong credentials, a missing bucket or an unreachable endpoint fail it."""
        with self._metrics.time("backend.check"):
            try:
                list(self._client.list_blobs(self._bucket_name, prefix=self._key(""), max_results=1,
                                             retry=None, timeout=self._timeout))
            except _client_errors() as exc:
                where = f"bucket {self._bucket_name!r}" + (f" (prefix {self._prefix!r})" if self._prefix else "")
                raise RemoteStorageError(f"GCS {where} is not usable with this config: {exc}") from exc

    def close(self) -> None:
        self._client.close()
        self._session.close()


class _ClosingBody:
    """A streamed response's body that closes the response (and returns its connection) with it."""

    def __init__(self, response: Any) -> None:
        self._response = response

    def read(self, size: int) -> bytes:
        return bytes(self._response.raw.read(size))

    def close(self) -> None:
        self._response.close()


__all__ = ["CONFIG_KEYS", "EXTRA", "NAME", "GcsBackend", "create"]
