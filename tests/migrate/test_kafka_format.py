"""rlmm.kafka_format: Kafka's `__remote_log_metadata` values, both ways, held byte for byte to Kafka's own serde."""

from __future__ import annotations

import contextlib
import random
import uuid
from collections.abc import Callable, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from migrate_testkit import probe_request

from rlmm.errors import DecodeError
from rlmm.kafka_format import (
    KafkaMetadata,
    RemoteLogSegmentMetadataSnapshot,
    decode,
    encode,
    metadata_partition,
)
from rlmm.types import (
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentMetadataUpdate,
    RemoteLogSegmentState,
    RemotePartitionDeleteMetadata,
    RemotePartitionDeleteState,
    TopicIdPartition,
)

INT32 = 2**31 - 1
INT64 = 2**63 - 1

uuids = st.builds(uuid.UUID, int=st.integers(0, 2**128 - 1))
topic_names = st.text(st.characters(codec="utf-8"), min_size=1, max_size=40)
tps = st.builds(TopicIdPartition, uuids, topic_names, st.integers(0, INT32))
customs = st.one_of(st.none(), st.binary(max_size=200))


@st.composite
def segments(draw: st.DrawFn) -> RemoteLogSegmentMetadata:
    start = draw(st.integers(0, INT64 - 10**6))
    end = start + draw(st.integers(0, 10**6))
    starts = sorted(draw(st.lists(st.integers(start, end), min_size=1, max_size=4)))
    epochs = sorted(draw(st.sets(st.integers(0, INT32), min_size=len(starts), max_size=len(starts))))
    return RemoteLogSegmentMetadata(
        RemoteLogSegmentId(draw(tps), draw(uuids)), start, end, draw(st.integers(-1, INT64)),
        draw(st.integers(0, INT32)), draw(st.integers(0, INT64)), draw(st.integers(0, INT32)),
        dict(zip(epochs, [start, *starts[1:]], strict=True)),
        draw(customs), draw(st.sampled_from(RemoteLogSegmentState)), draw(st.booleans()))


updates = st.builds(RemoteLogSegmentMetadataUpdate, st.builds(RemoteLogSegmentId, tps, uuids), st.integers(0, INT64),
                    customs, st.sampled_from(RemoteLogSegmentState), st.integers(0, INT32))
deletes = st.builds(RemotePartitionDeleteMetadata, tps, st.sampled_from(RemotePartitionDeleteState),
                    st.integers(0, INT64), st.integers(0, INT32))


def snapshot_of(md: RemoteLogSegmentMetadata) -> RemoteLogSegmentMetadataSnapshot:
    return RemoteLogSegmentMetadataSnapshot(
        md.remote_log_segment_id.id, md.start_offset, md.end_offset, md.max_timestamp_ms, md.broker_id,
        md.event_timestamp_ms, md.segment_size_in_bytes, md.segment_leader_epochs, md.custom_metadata, md.state,
        md.txn_idx_empty)


records = st.one_of(segments(), updates, deletes, segments().map(snapshot_of))


@given(records)
@settings(max_examples=300, deadline=None)
def test_every_record_type_round_trips(record: KafkaMetadata) -> None:
    assert decode(encode(record)) == record


@given(records, st.data())
@settings(max_examples=100, deadline=None)
def test_any_truncation_is_a_decode_error(record: KafkaMetadata, data: st.DataObject) -> None:
    value = encode(record)
    cut = data.draw(st.integers(0, len(value) - 1))
    with pytest.raises(DecodeError):
        decode(value[:cut])


@given(records, st.binary(min_size=1, max_size=8))
@settings(max_examples=50, deadline=None)
def test_trailing_bytes_are_a_decode_error(record: KafkaMetadata, garbage: bytes) -> None:
    with pytest.raises(DecodeError, match="garbage"):
        decode(encode(record) + garbage)


@given(st.binary(max_size=64))
@settings(max_examples=300, deadline=None)
def test_random_bytes_decode_or_raise_decode_error_only(value: bytes) -> None:
    with contextlib.suppress(DecodeError):
        decode(value)


def _a_segment() -> RemoteLogSegmentMetadata:
    tp = TopicIdPartition(uuid.UUID(int=7), "orders", 1)
    return RemoteLogSegmentMetadata(RemoteLogSegmentId(tp, uuid.UUID(int=9)), 0, 9, -1, 0, 1, 100, {0: 0})


@pytest.mark.parametrize(("header", "message"), [
    (b"\x00\x00\x00", "unknown frame version 0"),
    (b"\x02\x00\x00", "unknown frame version 2"),
    (b"\x01\x07\x00", "unknown apiKey 7"),
    (b"\x01\x00\x01", "RemoteLogSegmentMetadataRecord version 1 is newer"),
])
def test_unknown_frame_api_key_or_version_is_named(header: bytes, message: str) -> None:
    with pytest.raises(DecodeError, match=message):
        decode(header + encode(_a_segment())[3:])


