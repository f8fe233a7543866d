"""The storage backend interface: put, ranged get, batched delete, list by prefix.

Each backend is one module in rsm.backends; RangeStream is the file-like object every ranged get returns.
"""

from __future__ import annotations

import abc
import contextlib
import io
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Protocol

from rlmm.config import ConfigKey
from rlmm.errors import RemoteStorageError
from rsm.metrics import Metrics

log = logging.getLogger(__name__)

# What put() uploads: a file on this host (a segment) or bytes already in memory (a packed index).
Source = Path | bytes


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    key: str
    size: int
    # When the store last wrote the object (ms since the epoch); None where a store cannot say.
    last_modified_ms: int | None = None


class StorageBackend(abc.ABC):
    """An object store seen through four calls. Keys are '/'-separated and relative to the backend's root.

    Errors: a missing object on get_range raises RemoteResourceNotFoundError; a start position at or past
    the end of the object raises InvalidArgumentError; anything else raises RemoteStorageError whose
    message names the location (bucket or directory), the key and the cause, and never a credential.
    """

    @abc.abstractmethod
    def put(self, key: str, source: Source) -> None:
        """Store `source` under `key` atomically: readers see the old object, the new one, or none."""

    @abc.abstractmethod
    def get_range(self, key: str, start: int, end: int | None = None) -> RangeStream:
        """Stream bytes start..end (inclusive; None or past the size means to the end of the object)."""

    @abc.abstractmethod
    def delete(self, keys: Sequence[str]) -> None:
        """Delete `keys` in one request where the store allows it; missing keys are not an error."""

    @abc.abstractmethod
    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        """Every object whose key starts with `prefix`, in key order."""

    @abc.abstractmethod
    def describe(self, key: str) -> str:
        """Where `key` lives, for error messages (for example: bucket 'b', key 'p/k')."""

    def local_file(self, key: str) -> Path | None:
        """The file holding the object's bytes on this host, for a store of local files (the filesystem backend);
        None for a remote store. The caller reads it as it is: no resume, no metrics."""
        return None

    def check(self) -> None:  # noqa: B027 - backends without credentials or a server have nothing to check
        """One cheap request proving the store answers with this config (credentials, bucket); raises
        RemoteStorageError saying what is wrong. Run at start, so a bad config shows before the first copy."""

    def close(self) -> None:  # noqa: B027 - backends without connections need no cleanup
        """Release connections and threads."""


class PrefixedStore:
    """What the object-store backends share: their keys under a configured prefix, and error texts with the
    configured credentials taken out."""

    _prefix: str
    _secrets: Sequence[str] = ()

    def _key(self, key: str) -> str:
        return f"{self._prefix}/{key}" if self._prefix else key

    def _scrub(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, "<redacted>")
        return text


class BackendModule(Protocol):
    """What a module in rsm.backends provides so that the manager can find and build it by name."""

    NAME: str
    CONFIG_KEYS: tuple[ConfigKey, ...]

    def create(self, config: dict[str, Any], metrics: Metrics) -> StorageBackend: ...


class RangeStream(io.RawIOBase):
    """A read-only binary stream over one ranged read that never holds more than the caller's buffer.

    It counts bytes into the metrics, fails loudly (naming the object) if the store closes the body
    early, and turns the transport's exceptions into RemoteStorageError. Given `reopen` (offset within
    the range -> a new body from there), a body that breaks mid-read is resumed up to `resumes` times.
    """

    def __init__(
        self,
        body: Any,
        length: int,
        where: str,
        on_bytes: Callable[[int], None] | None = None,
        on_error: Callable[[], None] | None = None,
        translate: Callable[[BaseException], RemoteStorageError] | None = None,
        reopen: Callable[[int], Any] | None = None,
        resumes: int = 0,
    ) -> None:
        super().__init__()
        self._body = body
        self._remaining = length
        self._where = where
        self._on_bytes = on_bytes
        self._on_error = on_error
        self._translate = translate
        self._reopen = reopen
        self._resumes_left = resumes if reopen is not None else 0
        self.length = length

    def observe(self, on_bytes: Callable[[int], None], on_error: Callable[[], None]) -> RangeStream:
        """Also report this stream's bytes and failure to `on_bytes`/`on_error` (the rsm operation that
        returned it, whose bytes arrive only as the caller reads); returns the stream."""
        first_bytes, first_error = self._on_bytes, self._on_error

        def both_bytes(n: int) -> None:
            if first_bytes is not None:
                first_bytes(n)
            on_bytes(n)

        def both_errors() -> None:
            if first_error is not None:
                first_error()
            on_error()

        self._on_bytes, self._on_error = both_bytes, both_errors
        return self

    def readable(self) -> bool:
        return True

    def read(self, size: int | None = -1) -> bytes:
        # Hand the store's chunk over as it is: RawIOBase.read would copy it through readinto.
        if self.closed:
            raise ValueError("read from a closed RangeStream")
        wanted = self._remaining if size is None or size < 0 else min(size, self._remaining)
        if wanted == 0:
            return b""
        chunks = []
        while wanted > 0:
            chunk = self._read_chunk(wanted)
            chunks.append(chunk)
            wanted -= len(chunk)
            if size is not None and size >= 0:
                break  # one read of at most `size` bytes, like any raw stream
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def readall(self) -> bytes:
        return self.read(-1)

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        chunk = self.read(len(view))
        view[: len(chunk)] = chunk
        return len(chunk)

    def _read_chunk(self, wanted: int) -> bytes:
        while True:
            failure: BaseException | None = None
            try:
                chunk = self._body.read(wanted)
            except RemoteStorageError:
                raise
            except Exception as exc:
                failure = exc
            else:
                if chunk:
                    break
                failure = EOFError(f"the store ended the body {self._remaining} bytes early")
            if self._resumes_left > 0 and self._reopen is not None:
                self._resumes_left -= 1
                self._resume(failure)
                continue
            self._fail()
            if self._translate is not None:
                raise self._translate(failure) from failure
            raise RemoteStorageError(f"reading {self._where} failed: {failure}") from failure
        self._remaining -= len(chunk)
        if self._on_bytes is not None:
            self._on_bytes(len(chunk))
        return chunk

    def _resume(self, failure: BaseException) -> None:
        assert self._reopen is not None
        log.info("resuming %s at byte %d after: %s", self._where, self.length - self._remaining, failure)
        with contextlib.suppress(Exception):
            self._body.close()
        try:
            self._body = self._reopen(self.length - self._remaining)
        except RemoteStorageError:
            self._fail()
            raise

    def _fail(self) -> None:
        if self._on_error is not None:
            self._on_error()

    def close(self) -> None:
        if not self.closed:
            try:
                self._body.close()
            finally:
                super().close()

    def __enter__(self) -> RangeStream:
        return self


def read_all(stream: BinaryIO | RangeStream) -> bytes:
    """Read a stream to its end and close it."""
    with stream:
        return stream.read()


__all__ = ["BackendModule", "ObjectInfo", "RangeStream", "Source", "StorageBackend", "read_all"]
