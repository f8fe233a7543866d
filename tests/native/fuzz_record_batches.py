"""Fuzz target of rlmm/_record_batches.c (run by run_fuzz.py): read() gives what rlmm.record_batches.read gives for any
bytes (the same records, next offset and transactional flag, or a ValueError with the same message, or the same
exception the decompressor raised), and refuses arguments of other types with TypeError.

Inputs are batches encoded here from the fuzzer's choices (so that most reach the records), then garbled, cut short or
joined to raw bytes; a decompressor drawn per input gives records uncompressed, decompresses for real, returns what
is not bytes, or raises. A quarter of the inputs go to keep() instead, against rlmm.record_batches.keep: runs of
records with gaps, tombstones and repeated keys over a window already holding some, half of them keeping only the
records of some user partitions, or only the others (keep's `only`), over keys of every shape. Half of the
well-formed batches are also read and kept in one pass (read_keep), against rlmm.record_batches.read_keep: the same
outcome, window and named partitions; read_keep refuses arguments of other types or number, and meets a `name` that
changes its containers (the window, `first`, `named`) mid-call without reading what it freed."""

from __future__ import annotations

import contextlib
import copy
import struct
from typing import Any

import atheris

from rlmm import _record_batches, record_batches


def _varint(value: int) -> bytes:
    raw = (value << 1) ^ (value >> 63)
    raw &= (1 << 64) - 1
    out = bytearray()
    while True:
        byte = raw & 0x7F
        raw >>= 7
        if raw:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _part(data: atheris.FuzzedDataProvider, nullable: bool = True) -> bytes:
    if nullable and data.ConsumeIntInRange(0, 5) == 0:
        return _varint(-1)
    content = data.ConsumeBytes(data.ConsumeIntInRange(0, 24))
    return _varint(len(content)) + content


def _record(data: atheris.FuzzedDataProvider) -> bytes:
    body = bytes([data.ConsumeIntInRange(0, 255)]) + _varint(data.ConsumeIntInRange(-(1 << 40), 1 << 40))
    body += _varint(data.ConsumeIntInRange(-3, 40)) + _part(data) + _part(data)
    headers = data.ConsumeIntInRange(0, 3)
    body += _varint(headers) + b"".join(_part(data, nullable=data.ConsumeIntInRange(0, 9) == 0) + _part(data)
                                          for _ in range(headers))
    return _varint(len(body)) + body


def _batch(data: atheris.FuzzedDataProvider) -> bytes:
    count = data.ConsumeIntInRange(0, 6)
    body = b"".join(_record(data) for _ in range(count))
    attributes = data.PickValueInList([0, 0, 0, 1, 2, 3, 4, 5, 0x10, 0x20, 0x30, 7])
    base = data.PickValueInList([0, 0, 5, 5, 1 << 40, -1, record_batches.MAX_BASE_OFFSET,
                                 record_batches.MAX_BASE_OFFSET + 1])
    head = struct.pack(">ibIhiqqqhii", 0, data.PickValueInList([2, 2, 2, 1, 0]), 0, attributes,
                       data.ConsumeIntInRange(-1, 8), 0, 0, -1, -1, -1,
                       count if data.ConsumeIntInRange(0, 6) else data.ConsumeIntInRange(-2, 9))
    length = len(head) + len(body)
    if data.ConsumeIntInRange(0, 9) == 0:
        length = data.ConsumeIntInRange(-5, length + 5)
    return struct.pack(">qi", base, length) + head + body


def _decompressor(kind: int) -> Any:
    def identity(codec: int, payload: bytes) -> bytes:
        return payload

    def not_bytes(codec: int, payload: bytes) -> Any:
        return bytearray(payload) if codec % 2 else None

    def raising(codec: int, payload: bytes) -> bytes:
        raise KeyError(f"codec {codec}")

    return [identity, record_batches.decompress, not_bytes, raising][kind]


def _refused(call: Any, args: list[Any], misuse: object) -> None:
    """Misuse of `call` must raise TypeError or ValueError."""
    try:
        call(*args)
    except (TypeError, ValueError):
        return
    raise AssertionError(f"{call.__name__} accepted misuse {misuse}: {args!r}")


def _outcome(read: Any, *args: Any) -> tuple[Any, ...]:
    try:
        return ("read", read(*args))
    except (ValueError, KeyError) as exc:
        return (type(exc).__name__, str(exc))


SEGMENT_ID = b"00112233-4455-6677-8899-aabbccddeeff"
KEYS = [b"segment:a", b"segment:b", b"epochs:a", b"", b"segment:", b"segmen",
        # user partitions' keys (rlmm.events.RecordKey), and keys near their shapes
        b"segment:t1:0:" + SEGMENT_ID, b"segment:t1:1:" + SEGMENT_ID, b"segment:t2:0:" + SEGMENT_ID[:-1] + b"0",
        b"epochs:t1:0:3", b"epochs:t1:1", b"partition-delete:t2:0", b"segment:t1:0:x", b"x:t1", b":::",
        b"segment:" + SEGMENT_ID + b":" + SEGMENT_ID]
