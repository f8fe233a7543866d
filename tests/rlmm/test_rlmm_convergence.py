"""Nodes that applied the same metadata topic hold the same view, whatever their history: several writers,
a late joiner, a node rebuilt from an empty state dir, and a topic that Kafka's log cleaner has compacted.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from rlmm_testkit import (
    TopicRecord,
    compacted,
    decoded,
    drive,
    make_tp,
    partition_delete,
    read_topic,
    register,
    replay,
    segment,
    wait_digest,
    workload,
)
from support import wait_until

from dev.kafka import KafkaCluster
from rlmm import RemoteLogMetadataManager, codec
from rlmm.events import key_of
from rlmm.types import RemotePartitionDeleteState as P

MakeManager = Callable[..., RemoteLogMetadataManager]
PARTITIONS = 3
CAUGHT_UP_S = 60.0


def test_managers_writing_to_one_topic_converge_to_one_digest(make_manager: MakeManager) -> None:
    rng = random.Random(4)
    managers = [make_manager(broker_id=b, partitions=PARTITIONS) for b in range(3)]
    # Each broker leads two user partitions and follows the others, as on a real cluster.
    led = {b: [make_tp(f"topic{b}", p) for p in range(2)] for b in range(3)}
    for b, manager in enumerate(managers):
        followed = [tp for other, tps in led.items() if other != b for tp in tps]
        register(manager, *led[b])
        register(manager, *followed, leader=False)
    for b, manager in enumerate(managers):
        drive(manager, {tp: workload(rng, tp, uploads=8, delete_partition=(b == 0 and tp.partition == 1))
                        for tp in led[b]})
    for manager in managers:
        manager.wait_caught_up(CAUGHT_UP_S)
    assert len({manager.view_digest() for manager in managers}) == 1


def test_a_managers_view_equals_a_replay_of_its_topic_into_the_in_memory_state(
    make_manager: MakeManager, kafka_bootstrap: str, metadata_topic: str
) -> None:
    manager = make_manager(partitions=PARTITIONS)
    tps = [make_tp("orders", p) for p in range(3)]
    register(manager, *tps)
    drive(manager, {tp: workload(random.Random(tp.partition), tp, uploads=8) for tp in tps})
    manager.wait_caught_up(CAUGHT_UP_S)
    assert manager.view_digest() == replay(decoded(read_topic(kafka_bootstrap, metadata_topic))).digest()


def test_a_node_with_an_empty_state_dir_rebuilds_to_the_digest_of_a_node_that_was_there_all_along(
    make_manager: MakeManager
) -> None:
    veteran = make_manager(broker_id=0, partitions=PARTITIONS)
    tps = [make_tp("orders", p) for p in range(3)]
    register(veteran, *tps)
    drive(veteran, {tp: workload(random.Random(10 + tp.partition), tp, uploads=8) for tp in tps})
    veteran.wait_caught_up(CAUGHT_UP_S)
    newcomer = make_manager(broker_id=1, partitions=PARTITIONS)
    register(newcomer, *tps, leader=False)
    newcomer.wait_caught_up(CAUGHT_UP_S)
    assert newcomer.view_digest() == veteran.view_digest()


def test_a_node_that_joins_midway_and_keeps_following_ends_with_the_same_digest(make_manager: MakeManager) -> None:
    writer = make_manager(broker_id=0, partitions=PARTITIONS)
    tps = [make_tp("orders", p) for p in range(2)]
    register(writer, *tps)
    plans = {tp: workload(random.Random(20 + tp.partition), tp, uploads=10) for tp in tps}
    drive(writer, {tp: writes[: len(writes) // 2] for tp, writes in plans.items()})
    joiner = make_manager(broker_id=1, partitions=PARTITIONS)
    register(joiner, *tps, leader=False)
    drive(writer, {tp: writes[len(writes) // 2:] for tp, writes in plans.items()})
    writer.wait_caught_up(CAUGHT_UP_S)
    wait_digest(joiner, writer.view_digest())


# --- Kafka's log cleaner really compacting the topic -----------------------------------------------------

AGGRESSIVE_COMPACTION = {
    "cleanup.policy": "compact",
    "segment.ms": 200,
    "min.cleanable.dirty.ratio": 0.01,
    "min.compaction.lag.ms": 0,
    "max.compaction.lag.ms": 200,
    "delete.retention.ms": 200,
}
# The shared broker's cleaner wakes every 15 s (log.cleaner.backoff.ms): waiting for it made each test below take
# 11-17 s. A broker of the module's own, whose cleaner wakes every 300 ms, compacts within a few seconds; the bound
# is only waited out by a cleaner that never runs.
COMPACTION_WAIT_S = 90.0
FAST_CLEANER = {"log.cleaner.backoff.ms": 300}


@pytest.fixture(scope="module")
def fast_cleaning_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`bootstrap.servers` of a one-node cluster of this module's own, whose log cleaner wakes every 300 ms."""
    with KafkaCluster(tmp_path_factory.mktemp("fast-cleaner"), 1, properties=FAST_CLEANER) as cluster:
        yield cluster.bootstrap


