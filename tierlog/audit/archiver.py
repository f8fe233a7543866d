"""The audit archiver: copies every metadata-topic record, before compaction can drop it, into Avro files.

Files live under `audit/<metadata topic>/<partition>/<first offset:020d>-<last offset:020d>.avro`; the
resume point is the highest last offset found there, so a crash loses nothing and repeats nothing. Two archivers
of one partition (a leadership hand-over) leave out of each file what the other has written since they resumed;
only when both list before either writes does a record land in two files, the same record at the same offset,
which every reader folds once (by offset). A gap (records compacted away before they were archived) is logged
and counted. `tierlog.audit.loop` runs and supervises it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
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
    # The metadata partitions to archive; None: every partition of the topic.
    partitions: frozenset[int] | None = None
    # Kafka client settings (security, logger) for the archiver's consumer.
    consumer_overrides: tuple[tuple[str, Any], ...] = ()

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
    """Consumes the metadata topic and writes its records into archive files; one instance, one thread.

    `start()` resumes each partition from the archive, `step()` reads one batch and writes the files that are due,
    `close()` writes what is buffered (when it can) and closes the consumer."""

    def __init__(self, store: StorageBackend, settings: ArchiverSettings) -> None:
        self._store = store
        self._settings = settings
        self._buffers: dict[int, _PartitionBuffer] = {}
        self._next_offset: dict[int, int] = {}
        # Offset after the last record seen in each partition, whether archived or only passed over.
        self._consumed_end: dict[int, int] = {}
        # Partitions assigned but not read yet: the offset the first record read should have.
        self._expected_first: dict[int, int] = {}
        self.stats = ArchiverStats()
        self._consumer = Consumer(self._consumer_config())
        self._closed = False

    def _consumer_config(self) -> dict[str, Any]:
        s = self._settings
        config: dict[str, Any] = {
            "bootstrap.servers": s.bootstrap_servers,
            # Positions come from the archive itself, never from committed offsets: the group is never joined.
            "group.id": f"tierlog-archiver-{s.metadata_topic}",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
        }
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
        chosen = self._settings.partitions
        return sorted(p for p in described.partitions if chosen is None or p in chosen)

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

    # --- running -----------------------------------------------------------------------------------

    def start(self, timeout_s: float = 30) -> list[int]:
        """Resume each chosen partition after its last archived offset; the partitions archived."""
        partitions = self._partitions(timeout_s)
        self._consumer.assign(self._resume_positions(partitions))
        return partitions

    def step(self, poll_timeout_s: float = 0.5) -> None:
        """Read one batch (unless a buffer is full: a store refusing writes must not make them grow without
        bound) and write the files that are full or have waited long enough; RemoteStorageError keeps the
        records buffered for the next step."""
        if not self._any_full():
            self._consume_batch(poll_timeout_s)
        self._flush_ready()

    def flush(self) -> None:
        """Write every buffered record now."""
        for partition in list(self._buffers):
            self._flush(partition)

    def close(self, flush: bool = True) -> None:
        """Close the consumer, first writing what is buffered when `flush` (a failure to write is logged: the
        next archiver reads those records again from the topic)."""
        if self._closed:
            return
        self._closed = True
        try:
            if flush:
                self.flush()
        except RemoteStorageError as exc:
            log.warning("closing the archiver of %s without writing its buffered records (%s); they are read "
                        "again from the topic", self._settings.metadata_topic, exc)
        finally:
            self._consumer.close()

    def run_until_caught_up(self, timeout_s: float = 600) -> ArchiverStats:
        """Archive every record present now (up to each partition's end), write it, and return."""
        partitions = self.start()
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
                self.step()
            self.flush()
        finally:
            self.close(flush=False)
        return self.stats

    # --- progress ----------------------------------------------------------------------------------

    def archived_end(self, partition: int) -> int:
        """Offset after the last record of `partition` archived (written, or passed over as compacted away)."""
        if self._buffers.get(partition) is not None and self._buffers[partition].datums:
            return self._next_offset[partition]
        return max(self._consumed_end.get(partition, 0), self._next_offset.get(partition, 0))

    def end_offset(self, partition: int) -> int | None:
        """The partition's end offset as the consumer last heard it from Kafka (no request), None before."""
        _low, high = self._consumer.get_watermark_offsets(
            TopicPartition(self._settings.metadata_topic, partition), cached=True)
        return None if high is None or high < 0 else int(high)

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
                if error.fatal():
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

    def holds_unwritten(self) -> bool:
        """Whether records read are waiting to be written."""
        return any(b.datums for b in self._buffers.values())

    def _any_full(self) -> bool:
        return any(len(b.datums) >= self._settings.max_records_per_file for b in self._buffers.values())

    def _flush_ready(self) -> None:
        """Write the buffers that are full or have waited long enough."""
        now = time.monotonic()
        for partition, buffer in list(self._buffers.items()):
            full = len(buffer.datums) >= self._settings.max_records_per_file
            if full or (buffer.datums and now - buffer.opened_at >= self._settings.max_file_interval_s):
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
