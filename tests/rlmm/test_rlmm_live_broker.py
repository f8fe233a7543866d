"""Liveness through a cluster's routine events: a broker SIGKILLed and restarted on its data dir, a leader moved.

Writes flow the whole time. Every write's future completes by its deadline, every acknowledged write is in the
view afterwards, and the same manager resumes within seconds. Each test prints its figures.
"""

from __future__ import annotations

import functools
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from confluent_kafka import Consumer, ElectionType, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from rlmm_testkit import make_tp, manager_config, segment
from support import wait_until
from support.topics import create_topic, unique_topic_name

from dev.kafka import KafkaCluster
from rlmm import RemoteLogMetadataManager, RemoteStorageError, TopicIdPartition, raw_fetch
from rlmm.events import metadata_partition_for

WRITE_TIMEOUT_S = 3.0
# A future's completion is observed by a callback on the writer's timer thread, which ticks every 50 ms.
DEADLINE_SLACK_S = 1.0
RECOVERY_LIMIT_S = 30.0
PARTITIONS = 2


@dataclass
class Write:
    segment_id: uuid.UUID
    submitted: float
    completed: float | None = None
    error: BaseException | None = None


@dataclass
class WriteLoad:
    """Adds one segment after another for `tp` until stopped, noting when each future completed and how."""

    manager: RemoteLogMetadataManager
    tp: TopicIdPartition
    writes: list[Write] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def run(self) -> None:
        offset = 0
        while not self.stop.is_set():
            md = segment(self.tp, offset, offset + 9, {0: offset})
            write = Write(md.remote_log_segment_id.id, time.monotonic())
            try:
                future = self.manager.add_remote_log_segment_metadata(md)
            except RemoteStorageError as exc:  # refused at once (e.g. a previous write still in flight)
                write.completed, write.error = time.monotonic(), exc
                self._note(write)
                self.stop.wait(0.05)
                continue
            self._note(write)
            future.add_done_callback(functools.partial(self._done, write))
            # One write per user partition at a time: wait for this one (it completes by its deadline).
            wait_until(future.done, timeout=WRITE_TIMEOUT_S + 5, interval=0.01, description="a write's future")
            offset += 10

    def _note(self, write: Write) -> None:
        with self.lock:
            self.writes.append(write)

    def _done(self, write: Write, future: Future[None]) -> None:
        write.completed, write.error = time.monotonic(), future.exception()

    def acked(self) -> list[Write]:
        with self.lock:
            return [w for w in self.writes if w.completed is not None and w.error is None]

    def acked_after(self, moment: float) -> Write | None:
        return next((w for w in self.acked() if w.submitted >= moment), None)

    def failed(self) -> list[Write]:
        with self.lock:
            return [w for w in self.writes if w.error is not None]


@pytest.fixture
def start_load() -> Iterator[Callable[[RemoteLogMetadataManager, TopicIdPartition], WriteLoad]]:
    started: list[tuple[WriteLoad, threading.Thread]] = []

    def start(manager: RemoteLogMetadataManager, tp: TopicIdPartition) -> WriteLoad:
        load = WriteLoad(manager, tp)
        thread = threading.Thread(target=load.run, name="write-load", daemon=True)
        thread.start()
        started.append((load, thread))
        return load

    try:
        yield start
    finally:
        for load, thread in started:
            load.stop.set()
            thread.join(timeout=WRITE_TIMEOUT_S + 10)


def stop_and_check(load: WriteLoad, thread_timeout_s: float = WRITE_TIMEOUT_S + 10) -> None:
    """Stop the load; every future must have completed, each within its deadline."""
    load.stop.set()
    wait_until(lambda: all(w.completed is not None for w in load.writes), timeout=thread_timeout_s,
               description="every write's future completed")
    late = [w for w in load.writes if w.completed is not None and
            w.completed - w.submitted > WRITE_TIMEOUT_S + DEADLINE_SLACK_S]
    assert late == [], f"{len(late)} futures completed after their deadline"


def assert_acked_present(manager: RemoteLogMetadataManager, load: WriteLoad) -> None:
    manager.wait_caught_up(60)
    present = {md.remote_log_segment_id.id for md in manager.list_remote_log_segments(load.tp)}
    lost = [w for w in load.acked() if w.segment_id not in present]
    assert lost == []


def new_manager(bootstrap: str, state_dir: Path, topic: str, replication: int) -> RemoteLogMetadataManager:
    return RemoteLogMetadataManager(manager_config(
        bootstrap, state_dir, topic, partitions=PARTITIONS,
        **{"write.timeout.ms": int(WRITE_TIMEOUT_S * 1000),
           "metadata.topic.replication.factor": replication,
           "metadata.topic.min.insync.replicas": min(2, replication)},
    ))