def test_a_tombstone_is_a_decode_error() -> None:
    with pytest.raises(DecodeError, match="null value"):
        decode(None)


def test_unknown_tagged_fields_are_skipped_as_kafka_keeps_them() -> None:
    value = encode(_a_segment())
    assert value.endswith(b"\x00")
    # Two tagged fields: an unknown tag 5 of three bytes, then TxnIndexEmpty (tag 0) = true.
    tagged = value[:-1] + b"\x02" + b"\x05\x03abc" + b"\x00\x01\x01"
    decoded = decode(tagged)
    assert isinstance(decoded, RemoteLogSegmentMetadata) and decoded.txn_idx_empty


def test_an_unknown_segment_state_is_a_decode_error() -> None:
    value = bytearray(encode(_a_segment()))
    value[-2] = 9  # the state byte, before the empty tagged-field section
    with pytest.raises(DecodeError, match="unknown state id 9"):
        decode(bytes(value))


def test_a_field_out_of_kafkas_ranges_names_it() -> None:
    value = bytearray(encode(_a_segment()))
    offsets_at = 1 + 1 + 1 + 1 + len(b"orders") + 16 + 4 + 1 + 16 + 1  # header, tp entry, segment id entry
    value[offsets_at:offsets_at + 8] = (2**64 - 5).to_bytes(8, "big")  # StartOffset -5
    with pytest.raises(DecodeError, match="start_offset"):
        decode(bytes(value))


# --- against Kafka's own classes ---------------------------------------------------------------------------

def random_records(rng: random.Random, count: int) -> list[KafkaMetadata]:
    """Records of every type with the shapes Kafka writes: one or several epochs, custom metadata absent, empty or
    present, the transaction-index flag either way, ids and values over their whole ranges."""
    found: list[KafkaMetadata] = []
    for i in range(count):
        tp = TopicIdPartition(uuid.UUID(int=rng.getrandbits(128)), rng.choice(["orders", "t", "événements", "a.b_c-d"]),
                              rng.choice([0, 1, rng.randrange(INT32)]))
        segment_id = RemoteLogSegmentId(tp, uuid.UUID(int=rng.getrandbits(128)))
        custom = rng.choice([None, b"", rng.randbytes(rng.randrange(1, 129))])
        start = rng.choice([0, rng.randrange(10**12)])
        end = start + rng.randrange(10**6)
        epoch_starts = sorted({start, *(rng.randint(start, end) for _ in range(rng.randrange(3)))})
        first_epoch = rng.randrange(1000)
        epochs = {first_epoch + 3 * k: offset for k, offset in enumerate(epoch_starts)}
        segment = RemoteLogSegmentMetadata(
            segment_id, start, end, rng.choice([-1, rng.randrange(2**41)]), rng.randrange(10), rng.randrange(2**41),
            rng.randrange(INT32), epochs, custom, rng.choice(list(RemoteLogSegmentState)), rng.random() < 0.5)
        kind = i % 4
        if kind == 0:
            found.append(segment)
        elif kind == 1:
            found.append(RemoteLogSegmentMetadataUpdate(segment_id, rng.randrange(2**41), custom,
                                                        rng.choice(list(RemoteLogSegmentState)), rng.randrange(10)))
        elif kind == 2:
            found.append(RemotePartitionDeleteMetadata(tp, rng.choice(list(RemotePartitionDeleteState)),
                                                       rng.randrange(2**41), rng.randrange(10)))
        else:
            found.append(snapshot_of(segment))
    return found


def test_kafka_reads_and_writes_the_same_bytes(kafka_probe: Callable[[Sequence[str]], list[str]]) -> None:
    """Kafka's RemoteLogMetadataSerde writes exactly what encode writes, and decode reads Kafka's bytes back to the
    values Kafka serialized (the probe also checks Kafka reads its own bytes back as equal objects)."""
    sample = random_records(random.Random(405), 400)
    kafka_values = [bytes.fromhex(answer) for answer in kafka_probe([probe_request(r) for r in sample])]
    for record, kafka_value in zip(sample, kafka_values, strict=True):
        assert encode(record) == kafka_value, record
        assert decode(kafka_value) == record


def test_the_partitioner_is_kafkas(kafka_probe: Callable[[Sequence[str]], list[str]]) -> None:
    rng = random.Random(26)
    asked = [(TopicIdPartition(uuid.UUID(int=rng.getrandbits(128)), "t", rng.choice([0, 1, 7, rng.randrange(INT32)])),
              rng.choice([1, 3, 50, 51, rng.randrange(1, 1000)])) for _ in range(500)]
    answers = kafka_probe([f"P {tp.topic_id} {tp.partition} {count}" for tp, count in asked])
    assert [metadata_partition(tp, count) for tp, count in asked] == [int(a) for a in answers]
