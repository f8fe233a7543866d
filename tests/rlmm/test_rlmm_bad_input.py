"""Bad input: unreadable records on the metadata topic stop their metadata partition loudly; invalid arguments
are refused with errors naming the field; older schema versions stay readable.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from rlmm_testkit import (
    call_error,
    make_tp,
    manager_config,
    partition_delete,
    produce_to,
    register,
    segment,
    update_of,
    wait_digest,
)
from support import wait_until
from support.topics import produce

from rlmm import (
    ConfigError,
    InvalidArgumentError,
    MetadataLogError,
    RemoteLogMetadataManager,
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentState,
    RemotePartitionDeleteState,
    TopicIdPartition,
    codec,
)
from rlmm.events import key_of, metadata_partition_for
from rlmm.manager import CONFIG_KEYS

S = RemoteLogSegmentState
MakeManager = Callable[..., RemoteLogMetadataManager]
TP = make_tp("foo", 0)


def _v1_segment_bytes(md: RemoteLogSegmentMetadata) -> bytes:
    """A segment record as a Kafka 3.x-era tierlog (schema v1, no txn_idx_empty) wrote it."""
    v1 = next(v for v in codec.registry().by_fingerprint.values() if v.name == "segment_record" and v.version == 1)
    _, datum = codec.to_datum(md)
    del datum["txn_idx_empty"]
    return codec.encode_with(v1, datum)


def _unknown_fingerprint_bytes(md: RemoteLogSegmentMetadata) -> bytes:
    return codec.MAGIC + bytes.fromhex("0123456789abcdef") + codec.encode(md)[10:]


# --- the codec ------------------------------------------------------------------------------------------

def test_a_v1_segment_record_decodes_with_an_empty_transaction_index_flag_of_false() -> None:
    md = segment(TP, 0, 10, {0: 0}, txn_idx_empty=False)
    assert codec.decode(_v1_segment_bytes(md)) == md


def test_v1_and_v2_segment_schemas_have_different_fingerprints() -> None:
    versions = [v for v in codec.registry().by_fingerprint.values() if v.name == "segment_record"]
    assert sorted(v.version for v in versions) == [1, 2]
    assert codec.registry().current["segment_record"].version == 2


def test_every_event_round_trips_through_the_current_schemas() -> None:
    md = segment(TP, 5, 10, {0: 5, 2: 7}, txn_idx_empty=True)
    md = md.create_with_update(update_of(md, S.COPY_SEGMENT_FINISHED, custom_metadata=b"\x00\xff"))
    delete = partition_delete(TP, RemotePartitionDeleteState.DELETE_PARTITION_STARTED)
    assert [codec.decode(codec.encode(event)) for event in (md, delete)] == [md, delete]


def test_an_unknown_schema_fingerprint_is_a_decode_error_naming_the_fingerprint() -> None:
    # Single-object encoding stores the fingerprint little-endian; the message shows it as read.
    with pytest.raises(codec.DecodeError, match="unknown schema fingerprint efcdab8967452301"):
        codec.decode(_unknown_fingerprint_bytes(segment(TP, 0, 1, {0: 0})))


# Named ids: the truncated event holds TP's random topic id, and xdist's workers must collect the same test names.
@pytest.mark.parametrize("value", [b"", b"garbage", b"\xc3\x01", codec.encode(segment(TP, 0, 1, {0: 0}))[:-3]],
                         ids=["empty", "garbage", "header-only", "truncated-event"])
def test_bytes_that_are_not_a_complete_event_are_a_decode_error(value: bytes) -> None:
    with pytest.raises(codec.DecodeError):
        codec.decode(value)


# --- unreadable records on the topic --------------------------------------------------------------------

@pytest.mark.parametrize("bad_value", [b"\x00not avro at all", b"fingerprint"], ids=["corrupt", "unknown-schema"])
def test_an_unreadable_record_stops_its_metadata_partition_with_an_error_naming_topic_partition_and_offset(
    make_manager: MakeManager, kafka_bootstrap: str, metadata_topic: str, bad_value: bytes
) -> None:
    manager = make_manager()
    register(manager, TP)
    good = segment(TP, 0, 10, {0: 0})
    manager.add_remote_log_segment_metadata(good).result(timeout=30)
    value = _unknown_fingerprint_bytes(good) if bad_value == b"fingerprint" else bad_value
    later = segment(TP, 11, 20, {0: 11})
    (_, bad_offset), _ = produce(kafka_bootstrap, metadata_topic, [
        (key_of(good).encode(), value), (key_of(later).encode(), codec.encode(later))])
    errors = wait_until(manager.metadata_errors, timeout=30, description="the manager reporting the bad record")
    message = str(errors[0])
    assert metadata_topic in message and "partition 0" in message and f"offset {bad_offset}" in message
    assert manager.applied_offsets()[0] == bad_offset  # nothing after the bad record is applied
    with pytest.raises(MetadataLogError):
        manager.list_remote_log_segments(TP)


def test_a_node_stopped_by_an_unreadable_record_refuses_writes_for_that_metadata_partition(
    make_manager: MakeManager, kafka_bootstrap: str, metadata_topic: str
) -> None:
    manager = make_manager()
    register(manager, TP)
    produce(kafka_bootstrap, metadata_topic, [(key_of(segment(TP, 0, 1, {0: 0})).encode(), b"\x00garbage")])
    wait_until(manager.metadata_errors, timeout=30, description="the manager reporting the bad record")
    error = call_error(lambda: manager.add_remote_log_segment_metadata(segment(TP, 0, 10, {0: 0})))
    assert isinstance(error, MetadataLogError)


def test_an_unreadable_record_leaves_the_other_metadata_partitions_serving(
    make_manager: MakeManager, kafka_bootstrap: str, metadata_topic: str
) -> None:
    manager = make_manager(partitions=2)
    broken, healthy = _tps_on_distinct_metadata_partitions(2)
    register(manager, broken, healthy)
    produce_to(kafka_bootstrap, metadata_topic, metadata_partition_for(broken.topic_id, broken.partition, 2),
               [(key_of(segment(broken, 0, 1, {0: 0})).encode(), b"\x00garbage")])
    wait_until(manager.metadata_errors, timeout=30, description="the manager reporting the bad record")
    md = segment(healthy, 0, 10, {0: 0})
    manager.add_remote_log_segment_metadata(md).result(timeout=30)
    assert manager.list_remote_log_segments(healthy) == [md]


def _tps_on_distinct_metadata_partitions(partitions: int) -> tuple[TopicIdPartition, TopicIdPartition]:
    found: dict[int, TopicIdPartition] = {}
    while len(found) < partitions:
        tp = make_tp("spread", 0)
        found.setdefault(metadata_partition_for(tp.topic_id, tp.partition, partitions), tp)
    return found[0], found[1]


def test_a_segment_record_written_with_the_v1_schema_is_served_by_the_current_reader(
    make_manager: MakeManager, kafka_bootstrap: str, metadata_topic: str
) -> None:
    manager = make_manager()
    register(manager, TP)
    old = segment(TP, 0, 10, {0: 0})
    finished = old.create_with_update(update_of(old, S.COPY_SEGMENT_FINISHED))
    produce(kafka_bootstrap, metadata_topic, [(key_of(md).encode(), _v1_segment_bytes(md)) for md in (old, finished)])
    manager.wait_caught_up(30)
    assert manager.metadata_errors() == {}
    assert manager.list_remote_log_segments(TP) == [finished]
    assert manager.list_remote_log_segments(TP)[0].txn_idx_empty is False


def test_a_record_with_an_invalid_transition_on_the_topic_is_dropped_and_the_partition_keeps_going(
    make_manager: MakeManager, kafka_bootstrap: str, metadata_topic: str
) -> None:
    manager = make_manager()
    register(manager, TP)
    md = segment(TP, 0, 10, {0: 0})
    manager.add_remote_log_segment_metadata(md).result(timeout=30)
    before = manager.view_digest()
    jump = md.create_with_update(update_of(md, S.DELETE_SEGMENT_FINISHED))
    produce(kafka_bootstrap, metadata_topic, [(key_of(jump).encode(), codec.encode(jump))])
    manager.wait_caught_up(30)
    assert manager.metadata_errors() == {}
    wait_digest(manager, before)
    manager.update_remote_log_segment_metadata(update_of(md, S.COPY_SEGMENT_FINISHED)).result(timeout=30)
    assert manager.remote_log_segment_metadata(TP, 0, 5) is not None


# --- invalid arguments ------------------------------------------------------------------------------------

def _segment_fields(**overrides: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "remote_log_segment_id": RemoteLogSegmentId(TP, uuid.uuid4()), "start_offset": 0, "end_offset": 10,
        "max_timestamp_ms": -1, "broker_id": 0, "event_timestamp_ms": 0, "segment_size_in_bytes": 100,
        "segment_leader_epochs": {0: 0},
    }
    return {**fields, **overrides}


@pytest.mark.parametrize(("overrides", "field"), [
    ({"start_offset": -1}, "start_offset"),
    ({"start_offset": 20}, "end_offset"),
    ({"segment_leader_epochs": {}}, "segment_leader_epochs"),
    ({"segment_leader_epochs": {0: 11}}, "segment_leader_epochs"),
    ({"segment_leader_epochs": {-1: 0}}, "segment_leader_epochs"),
    ({"segment_size_in_bytes": -5}, "segment_size_in_bytes"),
    ({"start_offset": "0"}, "start_offset"),
    ({"end_offset": 10.0}, "end_offset"),
    ({"broker_id": True}, "broker_id"),
    ({"custom_metadata": "text"}, "custom_metadata"),
    ({"state": 1}, "state"),
    ({"txn_idx_empty": 0}, "txn_idx_empty"),
    ({"remote_log_segment_id": "id"}, "remote_log_segment_id"),
], ids=lambda v: str(v) if isinstance(v, str) else None)
def test_invalid_segment_metadata_is_refused_naming_the_field(overrides: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidArgumentError, match=field):
        RemoteLogSegmentMetadata(**_segment_fields(**overrides))


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"partition": -1}, "partition"),
    ({"topic": ""}, "topic"),
    ({"topic_id": "not-a-uuid"}, "topic_id"),
])
def test_an_invalid_topic_id_partition_is_refused_naming_the_field(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidArgumentError, match=field):
        TopicIdPartition(**{"topic_id": uuid.uuid4(), "topic": "foo", "partition": 0, **kwargs})


@pytest.mark.parametrize(("read", "field"), [
    (lambda m: m.remote_log_segment_metadata(TP, -1, 0), "leader_epoch"),
    (lambda m: m.remote_log_segment_metadata(TP, 0, -1), "offset"),
    (lambda m: m.highest_offset_for_epoch(TP, "0"), "leader_epoch"),
    (lambda m: m.list_remote_log_segments(TP, -2), "leader_epoch"),
    (lambda m: m.remote_log_size(TP, None), "leader_epoch"),
    (lambda m: m.next_segment_with_txn_index(TP, 0, 1.5), "offset"),
    (lambda m: m.list_remote_log_segments(("foo", 0)), "topic_id_partition"),
    (lambda m: m.add_remote_log_segment_metadata({"start_offset": 0}), "remote_log_segment_metadata"),
    (lambda m: m.update_remote_log_segment_metadata(segment(TP, 0, 1, {0: 0})), "update"),
    (lambda m: m.put_remote_partition_delete_metadata(TP), "partition_delete"),
], ids=["negative-epoch", "negative-offset", "str-epoch", "negative-list-epoch", "none-epoch", "float-offset",
        "tuple-partition", "dict-segment", "segment-as-update", "tp-as-delete"])
def test_an_invalid_argument_to_the_manager_is_refused_naming_it(
    make_manager: MakeManager, read: Callable[[RemoteLogMetadataManager], object], field: str
) -> None:
    manager = make_manager()
    register(manager, TP)
    error = call_error(lambda: read(manager))
    assert isinstance(error, InvalidArgumentError)
    assert field in str(error)


@pytest.mark.parametrize(("config", "key"), [
    ({"no.such.key": "1"}, "no.such.key"),
    ({"broker.id": "zero"}, "broker.id"),
    ({"metadata.topic.num.partitions": 0}, "metadata.topic.num.partitions"),
    ({"write.timeout.ms": "-1"}, "write.timeout.ms"),
])
def test_an_invalid_config_is_refused_naming_the_key(tmp_path: Path, config: dict[str, Any], key: str) -> None:
    base = {"bootstrap.servers": "127.0.0.1:1", "broker.id": 0, "state.dir": str(tmp_path)}
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        RemoteLogMetadataManager({**base, **config})


def test_every_documented_config_key_is_accepted() -> None:
    documented = {"bootstrap.servers", "broker.id", "state.dir", "metadata.topic.name",
                  "metadata.topic.num.partitions", "metadata.topic.replication.factor",
                  "metadata.topic.min.insync.replicas", "write.timeout.ms", "metadata.topic.min.compaction.lag.ms"}
    assert documented <= {key.name for key in CONFIG_KEYS}


def test_a_metadata_topic_with_another_partition_count_is_refused_naming_the_key(
    create_topic: Callable[..., str], kafka_bootstrap: str, tmp_path: Path
) -> None:
    topic = create_topic("rlmm-three-partitions", partitions=3, config={"cleanup.policy": "compact"})
    with pytest.raises(ConfigError, match=r"metadata\.topic\.num\.partitions"):
        RemoteLogMetadataManager(manager_config(kafka_bootstrap, tmp_path, topic, partitions=2))


def test_a_metadata_topic_with_a_delete_cleanup_policy_is_refused_naming_the_policy(
    create_topic: Callable[..., str], kafka_bootstrap: str, tmp_path: Path
) -> None:
    topic = create_topic("rlmm-delete-policy", partitions=1, config={"cleanup.policy": "delete"})
    with pytest.raises(ConfigError, match=r"cleanup\.policy"):
        RemoteLogMetadataManager(manager_config(kafka_bootstrap, tmp_path, topic, partitions=1))


@pytest.mark.parametrize(("key", "value"), [("kafka.acks", "1"), ("kafka.enable.idempotence", "false")])
def test_a_kafka_client_setting_the_metadata_log_relies_on_is_refused_naming_it(
    make_manager: MakeManager, key: str, value: str
) -> None:
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        make_manager(**{key: value})


def test_records_the_state_machine_drops_are_counted_apart_from_those_it_applies(
    make_manager: MakeManager, kafka_bootstrap: str, metadata_topic: str
) -> None:
    manager = make_manager()
    register(manager, TP)
    good = segment(TP, 0, 10, {0: 0})
    manager.add_remote_log_segment_metadata(good).result(timeout=30)
    applied_before, dropped_before = manager.record_counts()
    # A foreign writer skips a state: Kafka's rules refuse COPY_SEGMENT_STARTED -> DELETE_SEGMENT_FINISHED.
    invalid = good.create_with_update(update_of(good, RemoteLogSegmentState.DELETE_SEGMENT_FINISHED))
    later = segment(TP, 11, 20, {0: 11})
    _, (_, last) = produce(kafka_bootstrap, metadata_topic, [
        (key_of(invalid).encode(), codec.encode(invalid)), (key_of(later).encode(), codec.encode(later))])
    wait_until(lambda: manager.applied_offsets()[0] > last, timeout=30, description="both records applied")
    applied, dropped = manager.record_counts()
    assert (applied - applied_before, dropped - dropped_before) == (1, 1)
    assert applied_before >= 1 and dropped_before == 0
