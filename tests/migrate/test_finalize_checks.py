"""What blocks `tierlog migrate finalize`: a broker that never announced migration mode, one whose heartbeat stopped
(rolled back, or its agent down), one not in dual-write state, a TBRLMM write after the last node came up, and stores
that differ by more than the writes on their way through an import."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from migrate_testkit import (
    SOURCE_PARTITIONS,
    kafka_model,
    produce_history,
    run_tierlog,
    tierlog_options,
    workload_history,
)
from rlmm_testkit import segment

from tierlog.cli.common import Settings
from tierlog.cli.kafka_metadata import describe_topic
from tierlog.cli.migrate import IN_FLIGHT_RECORDS, compare_in_one_order, finalize_blockers
from tierlog.migration.control import DUAL_WRITE, Announcement, ControlState

NOW = 1_800_000_000_000
MAX_AGE = 30_000


def _control(*nodes: Announcement) -> ControlState:
    return ControlState(nodes={a.broker_id: a for a in nodes})


def _fresh(broker: int, started: int = NOW - 60_000) -> Announcement:
    return Announcement(broker, DUAL_WRITE, started, NOW - 1000)


def test_every_broker_announced_and_fresh_blocks_nothing() -> None:
    assert finalize_blockers([0, 1, 2], _control(_fresh(0), _fresh(1), _fresh(2)), {1: NOW - 120_000}, NOW,
                             MAX_AGE) == []


def test_a_broker_that_never_announced_blocks() -> None:
    [blocker] = finalize_blockers([0, 1], _control(_fresh(0)), {}, NOW, MAX_AGE)
    assert blocker.startswith("broker 1 never announced migration mode")


def test_a_broker_whose_heartbeat_stopped_blocks() -> None:
    stale = Announcement(1, DUAL_WRITE, NOW - 600_000, NOW - 120_000)
    [blocker] = finalize_blockers([0, 1], _control(_fresh(0), stale), {}, NOW, MAX_AGE)
    assert "heartbeat is 120 s old" in blocker


def test_a_tbrlmm_write_after_the_last_node_started_blocks() -> None:
    [blocker] = finalize_blockers([0, 1], _control(_fresh(0), _fresh(1, started=NOW - 5000)), {7: NOW - 2000}, NOW,
                                  MAX_AGE)
    assert blocker.startswith("broker 7 wrote to the source topic as TopicBasedRemoteLogMetadataManager")


def test_the_stores_compared_before_finalize_agree_while_writes_are_on_their_way_through_the_import(
        kafka_bootstrap: str, create_topic: Callable[..., str], unique_topic: str, tmp_path: Path) -> None:
    source = create_topic(partitions=SOURCE_PARTITIONS)
    history = workload_history(seed=11, partitions=2, uploads=6)
    produce_history(kafka_bootstrap, source, history)
    options = tierlog_options(kafka_bootstrap, unique_topic, tmp_path / "import")
    code, done = run_tierlog("migrate", "--source-topic", source, *options)
    assert code == 0, done
    settings = Settings({}, dict(option.split("=", 1) for option in options[1::2]))
    source_topic = describe_topic(settings, source)
    assert source_topic is not None
    assert compare_in_one_order(settings, source_topic, False).ok

    # Newer records of one partition that tierlog does not hold yet: writes an import has not reached.
    model = kafka_model(history)
    tp = next(call.topic_id_partition for call in history if not model.is_deleted(call.topic_id_partition))
    later = [segment(tp, start, start + 99, {99: start}) for start in range(10_000, 10_000 + 100 * IN_FLIGHT_RECORDS,
                                                                           100)]
    produce_history(kafka_bootstrap, source, later)
    assert compare_in_one_order(settings, source_topic, False).ok
    # One more than an import can have on its way: tierlog is behind, or holds another order.
    produce_history(kafka_bootstrap, source, [segment(tp, 20_000, 20_099, {99: 20_000})])
    comparison = compare_in_one_order(settings, source_topic, False)
    assert list(comparison.differences) == [tp]