def test_a_fresh_node_rebuilds_from_a_compacted_topic_to_the_digest_of_the_writer(
    make_manager: MakeManager, create_topic: Callable[..., str], fast_cleaning_broker: str
) -> None:
    bootstrap = fast_cleaning_broker
    topic = create_topic("rlmm-compacted", partitions=1, config=AGGRESSIVE_COMPACTION, bootstrap=bootstrap)
    on_topic = {"bootstrap.servers": bootstrap, "metadata.topic.name": topic}
    writer = make_manager(broker_id=0, partitions=1, **on_topic)
    tps = [make_tp("orders", p) for p in range(3)]
    register(writer, *tps)
    drive(writer, {tp: workload(random.Random(30 + tp.partition), tp, uploads=12) for tp in tps})
    produced = read_topic(bootstrap, topic)

    def compacted_now() -> list[TopicRecord] | None:
        # Appends roll the active segment (segment.ms), so everything written before becomes cleanable.
        ticker = make_tp("ticker")
        writer.add_remote_log_segment_metadata(segment(ticker, 0, 0, {0: 0})).result(timeout=30)
        now = read_topic(bootstrap, topic)
        return now if _offsets(produced) - _offsets(now) else None

    remaining = wait_until(compacted_now, timeout=COMPACTION_WAIT_S, interval=0.5,
                           description=f"the log cleaner compacting {topic}")
    assert len(_offsets(produced) - _offsets(remaining)) > 0
    writer.wait_caught_up(CAUGHT_UP_S)
    fresh = make_manager(broker_id=1, partitions=1, **on_topic)
    fresh.wait_caught_up(CAUGHT_UP_S)
    assert fresh.view_digest() == writer.view_digest()
    assert replay(compacted(decoded(remaining))).digest() == writer.view_digest()


def _offsets(records: list[TopicRecord]) -> set[int]:
    return {record.offset for record in records}


def test_a_node_away_while_the_cleaner_removed_its_partitions_delete_started_applies_the_delete_finished(
    make_manager: MakeManager, create_topic: Callable[..., str], fast_cleaning_broker: str, tmp_path: Path
) -> None:
    bootstrap = fast_cleaning_broker
    # Tombstones kept a day: the returning node's view is recent enough to resume, not to rebuild.
    topic = create_topic("rlmm-away", partitions=1, config={**AGGRESSIVE_COMPACTION, "delete.retention.ms": 86_400_000},
                         bootstrap=bootstrap)
    on_topic = {"bootstrap.servers": bootstrap, "metadata.topic.name": topic}
    writer = make_manager(broker_id=0, partitions=1, **on_topic)
    doomed = make_tp("doomed")
    register(writer, doomed)
    md = segment(doomed, 0, 10, {0: 0})
    writer.add_remote_log_segment_metadata(md).result(timeout=30)
    writer.put_remote_partition_delete_metadata(partition_delete(doomed, P.DELETE_PARTITION_MARKED)).result(30)
    away = make_manager(broker_id=1, partitions=1, state_dir=tmp_path / "away", **on_topic)
    away.wait_caught_up(CAUGHT_UP_S)
    assert away.view_digest() == writer.view_digest()
    away.close()

    started = partition_delete(doomed, P.DELETE_PARTITION_STARTED)
    writer.put_remote_partition_delete_metadata(started).result(30)
    writer.put_remote_partition_delete_metadata(partition_delete(doomed, P.DELETE_PARTITION_FINISHED)).result(30)
    started_key = key_of(started).encode()

    def started_removed() -> bool:
        # Appends roll the active segment (segment.ms), so the delete records become cleanable.
        writer.add_remote_log_segment_metadata(segment(make_tp("ticker"), 0, 0, {0: 0})).result(timeout=30)
        states = [codec.decode(r.value).state for r in read_topic(bootstrap, topic)  # type: ignore[union-attr]
                  if r.key == started_key and r.value is not None]
        return states == [P.DELETE_PARTITION_FINISHED]

    wait_until(started_removed, timeout=COMPACTION_WAIT_S, interval=0.5,
               description=f"the log cleaner removing the DELETE_PARTITION_STARTED record of {topic}")
    writer.wait_caught_up(CAUGHT_UP_S)
    back = make_manager(broker_id=1, partitions=1, state_dir=tmp_path / "away", **on_topic)
    back.wait_caught_up(CAUGHT_UP_S)
    assert back.record_counts()[1] == 0  # nothing dropped as an invalid transition
    assert back.view_digest() == writer.view_digest()
