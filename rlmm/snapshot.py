"""Bootstrap snapshots: a compacted copy of the metadata log that a new node loads instead of the topic.

Format: an Avro container file of `codec.archived_event_schema()` records (newest record per key, no
tombstones, in (metadata partition, offset) order) with file metadata naming the topic and end offsets.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

import fastavro

from rlmm import codec
from rlmm.errors import RemoteStorageError
from rlmm.events import RecordKey
from rlmm.view import ConsumedRecord, MetadataView, apply_records

TOPIC_META = "tierlog.metadata.topic"
END_OFFSETS_META = "tierlog.snapshot.end_offsets"
_BATCH = 5000


class SnapshotError(RemoteStorageError):
    """A snapshot file is not usable; the message says which and why."""


def write_snapshot(
    out: BinaryIO, metadata_topic: str, records: Iterable[dict[str, Any]], end_offsets: dict[int, int]
) -> None:
    """Write archive datums (already compacted and ordered) as a snapshot file."""
    fastavro.writer(
        out, fastavro.parse_schema(codec.archived_event_schema()), records, codec="deflate",
        metadata={
            TOPIC_META: metadata_topic,
            END_OFFSETS_META: json.dumps({str(k): v for k, v in end_offsets.items()}),
        },
    )


def read_snapshot(path: Path) -> tuple[str, dict[int, int], Iterator[dict[str, Any]]]:
    handle = path.open("rb")
    try:
        reader = fastavro.reader(handle)
        meta = reader.metadata
        topic = meta[TOPIC_META]
        ends = {int(k): int(v) for k, v in json.loads(meta[END_OFFSETS_META]).items()}
    except (KeyError, ValueError, OSError) as exc:
        handle.close()
        raise SnapshotError(f"{path} is not a tierlog snapshot ({exc}); build one with `tierlog` snapshot") from exc

    def records() -> Iterator[dict[str, Any]]:
        with handle:
            for datum in reader:
                assert isinstance(datum, dict)
                yield datum

    return topic, ends, records()


def load_snapshot(
    path: str | Path, state_dir: str | Path, progress: Callable[[int], None] | None = None
) -> tuple[str, dict[int, int]]:
    """Materialize a snapshot into an EMPTY state dir; a manager started on it resumes from the end offsets."""
    path = Path(path)
    view_dir = Path(state_dir) / "view"
    if view_dir.exists() and any(view_dir.iterdir()):
        raise SnapshotError(f"state dir {state_dir} already holds a view; load a snapshot only into an empty one")
    topic, ends, datums = read_snapshot(path)
    view = MetadataView.open(state_dir)
    try:
        batch: list[ConsumedRecord] = []
        reached: dict[int, int] = {}
        loaded = 0
        for datum in datums:
            event = codec.from_archived(datum)
            if datum["metadata_topic"] != topic:
                raise SnapshotError(f"{path}: record at offset {datum['offset']} belongs to {datum['metadata_topic']}")
            batch.append(ConsumedRecord(datum["metadata_partition"], datum["offset"],
                                        RecordKey.decode(datum["key"].encode()), event))
            reached[datum["metadata_partition"]] = datum["offset"] + 1
            if len(batch) >= _BATCH:
                apply_records(view, topic, batch, reached)
                loaded += len(batch)
                batch = []
                if progress:
                    progress(loaded)
        apply_records(view, topic, batch, ends)
        loaded += len(batch)
        if progress:
            progress(loaded)
    finally:
        view.close()
    return topic, ends
