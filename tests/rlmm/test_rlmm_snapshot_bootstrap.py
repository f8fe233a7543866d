"""Snapshot bootstrap: a node with an empty state dir starts from the newest snapshot in the bucket, then tails
the topic, and ends equal to a node that rebuilt from the topic; a bad snapshot falls back to the topic."""

from __future__ import annotations

import io
import logging
import random
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

import pytest
from confluent_kafka.admin import AdminClient
from rlmm_testkit import drive, make_tp, manager_config, register, wait_digest, workload
from support.spark import s3_settings

from dev.s3 import S3Endpoint
from rlmm import RemoteLogMetadataManager, applier
from rlmm.archive import TABLES_FORMAT, SnapshotHeader, read_snapshot, write_chunked_view_snapshot, write_snapshot
from rlmm.bootstrap import (
    SnapshotSource,
    TopicPosition,
    bootstrap_from_snapshot,
    list_snapshots,
    snapshot_key,
)
from rlmm.errors import RemoteStorageError
from rlmm.event_log import check_topic
from rlmm.lineage import pending_checkpoint
from rlmm.snapshot import holds_everything_until, load_into, snapshot_entries, write_view_snapshot
from rlmm.types import TopicIdPartition
from rlmm.view import MetadataView
from rsm.backend import StorageBackend
from rsm.snapshot_source import BucketSnapshotSource
from tierlog.agent.components import ComponentName
from tierlog.agent.server import AgentServer
from tierlog.audit.archiver import Archiver, ArchiverSettings
from tierlog.audit.snapshots import (
    SnapshotSettings,
    archived_records,
    metadata_topic_now,
    write_snapshot_now,
    write_snapshot_of_view,
)
from tierlog.pipeline.locations import open_store

PARTITIONS = 2
LOCATION = "snapshots"


@pytest.fixture
def store_prefix() -> str:
    return f"bootstrap-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def store(s3_endpoint: S3Endpoint, store_prefix: str) -> Iterator[StorageBackend]:
    """A fresh prefix of the dev bucket, emptied after the test."""
    backend = open_store(f"s3://{s3_endpoint.bucket}/{store_prefix}", s3_settings(s3_endpoint))
    try:
        yield backend
    finally:
        keys = [info.key for info in backend.list("")]
        if keys:
            backend.delete(keys)
        backend.close()


def _node(kafka_bootstrap: str, metadata_topic: str, state_dir: Path, source: SnapshotSource,
          **extra: Any) -> RemoteLogMetadataManager:
    """A new node whose state dir is empty, configured with the snapshot location."""
    config = manager_config(kafka_bootstrap, state_dir, metadata_topic, partitions=PARTITIONS,
                            **{"snapshot.location": LOCATION, **extra})
    return RemoteLogMetadataManager(config, snapshot_source=source)


def _history(manager: RemoteLogMetadataManager, seed: int, partitions: int) -> list[TopicIdPartition]:
    """Segments uploaded, finished and deleted on `partitions` new user partitions, through `manager`; those."""
    rng = random.Random(seed)
    tps = [make_tp(f"bootstrap-{seed}", p) for p in range(partitions)]
    register(manager, *tps)
    drive(manager, {tp: workload(rng, tp, uploads=12) for tp in tps})
    return tps


def _topic_id(kafka_bootstrap: str, metadata_topic: str) -> str:
    return check_topic(AdminClient({"bootstrap.servers": kafka_bootstrap}), metadata_topic, PARTITIONS, 30).topic_id


def _snapshot(kafka_bootstrap: str, metadata_topic: str, store: StorageBackend) -> str:
    Archiver(store, ArchiverSettings(kafka_bootstrap, metadata_topic)).run_until_caught_up(timeout_s=60)
    key = write_snapshot_now(store, SnapshotSettings(LOCATION, metadata_topic), _topic_id(kafka_bootstrap,
                                                                                            metadata_topic))
    assert key is not None
    return key


