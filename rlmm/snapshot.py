"""Bootstrap snapshots: a copy of the materialized view (or, in format 1, of the compacted metadata log) that a
new node loads instead of the topic.

The file format is `rlmm.archive`'s. This module writes a view's entries as a snapshot of format 3: the RocksDB
tables of each column family, which a new node ingests as they are, with no work per entry. The writer checks that
the entries it put into the tables make the view digest the snapshot states; the file's sha256 (in its name, checked
by the reader) then proves a reader has those tables. It materializes a snapshot into an empty view: format 3 by
ingesting its tables, format 2 (entries, as earlier releases wrote) by writing its entries as they are while checking
that the view they make has the digest the snapshot states, format 1 by replaying its records. It also applies archive
records to a view and lists the entries a view snapshot holds.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, BinaryIO

from rlmm import state
from rlmm import view_format as vf
from rlmm.archive import (
    TABLES_FORMAT,
    VIEW_FORMAT,
    SnapshotHeader,
    entry_runs,
    from_archived,
    read_snapshot,
    view_runs,
    write_table_snapshot,
)
from rlmm.errors import SnapshotError
from rlmm.events import RecordKey
from rlmm.view import ConsumedRecord, MetadataView, apply_records, hashed_runs, write_tables

_BATCH = 5000

Progress = Callable[[int], None]


def read_header(path: str | Path) -> SnapshotHeader:
    """A snapshot file's header, without reading its datums."""
    with Path(path).open("rb") as handle:
        header, _datums = read_snapshot(handle, str(path))
    return header


def load_snapshot(
    path: str | Path, state_dir: str | Path, progress: Progress | None = None
) -> tuple[str, dict[int, int]]:
    """Materialize a snapshot into an EMPTY state dir; the topic and end offsets it reflects.

    When the header names the topic id and the time the snapshot was taken, the view records them as its source,
    last (a load cut short records none): a manager started on it resumes from the end offsets if the topic is still
    that incarnation and still holds the records after them (rlmm.manager checks), else rebuilds from the topic.
    `progress` gets the number of the file's datums loaded so far (records in format 1, chunks in format 2)."""
    path = Path(path)
    view_dir = Path(state_dir) / "view"
    if view_dir.exists() and any(view_dir.iterdir()):
        raise SnapshotError(f"state dir {state_dir} already holds a view; load a snapshot only into an empty one")
    header, datums = read_snapshot(path)
    view = MetadataView.open(state_dir)
    try:
        load_into(view, header, datums, progress)
        if header.topic_id is not None and header.created_ms is not None:
            view.set_source(header.metadata_topic, header.topic_id, header.created_ms)
    except BaseException:
        # A load that failed part way (a record that does not read, a full disk, ^C) leaves the state dir as it
        # found it, so that the operator can load another snapshot, or rebuild from the topic, into it at once.
        view.close()
        shutil.rmtree(view_dir, ignore_errors=True)
        raise
    view.close()
    return header.metadata_topic, dict(header.end_offsets)


def load_into(view: MetadataView, header: SnapshotHeader, datums: Iterable[dict[str, Any]],
              progress: Progress | None = None) -> None:
    """Materialize a snapshot read with `rlmm.archive.read_snapshot` into an empty view; SnapshotError when its
    tables do not ingest, when a format 2 snapshot's entries do not make the view digest it states, or when it was
    written for another view format."""
    if header.format not in (VIEW_FORMAT, TABLES_FORMAT):
        apply_archived(view, header.metadata_topic, datums, header.end_offsets, progress)
        return
    if header.view_format not in vf.READABLE_FORMATS:
        raise SnapshotError(f"its entries are in view format {header.view_format}, this tierlog stores "
                            f"{vf.FORMAT_VERSION}")
    if header.format == TABLES_FORMAT:
        # The writer checked that the tables hold entries making the digest the header states
        # (write_view_snapshot), and the file's sha256 that these are its tables.
        parts = ((datum["family"], datum["part"]) for datum in _counted(datums, progress))
        view.load_tables(header.metadata_topic, parts, header.end_offsets)
        return
    # The file's sha256 proves it arrived as written; the view digest, checked as the entries load, that what they
    # make is the view it describes.
    view.load_entries(header.metadata_topic, view_runs(_counted(datums, progress)), header.end_offsets,
                      header.view_digest)


