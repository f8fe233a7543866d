"""Differential test of migration mode against Kafka's real TopicBasedRemoteLogMetadataManager (TBRLMM): both run on
the dev broker's `__remote_log_metadata` (TBRLMM in a JVM, tests/migrate/TbrlmmProbe.java), writes go through either
one as during a roll, and tierlog must answer every read exactly as TBRLMM does.

TBRLMM's topic name is fixed, so these tests share `__remote_log_metadata` with whatever else ran on the dev broker:
each uses user partitions of fresh topic ids, and TBRLMM only ever reads the partitions registered with it.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Sequence

import pytest
from confluent_kafka import Consumer, TopicPartition
from migrate_testkit import (
    DEADLINE_S,
    SOURCE_TOPIC,
    KafkaWrite,
    Tbrlmm,
    assert_answers_as_tbrlmm,
    source_ends,
)
from rlmm_testkit import make_tp, manager_config, segment, submit, update_of, workload
from support.topics import unique_topic_name

from dev.process import wait_until
from rlmm import RemoteLogMetadataManager
from rlmm.types import (
    RemoteLogSegmentMetadata,
    RemoteLogSegmentState,
    RemotePartitionDeleteMetadata,
    TopicIdPartition,
)
from tierlog.migration.node import MigratingManager, import_group, split_config, wrap


@pytest.fixture(scope="module")
def migrating_node(kafka_bootstrap: str, tbrlmm: Tbrlmm, tmp_path_factory: pytest.TempPathFactory
                   ) -> Iterator[Callable[..., MigratingManager]]:
    """`start(from_offsets)` a tierlog node in migration mode (a metadata topic of its own) importing
    `__remote_log_metadata` from `from_offsets` (default: its end now), as after a `tierlog migrate` up to there: the
    topic keeps every run's records on the dev broker, none of them of this test's partitions."""
    started: list[MigratingManager] = []

    def start(from_offsets: dict[int, int] | None = None) -> MigratingManager:
        topic = unique_topic_name("tbrlmm-differential")
        positions = from_offsets if from_offsets is not None else source_ends(kafka_bootstrap, tbrlmm.partitions)
        consumer = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": import_group(topic)})
        try:
            consumer.commit(offsets=[TopicPartition(SOURCE_TOPIC, p, end) for p, end in positions.items()],
                            asynchronous=False)
        finally:
            consumer.close()
        config = manager_config(kafka_bootstrap, tmp_path_factory.mktemp("node"), topic, partitions=3, **{
            "migration.mode": "dual-write", "migration.source.topic": SOURCE_TOPIC,
            "migration.control.topic": f"{topic}-control", "migration.heartbeat.ms": 200})
        own, migration = split_config(config)
        node = wrap(RemoteLogMetadataManager(own), own, migration)
        assert isinstance(node, MigratingManager)
        started.append(node)
        return node

    yield start
    for node in started:
        node.close()


# --- the workload ------------------------------------------------------------------------------------------------

def roll_workload(seed: int, partitions: int, uploads: int) -> dict[TopicIdPartition, list[KafkaWrite]]:
    """Per user partition (fresh topic ids), a broker's valid calls: rlmm_testkit.workload's uploads across leader
    epochs, re-uploads and retention, plus failed uploads cleaned up (a COPY_SEGMENT_STARTED segment deleted, as
    Kafka's RemoteLogManager does); the last partition is deleted in the end."""
    rng = random.Random(seed)
    writes: dict[TopicIdPartition, list[KafkaWrite]] = {}
    for i in range(partitions):
        tp = make_tp(f"differential-{i % 2}", i)
        calls = workload(rng, tp, uploads, delete_partition=i == partitions - 1)
        body = [c for c in calls if not isinstance(c, RemotePartitionDeleteMetadata)]
        finished = {c.remote_log_segment_id for c in body if c.state is RemoteLogSegmentState.COPY_SEGMENT_FINISHED}
        for failed in [c for c in body if isinstance(c, RemoteLogSegmentMetadata)
                       and c.remote_log_segment_id not in finished]:
            body.append(update_of(failed, RemoteLogSegmentState.DELETE_SEGMENT_STARTED))
            if rng.random() < 0.5:
                body.append(update_of(failed, RemoteLogSegmentState.DELETE_SEGMENT_FINISHED))
        writes[tp] = body + [c for c in calls if isinstance(c, RemotePartitionDeleteMetadata)]
    return writes


# --- driving both sides ------------------------------------------------------------------------------------------

def wait_imported(node: MigratingManager) -> None:
    """Until the node's import has taken in all of `__remote_log_metadata` and its view applied it."""
    wait_until(lambda: not any(node.import_lag(5.0).values()), timeout=DEADLINE_S,
               description=f"the import of {SOURCE_TOPIC}")
    node.wait_caught_up(DEADLINE_S)


def take_over(node: MigratingManager, tp: TopicIdPartition) -> None:
    """Leadership of `tp` moves to the tierlog node: it serves tp once its predecessor's writes are imported."""
    node.on_partition_leadership_changes([tp], [])
    wait_until(lambda: node.is_ready(tp), timeout=DEADLINE_S, interval=0.02,
               description=f"the tierlog node ready for {tp}")


def roll(kafka_bootstrap: str, node: MigratingManager, probe: Tbrlmm,
         writes: dict[TopicIdPartition, list[KafkaWrite]], seed: int) -> dict[str, int]:
    """Make every partition's calls in its order, partitions interleaved, each call on the broker leading the
    partition then (TBRLMM or tierlog); leadership moves now and then, the new leader catching up first."""
    rng = random.Random(seed)
    queues = {tp: list(calls) for tp, calls in writes.items()}
    leader = {tp: rng.choice(("tierlog", "tbrlmm")) for tp in queues}
    made = {"tierlog": 0, "tbrlmm": 0}
    for tp, side in leader.items():
        if side == "tierlog":
            take_over(node, tp)
    while any(queues.values()):
        tp = rng.choice([tp for tp, left in queues.items() if left])
        if rng.random() < 0.2:
            leader[tp] = "tbrlmm" if leader[tp] == "tierlog" else "tierlog"
            if leader[tp] == "tierlog":
                take_over(node, tp)
            else:
                probe.catch_up(kafka_bootstrap, [tp])
        call = queues[tp].pop(0)
        if leader[tp] == "tierlog":
            submit(node, call).result(timeout=DEADLINE_S)
        else:
            probe.write(call)
        made[leader[tp]] += 1
    return made


def caught_up_both(kafka_bootstrap: str, node: MigratingManager, probe: Tbrlmm, tps: Sequence[TopicIdPartition]
                   ) -> None:
    probe.catch_up(kafka_bootstrap, tps)
    wait_imported(node)


# --- the tests ---------------------------------------------------------------------------------------------------

def test_during_a_roll_tierlog_answers_every_read_as_kafkas_tbrlmm(
        kafka_bootstrap: str, tbrlmm: Tbrlmm, migrating_node: Callable[..., MigratingManager]) -> None:
    writes = roll_workload(seed=26, partitions=4, uploads=10)
    node = migrating_node()
    tps = list(writes)
    tbrlmm.register(tps)
    node.on_partition_leadership_changes([], tps)
    made = roll(kafka_bootstrap, node, tbrlmm, writes, seed=26)
    assert min(made.values()) > 5, made  # both sides wrote a fair share
    caught_up_both(kafka_bootstrap, node, tbrlmm, tps)
    assert assert_answers_as_tbrlmm(node, tbrlmm, writes) > 500


def test_a_node_started_later_imports_what_tbrlmm_alone_wrote_and_answers_alike(
        kafka_bootstrap: str, tbrlmm: Tbrlmm, migrating_node: Callable[..., MigratingManager]) -> None:
    writes = roll_workload(seed=27, partitions=3, uploads=8)
    tps = list(writes)
    before = source_ends(kafka_bootstrap, tbrlmm.partitions)
    tbrlmm.register(tps)
    for calls in writes.values():
        for call in calls:
            tbrlmm.write(call)
    node = migrating_node(before)  # the first broker rolled to tierlog: it imports all TBRLMM wrote
    for tp in tps:
        take_over(node, tp)
    wait_imported(node)
    assert assert_answers_as_tbrlmm(node, tbrlmm, writes) > 300


def test_tbrlmm_taking_over_partitions_tierlog_alone_wrote_answers_alike(
        kafka_bootstrap: str, tbrlmm: Tbrlmm, migrating_node: Callable[..., MigratingManager]) -> None:
    """A rollback: TBRLMM is assigned the partitions after tierlog wrote them, and replays them from the topic. (The
    deleted partition is assigned before its delete: TBRLMM's consumer thread dies on a partition assigned after its
    DELETE_PARTITION_FINISHED, a NullPointerException in RemotePartitionMetadataStore.markInitialized.)"""
    writes = roll_workload(seed=28, partitions=3, uploads=8)
    *kept, deleted = list(writes)
    tbrlmm.register([deleted])
    node = migrating_node()
    for tp, calls in writes.items():
        take_over(node, tp)
        for call in calls:
            submit(node, call).result(timeout=DEADLINE_S)
    tbrlmm.register(kept)
    tbrlmm.catch_up(kafka_bootstrap, list(writes))
    assert assert_answers_as_tbrlmm(node, tbrlmm, writes) > 300


def test_a_segments_whole_life_written_through_tierlog_completes_each_call_as_tbrlmms_would(
        kafka_bootstrap: str, tbrlmm: Tbrlmm, migrating_node: Callable[..., MigratingManager]) -> None:
    """Each call returns once its record is applied, DELETE_SEGMENT_FINISHED too (after which tierlog's view no longer
    holds the segment at all), and TBRLMM ends with the same answers."""
    tp = make_tp("whole-life", 0)
    added = segment(tp, 0, 99, {0: 0})
    writes = {tp: [added, *(update_of(added, s) for s in list(RemoteLogSegmentState)[1:])]}
    tbrlmm.register([tp])
    node = migrating_node()
    take_over(node, tp)
    for call in writes[tp]:
        submit(node, call).result(timeout=DEADLINE_S)
    tbrlmm.catch_up(kafka_bootstrap, [tp])
    assert node.list_remote_log_segments(tp) == []
    assert_answers_as_tbrlmm(node, tbrlmm, writes)


@pytest.mark.parametrize("last", ["tbrlmm", "tierlog"])
def test_two_leaders_copying_the_same_offsets_end_as_in_tbrlmm_whichever_finishes_last(
        last: str, kafka_bootstrap: str, tbrlmm: Tbrlmm, migrating_node: Callable[..., MigratingManager]) -> None:
    """The roll's race: the old leader (TBRLMM) has not finished its copy when its successor (tierlog) copies the same
    offsets; one finishes after the other."""
    tp = make_tp("race", 0)
    old, new = segment(tp, 0, 99, {0: 0}), segment(tp, 0, 99, {0: 0})
    finish = {"tbrlmm": update_of(old, RemoteLogSegmentState.COPY_SEGMENT_FINISHED),
              "tierlog": update_of(new, RemoteLogSegmentState.COPY_SEGMENT_FINISHED)}
    tbrlmm.register([tp])
    node = migrating_node()
    tbrlmm.write(old)
    take_over(node, tp)
    submit(node, new).result(timeout=DEADLINE_S)
    first = "tierlog" if last == "tbrlmm" else "tbrlmm"
    for side in (first, last):
        if side == "tbrlmm":
            tbrlmm.write(finish[side])
        else:
            submit(node, finish[side]).result(timeout=DEADLINE_S)
    caught_up_both(kafka_bootstrap, node, tbrlmm, [tp])
    assert_answers_as_tbrlmm(node, tbrlmm, {tp: [old, new]})
    assert node.remote_log_segment_metadata(tp, 0, 50) is not None
