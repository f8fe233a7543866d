"""`tierlog restore` from the segment objects alone: real Kafka segments copied by the real RemoteStorageManager come
back with the metadata Kafka gave them, except exactly the fields the bucket does not hold, which the report names;
an unfinished copy and an unreadable packed index are reported, not restored."""

from __future__ import annotations

import dataclasses
import itertools
import shutil
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from restore_testkit import Cluster, archive, write_history
from rlmm_testkit import make_tp, register
from support.services import broker_log_dir
from support.topics import create_topic, unique_topic_name

from dev.process import wait_until
from rlmm import RemoteLogMetadataManager, RemoteLogSegmentState, TopicIdPartition
from rlmm.types import RemoteLogSegmentId, RemoteLogSegmentMetadata
from rsm import LogSegmentData, RemoteStorageManager
from rsm.keys import segment_keys
from tierlog.audit.restore import OBJECTS_UNKNOWN, partition_name

RECORDS = 1300
RECORD_BYTES = 2048
NEW_EPOCH = 3  # a leader change inside the second segment
NEW_EPOCH_AFTER = 5  # offsets into the second segment


def timestamp(index: int) -> int:
    """Record timestamps out of order, so a segment's max timestamp is rarely its last record's."""
    return 1_760_000_000_000 + (index * 7919) % 100_000


def rolled_segments(bootstrap: str, topic: str) -> tuple[Path, list[int]]:
    """Produce RECORDS records to a topic rolling 1 MiB segments, with a sparse offset index (one entry per 64 KiB,
    so the last batches of a segment follow its last entry); its partition directory and the rolled bases."""
    create_topic(bootstrap, topic, config={"segment.bytes": 1 << 20, "index.interval.bytes": 1 << 16,
                                           "retention.ms": -1, "message.timestamp.type": "CreateTime"})
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "compression.type": "none"})
    for index in range(RECORDS):
        producer.produce(topic, b"r" * RECORD_BYTES, key=str(index).encode(), timestamp=timestamp(index))
    assert producer.flush(30) == 0
    directory = broker_log_dir(bootstrap) / f"{topic}-0"
    wait_until(lambda: len(list(directory.glob("*.log"))) >= 3, timeout=30, description=f"{topic} rolled")
    return directory, sorted(int(p.stem) for p in directory.glob("*.log"))


def epoch_checkpoint(entries: list[tuple[int, int]], next_base: int) -> bytes:
    """What Kafka hands the RSM: every epoch entry from the log start up to the next segment's base offset."""
    kept = [(epoch, start) for epoch, start in entries if start < next_base]
    return f"0\n{len(kept)}\n".encode() + b"".join(f"{e} {s}\n".encode() for e, s in kept)


@dataclasses.dataclass(frozen=True)
class RolledSegment:
    """A rolled segment's files as the broker hands them to the RSM, and the metadata Kafka's RemoteLogManager adds
    for it (COPY_SEGMENT_STARTED) before copying."""

    metadata: RemoteLogSegmentMetadata
    data: LogSegmentData


def rolled(directory: Path, work: Path, tp: TopicIdPartition, base: int, next_base: int,
           epochs: list[tuple[int, int]]) -> RolledSegment:
    def take(name: str) -> Path:
        target = work / f"{uuid.uuid4().hex}-{name}"
        shutil.copyfile(directory / name, target)
        return target

    data = LogSegmentData(take(f"{base:020d}.log"), take(f"{base:020d}.index"), take(f"{base:020d}.timeindex"),
                          None, take(f"{next_base:020d}.snapshot"), epoch_checkpoint(epochs, next_base))
    before = [(e, s) for e, s in epochs if s <= base]
    segment_epochs = {before[-1][0]: base, **{e: s for e, s in epochs if base < s < next_base}}
    metadata = RemoteLogSegmentMetadata(
        RemoteLogSegmentId(tp, uuid.uuid4()), base, next_base - 1,
        max(timestamp(i) for i in range(base, next_base)), 3, int(time.time() * 1000),
        data.log_segment.stat().st_size, segment_epochs, txn_idx_empty=True)  # no transactions: no .txnindex
    return RolledSegment(metadata, data)


def copy(rsm: RemoteStorageManager, segment: RolledSegment) -> RemoteLogSegmentMetadata:
    """Copy a rolled segment as Kafka's RemoteLogManager does; the metadata it writes once the copy finished."""
    custom = rsm.copy_log_segment_data(segment.metadata, segment.data)
    return dataclasses.replace(segment.metadata, custom_metadata=custom,
                               state=RemoteLogSegmentState.COPY_SEGMENT_FINISHED)


def rsm_config(cluster: Cluster) -> dict[str, Any]:
    """The storage manager of the brokers: the cluster's bucket, keys without a hash prefix."""
    return {"storage.backend": "s3", "s3.bucket": cluster.bucket, "s3.endpoint.url": cluster.s3.endpoint,
            "s3.access.key.id": cluster.s3.access_key, "s3.secret.access.key": cluster.s3.secret_key}


