"""Fuzz target of rlmm/_lean_fold.c (run by run_fuzz.py): finished() folds a record only as LeanFold._segment_record
folds it (the same key returned, the same partitions held after), and otherwise changes nothing; it refuses
arguments of other types with TypeError and raises what a call it makes raises. fold_run() folds a run of records
exactly as finished() does one by one, stopping where that stops; rows() gives exactly lean_fold._rows's entries, and
refuses containers, ids and numbers of other types or ranges.

Each input builds a LeanFold's state by folding a few records in Python, then hands one more record to both: datums
drawn around every check (texts that are not an id's, numbers at the edges of their ranges, keys that do not match,
one or two leader epochs, every state), of partitions named or not, held or not, folded by the rules or not. For
fold_run, a run of such records (some of other forms, requests' or other metadata partitions'), read by a reader
that gives their datums or raises; for rows, a partition's segments and index drawn around the packings' edges."""

from __future__ import annotations

import contextlib
import copy
from typing import Any

import atheris

from rlmm import _lean_fold
from rlmm.lean_fold import LeanFold, _Partition, _rows
from rlmm.types import INT32_MAX, INT64_MAX
from rlmm.view import FreshState

TOPIC_IDS = ["00000000-0000-0000-0000-00000000000a", "5f0c3e9a-1b2c-4d5e-8f90-a1b2c3d4e5f6",
             "5F0C3E9A-1B2C-4D5E-8F90-A1B2C3D4E5F6", "not-a-topic-id", "00000000-0000-0000-0000-000000000000"]
TOPICS = ["orders", "payments", "", "é", "a" * 300]
NUMBERS = [0, 1, 7, -1, INT32_MAX, INT32_MAX + 1, 1 << 70, True]
SEGMENTS = ["00112233-4455-6677-8899-aabbccddeeff", "00112233-4455-6677-8899-AABBCCDDEEFF",
            "ffeeddcc-bbaa-9988-7766-554433221100", "00112233-4455-6677-8899-aabbccddee f",
            "00112233-4455-6677-8899-aabbccddeefg", "0011223344556677-8899-aabb-ccddeeff", "00112233",
            "00112233-4455-6677-8899-aabbccddeeé", "\ud800" * 36]
OFFSETS = [0, 1, 5, 99, 100, 1000, INT64_MAX, INT64_MAX + 1, -1, -2, 1 << 80]
STATES = ["COPY_SEGMENT_FINISHED", "COPY_SEGMENT_FINISHED", "COPY_SEGMENT_STARTED", "DELETE_SEGMENT_STARTED",
          "DELETE_SEGMENT_FINISHED", "copy_segment_finished"]

# Values outside the form folded in C, by the datum's field.
CHANGES: dict[int, list[Any]] = {0: TOPIC_IDS, 1: TOPICS, 2: NUMBERS, 3: SEGMENTS, 4: OFFSETS, 5: OFFSETS,
                                 6: [-2, INT64_MAX + 1], 7: [-1, INT32_MAX + 1], 8: [-1, INT64_MAX + 1],
                                 9: [-1, INT32_MAX + 1], 12: STATES}


def _pick(data: atheris.FuzzedDataProvider, values: list[Any]) -> Any:
    return data.PickValueInList(values)


