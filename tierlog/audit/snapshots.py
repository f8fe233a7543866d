"""Periodic bootstrap snapshots: applies the audit archive, on top of the newest snapshot, to a view and writes
that view as a new snapshot.

Each file is `rlmm.archive`'s snapshot format 2 (the view's entries and digest) stored under `rlmm.bootstrap`'s
key layout (creation time and sha256 in the name), so new nodes verify it before use. `tierlog.audit.loop` writes
them beside the archiver.
"""

from __future__ import annotations

import io
import logging
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaException, TopicCollection, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from rlmm.archive import read_archive_file, read_snapshot
from rlmm.bootstrap import SnapshotRef, list_snapshots, read_verified, snapshot_key
from rlmm.errors import RemoteStorageError, SnapshotError
from rlmm.snapshot import apply_archived, holds_everything_until, load_into, snapshot_entries, write_view_snapshot
from rlmm.view import MetadataView
from rsm.backend import StorageBackend, read_all
from rsm.snapshot_source import BucketSnapshotSource
from tierlog.audit.archiver import list_archive_files

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class SnapshotSettings:
    location: str  # the key prefix in the bucket: rlmm's `snapshot.location`
    metadata_topic: str
    interval_s: float = 3600.0
    keep: int = 3  # snapshots kept per topic; older ones are deleted after a new one is written

    def __post_init__(self) -> None:
        if not self.location.strip("/"):
            raise ValueError("snapshot location must not be empty")
        if self.interval_s <= 0:
            raise ValueError(f"interval_s must be > 0, got {self.interval_s}")
        if self.keep < 1:
            raise ValueError(f"keep must be >= 1, got {self.keep}")


# How long a snapshot of a node's own view waits for the view to reach the topic's end offsets.
VIEW_CATCH_UP_S = 60.0


def archived_records(store: StorageBackend, metadata_topic: str, after: Mapping[int, int]
                     ) -> Iterator[dict[str, Any]]:
    """Every archived datum of the topic at or past `after` (per partition), file by file, in offset order."""
    for archive_file in list_archive_files(store, metadata_topic):
        if archive_file.last_offset < after.get(archive_file.metadata_partition, 0):
            continue
        yield from read_archive_file(read_all(store.get_range(archive_file.key, 0)))


def materialize_newest(store: StorageBackend, settings: SnapshotSettings, topic_id: str, work: Path
                       ) -> tuple[MetadataView, int]:
    """An open view under `work` holding the newest snapshot that loads, or an empty one when none does; and the
    time up to which that snapshot holds every record of the topic (0 for none)."""
    source = BucketSnapshotSource(store)
    for attempt, ref in enumerate(list_snapshots(source, settings.location, settings.metadata_topic, topic_id)):
        view = MetadataView(work / f"base-{attempt}")
        try:
            header, datums = read_snapshot(io.BytesIO(read_verified(source, ref)))
            if header.metadata_topic != settings.metadata_topic:
                raise SnapshotError(f"it holds topic {header.metadata_topic}")
            load_into(view, header, datums)
            return view, ref.created_ms
        except (SnapshotError, ValueError) as exc:
            view.close()
            log.warning("snapshot %s is unusable as a base (%s); trying an older one", ref.key, exc)
    return MetadataView(work / "base-empty"), 0


def write_snapshot_now(store: StorageBackend, settings: SnapshotSettings, topic_id: str,
                       now_ms: int | None = None, topic_ends: Callable[[], Mapping[int, int]] | None = None
                       ) -> str | None:
    """Write a snapshot of everything archived so far; the new key, or None when nothing changed since the
    newest snapshot (or nothing is archived yet).

    The newest snapshot's view plus every archived record after it, applied in log order as a node applies the
    topic, is the view a node that replayed the whole topic holds; the snapshot carries it entry by entry. Its
    creation time is the time up to which it holds every record (rlmm.snapshot.holds_everything_until): now where
    the archive reached the topic's end offsets (`topic_ends`, asked before the archive is read), else the time of
    its newest records, so that a snapshot of a lagging archive never looks fresher than it is. Without
    `topic_ends` the caller vouches that the archive had read the whole topic when this was called."""
    topic = settings.metadata_topic
    asked_ms = int(time.time() * 1000) if now_ms is None else now_ms
    ends_then = None if topic_ends is None else topic_ends()
    with tempfile.TemporaryDirectory(prefix="tierlog-snapshot-") as work:
        view, base_ms = materialize_newest(store, settings, topic_id, Path(work))
        path = Path(work) / "snapshot.avro"
        try:
            base = view.applied_offsets(topic)
            newest_ms: dict[int, int] = {}
            ends = apply_archived(view, topic, _noting_times(archived_records(store, topic, base), newest_ms))
            if not ends or ends == base:
                return None
            created = asked_ms if ends_then is None else holds_everything_until(ends, newest_ms, base_ms, ends_then,
                                                                                 asked_ms)
            with path.open("wb") as out:
                write_view_snapshot(out, topic, snapshot_entries(view), ends, view.digest(), topic_id, created)
        finally:
            view.close()
        key = _put(store, settings, topic_id, created, path)
    log.info("wrote snapshot %s up to offsets %s, holding every record until %d", key, ends, created)
    _prune(store, settings, topic_id)
    return key


