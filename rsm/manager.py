"""The RemoteStorageManager facade: Kafka's RSM calls in snake_case over one storage backend.

Each segment is two objects, `.log` and a packed `.indexes`; see DESIGN.md "The storage layout". Segments may be
written compressed and encrypted chunk by chunk (rsm/transforms.py, rsm/keyring.py), each recording how.
"""

from __future__ import annotations

import dataclasses
import enum
import io
import logging
import tempfile
import threading
import uuid
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, BinaryIO

from rlmm.config import ConfigKey, parse_bool, parse_config, parse_int, parse_str
from rlmm.errors import ConfigError, InvalidArgumentError, RemoteResourceNotFoundError, RemoteStorageError
from rlmm.types import RemoteLogSegmentMetadata
from rsm import chunk_index, custom_metadata, keyring, transforms
from rsm.backend import RangeStream, StorageBackend, read_all
from rsm.backends import available_backends
from rsm.chunk_cache import ChunkCache, DiskChunkCache, MemoryChunkCache
from rsm.chunk_reader import ChunkedSegment, ChunkReader, SegmentFiles
from rsm.custom_metadata import SegmentCustomMetadata
from rsm.index_cache import IndexCache
from rsm.keyring import DataKeyError, KeyRing, WrappedKey, build_keyring
from rsm.keys import INDEXES_SUFFIX, LOG_SUFFIX, SegmentKeys, keys_for, parse_object_key
from rsm.metrics import ABSENT_INDEX_COUNTER, Metrics
from rsm.packed_index import (
    BROKER_READ_GROUP,
    MAX_HEADER_SIZE,
    READ_GROUPS,
    PackedIndexLayout,
    Section,
    SectionType,
    SegmentSection,
    extract,
    pack,
    parse_header,
)
from rsm.rate_limit import MIN_BYTES_PER_SECOND, THROTTLED_MS, UploadRateLimiter
from rsm.transforms import ChunkCodec, SegmentCipher, batches_compressed, write_transformed
from rsm.types import IndexType, LogSegmentData

log = logging.getLogger(__name__)
_OWNER = "rsm"


def _non_negative(value: int) -> bool:
    return value >= 0


def _parse_log_dirs(value: Any) -> tuple[Path, ...]:
    """Kafka's `log.dirs` form: a comma-separated list of directories, symlinks resolved once here."""
    dirs = tuple(Path(part.strip()).resolve() for part in parse_str(value).split(",") if part.strip())
    if not all(d.is_absolute() for d in dirs):
        raise ValueError("expected absolute directories")
    return dirs


# fetch.chunk.cache.class values; Aiven's class names are accepted for the same two caches.
CHUNK_CACHE_CLASSES = ("none", "disk", "memory")
_AIVEN_CACHE_CLASSES = {"diskchunkcache": "disk", "memorychunkcache": "memory"}
# Segments whose successor a caller named (hint_next_segment), remembered for prefetching across the boundary.
NEXT_SEGMENT_HINTS = 4096
# Segments whose chunk index (and data key) were decoded, kept so reads do not unwrap the key again (a KMS call).
DECODED_SEGMENTS = 1024
# The sections a segment read needs besides the `.log` object; adjacent in the packed object (one range).
CHUNK_SECTIONS = frozenset({SegmentSection.CHUNK_INDEX, SegmentSection.WRAPPED_KEY})
# Counters (tierlog_rsm_events{counter=...}): bytes of transformed segments before and after their transforms,
# and segments the compression heuristic left uncompressed.
TRANSFORM_ORIGINAL_BYTES = "transform.original_bytes"
TRANSFORM_STORED_BYTES = "transform.stored_bytes"
COMPRESSION_SKIPPED = "compression.skipped_segments"


def _parse_cache_class(value: Any) -> str:
    name = parse_str(value).strip()
    short = name.rpartition(".")[2].lower()
    return _AIVEN_CACHE_CLASSES.get(short, short)


