"""Kafka's remote-log value types, as frozen dataclasses with Kafka's field names in snake_case.

Both packages use these; validation lives here so every entry point rejects the same bad input.
"""

from __future__ import annotations

import base64
import binascii
import enum
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, fields
from types import MappingProxyType, ModuleType
from typing import Any, cast

from rlmm.errors import InvalidArgumentError


def kafka_uuid_text(value: uuid.UUID) -> str:
    """A Uuid as Kafka prints it (`Uuid.toString`): its 16 bytes in url-safe base64 without padding."""
    return base64.urlsafe_b64encode(value.bytes).decode("ascii").rstrip("=")


def kafka_uuid(most_significant: int, least_significant: int) -> uuid.UUID:
    """A Kafka Uuid (two signed 64-bit halves, as client libraries expose it) as a Python UUID."""
    return uuid.UUID(int=((most_significant & (2**64 - 1)) << 64) | (least_significant & (2**64 - 1)))


def parse_uuid(text: str) -> uuid.UUID:
    """A Uuid written either as Kafka prints it (22 url-safe base64 characters) or as hex (dashes optional).

    The two forms never collide: base64 of 16 bytes is 22 characters, hex is 32 (36 with dashes).
    """
    stripped = text.strip()
    if len(stripped) == 22:
        try:
            raw = base64.b64decode(stripped + "==", altchars=b"-_", validate=True)
        except (binascii.Error, ValueError):
            raw = b""
        if len(raw) == 16:
            return uuid.UUID(bytes=raw)
    else:
        try:
            return uuid.UUID(hex=stripped)
        except ValueError:
            pass
    raise InvalidArgumentError(
        f"{text!r} is not a topic or segment id: expected Kafka's form (22 base64 characters, "
        "e.g. YEGh00eySmWyunF_j787ng) or a hex UUID"
    )


_slots: ModuleType | None
try:  # built by setup.py where a C compiler is (optional): see rlmm/_slots.c
    from rlmm import _slots
except ImportError:  # a build without the compiler: slot_maker's makers are Python
    _slots = None

_NEW = object.__new__
_SET = object.__setattr__
_UNKNOWN_SAFETY = uuid.SafeUUID.unknown


def slot_maker(cls: type[Any], fields: Sequence[str]) -> Callable[..., Any]:
    """A function building a `cls` from the values of its slots `fields`, in that order, without __init__ and its
    checks: for values already checked (decoded from a record its writer validated, or derived by the rules) on a
    rebuild's hot path. In C where rlmm._slots was built (one call instead of object.__new__ and an
    object.__setattr__ per field, about 0.2 us each), else in Python."""
    if _slots is not None:
        try:
            return _slots.maker(cls, tuple(fields))
        except TypeError:  # not plain slots (another interpreter's UUID): the Python way sets them alike
            pass
    names = tuple(fields)

    def make(*values: Any) -> Any:
        made = _NEW(cls)
        for name, value in zip(names, values, strict=True):
            _SET(made, name, value)
        return made

    return make


_make_uuid = slot_maker(uuid.UUID, ("int", "is_safe"))


def uuid_from_text(text: str) -> uuid.UUID:
    """uuid.UUID(text): the canonical 36-character form in a third of the time (the constructor's keyword handling
    is most of its cost; a rebuild parses a segment id per record), any other text through the constructor."""
    if len(text) == 36 and text[8] == text[13] == text[18] == text[23] == "-":
        digits = text.replace("-", "")
        if len(digits) == 32:
            # The fields uuid.UUID.__init__ sets, as it sets them (it forbids setattr).
            return cast(uuid.UUID, _make_uuid(int(digits, 16), _UNKNOWN_SAFETY))
    return uuid.UUID(text)


class RemoteLogSegmentState(enum.IntEnum):
    COPY_SEGMENT_STARTED = 0
    COPY_SEGMENT_FINISHED = 1
    DELETE_SEGMENT_STARTED = 2
    DELETE_SEGMENT_FINISHED = 3


