"""A topic in Kafka's `__remote_log_metadata` format, for `tierlog migrate`, `export` and `verify migration`:
reading every record of it once, and the store Kafka's rules (rlmm.state) build from those records.

Records decoded by tierlog.migration.records; a record that does not decode, or that sits in another metadata
partition than TBRLMM's partitioner picks for its user partition, is a `SourceProblem` naming topic, partition and
offset.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from rlmm import state
from rlmm.errors import RemoteStorageError
from rlmm.events import MetadataEvent, key_of
from rlmm.types import (
    RemoteLogSegmentMetadata,
    RemoteLogSegmentMetadataUpdate,
    TopicIdPartition,
)
from tierlog.cli.common import EXIT_USAGE, CommandError, Settings
from tierlog.cli.output import ProgressBar
from tierlog.migration.records import DEFAULT_SOURCE_TOPIC as DEFAULT_SOURCE_TOPIC  # the commands' default
from tierlog.migration.records import (
    SourceProblem,
    SourceRecord,
    TopicMetadata,
    decode_source_record,
    refusal,
)

# consume() waits this long for a full batch: the last records of a topic come as a partial one.
POLL_S = 0.1
FETCH_WAIT_MS = 20


@dataclass(frozen=True, slots=True)
class TopicDescription:
    name: str
    topic_id: str
    partitions: int


def describe_topic(settings: Settings, name: str) -> TopicDescription | None:
    """The topic's id and partition count, or None when it does not exist."""
    from confluent_kafka import KafkaError, KafkaException, TopicCollection
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(settings.kafka_client())
    try:
        found = admin.describe_topics(TopicCollection([name]), request_timeout=settings.timeout_s)[name].result(
            settings.timeout_s)
    except KafkaException as exc:
        if exc.args and exc.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
            return None
        bootstrap = settings.bootstrap_setting()
        raise CommandError(f"cannot describe topic {name} on {bootstrap.value} (bootstrap.servers from "
                           f"{bootstrap.source}): {exc}") from exc
    return TopicDescription(name, str(found.topic_id), len(found.partitions))


def require_source(settings: Settings, name: str) -> TopicDescription:
    found = describe_topic(settings, name)
    if found is None:
        raise CommandError(f"source topic {name} does not exist on {settings.bootstrap()}; pass --source-topic NAME",
                           EXIT_USAGE)
    return found


def end_offsets(settings: Settings, topic: TopicDescription) -> dict[int, int]:
    """Each partition's end offset now: what a read of the topic stops at."""
    from rlmm.event_log import OffsetReader

    try:
        return OffsetReader(topic.name, settings.kafka_client()).end_offsets(list(range(topic.partitions)),
                                                                               settings.timeout_s)
    except RemoteStorageError as exc:
        raise CommandError(f"cannot read the end offsets of {topic.name}: {exc}") from exc


def read_topic(settings: Settings, topic: TopicDescription, ends: Mapping[int, int], batch_size: int = 5000
               ) -> Iterator[list[Any]]:
    """Every message of `topic` below `ends`, partition by partition in offset order, in batches as they arrive.

    Fails when nothing arrives for the settings' timeout while records are still due."""
    for batch, _finished in _consume(settings, topic, ends, batch_size, None):
        if batch:
            yield batch


def read_partitions(settings: Settings, topic: TopicDescription, ends: Mapping[int, int], window: int
                    ) -> Iterator[tuple[int, list[Any]]]:
    """Every message of `topic` below `ends`, one whole partition at a time, as each is read to its end; at most
    `window` partitions are read at once (what is held in memory). Partitions without records are left out."""
    held: dict[int, list[Any]] = {}
    for batch, finished in _consume(settings, topic, ends, 5000, window):
        for message in batch:
            held.setdefault(message.partition() or 0, []).append(message)
        for partition in finished:
            yield partition, held.pop(partition, [])


