"""Avro single-object encoding of metadata events, resolving any older writer schema by fingerprint.

Schemas live in `schemas/*.avsc` (one file per record version); the newest version of each is the reader.
"""

from __future__ import annotations

import io
import json
import os
import re
import uuid
from dataclasses import dataclass
from functools import cache, lru_cache
from pathlib import Path
from types import ModuleType
from typing import Any

import fastavro
from fastavro.schema import fingerprint, to_parsing_canonical_form

from rlmm import packed
from rlmm.errors import DecodeError, InvalidArgumentError
from rlmm.events import EpochCheckpoint, EpochLineage, MetadataEvent, RecordKey, key_of
from rlmm.types import (
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentState,
    RemotePartitionDeleteMetadata,
    RemotePartitionDeleteState,
    TopicIdPartition,
    epoch_plainly_in_range,
    uuid_from_text,
    values_plainly_in_range,
)

_avro_reader: ModuleType | None
try:  # built by setup.py where a C compiler is (optional): see rlmm/_avro_reader.c
    from rlmm import _avro_reader
except ImportError:  # a build without the compiler: fastavro reads everything
    _avro_reader = None

MAGIC = b"\xc3\x01"  # Avro single-object encoding marker, followed by the 8-byte CRC-64-AVRO fingerprint
_HEADER = len(MAGIC) + 8
_FILE_NAME = re.compile(r"^(?P<name>[a-z_]+)\.v(?P<version>\d+)\.avsc$")



def schema_dir() -> Path:
    """Where the .avsc files are: TIERLOG_SCHEMA_DIR, else the copy a wheel carries (rlmm/schemas/), else the
    checkout's schemas/ (an editable install); rlmm finds them on its own, importing nothing of tierlog."""
    override = os.environ.get("TIERLOG_SCHEMA_DIR")
    if override:
        return Path(override)
    here = Path(__file__).resolve().parent
    packaged = here / "schemas"
    if packaged.is_dir():
        return packaged
    # Only a real checkout counts, not any schemas/ that happens to sit beside an installed rlmm.
    checkout = here.parent
    if (checkout / "pyproject.toml").is_file() and (checkout / "schemas").is_dir():
        return checkout / "schemas"
    return packaged  # absent: SchemaRegistry.load names it in its error


SCHEMA_DIR = schema_dir()


@dataclass(frozen=True)
class SchemaVersion:
    name: str  # file stem without version, e.g. "segment_record"
    version: int
    schema: Any  # parsed fastavro schema
    fingerprint: bytes
    # The same schema parsed without its uuid logical types: ids decode as their text, which `decode` turns into
    # UUIDs faster than fastavro's conversion (a third of a segment record's decode).
    plain: Any
    # `plain` as rlmm._avro_reader runs it (None without the extension): a rebuild's records read in C, several
    # times faster than fastavro, which still reads whatever the C reader does not read exactly.
    program: Any = None
    # `plain` read with its records as tuples of their fields' values (None without the extension): for a reader
    # that takes a record's values by position (rlmm.lean_fold).
    tuples: Any = None


@dataclass(frozen=True)
class SchemaRegistry:
    """All known versions of every event schema, keyed by fingerprint; the newest version reads."""

    by_fingerprint: dict[bytes, SchemaVersion]
    current: dict[str, SchemaVersion]

    @classmethod
    def load(cls, directory: Path = SCHEMA_DIR) -> SchemaRegistry:
        by_fp: dict[bytes, SchemaVersion] = {}
        current: dict[str, SchemaVersion] = {}
        for path in sorted(directory.glob("*.avsc")):
            match = _FILE_NAME.match(path.name)
            if not match:
                continue
            raw = json.loads(path.read_text())
            parsed = fastavro.parse_schema(raw)
            fp = bytes.fromhex(fingerprint(to_parsing_canonical_form(parsed), "CRC-64-AVRO"))
            plain = _without_uuid_types(raw)
            version = SchemaVersion(match["name"], int(match["version"]), parsed, fp, fastavro.parse_schema(plain),
                                    reader_program(plain), reader_program(plain, records_as_tuples=True))
            by_fp[fp] = version
            if version.name not in current or current[version.name].version < version.version:
                current[version.name] = version
        if not {"segment_record", "partition_delete_record", "epoch_checkpoint_record"} <= current.keys():
            raise FileNotFoundError(f"tierlog event schemas missing from {directory}")
        return cls(by_fp, current)

    def version(self, name: str, number: int) -> SchemaVersion:
        for version in self.by_fingerprint.values():
            if version.name == name and version.version == number:
                return version
        raise FileNotFoundError(f"schema {name} version {number} missing from tierlog's schemas")


