"""Values are range-checked where they enter: Kafka's int32 and int64 fields, at the API and off the topic.

An out-of-range value (a leader epoch of 2**31, a negative offset) is an InvalidArgumentError naming the field
and the value when a value type is built, and a DecodeError when a record on the topic holds it, never a
struct.error from the view's key packing.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rlmm_testkit import make_tp, segment

from rlmm import codec
from rlmm import view_format as vf
from rlmm.errors import DecodeError, InvalidArgumentError
from rlmm.events import EpochCheckpoint, EpochLineage
from rlmm.types import (
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentMetadataUpdate,
    RemoteLogSegmentState,
    RemotePartitionDeleteMetadata,
    RemotePartitionDeleteState,
    TopicIdPartition,
    uuid_from_text,
)

S = RemoteLogSegmentState
TP = make_tp("orders", 0)
INT32_OVER = 2**31
INT64_OVER = 2**63


def _segment(**overrides: Any) -> RemoteLogSegmentMetadata:
    fields: dict[str, Any] = {
        "remote_log_segment_id": RemoteLogSegmentId(TP, uuid.UUID(int=1)), "start_offset": 0, "end_offset": 99,
        "max_timestamp_ms": -1, "broker_id": 0, "event_timestamp_ms": 1, "segment_size_in_bytes": 10,
        "segment_leader_epochs": {0: 0},
    }
    return RemoteLogSegmentMetadata(**{**fields, **overrides})


@pytest.mark.parametrize(("overrides", "field", "value"), [
    ({"segment_leader_epochs": {INT32_OVER: 0}}, "segment_leader_epochs key", INT32_OVER),
    ({"segment_leader_epochs": {-1: 0}}, "segment_leader_epochs key", -1),
    ({"start_offset": -1}, "start_offset", -1),
    ({"end_offset": INT64_OVER}, "end_offset", INT64_OVER),
    ({"start_offset": 0, "end_offset": 2**64, "segment_leader_epochs": {0: 0}}, "end_offset", 2**64),
    ({"max_timestamp_ms": -2}, "max_timestamp_ms", -2),
    ({"max_timestamp_ms": INT64_OVER}, "max_timestamp_ms", INT64_OVER),
    ({"broker_id": INT32_OVER}, "broker_id", INT32_OVER),
    ({"broker_id": -1}, "broker_id", -1),
    ({"event_timestamp_ms": -5}, "event_timestamp_ms", -5),
    ({"event_timestamp_ms": INT64_OVER}, "event_timestamp_ms", INT64_OVER),
    ({"segment_size_in_bytes": INT32_OVER}, "segment_size_in_bytes", INT32_OVER),
], ids=lambda p: str(p) if not isinstance(p, dict) else "")
def test_an_out_of_range_segment_field_is_refused_naming_the_field_and_value(
    overrides: dict[str, Any], field: str, value: int
) -> None:
    with pytest.raises(InvalidArgumentError, match=rf"RemoteLogSegmentMetadata\.{field}.*got {value}"):
        _segment(**overrides)


def test_a_partition_beyond_int32_is_refused_naming_it() -> None:
    with pytest.raises(InvalidArgumentError, match=rf"TopicIdPartition\.partition.*got {INT32_OVER}"):
        TopicIdPartition(uuid.uuid4(), "orders", INT32_OVER)


@pytest.mark.parametrize(("field", "value"), [
    ("event_timestamp_ms", -1), ("event_timestamp_ms", INT64_OVER), ("broker_id", INT32_OVER), ("broker_id", -3),
])
def test_an_out_of_range_update_or_partition_delete_field_is_refused_naming_it(field: str, value: int) -> None:
    update: dict[str, Any] = {"remote_log_segment_id": RemoteLogSegmentId(TP, uuid.UUID(int=1)),
                              "event_timestamp_ms": 1, "custom_metadata": None,
                              "state": S.COPY_SEGMENT_FINISHED, "broker_id": 0}
    with pytest.raises(InvalidArgumentError, match=rf"RemoteLogSegmentMetadataUpdate\.{field}.*got {value}"):
        RemoteLogSegmentMetadataUpdate(**{**update, field: value})
    delete: dict[str, Any] = {"topic_id_partition": TP, "state": RemotePartitionDeleteState.DELETE_PARTITION_MARKED,
                              "event_timestamp_ms": 1, "broker_id": 0}
    with pytest.raises(InvalidArgumentError, match=rf"RemotePartitionDeleteMetadata\.{field}.*got {value}"):
        RemotePartitionDeleteMetadata(**{**delete, field: value})


@pytest.mark.parametrize(("build", "message"), [
    (lambda: EpochLineage(INT32_OVER, 1), rf"EpochLineage\.epoch.*got {INT32_OVER}"),
    (lambda: EpochLineage(0, -7), r"EpochLineage\.highest_log_offset.*got -7"),
    (lambda: EpochLineage(0, 1, frozenset({"not-a-uuid"})), r"EpochLineage\.displaced_segment_ids"),  # type: ignore[arg-type]
    (lambda: EpochCheckpoint(TP, (), -1, 0), r"EpochCheckpoint\.event_timestamp_ms.*got -1"),
    (lambda: EpochCheckpoint(TP, (), 0, INT32_OVER), rf"EpochCheckpoint\.broker_id.*got {INT32_OVER}"),
    (lambda: EpochCheckpoint(TP, (), 0, 0, -2), r"EpochCheckpoint\.reflects_offset.*got -2"),
    (lambda: EpochCheckpoint(TP, (EpochLineage(1, 5), EpochLineage(1, 6)), 0, 0), r"EpochCheckpoint\.epochs.*twice"),
], ids=["epoch", "highest", "displaced", "timestamp", "broker", "reflects", "duplicate-epoch"])
def test_an_invalid_checkpoint_field_is_refused_naming_it(build: Any, message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        build()


def _segment_datum(**overrides: Any) -> dict[str, Any]:
    _, datum = codec.to_datum(segment(TP, 0, 99, {0: 0}, segment_id=uuid.UUID(int=1)))
    return {**datum, **overrides}


def _checkpoint_datum(**overrides: Any) -> dict[str, Any]:
    _, datum = codec.to_datum(EpochCheckpoint(TP, (EpochLineage(0, 99),), 1, 0, 3))
    return {**datum, **overrides}


def _encoded(name: str, datum: dict[str, Any]) -> bytes:
    return codec.encode_with(codec.registry().current[name], datum)


@pytest.mark.parametrize(("name", "datum", "field"), [
    ("segment_record", _segment_datum(segment_leader_epochs=[{"epoch": INT32_OVER, "start_offset": 0}]),
     "segment_leader_epochs key"),
    ("segment_record", _segment_datum(partition=INT32_OVER), "partition"),
    ("segment_record", _segment_datum(start_offset=-4), "start_offset"),
    ("segment_record", _segment_datum(broker_id=-1), "broker_id"),
    ("segment_record", _segment_datum(segment_size_in_bytes=INT32_OVER), "segment_size_in_bytes"),
    ("epoch_checkpoint_record", _checkpoint_datum(
        epochs=[{"epoch": INT32_OVER, "highest_log_offset": 1, "displaced_segment_ids": []}]), "epoch"),
    ("epoch_checkpoint_record", _checkpoint_datum(
        epochs=[{"epoch": 0, "highest_log_offset": -9, "displaced_segment_ids": []}]), "highest_log_offset"),
    ("epoch_checkpoint_record", _checkpoint_datum(reflects_offset=-3), "reflects_offset"),
    ("partition_delete_record", {**codec.to_datum(RemotePartitionDeleteMetadata(
        TP, RemotePartitionDeleteState.DELETE_PARTITION_MARKED, 1, 0))[1], "event_timestamp_ms": -8},
     "event_timestamp_ms"),
], ids=["epoch", "partition", "start_offset", "broker_id", "size", "checkpoint-epoch", "checkpoint-highest",
        "checkpoint-reflects", "delete-timestamp"])
def test_a_record_on_the_topic_with_an_out_of_range_value_is_a_decode_error_naming_the_field(
    name: str, datum: dict[str, Any], field: str
) -> None:
    with pytest.raises(DecodeError, match=rf"{name} holds invalid values: .*{field}"):
        codec.decode(_encoded(name, datum))


_ANY_INT = st.integers(-(2**64), 2**64)


@settings(max_examples=300, deadline=None)
@given(partition=_ANY_INT, start=_ANY_INT, end=_ANY_INT, epoch=_ANY_INT, epoch_start=_ANY_INT, broker=_ANY_INT,
       size=_ANY_INT, timestamp=_ANY_INT)
def test_a_segment_record_either_decodes_to_values_the_view_can_key_or_is_a_decode_error(
    partition: int, start: int, end: int, epoch: int, epoch_start: int, broker: int, size: int, timestamp: int,
) -> None:
    datum = _segment_datum(partition=partition, start_offset=start, end_offset=end, broker_id=broker,
                           segment_size_in_bytes=size, event_timestamp_ms=timestamp,
                           segment_leader_epochs=[{"epoch": epoch, "start_offset": epoch_start}])
    try:
        value = _encoded("segment_record", datum)
    except (ValueError, OverflowError):
        return  # beyond what Avro's zigzag varint can carry at all: no such record can be on the topic
    try:
        event = codec.decode(value)
    except DecodeError:
        return
    assert isinstance(event, RemoteLogSegmentMetadata)
    tp = event.topic_id_partition
    for leader_epoch, first_offset in event.segment_leader_epochs.items():
        vf.index_key(tp, leader_epoch, first_offset)
        vf.lineage_key(tp, leader_epoch)
    vf.segment_key(event.remote_log_segment_id)
    assert codec.decode(codec.encode(event)) == event


_UUID_TEXT = st.one_of(
    st.uuids().map(str),
    st.uuids().map(lambda u: str(u).upper()),
    st.text(alphabet="0123456789abcdefABCDEF-_+ {}", min_size=30, max_size=40),
    st.text(max_size=40),
)


@settings(max_examples=2000)
@given(_UUID_TEXT)
def test_the_fast_uuid_parser_answers_as_the_uuid_constructor(text: str) -> None:
    """Decoding a record parses its ids with uuid_from_text: the same UUID as uuid.UUID(text), or the same error."""
    try:
        expected: uuid.UUID | None = uuid.UUID(text)
    except ValueError:
        expected = None
    if expected is None:
        with pytest.raises(ValueError):
            uuid_from_text(text)
        return
    parsed = uuid_from_text(text)
    assert parsed == expected and hash(parsed) == hash(expected) and str(parsed) == str(expected)
    assert parsed.bytes == expected.bytes and parsed.is_safe == expected.is_safe
