"""`tierlog restore` after the metadata topic was deleted: from the newest snapshot plus the audit archive after it,
the new topic gives a new node the view digest and the answers the lost topic gave; a topic holding records is
refused."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from restore_testkit import Cluster, archive, write_history
from rlmm_testkit import make_tp, register
from support.topics import create_topic

from rlmm import RemoteLogMetadataManager, TopicIdPartition
from rlmm.errors import RemoteStorageError
from tierlog.audit.archiver import list_archive_files
from tierlog.audit.assignment import MetadataTopicDescriber
from tierlog.audit.restore import (
    RestoreMarker,
    read_marker,
    retired_topic_name,
    snapshot_topic_ids,
    write_marker,
)
from tierlog.audit.snapshots import SnapshotSettings, write_snapshot_now

EPOCHS = range(6)


def answer(call: Callable[[], Any]) -> Any:
    """A query's answer, or the kind of error it raised (a deleted partition's reads raise)."""
    try:
        return call()
    except RemoteStorageError as exc:
        return type(exc).__name__


def answers(manager: RemoteLogMetadataManager, tps: list[TopicIdPartition]) -> dict[str, Any]:
    """What a broker asks of each partition: listings, sizes and highest offsets per epoch, and a lookup of every
    third offset the segments cover."""
    found: dict[str, Any] = {}
    for tp in tps:
        register(manager, tp)
        segments = answer(lambda: manager.list_remote_log_segments(tp))  # noqa: B023 - called at once
        found[f"{tp} list"] = segments
        last = max((md.end_offset + 2 for md in segments), default=0) if isinstance(segments, list) else 0
        for epoch in EPOCHS:
            found[f"{tp} {epoch} highest"] = answer(lambda: manager.highest_offset_for_epoch(tp, epoch))  # noqa: B023
            found[f"{tp} {epoch} size"] = answer(lambda: manager.remote_log_size(tp, epoch))  # noqa: B023
            for offset in range(0, last, 3):
                found[f"{tp} {epoch} {offset}"] = answer(
                    lambda: manager.remote_log_segment_metadata(tp, epoch, offset))  # noqa: B023
    return found


def relative(key: str) -> str:
    """An archive file's key below its topic's directory: `<metadata partition>/<first>-<last>.avro`."""
    return "/".join(key.split("/")[-2:])


def test_a_deleted_metadata_topic_is_restored_from_the_snapshot_and_the_archive_after_it(
    cluster: Cluster, manager_on: Callable[..., RemoteLogMetadataManager],
) -> None:
    writer = manager_on()
    early = [make_tp("orders", p) for p in range(3)]
    late = [make_tp("payments", p) for p in range(2)]
    write_history(writer, early, seed=1, delete_last=True)
    archive(cluster)
    topic_id = MetadataTopicDescriber({"bootstrap.servers": cluster.bootstrap}, cluster.metadata_topic,
                                      None).assignment().topic_id
    assert write_snapshot_now(cluster.store(), SnapshotSettings("snapshots", cluster.metadata_topic), topic_id)
    write_history(writer, late + early[:1], seed=2)  # after the snapshot: only in the archive
    archive(cluster)
    digest, before = writer.view_digest(), answers(writer, early + late)
    writer.close()
    cluster.delete_metadata_topic()

    run = cluster.restore()

    assert run.exit_code == 0, run.stderr
    assert "snapshot of topic id" in run.report["source"] and "audit archive" in run.report["source"]
    assert run.report["view_digest"] == run.report["written_digest"] == digest
    assert run.report["skipped"] == run.report["orphans"] == [] and run.report["unknown"] == {}
    retired = run.report["archive_moved_to"].split("/")[1]  # with the lost topic's snapshots: no later restore's base
    assert snapshot_topic_ids(cluster.store(), "snapshots", cluster.metadata_topic) == []
    assert len(snapshot_topic_ids(cluster.store(), "snapshots", retired)) == 1
    node = manager_on(broker_id=1)
    node.wait_caught_up(30)
    assert node.view_digest() == digest
    assert answers(node, early + late) == before


def test_the_lost_topics_archive_moves_aside_and_the_new_topic_is_archived_from_its_first_offset(
    cluster: Cluster, manager_on: Callable[..., RemoteLogMetadataManager],
) -> None:
    writer = manager_on()
    write_history(writer, [make_tp("orders", 0)], seed=3)
    archive(cluster)
    lost_files = {relative(f.key) for f in list_archive_files(cluster.store(), cluster.metadata_topic)}
    writer.close()
    cluster.delete_metadata_topic()

    run = cluster.restore("--from", "snapshot")

    assert run.exit_code == 0, run.stderr
    retired = run.report["archive_moved_to"].split("/")[1]
    assert {relative(f.key) for f in list_archive_files(cluster.store(), retired)} == lost_files
    archive(cluster)
    new_files = list_archive_files(cluster.store(), cluster.metadata_topic)
    assert min(f.first_offset for f in new_files) == 0
    assert sum(f.last_offset - f.first_offset + 1 for f in new_files) == run.report["records"]


def test_a_metadata_topic_that_holds_records_is_refused(
    cluster: Cluster, manager_on: Callable[..., RemoteLogMetadataManager],
) -> None:
    writer = manager_on()
    write_history(writer, [make_tp("orders", 0)], seed=4)
    archive(cluster)
    topic = MetadataTopicDescriber({"bootstrap.servers": cluster.bootstrap}, cluster.metadata_topic, None)
    ends = topic.end_offsets()

    run = cluster.restore()

    assert run.exit_code == 1
    assert f"metadata topic {cluster.metadata_topic} holds" in run.stderr and "delete it first" in run.stderr
    assert topic.end_offsets() == ends


def test_a_topic_of_the_wrong_kind_is_refused_with_the_advice_to_delete_it(cluster: Cluster) -> None:
    create_topic(cluster.bootstrap, cluster.metadata_topic)  # as a broker's auto.create.topics.enable makes it

    run = cluster.restore()

    assert run.exit_code == 1
    assert "metadata.topic.num.partitions" in run.stderr and "delete it and run the restore again" in run.stderr


def test_a_restore_cut_short_while_moving_the_archive_finishes_the_move_when_run_again(
    cluster: Cluster, manager_on: Callable[..., RemoteLogMetadataManager],
) -> None:
    writer = manager_on()
    write_history(writer, [make_tp("orders", 0)], seed=5)
    archive(cluster)
    store = cluster.store()
    files = {relative(f.key) for f in list_archive_files(store, cluster.metadata_topic)}
    retired = retired_topic_name(cluster.metadata_topic, 1)
    write_marker(store, cluster.metadata_topic, RestoreMarker("moving", retired, 1))

    run = cluster.restore()

    assert run.exit_code == 0, run.stderr
    assert list_archive_files(store, cluster.metadata_topic) == []
    assert {relative(f.key) for f in list_archive_files(store, retired)} == files
    assert read_marker(store, cluster.metadata_topic) is None
