"""A bounded LRU cache of segment chunks, keyed by segment id and chunk number, on local disk or in memory.

Disk: one file per chunk, `<fetch.chunk.cache.path>/<segment uuid>/<chunk number>`, written to a temporary file
and renamed into place; the index is rebuilt from the directory at start, so a restarted agent keeps its warm
cache. Every get checks the bytes against the checksum from the segment's chunk index; a corrupt or partial file
is dropped. A full disk degrades to uncached reads. Leases pin files another process (the JVM adapter) is about
to open, so eviction cannot remove them first. A lease checks each file as a get does, except a file this cache
wrote itself from checked bytes and finds unchanged (same inode, size and modification time): that one is marked
for its reader to check (`Lease.unchecked`), so a chunk the agent just fetched is not read back only to be read
again by the adapter.
"""

from __future__ import annotations

import abc
import contextlib
import errno
import logging
import os
import shutil
import threading
import time
import uuid
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, TypeVar

from rlmm.errors import RemoteStorageError
from rsm.chunk_index import checksum, file_checksum
from rsm.failure_log import RepeatedFailureLog
from rsm.metrics import Metrics

log = logging.getLogger(__name__)

_T = TypeVar("_T")

ChunkKey = tuple[uuid.UUID, int]
_TEMP_DIR = ".tmp"
_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)

# Counter names in rsm.metrics (the agent exports them as tierlog_rsm_events{counter=...}).
HITS = "chunk_cache.hits"
MISSES = "chunk_cache.misses"
EVICTIONS = "chunk_cache.evictions"
BYTES_WRITTEN = "chunk_cache.bytes_written"
BYTES_SERVED = "chunk_cache.bytes_served"
CORRUPT_DROPPED = "chunk_cache.corrupt_dropped"
DISK_FULL = "chunk_cache.disk_full"
WRITE_FAILURES = "chunk_cache.write_failures"


@dataclass(frozen=True, slots=True)
class Lease:
    """Chunk files pinned until `release` or `deadline` (time.monotonic()), whichever comes first."""

    id: str
    paths: tuple[Path, ...]
    deadline: float
    # Per path: True for a file this cache wrote from checked bytes and left unchecked here, whose reader must check
    # it before serving its bytes; False for a file checked as the lease was taken.
    unchecked: tuple[bool, ...] = ()


