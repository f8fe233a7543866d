"""Reading a chunked segment: every chunk checked against its checksum before any of its bytes are served,
through the chunk cache when there is one, with a sequential reader's next chunks prefetched in the background.
A transformed segment's chunks are decrypted and decompressed once checked; the cache holds original bytes.

A read of chunks the cache lacks costs one ranged GET from the first missing chunk to the last one wanted,
consumed chunk by chunk as the caller reads; prefetching continues past a segment's end into the next segment
when the caller named it (RemoteStorageManager.hint_next_segment).
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import google_crc32c

from rlmm.errors import InvalidArgumentError, RemoteResourceNotFoundError
from rlmm.types import RemoteLogSegmentId
from rsm.backend import RangeStream, StorageBackend
from rsm.chunk_cache import ChunkCache, ChunkKey
from rsm.chunk_index import ChunkCorruptError, ChunkIndex, checksum
from rsm.failure_log import RepeatedFailureLog
from rsm.metrics import Metrics
from rsm.transforms import IDENTITY, ChunkCodec, TransformError

log = logging.getLogger(__name__)

# Prefetch tasks waiting for a thread at most; more are dropped (counted), so a burst of readers never queues
# unbounded work and submitting never blocks a read.
PREFETCH_QUEUE_BOUND = 64
# Segments whose reader's read-ahead is remembered (ChunkReader._read_ahead), the least recently read dropped first.
READ_AHEAD_SEGMENTS = 1024
CHECKSUM_FAILURES = "chunk.checksum_failures"
PREFETCHED_CHUNKS = "chunk_cache.prefetched_chunks"
PREFETCH_DROPPED = "chunk_cache.prefetch_dropped"
# Bytes of a GET's body read, checksummed and written into a cache file at a time.
STREAM_PIECE = 1 << 20


@dataclass(frozen=True, slots=True)
class ChunkedSegment:
    """What reading one chunked segment needs: its id, its `.log` object's key, its chunk index, and how its
    chunks were transformed."""

    segment_id: RemoteLogSegmentId
    key: str
    index: ChunkIndex
    where: str  # the object's location, for messages
    codec: ChunkCodec = IDENTITY

    def cache_key(self, chunk: int) -> ChunkKey:
        return (self.segment_id.id, chunk)


@dataclass(frozen=True, slots=True)
class ChunkCheck:
    """What the reader of a file range must check before serving any of its bytes: the CRC32C of `length` bytes at
    `offset` of the same file (the whole chunk number `chunk` the range lies in)."""

    chunk: int
    offset: int
    length: int
    crc32c: int


@dataclass(frozen=True, slots=True)
class FileRange:
    """`length` bytes at `offset` of the file at `path`; with a `check`, unchecked bytes the reader checks first."""

    path: Path
    offset: int
    length: int
    check: ChunkCheck | None = None


@dataclass(frozen=True, slots=True)
class SegmentFiles:
    """Segment bytes start..end_position (inclusive) as ranges of files: checked cache files pinned by a lease, or
    (no lease: `lease_id` empty) the store's own files, each range with the check its reader must make."""

    ranges: tuple[FileRange, ...]
    end_position: int
    lease_id: str = ""
    lease_deadline: float | None = None  # time.monotonic() after which leased files may be evicted


NextSegment = Callable[[ChunkedSegment], "ChunkedSegment | None"]


