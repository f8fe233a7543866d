"""The C reader of tierlog's Avro events (rlmm/_avro_reader.c) gives exactly what fastavro gives, for every version of
every schema; whatever it does not read exactly (garbage, truncations) it leaves to fastavro, which says what is wrong.
"""

from __future__ import annotations

import io
import json
from typing import Any

import fastavro
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlmm import codec
from rlmm.errors import DecodeError

# Built by `pip install -e .` (setup.py) on every machine with a C compiler, CI's among them: a failed build must
# fail here, not pass the suite on fastavro alone.
from rlmm import _avro_reader  # isort: skip

VERSIONS = sorted(codec.registry().by_fingerprint.values(), key=lambda v: (v.name, v.version))
READER_SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _plain_json(version: codec.SchemaVersion) -> Any:
    path = codec.SCHEMA_DIR / f"{version.name}.v{version.version}.avsc"
    return codec._without_uuid_types(json.loads(path.read_text()))


def datums(schema: Any, named: dict[str, Any] | None = None) -> st.SearchStrategy[Any]:
    """Any datum of a (plain) schema, as fastavro writes and reads it."""
    named = {} if named is None else named
    if isinstance(schema, list):
        return st.one_of([datums(branch, named) for branch in schema])
    if isinstance(schema, str):
        primitive = {"null": st.none(), "boolean": st.booleans(), "int": st.integers(-(2**31), 2**31 - 1),
                     "long": st.integers(-(2**63), 2**63 - 1), "string": st.text(max_size=40),
                     "bytes": st.binary(max_size=40)}
        return primitive[schema] if schema in primitive else named[schema]
    kind = schema["type"]
    if kind == "enum":
        named[schema["name"]] = strategy = st.sampled_from(schema["symbols"])
    elif kind == "array":
        strategy = st.lists(datums(schema["items"], named), max_size=5)
    elif kind == "record":
        strategy = st.fixed_dictionaries({f["name"]: datums(f["type"], named) for f in schema["fields"]})
        named[schema["name"]] = strategy
    else:
        strategy = datums(kind, named)
    return strategy


def _encoded(version: codec.SchemaVersion, datum: Any) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, version.plain, datum)
    return codec.MAGIC + version.fingerprint[::-1] + out.getvalue()


def _fastavro(version: codec.SchemaVersion, value: bytes) -> Any:
    return fastavro.schemaless_reader(io.BytesIO(value[codec._HEADER:]), version.plain, None)


def as_tuples(schema: Any, datum: Any, named: dict[str, Any] | None = None) -> Any:
    """A datum of a (plain) schema with its records as tuples of their fields' values (what a program compiled
    with records_as_tuples reads)."""
    named = {} if named is None else named
    if isinstance(schema, list):  # a union: the branch the datum is of (only one record branch in our schemas)
        records = [b for b in schema if (isinstance(b, dict) and b["type"] == "record")
                   or (isinstance(b, str) and b in named)]
        return as_tuples(records[0], datum, named) if isinstance(datum, dict) and records else datum
    if isinstance(schema, str):
        return as_tuples(named[schema], datum, named) if schema in named else datum
    if schema["type"] == "record":
        named[schema["name"]] = schema
        return tuple(as_tuples(field["type"], datum[field["name"]], named) for field in schema["fields"])
    if schema["type"] == "array":
        return [as_tuples(schema["items"], item, named) for item in datum]
    return datum


def test_every_schema_version_is_read_in_c() -> None:
    assert all(version.program is not None for version in VERSIONS), [v for v in VERSIONS if v.program is None]
    assert all(version.tuples is not None for version in VERSIONS), [v for v in VERSIONS if v.tuples is None]


@pytest.mark.parametrize("version", VERSIONS, ids=lambda v: f"{v.name}.v{v.version}")
@READER_SETTINGS
@given(data=st.data())
def test_it_reads_what_fastavro_reads(version: codec.SchemaVersion, data: st.DataObject) -> None:
    datum = data.draw(datums(_plain_json(version)))
    value = _encoded(version, datum)
    read = _avro_reader.read(version.program, value, codec._HEADER)
    assert read == _fastavro(version, value) == datum
    assert _avro_reader.read(version.program, value + b"trailing", codec._HEADER) == read  # as fastavro: ignored
    # Read as tuples: the same values, by position.
    assert _avro_reader.read(version.tuples, value, codec._HEADER) == as_tuples(_plain_json(version), datum)


