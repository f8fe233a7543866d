"""Three brokers with tierlog's plugins: a replica that lost its disk catches up from tiered storage instead
of from offset 0, and after the leader goes away the new leader keeps tiering."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from e2e_testkit import describe, finished, remote_segments, wait_for_leader, wait_in_isr

from dev.demo import (
    consume,
    create_topic,
    local_segment_offsets,
    produce,
    tiered_topic_config,
    wait_for,
    wait_until_tiered,
)
from dev.kafka import KafkaCluster

RECORDS = 20_000
TOPIC = "replicated"


def test_wiped_replica_catches_up_from_tiered_storage_and_new_leader_keeps_tiering(
    tiered_cluster: Callable[..., KafkaCluster], socket_dir: Path
) -> None:
    cluster = tiered_cluster(nodes=3)
    create_topic(
        cluster.bootstrap,
        TOPIC,
        replication_factor=3,
        config=tiered_topic_config(**{"min.insync.replicas": "2"}),
    )
    produce(cluster.bootstrap, TOPIC, 0, RECORDS)
    tp, state = describe(cluster.bootstrap, TOPIC)
    leader = state.leader
    wait_until_tiered(cluster.log_dir(leader), TOPIC, min_local_start=RECORDS // 2)

    # A follower loses its disk: it must rebuild its log from the leader's local log start, fetching the
    # leader-epoch and producer-snapshot indexes of the tiered segment below it, not re-copy from offset 0.
    follower = next(n for n in state.replicas if n != leader)
    cluster.stop_node(follower)
    cluster.wipe_log_dir(follower)
    cluster.start_node(follower)
    wait_in_isr(cluster.bootstrap, TOPIC, follower)
    rebuilt = wait_for(lambda: local_segment_offsets(cluster.log_dir(follower), TOPIC), 60, "the rebuilt log")
    assert rebuilt[0] > 0

    # The leader goes away; a new one is elected and tiers what is produced next.
    cluster.stop_node(leader)
    new_leader = wait_for_leader(cluster.bootstrap, TOPIC, not_on=leader)
    produce(cluster.bootstrap, TOPIC, RECORDS, RECORDS)
    wait_until_tiered(cluster.log_dir(new_leader), TOPIC, min_local_start=RECORDS + RECORDS // 2, timeout=120)
    tiered_by_new_leader = [
        s
        for s in finished(remote_segments(socket_dir, new_leader, tp))
        if s.start_offset >= RECORDS and s.broker_id == new_leader
    ]
    assert tiered_by_new_leader

    read = consume(cluster.bootstrap, TOPIC, 2 * RECORDS, timeout=150)
    assert read.indexes == list(range(2 * RECORDS))
    assert not read.mismatched
