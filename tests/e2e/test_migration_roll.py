"""A live migration on three brokers: a tiered topic under produce load, brokers rolled one by one from Kafka's
TopicBasedRemoteLogMetadataManager to tierlog's in migration mode while tiering and local retention run, then
`tierlog migrate finalize`, whose comparison of the two stores passes under the load; and rolled back to Kafka's
manager in the middle of the roll (three brokers) or after it (one). Every record produced reads back from offset 0,
every segment object in the bucket is one the manager in charge knows, and the finished segments tile the log with no
range uploaded twice but as Kafka's RemoteLogManager does (a leader finishing its copy in flight as it stops, a copy a
restart cut short)."""

from __future__ import annotations

import contextlib
import functools
import io
import itertools
import json
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaException
from e2e_testkit import PartitionState, describe, finished, remote_segments, topic_log_objects, wait_in_isr

from dev.demo import (
    KAFKA_RLMM,
    TIERLOG_RLMM,
    PluginChoice,
    S3Location,
    broker_properties,
    consume,
    create_topic,
    produce,
    tiered_topic_config,
    wait_for,
    wait_until_tiered,
)
from dev.kafka import KafkaCluster
from rlmm.types import RemoteLogSegmentMetadata, RemoteLogSegmentState, TopicIdPartition
from tierlog.cli.common import Settings
from tierlog.cli.kafka_metadata import describe_topic, end_offsets, replay_source
from tierlog.cli.main import main
from tierlog.migration.control import DUAL_WRITE, read_control
from tierlog.migration.records import DEFAULT_SOURCE_TOPIC

TOPIC = "rolled"
CHUNK = 1000
LOAD_PAUSE_S = 0.5  # ~1 segment (SEGMENT_BYTES) every 3 s: copies go on throughout the roll, and reading back is short
METADATA_PARTITIONS = 3


class Load:
    """Produces records in chunks on a thread until stopped; `produced` counts the acknowledged ones."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self.produced = 0
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                produce(self.bootstrap, TOPIC, self.produced, CHUNK)
                self.produced += CHUNK
                self._stop.wait(LOAD_PAUSE_S)
        except BaseException as exc:
            self.error = exc

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(150)
        return self.produced


def _in_migration_mode(bootstrap: str, broker: int, since_ms: int) -> bool:
    """Whether the broker's rlmm announced migration mode after `since_ms` (tierlog.migration.control)."""
    found = read_control({"bootstrap.servers": bootstrap}, "__tierlog_migration", 10)[0].nodes.get(broker)
    return found is not None and found.state == DUAL_WRITE and found.started_ms >= since_ms


def _described(bootstrap: str) -> tuple[TopicIdPartition, PartitionState] | None:
    try:
        return describe(bootstrap, TOPIC)
    except KafkaException:  # a broker that has not seen the new topic yet
        return None


def _now_ms() -> int:
    return int(time.time() * 1000)


def _during(shutdowns: dict[int, list[tuple[int, int]]], segment: RemoteLogSegmentMetadata) -> bool:
    """Whether the segment's copy finished while the broker that copied it was shutting down."""
    return any(start <= segment.event_timestamp_ms <= end for start, end in shutdowns.get(segment.broker_id, []))


def _restart(cluster: KafkaCluster, node: int, shutdowns: dict[int, list[tuple[int, int]]]) -> int:
    """Restart the broker with the cluster's current properties, noting when it was told to stop and when it had
    stopped; returns the first."""
    stopping_ms = _now_ms()
    cluster.stop_node(node)
    shutdowns.setdefault(node, []).append((stopping_ms, _now_ms()))
    cluster.start_node(node)
    wait_in_isr(cluster.bootstrap, TOPIC, node)
    return stopping_ms


def _import_options(bootstrap: str, tmp_path: Path) -> list[str]:
    """The `tierlog migrate` options of a three-broker cluster."""
    return ["-o", f"bootstrap.servers={bootstrap}", "-o", f"metadata.topic.num.partitions={METADATA_PARTITIONS}",
            "-o", "metadata.topic.replication.factor=3", "-o", f"state.dir={tmp_path / 'import'}"]