def _record(data: atheris.FuzzedDataProvider) -> tuple[int, bytes, tuple[Any, ...], bytes, bool | None]:
    """(offset, raw key, datum, value, skipped_before) of a segment record: of the form folded in C, then for most
    inputs with one or two of its values, its key or its shape changed."""
    topic_id, topic, number = _pick(data, TOPIC_IDS[:3]), _pick(data, TOPICS[:2]), _pick(data, NUMBERS[:3])
    segment = _pick(data, SEGMENTS[:3])
    start = _pick(data, OFFSETS[:6])
    end = start + _pick(data, [0, 9, 99])
    datum: Any = [topic_id, topic, number, segment, start, end, _pick(data, [0, -1, 5]), _pick(data, [0, 1]),
                  _pick(data, [0, 12]), _pick(data, [0, 1]), [(_pick(data, [0, 1, 2]), start)], None, STATES[0],
                  data.ConsumeBool()]
    skipped = _pick(data, [None, True])
    for _ in range(_pick(data, [0, 0, 1, 1, 2])):
        changed = data.ConsumeIntInRange(0, 14)
        if changed == 14:
            skipped = False
        elif changed == 10:  # no epoch, two, one out of range, or not a list of tuples
            datum[10] = _pick(data, [[], [(0, start), (1, end)], [(-1, start)], [(INT32_MAX + 1, start)],
                                     [(0, start - 1)], [(0, end + 1)], [(0, start)] * 2, ((0, start),), [[0, start]],
                                     [(0, start, 1)], None])
        else:
            datum[changed] = _pick(data, [*CHANGES.get(changed, []), None, 1.0, b"x", "7"])
    key = f"segment:{datum[0]}:{datum[2]}:{datum[3]}".encode(errors="surrogatepass")
    if data.ConsumeIntInRange(0, 9) == 0:
        key = _pick(data, [key[:-1], key + b"0", key.replace(b":", b";", 1), b"segment:", key.upper()])
    if data.ConsumeIntInRange(0, 29) == 0:
        datum = _pick(data, [datum[:13], [*datum, None], None])
    value = b"record-" + data.ConsumeBytes(data.ConsumeIntInRange(0, 8))
    return (_pick(data, [0, 1, 7, 1 << 40]), key, tuple(datum) if isinstance(datum, list) else datum, value,
            skipped)


def _fold() -> LeanFold:
    return LeanFold(FreshState())


def _state(lean: LeanFold) -> tuple[Any, ...]:
    return copy.deepcopy((lean._lean, lean._named, lean._ruled))


def _outcome(call: Any) -> tuple[str, Any]:
    try:
        return ("returned", call())
    except Exception as exc:  # a record the rules would word: the same exception from both sides
        return (type(exc).__name__, str(exc))


HEADER = b"\xc3\x01h"
INT32_MIN = -(1 << 31)
EPOCHS = [0, 1, 2, 7, 255, 256, INT32_MAX, -1, INT32_MIN]
STARTS = [0, 1, 255, 256, 1 << 32, INT64_MAX, -1, -(1 << 63)]
# Values that neither packing nor the containers' checks take.
WRONG = [None, 1.0, "7", b"x", True, INT32_MAX + 1, INT32_MIN - 1, INT64_MAX + 1, -(1 << 63) - 1, (1, 2, 3)]


def _rows_input(data: atheris.FuzzedDataProvider) -> None:
    """rows() against lean_fold._rows: equal entries for a partition of valid values, an error for any other."""
    key = data.ConsumeBytes(data.ConsumeIntInRange(0, 24))
    segments: dict[Any, Any] = {}
    for _ in range(data.ConsumeIntInRange(0, 12)):  # ids of several lengths: a prefix sorts first
        segments[data.ConsumeBytes(data.ConsumeIntInRange(0, 17))] = data.ConsumeBytes(data.ConsumeIntInRange(0, 6))
    index: dict[Any, Any] = {}
    for _ in range(data.ConsumeIntInRange(0, 5)):
        index[_pick(data, EPOCHS)] = [(_pick(data, STARTS), data.ConsumeBytes(data.ConsumeIntInRange(0, 16)))
                                      for _ in range(data.ConsumeIntInRange(0, 4))]
    wrong = data.ConsumeIntInRange(0, 9)
    args: list[Any] = [key, segments, index]
    if wrong == 1:
        segments[_pick(data, ["id", 1, None])] = b"v"
    elif wrong == 2 and segments:
        segments[next(iter(segments))] = _pick(data, ["v", 1, None, bytearray(b"v")])
    elif wrong == 3:
        index[_pick(data, WRONG)] = []
    elif wrong == 4 and index:
        index[next(iter(index))] = _pick(data, [None, (), [(1,)], [[1, b"s"]], [(1, "s")], [(1, b"s", 2)],
                                                [(_pick(data, WRONG), b"s")]])
    elif wrong == 5:
        args[data.ConsumeIntInRange(0, 2)] = _pick(data, [None, "k", [], bytearray(b"k"), frozenset()])
    elif wrong == 6:
        args = args[:data.ConsumeIntInRange(0, 2)] if data.ConsumeBool() else [*args, None]
    else:
        assert _lean_fold.rows(*args) == tuple(_rows(*args)), args
        return
    valid = len(args) == 3 and type(args[0]) is bytes and type(args[1]) is dict and type(args[2]) is dict and \
        all(type(k) is bytes and type(v) is bytes for k, v in args[1].items()) and \
        all(type(e) is int and INT32_MIN <= e <= INT32_MAX and type(entries) is list and
            all(type(x) is tuple and len(x) == 2 and type(x[0]) is int and -(1 << 63) <= x[0] <= INT64_MAX and
                type(x[1]) is bytes for x in entries) for e, entries in args[2].items())
    if valid:  # the change drew a value that is still valid
        assert _lean_fold.rows(*args) == tuple(_rows(*args)), args
        return
    try:
        _lean_fold.rows(*args)
    except (TypeError, OverflowError):
        return
    raise AssertionError(f"rows accepted {args!r}")