PREFIX = b"segment:"


def _named_by(text: bytes) -> bytes | None:
    """A naming of partition texts for keep's `only`: some name none."""
    return None if b"x" in text or not text else b"key-" + text


def _kept(data: atheris.FuzzedDataProvider) -> tuple[Any, ...]:
    """A kept record as a window holds one: (partition, offset, key, value or a tombstone, None, cleaned)."""
    key = data.PickValueInList(KEYS)
    return 0, data.ConsumeIntInRange(0, 50), key, data.PickValueInList([None, b"v", b"w"]), None, data.ConsumeBool()


def _only(data: atheris.FuzzedDataProvider, raising: bool) -> tuple[Any, ...]:
    """A keep's `only`: some user partitions' records kept, or the others; with `raising`, at times a `name` that
    raises (the same exception from both)."""
    first = {key for key in (b"key-t1:0", b"key-t2:0", b"key-t1:1") if data.ConsumeBool()}
    named: dict[bytes, Any] = {b"t1:1": data.PickValueInList([None, b"key-t1:1", b"elsewhere"])}
    name: Any = _named_by
    if raising and data.ConsumeIntInRange(0, 9) == 0:
        def name(text: bytes) -> Any:
            raise KeyError(text)
    return data.PickValueInList([frozenset(first), first]), named, name, data.ConsumeBool()


def _window(data: atheris.FuzzedDataProvider) -> dict[bytes, Any]:
    newest: dict[bytes, Any] = {}
    for _ in range(data.ConsumeIntInRange(0, 4)):
        entry = _kept(data)
        newest[entry[2]] = entry
    return newest


def _read_keep_input(data: atheris.FuzzedDataProvider, read_args: list[Any]) -> None:
    """read_keep() gives what read() then keep() give (rlmm.record_batches.read_keep) and leaves the same window; or
    refuses misuse with TypeError or ValueError. (A `name` that raises is keep's to meet: read_keep stops at the first
    exception either way, a window part filled, which its callers discard.)"""
    misuse = data.ConsumeIntInRange(0, 6)
    args: list[Any] = [*read_args, _window(data), [], data.PickValueInList([0, 3, 49]),
                       data.PickValueInList([0, 3, 1 << 40]), data.ConsumeBool(), PREFIX,
                       _only(data, raising=False) if data.ConsumeBool() else None]
    if misuse < 4:
        copied = copy.deepcopy(args[4:])
        expected_outcome = _outcome(record_batches.read_keep, *args[:4], *copied)
        got = _outcome(_record_batches.read_keep, *args)
        assert got == expected_outcome, (args, got, expected_outcome)
        if got[0] == "read":
            assert args[4:6] == copied[:2], (args, copied)
        if got[0] == "read" and args[10] is not None:
            assert args[10][1] == copied[6][1], (args[10][1], copied[6][1])  # the same partitions named
        return
    if misuse == 6:  # a `name` that changes what read_keep reads from: it answers from what it holds, or raises
        first: set[bytes] = set()
        named: dict[bytes, Any] = {}
        drops = data.ConsumeIntInRange(0, 3)

        def name(text: bytes) -> Any:
            named.clear()
            first.symmetric_difference_update({b"key-t1:0", b"key-" + text})
            if drops == 1:  # the window too
                args[4].pop(next(iter(args[4]), None), None)
            return _named_by(text) if drops != 2 else bytearray(text)

        args[10] = (first, named, name, data.ConsumeBool())
        with contextlib.suppress(ValueError, KeyError, TypeError):
            _record_batches.read_keep(*args)
        return
    if misuse == 4:  # an argument of another type
        changed = data.ConsumeIntInRange(4, 10)
        replaced, args[changed] = args[changed], data.PickValueInList([None, 1.5, "x", (), {}, [], 1 << 70])
        if type(args[changed]) is type(replaced) or (changed == 10 and args[changed] is None):
            return  # an argument of its type all the same
    else:  # another number of arguments
        args = args[:data.ConsumeIntInRange(0, 10)] if data.ConsumeBool() else [*args, None]
    _refused(_record_batches.read_keep, args, misuse)


