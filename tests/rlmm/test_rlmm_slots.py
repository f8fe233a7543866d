"""rlmm.types.slot_maker: the objects a rebuild builds per record without their constructors' checks, in C
(rlmm/_slots.c) and in Python, are the objects their constructors build from the same values."""

from __future__ import annotations

import gc
import sys
import uuid
import weakref
from dataclasses import dataclass, fields
from types import MappingProxyType
from typing import Any

import pytest

from rlmm import codec, types
from rlmm.events import EpochLineage, RecordKey, segment_key
from rlmm.types import RemoteLogSegmentId, RemoteLogSegmentMetadata, RemoteLogSegmentState, TopicIdPartition

# Built by `pip install -e .` (setup.py) on every machine with a C compiler, CI's among them: a failed build must
# fail here, not pass the suite on the Python makers alone.
from rlmm import _slots  # isort: skip

TP = TopicIdPartition(uuid.UUID(int=7), "orders", 3)


def _names(cls: type[Any]) -> list[str]:
    return [f.name for f in fields(cls)]


def _python_maker(cls: type[Any], names: list[str], monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setattr(types, "_slots", None)
    return types.slot_maker(cls, names)


@pytest.mark.parametrize("native", [True, False], ids=["C", "Python"])
def test_made_objects_equal_constructed_ones(native: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    def maker(cls: type[Any], names: list[str]) -> Any:
        return types.slot_maker(cls, names) if native else _python_maker(cls, names, monkeypatch)

    segment_id = RemoteLogSegmentId(TP, uuid.UUID(int=99))
    values = (segment_id, 10, 20, -1, 0, 1_700_000_000_000, 512, MappingProxyType({3: 10}), None,
              RemoteLogSegmentState.COPY_SEGMENT_FINISHED, True)
    made = maker(RemoteLogSegmentMetadata, _names(RemoteLogSegmentMetadata))(*values)
    built = RemoteLogSegmentMetadata(*values)
    assert type(made) is RemoteLogSegmentMetadata and made == built and hash(made) == hash(built)
    assert codec.encode(made) == codec.encode(built)
    assert maker(RemoteLogSegmentId, ["topic_id_partition", "id"])(TP, uuid.UUID(int=99)) == segment_id
    lineage = maker(EpochLineage, _names(EpochLineage))(4, 30, frozenset({uuid.UUID(int=1)}),
                                                        frozenset({uuid.UUID(int=2)}))
    assert lineage == EpochLineage(4, 30, frozenset({uuid.UUID(int=1)}), frozenset({uuid.UUID(int=2)}))
    made_uuid = maker(uuid.UUID, ["int", "is_safe"])(2**128 - 1, uuid.SafeUUID.unknown)
    assert made_uuid == uuid.UUID(int=2**128 - 1) and str(made_uuid) == "ffffffff-ffff-ffff-ffff-ffffffffffff"
    assert hash(made_uuid) == hash(uuid.UUID(int=2**128 - 1)) and weakref.ref(made_uuid)() is made_uuid
    with pytest.raises(AttributeError):  # still frozen (FrozenInstanceError)
        made.start_offset = 11  # type: ignore[misc]


def test_the_hot_paths_use_the_c_makers() -> None:
    # Decoding a record and deriving a lineage build their objects through rlmm._slots where it was built.
    for make in (types._make_segment, types._make_segment_id, types._make_uuid):
        assert type(make) is type(len), make  # a built-in function: the C maker, not the Python one
    md = codec.decode(codec.encode(RemoteLogSegmentMetadata(
        RemoteLogSegmentId(TP, uuid.UUID(int=5)), 0, 9, 100, 1, 1_700_000_000_000, 64, {0: 0})))
    assert isinstance(md, RemoteLogSegmentMetadata)
    assert segment_key(md.remote_log_segment_id) == RecordKey("segment", TP.topic_id, TP.partition, uuid.UUID(int=5))
    assert types.uuid_from_text("00000000-0000-0000-0000-000000000005") == uuid.UUID(int=5)


def test_a_made_object_holds_its_values_and_lets_them_go() -> None:
    make = _slots.maker(EpochLineage, tuple(_names(EpochLineage)))
    displaced = frozenset({uuid.UUID(int=3)})
    before = sys.getrefcount(displaced)
    lineage = make(1, None, displaced, frozenset())
    assert sys.getrefcount(displaced) == before + 1
    del lineage
    gc.collect()
    assert sys.getrefcount(displaced) == before


@dataclass(slots=True, weakref_slot=True)
class _Cyclic:
    other: Any
    name: Any


def test_a_made_object_in_a_reference_cycle_is_collected() -> None:
    make = _slots.maker(_Cyclic, ("other", "name"))
    first = make(None, "a")
    first.other = make(first, "b")
    alive = weakref.finalize(first, lambda: None)
    del first
    gc.collect()
    assert not alive.alive


class _Plain:
    def __init__(self) -> None:
        self.field = 1


class _Slotted:
    __slots__ = ("a", "b")


@pytest.mark.parametrize(("cls", "names", "message"), [
    (_Plain, ("field",), "'field' is not a slot of"),  # an instance __dict__ entry, not a slot
    (_Slotted, ("a", "a"), "'a' is not a slot of .* named once"),
    (_Slotted, ("a", "c"), "'c' is not a slot"),
    (_Slotted, ("a", 1), "1 is not a slot"),
    (_Slotted, ("__class__",), "'__class__' is not a slot"),
])
def test_a_maker_refuses_fields_that_are_not_its_classes_slots(cls: type[Any], names: tuple[Any, ...],
                                                                message: str) -> None:
    with pytest.raises(TypeError, match=message):
        _slots.maker(cls, names)


def test_a_maker_says_how_many_values_it_takes() -> None:
    make = _slots.maker(_Slotted, ("a", "b"))
    with pytest.raises(TypeError, match="_Slotted maker takes 2 values, got 1"):
        make(1)
    with pytest.raises(TypeError, match=r"maker\(cls: type, fields: tuple\[str, ...\]\)"):
        _slots.maker(_Slotted, ["a"])  # type: ignore[arg-type]
    made = make(1, 2)
    assert (made.a, made.b) == (1, 2)


def test_the_python_maker_refuses_a_wrong_count_too(monkeypatch: pytest.MonkeyPatch) -> None:
    make = _python_maker(_Slotted, ["a", "b"], monkeypatch)
    with pytest.raises(ValueError):
        make(1)