def _without_uuid_types(schema: Any) -> Any:
    if isinstance(schema, list):
        return [_without_uuid_types(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    return {k: _without_uuid_types(v) for k, v in schema.items() if not (k == "logicalType" and v == "uuid")}


def read_plain(program: Any, data: bytes) -> Any:
    """The datum `program` (from `reader_program`) reads at the start of `data`, in C; ValueError for bytes the C
    reader does not read exactly (fastavro then decodes them or says what is wrong)."""
    assert _avro_reader is not None  # a program is compiled only with the reader there
    return _avro_reader.read(program, data, 0)


_PRIMITIVE_OPS = {"null": "OP_NULL", "boolean": "OP_BOOLEAN", "int": "OP_INT", "long": "OP_LONG",
                  "string": "OP_STRING", "bytes": "OP_BYTES"}


def reader_program(schema: Any, records_as_tuples: bool = False) -> Any:
    """A schema (JSON, without logical types) as rlmm._avro_reader runs it, or None: without the extension, or for
    a schema holding a type it does not read (float, double, map, fixed), which fastavro then reads. With
    `records_as_tuples`, a record reads as the tuple of its fields' values, in the schema's order."""
    if _avro_reader is None:
        return None
    reader = _avro_reader
    named: dict[str, Any] = {}

    def compile_(node: Any, namespace: str) -> Any:
        if isinstance(node, str):
            if node in _PRIMITIVE_OPS:
                return (getattr(reader, _PRIMITIVE_OPS[node]),)
            return named[node if "." in node or not namespace else f"{namespace}.{node}"]
        if isinstance(node, list):
            return (reader.OP_UNION, tuple(compile_(branch, namespace) for branch in node))
        kind = node["type"]
        if kind in _PRIMITIVE_OPS and set(node) == {"type"}:
            return compile_(kind, namespace)
        if kind in ("enum", "record"):
            name = node["name"]
            namespace = name.rpartition(".")[0] if "." in name else node.get("namespace", namespace)
            full = name if "." in name else f"{namespace}.{name}" if namespace else name
            if kind == "enum":
                named[full] = (reader.OP_ENUM, tuple(node["symbols"]))
            elif records_as_tuples:
                named[full] = (reader.OP_TUPLE, tuple(compile_(field["type"], namespace) for field in node["fields"]))
            else:
                named[full] = (reader.OP_RECORD, tuple(
                    (field["name"], compile_(field["type"], namespace)) for field in node["fields"]))
            return named[full]
        if kind == "array":
            return (reader.OP_ARRAY, compile_(node["items"], namespace))
        raise LookupError(kind)

    try:
        program = compile_(schema, "")
    except LookupError:  # a type (or a reference) the reader does not take
        return None
    return program if reader.check(program) else None


@cache
def registry() -> SchemaRegistry:
    return SchemaRegistry.load()


def encode_with(version: SchemaVersion, datum: dict[str, Any]) -> bytes:
    buffer = io.BytesIO()
    buffer.write(MAGIC)
    # The fingerprint is stored little-endian, as Avro's single-object encoding specifies.
    buffer.write(version.fingerprint[::-1])
    fastavro.schemaless_writer(buffer, version.schema, datum)
    return buffer.getvalue()


# The epoch_checkpoint_record version before checkpoints were keyed per epoch, which releases before them read: a
# whole-partition checkpoint (every epoch under the partition's key, all that version could say) is written with it,
# so that brokers not yet upgraded read what upgraded ones write during a rolling upgrade. It cannot say which
# segments are overwritten: a node reading it lists them in their epochs, as those releases did.
WHOLE_PARTITION_CHECKPOINT_VERSION = 2
# The epoch_checkpoint_record version before overwritten segment ids, which releases before them read: a checkpoint
# none of whose epochs has overwritten segments (nearly all) is written with it, for the same reason.
PLAIN_CHECKPOINT_VERSION = 3
# Older versions whose datum, as its writer wrote it, reads like the current version's (the fields the current one
# adds are read with their defaults, see from_datum): read in C as they are, without fastavro's schema resolution.
_READ_AS_WRITTEN = frozenset({("epoch_checkpoint_record", PLAIN_CHECKPOINT_VERSION)})


def encode(event: MetadataEvent) -> bytes:
    name, datum = to_datum(event)
    if isinstance(event, EpochCheckpoint):
        if event.whole_partition:
            return encode_with(registry().version(name, WHOLE_PARTITION_CHECKPOINT_VERSION), datum)
        if not any(lineage.overwritten_segment_ids for lineage in event.epochs):
            return encode_with(registry().version(name, PLAIN_CHECKPOINT_VERSION), datum)
    return encode_with(registry().current[name], datum)


def decode(value: bytes) -> MetadataEvent:
    name, datum = decode_datum(value, plain_ids=True)
    return from_datum(name, datum)


def decode_record(key: bytes, value: bytes | None) -> tuple[RecordKey, MetadataEvent | None]:
    """A consumed record's key and event (None: a tombstone); DecodeError or InvalidArgumentError for bytes no
    tierlog wrote. A segment record whose key spells its event's own ids, as every tierlog writer's does, gets the
    event's key instead of a second parse of the same ids."""
    if value is None:
        return RecordKey.decode(key), None
    name, datum = decode_datum(value, plain_ids=True)
    event = from_datum(name, datum)
    if name == "segment_record" and key == _segment_key_text(datum):
        return key_of(event), event
    return RecordKey.decode(key), event


def _segment_key_text(datum: dict[str, Any]) -> bytes:
    # RecordKey.decode parses these very texts the way from_datum does, so equal bytes decode to the event's key.
    return f"segment:{datum['topic_id']}:{datum['partition']}:{datum['segment_id']}".encode()


def is_current(value: bytes) -> bool:
    """Whether `value` was written with the newest version of its schema: such bytes re-encode to themselves,
    so a reader may store them as they are."""
    version = registry().by_fingerprint.get(value[2:_HEADER][::-1])
    return version is not None and registry().current[version.name] is version


def decode_datum(value: bytes, plain_ids: bool = False) -> tuple[str, dict[str, Any]]:
    """(schema name, datum) of an encoded event; with `plain_ids`, topic and segment ids stay text."""
    if len(value) < _HEADER or value[:2] != MAGIC:
        raise DecodeError("value does not start with the Avro single-object marker C3 01")
    fp = value[2:_HEADER][::-1]
    writer = registry().by_fingerprint.get(fp)
    if writer is None:
        raise DecodeError(f"unknown schema fingerprint {fp.hex()}: written by a newer tierlog? upgrade this node")
    reader = registry().current[writer.name]
    if plain_ids and writer.program is not None and type(value) is bytes and (
            reader is writer or (writer.name, writer.version) in _READ_AS_WRITTEN):
        assert _avro_reader is not None  # a program is compiled only with the reader there
        try:
            return writer.name, _avro_reader.read(writer.program, value, _HEADER)
        except ValueError:
            pass  # bytes the C reader does not read exactly: fastavro decodes them or says what is wrong
    # Schema resolution is only needed (and only paid for) when an older writer wrote the record.
    if plain_ids:
        writer_schema, reader_schema = writer.plain, None if reader is writer else reader.plain
    else:
        writer_schema, reader_schema = writer.schema, None if reader is writer else reader.schema
    try:
        datum = fastavro.schemaless_reader(io.BytesIO(value[_HEADER:]), writer_schema, reader_schema)
    except Exception as exc:  # fastavro raises many types for truncated or garbled bytes
        raise DecodeError(f"cannot decode {writer.name} v{writer.version}: {exc}") from exc
    if not isinstance(datum, dict):
        raise DecodeError(f"{writer.name} decoded to {type(datum).__name__}, expected a record")
    return writer.name, datum


def _tp_fields(tp: TopicIdPartition) -> dict[str, Any]:
    return {"topic_id": str(tp.topic_id), "topic": tp.topic, "partition": tp.partition}


def _tp_from(datum: dict[str, Any]) -> TopicIdPartition:
    return _topic_id_partition(str(datum["topic_id"]), datum["topic"], datum["partition"])


@lru_cache(maxsize=65536)
def _topic_id_partition(topic_id: str, topic: str, partition: int) -> TopicIdPartition:
    # Few user partitions recur across millions of events; building each once saves most decode time.
    return TopicIdPartition(uuid.UUID(topic_id), topic, partition)


_SEGMENT_STATES = RemoteLogSegmentState.__members__


def _as_uuid(value: Any) -> uuid.UUID:
    return value if isinstance(value, uuid.UUID) else uuid_from_text(str(value))


# Each checkpoint of an epoch restates the segments displaced (or overwritten) in it, so the same ids come again and
# again.
@lru_cache(maxsize=65536)
def _displaced_id(value: str) -> uuid.UUID:
    return _as_uuid(value)


def to_datum(event: MetadataEvent) -> tuple[str, dict[str, Any]]:
    if isinstance(event, RemoteLogSegmentMetadata):
        segment_id = event.remote_log_segment_id
        return "segment_record", {
            **_tp_fields(segment_id.topic_id_partition),
            "segment_id": str(segment_id.id),
            "start_offset": event.start_offset,
            "end_offset": event.end_offset,
            "max_timestamp_ms": event.max_timestamp_ms,
            "broker_id": event.broker_id,
            "event_timestamp_ms": event.event_timestamp_ms,
            "segment_size_in_bytes": event.segment_size_in_bytes,
            "segment_leader_epochs": [
                {"epoch": e, "start_offset": o} for e, o in event.segment_leader_epochs.items()
            ],
            "custom_metadata": event.custom_metadata,
            "state": event.state.name,
            "txn_idx_empty": event.txn_idx_empty,
        }
    if isinstance(event, RemotePartitionDeleteMetadata):
        return "partition_delete_record", {
            **_tp_fields(event.topic_id_partition),
            "state": event.state.name,
            "event_timestamp_ms": event.event_timestamp_ms,
            "broker_id": event.broker_id,
        }
    if isinstance(event, EpochCheckpoint):
        return "epoch_checkpoint_record", {
            **_tp_fields(event.topic_id_partition),
            "epochs": [
                {
                    "epoch": lineage.epoch,
                    "highest_log_offset": lineage.highest_log_offset,
                    "displaced_segment_ids": sorted(str(s) for s in lineage.displaced_segment_ids),
                    "overwritten_segment_ids": sorted(str(s) for s in lineage.overwritten_segment_ids),
                }
                for lineage in event.epochs
            ],
            "event_timestamp_ms": event.event_timestamp_ms,
            "broker_id": event.broker_id,
            "reflects_offset": event.reflects_offset,
            "whole_partition": event.whole_partition,
        }
    raise InvalidArgumentError(f"not a tierlog metadata event: {type(event).__name__}")


def from_datum(name: str, datum: dict[str, Any]) -> MetadataEvent:
    try:
        tp = _tp_from(datum)
        if name == "segment_record":
            # Positional, and a one-epoch list read without a loop: this runs once per segment record of a rebuild.
            epochs = datum["segment_leader_epochs"]
            start = datum["start_offset"]
            if len(epochs) == 1:  # its epoch mostly starts at the segment's start: one int object for both
                first = epochs[0]["start_offset"]
                by_epoch = {epochs[0]["epoch"]: start if first == start else first}
            else:
                by_epoch = {e["epoch"]: e["start_offset"] for e in epochs}
            return RemoteLogSegmentMetadata.from_record(
                RemoteLogSegmentId.from_record(tp, _as_uuid(datum["segment_id"])),
                start,
                datum["end_offset"],
                datum["max_timestamp_ms"],
                datum["broker_id"],
                datum["event_timestamp_ms"],
                datum["segment_size_in_bytes"],
                by_epoch,
                datum["custom_metadata"],
                _SEGMENT_STATES[datum["state"]],
                datum.get("txn_idx_empty", False),
            )
        if name == "partition_delete_record":
            return RemotePartitionDeleteMetadata(
                topic_id_partition=tp,
                state=RemotePartitionDeleteState[datum["state"]],
                event_timestamp_ms=datum["event_timestamp_ms"],
                broker_id=datum["broker_id"],
            )
        if name == "epoch_checkpoint_record":
            return EpochCheckpoint(
                topic_id_partition=tp,
                epochs=tuple(
                    EpochLineage.from_record(
                        e["epoch"],
                        e["highest_log_offset"],
                        frozenset(map(_displaced_id, e["displaced_segment_ids"])),
                        frozenset(map(_displaced_id, e.get("overwritten_segment_ids", ()))),
                    )
                    for e in datum["epochs"]
                ),
                event_timestamp_ms=datum["event_timestamp_ms"],
                broker_id=datum["broker_id"],
                reflects_offset=datum.get("reflects_offset"),
                whole_partition=datum.get("whole_partition", True),
            )
    except (InvalidArgumentError, KeyError, ValueError, TypeError) as exc:
        raise DecodeError(f"{name} holds invalid values: {exc}") from exc
    raise DecodeError(f"no event type for schema {name}")


def decode_packed_segment(value: bytes, tp: TopicIdPartition) -> tuple[int, bytes]:
    """A stored segment's id as an int, and the segment packed for partition `tp` (rlmm.packed): what packing
    `decode(value)` gives. A segment of one leader epoch whose values are plainly within Kafka's ranges (a view's
    segments, read whole when a partition is first served) is packed from its datum, without building the
    metadata's objects; any other goes through `decode`, which judges it."""
    name, datum = decode_datum(value, plain_ids=True)
    if name == "segment_record" and len(datum["segment_leader_epochs"]) == 1:
        only = datum["segment_leader_epochs"][0]
        epoch, epoch_start = only["epoch"], only["start_offset"]
        start, end, max_timestamp = datum["start_offset"], datum["end_offset"], datum["max_timestamp_ms"]
        broker, event_timestamp, size = datum["broker_id"], datum["event_timestamp_ms"], datum["segment_size_in_bytes"]
        state = _SEGMENT_STATES.get(datum["state"])
        if state is not None and epoch_plainly_in_range(epoch, epoch_start, start, end) \
                and values_plainly_in_range(start, end, max_timestamp, broker, event_timestamp, size):
            segment_id = _as_uuid(datum["segment_id"])
            own = _tp_from(datum)
            return segment_id.int, packed.pack_fields(
                start, end, segment_id.bytes, max_timestamp, event_timestamp, broker, size, state,
                datum.get("txn_idx_empty", False), epoch, epoch_start, [], datum["custom_metadata"],
                None if own == tp else own.topic)
    md = from_datum(name, datum)
    if not isinstance(md, RemoteLogSegmentMetadata):
        raise DecodeError(f"expected a stored segment, found a {name}")
    return md.remote_log_segment_id.id.int, packed.pack(md, tp)


def clear_caches() -> None:
    """Empty the decoding caches (a node clears them once a backlog is applied; they refill as needed)."""
    _topic_id_partition.cache_clear()
    _displaced_id.cache_clear()