def test_segments_are_restored_from_their_objects_and_the_report_names_what_the_bucket_cannot_say(
    cluster: Cluster, manager_on: Callable[..., RemoteLogMetadataManager], tmp_path: Path,
) -> None:
    topic = unique_topic_name("restore-objects")
    directory, bases = rolled_segments(cluster.bootstrap, topic)
    tp = TopicIdPartition(uuid.uuid4(), topic, 0)
    epochs = [(0, 0), (NEW_EPOCH, bases[1] + NEW_EPOCH_AFTER)]
    with RemoteStorageManager(rsm_config(cluster)) as rsm:
        copied = [copy(rsm, rolled(directory, tmp_path, tp, base, next_base, epochs))
                  for base, next_base in itertools.pairwise(bases)]
        unfinished = copy(rsm, rolled(directory, tmp_path, tp, bases[0], bases[1], epochs))
        corrupt = copy(rsm, rolled(directory, tmp_path, tp, bases[0], bases[1], epochs))
    store = cluster.store()
    unfinished_keys = segment_keys(unfinished.remote_log_segment_id, bases[0], hashed=False)
    store.delete([unfinished_keys.indexes])
    corrupt_keys = segment_keys(corrupt.remote_log_segment_id, bases[0], hashed=False)
    store.put(corrupt_keys.indexes, b"not a packed index")

    plan = cluster.restore("--dry-run", "--from", "objects")

    assert plan.exit_code == 1, plan.stderr  # the unreadable object could not be restored
    assert not cluster.topic_exists()
    assert plan.report["unknown"] == {partition_name(tp): dict(OBJECTS_UNKNOWN)}
    assert [o["key"] for o in plan.report["orphans"]] == [unfinished_keys.log]
    assert [(s["key"], "TLIX" in s["reason"]) for s in plan.report["skipped"]] == [(corrupt_keys.log, True)]

    run = cluster.restore()

    assert run.exit_code == 1, run.stderr
    assert "segment objects" in run.report["source"]
    assert run.report["written_digest"] == run.report["view_digest"]
    assert (run.report["unknown"], run.report["orphans"], run.report["skipped"]) == (
        plan.report["unknown"], plan.report["orphans"], plan.report["skipped"])
    node = manager_on()
    node.wait_caught_up(30)
    register(node, tp)
    restored = node.list_remote_log_segments(tp)
    assert [dataclasses.replace(md, broker_id=3, event_timestamp_ms=0) for md in restored] == \
        [dataclasses.replace(md, event_timestamp_ms=0) for md in copied]
    assert {md.broker_id for md in restored} == {7}  # this run's broker.id: not in the bucket
    assert all(abs(md.event_timestamp_ms - want.event_timestamp_ms) < 60_000
               for md, want in zip(restored, copied, strict=True))
    assert node.remote_log_segment_metadata(tp, NEW_EPOCH, epochs[1][1]) == restored[1]
    assert node.highest_offset_for_epoch(tp, 0) == epochs[1][1] - 1


@pytest.mark.parametrize("checkpoint, start, expected", [
    (b"0\n1\n0 0\n", 100, {0: 100}),
    (b"0\n3\n0 0\n2 90\n5 150\n", 100, {2: 100, 5: 150}),
    (b"0\n2\n0 0\n4 100\n", 100, {4: 100}),
    (b"0\n0\n", 100, {}),
])
def test_a_segments_leader_epochs_are_cut_from_the_checkpoint_as_kafka_cuts_them(
    checkpoint: bytes, start: int, expected: dict[int, int],
) -> None:
    from tierlog.audit.restore import leader_epochs

    assert leader_epochs(checkpoint, start) == expected


def test_copies_that_finished_after_the_archives_newest_record_are_restored_from_their_objects(
    cluster: Cluster, manager_on: Callable[..., RemoteLogMetadataManager], tmp_path: Path,
) -> None:
    writer = manager_on()
    write_history(writer, [make_tp("orders", 0)], seed=6)
    topic = unique_topic_name("restore-tail")
    directory, bases = rolled_segments(cluster.bootstrap, topic)
    tp = TopicIdPartition(uuid.uuid4(), topic, 0)
    started = rolled(directory, tmp_path, tp, bases[1], bases[2], [(0, 0)])
    register(writer, tp)
    writer.add_remote_log_segment_metadata(started.metadata).result(30)
    archive(cluster)
    # Both copies end after the archive's newest record: their records went with the topic, unarchived.
    with RemoteStorageManager(rsm_config(cluster)) as rsm:
        unknown = copy(rsm, rolled(directory, tmp_path, tp, bases[0], bases[1], [(0, 0)]))
        finished = copy(rsm, started)
    writer.close()
    cluster.delete_metadata_topic()

    run = cluster.restore()

    assert run.exit_code == 0, run.stderr
    assert "audit archive" in run.report["source"]
    assert any("written after the archive's newest record" in note for note in run.report["notes"])
    assert any("restored as COPY_SEGMENT_FINISHED" in note for note in run.report["notes"])
    assert run.report["unknown"] == {partition_name(tp): {name: OBJECTS_UNKNOWN[name]
                                                          for name in ("broker_id", "event_timestamp_ms")}}
    node = manager_on()
    node.wait_caught_up(30)
    register(node, tp)
    assert [dataclasses.replace(md, broker_id=3, event_timestamp_ms=0) for md in node.list_remote_log_segments(tp)] \
        == [dataclasses.replace(md, event_timestamp_ms=0) for md in (unknown, finished)]
