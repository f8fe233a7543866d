"""The audit archiver: copies every metadata-topic record, before compaction can drop it, into Avro files.

Files live under `audit/<metadata topic>/<partition>/<first offset:020d>-<last offset:020d>.avro`; the
resume point is the highest last offset found there, so a crash loses nothing and repeats nothing. A gap
(records compacted away before they were archived) is logged and counted; inside the agent the archiver
restarts after any failure.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition

from rlmm.archive import (
    ARCHIVE_ROOT,
    ArchiveFile,
    archive_key,
    encode_archive_file,
    next_offset_to_archive,
    parse_archive_key,
    partition_prefix,
    to_archived,
)
from rlmm.errors import DecodeError, MetadataLogError, RemoteStorageError
from rsm.backend import ObjectInfo, StorageBackend

log = logging.getLogger(__name__)

RETRY_MIN_S = 0.5
RETRY_MAX_S = 30.0


def list_archive_files(
    store: StorageBackend, metadata_topic: str, metadata_partition: int | None = None
) -> list[ArchiveFile]:
    """The archive files of one metadata topic (or one of its partitions), by partition and offset."""
    prefix = (
        f"{ARCHIVE_ROOT}/{metadata_topic}/"
        if metadata_partition is None
        else partition_prefix(metadata_topic, metadata_partition)
    )
    return _parse_all(store.list(prefix))


def _parse_all(objects: Iterable[ObjectInfo]) -> list[ArchiveFile]:
    files = [f for f in (parse_archive_key(o.key, o.size) for o in objects) if f is not None]
    return sorted(files, key=lambda f: (f.metadata_partition, f.first_offset))


@dataclass(frozen=True, slots=True)
class ArchiverSettings:
    bootstrap_servers: str
    metadata_topic: str
    max_records_per_file: int = 10_000
    # Longest a record waits in memory before its file is written: keep it far below the topic's
    # min.compaction.lag.ms, which is what guarantees the archiver sees every record.
    max_file_interval_s: float = 5.0
    # With a group id, archivers on several nodes split the metadata partitions between them;
    # without one, this archiver takes every partition (the standalone `tierlog archive`).
    group_id: str | None = None
    group_instance_id: str | None = None
    consumer_overrides: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if self.max_records_per_file < 1:
            raise ValueError(f"max_records_per_file must be >= 1, got {self.max_records_per_file}")
        if self.max_file_interval_s <= 0:
            raise ValueError(f"max_file_interval_s must be > 0, got {self.max_file_interval_s}")
        if not self.metadata_topic:
            raise ValueError("metadata_topic must not be empty")


@dataclass(frozen=True)
class AuditGap:
    """Offsets first..last of a metadata partition left the topic before they were archived."""

    metadata_partition: int
    first_offset: int
    last_offset: int


@dataclass
class ArchiverStats:
    files_written: int = 0
    records_archived: int = 0
    files_skipped_as_already_archived: int = 0
    per_partition_next_offset: dict[int, int] = field(default_factory=dict)
    gaps: list[AuditGap] = field(default_factory=list)


@dataclass
class _PartitionBuffer:
    datums: list[dict[str, Any]] = field(default_factory=list)
    opened_at: float = 0.0


class Archiver:
    """Consumes the metadata topic and writes its records into archive files; one instance, one thread."""

    def __init__(self, store: StorageBackend, settings: ArchiverSettings) -> None:
        self._store = store
        self._settings = settings
        self._buffers: dict[int, _PartitionBuffer] = {}
        self._next_offset: dict[int, int] = {}
        # Offset after the last record seen in each partition, whether archived or only passed over.
        self._consumed_end: dict[int, int] = {}
        # Partitions (re)assigned but not read yet: the offset the first record read should have.
        self._expected_first: dict[int, int] = {}
        self.stats = ArchiverStats()
        self._consumer = Consumer(self._consumer_config())

    def _consumer_config(self) -> dict[str, Any]:
        s = self._settings
        config: dict[str, Any] = {
            "bootstrap.servers": s.bootstrap_servers,
            # Positions come from the archive itself, never from committed offsets.
            "group.id": s.group_id or f"tierlog-archiver-standalone-{s.metadata_topic}",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
        }
        if s.group_instance_id:
            config["group.instance.id"] = s.group_instance_id
        config.update(dict(s.consumer_overrides))
        return config

    # --- positions ---------------------------------------------------------------------------------

    def _partitions(self, timeout_s: float) -> list[int]:
        topic = self._settings.metadata_topic
        try:
            metadata = self._consumer.list_topics(topic, timeout=timeout_s)
        except KafkaException as exc:
            raise MetadataLogError(
                f"cannot reach Kafka at {self._settings.bootstrap_servers} to read topic {topic!r}: {exc}"
            ) from exc
        described = metadata.topics.get(topic)
        if described is None or described.error is not None or not described.partitions:
            raise MetadataLogError(
                f"metadata topic {topic!r} does not exist on {self._settings.bootstrap_servers}; "
                "start the agent (it creates the topic) or pass the right metadata topic name"
            )
        return sorted(described.partitions)

    def _resume_positions(self, partitions: Iterable[int]) -> list[TopicPartition]:
        topic = self._settings.metadata_topic
        positions = []
        for p in partitions:
            resume = next_offset_to_archive(list_archive_files(self._store, topic, p))
            self._next_offset[p] = resume if resume is not None else 0
            self._buffers[p] = _PartitionBuffer()
            # Compaction never moves the low watermark, so only the first offset actually read shows a gap.
            self._expected_first[p] = self._next_offset[p]
            positions.append(TopicPartition(topic, p, OFFSET_BEGINNING if resume is None else resume))
            log.info("archiving %s-%d from offset %s", topic, p, "0 (start)" if resume is None else resume)
        return positions

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        consumer.assign(self._resume_positions(tp.partition for tp in partitions))

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # Write what is buffered so the next owner resumes after it rather than re-reading it.
        for tp in partitions:
            self._flush(tp.partition)
            self._buffers.pop(tp.partition, None)
        consumer.unassign()

    # --- running -----------------------------------------------------------------------------------

    def run(self, stop: threading.Event, poll_timeout_s: float = 0.5) -> None:
        """Archive until `stop` is set; buffered records are written before returning."""
        if self._settings.group_id:
            self._consumer.subscribe(
                [self._settings.metadata_topic], on_assign=self._on_assign, on_revoke=self._on_revoke
            )
        else:
            self._consumer.assign(self._resume_positions(self._partitions(timeout_s=30)))
        backoff_s = RETRY_MIN_S
        try:
            while not stop.is_set():
                # A store that refuses writes must not make the buffers grow without bound.
                if not self._any_full():
                    self._consume_batch(poll_timeout_s)
                try:
                    self._flush_ready()
                    backoff_s = RETRY_MIN_S
                except RemoteStorageError as exc:
                    log.warning("writing the audit archive failed, retrying in %.1f s: %s", backoff_s, exc)
                    stop.wait(backoff_s)
                    backoff_s = min(backoff_s * 2, RETRY_MAX_S)
            self._flush_all()
        finally:
            self._consumer.close()

    def run_until_caught_up(self, timeout_s: float = 600) -> ArchiverStats:
        """Archive every record present now (up to each partition's end), write it, and return."""
        if self._settings.group_id:
            raise ValueError("run_until_caught_up archives every partition; use it without a group id")
        partitions = self._partitions(timeout_s=30)
        self._consumer.assign(self._resume_positions(partitions))
        topic = self._settings.metadata_topic
        watermarks = self._consumer.get_watermark_offsets
        ends = {p: watermarks(TopicPartition(topic, p), timeout=10)[1] for p in partitions}
        deadline = time.monotonic() + timeout_s
        try:
            while any(self._position(p) < ends[p] for p in partitions):
                if time.monotonic() > deadline:
                    raise MetadataLogError(
                        f"archiving {topic} did not reach the end offsets {ends} within {timeout_s}s"
                    )
                self._consume_batch(0.5)
                self._flush_ready()
            self._flush_all()
        finally:
            self._consumer.close()
        return self.stats

    def _position(self, partition: int) -> int:
        """Offset after the last record consumed (buffered or written) in `partition`."""
        buffered = self._buffers[partition].datums
        if buffered:
            return int(buffered[-1]["offset"]) + 1
        return max(self._consumed_end.get(partition, 0), self._next_offset[partition])

    def _consume_batch(self, timeout_s: float) -> None:
        for message in self._consumer.consume(num_messages=2000, timeout=timeout_s):
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    # Past the last record: transaction markers or compacted offsets may follow it.
                    partition, offset = message.partition() or 0, message.offset() or 0
                    self._check_gap(partition, offset)
                    self._consumed_end[partition] = max(offset, self._consumed_end.get(partition, 0))
                    continue
                if error.fatal() or error.code() == KafkaError._MAX_POLL_EXCEEDED:
                    # E.g. kicked from the group after a long store outage: only a new consumer goes on.
                    raise MetadataLogError(f"consuming {self._settings.metadata_topic} failed: {error}")
                log.warning("consuming %s: %s (the client retries)", self._settings.metadata_topic, error.str())
                continue
            self._check_gap(message.partition() or 0, message.offset() or 0)
            self._accept(message)

    def _check_gap(self, partition: int, offset: int) -> None:
        """Report records that left the topic between the resume point and the first offset read."""
        expected = self._expected_first.pop(partition, None)
        if expected is None or offset <= expected:
            return
        gap = AuditGap(partition, expected, offset - 1)
        self.stats.gaps.append(gap)
        log.warning(
            "audit gap in %s-%d: offsets %d..%d were removed from the topic before they were archived; "
            "raise min.compaction.lag.ms or keep the archiver running",
            self._settings.metadata_topic, partition, gap.first_offset, gap.last_offset,
        )

    def _accept(self, message: Any) -> None:
        partition, offset = message.partition(), message.offset()
        buffer = self._buffers.get(partition)
        if buffer is None or offset < self._next_offset[partition]:
            return  # revoked meanwhile, or already archived (a seek landed before the resume point)
        if buffer.datums and offset <= buffer.datums[-1]["offset"]:
            return
        key = message.key()
        if key is None:
            raise MetadataLogError(
                f"record {self._settings.metadata_topic}-{partition}@{offset} has no key: "
                "this topic is not a tierlog metadata topic"
            )
        _type, timestamp_ms = message.timestamp()
        try:
            datum = to_archived(
                self._settings.metadata_topic, partition, offset, timestamp_ms, key, message.value()
            )
        except DecodeError as exc:
            raise MetadataLogError(
                f"record {self._settings.metadata_topic}-{partition}@{offset} cannot be archived: {exc}; "
                "the archive stops before it so that no record is skipped"
            ) from exc
        if not buffer.datums:
            buffer.opened_at = time.monotonic()
        buffer.datums.append(datum)

    def _any_full(self) -> bool:
        return any(len(b.datums) >= self._settings.max_records_per_file for b in self._buffers.values())

    def _flush_ready(self) -> None:
        """Write the buffers that are full or have waited long enough."""
        now = time.monotonic()
        for partition, buffer in list(self._buffers.items()):
            full = len(buffer.datums) >= self._settings.max_records_per_file
            if full or (buffer.datums and now - buffer.opened_at >= self._settings.max_file_interval_s):
                self._flush(partition)

    def _flush_all(self) -> None:
        for partition in list(self._buffers):
            self._flush(partition)

    def _flush(self, partition: int) -> None:
        """Write the partition's buffer as files of at most max_records_per_file records, in order."""
        buffer = self._buffers.get(partition)
        while buffer is not None and buffer.datums:
            limit = self._settings.max_records_per_file
            chunk, buffer.datums = buffer.datums[:limit], buffer.datums[limit:]
            try:
                self._write_file(partition, chunk)
            except RemoteStorageError:
                # Keep the records so the next flush retries them; the consumer position is not moved back.
                buffer.datums = chunk + buffer.datums
                raise

    def _write_file(self, partition: int, datums: list[dict[str, Any]]) -> None:
        datums = self._drop_already_archived(partition, datums)
        if not datums:
            return
        topic = self._settings.metadata_topic
        first, last = datums[0]["offset"], datums[-1]["offset"]
        key = archive_key(topic, partition, first, last)
        self._store.put(key, encode_archive_file(topic, partition, datums))
        self._next_offset[partition] = last + 1
        self._consumed_end[partition] = max(self._consumed_end.get(partition, 0), last + 1)
        self.stats.files_written += 1
        self.stats.records_archived += len(datums)
        self.stats.per_partition_next_offset[partition] = last + 1
        log.debug("archived %s (%d records)", key, len(datums))

    def _drop_already_archived(self, partition: int, datums: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Leave out records another archiver (a paused predecessor) has written since we resumed.

        Any such file starts at or after our resume point (files are written in offset order), so it
        starts between that point and this batch's last offset; keys of that range share the digits
        both ends share, and one listing of that narrow prefix finds them.
        """
        topic = self._settings.metadata_topic
        first, last = datums[0]["offset"], datums[-1]["offset"]
        low, high = f"{min(self._next_offset[partition], first):020d}", f"{last:020d}"
        common = next((i for i in range(20) if low[i] != high[i]), 20)
        narrowed = partition_prefix(topic, partition) + low[:common]
        listed = _parse_all(self._store.list(narrowed))
        overlapping = [f for f in listed if f.first_offset <= last and f.last_offset >= first]
        if not overlapping:
            return datums
        covered_to = max(f.last_offset for f in overlapping)
        self.stats.files_skipped_as_already_archived += 1
        log.warning(
            "%s-%d offsets %d..%d were already archived by another archiver; keeping only what follows",
            topic, partition, first, covered_to,
        )
        return [d for d in datums if d["offset"] > covered_to]


class ArchiverThread(threading.Thread):
    """Runs an Archiver in the background of the agent; after any failure it logs, waits and starts a new
    one, which resumes from the archive. `restarts`, `gaps` and `error` (the last failure) are for inspection."""

    def __init__(self, make_archiver: Callable[[], Archiver]) -> None:
        super().__init__(name="tierlog-archiver", daemon=True)
        self._make_archiver = make_archiver
        self._stop_event = threading.Event()
        self.error: BaseException | None = None
        self.restarts = 0
        self._current: Archiver | None = None
        self._earlier_gaps = 0

    @property
    def gaps(self) -> int:
        """Audit gaps found since the thread started, by every archiver it ran."""
        current = self._current
        return self._earlier_gaps + (len(current.stats.gaps) if current is not None else 0)

    def run(self) -> None:
        backoff_s = RETRY_MIN_S
        while not self._stop_event.is_set():
            try:
                if self._current is not None:
                    self._earlier_gaps += len(self._current.stats.gaps)
                self._current = self._make_archiver()
                self._current.run(self._stop_event)
            except Exception as exc:  # the agent keeps serving; the archiver starts again
                self.error = exc
                self.restarts += 1
                log.warning("the audit archiver failed (%s); restarting in %.1f s from the archive's resume point",
                            exc, backoff_s)
                self._stop_event.wait(backoff_s)
                backoff_s = min(backoff_s * 2, RETRY_MAX_S)

    def stop(self, timeout_s: float = 30) -> None:
        self._stop_event.set()
        self.join(timeout_s)
