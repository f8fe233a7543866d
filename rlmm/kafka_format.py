"""Kafka's own `__remote_log_metadata` record format, both ways: what TopicBasedRemoteLogMetadataManager writes.

Read from Kafka's sources (storage module, 3.6 to 4.4): each record value is RemoteLogMetadataSerde's frame, that is
AbstractApiMessageSerde's three unsigned varints (frame version 1, apiKey, message version) followed by the generated
message in its flexible encoding (compact strings, bytes and arrays, a tagged-field section after every struct).
apiKey 0 RemoteLogSegmentMetadataRecord, 1 RemoteLogSegmentMetadataUpdateRecord, 2 RemotePartitionDeleteMetadataRecord,
3 RemoteLogSegmentMetadataSnapshotRecord; every one has had only version 0 (flexible) since 3.6. Kafka 4.0 added
TxnIndexEmpty as tagged field 0 of the segment and snapshot records (written only when true, so older writers' records
read as false). Keys are null; the partition is RemoteLogMetadataTopicPartitioner's (see `metadata_partition`).
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TypeVar

from rlmm.errors import DecodeError, InvalidArgumentError
from rlmm.types import (
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentMetadataUpdate,
    RemoteLogSegmentState,
    RemotePartitionDeleteMetadata,
    RemotePartitionDeleteState,
    TopicIdPartition,
)

FRAME_VERSION = 1
SEGMENT_API_KEY = 0
SEGMENT_UPDATE_API_KEY = 1
PARTITION_DELETE_API_KEY = 2
SEGMENT_SNAPSHOT_API_KEY = 3
# The message versions this module reads and writes, per apiKey (Kafka's validVersions "0" for all four).
MESSAGE_VERSION = 0
TXN_INDEX_EMPTY_TAG = 0
RECORD_NAMES = {
    SEGMENT_API_KEY: "RemoteLogSegmentMetadataRecord",
    SEGMENT_UPDATE_API_KEY: "RemoteLogSegmentMetadataUpdateRecord",
    PARTITION_DELETE_API_KEY: "RemotePartitionDeleteMetadataRecord",
    SEGMENT_SNAPSHOT_API_KEY: "RemoteLogSegmentMetadataSnapshotRecord",
}
_T = TypeVar("_T")
_STRING_MAX = 0x7FFF  # Kafka's generated readers refuse longer strings


@dataclass(frozen=True, slots=True)
class RemoteLogSegmentMetadataSnapshot:
    """Kafka's RemoteLogSegmentMetadataSnapshot (apiKey 3): a segment's state without its topic partition, from the
    file snapshots TBRLMM kept before 3.8. TBRLMM never writes one to the metadata topic."""

    segment_id: uuid.UUID
    start_offset: int
    end_offset: int
    max_timestamp_ms: int
    broker_id: int
    event_timestamp_ms: int
    segment_size_in_bytes: int
    segment_leader_epochs: Mapping[int, int]
    custom_metadata: bytes | None
    state: RemoteLogSegmentState
    txn_idx_empty: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "segment_leader_epochs", MappingProxyType(dict(sorted(
            self.segment_leader_epochs.items()))))


KafkaMetadata = (RemoteLogSegmentMetadata | RemoteLogSegmentMetadataUpdate | RemotePartitionDeleteMetadata
                 | RemoteLogSegmentMetadataSnapshot)


# --- the partitioner --------------------------------------------------------------------------------------

_INT32 = 0xFFFFFFFF


def _java_int(value: int) -> int:
    value &= _INT32
    return value - (1 << 32) if value & 0x80000000 else value


def _long_hash(value: int) -> int:
    """Java's Long.hashCode of a signed 64-bit value (given as its unsigned bits)."""
    return _java_int(value ^ (value >> 32))


def murmur2(data: bytes) -> int:
    """Kafka's Utils.murmur2 (the default partitioner's hash), as a signed 32-bit int."""
    m, length = 0x5BD1E995, len(data)
    h = (0x9747B28C ^ length) & _INT32
    whole = length - length % 4
    for i in range(0, whole, 4):
        k = (int.from_bytes(data[i:i + 4], "little") * m) & _INT32
        k ^= k >> 24
        k = (k * m) & _INT32
        h = ((h * m) & _INT32) ^ k
    tail = length % 4
    if tail == 3:
        h ^= data[whole + 2] << 16
    if tail >= 2:
        h ^= data[whole + 1] << 8
    if tail >= 1:
        h ^= data[whole]
        h = (h * m) & _INT32
    h ^= h >> 13
    h = (h * m) & _INT32
    h ^= h >> 15
    return _java_int(h)