class ChunkCache(abc.ABC):
    """The bookkeeping (LRU order, byte bound, pins, metrics) shared by the disk and the memory cache."""

    def __init__(self, max_bytes: int, metrics: Metrics, clock: Callable[[], float] = time.monotonic) -> None:
        self._max_bytes = max_bytes
        self._metrics = metrics
        self._clock = clock
        self._lock = threading.Lock()
        self._entries: OrderedDict[ChunkKey, int] = OrderedDict()
        self._bytes = 0
        self._leases: dict[str, tuple[float, tuple[ChunkKey, ...]]] = {}
        self._pinned: Counter[ChunkKey] = Counter()
        self._write_failures = RepeatedFailureLog(log, "writing to the chunk cache (reads go uncached meanwhile)")

    @property
    def max_bytes(self) -> int:
        """The cache's bound in bytes."""
        return self._max_bytes

    # -- storage, per kind ----------------------------------------------------------------------

    @abc.abstractmethod
    def _read(self, key: ChunkKey) -> bytes | None:
        """The stored bytes, or None if absent."""

    @abc.abstractmethod
    def _write(self, key: ChunkKey, data: bytes) -> None:
        """Store atomically (readers see the whole chunk or none); raises OSError on failure."""

    @abc.abstractmethod
    def _delete(self, key: ChunkKey) -> None:
        """Remove; absent is not an error."""

    def path(self, key: ChunkKey) -> Path | None:
        """Where a chunk's file is, for a cache on disk; None for the memory cache."""
        return None

    def _own_file(self, key: ChunkKey) -> tuple[Path, int] | None:
        """(path, size) of a chunk's file if this cache wrote it, in this process, and it is still that file; None
        otherwise (the memory cache keeps no files)."""
        return None

    def put_stream(self, key: ChunkKey, pieces: Iterable[bytes]) -> bool | None:
        """Store a chunk from its pieces as they come, without holding it whole, for a cache that can (None: it
        cannot, and nothing was consumed). The caller checks the chunk it streams and raises once its last piece is
        consumed if it is damaged: then nothing is stored. False if it was not stored (bigger than the cache, or a
        write failed: the pieces are consumed to the end all the same, so the caller's check still runs); True once
        stored."""
        return None

    def _check_file(self, key: ChunkKey) -> tuple[Path, int, int] | None:
        """(path, checksum, size) of a chunk's file, read in small pieces (nothing is kept); None if absent or the
        cache keeps no files."""
        path = self.path(key)
        if path is None:
            return None
        try:
            return (path, *file_checksum(path))
        except FileNotFoundError:
            return None

    # -- the cache ------------------------------------------------------------------------------

    def contains(self, key: ChunkKey) -> bool:
        with self._lock:
            return key in self._entries

    def get(self, key: ChunkKey, expected_crc: int) -> bytes | None:
        """The chunk if cached and it matches `expected_crc`; a damaged copy is dropped (a miss)."""

        def read(key: ChunkKey) -> tuple[bytes, int, int] | None:
            data = self._read(key)
            return None if data is None else (data, checksum(data), len(data))

        return self._checked(key, expected_crc, read)

    def _checked(self, key: ChunkKey, expected_crc: int, read: Callable[[ChunkKey], tuple[_T, int, int] | None]
                 ) -> _T | None:
        """What `read` found of a cached chunk, (what, its checksum, its size), if it matches `expected_crc`; None
        for a miss. A damaged copy is dropped, and so is the entry of a file removed behind the cache's back."""
        with self._lock:
            present = key in self._entries
            if present:
                self._entries.move_to_end(key)
        found = read(key) if present else None
        return self._judged(key, present, expected_crc, found)

    def _judged(self, key: ChunkKey, present: bool, expected_crc: int, found: tuple[_T, int, int] | None
                ) -> _T | None:
        """`found` of a chunk the index held (`present`), if it matches `expected_crc`; the metrics of the lookup."""
        if found is not None and found[1] != expected_crc:
            log.warning("dropping cached chunk %d of segment %s: it fails its checksum (damaged or partial file); "
                        "fetching it again", key[1], key[0])
            self._metrics.increment(CORRUPT_DROPPED)
            self._drop(key)
            found = None
        elif found is None and present:
            self._drop(key)  # removed behind our back
        if found is None:
            self._metrics.increment(MISSES)
            return None
        self._metrics.increment(HITS)
        self._metrics.increment(BYTES_SERVED, found[2])
        return found[0]

    def put(self, key: ChunkKey, data: bytes) -> bool:
        """Store a checked chunk; False if it was not stored (bigger than the cache, or the write failed)."""
        if len(data) > self._max_bytes:
            return False
        try:
            self._write(key, data)
        except OSError as exc:
            self._write_failed(exc)
            return False
        self._stored(key, len(data))
        return True

    def _stored(self, key: ChunkKey, size: int) -> None:
        """Account for a chunk just written."""
        self._write_failures.succeeded()
        self._metrics.increment(BYTES_WRITTEN, size)
        with self._lock:
            self._bytes += size - self._entries.pop(key, 0)
            self._entries[key] = size
            self._evict_locked()

    def _write_failed(self, exc: OSError) -> None:
        if exc.errno in _DISK_FULL:
            self._metrics.increment(DISK_FULL)
        self._metrics.increment(WRITE_FAILURES)
        self._write_failures.failed(exc)

    def lease(self, keys: Sequence[tuple[ChunkKey, int]], seconds: float) -> Lease | None:
        """Check each (key, expected checksum) and pin its file for `seconds`; None if any is missing or damaged
        (a damaged one is dropped), or the cache keeps no files. A file this cache wrote itself and finds unchanged
        is not read here: the lease marks it `unchecked`, for its reader to check."""
        paths = []
        unchecked = []
        for key, crc in keys:
            own = self._own_file(key)
            if own is not None:
                with self._lock:
                    present = key in self._entries
                    if present:
                        self._entries.move_to_end(key)
                path = self._judged(key, present, crc, (own[0], crc, own[1]) if present else None)
            else:
                path = self._checked(key, crc, self._check_file)
            if path is None:
                return None
            paths.append(path)
            unchecked.append(own is not None)
        lease_id = uuid.uuid4().hex
        deadline = self._clock() + seconds
        chosen = tuple(key for key, _ in keys)
        with self._lock:
            self._expire_leases_locked()
            if any(key not in self._entries for key in chosen):
                return None  # evicted between the check and the pin
            self._leases[lease_id] = (deadline, chosen)
            self._pinned.update(chosen)
        return Lease(lease_id, tuple(paths), deadline, tuple(unchecked))

    def release(self, lease_id: str) -> bool:
        """Unpin a lease's files; False if it is unknown (released before, or expired)."""
        with self._lock:
            found = self._leases.pop(lease_id, None)
            if found is not None:
                self._pinned.subtract(found[1])
                self._evict_locked()
        return found is not None

    def invalidate(self, segment: uuid.UUID) -> None:
        """Forget every chunk of a segment (copied again, or deleted)."""
        with self._lock:
            doomed = [key for key in self._entries if key[0] == segment]
        for key in doomed:
            self._drop(key)

    @property
    def size_bytes(self) -> int:
        with self._lock:
            return self._bytes

    @property
    def entries(self) -> int:
        with self._lock:
            return len(self._entries)

    def _drop(self, key: ChunkKey) -> None:
        with self._lock:
            size = self._entries.pop(key, None)
            if size is not None:
                self._bytes -= size
        self._delete(key)

    def _expire_leases_locked(self) -> None:
        now = self._clock()
        for lease_id in [i for i, (deadline, _) in self._leases.items() if deadline <= now]:
            _, keys = self._leases.pop(lease_id)
            self._pinned.subtract(keys)

    def _evict_locked(self) -> None:
        if self._bytes <= self._max_bytes:
            return
        self._expire_leases_locked()
        for key in list(self._entries):
            if self._bytes <= self._max_bytes:
                break
            if self._pinned[key] > 0:
                continue  # another process is about to read it; evicted once released or expired
            self._bytes -= self._entries.pop(key)
            self._delete(key)
            self._metrics.increment(EVICTIONS)

    def _load(self, found: Iterable[tuple[float, ChunkKey, int]]) -> None:
        """Seed the index (oldest first), evicting down to the bound."""
        with self._lock:
            for _, key, size in sorted(found):
                self._entries[key] = size
                self._bytes += size
            self._evict_locked()