def _consume(settings: Settings, topic: TopicDescription, ends: Mapping[int, int], batch_size: int,
             window: int | None) -> Iterator[tuple[list[Any], list[int]]]:
    """The messages below `ends` in batches, each with the partitions it finished; `window`: how many partitions are
    read at once (in partition order, the next assigned as one finishes), or None for all."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

    consumer = Consumer(settings.kafka_client(**{
        "group.id": f"tierlog-migrate-{uuid.uuid4().hex[:8]}", "enable.auto.commit": False,
        "auto.offset.reset": "earliest", "enable.partition.eof": True,
        # A partition assigned as another finishes is fetched without waiting out the long poll of those at their end.
        "fetch.wait.max.ms": FETCH_WAIT_MS,
    }))
    try:
        due = [p for p, end in sorted(ends.items()) if end > 0]
        pending = set(due[:window] if window else due)
        queued = due[len(pending):]
        # Every partition assigned at once, so each one's start is looked up now; those not yet read wait paused.
        consumer.assign([TopicPartition(topic.name, p, OFFSET_BEGINNING) for p in due])
        if queued:
            consumer.pause([TopicPartition(topic.name, p) for p in queued])
        seen = 0
        stalled_after = time.monotonic() + settings.timeout_s
        while pending:
            if time.monotonic() > stalled_after:
                raise CommandError(f"reading {topic.name} stalled: nothing arrived for {settings.timeout_s:g} s after "
                                   f"{seen} records; is the broker healthy? (raise --timeout to wait longer)")
            batch = []
            finished = []
            for message in consumer.consume(batch_size, timeout=min(POLL_S, settings.timeout_s)):
                stalled_after = time.monotonic() + settings.timeout_s
                partition = message.partition() or 0
                error = message.error()
                if error is not None and error.code() != KafkaError._PARTITION_EOF:
                    raise CommandError(f"reading {topic.name}-{partition} failed: {error.str()}")
                if partition not in pending:
                    continue
                offset = message.offset() or 0
                if error is None and offset < ends[partition]:
                    batch.append(message)
                if error is not None or offset + 1 >= ends[partition]:
                    pending.discard(partition)
                    finished.append(partition)
            if finished and queued:
                starting, queued = queued[:len(finished)], queued[len(finished):]
                pending.update(starting)
                consumer.resume([TopicPartition(topic.name, p) for p in starting])
            seen += len(batch)
            if batch or finished:
                yield batch, finished
    finally:
        consumer.close()


def read_source(settings: Settings, topic: TopicDescription, ends: Mapping[int, int]
                ) -> Iterator[list[SourceRecord | SourceProblem]]:
    """Every record of a topic in Kafka's format below `ends`, decoded, in batches (see `read_topic`)."""
    for batch in read_topic(settings, topic, ends):
        yield [decode_source_record(topic.name, topic.partitions, m) for m in batch]


def read_source_partitions(settings: Settings, topic: TopicDescription, ends: Mapping[int, int], window: int
                           ) -> Iterator[tuple[int, list[SourceRecord | SourceProblem]]]:
    """Every record of a topic in Kafka's format below `ends`, decoded, one whole partition at a time (see
    `read_partitions`)."""
    for partition, messages in read_partitions(settings, topic, ends, window):
        yield partition, [decode_source_record(topic.name, topic.partitions, m) for m in messages]


def fold_tierlog(settings: Settings, show: bool | None) -> state.InMemoryState:
    """tierlog's metadata topic, as it is now, folded through the pure state machine."""
    from rlmm import codec
    from rlmm.events import RecordKey

    topic = describe_topic(settings, settings.metadata_topic())
    if topic is None:
        raise CommandError(f"tierlog's metadata topic {settings.metadata_topic()} does not exist on "
                           f"{settings.bootstrap()}; pass -o metadata.topic.name=NAME", EXIT_USAGE)
    ends = end_offsets(settings, topic)
    folded = state.InMemoryState()
    done = 0
    with ProgressBar(f"reading {topic.name}", sum(ends.values()), show) as bar:
        for batch in read_topic(settings, topic, ends):
            for message in batch:
                value = message.value()
                try:
                    event = None if value is None else codec.decode(value)
                    key = RecordKey.decode(message.key() or b"")
                except RemoteStorageError as exc:
                    raise CommandError(f"{topic.name}-{message.partition()} offset {message.offset()} is not a "
                                       f"tierlog record: {exc}") from exc
                state.apply_record(folded, key, event, message.offset())
            done += len(batch)
            bar.update(done)
        bar.finish(done)
    return folded