def _fold_run_input(data: atheris.FuzzedDataProvider) -> None:
    """fold_run() against finished() called record by record, stopping where it does."""
    lean = _fold()
    records: list[Any] = []
    datums: dict[bytes, Any] = {}
    for number in range(data.ConsumeIntInRange(0, 10)):
        offset, key, datum, value, skipped = _record(data)
        value = HEADER + value + number.to_bytes(2, "big")  # each value names its datum
        datums[value] = datum
        if isinstance(datum, tuple) and len(datum) == 14 and data.ConsumeIntInRange(0, 3):
            _outcome(lambda: lean._name(*datum[:3]))  # noqa: B023
        record: Any = (_pick(data, [0, 0, 1, 2]), offset, key, value, None, skipped)
        other = data.ConsumeIntInRange(0, 11)
        if other == 1:
            record = (*record[:4], "request", skipped)
        elif other == 2:
            record = (*record[:3], _pick(data, [None, b"", b"\xc3\x01", b"other" + value, "text"]), None, skipped)
        elif other == 3:
            record = _pick(data, [record[:5], list(record), None])
        records.append(record)
    stop_at: Any = _pick(data, [{}, set(), {1: None}, {2}, {0, 1, 2}])
    failing = data.ConsumeIntInRange(0, 4)

    def read(program: Any, value: bytes, header_length: int) -> Any:
        datum = datums[value]
        if failing == 1 and value[-1] % 3 == 0:
            raise ValueError("not read exactly")
        if failing == 2 and value[-1] % 4 == 1:
            raise KeyError("a reader's fault")
        return datum

    start = data.ConsumeIntInRange(0, len(records))
    args: list[Any] = [lean._lean, lean._named, lean._ruled, lean._new, records, start, stop_at, set(), HEADER, read,
                       None, 2]
    misuse = data.ConsumeIntInRange(0, 14)
    if misuse == 1:  # an argument of another type (the program is the reader's to judge)
        args[_pick(data, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 11])] = _pick(data, [None, "x", 1.5, ()])
    elif misuse == 2:
        args = args[:data.ConsumeIntInRange(0, 11)] if data.ConsumeBool() else [*args, None]
    elif misuse == 3:
        args[5] = _pick(data, [-1, -(1 << 70), 1 << 70])
    if misuse in (1, 2, 3):
        try:
            _lean_fold.fold_run(*args)
        except (TypeError, ValueError, OverflowError):
            return
        raise AssertionError(f"fold_run accepted misuse {misuse}: {args!r}")
    if misuse == 4:  # past the end: nothing to fold
        args[5] = len(records) + data.ConsumeIntInRange(1, 3)
        assert _lean_fold.fold_run(*args) == (args[5], 0)
        return
    reference = _fold()
    reference._lean, reference._named, reference._ruled = _state(lean)
    expected_touched: set[Any] = set()
    index = start
    while index < len(records):
        record = records[index]
        if type(record) is not tuple or len(record) != 6 or record[4] is not None or type(record[3]) is not bytes \
                or not record[3].startswith(HEADER) or record[0] in stop_at:
            break
        try:
            taken = _lean_fold.finished(reference._lean, reference._named, reference._ruled, reference._new, record[1],
                                        record[2], read(None, record[3], 2), record[3], record[5])
        except Exception:
            break
        if taken is None:
            break
        expected_touched.add(taken)
        index += 1
    got = _lean_fold.fold_run(*args)
    assert got == (index, index - start), (got, index, start, records)
    assert args[7] == expected_touched, (args[7], expected_touched)
    assert _state(lean) == _state(reference), (lean._lean, reference._lean)