class _TooBig(Exception):
    """A streamed chunk turned out bigger than the whole cache: not stored."""


class MemoryChunkCache(ChunkCache):
    """Chunks held as bytes in this process (`fetch.chunk.cache.class=memory`); no files to hand out."""

    def __init__(self, max_bytes: int, metrics: Metrics, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(max_bytes, metrics, clock)
        self._data: dict[ChunkKey, bytes] = {}

    def _read(self, key: ChunkKey) -> bytes | None:
        return self._data.get(key)

    def _write(self, key: ChunkKey, data: bytes) -> None:
        self._data[key] = data

    def _delete(self, key: ChunkKey) -> None:
        self._data.pop(key, None)


class DiskChunkCache(ChunkCache):
    """Chunks as files below `root` (`fetch.chunk.cache.class=disk`); survives restarts."""

    def __init__(
        self, root: Path, max_bytes: int, metrics: Metrics, clock: Callable[[], float] = time.monotonic
    ) -> None:
        super().__init__(max_bytes, metrics, clock)
        self._root = root
        self._temp = root / _TEMP_DIR
        # Files written by this process from checked bytes: (inode, size, modification time) as renamed into place.
        self._own: dict[ChunkKey, tuple[int, int, int]] = {}
        try:
            # A crash may leave half-written temporary files; they were never renamed into the cache.
            shutil.rmtree(self._temp, ignore_errors=True)
            self._temp.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise RemoteStorageError(f"cannot use fetch.chunk.cache.path {str(root)!r}: {exc}") from exc
        self._load(self._scan())
        log.info("chunk cache at %s: %d chunks, %d bytes (bound %d)", root, self.entries, self.size_bytes,
                 max_bytes)

    def _scan(self) -> list[tuple[float, ChunkKey, int]]:
        """Every chunk file in the directory with its modification time (an approximation of its last use)."""
        found = []
        for directory in self._root.iterdir():
            try:
                segment = uuid.UUID(directory.name)
            except ValueError:
                continue  # .tmp, or not ours
            for entry in os.scandir(directory):
                if entry.name.isdigit():
                    stat = entry.stat()
                    found.append((stat.st_mtime, (segment, int(entry.name)), stat.st_size))
        return found

    def path(self, key: ChunkKey) -> Path:
        return self._root / str(key[0]) / str(key[1])

    def _read(self, key: ChunkKey) -> bytes | None:
        try:
            with open(self.path(key), "rb", buffering=0) as source:
                return source.read()
        except FileNotFoundError:
            return None

    def _own_file(self, key: ChunkKey) -> tuple[Path, int] | None:
        written = self._own.get(key)
        if written is None:
            return None
        path = self.path(key)
        try:
            found = os.stat(path)
        except OSError:
            return None
        return (path, found.st_size) if (found.st_ino, found.st_size, found.st_mtime_ns) == written else None

    def _write(self, key: ChunkKey, data: bytes) -> None:
        def write(out: BinaryIO) -> None:
            written = out.write(data)
            if written != len(data):
                raise OSError(errno.EIO, f"short write ({written} of {len(data)} bytes)")

        self._write_file(key, write)

    def put_stream(self, key: ChunkKey, pieces: Iterable[bytes]) -> bool | None:
        remaining = iter(pieces)
        size = 0

        def write(out: BinaryIO) -> None:
            nonlocal size
            for piece in remaining:
                size += len(piece)
                if size > self._max_bytes:
                    raise _TooBig
                if out.write(piece) != len(piece):
                    raise OSError(errno.EIO, f"short write of a piece of {len(piece)} bytes")

        try:
            self._write_file(key, write)
        except (_TooBig, OSError) as exc:
            for _ in remaining:
                pass  # the rest of the chunk is read all the same, so the caller's check runs and its body moves on
            if isinstance(exc, OSError):
                self._write_failed(exc)
            return False
        self._stored(key, size)
        return True

    def _write_file(self, key: ChunkKey, write: Callable[[BinaryIO], None]) -> None:
        """Write a chunk's file with `write` into a temporary file, then rename it into place (readers see the whole
        chunk or none); raises what `write` raises, the temporary file removed."""
        temp = self._temp / uuid.uuid4().hex
        target = self.path(key)
        try:
            with open(temp, "xb", buffering=0) as out:
                write(out)
            # No fsync: after a power loss a damaged file fails its checksum and is fetched again.
            for attempt in range(2):
                target.parent.mkdir(exist_ok=True)
                try:
                    os.replace(temp, target)
                    break
                except FileNotFoundError:  # an invalidation removed the segment's directory meanwhile
                    if attempt:
                        raise
        except BaseException:
            temp.unlink(missing_ok=True)
            raise
        with contextlib.suppress(OSError):
            written = os.stat(target)
            self._own[key] = (written.st_ino, written.st_size, written.st_mtime_ns)

    def _delete(self, key: ChunkKey) -> None:
        self._own.pop(key, None)
        path = self.path(key)
        path.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            path.parent.rmdir()  # the segment's last chunk: leave no empty directory behind


__all__ = [
    "BYTES_SERVED",
    "BYTES_WRITTEN",
    "CORRUPT_DROPPED",
    "DISK_FULL",
    "EVICTIONS",
    "HITS",
    "MISSES",
    "WRITE_FAILURES",
    "ChunkCache",
    "ChunkKey",
    "DiskChunkCache",
    "Lease",
    "MemoryChunkCache",
]
