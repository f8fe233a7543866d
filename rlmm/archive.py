"""The audit archive's and the bootstrap snapshot's formats: one decoded metadata-topic record with its
position (`archived_event_schema`), the archive's object keys and files, and the snapshot file.

Archive files live under `audit/<metadata topic>/<partition>/<first offset:020d>-<last offset:020d>.avro`.
A snapshot is one container file whose file metadata names the topic and the end offsets it reflects and, since
the header gained them, the topic's id (the incarnation the offsets belong to) and when the snapshot was taken:
what a loader needs to trust the view and tail the topic from those offsets (older files lack both). Format 1
holds the same records as the archive (newest per key, no tombstones, in (metadata partition, offset) order),
which a loader replays. Format 2 holds the materialized view itself: every entry (column family, key, value) as
`rlmm.view` stores them in the view format it names, grouped in chunks of one family, with the view's digest,
so a loader writes them as they are.
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import fastavro
from fastavro.schema import to_parsing_canonical_form

from rlmm import view_format
from rlmm.codec import decode_datum, from_datum, read_plain, reader_program, registry
from rlmm.errors import SnapshotError
from rlmm.events import MetadataEvent

ARCHIVE_ROOT = "audit"
ARCHIVE_FORMAT_VERSION = "1"
META_TOPIC = "tierlog.metadata.topic"
META_PARTITION = "tierlog.metadata.partition"
META_FORMAT = "tierlog.archive.format"
END_OFFSETS_META = "tierlog.snapshot.end_offsets"
SNAPSHOT_FORMAT_META = "tierlog.snapshot.format"  # absent in format 1 files, which predate it
VIEW_FORMAT_META = "tierlog.snapshot.view_format"
VIEW_DIGEST_META = "tierlog.snapshot.view_digest"
TOPIC_ID_META = "tierlog.snapshot.topic_id"  # absent in files written before it: such a file names no incarnation
CREATED_META = "tierlog.snapshot.created_ms"
RECORDS_FORMAT = 1
VIEW_FORMAT = 2
TABLES_FORMAT = 3
# Entries per chunk: a chunk is one Avro datum, so this bounds what a reader holds at once.
_CHUNK_ENTRIES = 20_000
_FILE_NAME = re.compile(r"^(?P<first>\d{20})-(?P<last>\d{20})\.avro$")


@dataclass(frozen=True, slots=True)
class ArchiveFile:
    """One archive file, as its key names it."""

    key: str
    metadata_topic: str
    metadata_partition: int
    first_offset: int
    last_offset: int
    size: int = 0


def partition_prefix(metadata_topic: str, metadata_partition: int) -> str:
    return f"{ARCHIVE_ROOT}/{metadata_topic}/{metadata_partition}/"


def archive_key(metadata_topic: str, metadata_partition: int, first_offset: int, last_offset: int) -> str:
    name = f"{first_offset:020d}-{last_offset:020d}.avro"
    return partition_prefix(metadata_topic, metadata_partition) + name


def parse_archive_key(key: str, size: int = 0) -> ArchiveFile | None:
    """The file a key names, or None for anything else under audit/ (temporary files, strangers)."""
    parts = key.split("/")
    if len(parts) < 4 or parts[-4] != ARCHIVE_ROOT or not parts[-2].isdigit():
        return None
    match = _FILE_NAME.match(parts[-1])
    if match is None:
        return None
    return ArchiveFile(key, parts[-3], int(parts[-2]), int(match["first"]), int(match["last"]), size)


def next_offset_to_archive(files: Iterable[ArchiveFile]) -> int | None:
    """Where archiving resumes: one past the last archived offset, or None when nothing is archived."""
    last = max((f.last_offset for f in files), default=None)
    return None if last is None else last + 1


def encode_archive_file(metadata_topic: str, metadata_partition: int, datums: list[dict[str, Any]]) -> bytes:
    """One Avro object container file holding `datums` (archive records of one metadata partition)."""
    buffer = io.BytesIO()
    fastavro.writer(
        buffer,
        _parsed_archive_schema(),
        datums,
        codec="deflate",
        metadata={
            META_TOPIC: metadata_topic,
            META_PARTITION: str(metadata_partition),
            META_FORMAT: ARCHIVE_FORMAT_VERSION,
        },
    )
    return buffer.getvalue()


def read_archive_file(data: bytes) -> Iterator[dict[str, Any]]:
    yield from fastavro.reader(io.BytesIO(data))  # type: ignore[misc]


_SCHEMA_CACHE: list[Any] = []


def _parsed_archive_schema() -> Any:
    if not _SCHEMA_CACHE:
        _SCHEMA_CACHE.append(fastavro.parse_schema(archived_event_schema()))
    return _SCHEMA_CACHE[0]


def archived_event_schema() -> dict[str, Any]:
    """Schema of one archived metadata record; Spark reads its nullable event structs as columns."""
    reg = registry()
    return {
        "type": "record",
        "name": "ArchivedEvent",
        "namespace": "io.tierlog.audit",
        "doc": "One record of the metadata topic, decoded, with its topic position; all events null = tombstone.",
        "fields": [
            {"name": "metadata_topic", "type": "string"},
            {"name": "metadata_partition", "type": "int"},
            {"name": "offset", "type": "long"},
            {"name": "timestamp_ms", "type": "long"},
            {"name": "key", "type": "string"},
            {"name": "segment", "type": ["null", reg.current["segment_record"].schema], "default": None},
            {"name": "partition_delete", "type": ["null", reg.current["partition_delete_record"].schema],
             "default": None},
            {"name": "epoch_checkpoint", "type": ["null", reg.current["epoch_checkpoint_record"].schema],
             "default": None},
        ],
    }


_ARCHIVE_FIELD = {
    "segment_record": "segment",
    "partition_delete_record": "partition_delete",
    "epoch_checkpoint_record": "epoch_checkpoint",
}


def to_archived(
    metadata_topic: str, metadata_partition: int, offset: int, timestamp_ms: int, key: bytes, value: bytes | None
) -> dict[str, Any]:
    """An archive datum for one raw topic record (value None is a tombstone)."""
    datum: dict[str, Any] = {
        "metadata_topic": metadata_topic,
        "metadata_partition": metadata_partition,
        "offset": offset,
        "timestamp_ms": timestamp_ms,
        "key": key.decode(),
        "segment": None,
        "partition_delete": None,
        "epoch_checkpoint": None,
    }
    if value is not None:
        name, event_datum = decode_datum(value)
        datum[_ARCHIVE_FIELD[name]] = event_datum
    return datum


def from_archived(datum: dict[str, Any]) -> MetadataEvent | None:
    """The event an archive datum holds, or None for a tombstone."""
    for name, field in _ARCHIVE_FIELD.items():
        if datum.get(field) is not None:
            return from_datum(name, datum[field])
    return None


@dataclass(frozen=True, slots=True)
class SnapshotHeader:
    """What a snapshot's file metadata says: the topic, the offsets it reflects, its format and, for the view
    format, the view format version of its entries and the view digest they make; the topic's id and the time the
    snapshot was taken, None in files written before the header named them."""

    metadata_topic: str
    end_offsets: Mapping[int, int]
    format: int = RECORDS_FORMAT
    view_format: int | None = None
    view_digest: str | None = None
    topic_id: str | None = None
    created_ms: int | None = None


def _source_meta(topic_id: str | None, created_ms: int | None) -> dict[str, str]:
    if (topic_id is None) != (created_ms is None):
        raise ValueError("a snapshot names both its topic id and its creation time, or neither")
    return {} if topic_id is None else {TOPIC_ID_META: topic_id, CREATED_META: str(created_ms)}


def write_snapshot(
    out: BinaryIO, metadata_topic: str, records: Iterable[dict[str, Any]], end_offsets: dict[int, int],
    topic_id: str | None = None, created_ms: int | None = None,
) -> None:
    """Write archive datums (already compacted and ordered) as a snapshot file of format 1."""
    fastavro.writer(
        out, _parsed_archive_schema(), records, codec="deflate",
        metadata={
            META_TOPIC: metadata_topic,
            END_OFFSETS_META: _encode_ends(end_offsets),
            **_source_meta(topic_id, created_ms),
        },
    )


def view_chunk_schema() -> dict[str, Any]:
    """Schema of one chunk of a format 2 snapshot: entries of one column family, keys and values in step."""
    return {
        "type": "record",
        "name": "ViewChunk",
        "namespace": "io.tierlog.snapshot",
        "doc": "Entries of one column family of the materialized view, as rlmm.view stores them.",
        "fields": [
            {"name": "family", "type": "string"},
            {"name": "keys", "type": {"type": "array", "items": "bytes"}},
            {"name": "values", "type": {"type": "array", "items": "bytes"}},
        ],
    }


def view_table_schema() -> dict[str, Any]:
    """Schema of one part of a format 3 snapshot: a stretch of the bytes of one column family's RocksDB table."""
    return {
        "type": "record",
        "name": "ViewTablePart",
        "namespace": "io.tierlog.snapshot",
        "doc": "Consecutive bytes of the RocksDB table file holding one column family of the materialized view.",
        "fields": [
            {"name": "family", "type": "string"},
            {"name": "part", "type": "bytes"},
        ],
    }


