"""Helpers for the end-to-end tests: broker-side facts (leaders, ISR, offsets, topic ids), the agent's
view of a partition, and the bucket's objects for a topic. Producing and reading back come from dev.demo.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

from dev.demo import S3Location, wait_for
from rlmm.types import RemoteLogSegmentMetadata, RemoteLogSegmentState, TopicIdPartition, kafka_uuid
from tierlog.agent.client import AgentClient


@dataclass(frozen=True)
class PartitionState:
    leader: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]


def admin(bootstrap: str) -> AdminClient:
    return AdminClient({"bootstrap.servers": bootstrap})


def describe(bootstrap: str, topic: str, partition: int = 0) -> tuple[TopicIdPartition, PartitionState]:
    from confluent_kafka import TopicCollection

    client = admin(bootstrap)  # must outlive its futures
    description = client.describe_topics(TopicCollection([topic]))[topic].result(30)
    tid = description.topic_id
    tp = TopicIdPartition(
        topic_id=kafka_uuid(tid.get_most_significant_bits(), tid.get_least_significant_bits()),
        topic=topic,
        partition=partition,
    )
    info = description.partitions[partition]
    leader = info.leader.id if info.leader is not None else -1
    return tp, PartitionState(leader, tuple(r.id for r in info.replicas), tuple(r.id for r in info.isr))


def set_topic_config(bootstrap: str, topic: str, **settings: str) -> None:
    resource = ConfigResource(
        ConfigResource.Type.TOPIC,
        topic,
        incremental_configs=[
            ConfigEntry(name.replace("_", "."), value, incremental_operation=AlterConfigOpType.SET)
            for name, value in settings.items()
        ],
    )
    client = admin(bootstrap)
    client.incremental_alter_configs([resource])[resource].result(30)


def delete_topic(bootstrap: str, topic: str) -> None:
    client = admin(bootstrap)
    client.delete_topics([topic], operation_timeout=30)[topic].result(30)


def earliest_offset(bootstrap: str, topic: str, partition: int = 0) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "tierlog-offsets"})
    try:
        low, _high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)
        return int(low)
    finally:
        consumer.close()


def agent_socket(socket_dir: Path, node_id: int) -> Path:
    return socket_dir / f"agent-{node_id}.sock"


def remote_segments(
    socket_dir: Path, node_id: int, tp: TopicIdPartition, timeout: float = 60.0
) -> list[RemoteLogSegmentMetadata]:
    """What node `node_id`'s rlmm (through its agent) lists for `tp`, once the partition has loaded there;
    [] once the partition is gone (NOT_FOUND)."""
    import grpc

    deadline = time.monotonic() + timeout
    with AgentClient(agent_socket(socket_dir, node_id)) as client:
        while True:
            try:
                return client.list_remote_log_segments(tp)
            except grpc.RpcError as exc:
                if exc.code() == grpc.StatusCode.NOT_FOUND:
                    return []
                # ABORTED: registered but still loading (after a restart); UNAVAILABLE: agent restarting;
                # FAILED_PRECONDITION: a new agent the broker has not configured yet (it does at its next call).
                waiting = (grpc.StatusCode.ABORTED, grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.FAILED_PRECONDITION)
                if exc.code() not in waiting or (
                    time.monotonic() > deadline
                ):
                    raise
            time.sleep(0.5)


def finished(segments: list[RemoteLogSegmentMetadata]) -> list[RemoteLogSegmentMetadata]:
    return [s for s in segments if s.state is RemoteLogSegmentState.COPY_SEGMENT_FINISHED]


def topic_log_objects(s3: S3Location, topic: str) -> list[str]:
    """Keys of the segment (.log) objects of `topic` under the test's prefix."""
    return sorted(o["Key"] for o in s3.objects() if o["Key"].endswith(".log") and f"/{topic}-" in o["Key"])


def topic_objects(s3: S3Location, topic: str) -> list[str]:
    return sorted(o["Key"] for o in s3.objects() if f"/{topic}-" in o["Key"])


def agent_pid(socket_dir: Path, node_id: int) -> int | None:
    """The pid of the agent answering on node `node_id`'s socket, or None if none answers."""
    with contextlib.suppress(Exception), AgentClient(agent_socket(socket_dir, node_id), timeout=2) as client:
        return client.health().pid
    return None


def wait_for_new_agent(socket_dir: Path, node_id: int, old_pid: int, timeout: float = 60.0) -> int:
    def new_pid() -> int | None:
        pid = agent_pid(socket_dir, node_id)
        return pid if pid is not None and pid != old_pid else None

    return int(wait_for(new_pid, timeout, f"a new agent for node {node_id}"))


def wait_for_leader(bootstrap: str, topic: str, not_on: int, timeout: float = 90.0) -> int:
    seen: list[object] = []

    def leader() -> tuple[int] | None:  # a tuple: node 0 is a leader too, and 0 is falsy
        try:
            state = describe(bootstrap, topic)[1]
        except Exception as exc:  # a node is down: the next attempt asks another
            seen.append(exc)
            return None
        seen.append(state)
        return (state.leader,) if state.leader >= 0 and state.leader != not_on else None

    try:
        return int(wait_for(leader, timeout, f"{topic}-0 to elect a leader other than {not_on}")[0])
    except TimeoutError as exc:
        raise TimeoutError(f"{exc}; last seen: {seen[-3:]}") from None


def wait_in_isr(bootstrap: str, topic: str, node_id: int, timeout: float = 120.0) -> None:
    wait_for(
        lambda: node_id in describe(bootstrap, topic)[1].isr, timeout, f"node {node_id} to rejoin the ISR"
    )