def test_a_node_bootstrapped_from_a_snapshot_and_the_topic_tail_equals_a_full_rebuild(
    make_manager: Callable[..., RemoteLogMetadataManager], kafka_bootstrap: str, metadata_topic: str,
    store: StorageBackend, tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    writer = make_manager(partitions=PARTITIONS)
    _history(writer, seed=1, partitions=4)
    _snapshot(kafka_bootstrap, metadata_topic, store)
    _history(writer, seed=2, partitions=3)  # after the snapshot: only the topic has these
    expected = writer.view_digest()

    with caplog.at_level(logging.INFO, logger="rlmm.bootstrap"), \
            _node(kafka_bootstrap, metadata_topic, tmp_path / "from-snapshot", BucketSnapshotSource(store)) as node:
        assert any("bootstrapped" in r.getMessage() for r in caplog.records)
        rebuilt = make_manager(partitions=PARTITIONS, state_dir=tmp_path / "from-topic")
        wait_digest(rebuilt, expected)
        wait_digest(node, expected)


def test_a_corrupt_snapshot_falls_back_to_the_topic_with_a_log_line(
    make_manager: Callable[..., RemoteLogMetadataManager], kafka_bootstrap: str, metadata_topic: str,
    store: StorageBackend, tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    writer = make_manager(partitions=PARTITIONS)
    _history(writer, seed=3, partitions=3)
    key = _snapshot(kafka_bootstrap, metadata_topic, store)
    source = BucketSnapshotSource(store)
    data = bytearray(source.read(key))
    data[len(data) // 2] ^= 0xFF
    store.put(key, bytes(data))
    expected = writer.view_digest()

    with caplog.at_level(logging.INFO, logger="rlmm.bootstrap"), \
            _node(kafka_bootstrap, metadata_topic, tmp_path / "node", source) as node:
        assert any("corrupt" in r.getMessage() and key in r.getMessage() for r in caplog.records)
        assert not any("bootstrapped" in r.getMessage() for r in caplog.records)
        wait_digest(node, expected)


def test_a_snapshot_older_than_the_allowed_age_falls_back_to_the_topic_with_a_log_line(
    make_manager: Callable[..., RemoteLogMetadataManager], kafka_bootstrap: str, metadata_topic: str,
    store: StorageBackend, tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    writer = make_manager(partitions=PARTITIONS)
    _history(writer, seed=4, partitions=2)
    _snapshot(kafka_bootstrap, metadata_topic, store)
    expected = writer.view_digest()

    with caplog.at_level(logging.INFO, logger="rlmm.bootstrap"), \
            _node(kafka_bootstrap, metadata_topic, tmp_path / "node", BucketSnapshotSource(store),
                  **{"snapshot.max.age.ms": 0}) as node:
        assert any("stale" in r.getMessage() for r in caplog.records)
        assert not any("bootstrapped" in r.getMessage() for r in caplog.records)
        wait_digest(node, expected)


def test_a_new_snapshot_is_written_only_when_the_archive_moved_on(
    make_manager: Callable[..., RemoteLogMetadataManager], kafka_bootstrap: str, metadata_topic: str,
    store: StorageBackend,
) -> None:
    writer = make_manager(partitions=PARTITIONS)
    _history(writer, seed=5, partitions=2)
    _snapshot(kafka_bootstrap, metadata_topic, store)
    topic_id = _topic_id(kafka_bootstrap, metadata_topic)
    settings = SnapshotSettings(LOCATION, metadata_topic)
    assert write_snapshot_now(store, settings, topic_id) is None
    _history(writer, seed=6, partitions=1)
    Archiver(store, ArchiverSettings(kafka_bootstrap, metadata_topic)).run_until_caught_up(timeout_s=60)
    second = write_snapshot_now(store, settings, topic_id)
    assert second is not None
    refs = list_snapshots(BucketSnapshotSource(store), LOCATION, metadata_topic, topic_id)
    assert refs[0].key == second


class _UnreachableBucket:
    """A bucket that cannot be reached: an outage the real S3 server cannot produce on demand."""

    def list_keys(self, prefix: str) -> list[str]:
        raise ConnectionError(f"could not connect to the endpoint while listing {prefix}")

    def open(self, key: str) -> BinaryIO:
        raise ConnectionError(f"could not connect to the endpoint while reading {key}")


def test_an_unreachable_bucket_falls_back_to_the_topic_with_a_log_line(
    make_manager: Callable[..., RemoteLogMetadataManager], kafka_bootstrap: str, metadata_topic: str,
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    writer = make_manager(partitions=PARTITIONS)
    _history(writer, seed=8, partitions=2)
    expected = writer.view_digest()

    with caplog.at_level(logging.INFO, logger="rlmm.bootstrap"), \
            _node(kafka_bootstrap, metadata_topic, tmp_path / "node", _UnreachableBucket()) as node:
        assert any("cannot list snapshots" in r.getMessage() for r in caplog.records)
        wait_digest(node, expected)


def test_a_snapshot_of_another_topic_falls_back_to_the_topic_with_a_log_line(
    make_manager: Callable[..., RemoteLogMetadataManager], kafka_bootstrap: str, metadata_topic: str,
    store: StorageBackend, tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    writer = make_manager(partitions=PARTITIONS)
    _history(writer, seed=9, partitions=2)
    expected = writer.view_digest()
    stranger = io.BytesIO()
    write_snapshot(stranger, "some-other-topic", [], {0: 1})
    topic_id = _topic_id(kafka_bootstrap, metadata_topic)
    data = stranger.getvalue()
    store.put(snapshot_key(LOCATION, metadata_topic, topic_id, int(time.time() * 1000), data), data)

    with caplog.at_level(logging.INFO, logger="rlmm.bootstrap"), \
            _node(kafka_bootstrap, metadata_topic, tmp_path / "node", BucketSnapshotSource(store)) as node:
        assert any("some-other-topic" in r.getMessage() for r in caplog.records)
        assert not any("bootstrapped" in r.getMessage() for r in caplog.records)
        wait_digest(node, expected)


def test_an_agent_with_a_snapshot_location_bootstraps_its_rlmm_from_its_rsms_bucket(
    make_manager: Callable[..., RemoteLogMetadataManager], kafka_bootstrap: str, metadata_topic: str,
    s3_endpoint: S3Endpoint, store: StorageBackend, store_prefix: str, tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    writer = make_manager(partitions=PARTITIONS)
    _history(writer, seed=5, partitions=3)
    _snapshot(kafka_bootstrap, metadata_topic, store)
    expected = writer.view_digest()
    rlmm = {**manager_config(kafka_bootstrap, tmp_path / "agent-state", metadata_topic, partitions=PARTITIONS),
            "snapshot.location": LOCATION}
    rsm = {"storage.backend": "s3", "s3.bucket": s3_endpoint.bucket, "s3.prefix": store_prefix,
           "s3.endpoint.url": s3_endpoint.endpoint, "s3.access.key.id": s3_endpoint.access_key,
           "s3.secret.access.key": s3_endpoint.secret_key, "s3.region": s3_endpoint.region}
    config = {**{f"rlmm.{k}": str(v) for k, v in rlmm.items()}, **{f"rsm.{k}": v for k, v in rsm.items()}}
    agent = AgentServer(config, tmp_path / "agent.sock")
    try:
        with caplog.at_level(logging.INFO, logger="rlmm.bootstrap"):
            agent.start()
            node = agent.components.get(ComponentName.REMOTE_LOG_METADATA_MANAGER, 60)
            wait_digest(node, expected)
        assert any("bootstrapped" in r.getMessage() for r in caplog.records)
    finally:
        agent.stop()


def _put_snapshot(store: StorageBackend, metadata_topic: str, topic_id: str, data: bytes) -> str:
    """Store snapshot bytes under their own digest, as the newest snapshot."""
    key = snapshot_key(LOCATION, metadata_topic, topic_id, int(time.time() * 1000), data)
    store.put(key, data)
    return key


def _format_1_snapshot(store: StorageBackend, metadata_topic: str) -> bytes:
    """A snapshot as tierlog wrote them before format 2 (and the Spark job still does): archive records, replayed."""
    records = list(archived_records(store, metadata_topic, {}))
    ends = {p: max(d["offset"] for d in records if d["metadata_partition"] == p) + 1
            for p in {d["metadata_partition"] for d in records}}
    out = io.BytesIO()
    write_snapshot(out, metadata_topic, records, ends)
    return out.getvalue()


def _lookups(manager: RemoteLogMetadataManager, tps: list[Any]) -> list[object]:
    """Every answer a broker asks for, for each segment listed: listing, size, highest offset, floor lookup."""
    answers: list[object] = []
    for tp in tps:
        listed = manager.list_remote_log_segments(tp)
        answers.append(listed)
        for md in listed:
            for epoch, start in md.segment_leader_epochs.items():
                answers += [manager.highest_offset_for_epoch(tp, epoch), manager.remote_log_size(tp, epoch),
                            manager.remote_log_segment_metadata(tp, epoch, start),
                            manager.next_segment_with_txn_index(tp, epoch, start)]
    return answers


def _bookkeeping(state_dir: Path) -> tuple[list[tuple[str, bytes, bytes]], list[object]]:
    """A closed node's whole view (partition bookkeeping included) and the checkpoint its next write appends."""
    view = MetadataView.open(state_dir, read_only=True)
    try:
        return list(snapshot_entries(view)), [pending_checkpoint(view, tp, 1, 0) for tp in view.user_partitions()]
    finally:
        view.close()


def test_a_node_bootstrapped_from_a_view_snapshot_equals_a_topic_rebuild_in_lookups_and_bookkeeping(
    make_manager: Callable[..., RemoteLogMetadataManager], kafka_bootstrap: str, metadata_topic: str,
    store: StorageBackend, tmp_path: Path,
) -> None:
    writer = make_manager(partitions=PARTITIONS)
    tps = _history(writer, seed=11, partitions=4)
    key = _snapshot(kafka_bootstrap, metadata_topic, store)
    header, _ = read_snapshot(io.BytesIO(BucketSnapshotSource(store).read(key)))
    assert header.format == TABLES_FORMAT and header.view_digest == writer.view_digest()
    tps += _history(writer, seed=12, partitions=2)
    expected = writer.view_digest()

    node = _node(kafka_bootstrap, metadata_topic, tmp_path / "from-snapshot", BucketSnapshotSource(store))
    rebuilt = make_manager(partitions=PARTITIONS, state_dir=tmp_path / "from-topic")
    try:
        for manager in (node, rebuilt):
            register(manager, *tps)
            wait_digest(manager, expected)
            manager.wait_caught_up(60)
        assert _lookups(node, tps) == _lookups(rebuilt, tps) == _lookups(writer, tps)
        assert all(node.list_remote_log_segments(tp) for tp in tps)
        assert node.applied_offsets() == rebuilt.applied_offsets()
    finally:
        node.close()
        rebuilt.close()
    assert _bookkeeping(tmp_path / "from-snapshot") == _bookkeeping(tmp_path / "from-topic")


def _entries_of(data: bytes, scratch: Path) -> tuple[SnapshotHeader, list[tuple[str, bytes, bytes]]]:
    """A view snapshot's header and the entries it holds, whatever its format (loaded into a scratch view)."""
    header, datums = read_snapshot(io.BytesIO(data))
    view = MetadataView.open(scratch)
    try:
        load_into(view, header, datums)
        return header, list(snapshot_entries(view))
    finally:
        view.close()


def _forge_entries(kafka_bootstrap: str, metadata_topic: str, store: StorageBackend, scratch: Path) -> str:
    """Replace the newest snapshot with one whose entries differ from what its digest states (a writer bug: its
    sha256 still matches, so only the view digest tells; a format 2 file, whose entries a reader hashes, as earlier
    releases wrote); the forged snapshot's key."""
    good = _snapshot(kafka_bootstrap, metadata_topic, store)
    header, entries = _entries_of(BucketSnapshotSource(store).read(good), scratch)
    family, entry_key, value = entries[len(entries) // 2]
    entries[len(entries) // 2] = (family, entry_key, value[:-1])
    forged = io.BytesIO()
    assert header.view_digest is not None
    write_chunked_view_snapshot(forged, metadata_topic, entries, header.end_offsets, header.view_digest)
    store.delete([good])
    return _put_snapshot(store, metadata_topic, _topic_id(kafka_bootstrap, metadata_topic), forged.getvalue())


def test_a_snapshot_whose_entries_do_not_make_its_digest_falls_back_to_the_topic_with_a_log_line(
    make_manager: Callable[..., RemoteLogMetadataManager], kafka_bootstrap: str, metadata_topic: str,
    store: StorageBackend, tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    writer = make_manager(partitions=PARTITIONS)
    _history(writer, seed=13, partitions=2)
    bad = _forge_entries(kafka_bootstrap, metadata_topic, store, tmp_path / "scratch")
    expected = writer.view_digest()

    with caplog.at_level(logging.INFO, logger="rlmm.bootstrap"), \
            _node(kafka_bootstrap, metadata_topic, tmp_path / "node", BucketSnapshotSource(store)) as node:
        assert any("unusable" in r.getMessage() and bad in r.getMessage() and "digest" in r.getMessage()
                   for r in caplog.records)
        assert not any("bootstrapped" in r.getMessage() for r in caplog.records)
        wait_digest(node, expected)


def _bootstrap_empty_view(state_dir: Path, store: StorageBackend, metadata_topic: str, position: TopicPosition
                          ) -> tuple[object, bool]:
    """Bootstrap a new empty view from the newest snapshot: what it returned, and whether the view holds entries."""
    view = MetadataView.open(state_dir)
    try:
        loaded = bootstrap_from_snapshot(view, BucketSnapshotSource(store), LOCATION, metadata_topic, position,
                                         int(time.time() * 1000))
        return loaded, view.holds_entries()
    finally:
        view.close()


def test_a_snapshot_whose_entries_do_not_make_its_digest_leaves_the_view_empty(
    make_manager: Callable[..., RemoteLogMetadataManager], kafka_bootstrap: str, metadata_topic: str,
    store: StorageBackend, tmp_path: Path,
) -> None:
    writer = make_manager(partitions=PARTITIONS)
    _history(writer, seed=20, partitions=1)
    _forge_entries(kafka_bootstrap, metadata_topic, store, tmp_path / "scratch")
    position = TopicPosition(_topic_id(kafka_bootstrap, metadata_topic), 86_400_000, {})

    loaded, holds_entries = _bootstrap_empty_view(tmp_path / "node", store, metadata_topic, position)

    assert loaded is None
    assert not holds_entries  # checked before anything entered the view


def test_a_snapshot_behind_the_topics_log_start_leaves_the_view_empty_with_a_log_line(
    make_manager: Callable[..., RemoteLogMetadataManager], kafka_bootstrap: str, metadata_topic: str,
    store: StorageBackend, tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    writer = make_manager(partitions=PARTITIONS)
    _history(writer, seed=14, partitions=2)
    key = _snapshot(kafka_bootstrap, metadata_topic, store)
    header, _ = read_snapshot(io.BytesIO(BucketSnapshotSource(store).read(key)))
    # As if retention had removed records the snapshot does not hold: the topic starts past its end offsets.
    position = TopicPosition(_topic_id(kafka_bootstrap, metadata_topic), 86_400_000,
                             {p: end + 1 for p, end in header.end_offsets.items()})

    with caplog.at_level(logging.INFO, logger="rlmm.bootstrap"):
        loaded, holds_entries = _bootstrap_empty_view(tmp_path / "node", store, metadata_topic, position)
    assert loaded is None
    assert any("stale" in r.getMessage() and key in r.getMessage() for r in caplog.records)
    assert not holds_entries


@pytest.mark.parametrize("cut_short", ["before the applied offsets", "before the source"])
def test_a_view_a_snapshot_load_left_unfinished_is_started_afresh_with_a_log_line(
    make_manager: Callable[..., RemoteLogMetadataManager], kafka_bootstrap: str, metadata_topic: str,
    store: StorageBackend, tmp_path: Path, caplog: pytest.LogCaptureFixture, cut_short: str,
) -> None:
    writer = make_manager(partitions=PARTITIONS)
    _history(writer, seed=22, partitions=2)
    key = _snapshot(kafka_bootstrap, metadata_topic, store)
    _history(writer, seed=23, partitions=1)
    expected = writer.view_digest()
    # A load cut short where a crash can cut it: its entries in, but not yet its offsets, or not yet its source.
    header, datums = read_snapshot(io.BytesIO(BucketSnapshotSource(store).read(key)))
    view = MetadataView.open(tmp_path / "node")
    view.load_tables(metadata_topic, ((datum["family"], datum["part"]) for datum in datums),
                     {} if cut_short == "before the applied offsets" else header.end_offsets)
    view.close()

    with caplog.at_level(logging.INFO), \
            _node(kafka_bootstrap, metadata_topic, tmp_path / "node", BucketSnapshotSource(store)) as node:
        assert any("rebuilding the metadata view" in r.getMessage() for r in caplog.records)
        assert any("bootstrapped" in r.getMessage() for r in caplog.records)
        wait_digest(node, expected)


def test_a_format_1_snapshot_still_bootstraps_a_node(
    make_manager: Callable[..., RemoteLogMetadataManager], kafka_bootstrap: str, metadata_topic: str,
    store: StorageBackend, tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    writer = make_manager(partitions=PARTITIONS)
    _history(writer, seed=15, partitions=3)
    Archiver(store, ArchiverSettings(kafka_bootstrap, metadata_topic)).run_until_caught_up(timeout_s=60)
    _put_snapshot(store, metadata_topic, _topic_id(kafka_bootstrap, metadata_topic),
                  _format_1_snapshot(store, metadata_topic))
    _history(writer, seed=16, partitions=1)
    expected = writer.view_digest()

    with caplog.at_level(logging.INFO, logger="rlmm.bootstrap"), \
            _node(kafka_bootstrap, metadata_topic, tmp_path / "node", BucketSnapshotSource(store)) as node:
        assert any("bootstrapped" in r.getMessage() and "format 1" in r.getMessage() for r in caplog.records)
        wait_digest(node, expected)


def test_the_snapshot_writer_continues_from_a_format_1_snapshot_to_the_topics_view(
    make_manager: Callable[..., RemoteLogMetadataManager], kafka_bootstrap: str, metadata_topic: str,
    store: StorageBackend,
) -> None:
    writer = make_manager(partitions=PARTITIONS)
    _history(writer, seed=17, partitions=2)
    Archiver(store, ArchiverSettings(kafka_bootstrap, metadata_topic)).run_until_caught_up(timeout_s=60)
    topic_id = _topic_id(kafka_bootstrap, metadata_topic)
    _put_snapshot(store, metadata_topic, topic_id, _format_1_snapshot(store, metadata_topic))
    _history(writer, seed=18, partitions=2)
    Archiver(store, ArchiverSettings(kafka_bootstrap, metadata_topic)).run_until_caught_up(timeout_s=60)

    key = write_snapshot_now(store, SnapshotSettings(LOCATION, metadata_topic), topic_id)

    assert key is not None
    header, _ = read_snapshot(io.BytesIO(BucketSnapshotSource(store).read(key)))
    assert (header.format, header.view_digest) == (TABLES_FORMAT, writer.view_digest())


def test_a_bootstrapped_node_resolves_readiness_when_partitions_register_not_at_the_next_interval(
    make_manager: Callable[..., RemoteLogMetadataManager], kafka_bootstrap: str, metadata_topic: str,
    store: StorageBackend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    writer = make_manager(partitions=PARTITIONS)
    tps = _history(writer, seed=21, partitions=2)
    _snapshot(kafka_bootstrap, metadata_topic, store)
    # Were readiness only resolved at the interval, no partition would get ready within the test's deadline.
    monkeypatch.setattr(applier, "OFFSETS_INTERVAL_S", 3600.0)

    with _node(kafka_bootstrap, metadata_topic, tmp_path / "node", BucketSnapshotSource(store)) as node:
        register(node, *tps)
        assert node.list_remote_log_segments(tps[0]) == writer.list_remote_log_segments(tps[0]) != []


def test_a_snapshot_whose_header_names_another_topic_id_is_skipped_as_foreign_with_a_log_line(
    make_manager: Callable[..., RemoteLogMetadataManager], kafka_bootstrap: str, metadata_topic: str,
    store: StorageBackend, tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    writer = make_manager(partitions=PARTITIONS)
    _history(writer, seed=21, partitions=2)
    expected = writer.view_digest()
    good = _snapshot(kafka_bootstrap, metadata_topic, store)
    header, entries = _entries_of(BucketSnapshotSource(store).read(good), tmp_path / "scratch")
    # Filed under this topic's id, newer than the good one, but taken of another incarnation of the topic.
    foreign = io.BytesIO()
    write_view_snapshot(foreign, metadata_topic, entries, header.end_offsets, header.view_digest or "",
                        "AAAAAAAAAAAAAAAAAAAAAA", int(time.time() * 1000))
    data = foreign.getvalue()
    bad = snapshot_key(LOCATION, metadata_topic, _topic_id(kafka_bootstrap, metadata_topic),
                       int(time.time() * 1000) + 60_000, data)
    store.put(bad, data)

    with caplog.at_level(logging.INFO, logger="rlmm.bootstrap"), \
            _node(kafka_bootstrap, metadata_topic, tmp_path / "node", BucketSnapshotSource(store)) as node:
        assert any(bad in r.getMessage() and "foreign" in r.getMessage() and "AAAAAAAAAAAAAAAAAAAAAA" in r.getMessage()
                   for r in caplog.records)
        assert any("bootstrapped" in r.getMessage() and good in r.getMessage() for r in caplog.records)
        wait_digest(node, expected)


# --- a snapshot's creation time is the time up to which it holds every record ---------------------------------

def test_a_snapshot_holds_every_record_until_now_only_where_its_archive_reached_the_topics_end() -> None:
    now, newest, base = 10_000, {0: 4_000, 1: 6_000}, 5_000
    assert holds_everything_until({0: 7, 1: 9}, newest, base, {0: 7, 1: 9}, now) == now
    # Partition 1 is behind the topic: only what its newest record, or the snapshot built on, says.
    assert holds_everything_until({0: 7, 1: 9}, newest, base, {0: 7, 1: 12}, now) == 6_000
    # Partition 0 behind with only records older than the base snapshot: the base's time.
    assert holds_everything_until({0: 7, 1: 9}, newest, base, {0: 8, 1: 9}, now) == base
    assert holds_everything_until({0: 7}, {}, 0, {0: 8}, now) == 0
    # Partition 1 had records on the topic, none of them in the snapshot: it lags as one behind does.
    assert holds_everything_until({0: 7}, newest, base, {0: 7, 1: 3}, now) == 6_000
    assert holds_everything_until({0: 7}, {0: 4_000}, base, {0: 7, 1: 3}, now) == base
    # An empty partition holds nothing to lag behind.
    assert holds_everything_until({0: 7}, newest, base, {0: 7, 1: 0}, now) == now


def test_a_snapshot_of_an_archive_that_lags_the_topic_is_dated_by_its_newest_record_not_by_now(
    make_manager: Callable[..., RemoteLogMetadataManager], kafka_bootstrap: str, metadata_topic: str,
    store: StorageBackend,
) -> None:
    writer = make_manager(partitions=PARTITIONS)
    _history(writer, seed=7, partitions=3)
    Archiver(store, ArchiverSettings(kafka_bootstrap, metadata_topic)).run_until_caught_up(timeout_s=60)
    archived_by_ms = int(time.time() * 1000)
    time.sleep(0.05)
    _history(writer, seed=8, partitions=3)  # on the topic, not in the archive: the archiver is stuck
    topic_id = _topic_id(kafka_bootstrap, metadata_topic)
    settings = SnapshotSettings(LOCATION, metadata_topic)

    def topic_ends() -> dict[int, int]:
        return metadata_topic_now({"bootstrap.servers": kafka_bootstrap}, metadata_topic)[1]

    lagging = write_snapshot_now(store, settings, topic_id, topic_ends=topic_ends)
    assert lagging is not None
    created = list_snapshots(BucketSnapshotSource(store), LOCATION, metadata_topic, topic_id)[0].created_ms
    assert created <= archived_by_ms

    Archiver(store, ArchiverSettings(kafka_bootstrap, metadata_topic)).run_until_caught_up(timeout_s=60)
    asked_ms = int(time.time() * 1000)
    current = write_snapshot_now(store, settings, topic_id, topic_ends=topic_ends)
    assert current is not None
    newest = list_snapshots(BucketSnapshotSource(store), LOCATION, metadata_topic, topic_id)[0]
    assert newest.key == current and newest.created_ms >= asked_ms


def test_a_snapshot_written_from_a_live_nodes_view_bootstraps_a_new_node_to_the_same_digest(
    make_manager: Callable[..., RemoteLogMetadataManager], kafka_bootstrap: str, metadata_topic: str,
    store: StorageBackend, tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    """The agent of metadata partition 0's leader writes snapshots from its own view: no archive is read. The node
    goes on writing while it does; the snapshot holds what its view held at one moment, and its name the time
    until which that includes every record."""
    writer = make_manager(partitions=PARTITIONS)
    _history(writer, seed=21, partitions=2)
    topic_id = _topic_id(kafka_bootstrap, metadata_topic)
    ends = metadata_topic_now({"bootstrap.servers": kafka_bootstrap}, metadata_topic)[1]
    before_ms = int(time.time() * 1000)
    key = write_snapshot_of_view(store, SnapshotSettings(LOCATION, metadata_topic), topic_id, writer.view,
                                 writer.applied_offsets, lambda: ends)
    (ref,) = list_snapshots(BucketSnapshotSource(store), LOCATION, metadata_topic, topic_id)
    assert ref.key == key and ref.created_ms >= before_ms
    header, _ = read_snapshot(io.BytesIO(BucketSnapshotSource(store).read(key)))
    assert dict(header.end_offsets) == {p: end for p, end in ends.items() if end}  # a partition never written: none

    _history(writer, seed=22, partitions=1)  # the tail a new node reads from the topic after the snapshot
    expected = writer.view_digest()
    with caplog.at_level(logging.INFO, logger="rlmm.bootstrap"), \
            _node(kafka_bootstrap, metadata_topic, tmp_path / "node", BucketSnapshotSource(store)) as node:
        assert any("bootstrapped" in r.getMessage() for r in caplog.records)
        wait_digest(node, expected)


def test_a_snapshot_of_a_view_that_does_not_reach_the_topics_end_is_refused_by_its_deadline(
    make_manager: Callable[..., RemoteLogMetadataManager], metadata_topic: str, store: StorageBackend,
) -> None:
    writer = make_manager(partitions=PARTITIONS)
    _history(writer, seed=23, partitions=1)
    unreachable = {p: offset + 1000 for p, offset in writer.applied_offsets().items()}
    with pytest.raises(RemoteStorageError, match="did not reach the topic's end offsets"):
        write_snapshot_of_view(store, SnapshotSettings(LOCATION, metadata_topic), "id", writer.view,
                               writer.applied_offsets, lambda: unreachable, timeout_s=0.5)
    assert not list(store.list(""))