# Bytes per part of a table: a part is one Avro datum, so this bounds what a reader holds at once beside the file.
_TABLE_PART_BYTES = 8 << 20


def write_table_snapshot(
    out: BinaryIO, metadata_topic: str, tables: Iterable[tuple[str, Path]], end_offsets: Mapping[int, int],
    view_digest: str, topic_id: str | None = None, created_ms: int | None = None,
) -> None:
    """Write RocksDB table files of a view (one per column family, in the view's options; rlmm.view.write_tables)
    and the digest of their content as a snapshot file of format 3. Their blocks are compressed already."""
    fastavro.writer(
        out, fastavro.parse_schema(view_table_schema()), _table_parts(tables), codec="null",
        metadata=_view_meta(TABLES_FORMAT, metadata_topic, end_offsets, view_digest, topic_id, created_ms),
    )


def _table_parts(tables: Iterable[tuple[str, Path]]) -> Iterator[dict[str, Any]]:
    for family, path in tables:
        with path.open("rb") as table:
            while part := table.read(_TABLE_PART_BYTES):
                yield {"family": family, "part": part}


def _view_meta(snapshot_format: int, metadata_topic: str, end_offsets: Mapping[int, int], view_digest: str,
               topic_id: str | None, created_ms: int | None) -> dict[str, str]:
    return {
        META_TOPIC: metadata_topic,
        END_OFFSETS_META: _encode_ends(end_offsets),
        SNAPSHOT_FORMAT_META: str(snapshot_format),
        VIEW_FORMAT_META: str(view_format.FORMAT_VERSION),
        VIEW_DIGEST_META: view_digest,
        **_source_meta(topic_id, created_ms),
    }