def _roll_to_migration_mode(cluster: KafkaCluster, nodes: list[int], s3_location: S3Location, socket_dir: Path,
                            plugin_jar: Path, shutdowns: dict[int, list[tuple[int, int]]], load: Load) -> int:
    """Restart `nodes` one by one on tierlog in migration mode (the others keep what they run), each announcing it,
    then wait until the partition's leader has tiered what was produced so far; returns that leader."""
    cache = {k: v for k, v in cluster.properties.items() if k.startswith("rsm.config.fetch.chunk.cache.")}
    cluster.set_properties(broker_properties(PluginChoice(
        rlmm=TIERLOG_RLMM, s3=s3_location, metadata_replication_factor=3, metadata_partitions=METADATA_PARTITIONS,
        extra={**cache, "rlmm.config.migration.mode": "dual-write", "rlmm.config.migration.heartbeat.ms": "1000"},
    ), socket_dir, plugin_jar))
    for node in nodes:
        stopping_ms = _restart(cluster, node, shutdowns)
        wait_for(functools.partial(_in_migration_mode, cluster.bootstrap, node, stopping_ms), 60,
                 f"broker {node} to announce migration mode")
    leader = describe(cluster.bootstrap, TOPIC)[1].leader
    wait_until_tiered(cluster.log_dir(leader), TOPIC, min_local_start=load.produced, timeout=90)
    return leader


def _assert_read_back_with_no_orphan(bootstrap: str, s3_location: S3Location, total: int,
                                     segments_now: Callable[[], list[RemoteLogSegmentMetadata]], manager: str
                                     ) -> list[RemoteLogSegmentMetadata]:
    """Every record produced reads back from offset 0, and every segment object is one of the manager's segments,
    asked for after the read (copies go on until then); returns those segments."""
    read = consume(bootstrap, TOPIC, total, timeout=120)
    assert read.indexes == list(range(total))
    assert not read.mismatched
    segments = segments_now()
    known = {str(s.remote_log_segment_id.id) for s in segments}
    orphans = [key for key in topic_log_objects(s3_location, TOPIC) if _segment_of(key) not in known]
    assert not orphans, f"segment objects {manager} does not know: {orphans}"
    return segments


def _assert_tiled_once(cluster: KafkaCluster, tp: TopicIdPartition, segments: list[RemoteLogSegmentMetadata],
                       shutdowns: dict[int, list[tuple[int, int]]]) -> None:
    """The finished segments tile the log from offset 0 with no range uploaded twice but as Kafka's RemoteLogManager
    does (see the roll test)."""
    copies = sorted(finished(segments), key=lambda s: (s.start_offset, s.end_offset))
    assert copies[0].start_offset == 0
    assert not [(a, b) for a, b in itertools.pairwise(copies) if b.start_offset > a.end_offset + 1], "a gap"
    found = _copied_offsets_found(cluster, tp)
    assert any(found.values()), f"no broker's log says which copied offset it found on becoming {tp}'s leader"
    twice = [(a, b) for a, b in itertools.pairwise(copies) if b.start_offset <= a.end_offset
             and not _during(shutdowns, a)
             and not any(a.end_offset <= offset < b.end_offset for offset in found.get(b.broker_id, []))]
    assert not twice, f"ranges copied twice, not as Kafka's RemoteLogManager does: {twice}; copied offsets each " \
        f"broker found on becoming leader: {found}"


def _copied_offsets_found(cluster: KafkaCluster, tp: TopicIdPartition) -> dict[int, list[int]]:
    """Per broker, the highest copied offset its RemoteLogManager found each time it became the partition's leader
    (its INFO line "Found the highest copiedRemoteOffset"), from the broker's own log."""
    pattern = re.compile(r"Found the highest copiedRemoteOffset: Optional\[\w+[\[(]offset=(-?\d+).*"
                         r" for partition: \S+:" + re.escape(f"{tp.topic}-{tp.partition}") + r"\b")
    found: dict[int, list[int]] = {}
    for node in cluster.node_ids:
        text = cluster.log_file(node).read_text(encoding="utf-8", errors="replace")
        found[node] = [int(match.group(1)) for match in pattern.finditer(text)]
    return found


def tierlog(*argv: str) -> tuple[int, Any]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main([*argv, "--json"])
    return code, json.loads(out.getvalue())