class RemotePartitionDeleteState(enum.IntEnum):
    DELETE_PARTITION_MARKED = 0
    DELETE_PARTITION_STARTED = 1
    DELETE_PARTITION_FINISHED = 2


def _require_type(owner: str, name: str, value: Any, expected: type | tuple[type, ...]) -> None:
    # bool is an int in Python; Kafka's offsets and ids are never booleans.
    if isinstance(value, bool) and expected is not bool and bool not in _as_tuple(expected):
        raise InvalidArgumentError(f"{owner}.{name} must be {_type_names(expected)}, got bool {value!r}")
    if not isinstance(value, expected):
        raise InvalidArgumentError(
            f"{owner}.{name} must be {_type_names(expected)}, got {type(value).__name__} {value!r}"
        )


def _as_tuple(expected: type | tuple[type, ...]) -> tuple[type, ...]:
    return expected if isinstance(expected, tuple) else (expected,)


def _type_names(expected: type | tuple[type, ...]) -> str:
    return " or ".join(t.__name__ for t in _as_tuple(expected))


INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1


def values_plainly_in_range(start_offset: int, end_offset: int, max_timestamp_ms: int, broker_id: int,
                            event_timestamp_ms: int, segment_size_in_bytes: int) -> bool:
    """Whether a segment's values (ints a schema-typed decoder produced) are within Kafka's ranges, so that building
    it may skip the field checks (RemoteLogSegmentMetadata.from_record, rlmm.codec.decode_packed_segment)."""
    return (0 <= start_offset <= end_offset <= INT64_MAX and -1 <= max_timestamp_ms <= INT64_MAX
            and 0 <= broker_id <= INT32_MAX and 0 <= event_timestamp_ms <= INT64_MAX
            and 0 <= segment_size_in_bytes <= INT32_MAX)


def epoch_plainly_in_range(epoch: int, epoch_start: int, start_offset: int, end_offset: int) -> bool:
    """Whether one of a segment's leader epochs is within Kafka's range and starts inside the segment."""
    return 0 <= epoch <= INT32_MAX and start_offset <= epoch_start <= end_offset


def _require_non_negative(owner: str, name: str, value: int) -> None:
    """An offset, size or timestamp: Kafka's long, never negative."""
    require_range(owner, name, value, 0, INT64_MAX, "a non-negative int64")


def _require_int32(owner: str, name: str, value: int) -> None:
    """A leader epoch, partition, broker id or segment size: Kafka's int, never negative."""
    require_range(owner, name, value, 0, INT32_MAX, "a non-negative int32")


def require_range(owner: str, name: str, value: int, low: int, high: int, what: str) -> None:
    """Kafka's Java types bound what its fields hold; out of range, a value would break the view's key packing."""
    _require_type(owner, name, value, int)
    if not low <= value <= high:
        raise InvalidArgumentError(f"{owner}.{name} must be {what} ({low}..{high}), got {value}")


@dataclass(frozen=True, slots=True)
class TopicIdPartition:
    topic_id: uuid.UUID
    topic: str
    partition: int

    def __post_init__(self) -> None:
        _require_type("TopicIdPartition", "topic_id", self.topic_id, uuid.UUID)
        _require_type("TopicIdPartition", "topic", self.topic, str)
        if not self.topic:
            raise InvalidArgumentError("TopicIdPartition.topic must not be empty")
        _require_int32("TopicIdPartition", "partition", self.partition)

    def __str__(self) -> str:
        return f"{self.topic_id}:{self.topic}-{self.partition}"