# A format 2 snapshot's chunks read in C where rlmm._avro_reader was built (None: fastavro reads them): a new node's
# bootstrap reads every entry of the view, and fastavro took about 60% of loading one.
_CHUNK_PROGRAM = reader_program(view_chunk_schema())
_CHUNK_FORM = to_parsing_canonical_form(view_chunk_schema())


def write_chunked_view_snapshot(
    out: BinaryIO, metadata_topic: str, entries: Iterable[tuple[str, bytes, bytes]], end_offsets: Mapping[int, int],
    view_digest: str, topic_id: str | None = None, created_ms: int | None = None,
) -> None:
    """Write a view's entries (in the current view format) and its digest as a snapshot file of format 2, entry by
    entry, as releases before format 3 wrote them (rlmm.snapshot.write_view_snapshot writes format 3)."""
    fastavro.writer(
        # zstd: as small as deflate, and decompressed in half the time. Files of either codec are read.
        out, fastavro.parse_schema(view_chunk_schema()),
        ({"family": family, "keys": keys, "values": values} for family, keys, values in entry_runs(entries)),
        codec="zstandard",
        metadata=_view_meta(VIEW_FORMAT, metadata_topic, end_offsets, view_digest, topic_id, created_ms),
    )


def entry_runs(entries: Iterable[tuple[str, bytes, bytes]]) -> Iterator[tuple[str, list[bytes], list[bytes]]]:
    """(column family, keys, values) runs of consecutive entries of one family, of at most 20,000 entries each."""
    family: str | None = None
    keys: list[bytes] = []
    values: list[bytes] = []
    for entry_family, key, value in entries:
        if entry_family != family or len(keys) >= _CHUNK_ENTRIES:
            if keys:
                assert family is not None
                yield family, keys, values
            family, keys, values = entry_family, [], []
        keys.append(key)
        values.append(value)
    if keys:
        assert family is not None
        yield family, keys, values