@pytest.mark.parametrize("version", VERSIONS, ids=lambda v: f"{v.name}.v{v.version}")
@READER_SETTINGS
@given(data=st.data())
def test_bytes_it_reads_from_garbage_are_what_fastavro_reads_or_it_refuses_them(
    version: codec.SchemaVersion, data: st.DataObject
) -> None:
    valid = bytearray(_encoded(version, data.draw(datums(_plain_json(version)))))
    body = data.draw(st.sampled_from(["truncated", "flipped", "random"]))
    if body == "truncated":
        valid = valid[:data.draw(st.integers(codec._HEADER, len(valid)))]
    elif body == "flipped" and len(valid) > codec._HEADER:
        at = data.draw(st.integers(codec._HEADER, len(valid) - 1))
        valid[at] = data.draw(st.integers(0, 255))
    else:
        valid = valid[:codec._HEADER] + bytearray(data.draw(st.binary(max_size=64)))
    value = bytes(valid)
    try:
        read = _avro_reader.read(version.program, value, codec._HEADER)
    except ValueError:
        with pytest.raises(ValueError):  # refused alike as tuples
            _avro_reader.read(version.tuples, value, codec._HEADER)
        return  # left to fastavro
    assert read == _fastavro(version, value)
    assert _avro_reader.read(version.tuples, value, codec._HEADER) == as_tuples(_plain_json(version), read)


def test_a_truncated_record_is_refused_with_fastavros_words() -> None:
    segment = codec.registry().current["segment_record"]
    value = _encoded(segment, {"topic_id": "t", "topic": "orders", "partition": 0, "segment_id": "s",
                               "start_offset": 0, "end_offset": 9, "max_timestamp_ms": 0, "broker_id": 0,
                               "event_timestamp_ms": 0, "segment_size_in_bytes": 1,
                               "segment_leader_epochs": [{"epoch": 0, "start_offset": 0}],
                               "custom_metadata": None, "state": "COPY_SEGMENT_STARTED", "txn_idx_empty": False})
    with pytest.raises(ValueError):
        _avro_reader.read(segment.program, value[:-3], codec._HEADER)
    with pytest.raises(DecodeError, match=f"cannot decode segment_record v{segment.version}"):
        codec.decode_datum(value[:-3], plain_ids=True)


@pytest.mark.parametrize(("op", "garbage"), [
    ("long", b"\xff" * 11),  # a varint past 64 bits
    ("array", b"\xfe\xff\xff\xff\x0f"),  # a count far past the data
    ("array", b"\xff" * 9 + b"\x01"),  # the most negative count there is
    ("string", b"\x02\xff"),  # not UTF-8
    ("string", b"\x0a"),  # longer than the data
    ("enum", b"\x7f"),  # an index out of range
    ("boolean", b"\x02"),
    ("long", b""),
], ids=["overlong-varint", "array-count", "array-count-min", "not-utf8", "past-the-data", "enum-index", "boolean",
        "empty"])
def test_garbage_is_refused_at_once(op: str, garbage: bytes) -> None:
    program = {"long": (_avro_reader.OP_LONG,), "array": (_avro_reader.OP_ARRAY, (_avro_reader.OP_LONG,)),
               "string": (_avro_reader.OP_STRING,), "enum": (_avro_reader.OP_ENUM, ("A",)),
               "boolean": (_avro_reader.OP_BOOLEAN,)}[op]
    with pytest.raises(ValueError):
        _avro_reader.read(program, garbage, 0)


@pytest.mark.parametrize("program", [
    (), (99,), (_avro_reader.OP_LONG, 1), (_avro_reader.OP_RECORD, (("name",),)), (_avro_reader.OP_ENUM, (1,)),
    (_avro_reader.OP_ARRAY, "long"), [_avro_reader.OP_LONG], (_avro_reader.OP_TUPLE, ("name",)),
    (_avro_reader.OP_TUPLE, [(_avro_reader.OP_LONG,)]), (_avro_reader.OP_TUPLE, (("name", (_avro_reader.OP_LONG,)),)),
])
def test_a_malformed_program_is_not_taken(program: Any) -> None:
    assert not _avro_reader.check(program)


def test_a_schema_with_types_it_does_not_read_gets_no_program() -> None:
    assert codec.reader_program({"type": "record", "name": "R", "fields": [{"name": "f", "type": "double"}]}) is None
    assert codec.reader_program({"type": "map", "values": "long"}) is None
    named = {"type": "record", "name": "R", "namespace": "n", "fields": [
        {"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["A", "B"]}},
        {"name": "again", "type": "E"}, {"name": "full", "type": "n.E"}]}
    program = codec.reader_program(named)
    assert _avro_reader.read(program, b"\x00\x02\x00", 0) == {"e": "A", "again": "B", "full": "A"}
    assert _avro_reader.read(codec.reader_program(named, records_as_tuples=True), b"\x00\x02\x00", 0) == \
        ("A", "B", "A")