def _put(store: StorageBackend, settings: SnapshotSettings, topic_id: str, created_ms: int, path: Path) -> str:
    """Upload a snapshot file under its key (from the file: a large cluster's snapshot is never held in memory)."""
    key = snapshot_key(settings.location, settings.metadata_topic, topic_id, created_ms, path)
    store.put(key, path)
    log.info("uploaded snapshot %s (%d bytes)", key, path.stat().st_size)
    return key


def write_snapshot_of_view(store: StorageBackend, settings: SnapshotSettings, topic_id: str, view: MetadataView,
                           applied: Callable[[], Mapping[int, int]], topic_ends: Callable[[], Mapping[int, int]],
                           timeout_s: float = VIEW_CATCH_UP_S) -> str:
    """Write a snapshot of a live node's own view (its RocksDB files as they are at one moment): no archive is read
    or folded, so writing one costs a read of the view, whatever history the topic has. `applied` gives the offsets
    the node's manager applied; its view must reach the topic's end offsets asked now (`topic_ends`) within
    `timeout_s` (else RemoteStorageError), so that the snapshot holds every record written until now: its time."""
    topic = settings.metadata_topic
    asked_ms = int(time.time() * 1000)
    ends_then = topic_ends()
    deadline = time.monotonic() + timeout_s
    while (behind := {p: end for p, end in ends_then.items() if applied().get(p, 0) < end}):
        if time.monotonic() > deadline:
            raise RemoteStorageError(f"the node's view of {topic} did not reach the topic's end offsets within "
                                     f"{timeout_s:.0f} s (behind on partitions {sorted(behind)}); no snapshot written")
        time.sleep(0.2)
    with tempfile.TemporaryDirectory(prefix="tierlog-snapshot-") as work:
        path = Path(work) / "snapshot.avro"
        with view.point_in_time() as moment:
            ends = moment.applied_offsets(topic)
            with path.open("wb") as out:
                write_view_snapshot(out, topic, moment.snapshot_entries(), ends, moment.digest(), topic_id, asked_ms)
        key = _put(store, settings, topic_id, asked_ms, path)
    log.info("wrote snapshot %s of this node's view at offsets %s", key, ends)
    _prune(store, settings, topic_id)
    return key


def _noting_times(datums: Iterator[dict[str, Any]], newest_ms: dict[int, int]) -> Iterator[dict[str, Any]]:
    """The datums, noting the newest record timestamp of each metadata partition in `newest_ms`."""
    for datum in datums:
        partition = datum["metadata_partition"]
        newest_ms[partition] = max(newest_ms.get(partition, 0), datum["timestamp_ms"])
        yield datum


def _prune(store: StorageBackend, settings: SnapshotSettings, topic_id: str) -> None:
    refs: list[SnapshotRef] = list_snapshots(BucketSnapshotSource(store), settings.location,
                                             settings.metadata_topic, topic_id)
    old = [ref.key for ref in refs[settings.keep:]]
    if old:
        store.delete(old)


def metadata_topic_now(client_config: Mapping[str, Any], metadata_topic: str, timeout_s: float = 30.0
                       ) -> tuple[str, dict[int, int]]:
    """The metadata topic's id, as the manager records it (snapshots are filed under it), and the end offset of each
    of its partitions now. `client_config`: the Kafka client's settings (bootstrap.servers, security)."""
    admin = AdminClient(dict(client_config))  # kept while the answers are awaited: it dies with its handle
    try:
        described = admin.describe_topics(TopicCollection([metadata_topic]), request_timeout=timeout_s)
        topic = described[metadata_topic].result(timeout=timeout_s)
        listed = admin.list_offsets({TopicPartition(metadata_topic, p.id): OffsetSpec.latest()
                                     for p in topic.partitions}, request_timeout=timeout_s)
        return str(topic.topic_id), {tp.partition: answer.result(timeout=timeout_s).offset
                                     for tp, answer in listed.items()}
    except KafkaException as exc:
        raise RemoteStorageError(f"cannot describe metadata topic {metadata_topic} on "
                                 f"{client_config.get('bootstrap.servers')}: {exc}") from exc
