"""Fuzz target of rlmm/_slots.c (run by run_fuzz.py).

For a random class (over object, a slotted or frozen dataclass base, uuid.UUID, or a base whose __new__ sets up
more than slots: dict, list, an exception, int, a class with its own __new__, an abstract class; with slots of its
own, descriptors taken from other classes, a metaclass that runs code on every attribute read) and random field
names, a maker either refuses with TypeError or builds, for every set of values, the object the Python maker
(object.__new__ and object.__setattr__, rlmm.types.slot_maker without the extension) builds; a class object.__new__
refuses is always refused.
"""

from __future__ import annotations

import abc
import gc
import uuid
from dataclasses import dataclass
from typing import Any

import atheris

from rlmm import _slots, types

NAMES = ("a", "b", "c", "d", "__weakref__", "__dict__", "__class__", "int", "is_safe", "stolen")


class _Slotted:
    __slots__ = ("a", "b")


@dataclass(frozen=True, slots=True)
class _Frozen:
    c: Any
    d: Any


class _OwnNew:
    __slots__ = ("a",)

    def __new__(cls, *args: Any) -> Any:
        return super().__new__(cls)


class _Abstract(abc.ABC):
    __slots__ = ("a",)

    @abc.abstractmethod
    def method(self) -> None: ...


class _Other:
    __slots__ = ("stolen", "x1", "x2", "x3", "x4", "x5", "x6", "x7")


class _Noisy(type):
    """Runs code on every attribute read of its classes (as a metaclass may)."""

    def __getattribute__(cls, name: str) -> Any:
        gc.collect(0)
        return super().__getattribute__(name)


BASES: tuple[type[Any], ...] = (object, _Slotted, _Frozen, uuid.UUID, dict, list, Exception, int, tuple, bytes,
                                _OwnNew, _Abstract, set)


def _python_make(cls: type[Any], fields: tuple[str, ...], values: list[Any]) -> Any:
    saved, types._slots = types._slots, None  # slot_maker's Python maker
    try:
        return types.slot_maker(cls, fields)(*values)
    finally:
        types._slots = saved


def _shown(made: Any) -> type[Any]:
    try:
        return type(repr(made))
    except Exception as error:
        return type(error)


def _class(data: atheris.FuzzedDataProvider) -> type[Any]:
    base = BASES[data.ConsumeIntInRange(0, len(BASES) - 1)]
    namespace: dict[str, Any] = {}
    if data.ConsumeIntInRange(0, 3):
        namespace["__slots__"] = tuple(sorted({NAMES[data.ConsumeIntInRange(0, 5)]
                                               for _ in range(data.ConsumeIntInRange(0, 3))}))
    if data.ConsumeIntInRange(0, 5) == 0:  # another class's slot, as an attribute of this one
        namespace["stolen"] = _Other.__dict__["stolen"]
    if data.ConsumeIntInRange(0, 7) == 0:
        namespace["method"] = lambda self: None
    metaclass: type[Any] = type(base)
    if metaclass is type and data.ConsumeIntInRange(0, 7) == 0:
        metaclass = _Noisy
    try:
        return metaclass("Fuzzed", (base,), namespace)
    except TypeError:  # a layout Python itself refuses (slots over int, tuple, bytes)
        namespace.pop("__slots__", None)
        return metaclass("Fuzzed", (base,), namespace)


def one_input(raw: bytes) -> None:
    data = atheris.FuzzedDataProvider(raw)
    cls = _class(data)
    fields = tuple(NAMES[data.ConsumeIntInRange(0, len(NAMES) - 1)] for _ in range(data.ConsumeIntInRange(0, 4)))
    try:
        make = _slots.maker(cls, fields)
    except TypeError:
        return
    object.__new__(cls)  # the C maker takes only a class object.__new__ builds completely
    count = len(fields) if data.ConsumeIntInRange(0, 7) else data.ConsumeIntInRange(0, 6)
    values = [[None, data.ConsumeInt(2), "text", cls, make][data.ConsumeIntInRange(0, 4)] for _ in range(count)]
    try:
        made = make(*values)
    except TypeError:
        assert count != len(fields), (cls, fields, values)
        return
    expected = _python_make(cls, fields, values)
    assert type(made) is type(expected) is cls
    for name, value in zip(fields, values, strict=True):
        assert getattr(made, name) is getattr(expected, name) is value, (cls, fields, name)
    assert _shown(made) is _shown(expected)  # used as the Python-made one is (its methods may need unset slots)
    if data.ConsumeIntInRange(0, 15) == 0:
        del made, expected
        gc.collect(0)
