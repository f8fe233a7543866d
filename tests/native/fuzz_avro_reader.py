"""Fuzz target of rlmm/_avro_reader.c (run by run_fuzz.py).

Differential: for a random schema (records, enums, arrays, unions, primitives), compiled with its records read as
dicts or as tuples, and bytes that are a random datum's encoding, cut or changed, or random, what the C reader reads
is what fastavro reads (the reader rlmm.codec falls back to; its records turned into tuples for a tuple program); it
may only refuse with ValueError. Misuse: any other program (random nested tuples, lists, ints, text)
and arguments are refused with TypeError or ValueError; a program check() took never gives TypeError.
"""

from __future__ import annotations

import io
from typing import Any

import atheris
import fastavro

from rlmm import _avro_reader, codec

PRIMITIVES = ("null", "boolean", "int", "long", "string", "bytes")


class _Schemas:
    """A random schema drawn from the fuzzer's bytes, with the names it defined."""

    def __init__(self, data: atheris.FuzzedDataProvider) -> None:
        self.data = data
        self.names = 0

    def draw(self, depth: int, union: bool = True) -> Any:
        kind = self.data.ConsumeIntInRange(0, 5 if depth >= 4 else 9 if union else 8)
        if kind < 6:
            return PRIMITIVES[kind]
        self.names += 1
        name = f"N{self.names}"
        if kind == 6:
            count = self.data.ConsumeIntInRange(1, 5)
            return {"type": "enum", "name": name, "symbols": [f"S{i}" for i in range(count)]}
        if kind == 7:  # of items of at least a byte: the reader leaves more items than bytes to fastavro
            items = self.draw(depth + 1)
            return {"type": "array", "items": "long" if _encodes_empty(items) else items}
        if kind == 8:
            fields = [{"name": f"f{i}", "type": self.draw(depth + 1)} for i in range(self.data.ConsumeIntInRange(0, 4))]
            return {"type": "record", "name": name, "fields": fields}
        # A union: distinct primitives, and at most one named or array branch (Avro's rule).
        branches: list[Any] = sorted({PRIMITIVES[self.data.ConsumeIntInRange(0, 5)]
                                      for _ in range(self.data.ConsumeIntInRange(1, 3))})
        if self.data.ConsumeBool():
            branch = self.draw(depth + 1, union=False)
            if branch not in branches:
                branches.append(branch)
        return branches


def _encodes_empty(schema: Any) -> bool:
    """Whether a datum of `schema` may take no bytes."""
    if schema == "null":
        return True
    return isinstance(schema, dict) and schema["type"] == "record" and all(
        _encodes_empty(field["type"]) for field in schema["fields"])


def _datum(schema: Any, data: atheris.FuzzedDataProvider) -> Any:
    """A random datum of `schema`, as fastavro writes it."""
    if isinstance(schema, list):
        return _datum(schema[data.ConsumeIntInRange(0, len(schema) - 1)], data)
    if isinstance(schema, str):
        return {"null": lambda: None, "boolean": data.ConsumeBool,
                "int": lambda: data.ConsumeIntInRange(-(2**31), 2**31 - 1),
                "long": lambda: data.ConsumeIntInRange(-(2**63), 2**63 - 1),
                "string": lambda: data.ConsumeUnicodeNoSurrogates(data.ConsumeIntInRange(0, 20)),
                "bytes": lambda: data.ConsumeBytes(data.ConsumeIntInRange(0, 20))}[schema]()
    if schema["type"] == "enum":
        return schema["symbols"][data.ConsumeIntInRange(0, len(schema["symbols"]) - 1)]
    if schema["type"] == "array":
        return [_datum(schema["items"], data) for _ in range(data.ConsumeIntInRange(0, 4))]
    return {field["name"]: _datum(field["type"], data) for field in schema["fields"]}