CORE_CONFIG_KEYS: tuple[ConfigKey, ...] = (
    ConfigKey("storage.backend", parse_str, default="filesystem"),
    # Spread keys over the store's key space by a hash of the partition (helps S3 request-rate limits).
    ConfigKey("storage.hash.prefix", parse_bool, default=False),
    ConfigKey("index.cache.max.bytes", parse_int, 64 << 20, check=_non_negative, requirement=">= 0"),
    ConfigKey("index.cache.ttl.ms", parse_int, 600_000, check=lambda v: v > 0, requirement="> 0"),
    # The broker's log directories: copy_log_segment_data reads segment files only below them, so a caller
    # naming any other file (/etc/shadow) is refused. Unset (a library user's own files): no restriction.
    ConfigKey("log.dirs", _parse_log_dirs, default=()),
    # Without log.dirs (Kafka hands the RSM none): read only files inside some Kafka log directory, the one
    # each file's path leads to (a directory holding meta.properties). The agent turns it on for brokers.
    ConfigKey("log.dirs.detect", parse_bool, default=False),
    # Segments are uploaded with a CRC32C per chunk of this many bytes (recorded per segment, so changing it
    # affects new segments only); reads check every chunk and the chunk cache holds whole chunks.
    ConfigKey(
        "chunk.size", parse_int, chunk_index.DEFAULT_CHUNK_SIZE,
        check=lambda v: chunk_index.MIN_CHUNK_SIZE <= v <= chunk_index.MAX_CHUNK_SIZE,
        requirement=f"between {chunk_index.MIN_CHUNK_SIZE} and {chunk_index.MAX_CHUNK_SIZE}",
    ),
    ConfigKey(
        "fetch.chunk.cache.class", _parse_cache_class, "none", check=lambda v: v in CHUNK_CACHE_CLASSES,
        requirement=" or ".join(CHUNK_CACHE_CLASSES),
    ),
    ConfigKey("fetch.chunk.cache.path", parse_str, default=""),
    ConfigKey("fetch.chunk.cache.size", parse_int, 1 << 30, check=lambda v: v > 0, requirement="> 0"),
    # How far a sequential reader is read ahead (half of it for a reader new to a segment, ChunkReader._read_ahead);
    # prefetching waits until half of it is missing, so its GETs are large. Eight of the adapter's 8 MiB windows:
    # on S3 a GET's wait for its first byte then falls on 32-64 MiB, not on every window.
    ConfigKey(
        "fetch.chunk.cache.prefetch.max.size", parse_int, 16 * chunk_index.DEFAULT_CHUNK_SIZE,
        check=_non_negative, requirement=">= 0",
    ),
    ConfigKey("fetch.chunk.cache.prefetch.threads", parse_int, 2, check=lambda v: v > 0, requirement="> 0"),
    # fetch_log_segment_files hands out an untransformed segment's own file when the store keeps local files (the
    # filesystem backend), its reader checking each chunk, instead of copying the chunks into the disk cache first.
    ConfigKey("fetch.files.direct", parse_bool, default=True),
    # How long chunk files handed to another process (fetch_log_segment_files) stay pinned if not released.
    ConfigKey("fetch.chunk.cache.lease.ms", parse_int, 30_000, check=lambda v: v > 0, requirement="> 0"),
    # Where a compressed or encrypted segment is staged before its upload (empty: the system's temp dir).
    ConfigKey("transform.temp.dir", parse_str, default=""),
    # Bytes/s every upload of this rsm together reads from disk (Aiven's key); unset: no limit.
    ConfigKey(
        "upload.rate.limit.bytes.per.second", parse_int, None, check=lambda v: v >= MIN_BYTES_PER_SECOND,
        requirement=f">= {MIN_BYTES_PER_SECOND} (1 MiB/s)",
    ),
    *transforms.CONFIG_KEYS,
    *keyring.CONFIG_KEYS,
)
# What Kafka writes at the root of every log directory it formats.
KAFKA_LOG_DIR_MARKER = "meta.properties"


def parse_rsm_config(raw: Mapping[str, Any]) -> tuple[dict[str, Any], str, dict[str, Any]]:
    """Core config, the chosen backend's name, and its config (its required keys enforced)."""
    backends = available_backends()
    # Keys of backends that are not selected are accepted (a broker's config may carry them all).
    every_backend_key = tuple(
        dataclasses.replace(key, required=False) for module in backends.values() for key in module.CONFIG_KEYS
    )
    # The key ring's entries (encryption.key.pairs.<id>.*) are checked by keyring.build_keyring.
    core = parse_config(raw, CORE_CONFIG_KEYS + every_backend_key, _OWNER, ignore_prefixes=(keyring.RING_PREFIX,))
    name = core["storage.backend"]
    if name not in backends:
        raise ConfigError(
            f"{_OWNER}: config key storage.backend must be one of {', '.join(sorted(backends))}, got {name!r}"
        )
    if core["fetch.chunk.cache.class"] == "disk" and not core["fetch.chunk.cache.path"]:
        raise ConfigError(f"{_OWNER}: config key fetch.chunk.cache.path is required with fetch.chunk.cache.class=disk")
    own_keys = backends[name].CONFIG_KEYS
    own_names = {key.name for key in own_keys}
    backend_config = parse_config({k: v for k, v in raw.items() if k in own_names}, own_keys, _OWNER)
    return core, name, backend_config