# ~90 s, most of it three broker restarts (~17 s each on 2 shared cores), and 125-172 s under load: `make test-soak`.
@pytest.mark.soak
def test_brokers_rolled_from_tbrlmm_to_tierlog_under_load_then_finalized_lose_and_copy_nothing(
    tiered_cluster: Callable[..., KafkaCluster], plugin_jar: Path, socket_dir: Path, s3_location: S3Location,
    tmp_path: Path,
) -> None:
    cluster = tiered_cluster(nodes=3, rlmm=KAFKA_RLMM, metadata_partitions=METADATA_PARTITIONS)
    bootstrap = cluster.bootstrap
    options = _import_options(bootstrap, tmp_path)
    create_topic(bootstrap, TOPIC, replication_factor=3, config=tiered_topic_config(**{"min.insync.replicas": "2"}))
    tp, state = wait_for(lambda: _described(bootstrap), 30, f"{TOPIC} to be known to every broker")
    load = Load(bootstrap)
    shutdowns: dict[int, list[tuple[int, int]]] = {}  # broker -> when it was told to stop, and when it had stopped
    try:
        wait_until_tiered(cluster.log_dir(state.leader), TOPIC, min_local_start=2 * CHUNK)

        # Step 1: import what TBRLMM wrote so far.
        code, imported = tierlog("migrate", *options)
        assert code == 0, imported
        assert sum(imported["written"].values()) > 0

        # Step 2: roll each broker to tierlog in migration mode; the others still run TBRLMM meanwhile.
        leader = _roll_to_migration_mode(cluster, cluster.node_ids, s3_location, socket_dir, plugin_jar, shutdowns,
                                         load)

        # Step 3: finalize, checked.
        code, finalized = tierlog("migrate", "finalize", *options)
        assert code == 0, "\n".join(finalized["blockers"])
        assert finalized["finalized"] and not finalized["not_yet_finalized"]
    finally:
        total = load.stop()
    assert load.error is None, f"producing failed: {load.error}"

    segments = _assert_read_back_with_no_orphan(bootstrap, s3_location, total,
                                                functools.partial(remote_segments, socket_dir, leader, tp), "tierlog")
    # Two copies overlap in two cases only, both Kafka's RemoteLogManager's own behaviour (copyLogSegment and
    # maybeUpdateCopiedOffset): a leader stopping with a copy in flight finishes it (it writes COPY_SEGMENT_FINISHED
    # without asking whether its task was cancelled) while its successor copies on from the highest offset it finds
    # finished; or the successor knew the earlier copy, but its own local segment holding the next offset starts
    # before that copy's end (replicas roll segments independently). Anything else is a range uploaded twice.
    _assert_tiled_once(cluster, tp, segments, shutdowns)


# ~2-3 minutes (four broker restarts): `make test-soak`.
@pytest.mark.soak
def test_brokers_rolled_back_to_tbrlmm_in_the_middle_of_the_roll_under_load_lose_and_copy_nothing(
    tiered_cluster: Callable[..., KafkaCluster], plugin_jar: Path, socket_dir: Path, s3_location: S3Location,
    tmp_path: Path,
) -> None:
    cluster = tiered_cluster(nodes=3, rlmm=KAFKA_RLMM, metadata_partitions=METADATA_PARTITIONS)
    bootstrap = cluster.bootstrap
    tbrlmm_properties = dict(cluster.properties)
    options = _import_options(bootstrap, tmp_path)
    create_topic(bootstrap, TOPIC, replication_factor=3, config=tiered_topic_config(**{"min.insync.replicas": "2"}))
    tp, state = wait_for(lambda: _described(bootstrap), 30, f"{TOPIC} to be known to every broker")
    load = Load(bootstrap)
    shutdowns: dict[int, list[tuple[int, int]]] = {}
    rolled = cluster.node_ids[:2]
    try:
        wait_until_tiered(cluster.log_dir(state.leader), TOPIC, min_local_start=2 * CHUNK)
        code, imported = tierlog("migrate", *options)
        assert code == 0, imported

        # Two of the three brokers rolled to tierlog in migration mode, the third still on TBRLMM; leadership moves
        # between them with each restart while tiering goes on.
        _roll_to_migration_mode(cluster, rolled, s3_location, socket_dir, plugin_jar, shutdowns, load)

        # Rolled back before finalize, in reverse order: each broker's TBRLMM rebuilds from __remote_log_metadata,
        # which the dual writes kept whole, and tiering goes on from what tierlog copied.
        cluster.set_properties(tbrlmm_properties)
        for node in reversed(rolled):
            _restart(cluster, node, shutdowns)
        leader = describe(bootstrap, TOPIC)[1].leader
        wait_until_tiered(cluster.log_dir(leader), TOPIC, min_local_start=load.produced, timeout=90)
    finally:
        total = load.stop()
    assert load.error is None, f"producing failed: {load.error}"

    segments = _assert_read_back_with_no_orphan(bootstrap, s3_location, total,
                                                functools.partial(_kafka_segments, bootstrap), "Kafka's manager")
    _assert_tiled_once(cluster, tp, segments, shutdowns)