def _differential(data: atheris.FuzzedDataProvider) -> None:
    schema = _Schemas(data).draw(0)
    try:
        parsed = fastavro.parse_schema(schema)
    except Exception:  # a union the generator got wrong: not the reader's business
        return
    as_tuples = data.ConsumeBool()  # its records read as tuples of their fields' values
    program = codec.reader_program(schema, records_as_tuples=as_tuples)
    assert program is not None and _avro_reader.check(program), schema
    how = data.ConsumeIntInRange(0, 3)
    if how == 3:
        encoded = data.ConsumeBytes(data.ConsumeIntInRange(0, 64))
    else:
        out = io.BytesIO()
        fastavro.schemaless_writer(out, parsed, _datum(schema, data))
        encoded = bytearray(out.getvalue())
        if how == 1 and encoded:  # cut short
            del encoded[data.ConsumeIntInRange(0, len(encoded) - 1):]
        elif how == 2 and encoded:  # one byte changed
            encoded[data.ConsumeIntInRange(0, len(encoded) - 1)] = data.ConsumeIntInRange(0, 255)
    value = bytes(encoded)
    start = data.ConsumeIntInRange(0, 3)
    value = bytes(start) + value
    try:
        read = _avro_reader.read(program, value, start)
    except ValueError:
        assert how != 0, (schema, value)  # a datum fastavro wrote is read
        return
    expected = fastavro.schemaless_reader(io.BytesIO(value[start:]), parsed, None)
    if as_tuples:
        expected = _tuples(schema, expected, {})
    assert read == expected, (schema, value, read, expected)


def _tuples(schema: Any, datum: Any, named: dict[str, Any]) -> Any:
    """fastavro's datum of `schema` with its records as tuples of their fields' values. A union holds at most one
    array branch (Avro's rule) and at most one record branch (_Schemas draws no record reference), so a list in one is
    of its array branch and a dict of its record branch."""
    if isinstance(schema, list):
        kind = "record" if isinstance(datum, dict) else "array" if isinstance(datum, list) else None
        branches = [branch for branch in schema if isinstance(branch, dict) and branch["type"] == kind]
        return _tuples(branches[0], datum, named) if branches else datum
    if isinstance(schema, str) or schema["type"] == "enum":
        return datum
    if schema["type"] == "array":
        return [_tuples(schema["items"], item, named) for item in datum]
    return tuple(_tuples(field["type"], datum[field["name"]], named) for field in schema["fields"])


def _program(data: atheris.FuzzedDataProvider, depth: int) -> Any:
    """Something shaped like a program, or not: ops in and out of range, wrong sizes, other types, deep nesting."""
    kind = data.ConsumeIntInRange(0, 9)
    if kind == 0 or depth > 40:
        return [None, 0, -1, 1 << 70, "long", b"", 1.5, True][data.ConsumeIntInRange(0, 7)]
    items = [data.ConsumeIntInRange(-2, 12) if data.ConsumeBool() else _program(data, depth + 1)
             for _ in range(data.ConsumeIntInRange(0, 3))]
    if kind <= 6 and items:
        items[0] = data.ConsumeIntInRange(-1, 12)
    if kind == 7:
        items = [data.ConsumeIntInRange(0, 10), tuple(
            (data.ConsumeUnicodeNoSurrogates(2), _program(data, depth + 1)) if data.ConsumeBool()
            else _program(data, depth + 1) for _ in range(data.ConsumeIntInRange(0, 3)))]
    return items if kind == 8 else tuple(items)


def _misuse(data: atheris.FuzzedDataProvider) -> None:
    program = _program(data, 0)
    taken = _avro_reader.check(program)
    value = data.ConsumeBytes(data.ConsumeIntInRange(0, 48))
    args: list[Any] = [program, value, data.ConsumeIntInRange(-3, len(value) + 3)]
    wrong = data.ConsumeIntInRange(0, 6)
    if wrong == 1:
        args[1] = bytearray(value)
    elif wrong == 2:
        args[2] = [1 << 70, -(1 << 70), 1.0, "0", None][data.ConsumeIntInRange(0, 4)]
    elif wrong == 3:
        args = args[:data.ConsumeIntInRange(0, 2)]
    try:
        _avro_reader.read(*args)
    except TypeError:
        assert not (taken and wrong == 0), (program, value)
    except ValueError:
        pass


def one_input(raw: bytes) -> None:
    data = atheris.FuzzedDataProvider(raw)
    if data.ConsumeIntInRange(0, 2):
        _differential(data)
    else:
        _misuse(data)