def metadata_partition(tp: TopicIdPartition, num_partitions: int) -> int:
    """RemoteLogMetadataTopicPartitioner.metadataPartition: murmur2 of the big-endian bytes of
    Objects.hash(topicId's least significant long, its most significant long, partition), made positive, modulo
    the metadata topic's partition count."""
    if num_partitions <= 0:
        raise InvalidArgumentError(f"the metadata topic's partition count must be > 0, got {num_partitions}")
    bits = tp.topic_id.int
    h = 1
    for part in (_long_hash(bits & 0xFFFFFFFFFFFFFFFF), _long_hash(bits >> 64), tp.partition):
        h = _java_int(31 * h + part)
    return (murmur2((h & _INT32).to_bytes(4, "big")) & 0x7FFFFFFF) % num_partitions


# --- encoding ---------------------------------------------------------------------------------------------

_I8 = struct.Struct(">b").pack
_I32 = struct.Struct(">i").pack
_I64 = struct.Struct(">q").pack
_NO_TAGGED_FIELDS = b"\x00"


def _uvarint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _compact_string(text: str) -> bytes:
    raw = text.encode("utf-8")
    if len(raw) > _STRING_MAX:
        raise InvalidArgumentError(f"topic name of {len(raw)} bytes is longer than Kafka's {_STRING_MAX}")
    return _uvarint(len(raw) + 1) + raw


def _compact_nullable_bytes(value: bytes | None) -> bytes:
    return b"\x00" if value is None else _uvarint(len(value) + 1) + value


def _topic_id_partition_entry(tp: TopicIdPartition) -> bytes:
    return _compact_string(tp.topic) + tp.topic_id.bytes + _I32(tp.partition) + _NO_TAGGED_FIELDS


def _epochs_entries(epochs: Mapping[int, int]) -> bytes:
    # Kafka's metadata keeps the epochs in a TreeMap, so they go out in ascending epoch order.
    return _uvarint(len(epochs) + 1) + b"".join(
        _I32(epoch) + _I64(offset) + _NO_TAGGED_FIELDS for epoch, offset in sorted(epochs.items()))


def _segment_tail(md: RemoteLogSegmentMetadata | RemoteLogSegmentMetadataSnapshot) -> bytes:
    """The fields the segment record and the snapshot record share, after the id, through the tagged fields."""
    tagged = (b"\x01" + _uvarint(TXN_INDEX_EMPTY_TAG) + b"\x01\x01") if md.txn_idx_empty else _NO_TAGGED_FIELDS
    return b"".join((
        _I64(md.start_offset), _I64(md.end_offset), _I32(md.broker_id), _I64(md.max_timestamp_ms),
        _I64(md.event_timestamp_ms), _epochs_entries(md.segment_leader_epochs), _I32(md.segment_size_in_bytes),
        _compact_nullable_bytes(md.custom_metadata), _I8(md.state.value), tagged,
    ))


def _frame(api_key: int, body: bytes) -> bytes:
    return _uvarint(FRAME_VERSION) + _uvarint(api_key) + _uvarint(MESSAGE_VERSION) + body


def encode(metadata: KafkaMetadata) -> bytes:
    """The record value RemoteLogMetadataSerde.serialize writes for `metadata` (Kafka 4.x, byte for byte)."""
    if isinstance(metadata, RemoteLogSegmentMetadata):
        segment_id = metadata.remote_log_segment_id
        return _frame(SEGMENT_API_KEY, _topic_id_partition_entry(segment_id.topic_id_partition)
                      + segment_id.id.bytes + _NO_TAGGED_FIELDS + _segment_tail(metadata))
    if isinstance(metadata, RemoteLogSegmentMetadataUpdate):
        segment_id = metadata.remote_log_segment_id
        return _frame(SEGMENT_UPDATE_API_KEY, b"".join((
            _topic_id_partition_entry(segment_id.topic_id_partition), segment_id.id.bytes, _NO_TAGGED_FIELDS,
            _I32(metadata.broker_id), _I64(metadata.event_timestamp_ms),
            _compact_nullable_bytes(metadata.custom_metadata), _I8(metadata.state.value), _NO_TAGGED_FIELDS,
        )))
    if isinstance(metadata, RemotePartitionDeleteMetadata):
        return _frame(PARTITION_DELETE_API_KEY, b"".join((
            _topic_id_partition_entry(metadata.topic_id_partition), _I32(metadata.broker_id),
            _I64(metadata.event_timestamp_ms), _I8(metadata.state.value), _NO_TAGGED_FIELDS,
        )))
    if isinstance(metadata, RemoteLogSegmentMetadataSnapshot):
        return _frame(SEGMENT_SNAPSHOT_API_KEY, metadata.segment_id.bytes + _segment_tail(metadata))
    raise InvalidArgumentError(f"not a Kafka remote log metadata value: {type(metadata).__name__}")


# --- decoding ---------------------------------------------------------------------------------------------

