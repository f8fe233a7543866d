"""The hosted partitions' in-memory state, kept across a clean restart: what a node served when it closed, written
beside its view so that the restarted node serves those partitions from memory as soon as they are ready, instead
of answering their first lookups from disk while its loader reads them again (rlmm.manager._PartitionLoader, some
20 µs per hosted segment in the background: 15 s for a node hosting 1M segments).

A manager writes the file when it closes cleanly, once its applier has stopped: each partition its read model
serves (`ReadModel.snapshots`, held in `partitions`), as the model holds it and its lookup snapshot, each partition
in its own marshal blob (which keeps one object for a packed segment its table, floors and listings share) with a
CRC-32. It is valid only for the view exactly as it was then: the file names the view's RocksDB identity, its
latest sequence number and the offsets it applied, and a restarted manager takes it only if its view shows the same
before anything is written to it. Taking it removes it from disk at once (the data stays mapped until used), so it
never outlives the view state it describes. From then on the read model gives a partition its resumed state when
the node hosts it again (`ReadModel.host`), unless a batch touched the partition first (it is then read from
RocksDB as before); a blob whose CRC-32 or shape is wrong is dropped the same way, with a log line.

Nothing here is a source of truth: without the file (a crash, a first start, an older release) a node reads every
partition from RocksDB as it always did.
"""

from __future__ import annotations

import logging
import marshal
import mmap
import os
import struct
import sys
import threading
import uuid
import zlib
from array import array
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from rlmm import view_format as vf
from rlmm.events import EpochLineage
from rlmm.read_model import (
    EpochFloors,
    EpochIndex,
    Listing,
    PartitionModel,
    PartitionSnapshot,
    SegmentTable,
)
from rlmm.types import RemoteLogSegmentMetadata, TopicIdPartition

log = logging.getLogger(__name__)

FILE_NAME = "tierlog-hosted-state"
_MAGIC = b"tierlog hosted state\n"
_FILE_VERSION = 1
_LENGTH = struct.Struct(">Q")
_MARSHAL_VERSION = 4
# marshal's format may change between Python versions: a file is taken only by the version that wrote it.
_INTERPRETER = tuple(sys.version_info[:2])

Resumed = tuple[PartitionModel | None, PartitionSnapshot]


# What identifies a view's state exactly (MetadataView.state_mark): its RocksDB identity, latest sequence number and
# the offsets it applied.
Mark = tuple[str, int, dict[int, int]]


def write(path: Path, mark: Mark, partitions: Iterable[tuple[bytes, PartitionModel | None, PartitionSnapshot]]
          ) -> int:
    """Write the served partitions' state for a view at `mark` to `path` (through a temporary file, synced, then
    renamed: a crash leaves no partial file under that name). Returns the number of partitions written.

    The file is the magic line, each partition's blob, then the header (versions, mark, and where each blob lies)
    and the header's length: written as made, so that a node serving 1M segments does not hold the file's 170 MB
    twice while it closes."""
    directory: dict[bytes, tuple[int, int, int]] = {}
    temporary = _temporary(path)
    with temporary.open("wb") as out:
        out.write(_MAGIC)
        at = len(_MAGIC)
        for tp_key, partition, snapshot in partitions:
            blob = marshal.dumps(_flat(partition, snapshot), _MARSHAL_VERSION)
            directory[tp_key] = (at, len(blob), zlib.crc32(blob))
            out.write(blob)
            at += len(blob)
        header = marshal.dumps((_FILE_VERSION, vf.FORMAT_VERSION, _INTERPRETER, mark, directory), _MARSHAL_VERSION)
        out.write(header + _LENGTH.pack(len(header)))
        out.flush()
        os.fsync(out.fileno())
    os.replace(temporary, path)
    return len(directory)