def wait_ready(manager: RemoteLogMetadataManager, tp: TopicIdPartition, timeout: float) -> float:
    started = time.monotonic()
    manager.on_partition_leadership_changes({tp}, set())
    wait_until(lambda: manager.is_ready(tp), timeout=timeout, description=f"{tp} ready")
    return time.monotonic() - started


def test_broker_killed_and_restarted_writes_fail_by_deadline_then_the_same_manager_resumes(
    make_kafka_cluster: Callable[..., KafkaCluster],
    start_load: Callable[[RemoteLogMetadataManager, TopicIdPartition], WriteLoad], tmp_path: Path,
) -> None:
    cluster = make_kafka_cluster(nodes=1)
    manager = new_manager(cluster.bootstrap, tmp_path / "state", unique_topic_name("live-restart"), 1)
    try:
        tp = make_tp("restart")
        wait_ready(manager, tp, 30)
        load = start_load(manager, tp)
        wait_until(lambda: len(load.acked()) >= 5, timeout=30, description="writes before the kill")

        cluster.kill_node(0)
        killed = time.monotonic()
        wait_until(lambda: any(w.submitted >= killed for w in load.failed()), timeout=WRITE_TIMEOUT_S * 4,
                   description="a write during the outage failing by its deadline")
        with pytest.raises(RemoteStorageError):
            manager.wait_caught_up(2)

        cluster.start_node(0)
        restarted = time.monotonic()
        first = wait_until(lambda: load.acked_after(restarted), timeout=RECOVERY_LIMIT_S,
                           description="a write acknowledged after the restart")
        assert first.completed is not None
        recovered_s = first.completed - restarted
        # A partition registered after the restart needs end offsets, which a fenced admin client never got.
        ready_s = wait_ready(manager, make_tp("restart-new"), RECOVERY_LIMIT_S)
        stop_and_check(load)
        assert_acked_present(manager, load)
        print(f"\n1-node kill/restart: acked={len(load.acked())} failed={len(load.failed())} lost=0 "
              f"recovered_in={recovered_s:.2f}s new_partition_ready_in={ready_s:.2f}s")
    finally:
        manager.close()


def leader_of(bootstrap: str, topic: str, partition: int) -> int:
    metadata = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=10)
    return metadata.topics[topic].partitions[partition].leader


def test_three_brokers_leader_killed_restarted_and_moved_back_while_writes_flow(
    kafka_cluster3: KafkaCluster,
    start_load: Callable[[RemoteLogMetadataManager, TopicIdPartition], WriteLoad], tmp_path: Path,
) -> None:
    cluster = kafka_cluster3
    topic = unique_topic_name("live-cluster3")
    manager = new_manager(cluster.bootstrap, tmp_path / "state", topic, 3)
    try:
        tp = make_tp("moved")
        mp = metadata_partition_for(tp.topic_id, tp.partition, PARTITIONS)
        wait_ready(manager, tp, 30)
        load = start_load(manager, tp)
        wait_until(lambda: len(load.acked()) >= 5, timeout=30, description="writes before the kill")

        leader = leader_of(cluster.bootstrap, topic, mp)
        cluster.kill_node(leader)
        killed = time.monotonic()
        first = wait_until(lambda: load.acked_after(killed), timeout=RECOVERY_LIMIT_S,
                           description="a write acknowledged by the new leader")
        assert first.completed is not None
        failover_s = first.completed - killed
        cluster.start_node(leader)

        # Move leadership back to the restarted broker once it is in sync again.
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
        wait_until(lambda: leader in admin.list_topics(topic, timeout=10).topics[topic].partitions[mp].isrs,
                   timeout=60, description="the restarted broker back in sync")
        wait_until(lambda: _elect_preferred(admin, topic, mp) or leader_of(cluster.bootstrap, topic, mp) == leader,
                   timeout=60, description="leadership moved back")
        moved = time.monotonic()
        after_move = wait_until(lambda: load.acked_after(moved), timeout=RECOVERY_LIMIT_S,
                                description="a write acknowledged after the move")
        assert after_move.completed is not None
        ready_s = wait_ready(manager, make_tp("moved-new"), RECOVERY_LIMIT_S)
        stop_and_check(load)
        assert_acked_present(manager, load)
        print(f"\n3-node leader kill/restart/move: acked={len(load.acked())} failed={len(load.failed())} lost=0 "
              f"failover_in={failover_s:.2f}s after_move_in={after_move.completed - moved:.2f}s "
              f"new_partition_ready_in={ready_s:.2f}s")
    finally:
        manager.close()