def one_input(raw: bytes) -> None:
    data = atheris.FuzzedDataProvider(raw)
    which = data.ConsumeIntInRange(0, 5)
    if which == 4:
        _rows_input(data)
        return
    if which == 5:
        _fold_run_input(data)
        return
    misuse = data.ConsumeIntInRange(0, 12)
    lean = _fold()
    for _ in range(data.ConsumeIntInRange(0, 6)):  # the state before: records folded by the reference
        offset, key, datum, value, skipped = _record(data)
        if isinstance(datum, tuple) and len(datum) == 14:
            _outcome(lambda: lean._segment_record(offset, key, datum, value, skipped))  # noqa: B023
    for name in list(lean._named.values()):
        if name is not None and data.ConsumeIntInRange(0, 5) == 0:
            lean._ruled.add(name[1])
    offset, key, datum, value, skipped = _record(data)
    if isinstance(datum, tuple) and len(datum) == 14 and data.ConsumeIntInRange(0, 4):
        _outcome(lambda: lean._name(*datum[:3]))  # named, as most records' partitions are
    args: list[Any] = [lean._lean, lean._named, lean._ruled, lean._new, offset, key, datum, value, skipped]
    if misuse < 8:
        reference = _fold()
        reference._lean, reference._named, reference._ruled = _state(lean)
        before = _state(lean)
        got = _outcome(lambda: _lean_fold.finished(*args))
        if got == ("returned", None):
            assert _state(lean) == before, (args, "changed the fold and declined")
            return
        assert got[0] == "returned", (args, got)
        expected = _outcome(lambda: reference._segment_record(offset, key, datum, value, skipped))
        assert got == expected, (args, got, expected)
        assert _state(lean) == _state(reference), (args, lean._lean, reference._lean)
        return
    if misuse == 8:  # containers of other types
        args[data.ConsumeIntInRange(0, 2)] = _pick(data, [None, [], {}, frozenset(), set(), "x"])
        if type(args[0]) is dict and type(args[1]) is dict and type(args[2]) in (set, frozenset):
            return
    elif misuse == 9:  # a `new` that cannot be called
        args[3] = _pick(data, [None, 3, b"x"])
    elif misuse == 10:  # a `new` that raises, or gives a partition of other fields: an exception, never a crash
        def raising(key: Any, tp: Any) -> Any:
            raise KeyError("new")

        def wrong(key: Any, tp: Any) -> Any:
            made = _Partition(tp)
            made.owed = []  # type: ignore[assignment]
            lean._lean[key] = made
            return made

        args[3] = _pick(data, [raising, wrong, lambda key, tp: None])
        with contextlib.suppress(KeyError, TypeError, AttributeError):
            _lean_fold.finished(*args)
        return
    elif misuse == 11:  # another number of arguments
        args = args[:data.ConsumeIntInRange(0, 8)] if data.ConsumeBool() else [*args, None]
    else:  # a name whose comparison empties the record's epochs while the fold looks the partition's name up
        if not (isinstance(datum, tuple) and len(datum) == 14 and type(datum[10]) is list):
            return
        listed = datum[10]

        class Emptying:
            def __hash__(self) -> int:
                return hash(datum[:3])

            def __eq__(self, other: object) -> bool:
                listed.clear()
                return False

        lean._named[Emptying()] = None  # type: ignore[index]
        with contextlib.suppress(TypeError):
            _lean_fold.finished(*args)
        return
    try:
        _lean_fold.finished(*args)
    except TypeError:
        return
    raise AssertionError(f"finished accepted misuse {misuse}: {args!r}")
