"""Fuzz target of rlmm/_lean_fold.c (run by run_fuzz.py): finished() folds a record only as LeanFold._segment_record
folds it (the same key returned, the same partitions held after), and otherwise changes nothing; it refuses
arguments of other types with TypeError and raises what a call it makes raises.

Each input builds a LeanFold's state by folding a few records in Python, then hands one more record to both: datums
drawn around every check (texts that are not an id's, numbers at the edges of their ranges, keys that do not match,
one or two leader epochs, every state), of partitions named or not, held or not, folded by the rules or not."""

from __future__ import annotations

import contextlib
import copy
from typing import Any

import atheris

from rlmm import _lean_fold
from rlmm.lean_fold import LeanFold, _Partition
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


def one_input(raw: bytes) -> None:
    data = atheris.FuzzedDataProvider(raw)
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