def write_view_snapshot(
    out: BinaryIO, metadata_topic: str, entries: Iterable[tuple[str, bytes, bytes]], end_offsets: Mapping[int, int],
    view_digest: str, topic_id: str | None = None, created_ms: int | None = None,
) -> None:
    """Write a view's entries (content families by name, then bookkeeping: `snapshot_entries`) and its digest as a
    snapshot file of format 3. SnapshotError, having written nothing, when the entries do not make `view_digest`."""
    with tempfile.TemporaryDirectory(prefix="tierlog-snapshot-tables-") as work:
        digest = state.ViewDigest()
        tables = write_tables(hashed_runs(entry_runs(entries), digest), Path(work), Path(work), for_snapshot=True)
        if digest.hexdigest() != view_digest:
            raise SnapshotError(f"the entries make a view with digest {digest.hexdigest()}, not the stated "
                                f"{view_digest}; no snapshot written")
        write_table_snapshot(out, metadata_topic, tables.items(), end_offsets, view_digest, topic_id, created_ms)


def _counted(datums: Iterable[dict[str, Any]], progress: Progress | None) -> Iterator[dict[str, Any]]:
    for count, datum in enumerate(datums, 1):
        yield datum
        if progress:
            progress(count)


def apply_archived(view: MetadataView, metadata_topic: str, datums: Iterable[dict[str, Any]],
                   ends: Mapping[int, int] | None = None, progress: Progress | None = None) -> dict[int, int]:
    """Apply archive datums (tombstones too) past the offsets the view applied, in their order, committed in
    batches with the offsets they reach, as a node applies the topic. `ends` are offsets the view reflects once
    done even past the last datum (a format 1 snapshot's end offsets). Returns the view's applied offsets."""
    reached = view.applied_offsets(metadata_topic)
    batch: list[ConsumedRecord] = []
    applied = 0
    for datum in datums:
        if datum["metadata_topic"] != metadata_topic:
            raise SnapshotError(f"record at offset {datum['offset']} belongs to {datum['metadata_topic']}, not "
                                f"{metadata_topic}")
        partition, offset = datum["metadata_partition"], datum["offset"]
        if offset < reached.get(partition, 0):
            continue
        try:
            record = ConsumedRecord(partition, offset, RecordKey.decode(datum["key"].encode()), from_archived(datum))
        except ValueError as exc:  # a node reading this record from the topic halts at it (UnicodeError is one)
            raise SnapshotError(f"record at offset {offset} of {metadata_topic} partition {partition} does not read: "
                                f"{exc}") from exc
        batch.append(record)
        reached[partition] = offset + 1
        if len(batch) >= _BATCH:
            apply_records(view, metadata_topic, batch, dict(reached))
            applied += len(batch)
            batch = []
            if progress:
                progress(applied)
    for partition, end in (ends or {}).items():
        reached[partition] = max(end, reached.get(partition, 0))
    apply_records(view, metadata_topic, batch, dict(reached))
    if progress:
        progress(applied + len(batch))
    return reached


def snapshot_entries(view: MetadataView) -> Iterator[tuple[str, bytes, bytes]]:
    """What a view snapshot of the view holds: its content, then each user partition's bookkeeping (lineage
    checkpoints owed and position), which decides the checkpoints the node's next write appends."""
    return view.snapshot_entries()


def holds_everything_until(ends: Mapping[int, int], newest_ms: Mapping[int, int], base_ms: int,
                           topic_ends: Mapping[int, int], topic_ends_at_ms: int) -> int:
    """The time up to which a snapshot reaching `ends` holds every record of its topic: what its creation time must
    say, since a new node trusts it only while the topic still keeps every tombstone written after that time
    (delete.retention.ms). A partition read to the end the topic had at `topic_ends_at_ms` holds everything written
    before then; one behind (its archive lags), only up to its newest record applied (`newest_ms`, by record
    timestamp) or what the snapshot it was built on held (`base_ms`). A partition that held records then but none
    of them reached the snapshot lags too."""
    def until(partition: int, end: int) -> int:
        if end >= topic_ends.get(partition, 0):
            return topic_ends_at_ms
        return max(newest_ms.get(partition, 0), base_ms)

    reached = {**dict.fromkeys(topic_ends, 0), **ends}
    return min((until(partition, end) for partition, end in reached.items()), default=topic_ends_at_ms)