_UNPACK_I8 = struct.Struct(">b").unpack_from
_UNPACK_I32 = struct.Struct(">i").unpack_from
_UNPACK_I64 = struct.Struct(">q").unpack_from
_UNPACK_ENTRY = struct.Struct(">iq").unpack_from
_SEGMENT_STATES = {state.value: state for state in RemoteLogSegmentState}
_PARTITION_STATES = {state.value: state for state in RemotePartitionDeleteState}


class _Reader:
    """A cursor over one record value; every read past the end is a DecodeError naming the field."""

    __slots__ = ("data", "pos")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def _take(self, size: int, field: str) -> int:
        start = self.pos
        if start + size > len(self.data):
            raise DecodeError(f"truncated at byte {start} reading {field} ({len(self.data)} bytes in all)")
        self.pos = start + size
        return start

    def uvarint(self, field: str) -> int:
        value = shift = 0
        while True:
            if shift > 28:
                raise DecodeError(f"{field}: unsigned varint longer than 5 bytes at byte {self.pos}")
            byte = self.data[self._take(1, field)]
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value
            shift += 7

    def int8(self, field: str) -> int:
        return int(_UNPACK_I8(self.data, self._take(1, field))[0])

    def int32(self, field: str) -> int:
        return int(_UNPACK_I32(self.data, self._take(4, field))[0])

    def int64(self, field: str) -> int:
        return int(_UNPACK_I64(self.data, self._take(8, field))[0])

    def uuid(self, field: str) -> uuid.UUID:
        start = self._take(16, field)
        return uuid.UUID(bytes=bytes(self.data[start:start + 16]))

    def string(self, field: str) -> str:
        length = self.uvarint(field) - 1
        if length < 0:
            raise DecodeError(f"{field}: a non-nullable string is null")
        if length > _STRING_MAX:
            raise DecodeError(f"{field}: string length {length} exceeds Kafka's {_STRING_MAX}")
        start = self._take(length, field)
        try:
            return bytes(self.data[start:start + length]).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise DecodeError(f"{field}: not UTF-8 ({exc.reason})") from None

    def nullable_bytes(self, field: str) -> bytes | None:
        length = self.uvarint(field) - 1
        if length < 0:
            return None
        start = self._take(length, field)
        return bytes(self.data[start:start + length])

    def tagged_fields(self, field: str, known: Mapping[int, Callable[[_Reader, int], None]] = MappingProxyType({})
                      ) -> None:
        """A tagged-field section: known tags read by their handlers, unknown ones skipped (as Kafka keeps them)."""
        for _ in range(self.uvarint(f"{field} tagged field count")):
            tag = self.uvarint(f"{field} tag")
            size = self.uvarint(f"{field} tag {tag} size")
            handler = known.get(tag)
            if handler is None:
                self._take(size, f"{field} tag {tag}")
            else:
                handler(self, size)

    def topic_id_partition(self) -> TopicIdPartition:
        name = self.string("TopicIdPartition.Name")
        topic_id = self.uuid("TopicIdPartition.Id")
        partition = self.int32("TopicIdPartition.Partition")
        self.tagged_fields("TopicIdPartition")
        return _checked(TopicIdPartition, topic_id, name, partition)

    def segment_id(self) -> RemoteLogSegmentId:
        tp = self.topic_id_partition()
        segment = self.uuid("RemoteLogSegmentId.Id")
        self.tagged_fields("RemoteLogSegmentId")
        return RemoteLogSegmentId(tp, segment)

    def epochs(self) -> dict[int, int]:
        count = self.uvarint("SegmentLeaderEpochs") - 1
        if count < 0:
            raise DecodeError("SegmentLeaderEpochs: a non-nullable array is null")
        epochs: dict[int, int] = {}
        for _ in range(count):
            epoch, offset = _UNPACK_ENTRY(self.data, self._take(12, "SegmentLeaderEpochs entry"))
            self.tagged_fields("SegmentLeaderEpochs entry")
            epochs[epoch] = offset  # a repeated epoch keeps the last offset, as Kafka's HashMap.put does
        return epochs

    def end(self, name: str) -> None:
        if self.pos != len(self.data):
            raise DecodeError(f"{len(self.data) - self.pos} byte(s) of garbage after {name}")


def _checked(make: Callable[..., _T], *args: object) -> _T:
    """A value type built from decoded fields; a field out of Kafka's ranges makes the record undecodable."""
    try:
        return make(*args)
    except InvalidArgumentError as exc:
        raise DecodeError(str(exc)) from None


def _segment_state(value: int) -> RemoteLogSegmentState:
    state = _SEGMENT_STATES.get(value)
    if state is None:
        raise DecodeError(f"RemoteLogSegmentState: unknown state id {value}")
    return state


