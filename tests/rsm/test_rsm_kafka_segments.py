"""Round trips of real Kafka segment files: produced to the real broker, taken from its log directory.

The topic rolls 1 MiB segments and indexes every batch; a transactional producer aborts some
transactions so that rolled segments carry a `.txnindex`.
"""

from __future__ import annotations

import itertools
import random
import shutil
import struct
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka import Producer
from rsm_testkit import SegmentFixture, metadata_for
from support.topics import create_topic, unique_topic_name

from rlmm.types import RemoteLogSegmentId, TopicIdPartition
from rsm import IndexType, LogSegmentData, RemoteStorageManager

SEGMENT_BYTES = 1 << 20
RECORD_BYTES = 8 * 1024


@dataclass(frozen=True)
class RolledSegment:
    base_offset: int
    fixture: SegmentFixture


def _produce(bootstrap: str, topic: str) -> None:
    """About 3.3 MiB in transactions; every third is aborted, so aborted-transaction markers land in
    every segment."""
    rng = random.Random(11)
    producer = Producer({
        "bootstrap.servers": bootstrap,
        "transactional.id": f"rsm-test-{topic}",
        "linger.ms": 5,
        "compression.type": "none",
    })
    producer.init_transactions(30)
    for txn in range(20):
        producer.begin_transaction()
        for _ in range(20):
            producer.produce(topic, rng.randbytes(RECORD_BYTES), key=b"k")
        if txn % 3 == 1:
            # Flush first: aborting purges unsent records, and a transaction with no records in the
            # partition leaves no marker (and so no .txnindex entry) there.
            producer.flush(30)
            producer.abort_transaction(30)
        else:
            producer.commit_transaction(30)
    producer.flush(30)


def _wait_for_rolled_segments(partition_dir: Path, count: int) -> list[int]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        bases = sorted(int(p.stem) for p in partition_dir.glob("*.log"))
        if len(bases) > count:
            return bases
        time.sleep(0.5)
    raise AssertionError(f"{partition_dir} did not roll {count} segments within 60 s")


@pytest.fixture(scope="module")
def rolled_segments(
    kafka_bootstrap: str, kafka_log_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> list[RolledSegment]:
    """Copies of every rolled segment's files, as the broker would hand them to copy_log_segment_data."""
    topic = unique_topic_name("rsm-segments")
    config = {"segment.bytes": SEGMENT_BYTES, "index.interval.bytes": 1, "retention.ms": -1}
    create_topic(kafka_bootstrap, topic, config=config)
    _produce(kafka_bootstrap, topic)
    partition_dir = kafka_log_dir / f"{topic}-0"
    bases = _wait_for_rolled_segments(partition_dir, 2)
    copy_dir = tmp_path_factory.mktemp("kafka-segments")
    epochs = (partition_dir / "leader-epoch-checkpoint").read_bytes()
    tp = TopicIdPartition(uuid.uuid4(), topic, 0)
    rolled = []
    for base, next_base in itertools.pairwise(bases):
        name = f"{base:020d}"

        def take(suffix: str, source_name: str = name) -> Path:
            source = partition_dir / f"{source_name}{suffix}"
            target = copy_dir / source.name
            shutil.copyfile(source, target)
            return target

        txn = partition_dir / f"{name}.txnindex"
        data = LogSegmentData(
            log_segment=take(".log"),
            offset_index=take(".index"),
            time_index=take(".timeindex"),
            transaction_index=take(".txnindex") if txn.exists() else None,
            # Kafka uploads the producer snapshot taken when the next segment was rolled.
            producer_snapshot_index=take(".snapshot", f"{next_base:020d}"),
            leader_epoch_index=epochs,
        )
        size = data.log_segment.stat().st_size
        metadata = metadata_for(RemoteLogSegmentId.generate(tp), size, start_offset=base)
        rolled.append(RolledSegment(base, SegmentFixture(metadata, data)))
    return rolled


def _copy(manager: RemoteStorageManager, segment: RolledSegment) -> SegmentFixture:
    fixture = segment.fixture
    custom = manager.copy_log_segment_data(fixture.metadata, fixture.data)
    return SegmentFixture(fixture.with_custom_metadata(custom), fixture.data)


def test_the_broker_rolled_segments_with_every_index_file(rolled_segments: list[RolledSegment]) -> None:
    assert len(rolled_segments) >= 2
    assert any(s.fixture.data.transaction_index is not None for s in rolled_segments)
    assert all(s.fixture.data.offset_index.stat().st_size > 0 for s in rolled_segments)


def test_every_index_of_a_real_segment_round_trips(
    manager: RemoteStorageManager, rolled_segments: list[RolledSegment]
) -> None:
    for segment in rolled_segments:
        copied = _copy(manager, segment)
        fetched = manager.fetch_indexes(copied.metadata, list(IndexType))
        assert {t: s.read() for t, s in fetched.items()} == copied.index_bytes()


def test_ranged_fetches_of_a_real_segment_equal_the_files_bytes(
    manager: RemoteStorageManager, rolled_segments: list[RolledSegment]
) -> None:
    copied = _copy(manager, rolled_segments[0])
    expected = copied.log_bytes
    rng = random.Random(5)
    for _ in range(20):
        start = rng.randrange(len(expected))
        end = rng.choice([None, rng.randrange(start, len(expected)), len(expected) + 100])
        with manager.fetch_log_segment(copied.metadata, start, end) as stream:
            stop = len(expected) if end is None else min(end + 1, len(expected))
            assert stream.read() == expected[start:stop]


def test_offset_index_entries_fetched_remotely_point_at_the_batches_they_name(
    manager: RemoteStorageManager, rolled_segments: list[RolledSegment]
) -> None:
    """What the broker does with them: look up an offset, then fetch the batch at that position."""
    segment = rolled_segments[0]
    copied = _copy(manager, segment)
    with manager.fetch_index(copied.metadata, IndexType.OFFSET) as stream:
        index = stream.read()
    entries = [struct.unpack_from(">ii", index, i) for i in range(0, len(index), 8)]
    assert len(entries) > 1
    for relative_offset, position in entries[:: max(1, len(entries) // 10)]:
        with manager.fetch_log_segment(copied.metadata, position, position + 60) as batch:
            header = batch.read()
        base_offset = struct.unpack_from(">q", header, 0)[0]
        last_offset_delta = struct.unpack_from(">i", header, 23)[0]
        assert base_offset + last_offset_delta == segment.base_offset + relative_offset