# In `make test-soak` with the roll (about a minute: two broker restarts).
@pytest.mark.soak
def test_a_broker_rolled_back_to_tbrlmm_before_finalize_serves_what_it_tiered_in_migration_mode(
    tiered_cluster: Callable[..., KafkaCluster], plugin_jar: Path, socket_dir: Path, s3_location: S3Location,
    tmp_path: Path,
) -> None:
    cluster = tiered_cluster(nodes=1, rlmm=KAFKA_RLMM, metadata_partitions=METADATA_PARTITIONS)
    bootstrap, batch = cluster.bootstrap, 10_000
    tbrlmm_properties = dict(cluster.properties)
    create_topic(bootstrap, TOPIC)
    produce(bootstrap, TOPIC, 0, batch)
    wait_until_tiered(cluster.log_dir(0), TOPIC, min_local_start=batch // 2)
    code, imported = tierlog("migrate", "-o", f"bootstrap.servers={bootstrap}", "-o",
                             f"metadata.topic.num.partitions={METADATA_PARTITIONS}", "-o",
                             "metadata.topic.replication.factor=1", "-o", f"state.dir={tmp_path / 'import'}")
    assert code == 0, imported

    # In migration mode the broker tiers the next records: tierlog and, by the dual writes, __remote_log_metadata.
    cache = {k: v for k, v in cluster.properties.items() if k.startswith("rsm.config.fetch.chunk.cache.")}
    cluster.set_properties(broker_properties(PluginChoice(
        rlmm=TIERLOG_RLMM, s3=s3_location, metadata_partitions=METADATA_PARTITIONS,
        extra={**cache, "rlmm.config.migration.mode": "dual-write"}), socket_dir, plugin_jar))
    cluster.restart_node(0)
    produce(bootstrap, TOPIC, batch, batch)
    wait_until_tiered(cluster.log_dir(0), TOPIC, min_local_start=batch + batch // 2)

    # Rolled back: Kafka's manager rebuilds from __remote_log_metadata and finds every segment, then tiers on.
    cluster.set_properties(tbrlmm_properties)
    cluster.restart_node(0)
    produce(bootstrap, TOPIC, 2 * batch, batch)
    wait_until_tiered(cluster.log_dir(0), TOPIC, min_local_start=2 * batch + batch // 2)
    read = consume(bootstrap, TOPIC, 3 * batch)
    assert read.indexes == list(range(3 * batch))
    assert not read.mismatched
    # What Kafka's manager now holds: every object is of a segment it knows, and a range has at most one finished
    # copy. A second object of a range is the copy a restart cut short: Kafka's RemoteLogManager leaves its segment
    # COPY_SEGMENT_STARTED (its bytes may all be in the bucket) and copies the range again once the broker is back.
    states = {str(md.remote_log_segment_id.id): md.state for md in _kafka_segments(bootstrap)}
    by_start: dict[str, list[str]] = {}
    for key in topic_log_objects(s3_location, TOPIC):
        by_start.setdefault(key.rsplit("/", 1)[-1].split("-", 1)[0], []).append(key)
    unknown = [key for keys in by_start.values() for key in keys if _segment_of(key) not in states]
    assert not unknown, f"segment objects Kafka's manager does not know: {unknown}"
    twice = {}
    for start, keys in by_start.items():
        found = [states[_segment_of(key)] for key in keys]
        copies = found.count(RemoteLogSegmentState.COPY_SEGMENT_FINISHED)
        if len(keys) > 1 and (copies > 1 or copies + found.count(RemoteLogSegmentState.COPY_SEGMENT_STARTED)
                              < len(keys)):
            twice[start] = [(key, state.name) for key, state in zip(keys, found, strict=True)]
    assert not twice, f"ranges copied twice, not as a restart cuts a copy short: {twice}"


def _segment_of(key: str) -> str:
    """The segment id a segment object's key ends with (`<start>-<segment id>.log`)."""
    return key.removesuffix(".log")[-36:]


def _kafka_segments(bootstrap: str) -> list[RemoteLogSegmentMetadata]:
    """The topic's segments as Kafka's manager holds them: `__remote_log_metadata` replayed under its rules."""
    settings = Settings({}, {"bootstrap.servers": bootstrap})
    source = describe_topic(settings, DEFAULT_SOURCE_TOPIC)
    assert source is not None
    replay, problems, _writes, _read = replay_source(settings, source, end_offsets(settings, source), False)
    assert not problems, problems
    return [md for tp in replay.store.user_partitions() if tp.topic == TOPIC for md in replay.store.segments_of(tp)]