class ResumedState:
    """A hosted-state file taken by a restarted node: each partition's state, decoded when first taken."""

    def __init__(self, data: mmap.mmap | bytes, directory: dict[bytes, tuple[int, int, int]], name: str) -> None:
        self._data: mmap.mmap | bytes | None = data
        self._directory = directory
        self._name = name
        self._invalid = 0  # partitions whose state was found not valid

    def __len__(self) -> int:
        return len(self._directory)

    def __contains__(self, tp_key: object) -> bool:
        return tp_key in self._directory

    def take(self, tp_key: bytes) -> Resumed | None:
        """The partition's state as the node served it when it closed, or None (not in the file, or not valid)."""
        entry = self._directory.pop(tp_key, None)
        if entry is None or self._data is None:
            return None
        offset, length, crc = entry
        blob = memoryview(self._data)[offset:offset + length]
        try:
            if zlib.crc32(blob) != crc:
                raise ValueError("its CRC-32 does not match")
            return _unflat(marshal.loads(blob), tp_key)
        except (ValueError, TypeError, EOFError, KeyError, IndexError, struct.error) as exc:
            self._invalid += 1
            log.log(logging.WARNING if self._invalid == 1 else logging.DEBUG,
                    "%s: the state of user partition %s is not valid (%s); it is read from the view instead (so is "
                    "any other found not valid)", self._name, vf.tp_of_key(tp_key), exc)
            return None
        finally:
            blob.release()
            if not self._directory:
                self.close()
            else:
                self._release(offset, length)

    def _release(self, offset: int, length: int) -> None:
        """Let the pages of a partition's state taken go from this process's memory (read, they stayed mapped until the
        file was let go: at 1M hosted segments 75 MiB more RSS at ready, the rest taken in the background); read
        again, they come back from the page cache."""
        data = self._data
        if isinstance(data, mmap.mmap) and _MADV_DONTNEED is not None:
            start = -(-offset // mmap.PAGESIZE) * mmap.PAGESIZE  # the whole pages within the state's bytes
            end = (offset + length) // mmap.PAGESIZE * mmap.PAGESIZE
            if end > start:
                data.madvise(_MADV_DONTNEED, start, end - start)

    def discard(self, tp_key: bytes) -> None:
        """The view changed this partition since the file was written: its state there is stale."""
        if self._directory.pop(tp_key, None) is not None and not self._directory:
            self.close()

    def close(self) -> None:
        """Let go of every partition not taken yet, and of the mapping, which frees the file's disk space: on a thread
        of its own, as the file was unlinked when taken and the kernel then drops its pages and frees its blocks
        (40-50 ms for the 170 MB of 1M hosted segments, which a restart's registration waited for)."""
        self._directory.clear()
        data, self._data = self._data, None
        if isinstance(data, mmap.mmap):
            threading.Thread(target=_close, args=(data,), name="tierlog-rlmm-resume-close", daemon=True).start()


_MADV_DONTNEED: int | None = getattr(mmap, "MADV_DONTNEED", None)  # Linux and most Unixes


def take(path: Path, mark: Mark) -> ResumedState | None:
    """The hosted-state file at `path` if it was written for the view exactly as `mark` describes it, else None; the
    file is removed either way (what it holds is mapped until used or let go), as is one a crash left half-written."""
    _temporary(path).unlink(missing_ok=True)
    try:
        handle = path.open("rb")
    except FileNotFoundError:
        return None
    with handle:
        try:
            data: mmap.mmap | bytes = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError:  # an empty file cannot be mapped
            data = b""
    path.unlink()
    try:
        if data[:len(_MAGIC)] != _MAGIC or len(data) < len(_MAGIC) + _LENGTH.size:
            raise ValueError("it does not start as a hosted-state file, or ends before its header")
        (length,) = _LENGTH.unpack_from(data, len(data) - _LENGTH.size)
        if length > len(data) - len(_MAGIC) - _LENGTH.size:
            raise ValueError(f"its header would take {length} bytes, more than the file holds")
        file_version, view_format, interpreter, written_mark, directory = marshal.loads(
            data[len(data) - _LENGTH.size - length:len(data) - _LENGTH.size])
        if (file_version, view_format, tuple(interpreter)) != (_FILE_VERSION, vf.FORMAT_VERSION, _INTERPRETER):
            raise ValueError(f"it is of file version {file_version}, view format {view_format} and Python "
                             f"{interpreter}; this tierlog writes {_FILE_VERSION} and {vf.FORMAT_VERSION} on Python "
                             f"{_INTERPRETER}")
        if tuple(written_mark) != tuple(mark):
            log.info("%s was written for the view as it was before (identity %s, sequence number %s; now %s, %s): "
                     "its partitions are read from the view", path, *tuple(written_mark)[:2], *mark[:2])
            _close(data)
            return None
        if not isinstance(directory, dict):
            raise ValueError("its directory is not a mapping")
    except (ValueError, TypeError, EOFError, struct.error) as exc:
        log.warning("%s is not a valid hosted-state file (%s); its partitions are read from the view", path, exc)
        _close(data)
        return None
    return ResumedState(data, directory, str(path))


def remove(path: Path) -> None:
    """Remove the file at `path` and any half-written one."""
    path.unlink(missing_ok=True)
    _temporary(path).unlink(missing_ok=True)


def _temporary(path: Path) -> Path:
    return path.with_name(path.name + ".tmp")


def _close(data: mmap.mmap | bytes) -> None:
    if isinstance(data, mmap.mmap):
        try:
            data.close()
        except BufferError as exc:  # a view of it still held: the mapping goes when that does
            log.debug("the hosted-state file's mapping stays until its last view goes: %s", exc)


# --- a partition's state as marshal's types, and back --------------------------------------------------------------

def _flat(partition: PartitionModel | None, snapshot: PartitionSnapshot) -> tuple[Any, ...]:
    """The state as marshal writes it: bytes, ints, strings and containers of them. A decoded answer is written as its
    packed segment (the table's object for it: one object for both); the read model decodes the answers of a resumed
    partition again if it grants it that (ReadModel.host)."""
    listings = {epoch: (listing.segments, listing.size) for epoch, listing in snapshot.listings.items()}
    everything = (snapshot.everything.segments, snapshot.everything.size)
    if partition is None:
        return (snapshot.deleted, None, listings, everything)
    table = partition.table()
    stored = table.stored
    floors = {}
    for epoch, epoch_floors in snapshot.floors.items():
        answers = tuple(stored[answer.remote_log_segment_id.id.int]
                        if isinstance(answer, RemoteLogSegmentMetadata) else answer
                        for answer in epoch_floors.segments)
        floors[epoch] = (epoch_floors.bounds.tobytes(), answers)
    tp = partition.tp
    return (
        snapshot.deleted, (tp.topic_id.bytes, tp.topic, tp.partition, table.tp.topic,
                           None if snapshot.tp is None else snapshot.tp.topic),
        listings, everything,
        None if partition.meta is None else vf.encode_partition_meta(partition.meta),
        None if partition.delete is None else vf.encode_partition_delete(partition.delete),
        [(lineage.epoch, lineage.highest_log_offset, _id_bytes(lineage.displaced_segment_ids),
          _id_bytes(lineage.overwritten_segment_ids)) for lineage in partition.lineages.values()],
        stored,
        {epoch: (index.starts.tobytes(), index.segments) for epoch, index in partition.index.items()},
        floors,
    )


def _unflat(flat: tuple[Any, ...], tp_key: bytes) -> Resumed:
    deleted, names, raw_listings, raw_everything = flat[:4]
    listings = {epoch: Listing(segments, size) for epoch, (segments, size) in raw_listings.items()}
    everything = Listing(*raw_everything) if raw_everything[0] else PartitionSnapshot().everything
    if names is None:
        return None, PartitionSnapshot(bool(deleted), {}, listings, everything)
    raw_meta, raw_delete, raw_lineages, stored, raw_index, raw_floors = flat[4:]
    topic_id, topic, number, table_topic, snapshot_topic = names
    tp = TopicIdPartition(uuid.UUID(bytes=topic_id), topic, number)
    if vf.tp_key_of(tp) != tp_key:
        raise ValueError("it names another partition")
    table = SegmentTable(tp if table_topic == topic else TopicIdPartition(tp.topic_id, table_topic, number))
    if not isinstance(stored, dict):
        raise TypeError("its segments are not a mapping")
    table.stored = stored
    partition = PartitionModel(
        tp, None if raw_meta is None else vf.decode_partition_meta(raw_meta), table,
        None if raw_delete is None else vf.decode_partition_delete(raw_delete),
        # Derived: checked when first made, and the blob's CRC-32 held (a node has one per leader epoch of each of
        # its partitions, which the checks would make a fifth of a resume's time).
        {epoch: EpochLineage.derived(epoch, highest, _ids(displaced), _ids(overwritten))
         for epoch, highest, displaced, overwritten in raw_lineages},
        {epoch: _index(starts, segments) for epoch, (starts, segments) in raw_index.items()})
    for epoch, index in partition.index.items():
        if type(index.segments) is not list or len(index.starts) != len(index.segments):
            raise ValueError(f"the offset index of epoch {epoch} has {len(index.starts)} starts for "
                             f"{len(index.segments)} segments")
    floors = {}
    for epoch, (bounds, answers) in raw_floors.items():
        floors[epoch] = EpochFloors(_int64s(bounds), answers)
        if type(answers) is not tuple or len(floors[epoch].bounds) != 2 * len(answers):
            raise ValueError(f"the floors of epoch {epoch} have {len(floors[epoch].bounds)} bounds for "
                             f"{len(answers)} answers")
    snapshot_tp = None if snapshot_topic is None else \
        table.tp if snapshot_topic == table.tp.topic else TopicIdPartition(tp.topic_id, snapshot_topic, number)
    return partition, PartitionSnapshot(bool(deleted), floors, listings, everything, dict(partition.lineages),
                                        snapshot_tp)


def _id_bytes(ids: frozenset[uuid.UUID]) -> bytes:
    return b"".join(segment_id.bytes for segment_id in ids)


_NO_IDS: frozenset[uuid.UUID] = frozenset()


def _ids(raw: bytes) -> frozenset[uuid.UUID]:
    if not raw:
        return _NO_IDS
    if len(raw) % 16:
        raise ValueError(f"its lineage ids take {len(raw)} bytes, not a multiple of 16")
    return frozenset(uuid.UUID(bytes=raw[at:at + 16]) for at in range(0, len(raw), 16))


def _index(starts: bytes, segments: list[int]) -> EpochIndex:
    index = EpochIndex()
    index.starts, index.segments = _int64s(starts), segments  # as loaded: the segments' ints are the table's keys
    return index


def _int64s(raw: bytes) -> array[int]:
    values = array("q")
    values.frombytes(raw)
    return values