# --- Kafka's rules ----------------------------------------------------------------------------------------

def prepare(store: state.StateReader, metadata: TopicMetadata) -> MetadataEvent:
    """The tierlog event a Kafka record becomes under Kafka's rules over `store`; RemoteStorageError when the rules
    drop the record (an invalid transition, an update of an unknown segment, a record of a deleted partition)."""
    if isinstance(metadata, RemoteLogSegmentMetadata):
        return state.prepare_add(store, metadata)
    if isinstance(metadata, RemoteLogSegmentMetadataUpdate):
        return state.prepare_update(store, metadata)
    state.prepare_partition_delete(store, metadata)
    return metadata


class KafkaRulesReplay:
    """The store Kafka's rules build from a metadata history: each record checked as the manager checks an API
    call (rlmm.state.prepare_*), then applied, on an in-memory store. The records a writer appends after an event
    (lineage checkpoints, tombstones) are left out: on a store that applied every record they change no answer."""

    def __init__(self) -> None:
        self.store = state.InMemoryState()

    def apply(self, metadata: TopicMetadata) -> str | None:
        """Apply one record; return why Kafka's rules drop it, or None when applied."""
        try:
            event = prepare(self.store, metadata)
        except RemoteStorageError as exc:
            return refusal(self.store, metadata, exc)
        outcome = state.apply_record(self.store, key_of(event), event)
        assert outcome.applied, f"a checked record was dropped: {outcome.reason}"
        return None


def partition_answers(store: state.StateReader, tp: TopicIdPartition) -> dict[str, Any]:
    """What Kafka's RLMM API answers for `tp` from `store`: its delete state, its listed segments, per leader epoch the
    highest offset, the remote log size and the listing's segment ids, and the segment a lookup finds at each listed
    segment's first and last offset of each of its epochs; comparable between two stores."""
    segments = state.list_segments(store, tp)
    epochs = sorted({lin.epoch for lin in store.lineages_of(tp)}
                    | {epoch for md in segments for epoch in md.segment_leader_epochs})
    delete = store.partition_delete(tp)
    listings = {e: state.list_segments(store, tp, e) for e in epochs}
    lookups: dict[str, str | None] = {}
    for md in segments:
        for epoch, start in md.segment_leader_epochs.items():
            for offset in (start, md.epoch_end_offset(epoch)):
                found = state.segment_for_offset(store, tp, epoch, offset)
                lookups[f"{epoch}@{offset}"] = None if found is None else str(found.remote_log_segment_id.id)
    return {
        "delete_state": None if delete is None else delete.state.name,
        "segments": {str(md.remote_log_segment_id.id): _segment_answer(md) for md in segments},
        "highest_offset": {e: state.highest_offset_for_epoch(store, tp, e) for e in epochs},
        "remote_log_size": {e: sum(md.segment_size_in_bytes for md in listed) for e, listed in listings.items()},
        "listing": {e: [str(md.remote_log_segment_id.id) for md in listed] for e, listed in listings.items()},
        "lookups": lookups,
    }


def _segment_answer(md: RemoteLogSegmentMetadata) -> dict[str, Any]:
    return {
        "state": md.state.name, "start_offset": md.start_offset, "end_offset": md.end_offset,
        "leader_epochs": dict(md.segment_leader_epochs), "size": md.segment_size_in_bytes,
        "max_timestamp_ms": md.max_timestamp_ms, "broker_id": md.broker_id,
        "event_timestamp_ms": md.event_timestamp_ms,
        "custom_metadata": None if md.custom_metadata is None else md.custom_metadata.hex(),
        "txn_idx_empty": md.txn_idx_empty,
    }