def view_runs(chunks: Iterable[dict[str, Any]]) -> Iterator[tuple[str, list[bytes], list[bytes]]]:
    """The (column family, keys, values) runs of entries a format 2 snapshot's chunks hold, in their order."""
    for chunk in chunks:
        family, keys, values = chunk["family"], chunk["keys"], chunk["values"]
        if len(keys) != len(values):
            raise SnapshotError(f"a chunk of column family {family} has {len(keys)} keys but {len(values)} values")
        yield family, keys, values


def view_entries(chunks: Iterable[dict[str, Any]]) -> Iterator[tuple[str, bytes, bytes]]:
    """The (column family, key, value) entries of a format 2 snapshot's chunks."""
    for family, keys, values in view_runs(chunks):
        for key, value in zip(keys, values, strict=True):
            yield family, key, value


def _encode_ends(end_offsets: Mapping[int, int]) -> str:
    return json.dumps({str(k): v for k, v in end_offsets.items()})


def _header_of(meta: Mapping[str, str]) -> SnapshotHeader:
    """The header a snapshot file's metadata states; KeyError or ValueError when it states none."""
    ends = {int(k): int(v) for k, v in json.loads(meta[END_OFFSETS_META]).items()}
    version = int(meta.get(SNAPSHOT_FORMAT_META, RECORDS_FORMAT))
    topic_id = meta.get(TOPIC_ID_META)
    created = None if topic_id is None else int(meta[CREATED_META])
    if version in (VIEW_FORMAT, TABLES_FORMAT):
        return SnapshotHeader(meta[META_TOPIC], ends, version, int(meta[VIEW_FORMAT_META]), meta[VIEW_DIGEST_META],
                              topic_id, created)
    if version == RECORDS_FORMAT:
        return SnapshotHeader(meta[META_TOPIC], ends, topic_id=topic_id, created_ms=created)
    raise ValueError(f"snapshot format {version}, this tierlog reads {RECORDS_FORMAT} to {TABLES_FORMAT}")


def _not_a_snapshot(name: str, why: Exception) -> SnapshotError:
    return SnapshotError(f"{name} is not a tierlog snapshot ({why}); build one with `tierlog snapshot`")


def _corrupt(name: str, why: Exception) -> SnapshotError:
    return SnapshotError(f"{name} is corrupt: its bytes do not decode ({type(why).__name__}: {why})")