@dataclass(frozen=True, slots=True)
class RemoteLogSegmentId:
    topic_id_partition: TopicIdPartition
    id: uuid.UUID

    def __post_init__(self) -> None:
        _require_type("RemoteLogSegmentId", "topic_id_partition", self.topic_id_partition, TopicIdPartition)
        _require_type("RemoteLogSegmentId", "id", self.id, uuid.UUID)

    @classmethod
    def from_record(cls, topic_id_partition: TopicIdPartition, id: uuid.UUID) -> RemoteLogSegmentId:
        """Build one from values a decoder produced: checked only when they are not plainly of the right types."""
        if type(topic_id_partition) is not TopicIdPartition or type(id) is not uuid.UUID:
            return cls(topic_id_partition, id)
        return cast(RemoteLogSegmentId, _make_segment_id(topic_id_partition, id))

    @classmethod
    def generate(cls, topic_id_partition: TopicIdPartition) -> RemoteLogSegmentId:
        return cls(topic_id_partition, uuid.uuid4())

    def __str__(self) -> str:
        return f"{self.topic_id_partition}/{self.id}"


class OneEpoch(Mapping[int, int]):
    """A segment's leader epochs when it has one (most segments): the read-only mapping {epoch: start} in two slots,
    about 60 bytes where a dict behind a MappingProxyType takes about 220 (a node holds every hosted segment). It
    compares equal to any mapping with the same one entry, as the dict would."""

    __slots__ = ("_epoch", "_start")

    def __init__(self, epoch: int, start: int) -> None:
        self._epoch = epoch
        self._start = start

    def __getitem__(self, epoch: int) -> int:
        if epoch == self._epoch:
            return self._start
        raise KeyError(epoch)

    def get(self, epoch: int, default: Any = None) -> Any:
        return self._start if epoch == self._epoch else default

    def __contains__(self, epoch: object) -> bool:
        return epoch == self._epoch

    def __iter__(self) -> Iterator[int]:
        return iter((self._epoch,))

    def __len__(self) -> int:
        return 1

    def keys(self) -> tuple[int]:  # type: ignore[override]
        return (self._epoch,)

    def values(self) -> tuple[int]:  # type: ignore[override]
        return (self._start,)

    def items(self) -> tuple[tuple[int, int]]:  # type: ignore[override]
        return ((self._epoch, self._start),)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, OneEpoch):
            return self._epoch == other._epoch and self._start == other._start
        if isinstance(other, Mapping):
            return len(other) == 1 and other.get(self._epoch, _MISSING) == self._start
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # unhashable, as a dict

    def __repr__(self) -> str:
        return f"{{{self._epoch!r}: {self._start!r}}}"

    def __reduce__(self) -> tuple[type[OneEpoch], tuple[int, int]]:
        return OneEpoch, (self._epoch, self._start)


_MISSING = object()


def _frozen_epochs(owner: str, epochs: Mapping[int, int]) -> Mapping[int, int]:
    if not isinstance(epochs, Mapping):
        raise InvalidArgumentError(
            f"{owner}.segment_leader_epochs must be a mapping of epoch -> start offset, "
            f"got {type(epochs).__name__}"
        )
    if not epochs:
        raise InvalidArgumentError(f"{owner}.segment_leader_epochs must not be empty")
    for epoch, offset in epochs.items():
        _require_int32(owner, f"segment_leader_epochs key {epoch!r}", epoch)
        _require_non_negative(owner, f"segment_leader_epochs[{epoch}]", offset)
    if len(epochs) == 1:
        ((epoch, start),) = epochs.items()
        return OneEpoch(epoch, start)
    return MappingProxyType(dict(sorted(epochs.items())))