def answer_differences(expected: Mapping[str, Any], found: Mapping[str, Any], expected_name: str,
                       found_name: str) -> list[str]:
    """How two stores' `partition_answers` for one user partition differ, one line per difference."""
    lines = []
    if expected["delete_state"] != found["delete_state"]:
        lines.append(f"delete state: {expected_name} {expected['delete_state']}, {found_name} {found['delete_state']}")
    ours, theirs = expected["segments"], found["segments"]
    for segment in sorted(set(ours) | set(theirs)):
        if segment not in theirs:
            lines.append(f"segment {segment} ({ours[segment]['state']}): only in {expected_name}")
        elif segment not in ours:
            lines.append(f"segment {segment} ({theirs[segment]['state']}): only in {found_name}")
        elif ours[segment] != theirs[segment]:
            fields = ", ".join(f"{name} {value} / {theirs[segment][name]}"
                               for name, value in ours[segment].items() if value != theirs[segment][name])
            lines.append(f"segment {segment}: {fields} ({expected_name} / {found_name})")
    for answer in ("highest_offset", "remote_log_size", "listing", "lookups"):
        for at in sorted(set(expected[answer]) | set(found[answer]), key=str):
            mine, other = expected[answer].get(at), found[answer].get(at)
            if mine != other:
                lines.append(f"{answer} at epoch {at}: {expected_name} {mine}, {found_name} {other}")
    return lines


def store_differences(expected: state.InMemoryState | Any, found: state.InMemoryState | Any, expected_name: str,
                      found_name: str) -> dict[TopicIdPartition, list[str]]:
    """Per user partition either store knows, how their answers differ (partitions that agree left out)."""
    differences = {}
    for tp in sorted({*expected.user_partitions(), *found.user_partitions()}, key=lambda tp: (tp.topic, tp.partition)):
        lines = answer_differences(partition_answers(expected, tp), partition_answers(found, tp), expected_name,
                                   found_name)
        if lines:
            differences[tp] = lines
    return differences


@dataclass
class Comparison:
    """`__remote_log_metadata` replayed under Kafka's rules against tierlog's topic folded: how they differ, which
    records could not be read, and per broker the newest record TBRLMM (not a migrating tierlog node) wrote."""

    records: int
    partitions: int
    differences: dict[TopicIdPartition, list[str]]
    problems: list[SourceProblem]
    tbrlmm_writes: dict[int, int]  # broker id -> timestamp (ms) of its newest record

    @property
    def ok(self) -> bool:
        return not self.differences and not self.problems


def replay_source(settings: Settings, source: TopicDescription, ends: Mapping[int, int], show: bool | None
                  ) -> tuple[KafkaRulesReplay, list[SourceProblem], dict[int, int], int]:
    """The source below `ends` replayed under Kafka's rules (TBRLMM's store), the records it could not read, the
    newest time each broker wrote a record TBRLMM wrote (no tierlog writer), and how many records were read."""
    replay = KafkaRulesReplay()
    problems: list[SourceProblem] = []
    tbrlmm_writes: dict[int, int] = {}
    read = 0
    with ProgressBar(f"replaying {source.name}", sum(ends.values()), show) as bar:
        for batch in read_source(settings, source, ends):
            for item in batch:
                if isinstance(item, SourceProblem):
                    problems.append(item)
                    continue
                replay.apply(item.metadata)
                if item.tierlog_writer is None:
                    broker = item.metadata.broker_id
                    tbrlmm_writes[broker] = max(tbrlmm_writes.get(broker, 0), item.timestamp_ms)
            read += len(batch)
            bar.update(read)
        bar.finish(read)
    return replay, problems, tbrlmm_writes, read


def compare_stores(settings: Settings, source: TopicDescription, show: bool | None) -> Comparison:
    """What TBRLMM's store answers (the source replayed) against what tierlog's metadata topic answers, now."""
    ends = end_offsets(settings, source)
    replay, problems, tbrlmm_writes, read = replay_source(settings, source, ends, show)
    tierlog = fold_tierlog(settings, show)
    partitions = len({*replay.store.user_partitions(), *tierlog.user_partitions()})
    return Comparison(read, partitions, store_differences(replay.store, tierlog, "TBRLMM", "tierlog"), problems,
                      tbrlmm_writes)