def read_snapshot(source: Path | BinaryIO, name: str | None = None) -> tuple[SnapshotHeader, Iterator[dict[str, Any]]]:
    """A snapshot's header and its datums: archive records (format 1), view chunks (format 2) or parts of the view's
    tables (format 3), read lazily, from a file or a stream (one that cannot seek, such as an object as it is
    downloaded, is read datum by datum by fastavro). `name` names the snapshot in errors (default: its path, or
    "the snapshot")."""
    handle: BinaryIO = source.open("rb") if isinstance(source, Path) else source
    name = name or (str(source) if isinstance(source, Path) else "the snapshot")
    seekable = handle.seekable()
    try:
        # fastavro's block reader seeks; its datum reader does not.
        reader: Any = fastavro.block_reader(handle) if seekable else fastavro.reader(handle)
        header = _header_of(reader.metadata)
    except SnapshotError:
        handle.close()
        raise
    except Exception as exc:  # fastavro raises what its parsers meet (a bad schema, a short or garbled header)
        handle.close()
        raise _not_a_snapshot(name, exc) from exc

    # The C reader reads only what its program's schema wrote (this tierlog's chunks), a block of one datum at a time.
    chunks_in_c = _CHUNK_PROGRAM is not None and header.format == VIEW_FORMAT and seekable and \
        to_parsing_canonical_form(reader.writer_schema) == _CHUNK_FORM

    def datums() -> Iterator[dict[str, Any]]:
        # What fastavro meets in garbled bytes (a bad codec name or compressed block, a union branch or a length out
        # of range, an id or text that does not decode) is a SnapshotError naming the snapshot; a failed read of the
        # file (OSError) is raised as it is.
        try:
            yield from decoded()
        except (OSError, SnapshotError):
            raise
        except Exception as exc:
            raise _corrupt(name, exc) from exc

    def decoded() -> Iterator[dict[str, Any]]:
        with handle:
            if not seekable:
                yield from reader
                return
            for block in reader:
                # A block's decompressed bytes: fastavro's Block keeps them as `bytes_` (not documented, so looked
                # for; without them fastavro reads the block).
                data = getattr(block, "bytes_", None) if chunks_in_c and block.num_records == 1 else None
                if isinstance(data, io.BytesIO):
                    try:
                        yield read_plain(_CHUNK_PROGRAM, data.getvalue())
                        continue
                    except ValueError:
                        pass  # bytes it does not read exactly: fastavro decodes them or says what is wrong
                for datum in block:
                    assert isinstance(datum, dict)
                    yield datum

    return header, datums()


# --- a snapshot read as its bytes arrive ------------------------------------------------------------------------

_TABLE_FORM = to_parsing_canonical_form(view_table_schema())
_MAGIC = b"Obj\x01"
_SYNC_BYTES = 16


def stream_snapshot(read_chunk: Callable[[], bytes | memoryview], name: str
                    ) -> tuple[SnapshotHeader, Iterator[dict[str, Any]]]:
    """`read_snapshot` of bytes that arrive in chunks (`read_chunk` gives the next, empty at the end; a download).

    A format 3 snapshot's table parts come as slices of the chunks their bytes arrived in: each datum is
    {"family", "part"} with `part` a stretch of one part (consecutive stretches of one family make its table), so a
    table's bytes are not copied on their way to its file. The Avro container around them is read here (Avro's object
    container format: a header, then blocks of a datum count, a byte size, the datums and the file's sync marker),
    and anything it does not frame exactly is a SnapshotError. Any other snapshot (another format, a compressed one)
    is read by fastavro, from the same bytes."""
    cursor = _ChunkCursor(read_chunk, name)
    try:
        meta, sync = cursor.container_header()
        header = _header_of({key: value.decode() for key, value in meta.items() if key.startswith("tierlog.")})
        schema = to_parsing_canonical_form(fastavro.parse_schema(json.loads(meta["avro.schema"])))
    except (KeyError, ValueError, SnapshotError, fastavro.schema.SchemaParseException) as exc:
        raise _not_a_snapshot(name, exc) from exc
    if header.format != TABLES_FORMAT or meta.get("avro.codec", b"null") != b"null" or schema != _TABLE_FORM:
        return read_snapshot(io.BufferedReader(_Replay(cursor.replay(), read_chunk)), name)
    return header, _table_parts_of(cursor, sync)