@dataclass(frozen=True, slots=True)
class RemoteLogSegmentMetadata:
    remote_log_segment_id: RemoteLogSegmentId
    start_offset: int
    end_offset: int
    max_timestamp_ms: int
    broker_id: int
    event_timestamp_ms: int
    segment_size_in_bytes: int
    segment_leader_epochs: Mapping[int, int]
    custom_metadata: bytes | None = None
    state: RemoteLogSegmentState = RemoteLogSegmentState.COPY_SEGMENT_STARTED
    txn_idx_empty: bool = False

    def __post_init__(self) -> None:
        owner = "RemoteLogSegmentMetadata"
        _require_type(owner, "remote_log_segment_id", self.remote_log_segment_id, RemoteLogSegmentId)
        _require_non_negative(owner, "start_offset", self.start_offset)
        _require_non_negative(owner, "end_offset", self.end_offset)
        if self.end_offset < self.start_offset:
            raise InvalidArgumentError(
                f"{owner}.end_offset ({self.end_offset}) must be >= start_offset ({self.start_offset})"
            )
        # Kafka's RecordBatch.NO_TIMESTAMP (-1) marks a segment without timestamps.
        require_range(owner, "max_timestamp_ms", self.max_timestamp_ms, -1, INT64_MAX, "an int64 >= -1")
        _require_int32(owner, "broker_id", self.broker_id)
        _require_non_negative(owner, "event_timestamp_ms", self.event_timestamp_ms)
        _require_int32(owner, "segment_size_in_bytes", self.segment_size_in_bytes)
        epochs = _frozen_epochs(owner, self.segment_leader_epochs)
        object.__setattr__(self, "segment_leader_epochs", epochs)
        first_epoch_start = next(iter(epochs.values()))
        if first_epoch_start < self.start_offset or max(epochs.values()) > self.end_offset:
            raise InvalidArgumentError(
                f"{owner}.segment_leader_epochs offsets must lie within "
                f"[start_offset, end_offset] = [{self.start_offset}, {self.end_offset}], got {dict(epochs)}"
            )
        _require_type(owner, "custom_metadata", self.custom_metadata, (bytes, type(None)))
        _require_type(owner, "state", self.state, RemoteLogSegmentState)
        _require_type(owner, "txn_idx_empty", self.txn_idx_empty, bool)

    @classmethod
    def from_record(
        cls, remote_log_segment_id: RemoteLogSegmentId, start_offset: int, end_offset: int, max_timestamp_ms: int,
        broker_id: int, event_timestamp_ms: int, segment_size_in_bytes: int, segment_leader_epochs: dict[int, int],
        custom_metadata: bytes | None, state: RemoteLogSegmentState, txn_idx_empty: bool,
    ) -> RemoteLogSegmentMetadata:
        """Build one from values a schema-typed decoder produced (ints, bytes, bool; a dict of epochs it made for
        this call, which a one-epoch segment keeps as it is): when they are plainly within Kafka's ranges the field
        checks are skipped, else the full constructor judges and names what is wrong."""
        if len(segment_leader_epochs) == 1:  # most segments: one leader epoch, checked without a loop
            epochs = segment_leader_epochs
            ((epoch, epoch_start),) = epochs.items()
            epochs_in_range = epoch_plainly_in_range(epoch, epoch_start, start_offset, end_offset)
        else:
            epochs = dict(sorted(segment_leader_epochs.items()))
            epochs_in_range = bool(epochs) and all(
                epoch_plainly_in_range(e, o, start_offset, end_offset) for e, o in epochs.items())
        if not (epochs_in_range and values_plainly_in_range(start_offset, end_offset, max_timestamp_ms, broker_id,
                                                            event_timestamp_ms, segment_size_in_bytes)):
            return cls(remote_log_segment_id, start_offset, end_offset, max_timestamp_ms, broker_id,
                       event_timestamp_ms, segment_size_in_bytes, epochs, custom_metadata, state, txn_idx_empty)
        return cast(RemoteLogSegmentMetadata, _make_segment(
            remote_log_segment_id, start_offset, end_offset, max_timestamp_ms, broker_id, event_timestamp_ms,
            segment_size_in_bytes, OneEpoch(epoch, epoch_start) if len(epochs) == 1 else MappingProxyType(epochs),
            custom_metadata, state, txn_idx_empty))

    @property
    def topic_id_partition(self) -> TopicIdPartition:
        return self.remote_log_segment_id.topic_id_partition

    def epoch_end_offset(self, epoch: int) -> int:
        """Last offset of `epoch` inside this segment: the next epoch's start - 1, or the segment end."""
        later = [start for e, start in self.segment_leader_epochs.items() if e > epoch]
        return min(later) - 1 if later else self.end_offset

    def create_with_update(self, update: RemoteLogSegmentMetadataUpdate) -> RemoteLogSegmentMetadata:
        if update.remote_log_segment_id != self.remote_log_segment_id:
            raise InvalidArgumentError(
                f"update is for segment {update.remote_log_segment_id}, not {self.remote_log_segment_id}"
            )
        return RemoteLogSegmentMetadata(
            remote_log_segment_id=self.remote_log_segment_id,
            start_offset=self.start_offset,
            end_offset=self.end_offset,
            max_timestamp_ms=self.max_timestamp_ms,
            broker_id=update.broker_id,
            event_timestamp_ms=update.event_timestamp_ms,
            segment_size_in_bytes=self.segment_size_in_bytes,
            segment_leader_epochs=self.segment_leader_epochs,
            custom_metadata=update.custom_metadata,
            state=update.state,
            txn_idx_empty=self.txn_idx_empty,
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RemoteLogSegmentMetadata):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def _key(self) -> tuple[Any, ...]:
        return (
            self.remote_log_segment_id, self.start_offset, self.end_offset, self.max_timestamp_ms,
            self.broker_id, self.event_timestamp_ms, self.segment_size_in_bytes,
            tuple(self.segment_leader_epochs.items()), self.custom_metadata, self.state, self.txn_idx_empty,
        )