def test_raw_batches_are_read_from_each_partitions_leader_and_after_a_leader_is_killed(
    kafka_cluster3: KafkaCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A new node's worker reads a group's metadata partitions as raw batches (rlmm.raw_fetch) from whichever broker
    # leads each; a leader killed mid-read sends it to the new leader, and it reads what the consumer reads.
    cluster = kafka_cluster3
    topic = create_topic(cluster.bootstrap, unique_topic_name("raw-cluster3"), partitions=3, replication_factor=3,
                         config={"min.insync.replicas": 2})
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all", "batch.size": 2000, "linger.ms": 5})
    for number in range(6000):
        producer.produce(topic, key=b"segment:%d" % (number % 500), value=b"v" * (number % 90), partition=number % 3)
    assert producer.flush(60) == 0
    ends = {p: 2000 for p in range(3)}
    assert len({leader_of(cluster.bootstrap, topic, p) for p in ends}) > 1  # spread over brokers
    monkeypatch.setattr(raw_fetch, "_PARTITION_MAX_BYTES", 3000)  # many fetches: the kill lands mid-read
    victim = leader_of(cluster.bootstrap, topic, 0)
    reader = raw_fetch.RawReader(topic, {"bootstrap.servers": cluster.bootstrap}, 10)
    got: dict[int, list[tuple[int, bytes | None, bytes | None]]] = {p: [] for p in ends}
    try:
        for partition, records in reader.read(dict.fromkeys(ends, 0), ends, RECOVERY_LIMIT_S):
            got[partition] += records
            if partition == 0 and cluster.is_running(victim) and len(got[0]) > 200:
                cluster.kill_node(victim)
    finally:
        reader.close()
        if not cluster.is_running(victim):
            cluster.start_node(victim)
    assert leader_of(cluster.bootstrap, topic, 0) != victim
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": "tierlog-test-unused",
                         "enable.auto.commit": False})
    try:
        for p, end in ends.items():
            consumer.assign([TopicPartition(topic, p, 0)])
            expected: list[tuple[int, bytes | None, bytes | None]] = []
            while len(expected) < end:
                message = consumer.poll(10)
                assert message is not None and message.error() is None, message
                expected.append((message.offset(), message.key(), message.value()))  # type: ignore[arg-type]
            assert got[p] == expected
    finally:
        consumer.close()


def _elect_preferred(admin: AdminClient, topic: str, partition: int) -> bool:
    futures = admin.elect_leaders(ElectionType.PREFERRED, [TopicPartition(topic, partition)])
    futures.result(timeout=10)
    return False


def test_a_write_waiting_for_room_in_the_producer_queue_fails_by_its_deadline_without_blocking_readers(
    make_kafka_cluster: Callable[..., KafkaCluster], tmp_path: Path
) -> None:
    cluster = make_kafka_cluster(nodes=1)
    # The record holding the slot times out of librdkafka's queue well after the blocked write's deadline, and
    # before the manager's close gives up flushing: left queued, its delivery callback kept the producer alive,
    # reconnecting to the stopped broker, until the interpreter exited.
    queued_for_ms = int((WRITE_TIMEOUT_S * 2 + DEADLINE_SLACK_S) * 1000)
    config = manager_config(cluster.bootstrap, tmp_path / "state", unique_topic_name("live-queue"),
                            partitions=PARTITIONS, **{"write.timeout.ms": int(WRITE_TIMEOUT_S * 1000),
                                                      "kafka.queue.buffering.max.messages": 1,
                                                      "kafka.message.timeout.ms": queued_for_ms})
    manager = RemoteLogMetadataManager(config)
    try:
        queued, blocked = make_tp("queued"), make_tp("blocked")
        wait_ready(manager, queued, 30)
        wait_ready(manager, blocked, 30)
        cluster.kill_node(0)
        # The only queue slot stays taken: nothing can be delivered while the broker is down.
        first = manager.add_remote_log_segment_metadata(segment(queued, 0, 9, {0: 0}))
        outcome: list[BaseException | None] = []
        caller = threading.Thread(target=lambda: outcome.append(
            manager.add_remote_log_segment_metadata(segment(blocked, 0, 9, {0: 0})).exception()))
        started = time.monotonic()
        caller.start()
        reads: list[object] = []

        def read() -> None:
            reads.append((manager.list_remote_log_segments(queued), manager.is_ready(blocked)))

        while caller.is_alive() and time.monotonic() - started < WRITE_TIMEOUT_S - 0.5:
            reader = threading.Thread(target=read, daemon=True)
            reader.start()
            reader.join(timeout=0.5)
            assert not reader.is_alive(), "a read waited for the write stuck on the full producer queue"
        assert reads and all(r == ([], True) for r in reads)
        caller.join(timeout=WRITE_TIMEOUT_S + 5)
        assert time.monotonic() - started <= WRITE_TIMEOUT_S + DEADLINE_SLACK_S
        assert len(outcome) == 1 and "producer queue" in str(outcome[0])
        assert first.exception(timeout=WRITE_TIMEOUT_S + 5) is not None
    finally:
        manager.close()