class RewrapOutcome(enum.Enum):
    """What rewrap_data_key did with one segment."""

    REWRAPPED = "rewrapped"
    CURRENT = "current"  # already under the active key
    UNENCRYPTED = "unencrypted"
    GONE = "gone"  # deleted while it was rewrapped


class IndexAbsentError(RemoteResourceNotFoundError):
    """fetch_index asked for an index the segment does not have: Kafka's expected answer for most segments'
    TRANSACTION index, not a failure (the agent counts it apart from errors)."""


def _require_metadata(metadata: object) -> RemoteLogSegmentMetadata:
    if not isinstance(metadata, RemoteLogSegmentMetadata):
        raise InvalidArgumentError(
            f"expected RemoteLogSegmentMetadata, got {type(metadata).__name__}"
        )
    return metadata


def _require_index_type(value: object) -> IndexType:
    if not isinstance(value, IndexType):
        raise InvalidArgumentError(f"expected an rsm.IndexType, got {type(value).__name__} {value!r}")
    return value


class RemoteStorageManager:
    """Kafka's RemoteStorageManager. Thread-safe; one instance serves every partition of a broker."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        core, name, backend_config = parse_rsm_config(config)
        self._metrics = Metrics()
        self._backend: StorageBackend = available_backends()[name].create(backend_config, self._metrics)
        self._hashed: bool = core["storage.hash.prefix"]
        self._log_dirs: tuple[Path, ...] = core["log.dirs"]
        self._detect_log_dirs: bool = core["log.dirs.detect"]
        self._cache = IndexCache(
            core["index.cache.max.bytes"], core["index.cache.ttl.ms"] / 1000.0, self._metrics
        )
        self._chunk_size: int = core["chunk.size"]
        self._keyring: KeyRing | None = build_keyring(core, config)
        self._encrypt: bool = core["encryption.enabled"]
        self._compress: bool = core["compression.enabled"]
        self._compression_heuristic: bool = core["compression.heuristic.enabled"]
        self._zstd_level: int = core["compression.zstd.level"]
        self._temp_dir: str | None = core["transform.temp.dir"] or None
        limit = core["upload.rate.limit.bytes.per.second"]
        self._upload_limiter = None if limit is None else UploadRateLimiter(limit)
        self._decoded: OrderedDict[uuid.UUID, ChunkedSegment] = OrderedDict()
        self._decoded_lock = threading.Lock()
        self._lease_s: float = core["fetch.chunk.cache.lease.ms"] / 1000.0
        self._direct_files: bool = core["fetch.files.direct"]
        self._chunk_cache = _chunk_cache(core, self._metrics)
        self._chunk_cache_bytes: int = core["fetch.chunk.cache.size"]
        self._next_hints: OrderedDict[Any, RemoteLogSegmentMetadata] = OrderedDict()
        self._hints_lock = threading.Lock()
        self._reader = ChunkReader(
            self._backend, self._chunk_cache, self._metrics, core["fetch.chunk.cache.prefetch.max.size"],
            core["fetch.chunk.cache.prefetch.threads"], self._next_chunked_segment,
        )
        self._closed = threading.Event()

    def __repr__(self) -> str:
        return (f"RemoteStorageManager(backend={self._backend!r}, hash_prefix={self._hashed}, "
                f"compression={self._compress}, encryption={self._encrypt})")

    def __enter__(self) -> RemoteStorageManager:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed.is_set():
            raise RemoteStorageError("this RemoteStorageManager is closed; create a new one")

    # -- copy -----------------------------------------------------------------------------------

    def copy_log_segment_data(self, metadata: RemoteLogSegmentMetadata, data: LogSegmentData) -> bytes | None:
        """Upload the segment, then its packed indexes; return the section table as custom metadata.

        A retry with the same metadata overwrites both objects, so the call is idempotent.
        """
        self._check_open()
        _require_metadata(metadata)
        if not isinstance(data, LogSegmentData):
            raise InvalidArgumentError(f"expected rsm.LogSegmentData, got {type(data).__name__}")
        self._require_in_log_dirs(data)
        keys = keys_for(metadata, self._hashed)
        with self._metrics.time("rsm.copy_log_segment_data") as timer:
            # Read the indexes first: a missing file fails the copy before anything is uploaded.
            indexes = self._read_indexes(data)
            codec, wrapped = self._codec_for_copy(metadata, data.log_segment)
            chunks = self._upload_log(keys.log, data.log_segment, codec)
            packed, layout = pack(
                indexes, chunk_index=chunk_index.encode(chunks, codec.seal()),
                wrapped_key=None if wrapped is None else wrapped.encode(),
            )
            # Written last: a segment whose .indexes object exists is complete.
            self._backend.put(keys.indexes, packed)
            timer.bytes = metadata.segment_size_in_bytes + len(packed)
        self._forget(metadata)
        log.debug("copied segment %s to %s", metadata.remote_log_segment_id, keys.log)
        return custom_metadata.encode(SegmentCustomMetadata(layout, self._hashed))

    def _codec_for_copy(self, metadata: RemoteLogSegmentMetadata, log_segment: Path) -> tuple[
        ChunkCodec, WrappedKey | None
    ]:
        """How this segment's chunks are written, per the config now, and its wrapped fresh data key."""
        compress = self._compress
        if compress and self._compression_heuristic and batches_compressed(log_segment):
            compress = False  # its batches are compressed already: zstd would only cost time
            self._metrics.increment(COMPRESSION_SKIPPED)
        cipher, wrapped = None, None
        if self._encrypt:
            assert self._keyring is not None  # build_keyring refuses encryption without an active key
            segment = metadata.remote_log_segment_id.id
            data_key, wrapped = self._keyring.new_data_key(segment)
            cipher = SegmentCipher(data_key, segment)
        return ChunkCodec(compress, cipher, self._zstd_level), wrapped

    def _upload_log(self, key: str, log_segment: Path, codec: ChunkCodec) -> chunk_index.ChunkIndex:
        """Upload the `.log` object (transformed into a staging file first if the codec says so); its chunk index."""
        if codec.identity:
            chunks = chunk_index.build(log_segment, self._chunk_size, self._pace_upload)
            self._backend.put(key, log_segment)
            return chunks
        try:
            with tempfile.TemporaryDirectory(prefix="tierlog-rsm-", dir=self._temp_dir) as staging:
                staged = Path(staging) / "segment"
                with open(staged, "wb") as out:
                    chunks = write_transformed(log_segment, out, self._chunk_size, codec, self._pace_upload)
                self._backend.put(key, staged)
        except OSError as exc:
            raise RemoteStorageError(
                f"cannot stage the transformed segment {log_segment} in {self._temp_dir or tempfile.gettempdir()} "
                f"(config key transform.temp.dir): {exc}"
            ) from exc
        self._metrics.increment(TRANSFORM_ORIGINAL_BYTES, chunks.original_size)
        self._metrics.increment(TRANSFORM_STORED_BYTES, chunks.stored_size)
        return chunks

    def _pace_upload(self, nbytes: int) -> None:
        """Charge `nbytes` of a segment read for upload to the rate limit, if one is set."""
        if self._upload_limiter is not None:
            waited = self._upload_limiter.acquire(nbytes)
            if waited > 0:
                self._metrics.increment(THROTTLED_MS, round(waited * 1000))

    def _require_in_log_dirs(self, data: LogSegmentData) -> None:
        if not self._log_dirs and not self._detect_log_dirs:
            return
        for path in data.files():
            # Resolved first: a symlink inside a log dir must not lead outside it.
            real = path.resolve()
            if self._log_dirs:
                if not any(real.is_relative_to(root) for root in self._log_dirs):
                    raise InvalidArgumentError(
                        f"refusing to read {path} (resolves to {real}): segment files must lie in the broker's "
                        f"log directories ({', '.join(map(str, self._log_dirs))}, config key log.dirs)"
                    )
            elif not (real.parent.parent / KAFKA_LOG_DIR_MARKER).is_file():
                # A segment file lives in <log dir>/<topic>-<partition>/; the log dir holds meta.properties.
                raise InvalidArgumentError(
                    f"refusing to read {path} (resolves to {real}): segment files must lie in a partition "
                    f"directory of a Kafka log directory (one holding {KAFKA_LOG_DIR_MARKER}); set log.dirs "
                    "to the broker's log.dirs to name them"
                )

    @staticmethod
    def _read_indexes(data: LogSegmentData) -> dict[IndexType, bytes]:
        paths = {
            IndexType.OFFSET: data.offset_index,
            IndexType.TIMESTAMP: data.time_index,
            IndexType.PRODUCER_SNAPSHOT: data.producer_snapshot_index,
        }
        if data.transaction_index is not None:
            paths[IndexType.TRANSACTION] = data.transaction_index
        indexes = {IndexType.LEADER_EPOCH: data.leader_epoch_index}
        for index_type, path in paths.items():
            try:
                indexes[index_type] = path.read_bytes()
            except OSError as exc:
                raise RemoteStorageError(f"cannot read the {index_type.name} index {path}: {exc}") from exc
        return indexes

    # -- fetch ----------------------------------------------------------------------------------

    def fetch_log_segment(
        self, metadata: RemoteLogSegmentMetadata, start: int, end: int | None = None
    ) -> RangeStream:
        """Stream the segment's bytes from `start` to `end` inclusive (None or past the size: to the end)."""
        self._check_open()
        _require_metadata(metadata)
        if isinstance(start, bool) or not isinstance(start, int) or start < 0:
            raise InvalidArgumentError(f"start position must be an int >= 0, got {start!r}")
        if end is not None and (isinstance(end, bool) or not isinstance(end, int) or end < start):
            raise InvalidArgumentError(f"end position must be None or an int >= start ({start}), got {end!r}")
        operation = "rsm.fetch_log_segment"
        with self._metrics.time(operation):
            chunked = self._chunked_segment(metadata)
            if chunked is None:  # written before chunk indexes: served unchecked, as then
                stream = self._backend.get_range(self._keys(metadata).log, start, end)
            else:
                stream = self._reader.open(chunked, start, end)
        # The body arrives as the caller reads it: count its bytes (and a broken read) then.
        return stream.observe(
            lambda n: self._metrics.add_bytes(operation, n), lambda: self._metrics.add_error(operation)
        )

    def fetch_indexes(
        self, metadata: RemoteLogSegmentMetadata, types: Iterable[IndexType]
    ) -> dict[IndexType, BinaryIO]:
        """Every requested index the segment has, from one ranged GET; absent types are left out."""
        self._check_open()
        _require_metadata(metadata)
        wanted = {_require_index_type(t) for t in types}
        with self._metrics.time("rsm.fetch_indexes") as timer:
            found = self._fetch_sections(metadata, wanted)
            timer.bytes = sum(len(b) for b in found.values())
        return {t: io.BytesIO(found[t]) for t in sorted(wanted) if t in found}

    def fetch_index(self, metadata: RemoteLogSegmentMetadata, index_type: IndexType) -> BinaryIO:
        """One index; a miss loads its whole read group into the cache (see packed_index.READ_GROUPS):
        the broker's OFFSET, TIMESTAMP, TRANSACTION, or a follower's LEADER_EPOCH, PRODUCER_SNAPSHOT.

        Raises RemoteResourceNotFoundError if the segment has no such index (a segment without
        transactions has no TRANSACTION index).
        """
        self._check_open()
        _require_metadata(metadata)
        _require_index_type(index_type)
        segment = metadata.remote_log_segment_id.id
        with self._metrics.time("rsm.fetch_index") as timer:
            hit = self._cache.get(segment, index_type)
            if hit is None:
                group = next(g for g in READ_GROUPS if index_type in g)
                data = self._fetch_group(metadata, group).get(index_type)
            else:
                data = hit.data
            timer.bytes = 0 if data is None else len(data)
        if data is None:
            # Normal (most segments have no TRANSACTION index): counted as absent, not as a failed request.
            self._metrics.increment(f"{ABSENT_INDEX_COUNTER}{index_type.name}")
            raise IndexAbsentError(f"segment {metadata.remote_log_segment_id} has no {index_type.name} index")
        return io.BytesIO(data)

    def _segment_layout(
        self, metadata: RemoteLogSegmentMetadata
    ) -> tuple[SegmentKeys, PackedIndexLayout | None]:
        """The segment's keys, and its section table when its custom metadata carries one."""
        decoded = None
        if metadata.custom_metadata:
            decoded = custom_metadata.decode(metadata.custom_metadata, str(metadata.remote_log_segment_id))
        if decoded is None:
            return keys_for(metadata, self._hashed), None
        return keys_for(metadata, decoded.hashed_keys), decoded.layout

    def _keys(self, metadata: RemoteLogSegmentMetadata) -> SegmentKeys:
        return self._segment_layout(metadata)[0]

    def _fetch_group(
        self, metadata: RemoteLogSegmentMetadata, group: Iterable[SectionType]
    ) -> dict[SectionType, bytes]:
        """Fetch sections into the index cache. The broker's read group brings the chunk index along (it is the
        next section), so a broker's index read then segment read cost one GET each, as before chunks."""
        wanted = set(group)
        if wanted & (BROKER_READ_GROUP | CHUNK_SECTIONS):
            wanted |= CHUNK_SECTIONS
        found = self._fetch_sections(metadata, wanted)
        # Absent members are cached too, so the broker's TRANSACTION call after OFFSET costs nothing.
        self._cache.put(metadata.remote_log_segment_id.id, {t: found.get(t) for t in wanted})
        return found

    def _chunked_segment(self, metadata: RemoteLogSegmentMetadata) -> ChunkedSegment | None:
        """The segment's chunk index, key and codec; None for a segment written before chunk indexes."""
        keys, layout = self._segment_layout(metadata)
        if layout is not None and layout.get(SegmentSection.CHUNK_INDEX) is None:
            return None
        segment = metadata.remote_log_segment_id.id
        with self._decoded_lock:
            decoded = self._decoded.get(segment)
            if decoded is not None:
                self._decoded.move_to_end(segment)
                return decoded
        sections = self._chunk_sections(metadata)
        data = sections.get(SegmentSection.CHUNK_INDEX)
        if data is None:
            return None
        where = self._backend.describe(keys.log)
        slot = sections.get(SegmentSection.WRAPPED_KEY)
        if layout is not None and layout.get(SegmentSection.WRAPPED_KEY) is not None and slot is None:
            raise DataKeyError(f"segment {metadata.remote_log_segment_id} is encrypted, but {where}'s packed index "
                               "has no wrapped data key")
        cipher = None if slot is None else SegmentCipher(self._data_key(metadata, slot), segment)
        index = chunk_index.decode(
            data, f"segment {metadata.remote_log_segment_id} ({where})", None if cipher is None else cipher.open_index
        )
        if (cipher is not None) != index.encrypted:
            raise chunk_index.ChunkIndexError(
                f"the chunk index of segment {metadata.remote_log_segment_id} ({where}) says its chunks are "
                f"{'' if index.encrypted else 'not '}encrypted, but the segment has "
                f"{'a' if cipher is not None else 'no'} wrapped data key; its bytes are not served"
            )
        decoded = ChunkedSegment(
            metadata.remote_log_segment_id, keys.log, index, where, ChunkCodec(index.compressed is not None, cipher)
        )
        with self._decoded_lock:
            self._decoded[segment] = decoded
            while len(self._decoded) > DECODED_SEGMENTS:
                self._decoded.popitem(last=False)
        return decoded

    def _chunk_sections(self, metadata: RemoteLogSegmentMetadata) -> dict[SectionType, bytes | None]:
        """The segment's chunk index and wrapped key sections (None: absent), from the index cache or one GET."""
        segment = metadata.remote_log_segment_id.id
        hits = {t: self._cache.get(segment, t, counted=False) for t in CHUNK_SECTIONS}
        if any(hit is None for hit in hits.values()):
            found = self._fetch_group(metadata, CHUNK_SECTIONS)
            return {t: found.get(t) for t in CHUNK_SECTIONS}
        return {t: hit.data for t, hit in hits.items() if hit is not None}

    def _data_key(self, metadata: RemoteLogSegmentMetadata, slot: bytes) -> bytes:
        segment_id = metadata.remote_log_segment_id
        wrapped = WrappedKey.decode(slot, str(segment_id))
        if self._keyring is None:
            raise DataKeyError(
                f"segment {segment_id} is encrypted (its data key is wrapped under key id {wrapped.key_id!r}), but "
                "no key ring is configured: set encryption.key.pairs and the entry's key file or KMS key"
            )
        return self._keyring.unwrap(wrapped, segment_id.id)

    def _fetch_sections(
        self, metadata: RemoteLogSegmentMetadata, types: Iterable[SectionType]
    ) -> dict[SectionType, bytes]:
        keys, layout = self._segment_layout(metadata)
        where = self._backend.describe(keys.indexes)
        if layout is None:
            # A segment without our custom metadata (an older writer): one extra read for the header.
            header = read_all(self._backend.get_range(keys.indexes, 0, MAX_HEADER_SIZE - 1))
            layout = parse_header(header, where)
        wanted = layout.present(types)
        if not wanted:
            return {}
        start, end = layout.span(wanted)
        data = read_all(self._backend.get_range(keys.indexes, start, end - 1))
        return extract(data, start, wanted, where)

    # -- delete ---------------------------------------------------------------------------------

    def delete_log_segment_data(self, metadata: RemoteLogSegmentMetadata) -> None:
        """Delete both objects in one request; deleting what is already gone is not an error."""
        self._check_open()
        _require_metadata(metadata)
        keys, layout = self._segment_layout(metadata)
        targets = list(keys.both())
        if layout is None:
            # No custom metadata (a copy that failed, or an older writer): the segment may have been
            # written under either key layout, and deleting a missing key costs nothing extra.
            targets += keys_for(metadata, not self._hashed).both()
        with self._metrics.time("rsm.delete_log_segment_data"):
            self._backend.delete(targets)
        self._forget(metadata)

    def _forget(self, metadata: RemoteLogSegmentMetadata) -> None:
        """Drop what is cached of a segment that was copied again or deleted."""
        self._cache.invalidate(metadata.remote_log_segment_id.id)
        with self._decoded_lock:
            self._decoded.pop(metadata.remote_log_segment_id.id, None)
        if self._chunk_cache is not None:
            self._chunk_cache.invalidate(metadata.remote_log_segment_id.id)

    # -- the adapter's data path and prefetch hints ---------------------------------------------

    def fetch_log_segment_files(
        self, metadata: RemoteLogSegmentMetadata, start: int, end: int | None = None, max_bytes: int | None = None
    ) -> SegmentFiles | None:
        """The segment's bytes from `start` to `end` (inclusive; None: to the end), at most `max_bytes` of them,
        as ranges of files another process on this host (the JVM adapter) reads instead of a byte stream.
        `end_position` says where the answer stops when `max_bytes` cut it short.

        An untransformed segment in a store of local files (the filesystem backend, with fetch.files.direct) is
        answered with the store's own file, nothing copied: each range carries its chunk's position and CRC32C,
        which the reader must check before serving the range's bytes. Otherwise the ranges are checked files in
        the disk chunk cache, pinned until `release_segment_files(lease_id)` or the lease's deadline
        (fetch.chunk.cache.lease.ms); the reader must open them before the deadline (an open file stays readable
        after eviction).

        None when files cannot be had: no disk cache, a segment written before chunk indexes, or a cache that
        cannot hold the range (disk full, range larger than the cache). Then read with fetch_log_segment.
        """
        self._check_open()
        _require_metadata(metadata)
        if isinstance(start, bool) or not isinstance(start, int) or start < 0:
            raise InvalidArgumentError(f"start position must be an int >= 0, got {start!r}")
        if end is not None and (isinstance(end, bool) or not isinstance(end, int) or end < start):
            raise InvalidArgumentError(f"end position must be None or an int >= start ({start}), got {end!r}")
        with self._metrics.time("rsm.fetch_log_segment_files") as timer:
            if self._chunk_cache is None and not self._direct_files:
                return None
            chunked = self._chunked_segment(metadata)
            if chunked is None:
                return None
            size = chunked.index.original_size
            if start >= size:
                raise InvalidArgumentError(
                    f"start position {start} is at or past the end of {chunked.where} ({size} bytes)"
                )
            last = size - 1 if end is None else min(end, size - 1)
            wanted = max_bytes if max_bytes is not None and max_bytes > 0 else size
            own_file = self._backend.local_file(chunked.key) if chunked.codec.identity and self._direct_files else None
            if own_file is not None:
                last = min(last, start + wanted - 1)
                files: SegmentFiles | None = self._reader.store_files(chunked, own_file, start, last)
            elif self._chunk_cache is None:
                return None
            else:
                # Never more than a quarter of the cache in one answer, so its files all fit beside other readers'.
                window = min(max(chunked.index.chunk_size, self._chunk_cache_bytes // 4), wanted)
                last = min(last, start + window - 1)
                files = self._reader.files(chunked, start, last, self._lease_s)
            timer.bytes = 0 if files is None else last - start + 1
        return files

    def release_segment_files(self, lease_id: str) -> bool:
        """Unpin the files of a fetch_log_segment_files answer; False if the lease was unknown or expired (or the
        answer had none: the store's own files)."""
        return self._chunk_cache is not None and self._chunk_cache.release(lease_id)

    def hint_next_segment(self, metadata: RemoteLogSegmentMetadata, following: RemoteLogSegmentMetadata) -> None:
        """Optional: `following` is the segment after `metadata` in its partition (the caller's RLMM knows it:
        remote_log_segment_metadata(tp, epoch, metadata.end_offset + 1)). A sequential reader that nears the end
        of `metadata` then finds the first chunks of `following` prefetched into the chunk cache."""
        _require_metadata(metadata)
        _require_metadata(following)
        with self._hints_lock:
            self._next_hints[metadata.remote_log_segment_id.id] = following
            self._next_hints.move_to_end(metadata.remote_log_segment_id.id)
            while len(self._next_hints) > NEXT_SEGMENT_HINTS:
                self._next_hints.popitem(last=False)

    def prefetch_idle(self, timeout_s: float) -> bool:
        """Wait until no chunk prefetch is queued or running (tests, benchmarks); False if `timeout_s` passed."""
        return self._reader.prefetch_idle(timeout_s)

    def _next_chunked_segment(self, segment: ChunkedSegment) -> ChunkedSegment | None:
        with self._hints_lock:
            following = self._next_hints.get(segment.segment_id.id)
        return None if following is None or self._closed.is_set() else self._chunked_segment(following)

    # -- data keys of encrypted segments (tierlog rewrap, tierlog verify bucket) -------------------

    def data_key_id(self, indexes_key: str) -> str | None:
        """The ring id the data key of the segment whose packed index object is `indexes_key` (a key as
        `backend.list` returns it) is wrapped under; None for a segment that is not encrypted."""
        self._check_open()
        found = self._wrapped_key_slot(indexes_key)
        return None if found is None else WrappedKey.decode(found[1], indexes_key).key_id

    def rewrap_data_key(self, indexes_key: str) -> RewrapOutcome:
        """Wrap the segment's data key under the active ring entry, rewriting only its slot in the packed index
        object (the segment's bytes, chunk index and custom metadata stay as they are). Idempotent."""
        self._check_open()
        if self._keyring is None or self._keyring.active is None:
            raise ConfigError(f"{_OWNER}: rewrap needs encryption.key.pairs and encryption.key.pair.id (the key to "
                              "wrap under)")
        parsed = parse_object_key(indexes_key)
        if parsed is None or parsed.suffix != INDEXES_SUFFIX:
            raise InvalidArgumentError(f"{indexes_key!r} is not the key of a segment's packed index object")
        found = self._wrapped_key_slot(indexes_key)
        if found is None:
            return RewrapOutcome.UNENCRYPTED
        section, slot = found
        wrapped = WrappedKey.decode(slot, indexes_key)
        if wrapped.key_id == self._keyring.active:
            return RewrapOutcome.CURRENT
        data_key = self._keyring.unwrap(wrapped, parsed.segment_id)
        new_slot = self._keyring.wrap(data_key, parsed.segment_id).encode()
        packed = bytearray(read_all(self._backend.get_range(indexes_key, 0)))
        if bytes(packed[section.position : section.end]) != slot:
            raise RemoteStorageError(f"{self._backend.describe(indexes_key)} changed while it was rewrapped; "
                                     "run rewrap again")
        packed[section.position : section.end] = new_slot
        self._backend.put(indexes_key, bytes(packed))
        log_key = indexes_key.removesuffix(INDEXES_SUFFIX) + LOG_SUFFIX
        if not any(o.key == log_key for o in self._backend.list(log_key)):
            # Deleted (retention) while we rewrapped: take back the object our put re-created.
            self._backend.delete([indexes_key])
            return RewrapOutcome.GONE
        return RewrapOutcome.REWRAPPED

    def _wrapped_key_slot(self, indexes_key: str) -> tuple[Section, bytes] | None:
        where = self._backend.describe(indexes_key)
        layout = parse_header(read_all(self._backend.get_range(indexes_key, 0, MAX_HEADER_SIZE - 1)), where)
        section = layout.get(SegmentSection.WRAPPED_KEY)
        if section is None:
            return None
        return section, read_all(self._backend.get_range(indexes_key, section.position, section.end - 1))

    # -- lifecycle and metrics ------------------------------------------------------------------

    @property
    def backend(self) -> StorageBackend:
        return self._backend

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def check_storage(self) -> None:
        """One cheap request to the store with this config; raises RemoteStorageError saying what is wrong (bad
        credentials, a missing bucket, an unreachable endpoint). The agent runs it at start (tierlog.agent)."""
        self._check_open()
        self._backend.check()

    def metrics(self) -> dict[str, Any]:
        """Plain-dict counters: per operation requests, errors, bytes and latency; cache statistics."""
        snapshot = self._metrics.snapshot()
        snapshot["index_cache"] = {"bytes": self._cache.size_bytes}
        if self._chunk_cache is not None:
            snapshot["chunk_cache"] = {"bytes": self._chunk_cache.size_bytes, "chunks": self._chunk_cache.entries}
        return snapshot

    def close(self) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        self._reader.close()
        self._cache.clear()
        with self._decoded_lock:
            self._decoded.clear()  # data keys of the segments read
        self._backend.close()


def _chunk_cache(core: Mapping[str, Any], metrics: Metrics) -> ChunkCache | None:
    kind, size = core["fetch.chunk.cache.class"], core["fetch.chunk.cache.size"]
    if kind == "disk":
        return DiskChunkCache(Path(core["fetch.chunk.cache.path"]), size, metrics)
    if kind == "memory":
        return MemoryChunkCache(size, metrics)
    return None


__all__ = ["CORE_CONFIG_KEYS", "IndexAbsentError", "RemoteStorageManager", "RewrapOutcome", "parse_rsm_config"]