def _segment_fields(reader: _Reader) -> tuple[int, int, int, int, int, dict[int, int], int, bytes | None,
                                              RemoteLogSegmentState, bool]:
    start = reader.int64("StartOffset")
    end = reader.int64("EndOffset")
    broker = reader.int32("BrokerId")
    max_timestamp = reader.int64("MaxTimestampMs")
    event_timestamp = reader.int64("EventTimestampMs")
    epochs = reader.epochs()
    size = reader.int32("SegmentSizeInBytes")
    custom = reader.nullable_bytes("CustomMetadata")
    state = _segment_state(reader.int8("RemoteLogSegmentState"))
    txn_idx_empty = [False]

    def read_txn_index_empty(r: _Reader, size: int) -> None:
        if size != 1:
            raise DecodeError(f"TxnIndexEmpty: a bool of {size} bytes")
        txn_idx_empty[0] = r.int8("TxnIndexEmpty") != 0

    reader.tagged_fields("message", {TXN_INDEX_EMPTY_TAG: read_txn_index_empty})
    return start, end, broker, max_timestamp, event_timestamp, epochs, size, custom, state, txn_idx_empty[0]


def _decode_segment(reader: _Reader) -> RemoteLogSegmentMetadata:
    segment_id = reader.segment_id()
    start, end, broker, max_ts, event_ts, epochs, size, custom, state, txn_empty = _segment_fields(reader)
    return _checked(RemoteLogSegmentMetadata, segment_id, start, end, max_ts, broker, event_ts, size, epochs, custom,
                    state, txn_empty)


def _decode_update(reader: _Reader) -> RemoteLogSegmentMetadataUpdate:
    segment_id = reader.segment_id()
    broker = reader.int32("BrokerId")
    event_ts = reader.int64("EventTimestampMs")
    custom = reader.nullable_bytes("CustomMetadata")
    state = _segment_state(reader.int8("RemoteLogSegmentState"))
    reader.tagged_fields("message")
    return _checked(RemoteLogSegmentMetadataUpdate, segment_id, event_ts, custom, state, broker)


def _decode_partition_delete(reader: _Reader) -> RemotePartitionDeleteMetadata:
    tp = reader.topic_id_partition()
    broker = reader.int32("BrokerId")
    event_ts = reader.int64("EventTimestampMs")
    state_id = reader.int8("RemotePartitionDeleteState")
    reader.tagged_fields("message")
    state = _PARTITION_STATES.get(state_id)
    if state is None:
        raise DecodeError(f"RemotePartitionDeleteState: unknown state id {state_id}")
    return _checked(RemotePartitionDeleteMetadata, tp, state, event_ts, broker)


def _decode_snapshot(reader: _Reader) -> RemoteLogSegmentMetadataSnapshot:
    segment = reader.uuid("SegmentId")
    start, end, broker, max_ts, event_ts, epochs, size, custom, state, txn_empty = _segment_fields(reader)
    return RemoteLogSegmentMetadataSnapshot(segment, start, end, max_ts, broker, event_ts, size, epochs, custom, state,
                                            txn_empty)


_DECODERS: dict[int, Callable[[_Reader], KafkaMetadata]] = {
    SEGMENT_API_KEY: _decode_segment,
    SEGMENT_UPDATE_API_KEY: _decode_update,
    PARTITION_DELETE_API_KEY: _decode_partition_delete,
    SEGMENT_SNAPSHOT_API_KEY: _decode_snapshot,
}


def decode(value: bytes | None) -> KafkaMetadata:
    """What RemoteLogMetadataSerde.deserialize reads from a record value; DecodeError says why a value is not one
    (an unknown frame version, apiKey or message version, truncated or trailing bytes, a field out of range)."""
    if value is None:
        raise DecodeError("a null value (tombstone): TBRLMM writes none")
    reader = _Reader(value)
    frame = reader.uvarint("frame version")
    if frame != FRAME_VERSION:
        raise DecodeError(f"unknown frame version {frame} (only {FRAME_VERSION} exists)")
    api_key = reader.uvarint("apiKey")
    version = reader.uvarint("version")
    decoder = _DECODERS.get(api_key)
    if decoder is None:
        raise DecodeError(f"unknown apiKey {api_key} (version {version}); known: "
                          + ", ".join(f"{k} {n}" for k, n in RECORD_NAMES.items()))
    if version != MESSAGE_VERSION:
        raise DecodeError(f"{RECORD_NAMES[api_key]} version {version} is newer than this reader "
                          f"(it reads version {MESSAGE_VERSION})")
    metadata = decoder(reader)
    reader.end(RECORD_NAMES[api_key])
    return metadata


__all__ = [
    "KafkaMetadata",
    "RemoteLogSegmentMetadataSnapshot",
    "decode",
    "encode",
    "metadata_partition",
    "murmur2",
]