class ChunkReader:
    """Thread-safe; one per RemoteStorageManager."""

    def __init__(
        self,
        backend: StorageBackend,
        cache: ChunkCache | None,
        metrics: Metrics,
        prefetch_bytes: int,
        prefetch_threads: int,
        next_segment: NextSegment,
        wait_s: float = 30.0,
    ) -> None:
        self._backend = backend
        self.cache = cache
        self._metrics = metrics
        # A reader's read-ahead stays within a quarter of the cache, so that one reader cannot evict what it fetched
        # ahead, or what others are reading, before it is read.
        self._prefetch_bytes = prefetch_bytes if cache is None else min(prefetch_bytes, cache.max_bytes // 4)
        self._next_segment = next_segment
        self._wait_s = wait_s
        self._lock = threading.Lock()
        self._inflight: dict[ChunkKey, threading.Event] = {}
        # Per segment: the chunk its reader was last at, and how many chunks it reads ahead from there.
        self._read_aheads: dict[uuid.UUID, tuple[int, int]] = {}
        self._pool: ThreadPoolExecutor | None = None
        if cache is not None and prefetch_bytes > 0:
            self._pool = ThreadPoolExecutor(prefetch_threads, thread_name_prefix="rsm-prefetch")
        self._queue_slots = threading.BoundedSemaphore(PREFETCH_QUEUE_BOUND)
        self._pending = 0  # prefetch tasks queued or running
        self._idle = threading.Condition()
        self._prefetch_failures = RepeatedFailureLog(log, "prefetching segment chunks")

    # -- streams --------------------------------------------------------------------------------

    def open(self, segment: ChunkedSegment, start: int, end: int | None) -> RangeStream:
        """Stream original bytes start..end (inclusive; None or past the size: to the end)."""
        size = segment.index.original_size
        if start >= size:
            raise InvalidArgumentError(
                f"start position {start} is at or past the end of {segment.where} ({size} bytes)"
            )
        last = size - 1 if end is None else min(end, size - 1)
        return RangeStream(_SegmentBody(self, segment, start, last), last - start + 1, segment.where)

    def chunks(self, segment: ChunkedSegment, first: int, last: int) -> Iterator[bytes]:
        """Chunks first..last from one ranged GET, each checked, then cached, as slowly as the caller reads them.
        Each chunk is claimed while in flight, so other readers wait for it rather than fetch it again."""
        claims: dict[ChunkKey, threading.Event] = {}
        try:
            with self._get_run(segment, first, last) as body:
                for chunk in range(first, last + 1):
                    key = segment.cache_key(chunk)
                    if self.cache is not None:
                        claims.update(self._claim_all([key]))
                    data = self.decode(segment, chunk, _read_exact(body, segment.index.stored_length(chunk)))
                    if self.cache is not None:
                        self.cache.put(key, data)
                    claim = claims.pop(key, None)
                    if claim is not None:
                        self._unclaim(key, claim)
                    yield data
        finally:
            for key, claim in claims.items():
                self._unclaim(key, claim)

    def fill(self, segment: ChunkedSegment, first: int, last: int) -> int:
        """Fetch chunks first..last into the cache from one ranged GET, each checked first (prefetch, files); returns
        how many were fetched. All are claimed at once, so other readers wait for them rather than fetch them again.
        An untransformed chunk goes from the GET's body into its cache file a piece at a time, checked on the way,
        where the cache can (on disk): never held whole, and visible only once whole and checked."""
        cache = self.cache
        assert cache is not None
        claims = self._claim_all(segment.cache_key(n) for n in range(first, last + 1))
        try:
            with self._get_run(segment, first, last) as body:
                for chunk in range(first, last + 1):
                    key = segment.cache_key(chunk)
                    stored = None
                    if segment.codec.identity:
                        stored = cache.put_stream(key, self._checked_pieces(segment, chunk, body))
                    if stored is None:
                        length = segment.index.stored_length(chunk)
                        cache.put(key, self.decode(segment, chunk, _read_exact(body, length)))
                    claim = claims.pop(key, None)
                    if claim is not None:
                        self._unclaim(key, claim)
        finally:
            for key, claim in claims.items():
                self._unclaim(key, claim)
        return last - first + 1

    def _get_run(self, segment: ChunkedSegment, first: int, last: int) -> RangeStream:
        """One ranged GET of the stored chunks first..last."""
        index = segment.index
        start = index.stored_start(first)
        end = index.stored_start(last) + index.stored_length(last) - 1
        try:
            return self._backend.get_range(segment.key, start, end)
        except InvalidArgumentError:
            raise self._corrupt(segment, first, "the object is shorter than its chunk index says") from None

    def _checked_pieces(self, segment: ChunkedSegment, chunk: int, body: RangeStream) -> Iterator[bytes]:
        """An untransformed chunk's bytes from `body`, a piece at a time; after the last, ChunkCorruptError if they
        were short or fail the chunk's checksum (so a cache file being written from them is never renamed into
        place)."""
        length = segment.index.stored_length(chunk)
        remaining, crc = length, 0
        while remaining > 0:
            piece = body.read(min(STREAM_PIECE, remaining))
            if not piece:
                break
            crc = google_crc32c.extend(crc, piece)
            remaining -= len(piece)
            yield piece
        if remaining:
            raise self._corrupt(segment, chunk, f"it is {length - remaining} bytes, its chunk index says {length}")
        if crc != segment.index.checksums[chunk]:
            raise self._corrupt(segment, chunk, "it fails its CRC32C checksum")

    def cached(self, segment: ChunkedSegment, chunk: int) -> bytes | None:
        """The checked chunk from the cache, waiting for it if another reader is fetching it right now."""
        assert self.cache is not None
        key = segment.cache_key(chunk)
        with self._lock:
            fetching = self._inflight.get(key)
        if fetching is not None:
            fetching.wait(self._wait_s)
        return self.cache.get(key, segment.index.plain_checksum(chunk))

    def decode(self, segment: ChunkedSegment, chunk: int, data: bytes) -> bytes:
        """The chunk's original bytes from its stored bytes, checked first; raises ChunkCorruptError."""
        if len(data) != segment.index.stored_length(chunk):
            raise self._corrupt(segment, chunk, f"it is {len(data)} bytes, its chunk index says "
                                f"{segment.index.stored_length(chunk)}")
        if checksum(data) != segment.index.checksums[chunk]:
            raise self._corrupt(segment, chunk, "it fails its CRC32C checksum")
        if segment.codec.identity:
            return data
        try:
            return segment.codec.decode(segment.index, chunk, data)
        except TransformError as exc:
            raise self._corrupt(segment, chunk, str(exc)) from None

    def _corrupt(self, segment: ChunkedSegment, chunk: int, why: str) -> ChunkCorruptError:
        self._metrics.increment(CHECKSUM_FAILURES)
        start = segment.index.stored_start(chunk)
        return ChunkCorruptError(
            f"segment {segment.segment_id} chunk {chunk} (stored bytes {start}-"
            f"{start + segment.index.stored_length(chunk) - 1} of {segment.where}) is damaged: {why}; its bytes are "
            "not served. Copy the segment again from a replica that still has it, or delete it"
        )

    # -- files for another process ----------------------------------------------------------------

    def files(self, segment: ChunkedSegment, start: int, end: int, lease_s: float) -> SegmentFiles | None:
        """Bytes start..end (inclusive, inside the segment) as checked, leased cache files; None if the cache
        cannot hold them (no disk cache, the disk is full, or the cache is too small for the range)."""
        cache = self.cache
        if cache is None or cache.path(segment.cache_key(0)) is None:
            return None
        index = segment.index
        first, last = index.chunk_of(start), index.chunk_of(end)
        wanted = [(segment.cache_key(n), index.plain_checksum(n)) for n in range(first, last + 1)]
        # The next window's GET goes out now, beside this window's own.
        self.prefetch_after(segment, last, covered=last)
        lease = None
        for _ in range(2):  # a second round refetches a file the lease's check found damaged
            if not self._ensure_cached(segment, first, last):
                return None
            lease = cache.lease(wanted, lease_s)
            if lease is not None:
                break
        if lease is None:
            return None
        ranges = []
        for chunk, path, unchecked in zip(range(first, last + 1), lease.paths, lease.unchecked, strict=True):
            chunk_start, length = index.original_start(chunk), index.original_length(chunk)
            low = max(start, chunk_start)
            high = min(end, chunk_start + length - 1)
            # A file the cache wrote itself from checked bytes: its reader checks it, the agent does not read it back.
            check = ChunkCheck(chunk, 0, length, index.plain_checksum(chunk)) if unchecked else None
            ranges.append(FileRange(path, low - chunk_start, high - low + 1, check))
        return SegmentFiles(tuple(ranges), end, lease.id, lease.deadline)

    def store_files(self, segment: ChunkedSegment, path: Path, start: int, end: int) -> SegmentFiles:
        """Bytes start..end (inclusive, inside the segment) of an untransformed segment as ranges of the store's own
        file at `path`, each with the CRC32C its whole chunk must have: nothing is read or copied here, the reader
        checks each chunk as it would a cache file's. Raises RemoteResourceNotFoundError if the file is gone,
        ChunkCorruptError if it is shorter than the chunk index says."""
        assert segment.codec.identity, "a transformed segment's stored bytes are not its bytes"
        index = segment.index
        first, last = index.chunk_of(start), index.chunk_of(end)
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            raise RemoteResourceNotFoundError(f"no object at {segment.where}") from None
        if size < index.stored_start(last) + index.stored_length(last):
            raise self._corrupt(segment, last, f"the object is {size} bytes, shorter than its chunk index says")
        ranges = []
        for chunk in range(first, last + 1):
            chunk_start, length = index.stored_start(chunk), index.stored_length(chunk)
            low, high = max(start, chunk_start), min(end, chunk_start + length - 1)
            check = ChunkCheck(chunk, chunk_start, length, index.checksums[chunk])
            ranges.append(FileRange(path, low, high - low + 1, check))
        return SegmentFiles(tuple(ranges), end)

    def _ensure_cached(self, segment: ChunkedSegment, first: int, last: int) -> bool:
        """Fetch the chunks first..last the cache lacks (one GET per run of missing chunks); False if some could
        not be cached."""
        assert self.cache is not None
        missing: list[int] = []
        for chunk in range(first, last + 1):
            key = segment.cache_key(chunk)
            with self._lock:
                fetching = self._inflight.get(key)
            if fetching is not None:
                fetching.wait(self._wait_s)
            if not self.cache.contains(key):
                missing.append(chunk)
        for low, high in _runs(missing):
            self.fill(segment, low, high)
        return all(self.cache.contains(segment.cache_key(n)) for n in missing)

    # -- prefetch -------------------------------------------------------------------------------

    def prefetch_after(self, segment: ChunkedSegment, chunk: int, covered: int) -> None:
        """A reader is at `chunk` and will get chunks up to `covered` on its own: fetch ahead of it (_read_ahead),
        into the next segment if the caller named one. Never blocks."""
        if self._pool is None:
            return
        index = segment.index
        ahead = self._read_ahead(segment, chunk)
        target = chunk + ahead
        first = covered + 1
        last = min(target, index.count - 1)
        if first <= last and self._worth_fetching(segment, first, last):
            self._submit(self._prefetch, segment, first, last)
        beyond = target - (index.count - 1)
        if beyond > 0 and covered < target:
            self._submit(self._prefetch_next, segment, beyond)

    def _read_ahead(self, segment: ChunkedSegment, chunk: int) -> int:
        """How many chunks past `chunk` to have fetched: half the prefetch size for a reader new to the segment or
        one that jumped, the whole of it once the reader moved on within what was read ahead for it. So a reader
        that reads a little costs a smaller prefetch, and one catching up sequentially gets the largest GETs (fewer
        requests, and on S3 more bytes for each request's wait)."""
        most = max(1, self._prefetch_bytes // segment.index.chunk_size)
        with self._lock:
            before = self._read_aheads.pop(segment.segment_id.id, None)
            if before is None or not before[0] <= chunk <= before[0] + before[1]:
                ahead = max(1, most // 2)
            else:
                ahead = most if chunk > before[0] else before[1]
            self._read_aheads[segment.segment_id.id] = (chunk, ahead)
            if len(self._read_aheads) > READ_AHEAD_SEGMENTS:
                del self._read_aheads[next(iter(self._read_aheads))]
        return ahead

    def _worth_fetching(self, segment: ChunkedSegment, first: int, last: int) -> bool:
        """Whether to prefetch chunks first..last now: when the first is missing (neither cached nor being fetched),
        or at least half of them are. Otherwise the reader still has half of its read-ahead, and waiting lets the
        next GET bring a larger run."""
        assert self.cache is not None
        with self._lock:
            inflight = set(self._inflight)
        missing = [n for n in range(first, last + 1)
                   if segment.cache_key(n) not in inflight and not self.cache.contains(segment.cache_key(n))]
        return bool(missing) and (missing[0] == first or 2 * len(missing) >= last - first + 1)

    def _submit(self, task: Callable[..., None], *args: Any) -> None:
        assert self._pool is not None
        if not self._queue_slots.acquire(blocking=False):
            self._metrics.increment(PREFETCH_DROPPED)
            return

        def run() -> None:
            try:
                task(*args)
                self._prefetch_failures.succeeded()
            except Exception as exc:
                # A prefetch is an optimization: the reader fetches (and reports) the chunk itself.
                self._prefetch_failures.failed(exc)
            finally:
                self._done()

        with self._idle:
            self._pending += 1
        try:
            self._pool.submit(run)
        except RuntimeError:  # shut down
            self._done()

    def _done(self) -> None:
        self._queue_slots.release()
        with self._idle:
            self._pending -= 1
            self._idle.notify_all()

    def prefetch_idle(self, timeout_s: float) -> bool:
        """Wait until no prefetch is queued or running; False if `timeout_s` passed first."""
        with self._idle:
            return self._idle.wait_for(lambda: self._pending == 0, timeout_s)

    def _prefetch(self, segment: ChunkedSegment, first: int, last: int) -> None:
        assert self.cache is not None
        with self._lock:
            inflight = set(self._inflight)
        missing = [
            n for n in range(first, last + 1)
            if segment.cache_key(n) not in inflight and not self.cache.contains(segment.cache_key(n))
        ]
        for low, high in _runs(missing):
            self._metrics.increment(PREFETCHED_CHUNKS, self.fill(segment, low, high))

    def _prefetch_next(self, segment: ChunkedSegment, count: int) -> None:
        following = self._next_segment(segment)
        if following is not None and following.index.count:
            last = min(count, following.index.count) - 1
            if self._worth_fetching(following, 0, last):
                self._prefetch(following, 0, last)

    # -- in-flight chunks -----------------------------------------------------------------------

    def _claim_all(self, keys: Iterable[ChunkKey]) -> dict[ChunkKey, threading.Event]:
        """Claim the keys no one else is fetching; returns those claimed."""
        claimed = {}
        with self._lock:
            for key in keys:
                if key not in self._inflight:
                    claimed[key] = self._inflight[key] = threading.Event()
        return claimed

    def _unclaim(self, key: ChunkKey, event: threading.Event) -> None:
        with self._lock:
            if self._inflight.get(key) is event:
                del self._inflight[key]
        event.set()

    def close(self) -> None:
        if self._pool is not None:
            # Queued prefetches are dropped; running ones (a few chunks each) finish before the backend closes.
            self._pool.shutdown(wait=True, cancel_futures=True)


class _SegmentBody:
    """What a RangeStream reads for a chunked segment: original bytes start..last, a checked chunk at a time."""

    def __init__(self, reader: ChunkReader, segment: ChunkedSegment, start: int, last: int) -> None:
        self._reader = reader
        self._segment = segment
        self._start = start
        self._last_byte = last
        self._next = segment.index.chunk_of(start)
        self._last_chunk = segment.index.chunk_of(last)
        self._chunk = b""
        self._pos = self._limit = 0
        self._run: Iterator[bytes] | None = None
        self._run_at = -1  # the chunk the open run yields next
        self._served = -1

    def read(self, size: int) -> bytes:
        if self._pos >= self._limit:
            if self._next > self._last_chunk:
                return b""
            self._load(self._next)
            self._next += 1
        stop = min(self._limit, self._pos + size)
        piece = self._chunk if self._pos == 0 and stop == len(self._chunk) else self._chunk[self._pos : stop]
        self._pos = stop
        return piece

    def _load(self, chunk: int) -> None:
        data = None
        if self._run is not None and self._run_at == chunk:
            data = self._from_run()
        elif self._reader.cache is not None:
            data = self._reader.cached(self._segment, chunk)
        if data is None:
            self._close_run()
            # One GET for the rest of the range: a whole-segment read costs one request, chunks or not.
            self._run = self._reader.chunks(self._segment, chunk, self._last_chunk)
            self._run_at = chunk
            data = self._from_run()
        offset = self._segment.index.original_start(chunk)
        self._chunk = data
        self._pos = max(self._start - offset, 0)
        self._limit = min(self._last_byte + 1 - offset, len(data))
        self._served = chunk
        covered = self._last_chunk if self._run is not None else chunk
        self._reader.prefetch_after(self._segment, chunk, covered)

    def _from_run(self) -> bytes:
        assert self._run is not None
        try:
            data = next(self._run)
        except BaseException:
            self._run = None  # failed (and reported to the caller): nothing to prefetch in its stead
            raise
        self._run_at += 1
        return data

    def _close_run(self) -> None:
        if self._run is not None:
            run, self._run = self._run, None
            run.close()  # type: ignore[attr-defined]

    def close(self) -> None:
        had_run = self._run is not None
        self._close_run()
        if had_run and 0 <= self._served < self._last_chunk:
            # Closed early (the broker read what it needed): what the run would have brought is prefetched instead.
            self._reader.prefetch_after(self._segment, self._served, covered=self._served)


def _read_exact(body: RangeStream, size: int) -> bytes:
    pieces = []
    remaining = size
    while remaining > 0:
        piece = body.read(remaining)
        if not piece:
            break
        pieces.append(piece)
        remaining -= len(piece)
    return pieces[0] if len(pieces) == 1 else b"".join(pieces)


def _runs(chunks: list[int]) -> Iterator[tuple[int, int]]:
    """Consecutive runs of sorted chunk numbers, as (first, last)."""
    start = previous = None
    for chunk in chunks:
        if previous is not None and chunk == previous + 1:
            previous = chunk
            continue
        if start is not None and previous is not None:
            yield start, previous
        start = previous = chunk
    if start is not None and previous is not None:
        yield start, previous


__all__ = ["ChunkCheck", "ChunkReader", "ChunkedSegment", "FileRange", "NextSegment", "SegmentFiles"]