_make_segment_id = slot_maker(RemoteLogSegmentId, [f.name for f in fields(RemoteLogSegmentId)])
_make_segment = slot_maker(RemoteLogSegmentMetadata, [f.name for f in fields(RemoteLogSegmentMetadata)])


@dataclass(frozen=True, slots=True)
class RemoteLogSegmentMetadataUpdate:
    remote_log_segment_id: RemoteLogSegmentId
    event_timestamp_ms: int
    custom_metadata: bytes | None
    state: RemoteLogSegmentState
    broker_id: int

    def __post_init__(self) -> None:
        owner = "RemoteLogSegmentMetadataUpdate"
        _require_type(owner, "remote_log_segment_id", self.remote_log_segment_id, RemoteLogSegmentId)
        _require_non_negative(owner, "event_timestamp_ms", self.event_timestamp_ms)
        _require_type(owner, "custom_metadata", self.custom_metadata, (bytes, type(None)))
        _require_type(owner, "state", self.state, RemoteLogSegmentState)
        _require_int32(owner, "broker_id", self.broker_id)

    @property
    def topic_id_partition(self) -> TopicIdPartition:
        return self.remote_log_segment_id.topic_id_partition


@dataclass(frozen=True, slots=True)
class RemotePartitionDeleteMetadata:
    topic_id_partition: TopicIdPartition
    state: RemotePartitionDeleteState
    event_timestamp_ms: int
    broker_id: int

    def __post_init__(self) -> None:
        owner = "RemotePartitionDeleteMetadata"
        _require_type(owner, "topic_id_partition", self.topic_id_partition, TopicIdPartition)
        _require_type(owner, "state", self.state, RemotePartitionDeleteState)
        _require_non_negative(owner, "event_timestamp_ms", self.event_timestamp_ms)
        _require_int32(owner, "broker_id", self.broker_id)


__all__ = [
    "RemoteLogSegmentId",
    "RemoteLogSegmentMetadata",
    "RemoteLogSegmentMetadataUpdate",
    "RemoteLogSegmentState",
    "RemotePartitionDeleteMetadata",
    "RemotePartitionDeleteState",
    "TopicIdPartition",
    "kafka_uuid_text",
    "parse_uuid",
]