def _table_parts_of(cursor: _ChunkCursor, sync: bytes) -> Iterator[dict[str, Any]]:
    while not cursor.at_end():
        count, size = cursor.long(), cursor.long()
        if count <= 0 or size < 0:
            raise cursor.corrupt(f"a block of {count} datums in {size} bytes")
        start = cursor.position
        for _ in range(count):
            family = cursor.text()
            for piece in cursor.pieces(cursor.length()):
                yield {"family": family, "part": piece}
        if cursor.position - start != size:
            raise cursor.corrupt(f"a block says it holds {size} bytes, its datums hold {cursor.position - start}")
        if cursor.take(_SYNC_BYTES) != sync:
            raise cursor.corrupt("a block does not end with the file's sync marker")


class _ChunkCursor:
    """Reads Avro's encodings from chunks as they arrive; what the container header took is kept for a replay."""

    def __init__(self, read_chunk: Callable[[], bytes | memoryview], name: str) -> None:
        self._read_chunk = read_chunk
        self._name = name
        self._chunk = memoryview(b"")
        self._taken: bytearray | None = bytearray()  # what the header took, while it is read
        self._header = b""
        self.position = 0

    def corrupt(self, what: str) -> SnapshotError:
        return SnapshotError(f"{self._name} is corrupt at byte {self.position}: {what}")

    def _fill(self) -> bool:
        while not self._chunk:
            chunk = self._read_chunk()
            if not chunk:
                return False
            self._chunk = memoryview(chunk).cast("B")
        return True

    def at_end(self) -> bool:
        return not self._fill()

    def pieces(self, size: int) -> Iterator[memoryview]:
        """The next `size` bytes, as slices of the chunks they arrived in."""
        while size:
            if not self._fill():
                raise self.corrupt(f"it ends {size} bytes short of the datum it is in")
            piece, self._chunk = self._chunk[:size], self._chunk[size:]
            self.position += len(piece)
            size -= len(piece)
            if self._taken is not None:
                self._taken += piece
            yield piece

    def take(self, size: int) -> bytes:
        return b"".join(self.pieces(size))

    def long(self) -> int:
        """A zig-zag varint."""
        value = shift = 0
        for _ in range(10):
            byte = self.take(1)[0]
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return (value >> 1) ^ -(value & 1)
            shift += 7
        raise self.corrupt("a number runs past ten bytes")

    def length(self) -> int:
        size = self.long()
        if size < 0:
            raise self.corrupt(f"a length of {size}")
        return size

    def text(self) -> str:
        try:
            return self.take(self.length()).decode()
        except UnicodeDecodeError as exc:
            raise self.corrupt(f"a string that is not UTF-8 ({exc})") from exc

    def container_header(self) -> tuple[dict[str, bytes], bytes]:
        """The file's metadata and sync marker."""
        if self.take(len(_MAGIC)) != _MAGIC:
            raise ValueError("it does not start as an Avro container file")
        meta: dict[str, bytes] = {}
        while count := self.long():
            if count < 0:  # a block of -count entries, its byte size next
                count = -count
                self.long()
            for _ in range(count):
                key = self.text()
                meta[key] = self.take(self.length())
        sync = self.take(_SYNC_BYTES)
        assert self._taken is not None
        self._header, self._taken = bytes(self._taken), None
        return meta, sync

    def replay(self) -> bytes:
        """What the header took and what is left of the chunk it ended in: the bytes a reader from the start has
        not got from `read_chunk`."""
        rest, self._chunk = bytes(self._chunk), memoryview(b"")
        return self._header + rest


class _Replay(io.RawIOBase):
    """`first`, then the chunks `read_chunk` gives: a stream from the start of the object again."""

    def __init__(self, first: bytes, read_chunk: Callable[[], bytes | memoryview]) -> None:
        super().__init__()
        self._current = memoryview(first)
        self._read_chunk = read_chunk

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._current:
            chunk = self._read_chunk()
            if not chunk:
                return 0
            self._current = memoryview(chunk).cast("B")
        view = memoryview(buffer).cast("B")
        taken = min(len(view), len(self._current))
        view[:taken] = self._current[:taken]
        self._current = self._current[taken:]
        return taken