def _keep_input(data: atheris.FuzzedDataProvider) -> None:
    """keep() changes `newest` and the superseded tombstones as rlmm.record_batches.keep does, and gives the same
    offsets and flag; misuse is a TypeError or ValueError."""
    misuse = data.ConsumeIntInRange(0, 9)
    newest = _window(data)
    expected = data.PickValueInList([0, 5, 1 << 40, 1 << 62])
    offset = expected if data.ConsumeIntInRange(0, 3) else data.ConsumeIntInRange(0, 9)
    records: list[Any] = []
    for _ in range(data.ConsumeIntInRange(0, 12)):
        offset += data.PickValueInList([0, 1, 1, 1, 2, 7]) if records else 0
        records.append((offset, data.PickValueInList([*KEYS, None]), data.PickValueInList([None, b"x", b"y", b""])))
    args: list[Any] = [newest, [], data.PickValueInList([0, 3, 49]), records, expected, data.ConsumeBool(), PREFIX]
    if data.ConsumeBool():  # only the records of some user partitions, or only the others
        args.append(_only(data, raising=misuse < 7))
    if misuse < 7:
        copied = copy.deepcopy(args)
        expected_outcome = _outcome(record_batches.keep, *copied)
        got = _outcome(_record_batches.keep, *args)
        assert got == expected_outcome and args[:2] == copied[:2], (args, copied, got, expected_outcome)
        if len(args) == 8:
            assert args[7][1] == copied[7][1], (args[7][1], copied[7][1])  # the same partitions named
        return
    if misuse > 7:  # records or entries of other shapes: met by every record's keeping
        args = args[:7]
    if misuse == 7 and len(args) == 8 and data.ConsumeBool():  # an `only` of another shape
        args[7] = data.PickValueInList([(), (frozenset(),), [frozenset(), {}, _named_by, True],
                                        (frozenset(), {}, _named_by, 1), (frozenset(), [], _named_by, True),
                                        ([], {}, _named_by, True), (frozenset(), {}, None, True), "only"])
        try:
            _record_batches.keep(*args)
        except TypeError:
            return
        raise AssertionError(f"keep accepted only={args[7]!r}")
    if misuse == 7:  # containers, numbers or a prefix of other types
        changed = data.ConsumeIntInRange(0, 6)
        replaced, args[changed] = args[changed], data.PickValueInList([None, 1.5, "x", (), {}, [], 1 << 70])
        if type(args[changed]) is type(replaced) and changed != 4:
            return  # an argument of its type all the same (an empty dict or list, a large partition number)
    elif misuse == 8:  # records not (int, bytes | None, bytes | None), or entries that are not kept records
        bad = data.PickValueInList([(1,), (1, b"k", b"v", 0), [1, b"k", b"v"], (1.0, b"k", b"v"), (1, "k", b"v"),
                                    (1, b"k", bytearray(b"v")), ((1 << 63) - 1, b"k", b"v"), None])
        if data.ConsumeBool() or not newest:
            records.insert(data.ConsumeIntInRange(0, len(records)), bad)
        else:
            newest[next(iter(newest))] = data.PickValueInList([(), None, (1, 2, 3)])
            records.insert(0, (0, next(iter(newest)), b"v"))
    else:  # another number of arguments
        args = args[:data.ConsumeIntInRange(0, 6)] if data.ConsumeBool() else [*args, None, None][:9]
    _refused(_record_batches.keep, args, misuse)


def one_input(raw: bytes) -> None:
    data = atheris.FuzzedDataProvider(raw)
    if data.ConsumeIntInRange(0, 3) == 0:
        _keep_input(data)
        return
    misuse = data.ConsumeIntInRange(0, 7)
    parts = [_batch(data) for _ in range(data.ConsumeIntInRange(0, 4))]
    encoded = bytearray(b"".join(parts))
    for _ in range(data.PickValueInList([0, 0, 0, 1, 2, 3])):
        if encoded:
            encoded[data.ConsumeIntInRange(0, len(encoded) - 1)] = data.ConsumeIntInRange(0, 255)
    if encoded and data.ConsumeIntInRange(0, 3) == 0:
        del encoded[data.ConsumeIntInRange(0, len(encoded) - 1):]
    encoded += data.ConsumeBytes(data.PickValueInList([0, 0, 0, 12, 64]))
    start = data.PickValueInList([0, 0, 0, 3, 1 << 40, -1])
    end = data.PickValueInList([1 << 62, 1 << 62, 1 << 62, 10, 0, (1 << 63) - 1])
    decompress = _decompressor(data.PickValueInList([0, 0, 0, 1, 2, 3]))
    args: list[Any] = [bytes(encoded), start, end, decompress]
    if misuse < 4 and data.ConsumeBool():
        _read_keep_input(data, args)
        return
    if misuse < 4:  # well-formed arguments: the same outcome either way
        expected = _outcome(record_batches.read, *args)
        got = _outcome(_record_batches.read, *args)
        assert got == expected, (args, got, expected)
        return
    if misuse == 4:  # data of another type
        args[0] = data.PickValueInList([bytearray(encoded), memoryview(encoded), encoded.decode("latin-1"), None])
    elif misuse == 5:  # an offset of another type, or out of int64
        args[data.ConsumeIntInRange(1, 2)] = data.PickValueInList([1.0, "1", None, True, 1 << 63, -(1 << 63) - 1])
    elif misuse == 6:  # a decompressor that cannot be called
        args[3] = data.PickValueInList([None, 3, b"x"])
    else:  # another number of arguments
        args = args[:data.ConsumeIntInRange(0, 3)] if data.ConsumeBool() else [*args, None]
    _refused(_record_batches.read, args, misuse)
